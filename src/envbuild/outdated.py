"""`envbuild outdated`: what upstream released since the profiles were pinned.

A profile pins exact releases on purpose, so nothing moves until someone moves it.
This says when it is worth moving: a newer patch of the pinned torch or numpy series
(bug fixes, same ABI), and a newer torch release that has the same build for the same
Python (chosen as `envbuild new` would choose it). The patches come from the index
with the same `uv pip compile --no-deps` lookup `new` uses.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from packaging.version import Version

from envbuild import proc, scaffold, uvtool, validate
from envbuild.errors import EnvbuildError
from envbuild.names import PYPI_SIMPLE
from envbuild.profile import NameParts, Profile
from envbuild.project import Project


@dataclass
class Drift:
    profile: str
    torch: str
    numpy: str
    torch_patch: str | None = None  # newest patch of the pinned torch series, when newer
    numpy_patch: str | None = None
    newer_torch: str | None = None  # newest patch of a newer release with this build and Python
    newer_numpy: str | None = None  # newest patch of a newer numpy series the pinned torch allows
    notes: list[str] = field(default_factory=list)
    error: str | None = None
    checked: bool = True  # False where nothing was looked up: a conda profile, or a lookup that failed

    @property
    def outdated(self) -> bool:
        return bool(self.torch_patch or self.numpy_patch or self.newer_torch or self.newer_numpy)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "outdated": self.outdated}


def _series(version: str) -> str:
    v = Version(version)
    return f"{v.major}.{v.minor}"


def _newer(found: str | None, pinned: str) -> str | None:
    return found if found and Version(found) > Version(pinned) else None


def drift(prof: Profile, index_url: str) -> Drift:
    """One profile against the index; a lookup failure is recorded, not raised, so the others still report."""
    out = Drift(prof.name, prof.torch, prof.numpy)
    if prof.flavor == "conda":
        out.notes.append("conda profile: its torch comes from conda-forge, which this lookup does not read")
        out.checked = False
        return out
    parts = NameParts(prof.build_tag, prof.accelerator, prof.accelerator_version, prof.python)
    try:
        torch_series, _ = scaffold.pick_torch(parts)
        numpy_series = scaffold.pick_numpy(parts, prof.torch)
        ask = [f"torch=={_series(prof.torch)}.*", f"numpy=={_series(prof.numpy)}.*"]
        found = uvtool.newest_versions(ask, prof.python, index_url=index_url)
        out.torch_patch = _newer(found.get("torch"), prof.torch)
        out.numpy_patch = _newer(found.get("numpy"), prof.numpy)
        # One lookup for both newer series; a pinned series newer than what `new` would pick stays put.
        later = {
            pkg: series
            for pkg, series, pinned in (
                ("torch", torch_series.release, prof.torch),
                ("numpy", numpy_series, prof.numpy),
            )
            if Version(series) > Version(_series(pinned))
        }
        if later:
            got = uvtool.newest_versions([f"{p}=={v}.*" for p, v in later.items()], prof.python, index_url=index_url)
            out.newer_torch, out.newer_numpy = got.get("torch"), got.get("numpy")
    except EnvbuildError as exc:
        out.error, out.checked = exc.message.splitlines()[0], False
    return out


def report(project: Project, profiles: list[Profile], jobs: int = 4) -> list[Drift]:
    def one(prof: Profile) -> Drift:
        return drift(prof, prof.index_url or project.config.index_url or PYPI_SIMPLE)

    return proc.gather(one, profiles, jobs)


def report_all(project: Project, jobs: int = 4) -> tuple[list[Drift], list[str]]:
    """Every profile of the project, and the names of the invalid ones: each of those is a row that
    says why, not the end of the report, so a scheduled job still hears about the others."""
    loaded = validate.load_all(project)
    drifts = report(project, [p for p in loaded.values() if isinstance(p, Profile)], jobs)
    invalid = []
    for name, exc in loaded.items():
        if isinstance(exc, Profile):
            continue
        invalid.append(name)
        drifts.append(Drift(name, "-", "-", error=f"not valid: {exc.first_problem()}", checked=False))
    return sorted(drifts, key=lambda d: d.profile), invalid
