"""Checks: the versions the profile promises, and the native libraries torch loads."""

from __future__ import annotations

import ctypes
import glob
import os
import platform
import sys
from importlib import metadata

from .core import (
    BOOTSTRAP,
    CheckFailed,
    Context,
    Result,
    Skip,
    _canon,
    _public,
)


def installed_versions() -> dict[str, str]:
    """{distribution (canonical name): version} of this interpreter's environment."""
    return {_canon(d.metadata["Name"]): d.version for d in metadata.distributions() if d.metadata["Name"]}


def moved_pins(locked: dict[str, str], installed: dict[str, str]) -> list[str]:
    """The locked distributions installed at another version (sorted)."""
    return sorted(n for n, v in locked.items() if n in installed and installed[n] != v)


def locked_pins(ctx: Context) -> dict[str, str]:
    """{distribution (canonical name): version} the lockfile pins."""
    return {_canon(k): str(v) for k, v in (ctx.expect.get("packages") or {}).items()}


def moved_remedy(ctx: Context, dists: set[str], installed: dict[str, str] | None = None) -> str:
    """How to keep `dists` where each is a locked distribution that an install in an image built FROM
    this one moved to another version (checked with --lock-match pins); "" where one is not.
    `installed` is the environment's versions where the caller has read them already."""
    if ctx.lock_match != "pins" or ctx.local or not dists:
        return ""
    pins = locked_pins(ctx)
    if not dists <= set(moved_pins(pins, installed if installed is not None else installed_versions())):
        return ""
    return ctx.moved_pins_remedy([f"{n}=={pins[n]}" for n in sorted(dists)])


def check_versions(ctx: Context, r: Result) -> None:
    import numpy
    import torch

    ctx.torch = torch
    exp = ctx.expect
    py = "{}.{}".format(*sys.version_info[:2])
    r.facts.update(
        python=platform.python_version(),
        torch=torch.__version__,
        numpy=numpy.__version__,
        cuda=torch.version.cuda,
        hip=getattr(torch.version, "hip", None),
        executable=sys.executable,
    )
    problems = []
    if exp.get("python") and py != exp["python"]:
        problems.append(f"Python {py}, expected {exp['python']}")
    if exp.get("torch") and _public(torch.__version__) != exp["torch"]:
        problems.append(f"torch {torch.__version__}, expected {exp['torch']}")
    accel = exp.get("accelerator")
    if accel == "cuda" and not str(torch.version.cuda or "").startswith(str(exp.get("cuda"))):
        problems.append(f"torch.version.cuda is {torch.version.cuda}, expected {exp.get('cuda')}")
    if accel == "rocm" and not str(getattr(torch.version, "hip", "") or "").startswith(str(exp.get("rocm"))):
        problems.append(f"torch.version.hip is {getattr(torch.version, 'hip', None)}, expected {exp.get('rocm')}")
    if accel == "cpu" and (torch.version.cuda or getattr(torch.version, "hip", None)):
        problems.append(f"a CPU profile got a GPU build of torch ({torch.__version__})")
    if exp.get("numpy") and numpy.__version__ != exp["numpy"]:
        problems.append(f"numpy {numpy.__version__}, expected {exp['numpy']}")
    locked = locked_pins(ctx)
    unlocked: list[str] = []  # distributions the lockfile lacks, where they fail the check
    moved: list[str] = []  # locked distributions installed at another version
    installed: dict[str, str] | None = None
    if locked and ctx.lock_match != "none":
        installed = installed_versions()
        missing = sorted(n for n in locked if n not in installed)
        moved = moved_pins(locked, installed)
        other = [f"{n} {installed[n]} (lock: {locked[n]})" for n in moved]
        extra = sorted(n for n in installed if n not in locked and n not in BOOTSTRAP)
        r.facts.update(locked_packages=len(locked), installed_packages=len(installed))
        if missing:
            problems.append("missing from the environment: " + ", ".join(missing))
        if other:
            problems.append("versions differ from the lockfile: " + "; ".join(other))
        if extra and ctx.lock_match == "exact":
            unlocked = extra
            problems.append("not in the lockfile: " + ", ".join(extra))
        elif extra:
            r.facts["not_in_lockfile"] = extra
    if problems:
        only_added = bool(unlocked) and len(problems) == 1
        remedy = moved_remedy(ctx, set(moved), installed) if len(problems) == 1 else ""
        raise CheckFailed(
            "; ".join(problems), remedy or ctx.environment_remedy(or_change_profile=True, only_added=only_added)
        )


def check_libs(ctx: Context, r: Result) -> None:
    """The GPU runtime libraries that the torch wheels brought along actually load."""
    if ctx.accelerator != "cuda":
        raise Skip(f"{ctx.accelerator} profile: no CUDA libraries to load")
    import torch

    roots = [os.path.join(p, "nvidia") for p in sys.path if os.path.isdir(os.path.join(p, "nvidia"))]
    wanted = ("libcudart.so*", "libcublas.so*", "libcudnn.so*", "libnccl.so*")
    loaded, failed = [], []
    for pattern in wanted:
        hits = sorted(h for root in roots for h in glob.glob(os.path.join(root, "**", pattern), recursive=True))
        if not hits:
            continue
        try:
            ctypes.CDLL(hits[0])
            loaded.append(os.path.basename(hits[0]))
        except OSError as exc:
            failed.append(f"{os.path.basename(hits[0])}: {exc}")
    r.facts.update(loaded=loaded, compiled_cuda=torch.version.cuda, cudnn=torch.backends.cudnn.version())
    if failed:
        raise CheckFailed("CUDA libraries fail to load: " + "; ".join(failed), ctx.environment_remedy())
    if not loaded and torch.backends.cudnn.version() is None:
        raise CheckFailed("no CUDA runtime libraries found next to torch", ctx.environment_remedy())
