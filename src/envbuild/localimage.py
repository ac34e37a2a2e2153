"""Which local image a profile's name stands for, when a command is given the name (run, smoke, push)."""

from __future__ import annotations

from typing import Any

from envbuild import engine, freshness
from envbuild import plan as plan_mod
from envbuild.aptfile import apt_lock_name
from envbuild.errors import ImageMissing, UsageError
from envbuild.lockfile import lock_sha256
from envbuild.names import (
    LABEL_APT_LOCK_SHA,
    LABEL_CONTENT_DIGEST,
    LABEL_IMAGE_DIGEST,
    LABEL_IMAGE_INPUTS,
    LABEL_LOCK_SHA,
    LABEL_PROFILE,
    LABEL_SOURCE,
    UNTESTED,
    content_digest,
    immutable_tag,
    moving_tag,
    part_digests,
)
from envbuild.profile import Profile
from envbuild.project import Project, repository_part, same_source, source_label


def repository(project: Project, repo: str | None) -> str:
    """The local image repository: --tag, else the project's (envbuild.toml's, else derived)."""
    return repo or project.repository


def profile_image(
    cli: Any, project: Project, prof: Profile, repo: str | None = None, facts: list[tuple[str, str, str]] | None = None
) -> tuple[str, Any]:
    """(ref, image) that a profile's name stands for when a command is given it instead of an image:
    REPO:NAME, the tag `run` starts and `push` publishes, built here or pulled; else, before any
    build passed its smoke test, the newest `--no-smoke` build (REPO:NAME-untested). REPO:NAME is
    whichever build was tagged last: where it names a build of other inputs (on a shared engine,
    another clone of the project, another branch's lockfiles, tagged it after this one's), the
    tested build of this checkout's inputs comes first, REPO:NAME-<content digest>: `run`, `smoke`
    and `push` took the other clone's image. An image built FROM this checkout's (a team's tweak
    tagged REPO:NAME) carries its digest, and stays what the name stands for.

    `facts`: local_facts of the profile where the caller has them already.
    ImageMissing, a usage error naming REPO:NAME, when there is none of them."""
    moving = moving_tag(repository(project, repo), prof.name)
    digest = current_digest(local_facts(project, prof) if facts is None else facts)
    named = _local(cli, moving, prof.name)
    ours = named is not None and dict(named.labels or {}).get(LABEL_CONTENT_DIGEST) == digest
    first = [immutable_tag(repository(project, repo), prof.name, digest)] if digest and not ours else []
    for ref in [*first, moving, moving + UNTESTED]:
        image = named if ref == moving else _local(cli, ref, prof.name)
        if image is not None:
            check_belongs(project, prof, ref, dict(image.labels or {}))
            return ref, image
    raise ImageMissing(
        f"no image {moving} in the engine",
        hint=f"build it (envbuild build {prof.name}) or pull it (envbuild pull {prof.name})",
    )


def _local(cli: Any, ref: str, profile: str) -> Any:
    try:
        return engine.local_image(cli, ref, profile)
    except ImageMissing:
        return None


def current_digest(facts: list[tuple[str, str, str]]) -> str:
    """The content digest (io.envbuild.content-digest) a build of this checkout's profile and
    lockfiles carries, from their local_facts (the inputs the build digests); "" without a
    readable lockfile."""
    local = {label: value for _, label, value in facts}
    lock, apt = local[LABEL_LOCK_SHA], local[LABEL_APT_LOCK_SHA]
    if len(lock) != 64:
        return ""
    return content_digest(lock, local[LABEL_IMAGE_DIGEST], apt if len(apt) == 64 else "")


def local_facts(project: Project, prof: Profile) -> list[tuple[str, str, str]]:
    """(what, label, local value) that an image built from this checkout carries: the lockfile's
    identity and the digest of everything else that reaches the image (plan.Plan.image_digest)."""
    plan = plan_mod.make(project, prof, strict=False)
    lock_path = freshness.primary_lock(project, plan)
    try:
        local_lock = lock_sha256(lock_path.read_text("utf-8"))
    except FileNotFoundError:
        local_lock = "(no local lockfile)"
    except (OSError, UnicodeDecodeError):
        local_lock = "(unreadable lockfile)"
    apt_path = freshness.lock_dir(project, prof.name) / apt_lock_name(plan.platforms[0])
    try:
        local_apt = lock_sha256(apt_path.read_text("utf-8"))
    except FileNotFoundError:
        local_apt = "(none)"  # OS packages not locked: an image without the label matches
    except (OSError, UnicodeDecodeError):
        local_apt = "(unreadable apt.lock)"
    return [
        ("lockfile sha256", LABEL_LOCK_SHA, local_lock),
        ("apt.lock sha256", LABEL_APT_LOCK_SHA, local_apt),
        ("image inputs digest", LABEL_IMAGE_DIGEST, plan.image_digest),
        ("image inputs", LABEL_IMAGE_INPUTS, part_digests(plan.image_inputs)),
    ]


def check_belongs(project: Project, prof: Profile, ref: str, labels: dict[str, str]) -> None:
    """An image a profile's name resolved to must say it is that profile's, built by this project;
    another project's image under the same tag is refused with the fix, never used silently."""

    built_as = labels.get(LABEL_PROFILE)
    if built_as != prof.name:
        raise UsageError(
            f"{ref} is not an envbuild image of {prof.name} (its profile label says {built_as or 'nothing'})",
            hint=f"build it here (envbuild build {prof.name}), or name another image with --tag",
        )
    source = other_source(project, labels)
    if source:
        raise UsageError(
            f"{ref} was built by another project ({source}), not this one ({source_label(project)})",
            hint=f"build it here (envbuild build {prof.name}); {own_repository_fix(project)}",
        )


def own_repository_fix(project: Project) -> str:
    """How to give this project a repository no other project on the engine uses: the default is
    envbuild/<name>, so two folders (or remotes) of one name meet there; a concrete value to set."""
    if project.config.repository:
        return (
            f"envbuild.toml's repository ({project.config.repository}) is another project's too: "
            "give this project one of its own"
        )
    # the parent folder's name tells two folders of one name apart (/srv/a/app, /srv/b/app)
    parent = repository_part(project.root.parent.name) or "2"
    suggested = f"envbuild/{repository_part(f'{parent}-{project.name}')}"
    return (
        f"projects named {project.name} share envbuild/{project.name} by default: give this one its own, "
        f'repository = "{suggested}" under [envbuild] in its envbuild.toml'
    )


def taken_from(cli: Any, project: Project, ref: str) -> str:
    """The other project whose image `ref` names now, which a build of this one is about to move the
    tag from (its `run` and `push` then refuse what the tag names); "" when the tag is free or ours.
    Two projects in folders of one name (or with remotes of one name) share envbuild/<name> by default."""
    try:
        return other_source(project, dict(engine.local_image(cli, ref).labels or {}))
    except ImageMissing:
        return ""


def other_source(project: Project, labels: dict[str, str]) -> str:
    """The source label of an image another project built (by its labels); "" for this one's or
    an unlabelled image."""
    source = labels.get(LABEL_SOURCE, "")
    return source if source and not same_source(source, source_label(project)) else ""
