"""The one way envbuild runs another program (uv, conda-lock, git, the docker CLI, hadolint).

A missing binary, a time-out or a crash of the program comes back as the calling stage's own
error type, naming the program and the fix, so it reaches the user with that stage's exit code and
never as "internal error" (exit 70). The program's failure exit is the caller's to judge: it knows
what the output means.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

from envbuild.errors import EnvbuildError, Interrupted

E = TypeVar("E", bound=EnvbuildError)
T = TypeVar("T")
R = TypeVar("R")

# Programs started by worker threads (a `lock -j 4` runs four uv at once): an interrupt in the main
# thread stops them here, so no worker goes on to write what its program found.
_running: set[subprocess.Popen[str]] = set()
_guard = threading.Lock()
_cancelled = threading.Event()


def cancel_all() -> None:
    """Stop every program `run` started and make the next `run` (and `check_cancelled`) refuse."""
    with _guard:  # with run's registration under one lock: no program slips between set and snapshot
        _cancelled.set()
        procs = list(_running)
    for child in procs:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.pid, signal.SIGKILL)  # its own session: uv's helpers go with it


def reset() -> None:
    """A new piece of work may start programs again (after a cancelled one, in the same process)."""
    _cancelled.clear()


def check_cancelled() -> None:
    """Interrupted, when an interrupt arrived: a worker calls it before it writes anything."""
    if _cancelled.is_set():
        raise Interrupted("interrupted: nothing was written")


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
    check_cancelled()
    try:
        child = subprocess.Popen(
            list(argv),
            cwd=cwd,
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=dict(env) if env is not None else None,
            start_new_session=True,
        )
    except FileNotFoundError as exc:
        raise error(
            f"{shown} is not installed (no {argv[0]} here)",
            hint=install_hint or f"install {shown}, or put it on PATH",
        ) from exc
    except PermissionError as exc:
        raise error(f"{shown} ({argv[0]}) cannot be run: {exc.strerror}", hint="check its file permissions") from exc
    except OSError as exc:
        raise error(f"{shown} could not be started: {exc}") from exc
    return wait(child, stdin, error=error, timeout=timeout, what=shown, timeout_hint=timeout_hint)


def wait(
    child: subprocess.Popen[str],
    stdin: str | None = None,
    *,
    error: type[E],
    timeout: float,
    what: str,
    timeout_hint: str = "",
) -> subprocess.CompletedProcess[str]:
    """`run`'s second half, for a program started elsewhere (text pipes, a session of its own):
    from here on an interrupt or the time-out stops it as it stops any program `run` started."""
    argv = child.args if isinstance(child.args, list) else [str(child.args)]
    with _guard:
        _running.add(child)
        late = _cancelled.is_set()  # the interrupt came while it was starting
    if late:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.pid, signal.SIGKILL)
    try:
        out, err = child.communicate(stdin, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise error(
            f"{what} did not finish within {timeout:.0f} s and was stopped",
            hint=timeout_hint or "try again; if it keeps stalling, check the network path to the indexes",
        ) from exc
    finally:
        with _guard:
            _running.discard(child)
        if child.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(child.pid, signal.SIGKILL)
            child.wait()
    check_cancelled()  # stopped by an interrupt: its output is not an answer
    return subprocess.CompletedProcess([str(a) for a in argv], child.returncode, out, err)


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


def gather(fn: Callable[[T], R], items: Sequence[T], jobs: int) -> list[R]:
    """`fn` over `items` in up to `jobs` worker threads; the results in the order of `items`.

    An interrupt (Ctrl-C, SIGTERM) stops every program the workers started and every item not
    started (`run` refuses); the workers' `check_cancelled` keeps them from writing. The main thread
    wakes every 0.2 s: Python raises KeyboardInterrupt there only, when it next runs Python, and the
    kernel may let a worker take the signal instead (one starting a program masks signals around
    the fork, and picks up a SIGINT meant for the sleeping main thread). A wait without a timeout
    slept on until every worker was done: a Ctrl-C to `lock` went unanswered while two stalled
    resolvers ran (a unit test makes a worker take the signal)."""
    from concurrent import futures  # only the commands that fan out pay for it

    reset()
    pool = futures.ThreadPoolExecutor(max_workers=max(1, jobs))
    try:
        pending = [pool.submit(fn, item) for item in items]
        waiting = set(pending)
        while waiting:
            _, waiting = futures.wait(waiting, timeout=0.2)
        return [f.result() for f in pending]
    except BaseException:
        cancel_all()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
