"""Shared fixtures: a throw-away project folder and an in-process CLI runner."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
SHIPPED_PROFILES = REPO / "profiles"

VALID: dict[str, Any] = {
    "name": "cu121-py311",
    "accelerator": "cuda",
    "cuda": "12.1",
    "python": "3.11",
    "torch": "2.3.1",
    "torchvision": "0.18.1",
    "numpy": "1.26.4",
}


@dataclass
class FakeIndex:
    """Stands in for the newest-version lookup (`uvtool.newest_versions`): the e2e suite asks real PyPI."""

    newest: dict[str, str]  # "torch==2.14.*" -> "2.14.1"
    asked: list[tuple[list[str], str]]

    def __call__(self, requirements: list[str], python: str, **_: object) -> dict[str, str]:
        self.asked.append((list(requirements), python))
        return {r.split("==")[0]: self.newest[r] for r in requirements}


@pytest.fixture(scope="session", autouse=True)
def own_cache_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The tests' own XDG_CACHE_HOME: the lock-ahead records that `new` and `lock` leave, and
    `run`'s download cache, never in the user's ~/.cache (which gathered a record per test folder).
    uv's default cache moves with it (the e2e session names its own); removed afterwards."""
    import os

    folder = tmp_path_factory.mktemp("cache-home")
    before = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(folder)
    yield folder
    if before is None:
        os.environ.pop("XDG_CACHE_HOME", None)
    else:
        os.environ["XDG_CACHE_HOME"] = before
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def own_wheel_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The tests' own wheel cache (ENVBUILD_CACHE_DIR), never the user's; removed afterwards.
    Subprocesses inherit it."""
    import os

    from envbuild.wheelcache import CACHE_ENV

    folder = tmp_path_factory.mktemp("wheel-cache")
    before = os.environ.get(CACHE_ENV)
    os.environ[CACHE_ENV] = str(folder)
    yield folder
    if before is None:
        os.environ.pop(CACHE_ENV, None)
    else:
        os.environ[CACHE_ENV] = before
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def fake_index(monkeypatch: pytest.MonkeyPatch) -> FakeIndex:
    from envbuild import uvtool

    index = FakeIndex({}, [])
    monkeypatch.setattr(uvtool, "newest_versions", index)
    return index


@dataclass
class Result:
    code: int
    out: str
    err: str


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A copy of the shipped profiles in a fresh project folder."""
    root = tmp_path / "proj"
    shutil.copytree(SHIPPED_PROFILES, root / "profiles")
    shutil.copytree(REPO / "checks", root / "checks")  # cpu-py311's own smoke check
    return root


@pytest.fixture
def engineless_project(project: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """`project` with the committed lockfiles too, as the working folder, and no engine to reach."""
    shutil.copytree(REPO / "lockfiles", project / "lockfiles")
    monkeypatch.chdir(project)
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")  # nothing listens there
    return project


@pytest.fixture
def write_profile(project: Path) -> Callable[..., Path]:
    def write(stem: str | None = None, text: str | None = None, **fields: Any) -> Path:
        data = {**VALID, **fields}
        data = {k: v for k, v in data.items() if v is not None}
        stem = stem or str(data.get("name", "x"))
        path = project / "profiles" / f"{stem}.yaml"
        path.write_text(text if text is not None else yaml.safe_dump(data, sort_keys=False))
        return path

    return write


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Callable[..., Result]:
    from envbuild.cli import run

    monkeypatch.setenv("COLUMNS", "200")

    def invoke(*args: str) -> Result:
        capsys.readouterr()
        code = run(list(args))
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return invoke


def dockerfile_instructions(text: str) -> list[str]:
    """The instruction keywords of a Dockerfile in order, comments and continuation lines folded away."""
    out: list[str] = []
    continued = False
    for line in text.splitlines():
        stripped = line.strip()
        if not continued and stripped and not stripped.startswith("#"):
            out.append(stripped.split(None, 1)[0])
        continued = stripped.endswith("\\")
    return out
