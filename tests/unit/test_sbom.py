"""`envbuild sbom`: a CycloneDX document that the library's own validator accepts."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from envbuild import sbom
from tests.conftest import Result


def test_the_sbom_of_a_profile_lists_torch_and_numpy_with_their_hashes_and_sources(
    cli: Callable[..., Result], engineless_project: Path, tmp_path: Path
) -> None:
    target = tmp_path / "cpu-py311.cdx.json"
    res = cli("sbom", "cpu-py311", "-o", str(target))
    assert res.code == 0, res.err
    text = target.read_text()
    sbom.validate_document(text)  # cyclonedx-python-lib's strict JSON validator
    doc = json.loads(text)
    assert doc["bomFormat"] == "CycloneDX" and doc["specVersion"] == "1.6"
    parts = {c["name"]: c for c in doc["components"]}
    torch, numpy = parts["torch"], parts["numpy"]
    assert (torch["version"], torch["purl"]) == ("2.13.0+cpu", "pkg:pypi/torch@2.13.0%2Bcpu")
    assert torch["hashes"] == [
        {"alg": "SHA-256", "content": "6746dbcbeb526eb61330b76b41ff1b4eb848951103a892eeb080dfa2b264667b"}
    ]
    assert torch["externalReferences"] == [{"type": "distribution", "url": "https://download.pytorch.org/whl/cpu"}]
    assert numpy["version"] == "2.1.3" and numpy["hashes"]
    assert numpy["externalReferences"][0]["url"] == "https://pypi.org/simple"
    assert len(doc["dependencies"][0]["dependsOn"]) == len(parts)


def test_a_broken_document_is_refused_by_the_validator() -> None:
    with pytest.raises(ValueError, match="does not validate"):
        sbom.validate_document(json.dumps({"bomFormat": "CycloneDX", "specVersion": "1.6", "components": "x"}))
