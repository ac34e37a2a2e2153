"""The one way envbuild runs another program (uv, conda-lock, git, the docker CLI, hadolint).

A missing binary, a time-out or a crash of the program comes back as the calling stage's own
error type, naming the program and the fix, so it reaches the user with that stage's exit code and
never as "internal error" (exit 70). The program's failure exit is the caller's to judge: it knows
what the output means.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TypeVar

from envbuild.errors import EnvbuildError

E = TypeVar("E", bound=EnvbuildError)


def run(
    argv: Sequence[str],
    *,
    error: type[E],
    timeout: float,
    what: str = "",
    cwd: Path | None = None,
    stdin: str | None = None,
    env: Mapping[str, str] | None = None,
    install_hint: str = "",
    timeout_hint: str = "",
) -> subprocess.CompletedProcess[str]:
    """Run `argv` to completion with its output captured as text.

    `error` is the stage's error class; `what` names the program for people (default: argv[0]'s
    name). The returned process may have failed: callers check `returncode`.
    """
    shown = what or Path(argv[0]).name
    try:
        return subprocess.run(
            list(argv),
            cwd=cwd,
            input=stdin,
            capture_output=True,
            text=True,
            env=dict(env) if env is not None else None,
            check=False,
            timeout=timeout,
        )
    except FileNotFoundError as exc:
        raise error(
            f"{shown} is not installed (no {argv[0]} here)",
            hint=install_hint or f"install {shown}, or put it on PATH",
        ) from exc
    except PermissionError as exc:
        raise error(f"{shown} ({argv[0]}) cannot be run: {exc.strerror}", hint="check its file permissions") from exc
    except subprocess.TimeoutExpired as exc:
        raise error(
            f"{shown} did not finish within {timeout:.0f} s and was stopped",
            hint=timeout_hint or "try again; if it keeps stalling, check the network path to the indexes",
        ) from exc
    except OSError as exc:
        raise error(f"{shown} could not be started: {exc}") from exc


def run_ok(argv: Sequence[str], *, timeout: float, cwd: Path | None = None) -> str | None:
    """stdout of a best-effort helper (git for labels, nvidia-smi for doctor); None when it is not
    there, fails or stalls: the caller has a fallback."""
    try:
        proc = subprocess.run(
            list(argv), cwd=cwd, capture_output=True, text=True, check=False, timeout=timeout, env=os.environ.copy()
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout if proc.returncode == 0 else None
