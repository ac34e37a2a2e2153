"""validate's rules about the profile's package lists: `packages` and `build_requires`."""

from __future__ import annotations

from typing import Any

from packaging.requirements import InvalidRequirement, Requirement

from envbuild.names import canonical
from envbuild.profilefile import Loaded


def check(ld: Loaded, data: dict[str, Any]) -> None:
    _listed_twice(ld, data)
    if data.get("flavor") == "conda" and data.get("build_requires"):
        ld.add(
            "error",
            "build_requires",
            "is for venv profiles: a conda environment's packages come built from conda-forge",
            "remove it, or use flavor: venv",
        )


def _listed_twice(ld: Loaded, data: dict[str, Any]) -> None:
    """One package listed twice without markers to tell them apart: the resolver would only say
    "unsatisfiable" (two pins) or quietly take the stricter one."""
    first: dict[str, int] = {}
    listed = data.get("packages")
    for i, item in enumerate(listed if isinstance(listed, list) else []):
        try:
            req = Requirement(str(item))
        except InvalidRequirement:
            continue  # the model says what is wrong with it
        if req.marker is not None:
            continue  # markers may tell two entries apart (one per Python or platform)
        key = canonical(req.name)
        if key in first:
            where = f"packages[{first[key]}]"
            ld.add("error", f"packages[{i}]", f"{req.name} is listed twice (also {where})", "keep one pin", str(item))
        else:
            first[key] = i
