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

from envbuild.names import canonical
from envbuild.plan import Plan
from envbuild.profile import Profile

CONFIG_FILE = "build-requires.toml"  # uv's --config-file, beside the lock input and in the build context


def for_lock(plan: Plan) -> dict[str, tuple[str, ...]]:
    """{package: requirements} for a resolve: pinned where the plan's requirements pin exactly
    (torch, its companions with `auto` resolved, numpy, `name==X` packages). The torch family by
    version alone: a build environment takes no index routing, and metadata does not depend on the
    build (cpu or cu121) of torch it was made with."""
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


def missing(prof: Profile, locked: Mapping[str, str]) -> list[str]:
    """The names `build_requires` asks for that the lockfile (`locked`: {name: version}) lacks."""
    wanted = {canonical(n) for names in prof.build_requires.values() for n in names}
    return sorted(wanted - set(locked))


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
