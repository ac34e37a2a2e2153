"""Which local image a profile's name stands for, when a command is given the name (run, smoke, push)."""

from __future__ import annotations

from typing import Any

from envbuild import engine
from envbuild.errors import ImageMissing, UsageError
from envbuild.names import LABEL_PROFILE, LABEL_SOURCE, UNTESTED, moving_tag
from envbuild.profile import Profile
from envbuild.project import Project, repository_part, same_source, source_label


def repository(project: Project, repo: str | None) -> str:
    """The local image repository: --tag, else the project's (envbuild.toml's, else derived)."""
    return repo or project.repository


def profile_image(cli: Any, project: Project, prof: Profile, repo: str | None = None) -> tuple[str, Any]:
    """(ref, image) that a profile's name stands for when a command is given it instead of an image:
    REPO:NAME, the tag `run` starts and `push` publishes, built here or pulled; else, before any
    build passed its smoke test, the newest `--no-smoke` build (REPO:NAME-untested).

    ImageMissing, a usage error naming REPO:NAME, when there is neither."""
    moving = moving_tag(repository(project, repo), prof.name)
    try:
        ref, image = moving, engine.local_image(cli, moving, prof.name)
    except ImageMissing:
        try:
            ref, image = moving + UNTESTED, engine.local_image(cli, moving + UNTESTED, prof.name)
        except ImageMissing:
            raise ImageMissing(
                f"no image {moving} in the engine",
                hint=f"build it (envbuild build {prof.name}) or pull it (envbuild pull {prof.name})",
            ) from None
    check_belongs(project, prof, ref, dict(image.labels or {}))
    return ref, image


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
