"""`envbuild status`: where each profile stands (valid, locked, built, tested) and the next command.

Offline except for one question to the engine; an engine that does not answer makes the image
column "unknown", not the command fail: the rest is still worth knowing.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from envbuild import images, lock
from envbuild.errors import EngineUnavailable, ProfileError
from envbuild.profile import Profile
from envbuild.project import Project


@dataclass
class ProfileStatus:
    profile: str
    valid: bool
    problem: str  # the first error when not valid
    lockfile: str  # fresh | missing | stale | -
    lock_reason: str
    image: str  # tested | untested | stale | none | unknown | -
    image_ref: str
    next: str  # the command that moves it forward; "" when it is ready

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def _image(rows: list[images.ImageRow], name: str) -> tuple[str, str]:
    mine = [r for r in rows if r.profile == name and r.tags]
    current = [r for r in mine if r.state == "current"]
    if current:
        best = max(current, key=lambda r: (r.smoke == "passed", r.created))
        return ("tested" if best.smoke == "passed" else "untested"), best.tags[0]
    if mine:
        newest = max(mine, key=lambda r: r.created)
        return "stale", newest.tags[0]
    return "none", ""


def status(project: Project, names: list[str] | None = None) -> tuple[list[ProfileStatus], str]:
    """Each profile's status, and a note when the engine could not be asked."""
    expected = images.load_all(project, names)
    chosen = names or sorted(expected)
    note = ""
    rows: list[images.ImageRow] | None
    try:
        rows = images.survey(project, chosen, expected)[1].rows
    except EngineUnavailable as exc:
        rows, note = None, f"{exc.message}; image states are unknown"
    out = []
    for name in chosen:
        target = expected.get(name) or ProfileError(f"no profile {name}")
        if not isinstance(target, Profile):
            errors = [d.render() for d in target.diagnostics if d.severity == "error"] or [target.message]
            out.append(ProfileStatus(name, False, errors[0], "-", "", "-", "", f"envbuild validate {name}"))
            continue
        state, reason = lock.lock_state(project, target)
        image, ref = ("unknown", "") if rows is None else _image(rows, name)
        if state != "fresh":
            step = f"envbuild lock {name}"
        elif image in {"none", "stale", "untested"}:
            step = f"envbuild build {name}"
        else:
            step = ""
        out.append(ProfileStatus(name, True, "", state, reason, image, ref, step))
    return out, note
