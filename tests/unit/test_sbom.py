"""`envbuild sbom`: a CycloneDX document that the library's own validator accepts."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from envbuild import sbomdoc
from tests.conftest import Result


def test_the_sbom_of_a_profile_lists_torch_and_numpy_with_their_hashes_and_sources(
    cli: Callable[..., Result], engineless_project: Path, tmp_path: Path
) -> None:
    target = tmp_path / "cpu-py311.cdx.json"
    res = cli("sbom", "cpu-py311", "-o", str(target))
    assert res.code == 0, res.err
    text = target.read_text()
    sbomdoc.validate_document(text)  # cyclonedx-python-lib's strict JSON validator
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
        sbomdoc.validate_document(json.dumps({"bomFormat": "CycloneDX", "specVersion": "1.6", "components": "x"}))


def test_a_profile_with_apt_lock_lists_its_os_packages_with_the_archive_sha256(
    cli: Callable[..., Result], engineless_project: Path
) -> None:
    from envbuild import aptfile

    res = cli("sbom", "cpu-py311")
    assert res.code == 0, res.err
    parts = {c["name"]: c for c in json.loads(res.out)["components"]}
    apt = aptfile.parse((engineless_project / "lockfiles" / "cpu-py311" / "apt.lock").read_text())
    python = next(d for d in apt.stages["runtime"] if d.name == "python3.11")
    entry = parts["python3.11"]
    assert entry["purl"].startswith("pkg:deb/python3.11@") and entry["version"] == python.version
    assert entry["hashes"] == [{"alg": "SHA-256", "content": python.sha256}]
    assert entry["externalReferences"] == [{"type": "distribution", "url": python.url}]
    base_only = next(d for d in apt.base if d.name not in apt.installed)  # in the base, never fetched
    assert "hashes" not in parts[base_only.name] and parts[base_only.name]["version"] == base_only.version


def test_every_image_carries_its_sbom_made_the_same_way_each_time(
    cli: Callable[..., Result], engineless_project: Path
) -> None:
    """The build context holds the SBOM the image will carry (/opt/envbuild/sbom.cdx.json), labelled
    by its sha256, and it is the same bytes for the same lockfiles (no random serial, no clock)."""
    import hashlib

    def context() -> tuple[str, dict[str, str]]:
        res = cli("build", "cpu-py311", "--context-only", "--json")
        assert res.code == 0, res.err
        report = json.loads(res.out)
        return (Path(report["context"]) / "smoke" / "sbom.cdx.json").read_text(), report["labels"]

    first, labels = context()
    second, _ = context()
    assert first == second
    sbomdoc.validate_document(first)
    assert labels["io.envbuild.sbom-sha256"] == hashlib.sha256(first.encode()).hexdigest()
    doc = json.loads(first)
    assert doc["metadata"]["timestamp"].startswith(labels["org.opencontainers.image.created"][:19])
    names = {c["name"] for c in doc["components"]}
    assert {"torch", "numpy", "einops", "python3.11", "g++"} <= names


def test_a_rebuild_checks_its_sbom_only_when_the_document_or_the_library_changed(
    cli: Callable[..., Result], engineless_project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The validator takes seconds (its IRI checks parse every URL): a document that passed before,
    byte for byte under the same library version, is not checked again; anything else is, and only
    a document that passed leaves its key."""
    from envbuild import buildctx

    checked: list[str] = []
    real = buildctx._validate_sbom

    def counted(text: str) -> None:
        checked.append(text)
        real(text)

    monkeypatch.setattr(buildctx, "_validate_sbom", counted)

    def context() -> Result:
        return cli("build", "cpu-py311", "--context-only", "--json")

    assert context().code == 0
    assert len(checked) == 1
    assert context().code == 0
    assert len(checked) == 1  # the same bytes under the same library: passed before
    marker = engineless_project / ".envbuild" / "cpu-py311" / "sbom.validated"
    marker.write_text(marker.read_text().replace("cyclonedx-python-lib ", "cyclonedx-python-lib 0.0.1-"))
    assert context().code == 0
    assert len(checked) == 2  # another library version: checked again
    assert marker.read_text() == sbomdoc.validation_key(checked[-1])
    # a document the validator refuses: no context is handed over, and no key says it passed
    marker.unlink()

    def refuse(text: str) -> None:
        checked.append(text)
        raise ValueError("the generated CycloneDX document does not validate: (test)")

    monkeypatch.setattr(buildctx, "_validate_sbom", refuse)
    refused = context()
    assert refused.code != 0 and "does not validate" in refused.err
    assert len(checked) == 3 and not marker.exists()


def test_the_sbom_check_runs_the_librarys_validator_in_a_process_of_its_own() -> None:
    """Out of envbuild's process (it would hold the GIL docker-py needs beside it), but the same
    verdicts: a good document passes, a broken one is refused with the validator's reason."""
    from envbuild import buildctx

    good = sbomdoc.document("x", {"einops": "0.8.0"}, None, {}, {}, check=False)
    buildctx._validate_sbom(good)
    with pytest.raises(ValueError, match="does not validate"):
        buildctx._validate_sbom(json.dumps({"bomFormat": "CycloneDX", "specVersion": "1.6", "components": "x"}))
