"""Random and mutated YAML through the loader, validation and rendering: only envbuild errors."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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
            outputs = render.render(loaded.profile)
        except EnvbuildError:
            return
        assert outputs["Dockerfile"].startswith("# Rendered by envbuild")


def _write(text: str) -> Path:
    folder = Path(tempfile.mkdtemp())
    path = folder / "cu121-py311.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    return path


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=300))
def test_random_text(text: str) -> None:
    _run(_write(text))


@settings(max_examples=300, deadline=None)
@given(key=keys, value=values)
def test_one_field_mutated(key: str, value: Any) -> None:
    data = {**VALID, key: value}
    _run(_write(yaml.safe_dump(data, allow_unicode=True)))


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(keys, values, max_size=8))
def test_random_mappings(data: dict[str, Any]) -> None:
    _run(_write(yaml.safe_dump(data, allow_unicode=True)))


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes(blob: bytes) -> None:
    path = _write("")
    path.write_bytes(blob)
    _run(path)
