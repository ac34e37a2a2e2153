"""uv, the resolver and installer envbuild drives: where it is, its environment, and running it.

Every uv call of every stage (lock, venv, outdated, the compat refresh) goes through `run`, so a
missing uv, a stalled index or a failed resolution reads the same everywhere.
"""

from __future__ import annotations

import os
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
        raise fetchfail.failure(error, what, done.stderr.strip() or done.stdout, route, fallback_hint)
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
        "--index-url",
        index_url,
        "--quiet",
    ]
    if not with_deps:
        args.append("--no-deps")
    out = run(args, error=error, cwd=Path.cwd(), stdin="".join(f"{r}\n" for r in requirements), route=route)
    pins = {}
    for line in out.splitlines():
        name, sep, version = line.strip().partition("==")
        if sep:
            pins[name.lower()] = version
    return pins
