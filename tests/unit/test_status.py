"""`envbuild status`: each profile's state and the next command, even with no engine to ask."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from ..conftest import Result


def test_status_says_what_each_profile_needs_next_without_an_engine(
    cli: Callable[..., Result], engineless_project: Path
) -> None:
    prof = engineless_project / "profiles" / "cu124-py312.yaml"
    prof.write_text(prof.read_text().replace('numpy: "2.2.6"', 'numpy: "2.2.5"'))
    (engineless_project / "profiles" / "cu126-py312.yaml").write_text("name: cu126-py312\naccelerator: cuda\n")
    res = cli("status", "--json")
    assert res.code == 0, res.err
    report = json.loads(res.out)
    got = {p["profile"]: (p["valid"], p["lockfile"], p["image"], p["next"]) for p in report["profiles"]}
    # nothing could be asked of the engine: not "ready" (issue 25, item 7), but where to look
    assert got["cpu-py311"] == (True, "fresh", "unknown", "envbuild doctor")
    assert got["cpu-py312"] == (True, "missing", "unknown", "envbuild lock cpu-py312")
    assert got["cu124-py312"] == (True, "stale", "unknown", "envbuild lock cu124-py312")
    assert got["cu126-py312"] == (False, "-", "-", "envbuild validate cu126-py312")
    problem = next(p["problem"] for p in report["profiles"] if p["profile"] == "cu126-py312")
    assert problem.startswith("profiles/cu126-py312.yaml")
    assert "image states are unknown" in report["note"] and "no socket there" in report["note"]


def test_status_of_an_unknown_profile_is_a_usage_error(cli: Callable[..., Result], engineless_project: Path) -> None:
    res = cli("status", "cu999-py311")
    assert res.code == 2
    assert "cu999-py311" in res.err
