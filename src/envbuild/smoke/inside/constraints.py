"""A conda image's constraints.txt pins, from the environment itself: `python -m
envbuild_smoke.constraints --append /opt/envbuild/constraints.txt NAME...` adds `NAME==VERSION` for
each NAME installed, as this Python's package metadata reports it (what pip compares a constraint
with). A venv image's pins come from its lockfile instead (envbuild build writes them): there the
lock's versions are pip's own; a conda lock's are the conda packages', and conda-forge's torch can
report another version string than its package's.

`--channel-only NAME...` (torchvision, torchaudio) holds each the same way where the environment has
it, and at `NAME<0` where it lacks it: PyPI's builds are made for PyPI's torch and fail on import
beside a conda channel's ("operator torchvision::nms does not exist"), yet pip installed them without
a word. Held, pip and uv stop and say "(constraint) torchvision<0"; the fix is in the profile."""

from __future__ import annotations

import argparse
import sys
from importlib import metadata


def pins(names: list[str]) -> list[str]:
    """`name==version` for each of `names` installed here, in the order given; the others left out."""
    out = []
    for name in names:
        try:
            out.append(f"{name}=={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            continue
    return out


def channel_only(names: list[str]) -> list[str]:
    """`name==version` for each of `names` installed here, `name<0` (no version at all) for the rest."""
    held = {line.partition("==")[0]: line for line in pins(names)}
    return [held.get(name, f"{name}<0") for name in names]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m envbuild_smoke.constraints")
    parser.add_argument("--append", required=True, help="the constraints file (its comment lines are there)")
    parser.add_argument("--channel-only", nargs="*", default=[], help="held as installed, else at NAME<0")
    parser.add_argument("names", nargs="+")
    args = parser.parse_args(argv)
    lines = pins(args.names) + channel_only(args.channel_only)
    if not any(line.startswith("torch==") for line in lines):  # the image's whole point: fail the build
        print(f"constraints: torch is not installed in {sys.prefix}", file=sys.stderr)
        return 1
    with open(args.append, "a", encoding="utf-8") as fh:
        fh.write("".join(f"{line}\n" for line in lines))
    print(f"constraints: {', '.join(lines)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
