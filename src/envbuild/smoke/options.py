"""The smoke command's options, checked before anything starts: a wrong one is a usage error with
the fix, never a run that ignored it or checked nothing."""

from __future__ import annotations

import difflib

from envbuild.errors import UsageError
from envbuild.smoke.inside.core import LOCK_MATCHES
from envbuild.smoke.inside.report import CHECKS


def check(
    local: bool,
    target: str | None,
    *,
    python: str | None,
    lock_match: str | None,
    min_peak: float | None,
    shm_size: str | None,
    ipc_host: bool,
    tag: str | None,
    only: list[str],
) -> None:
    if lock_match is not None and lock_match not in LOCK_MATCHES:
        raise UsageError(
            f"--lock-match {lock_match!r}: use exact, pins or none", hint="e.g. envbuild smoke IMAGE --lock-match pins"
        )
    if min_peak is not None and not 0 < min_peak <= 100:
        raise UsageError(
            f"--min-peak {min_peak:g}: a percentage of the datasheet peak, 0-100", hint="e.g. --min-peak 60"
        )
    _check_only(only, f"{'--local ' if local else ''}{target or 'NAME'}")
    _check_mode(local, target, python=python, shm_size=shm_size, ipc_host=ipc_host, tag=tag)


def _check_only(only: list[str], shown: str) -> None:
    """A project's own check (check:FILE) is looked up where it runs: an image has the scripts it was
    built with, and the smoke test there names them when one is missing."""
    names = [name for name, _ in CHECKS]
    for name in only:
        if name in names or (name.startswith("check:") and len(name) > len("check:")):
            continue
        close = difflib.get_close_matches(name, names, n=1)
        raise UsageError(
            f"--only {name!r}: no such check; the checks are {', '.join(names)}, and check:FILE for a "
            "script of the profile's `checks` (the labels check follows every run in a container)",
            hint=f"envbuild smoke {shown} --only {close[0] if close else names[0]}",
        )


def _check_mode(
    local: bool, target: str | None, *, python: str | None, shm_size: str | None, ipc_host: bool, tag: str | None
) -> None:
    """Options of the other mode would be ignored silently, and the user would believe they took effect."""
    name = target or "NAME"
    if not local:
        # --lock-match does go with an image: `pins` checks a derived image (FROM it + pip install)
        if python is not None:
            raise UsageError(
                "--python goes with --local: an image runs its own interpreter",
                hint=f"envbuild smoke --local {name} --python {python}",
            )
        return
    for option, shown in (
        ("--shm-size", None if shm_size is None else f"--shm-size {shm_size}"),
        ("--ipc-host", "--ipc-host" if ipc_host else None),
        ("--tag", None if tag is None else f"--tag {tag}"),
    ):
        if shown:
            raise UsageError(
                f"{option} is for a run in a container; --local runs here, with this host's /dev/shm and no image",
                hint=f"envbuild smoke {name} {shown} (without --local)",
            )
