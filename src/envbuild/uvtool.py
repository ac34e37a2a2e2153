"""uv, the resolver and installer envbuild drives: where it is, its environment, and running it.

Every uv call of every stage (lock, venv, outdated, the compat refresh) goes through `run`, so a
missing uv, a stalled index or a failed resolution reads the same everywhere.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar

from envbuild import fetchfail, lockahead, proc
from envbuild.errors import EnvbuildError, LockError
from envbuild.names import PLATFORM_TAGS, PYPI_SIMPLE

E = TypeVar("E", bound=EnvbuildError)

# What a user changes when an index is out of reach (fetchfail names the host and the cause).
LOCK_ROUTE = (
    "point `torch_index:` (the PyTorch index) or `index_url:` (PyPI) at a mirror this machine reaches, "
    "in the profile or with --torch-index / --index-url; or pass --find-links DIR with the wheels; "
    "or lock on a connected machine and commit the lockfiles"
)
TIMEOUT_ENV = "ENVBUILD_UV_TIMEOUT"
DEFAULT_TIMEOUT_S = 1800.0


# Both are worked out in lockahead, which starts a re-lock's uv call before this module loads.
binary = lockahead.uv_binary
environment = lockahead.uv_environment


def interpreter(python: str, *, builds: bool = True) -> list[str]:
    """`--python` naming the interpreter envbuild runs on, for a uv call that resolves for Python
    `python`, or nothing (uv then looks for a `python3.Y` of that version on PATH, as before).

    Without it, every call pays for uv's interpreter discovery, and where that finds a pyenv shim
    (a script that picks the real binary when run) uv queries it anew each time, since the shim
    may lead elsewhere tomorrow: 0.13 s per call for python3.11 on the CI machines, 0.45 s for
    python3.12 and python3.13, a third of a warm lock. An interpreter named by its path is queried
    once and remembered. The interpreter plays no part in what a resolution for a target Python
    and platform picks (--python-version and --python-platform set the markers); it only runs the
    builds of sdists' metadata. So envbuild's own interpreter is named where no build can happen
    (`builds=False`: every pin exact and read from uv's cache), or where it is the target's
    version anyway; a build for another version keeps an interpreter of that version."""
    here = sys.executable
    if not here or not os.path.isfile(here):  # an embedded interpreter: leave the choice to uv
        return []
    if builds and python.split(".")[:2] != [str(v) for v in sys.version_info[:2]]:
        return []
    return ["--python", here]


def timeout_s() -> float:
    """How long one uv call may take: ENVBUILD_UV_TIMEOUT seconds, else 30 minutes (a cold CUDA
    lock or install moves gigabytes)."""
    raw = os.environ.get(TIMEOUT_ENV, "")
    try:
        return float(raw) if raw else DEFAULT_TIMEOUT_S
    except ValueError:
        return DEFAULT_TIMEOUT_S


def run(
    args: Sequence[str],
    *,
    error: type[E],
    cwd: Path | None = None,
    stdin: str | None = None,
    route: str = LOCK_ROUTE,
    fallback_hint: str = "the resolver's message above says why",
    what: str = "uv",
    unsolved: fetchfail.Explanation | None = None,
) -> str:
    """uv's stdout; its failure as `error`, summarised by fetchfail with the uv message below."""
    done = proc.run(
        [binary(), *args],
        error=error,
        timeout=timeout_s(),
        what=what,
        cwd=cwd,
        stdin=stdin,
        env=environment(),
        install_hint="pip install uv (envbuild depends on it)",
        timeout_hint=f"an index stalled or is slow: retry, use a closer mirror ({route.split(';', maxsplit=1)[0]}), "
        f"or allow longer with {TIMEOUT_ENV}=SECONDS",
    )
    if done.returncode != 0:
        raise fetchfail.failure(error, what, done.stderr.strip() or done.stdout, route, fallback_hint, unsolved)
    return done.stdout


def ran_early(args: Sequence[str], *, error: type[E], cwd: Path) -> bool:
    """True when the entry point started this very call (`args` in `cwd`, as its files are now)
    before the CLI loaded, and it succeeded: what it wrote is then in `cwd`. False: run it now."""
    early = lockahead.claim(binary(), args, cwd, environment())
    if early is None:
        return False
    try:
        done = proc.wait(early.child, error=error, timeout=timeout_s(), what="uv")
    except BaseException:
        early.deliver(None)
        raise
    # A failed early call is run again as usual: that run's failure is the one reported.
    early.deliver(cwd if done.returncode == 0 else None)
    return done.returncode == 0


def newest_versions(
    requirements: Sequence[str],
    python: str,
    *,
    error: type[EnvbuildError] = LockError,
    index_url: str = PYPI_SIMPLE,
    with_deps: bool = False,
    route: str = LOCK_ROUTE,
) -> dict[str, str]:
    """What uv picks for `requirements` on Linux x86_64 and a target Python: {name: version}, no hashes."""
    args = [
        "pip",
        "compile",
        "-",
        "--python-version",
        python,
        "--python-platform",
        PLATFORM_TAGS["x86_64"],
        "--no-header",
        "--no-annotate",
        "--no-config",
        "--no-python-downloads",
        *interpreter(python),
        "--index-url",
        index_url,
        "--quiet",
    ]
    if not with_deps:
        args.append("--no-deps")
    # no answer here means the index has no such release (a series not out yet), not a conflict of pins
    unsolved = fetchfail.Explanation(
        f"{index_url} has no release for Python {python} that satisfies {' and '.join(requirements)}",
        "name a release the index has (uv's words say which of these it lacks, and what it found)",
    )
    stdin = "".join(f"{r}\n" for r in requirements)
    out = run(args, error=error, cwd=Path.cwd(), stdin=stdin, route=route, unsolved=unsolved)
    pins = {}
    for line in out.splitlines():
        name, sep, version = line.strip().partition("==")
        if sep:
            pins[name.lower()] = version
    return pins
