"""Checks of what PyTorch 2 users reach for first: torch.compile (inductor on the CPU, Triton on
GPUs) and torch.export (TorchScript on releases before 2.1), with ONNX where the lock has onnx."""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
import tempfile
import time
from typing import Any

from . import vecprobe
from .core import CheckFailed, Context, Result, Skip, _public
from .cxxlink import find_cxx, libstdcxx_linkage, static_problem

TOLERANCE = {"rtol": 1e-3, "atol": 1e-4}  # fp32 kernels fused differently: not bit-equal, but close


def _torch_at_least(torch: Any, major: int, minor: int) -> bool:
    parts = _public(torch.__version__).split(".")
    return (int(parts[0]), int(parts[1])) >= (major, minor)


def _model(torch: Any, device: str) -> Any:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(32, 64),
        torch.nn.ReLU(),
        torch.nn.Linear(64, 64),
        torch.nn.GELU(),
        torch.nn.Linear(64, 8),
    ).to(device)


def _writable(path: str) -> bool:
    probe = path
    while not os.path.exists(probe):
        probe = os.path.dirname(probe) or "/"
    return os.access(probe, os.W_OK)


def _toolchain() -> dict[str, Any]:
    """What inductor and Triton need from the image, found before anything is compiled."""
    include = sysconfig.get_paths().get("include", "")
    inductor_cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR") or os.path.join(
        tempfile.gettempdir(), "torchinductor_" + (os.environ.get("USER") or str(os.getuid()))
    )
    triton_cache = os.environ.get("TRITON_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".triton", "cache")
    cxx = find_cxx()
    return {
        "cxx": cxx,
        "libstdcxx": libstdcxx_linkage(cxx) if cxx else None,
        "cc": shutil.which(os.environ.get("CC", "gcc")) or shutil.which("cc"),
        "python_headers": os.path.isfile(os.path.join(include, "Python.h")),
        "ninja": shutil.which("ninja"),
        "tmp_writable": _writable(tempfile.gettempdir()),
        "inductor_cache": inductor_cache,
        "inductor_cache_writable": _writable(inductor_cache),
        "triton_cache": triton_cache,
        "triton_cache_writable": _writable(triton_cache),
    }


def _toolchain_problem(tools: dict[str, Any], gpu: bool, *, image: bool = True) -> tuple[str, str] | None:
    """The first piece missing. `image`: ninja is part of what an image promises (compile: true);
    an interpreter on the host is checked for torch.compile alone, which does not use it."""
    py = "{}.{}".format(*sys.version_info[:2])
    if not tools["cxx"]:
        return (
            "no C++ compiler (g++): inductor compiles its CPU kernels with one",
            f"keep the profile's compile toolchain (compile: true installs g++, ninja-build and python{py}-dev), "
            "or add g++ to apt",
        )
    if (tools.get("libstdcxx") or {}).get("linkage") == "static":
        return static_problem(tools["cxx"])
    if not tools["python_headers"]:
        return (
            f"no Python headers (Python.h) for Python {py}",
            f"install python{py}-dev in the image (compile: true does)",
        )
    if image and not tools["ninja"]:
        return (
            "no ninja: torch.utils.cpp_extension (load, load_inline) refuses to build a C++ extension without it",
            "keep the profile's compile toolchain (compile: true installs ninja-build), or add ninja-build to apt",
        )
    if not tools["tmp_writable"]:
        return (f"{tempfile.gettempdir()} is not writable", "mount a writable /tmp (e.g. --tmpfs /tmp)")
    if not tools["inductor_cache_writable"]:
        return (
            f"the inductor cache {tools['inductor_cache']} is not writable by this user",
            "set TORCHINDUCTOR_CACHE_DIR to a folder the image user can write",
        )
    if gpu and not tools["triton_cache_writable"]:
        return (
            f"the Triton cache {tools['triton_cache']} is not writable by this user",
            "set TRITON_CACHE_DIR (or HOME) to a folder the image user can write",
        )
    return None


def _diagnose(exc: BaseException, prefix: str | None = None) -> str:
    text = f"{type(exc).__name__}: {exc}"
    where = sys.prefix if prefix is None else prefix
    compiler = "CppCompile" in text or "C++ compiler" in text or "InvalidCxxCompiler" in text
    if compiler and any(c.isspace() for c in where):
        # torch joins -I/-L folders into the compiler's command unquoted: "/tmp/my venv" is two words
        return (
            f"this environment's path has a space ({where}): torch passes its include and library folders "
            "to the C++ compiler unquoted, so every C++ build (torch.compile on CPU, C++ extensions) fails "
            "in it; make the environment in a folder whose path has none (envbuild venv NAME DIR)"
        )
    if compiler:
        return "the C++ compiler failed: install g++ and the Python headers (compile: true)"
    if "Python.h" in text:
        return "the Python headers are missing: install python3.X-dev (compile: true)"
    if "triton" in text.lower():
        return "Triton is missing or does not match torch: re-lock so the torch wheel's own triton pin is installed"
    if "Permission denied" in text or "Read-only file system" in text:
        return "a cache or temporary folder is not writable: set TORCHINDUCTOR_CACHE_DIR / TRITON_CACHE_DIR"
    return "see facts.error"


def _vec_isa() -> dict[str, Any]:
    """inductor's choice of the CPU's vector instructions, timed apart from the first compile. The
    choice compiles and loads one probe per candidate the CPU has; it is cached in the inductor
    cache folder, so it is paid once per folder (each fresh container, unless the folder is kept),
    and it took 47-56 s of a first CPU compile on a 16-CPU AMX host (docs/GPU-SMOKE.md). The smoke
    test starts it in a process of its own as it starts (`vecprobe`): this then waits for that."""
    try:
        from torch._inductor.cpu_vec_isa import pick_vec_isa
    except ImportError:
        try:  # before torch 2.5 it lived in codecache
            from torch._inductor.codecache import pick_vec_isa
        except ImportError:
            return {}
    early = vecprobe.result()  # the probe this smoke test started beside the checks before this one
    t0 = time.monotonic()
    try:
        isa = str(pick_vec_isa()) or "none"  # after the early probe: it only loads what that compiled
    except Exception as exc:  # an internal API: its failure is a fact, not the check's verdict
        return {"vec_isa_error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    here = round(time.monotonic() - t0, 2)
    if not early:
        return {"vec_isa": isa, "vec_isa_probe_s": here}
    # the probe's own time is what a user's first compile in a fresh container waits for
    return {"vec_isa": isa, "vec_isa_probe_s": early["vec_isa_probe_s"], "vec_isa_early": True, "vec_isa_load_s": here}


def _compiled_run(torch: Any, device: str) -> dict[str, Any]:
    model = _model(torch, device)
    compiled = torch.compile(model)
    out: dict[str, Any] = {"device": device, **(_vec_isa() if device == "cpu" else {})}
    for label, batch in (("first", 16), ("second", 24)):  # a second shape: a recompile or a dynamic kernel
        x = torch.randn(batch, 32, device=device)
        t0 = time.monotonic()
        y = compiled(x)
        y.square().mean().backward()
        out[f"{label}_call_s"] = round(time.monotonic() - t0, 2)
        grads = [p.grad.detach().clone() for p in model.parameters()]
        model.zero_grad()
        ref = model(x)
        ref.square().mean().backward()
        ref_grads = [p.grad.detach() for p in model.parameters()]
        model.zero_grad()
        if not torch.allclose(y, ref, **TOLERANCE) or not all(
            torch.allclose(grads[i], ref_grads[i], **TOLERANCE) for i in range(len(grads))
        ):
            diff = float((y - ref).abs().max())
            raise CheckFailed(
                f"{device}: the compiled model's result differs from eager (max |diff| {diff:.2e}, batch {batch})",
                "a miscompiled kernel: report it upstream with torch and compiler versions",
            )
    return out


def check_compile(ctx: Context, r: Result) -> None:
    if ctx.expect.get("compile") is False:
        raise Skip("the profile opts out of the compile toolchain (compile: false)")
    import torch

    if not _torch_at_least(torch, 2, 0):
        raise Skip(f"torch.compile needs torch >= 2.0 (this is {torch.__version__})")
    gpu = ctx.use_gpu and torch.cuda.is_available()
    tools = _toolchain()
    r.facts.update(toolchain=tools)
    problem = _toolchain_problem(tools, gpu, image=not ctx.local)
    if problem:
        raise CheckFailed(*problem)
    devices = ["cpu", *(f"cuda:{i}" for i in range(torch.cuda.device_count()))] if gpu else ["cpu"]
    runs = []
    for device in devices:
        try:
            runs.append(_compiled_run(torch, device))
        except CheckFailed:
            raise
        except Exception as exc:  # inductor and Triton raise many types; the message names the cause
            r.facts["error"] = f"{type(exc).__name__}: {str(exc)[:2000]}"
            raise CheckFailed(f"{device}: torch.compile failed ({type(exc).__name__})", _diagnose(exc)) from exc
    r.facts.update(runs=runs, first_call_s=runs[0]["first_call_s"])
    if "vec_isa_probe_s" in runs[0]:
        r.facts["vec_isa_probe_s"] = runs[0]["vec_isa_probe_s"]


def check_export(ctx: Context, r: Result) -> None:
    import torch

    model = _model(torch, "cpu").eval()
    x = torch.randn(4, 32)
    with torch.no_grad():
        want = model(x)
    folder = tempfile.mkdtemp(prefix="envbuild-export-")
    try:
        if _torch_at_least(torch, 2, 1):
            program = torch.export.export(model, (x,))
            path = os.path.join(folder, "model.pt2")
            torch.export.save(program, path)
            got = torch.export.load(path).module()(x)
            r.facts["format"] = "torch.export"
        else:
            path = os.path.join(folder, "model.ts")
            torch.jit.save(torch.jit.trace(model, x), path)
            got = torch.jit.load(path)(x)
            r.facts["format"] = "torchscript"
        if not torch.allclose(got, want, **TOLERANCE):
            raise CheckFailed(f"the {r.facts['format']} program, loaded back, computes another result", "see facts")
        r.facts["onnx"] = _onnx(ctx, torch, model, x, folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _onnx(ctx: Context, torch: Any, model: Any, x: Any, folder: str) -> str:
    locked = {k.lower() for k in (ctx.expect.get("packages") or {})}
    if "onnx" not in locked:
        return "skip: onnx is not in the lockfile"
    import onnx  # type: ignore[import-not-found]  # only where the lockfile has it

    path = os.path.join(folder, "model.onnx")
    caveat = ""
    if _torch_at_least(torch, 2, 9) and "onnxscript" not in locked:
        # From 2.9 a plain torch.onnx.export is the dynamo exporter, which imports onnxscript: the
        # call users make fails here, so say so rather than certify it; the TorchScript one still runs.
        torch.onnx.export(model, (x,), path, dynamo=False)
        caveat = (
            " with dynamo=False only: torch.onnx.export's default exporter needs onnxscript, which the"
            " lockfile lacks (add it to the profile's packages)"
        )
    else:
        torch.onnx.export(model, (x,), path)  # the call users make, with torch's default exporter
    onnx.checker.check_model(onnx.load(path))
    if not locked & {"onnxruntime", "onnxruntime-gpu"}:
        return "exported and checked" + caveat
    import numpy
    import onnxruntime  # type: ignore[import-not-found]

    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    got = session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]
    with torch.no_grad():
        want = model(x).numpy()
    if not numpy.allclose(got, want, **TOLERANCE):
        raise CheckFailed(
            f"the ONNX export, run in onnxruntime {onnxruntime.__version__}, computes another result "
            f"(max difference {float(numpy.abs(got - want).max()):.3g})",
            "see facts; an exporter or onnxruntime release mismatch: move one of the two pins",
        )
    return "exported, checked and run in onnxruntime" + caveat
