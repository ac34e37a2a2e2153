"""`envbuild status`: where each profile stands (valid, locked, built, tested) and the next command.

Offline except for one question to the engine; an engine that does not answer makes the image
column "unknown", not the command fail: the rest is still worth knowing.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from envbuild import engine, freshness, images, localimage, smokerecord, validate
from envbuild import plan as plan_mod
from envbuild.errors import EngineUnavailable, ImageMissing, ProfileError, UsageError
from envbuild.names import is_envbuild_tag, moving_tag
from envbuild.profile import Profile
from envbuild.project import Project


@dataclass
class ProfileStatus:
    profile: str
    valid: bool
    problem: str  # the first error when not valid
    lockfile: str  # fresh | missing | stale | edited | -
    lock_reason: str
    image: str  # tested | untested | stale | none | foreign | unknown | -
    image_ref: str
    next: str  # the command that moves it forward; "" when it is ready
    # a GPU profile's tested image: did its smoke test run the GPU checks (pass), or was it built
    # on a host without GPUs (skip)? "-" for CPU profiles and images not tested
    gpu_checks: str = "-"
    image_problem: str = ""  # why the image column is "foreign" or "stale"

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def image_state(rows: list[images.ImageRow], name: str, repository: str = "") -> tuple[str, str, str]:
    """(state, a tag of it, its smoke test's gpu check); of its tags, the one in `repository` first
    (a pushed image's registry tag sorted before it and was shown instead)."""
    # By the tags envbuild gives: an image built FROM the profile's (`myteam/app:latest`) has its
    # labels, and was reported as the profile's stale image
    mine = {
        r.image_id: sorted(
            (t for t in r.tags if is_envbuild_tag(t, name)), key=lambda t: t.rpartition(":")[0] != repository
        )
        for r in rows
        if r.profile == name
    }
    ours = [r for r in rows if r.profile == name and mine[r.image_id]]
    current = [r for r in ours if r.state == "current"]
    if current:
        best = max(current, key=lambda r: (r.smoke == "passed", r.created))
        return ("tested" if best.smoke == "passed" else "untested"), mine[best.image_id][0], best.smoke_gpu
    if ours:
        newest = max(ours, key=lambda r: r.created)
        return "stale", mine[newest.image_id][0], "-"
    return "none", "", "-"


def foreign_problem(cli: Any, rows: list[images.ImageRow], project: Project, prof: Profile) -> tuple[str, str]:
    """(REPO:NAME, why) when the profile's tag names an image `run NAME` refuses (retagged by hand,
    or another project's under the same tag), judged by localimage.check_belongs as `run` judges
    it: the profile is not ready whatever its own images say. ("", "") when the tag is ours or absent."""
    tag = moving_tag(project.repository, prof.name)
    at = next((r for r in rows if r.profile == prof.name and tag in r.tags), None)
    if at is not None and at.smoke == "altered":  # built FROM the tested image (or relabelled) and tagged so
        return tag, f"{smokerecord.ALTERED}: push refuses it"
    if at is not None:
        return "", ""  # one of the builds the survey found: check_belongs would pass it
    try:
        image = engine.local_image(cli, tag, prof.name)
        localimage.check_belongs(project, prof, tag, dict(image.labels or {}))
    except ImageMissing:
        return "", ""
    except EngineUnavailable:
        return "", ""  # the survey just answered; a later hang leaves the state as the rows give it
    except UsageError as exc:
        return tag, f"{exc.message}: run refuses it"
    return "", ""


def status(project: Project, names: list[str] | None = None) -> tuple[list[ProfileStatus], str]:
    """Each profile's status, and a note when the engine could not be asked."""
    expected = validate.load_all(project, names)
    chosen = names or sorted(expected)
    note = ""
    rows: list[images.ImageRow] | None
    cli: Any = None
    try:
        cli, surveyed = images.survey(project, chosen, expected)
        rows = surveyed.rows
    except EngineUnavailable as exc:
        rows, note = None, f"{exc.message}; image states are unknown"
    out = []
    for name in chosen:
        target = expected.get(name) or ProfileError(f"no profile {name}")
        if not isinstance(target, Profile):
            errors = [d.render() for d in target.diagnostics if d.severity == "error"] or [target.message]
            out.append(ProfileStatus(name, False, errors[0], "-", "", "-", "", f"envbuild validate {name}"))
            continue
        found = freshness.query(project, plan_mod.make(project, target, strict=False))
        state, reason = found.state, found.reason
        image, ref, gpu = ("unknown", "", "-") if rows is None else image_state(rows, name, project.repository)
        taken, problem = ("", "") if rows is None else foreign_problem(cli, rows, project, target)
        if taken:
            image, ref, gpu = "foreign", taken, "-"
        elif image == "stale":  # which input moved: `status` said stale and nothing more
            why = next((r.why for r in rows or [] if ref in r.tags), "")
            problem = f"{ref} is stale: {why}" if why else ""
        if state != "fresh":
            step = f"envbuild lock {name}"
        elif image == "unknown":
            step = "envbuild doctor"  # nothing could be asked of the engine: never "ready"
        elif image in {"none", "stale", "untested", "foreign"}:
            step = f"envbuild build {name}"
        else:
            step = ""
        out.append(ProfileStatus(name, True, "", state, reason, image, ref, step, gpu, problem))
    return out, note
