"""Which local image a profile's name stands for, when a command is given the name (run, smoke, push)."""

from __future__ import annotations

import contextlib
from typing import Any

from envbuild import engine
from envbuild.errors import ImageMissing
from envbuild.names import UNTESTED, moving_tag
from envbuild.profile import Profile
from envbuild.project import Project


def repository(project: Project, repo: str | None) -> str:
    """The local image repository: --tag, else envbuild.toml's `repository`."""
    return repo or project.config.repository


def profile_image(cli: Any, project: Project, prof: Profile, repo: str | None = None) -> tuple[str, Any]:
    """(ref, image) that a profile's name stands for when a command is given it instead of an image:
    REPO:NAME, the tag `run` starts and `push` publishes, built here or pulled; else, before any
    build passed its smoke test, the newest `--no-smoke` build (REPO:NAME-untested).

    ImageMissing, a usage error naming REPO:NAME, when there is neither."""
    moving = moving_tag(repository(project, repo), prof.name)
    try:
        return moving, engine.local_image(cli, moving, prof.name)
    except ImageMissing:
        with contextlib.suppress(ImageMissing):
            return moving + UNTESTED, engine.local_image(cli, moving + UNTESTED, prof.name)
        raise
