"""Random and mutated YAML through the loader, validation and rendering: only envbuild errors."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envbuild import plan as plan_mod
from envbuild import profile, render, validate
from envbuild.errors import EnvbuildError

from ..conftest import VALID

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True),
    st.text(max_size=40),
    st.sampled_from(["auto", "3.11", "12.1", "2.3.1", "cuda", "rocm", "cpu", "venv", "conda"]),
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
keys = st.sampled_from([*profile.FIELDS, "torchvison", "extra", ""])


def _run(path: Path) -> None:
    loaded = validate.check(path, "p.yaml")
    for d in loaded.diagnostics:
        assert d.render()
    if loaded.profile is not None and not loaded.errors:
        try:
            outputs = render.render(plan_mod.for_profile(loaded.profile))
        except EnvbuildError:
            return
        assert outputs["Dockerfile"].startswith("# Rendered by envbuild")


def _check_file(blob: bytes) -> None:
    """`blob` as a profile file, checked in a folder of its own that goes with the example
    (hypothesis runs ~1,000 per suite: a folder left each time filled /tmp)."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "cu121-py311.yaml"
        path.write_bytes(blob)
        _run(path)


def _check_text(text: str) -> None:
    _check_file(text.encode("utf-8", errors="surrogatepass"))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=300))
def test_random_text(text: str) -> None:
    _check_text(text)


@settings(max_examples=300, deadline=None)
@given(key=keys, value=values)
def test_one_field_mutated(key: str, value: Any) -> None:
    data = {**VALID, key: value}
    _check_text(yaml.safe_dump(data, allow_unicode=True))


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(keys, values, max_size=8))
def test_random_mappings(data: dict[str, Any]) -> None:
    _check_text(yaml.safe_dump(data, allow_unicode=True))


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes(blob: bytes) -> None:
    _check_file(blob)


def _pretend_newest(requirements: list[str], python: str, **_: object) -> dict[str, str]:
    """Every series has a .1 patch: enough for `new`, which asks only for series the compat data knows."""
    return {r.split("==")[0]: r.split("==")[1].replace(".*", ".1") for r in requirements}


conventional = st.builds(
    lambda tok, py, suffix: f"{tok}-py3{py}{suffix}",
    st.sampled_from(["cpu", "cu118", "cu121", "cu125", "cu126", "cu130", "cu132", "rocm63", "rocm72", "rocm5"]),
    st.integers(min_value=8, max_value=15),
    st.sampled_from(["", "", "-dev", "-X", "--"]),
)
# Weighted towards names and versions that can succeed, so both ends of the contract get exercised.
names = st.one_of(conventional, conventional, conventional, st.text(max_size=20))
versions = st.one_of(
    st.none(), st.none(), st.sampled_from(["2.3", "2.9.1", "1.26", "2.1.3", "9.9", "2.2"]), st.text(max_size=12)
)


@settings(max_examples=300, deadline=None)
@given(name=names, torch=versions, numpy=versions)
def test_new_writes_a_valid_profile_or_nothing(name: str, torch: str | None, numpy: str | None) -> None:
    from pytest import MonkeyPatch

    from envbuild import scaffold, uvtool
    from envbuild.project import open_project

    with tempfile.TemporaryDirectory() as folder, MonkeyPatch.context() as mp:
        root = Path(folder)
        mp.setattr(uvtool, "newest_versions", _pretend_newest)
        try:
            made = scaffold.create(open_project(str(root)), name, torch=torch, numpy=numpy)
        except EnvbuildError:
            written = list((root / "profiles").glob("*")) if (root / "profiles").exists() else []
            assert written == []
            return
        loaded = validate.check(made.path, made.path.name)
        assert loaded.errors == [], [d.render() for d in loaded.errors]
        assert made.path.read_text() == made.text
