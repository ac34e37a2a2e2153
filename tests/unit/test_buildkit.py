"""BuildKit's path: identical image digests need its rewrite-timestamp, which only 0.13 and later have."""

from __future__ import annotations

import pytest

from envbuild import buildkit

# `docker buildx inspect` as buildx 0.12 and 0.14 print it (the field was renamed in between)
OLD = "Name:      default\nDriver:    docker\n\nNodes:\nName:      default\nBuildkit:  v0.8.3+unknown\n"
NEW = "Name:          default\nDriver:        docker\nNodes:\nName:             default\nBuildKit version: v0.13.2\n"


@pytest.mark.parametrize(
    ("text", "version", "output"),
    [
        (OLD, (0, 8), ["--load"]),
        (NEW, (0, 13), ["--output", "type=docker,rewrite-timestamp=true"]),
        ("Name: default\n", None, ["--load"]),
    ],
)
def test_the_image_comes_back_with_rewritten_times_only_where_buildkit_can(
    text: str, version: tuple[int, int] | None, output: list[str]
) -> None:
    assert buildkit.buildkit_version(text) == version
    assert buildkit.buildx_output(version) == output
