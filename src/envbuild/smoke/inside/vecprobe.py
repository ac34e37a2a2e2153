"""inductor's probe of the CPU's vector instructions, started as the smoke test starts.

The first CPU compile in a fresh container waits for `pick_vec_isa`: one compile of the vector
headers per extension the CPU has, one after another (8.9 s on a 2-CPU AVX-512 machine, 47-56 s on
a 16-CPU AMX host: docs/GPU-SMOKE.md), then a load of each in a child process. The compiled probes
land in the inductor cache, keyed by compiler, flags and torch, and a later `pick_vec_isa` there
only loads them. So the smoke test runs it in a process of its own from its start, beside the
checks before `compile` (the GPU's, DDP's, the imports), in the same environment (the same cache
folder and compiler); the `compile` check then takes its answer and reports how long the probe
took, which is what a user's first compile in a fresh container waits for.

A probe is never cut short while it compiles (only when the smoke test itself is interrupted): a
half-written one would stay in the cache as a file that does not load, and inductor would then
take that extension for missing.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

CODE = """
import time
try:
    from torch._inductor.cpu_vec_isa import pick_vec_isa
except ImportError:  # before torch 2.5 it lived in codecache
    from torch._inductor.codecache import pick_vec_isa
t0 = time.monotonic()
isa = str(pick_vec_isa()) or "none"
print(round(time.monotonic() - t0, 2), isa)
"""
WAIT_S = 900.0  # the probe of a slow host took ~1 min; past this it is taken for hung

_running: list[subprocess.Popen[str]] = []


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def start(wanted: bool) -> None:
    """Start the probe where the `compile` check will run and another CPU can take it (on one CPU
    it would only make the checks before it slower by as much)."""
    if not wanted or _running or _cpus() < 2:
        return
    try:
        child = subprocess.Popen(
            [sys.executable, "-c", CODE],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
    except OSError:
        return  # the compile check probes by itself, as before
    _running.append(child)


def result() -> dict[str, Any]:
    """The early probe's answer, once it has ended: {"vec_isa": ..., "vec_isa_probe_s": ...};
    {} when none ran or it failed (the caller then probes by itself)."""
    if not _running:
        return {}
    child = _running.pop()
    out = _wait(child)
    if out is None:
        return {}
    seconds, _, isa = out.strip().partition(" ")
    if child.returncode != 0 or not isa:
        return {}
    try:
        return {"vec_isa": isa, "vec_isa_probe_s": float(seconds)}
    except ValueError:
        return {}


def finish(interrupted: bool = False) -> None:
    """At the smoke test's end: a probe the `compile` check did not take (it failed before it
    asked) is waited for, so that none is cut short; stopped only on an interrupt."""
    while _running:
        child = _running.pop()
        if interrupted:
            child.kill()
        _wait(child)


def _wait(child: subprocess.Popen[str]) -> str | None:
    """What the probe printed once it ended; None for one that ran past WAIT_S (then stopped)."""
    try:
        return child.communicate(timeout=WAIT_S)[0]
    except subprocess.TimeoutExpired:
        child.kill()
        child.communicate()
        return None
