"""What an sdist's isolated build gets besides what it declares: the profile's `build_requires`.

torch-scatter, flash-attn and apex import torch in setup.py without declaring it, so uv's isolated
build (PEP 517) fails with "No module named 'torch'" in `lock` (which builds their metadata) and in
the image's builder. uv's `extra-build-dependencies` setting adds requirements to one package's
build environment; this pins them. In a lock, to what the profile pins (nothing is resolved yet);
in a build or a venv, to the lockfile's versions, so what a package is compiled against is the
environment it then runs in, hash-checked through the build constraint (requirements.lock).
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from packaging.requirements import InvalidRequirement, Requirement

from envbuild.names import TORCH_FAMILY_RE, canonical
from envbuild.plan import Plan
from envbuild.profile import Profile

CONFIG_FILE = "build-requires.toml"  # uv's --config-file, beside the lock input and in the build context


def for_lock(plan: Plan) -> dict[str, tuple[str, ...]]:
    """{package: requirements} for a resolve: pinned where the plan's requirements pin exactly
    (torch, its companions with `auto` resolved, numpy, `name==X` packages). The torch family by
    version: metadata does not depend on the build (cpu or cu121) it was made with, and the lock's
    find-links (index_pages) make the profile's build the one uv picks."""
    pins: dict[str, str] = {}
    for line in plan.requirements:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        exact = [s.version for s in req.specifier if s.operator == "=="]
        if req.marker is None and len(exact) == 1 and "*" not in exact[0]:
            pins[canonical(req.name)] = exact[0]
    return {
        canonical(pkg): tuple(f"{n}=={pins[canonical(n)]}" if canonical(n) in pins else n for n in names)
        for pkg, names in sorted(plan.profile.build_requires.items())
    }


def _named(prof: Profile) -> list[str]:
    """Every name `build_requires` asks for, canonical, sorted, once."""
    return sorted({canonical(n) for names in prof.build_requires.values() for n in names})


def index_pages(plan: Plan) -> list[str]:
    """The PyTorch index's page of each torch-family name `build_requires` asks for, as find-links for
    a lock: a build environment takes no index routing (uv applies `sources` to the project's own
    requirements only), so without them `torch==2.13.0` comes from PyPI, a 3 GB CUDA build for a
    CPU profile's metadata. From a flat page uv takes the +cpu build, a higher version than PyPI's."""
    src = plan.source
    if src.route != "index" or not src.torch_index or src.torch_index_flat:
        return []  # PyPI's build is the profile's, or a wheelhouse among the find-links holds it
    return [f"{src.torch_index.rstrip('/')}/{n}/" for n in _named(plan.profile) if TORCH_FAMILY_RE.fullmatch(n)]


def missing(prof: Profile, locked: Mapping[str, str]) -> list[str]:
    """The names `build_requires` asks for that the lockfile (`locked`: {name: version}) lacks."""
    return [n for n in _named(prof) if n not in locked]


def for_build(prof: Profile, locked: Mapping[str, str]) -> dict[str, tuple[str, ...]]:
    """{package: requirements} for a build from the lockfile: each at its locked version."""
    return {
        canonical(pkg): tuple(f"{canonical(n)}=={locked[canonical(n)]}" for n in names if canonical(n) in locked)
        for pkg, names in sorted(prof.build_requires.items())
    }


def config(requirements: Mapping[str, tuple[str, ...]]) -> str:
    """uv's configuration file (uv.toml's format) giving each package's build its requirements."""
    lines = [
        "# Rendered by envbuild from the profile's build_requires; do not edit.",
        "[extra-build-dependencies]",
    ]
    # JSON strings are TOML basic strings: names and pins need no other escaping
    lines += [f"{json.dumps(pkg)} = [{', '.join(json.dumps(r) for r in reqs)}]" for pkg, reqs in requirements.items()]
    return "\n".join(lines) + "\n"
