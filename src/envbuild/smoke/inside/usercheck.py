"""The project's own checks (`checks:` in a profile): scripts that travel with the smoke test and
pass when they exit 0 within their time limit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any

from .core import CheckFailed, Context, Result

TAIL_LINES = 20
CRASH_FRAMES = 12
# Python frames that load a shared object built on this machine: a native crash under one of
# them is, first of all, suspect of the compiler that built it (docs/GPU-SMOKE.md, 2026-12-04).
LOADS_LOCAL_BUILDS = (" in _load_aoti", " in aoti_load_package", "cpp_extension.py")


def _tail(text: str) -> list[str]:
    return text.strip().splitlines()[-TAIL_LINES:]


def _crash_stack(stderr: str) -> list[str]:
    """The crashing thread's frames from faulthandler's dump, innermost first ("File ..., line N in
    f"), or [] where the script did not crash in Python's view."""
    lines = stderr.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("Current thread"):
            frames = []
            for frame in lines[i + 1 :]:
                if not frame.startswith("  File "):
                    break
                frames.append(frame.strip())
            return frames[:CRASH_FRAMES]
    return []


def _where(stack: list[str], path: str) -> str:
    """Where it crashed (' in FILE, line N in f'), and the script's own line that led there when
    that is another frame."""
    if not stack:
        return ""
    where = f" in {stack[0][len('File ') :]}"  # no str.removeprefix: images may run Python 3.8
    mine = next((f for f in stack if f'"{path}"' in f), None)
    if mine and mine != stack[0]:
        where += f" (from {os.path.basename(path)}, {mine.split(', ', 1)[1]})"
    return where


def _killed(script: str, path: str, code: int, stderr: str, r: Result) -> CheckFailed:
    """A script ended by a signal: a crash in native code (a library, the driver, a compiled
    extension or kernel), where the last line of stderr is whatever a warning printed last."""
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    stack = _crash_stack(stderr)
    r.facts.update(signal=name, crash_stack=stack)
    if name == "SIGKILL":
        return CheckFailed(
            f"{script} was killed (SIGKILL): most often the kernel's out-of-memory killer",
            "give it more memory (the container's --memory limit, or the host's), or make the script use less",
        )
    remedy = (
        "a crash in native code (a compiled library, the GPU driver or a kernel), not a Python error: "
        f"facts.crash_stack is where it was; rerun it with `python -X faulthandler {script}` to see it again"
    )
    if any(marker in frame for frame in stack for marker in LOADS_LOCAL_BUILDS):
        remedy = (
            "it died loading code compiled on this machine (an AOTInductor package or a C++ extension): "
            "one known cause is a C++ compiler that links libstdc++ statically, which the compile check tests "
            "(facts.toolchain.libstdcxx); if so, build with CXX pointing at a g++ that links it shared "
            "(/usr/bin/g++). " + remedy[0].upper() + remedy[1:]
        )
    return CheckFailed(f"{script} crashed with {name} (signal {-code}){_where(stack, path)}", remedy)


def run_script(ctx: Context, r: Result, script: dict[str, Any]) -> None:
    path = str(script["path"])
    if not os.path.isabs(path):
        path = os.path.join(os.path.dirname(ctx.expect_path or "."), path)
    limit = float(script.get("timeout") or 600)
    r.facts.update(script=script["file"], timeout_s=limit)
    t0 = time.monotonic()
    try:
        proc = subprocess.run(
            [sys.executable, path],
            capture_output=True,
            text=True,
            timeout=limit,
            check=False,
            cwd=os.path.dirname(path),
            # A native crash then prints the Python stack it happened under (faulthandler).
            env={**os.environ, "PYTHONFAULTHANDLER": os.environ.get("PYTHONFAULTHANDLER") or "1"},
        )
    except subprocess.TimeoutExpired as exc:
        r.facts["stdout_tail"] = _tail(exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or "")
        raise CheckFailed(
            f"{script['file']} did not finish within {limit:g} s", "make it faster, or raise its timeout"
        ) from exc
    r.facts.update(
        exit_code=proc.returncode,
        script_s=round(time.monotonic() - t0, 2),
        stdout_tail=_tail(proc.stdout),
        stderr_tail=_tail(proc.stderr),
    )
    if proc.returncode < 0:
        raise _killed(script["file"], path, proc.returncode, proc.stderr, r)
    if proc.returncode != 0:
        last = (_tail(proc.stderr) or _tail(proc.stdout) or ["no output"])[-1]
        raise CheckFailed(
            f"{script['file']} exited {proc.returncode}: {last[:300]}",
            f"see facts.stderr_tail; run it alone with `python {script['file']}` in the image",
        )
