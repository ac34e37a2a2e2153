"""`envbuild outdated`: newer patches of the pinned series, and newer releases that fit the profile."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from envbuild.errors import LockError

from ..conftest import FakeIndex, Result


def _report(res: Result) -> dict[str, dict[str, Any]]:
    return {row["profile"]: row for row in json.loads(res.out)}


def test_newer_release_and_numpy_series_that_fit(
    cli: Callable[..., Result], project: Path, fake_index: FakeIndex
) -> None:
    fake_index.newest.update(
        {"torch==2.3.*": "2.3.1", "numpy==1.26.*": "1.26.4", "torch==2.5.*": "2.5.1", "numpy==2.4.*": "2.4.6"}
    )
    res = cli("outdated", "cu121-py311", "--json", "--project", str(project))
    assert res.code == 0, res.err
    row = _report(res)["cu121-py311"]
    # torch 2.5 is the newest verified release with a CUDA 12.1 build for Python 3.11; 2.3.1 and
    # 1.26.4 are the last patches of their series.
    assert (row["torch_patch"], row["newer_torch"], row["numpy_patch"], row["newer_numpy"]) == (
        None,
        "2.5.1",
        None,
        "2.4.6",
    )
    assert row["outdated"] is True
    assert fake_index.asked == [
        (["torch==2.3.*", "numpy==1.26.*"], "3.11"),
        (["torch==2.5.*", "numpy==2.4.*"], "3.11"),
    ]


def test_check_exits_1_only_when_a_profile_is_behind(
    cli: Callable[..., Result], project: Path, fake_index: FakeIndex
) -> None:
    path = project / "profiles" / "cu130-py313.yaml"
    data = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**data, "numpy": "2.5.5"}))
    fake_index.newest.update({"torch==2.14.*": "2.14.1", "numpy==2.5.*": "2.5.5"})
    current = cli("outdated", "cu130-py313", "--check", "--project", str(project))
    assert current.code == 0, current.err
    assert fake_index.asked == [(["torch==2.14.*", "numpy==2.5.*"], "3.13")]  # nothing newer to ask about

    fake_index.newest["torch==2.14.*"] = "2.14.2"  # upstream ships a patch
    behind = cli("outdated", "cu130-py313", "--check", "--project", str(project))
    assert behind.code == 1
    assert "error: 1 profile(s) behind upstream: cu130-py313" in behind.err
    assert "fix: move a pin on purpose: edit torch/numpy in the profile" in behind.err
    assert "2.14.2" in behind.out


def test_one_failed_lookup_does_not_hide_the_others(
    cli: Callable[..., Result], project: Path, fake_index: FakeIndex, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_index.newest.update({"torch==2.7.*": "2.7.1", "numpy==2.2.*": "2.2.6", "torch==2.14.*": "2.14.1"})
    fake_index.newest.update({"numpy==2.4.*": "2.4.6", "numpy==2.5.*": "2.5.5"})

    def lookup(requirements: list[str], python: str, **kw: object) -> dict[str, str]:
        if python == "3.10":
            raise LockError("uv cannot reach 127.0.0.1: the connection was refused (http://127.0.0.1:9/simple)")
        return fake_index(requirements, python, **kw)

    from envbuild import uvtool

    monkeypatch.setattr(uvtool, "newest_versions", lookup)
    res = cli("outdated", "cu118-py310", "cu126-py312", "cpu-py311-conda", "--json", "--project", str(project))
    assert res.code == 4
    rows = _report(res)
    assert rows["cu118-py310"]["checked"] is False
    assert rows["cu118-py310"]["error"].startswith("uv cannot reach 127.0.0.1")
    assert rows["cu126-py312"]["newer_torch"] == "2.14.1"  # still reported
    assert rows["cpu-py311-conda"]["checked"] is False  # conda-forge is not PyPI: not looked up
    assert "error: could not look up cu118-py310" in res.err

    table = cli("outdated", "cpu-py311-conda", "--project", str(project))
    assert table.code == 0 and "n/a" in table.out
    assert "cpu-py311-conda: conda profile: its torch comes from conda-forge" in table.err


def test_an_invalid_profile_is_a_row_and_the_others_are_still_looked_up(
    cli: Callable[..., Result], project: Path, fake_index: FakeIndex
) -> None:
    """`outdated` stopped at the first invalid profile with validate's error: a scheduled job learnt
    nothing about the others."""
    for path in (project / "profiles").glob("*.yaml"):
        if path.stem not in {"_base", "cu126-py312"}:
            path.unlink()
    (project / "profiles" / "cu121-py312.yaml").write_text(
        'name: cu121-py312\naccelerator: cuda\ncuda: "12.1"\npython: "3.12"\ntorch: "2.2.2"\nnumpy: "2.0.2"\n'
    )
    fake_index.newest.update({"torch==2.7.*": "2.7.1", "numpy==2.2.*": "2.2.6", "torch==2.14.*": "2.14.1"})
    fake_index.newest.update({"numpy==2.4.*": "2.4.6", "numpy==2.5.*": "2.5.5"})
    res = cli("outdated", "--json", "--project", str(project))
    assert res.code == 2
    rows = _report(res)
    assert rows["cu126-py312"]["checked"] is True and rows["cu126-py312"]["newer_torch"] == "2.14.1"
    bad = rows["cu121-py312"]
    assert bad["checked"] is False and bad["error"].startswith("not valid: profiles/cu121-py312.yaml:6: numpy:")
    assert "error: 1 profile(s) invalid: cu121-py312" in res.err
