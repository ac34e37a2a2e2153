"""The profile JSON Schema editors use: committed copy current, and never stricter than envbuild itself."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from pydantic import ValidationError

from envbuild import profile
from tests.conftest import REPO, SHIPPED_PROFILES, VALID, Result

COMMITTED = REPO / "schema" / "profile.schema.json"
VALIDATOR = jsonschema.Draft7Validator(profile.file_schema())


def _schema_errors(doc: dict[str, Any]) -> list[str]:
    return sorted(".".join(str(p) for p in e.absolute_path) or e.validator for e in VALIDATOR.iter_errors(doc))


def test_committed_schema_is_what_envbuild_generates() -> None:
    assert COMMITTED.read_text("utf-8") == profile.file_schema_text(), (
        "regenerate: envbuild schema -o schema/profile.schema.json"
    )


def test_schema_is_a_valid_draft_07_schema() -> None:
    jsonschema.Draft7Validator.check_schema(json.loads(COMMITTED.read_text("utf-8")))


@pytest.mark.parametrize("path", sorted(SHIPPED_PROFILES.glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_file_passes_fragments_included(path: Path) -> None:
    assert _schema_errors(yaml.safe_load(path.read_text("utf-8"))) == []


@pytest.mark.parametrize(
    ("text", "flagged"),
    [
        ("pyhton: '3.11'\n", ["additionalProperties"]),  # a typo an editor underlines
        ("python: 3.10\n", ["python"]),  # YAML's float 3.1
        ("torch: 2.3.1\nnumpy: 1.26\n", ["numpy"]),  # 2.3.1 stays a string; 1.26 does not
        ("accelerator: gpu\n", ["accelerator"]),
        ("cuda: '12'\n", ["cuda"]),
        ("env: {1BAD: x}\n", ["env"]),
        ("env: {OMP_NUM_THREADS: 8}\n", ["env.OMP_NUM_THREADS"]),
        ("platforms: [arm64]\n", ["platforms.0"]),
        ("torchvision: latest\n", ["torchvision"]),
        ("base: 'Ubuntu:22.04'\n", ["base"]),
        ("description: '" + "x" * 513 + "'\n", ["description"]),
    ],
)
def test_the_mistakes_users_make_are_flagged_where_they_are(text: str, flagged: list[str]) -> None:
    assert _schema_errors(yaml.safe_load(text)) == flagged


FIELD_VALUES: dict[str, list[Any]] = {
    "name": ["cu121-py311", "cpu-py312-dev", "rocm624-py312", "cu12-py311", "CU121-py311", "cpu-py3", "cpu-py311-"],
    "cuda": ["12.1", "11.8", "12", "12.10", "v12.1"],
    "python": ["3.11", "3.9", "3", "3.11.4", "311"],
    "torch": ["2.3.1", "2.3", "2.3.1rc1", " 2.3.1"],
    "numpy": ["1.26.4", "2.0", "1.26.4.post1"],
    "torchvision": ["0.18.1", "auto", "Auto", "0.18"],
    "base": ["ubuntu:22.04", "ghcr.io/a/b:1@sha256:" + "a" * 64, "localhost:5000/x", "UPPER:1", "a b"],
    "registry": ["ghcr.io/acme/envs", "localhost:5000", "ghcr.io/Acme", "https://ghcr.io/x"],
    "index_url": ["https://pypi.example/simple", "file:///wheels", "ftp://x", "https://a b", "https://x/$HOME"],
    "apt": [["git"], ["git=1:2.39.5-0+deb12u1"], ["Git"], ["git; rm -rf /"]],
    "channels": [["conda-forge"], ["https://conda.example/c"], ["bad channel"]],
    "conda_packages": [["pillow"], ["libjpeg-turbo=3.0"], ["pillow>=10,<11"], ["a;b"]],
    "env": [{"A_1": "x"}, {"_X": ""}, {"1A": "x"}, {"A-B": "x"}, {"A": "two\nlines"}],
    "description": ["ok", "x" * 512, "x" * 513],
}


@pytest.mark.parametrize(
    ("field", "value"), [(f, v) for f, vals in FIELD_VALUES.items() for v in vals], ids=lambda x: repr(x)[:30]
)
def test_schema_agrees_with_the_model_field_by_field(field: str, value: Any) -> None:
    """An editor must never underline what envbuild accepts, and should underline what it rejects.

    Field by field against the strict model (cross-field rules are validate's alone). Where the
    schema cannot express a rule (a line break in an env value), it may only be more lenient.
    """
    doc = {**VALID, field: value}
    try:
        profile.Profile.model_validate(doc)
        model_ok = True
    except ValidationError:
        model_ok = False
    schema_ok = not _schema_errors(doc)
    if model_ok:
        assert schema_ok, f"schema rejects {field}={value!r}, which envbuild accepts"
    elif field != "env" or not any("\n" in str(v) for v in value.values()):
        assert not schema_ok, f"schema accepts {field}={value!r}, which envbuild rejects"


def test_cli_prints_writes_and_checks(cli: Callable[..., Result], tmp_path: Path) -> None:
    printed = cli("schema")
    assert printed.code == 0
    assert json.loads(printed.out)["title"] == "envbuild profile"
    target = tmp_path / "profile.schema.json"
    assert cli("schema", "-o", str(target)).code == 0
    assert target.read_text("utf-8") == profile.file_schema_text()
    assert cli("schema", "--check", "-o", str(target)).code == 0
    target.write_text("{}\n")
    drifted = cli("schema", "--check", "-o", str(target))
    assert drifted.code == 1
    assert f"{target} differs from this envbuild's profile schema" in drifted.err
    assert f"regenerate it: envbuild schema -o {target}" in drifted.err
    assert "lockfile" not in drifted.err  # it said "stale or missing lockfiles" of a schema file
    assert target.read_text("utf-8") == "{}\n"  # --check never writes
    missing = cli("schema", "--check", "-o", str(tmp_path / "none.json"))
    assert missing.code == 1 and f"{tmp_path / 'none.json'} is missing" in missing.err
