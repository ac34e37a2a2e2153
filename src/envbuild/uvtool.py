"""uv, the resolver and installer envbuild drives: where it is, its environment, and running it.

Every uv call of every stage (lock, venv, outdated, the compat refresh) goes through `run`, so a
missing uv, a stalled index or a failed resolution reads the same everywhere.
"""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar

from envbuild import fetchfail, proc
from envbuild.errors import EnvbuildError, LockError
from envbuild.names import PLATFORM_TAGS, PYPI_SIMPLE

E = TypeVar("E", bound=EnvbuildError)

# UV_* settings of the caller's shell would silently change what gets locked.
_ENV_KEEP = {
    "UV_CACHE_DIR",
    "UV_NATIVE_TLS",
    "UV_HTTP_TIMEOUT",
    "UV_HTTP_RETRIES",
    "UV_OFFLINE",
    "UV_INSECURE_HOST",
}
# What a user changes when an index is out of reach (fetchfail names the host and the cause).
LOCK_ROUTE = (
    "point `torch_index:` (the PyTorch index) or `index_url:` (PyPI) at a mirror this machine reaches, "
    "in the profile or with --torch-index / --index-url; or pass --find-links DIR with the wheels; "
    "or lock on a connected machine and commit the lockfiles"
)
TIMEOUT_ENV = "ENVBUILD_UV_TIMEOUT"
DEFAULT_TIMEOUT_S = 1800.0


def binary() -> str:
    """ENVBUILD_UV when set (a uv of the user's choosing), else the uv that came with envbuild (the
    `uv` package), else one on PATH."""
    if os.environ.get("ENVBUILD_UV"):
        return os.environ["ENVBUILD_UV"]
    candidate = Path(sysconfig.get_path("scripts")) / "uv"
    if candidate.is_file():
        return str(candidate)
    found = shutil.which("uv") or shutil.which("uv", path=str(Path(sys.executable).parent))
    return found or "uv"  # proc.run names it as missing, with the fix


def environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("UV_") or k in _ENV_KEEP}


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
