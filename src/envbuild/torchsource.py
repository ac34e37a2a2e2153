"""Where the torch family comes from: the route a build takes (PyPI or the PyTorch index), the
canonical index a lockfile records, and today's way to reach it (mirrors, a wheelhouse)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from envbuild import compat
from envbuild.names import PYPI_SIMPLE, TORCH_INDEX_ROOT
from envbuild.profile import Profile


@dataclass(frozen=True)
class TorchSource:
    """Where the torch family is resolved and installed from, for one profile.

    `route` and `canonical_index` are facts about the build (what lock records); `index_url`,
    `torch_index` and `find_links` are today's way to reach it (mirrors, a wheelhouse), which
    may differ on every machine and never reach a lockfile.
    """

    route: str  # "pypi" (PyPI's default wheel is this build) or "index"
    index_url: str  # the PyPI (mirror) URL
    torch_index: str | None  # where the torch family is fetched from today, when route == "index"
    torch_index_flat: bool  # torch_index is a flat folder of wheels (find-links style)
    find_links: tuple[str, ...]
    canonical_index: str  # the public index this build lives on: what a lockfile records
    # A build's context holds every wheel the lock pins: its installs ask no index at all (set by
    # the build from the wheel cache; a lock never is offline)
    offline: bool = False

    # How an install of a hash-pinned lockfile picks among the indexes. uv's default (first-index)
    # looks a package up only on the first index that has its name, and the PyTorch index mirrors
    # older copies of common packages (numpy, filelock, jinja2, ...): a pin newer than its copy
    # fails to resolve. Every artifact's sha256 is pinned, so whichever index serves it, it is the
    # locked file: the dependency confusion first-index guards against cannot happen here.
    index_strategy = "unsafe-best-match"

    @property
    def extra_index(self) -> str:
        """The index pip or uv needs beside index_url: the torch index, unless it is a flat wheelhouse."""
        return self.torch_index or "" if self.route == "index" and not self.torch_index_flat else ""


def _as_url(location: str) -> tuple[str, bool]:
    """A URL for an index or wheelhouse; local folders are flat (find-links style) indexes."""
    if location.startswith(("http://", "https://")):
        return location.rstrip("/"), location.endswith((".html", "/links"))
    path = location.removeprefix("file://")
    return Path(path).resolve().as_uri(), True


def _holds_torch(location: str) -> bool:
    """A local folder with a torch wheel in it (a URL is not looked into: that would ask the network)."""
    if "://" in location and not location.startswith("file://"):
        return False
    folder = Path(location.removeprefix("file://"))
    return folder.is_dir() and next(folder.glob("torch-*.whl"), None) is not None


def torch_route(profile: Profile) -> tuple[str, str]:
    """(route, canonical index) of the profile's torch build, from the compat data: "pypi" when PyPI's
    own wheel for the release is this build on every platform of the profile."""
    db = compat.load()
    row = db.release(profile.torch)
    # A Python PyPI has no wheel for (a preview) is served by the PyTorch index alone.
    has_wheel = row is not None and row.on_pypi(profile.python)
    on_pypi = (
        profile.accelerator == "cuda"
        and row is not None
        and row.pypi_cuda == profile.cuda
        and "aarch64" not in profile.platforms
    )
    # PyPI's aarch64 wheels are CPU builds: a CPU profile for aarch64 alone locks from PyPI. With
    # x86_64 as well it needs the CPU index, which serves both (PyPI's x86_64 wheel is CUDA).
    cpu_on_pypi = profile.accelerator == "cpu" and set(profile.platforms) == {"aarch64"}
    if has_wheel and (on_pypi or (cpu_on_pypi and db.pypi_platform_builds.aarch64 == "cpu")):
        return "pypi", PYPI_SIMPLE
    return "index", f"{TORCH_INDEX_ROOT}/{profile.build_tag}"


def torch_source(
    profile: Profile,
    *,
    index_url: str | None = None,
    torch_index: str | None = None,
    find_links: tuple[str, ...] = (),
    route: tuple[str, str] | None = None,
) -> TorchSource:
    """Where the torch family comes from today. `route`: (route, canonical index) as a lockfile
    recorded it; None works it out from today's compat data (what `lock` does)."""
    kind, canonical = route or torch_route(profile)
    index = index_url or profile.index_url or PYPI_SIMPLE
    links = tuple(find_links) or tuple(profile.find_links)
    explicit = torch_index or profile.torch_index
    if kind == "pypi" and not explicit:
        return TorchSource("pypi", index, None, False, links, canonical)
    if explicit:
        url, flat = _as_url(explicit)
    elif links:
        # An air-gapped wheelhouse stands in for the PyTorch index: the one that holds a torch wheel,
        # wherever it is listed (a folder of the team's own sdists may come first), else the first.
        url, flat = _as_url(next((link for link in links if _holds_torch(link)), links[0]))
    else:
        url, flat = canonical, False
    return TorchSource("index", index, url, flat, links, canonical)
