"""Checks on the accelerator: devices, driver, architecture coverage, cuDNN."""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import os

from .core import (
    GPU_REFUSED_ENV,
    CheckFailed,
    Context,
    Result,
    Skip,
)


def driver_version() -> str | None:
    """The NVIDIA driver version from NVML (libnvidia-ml), or None where there is no driver."""
    for lib in ("libnvidia-ml.so.1", "libnvidia-ml.so"):
        try:
            nvml = ctypes.CDLL(lib)
        except OSError:
            continue
        if nvml.nvmlInit_v2() != 0:
            return None
        buf = ctypes.create_string_buffer(96)
        ok = nvml.nvmlSystemGetDriverVersion(buf, 96) == 0
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()
        return buf.value.decode() if ok else None
    return None


def version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(".") if p.isdigit())


def _arch_number(entry: str) -> tuple[int, str] | None:
    """ "sm_90a" -> (90, "a"); "compute_120" -> (120, ""); anything else -> None."""
    tail = entry.split("_", 1)[1] if "_" in entry else ""
    digits = "".join(itertools.takewhile(str.isdigit, tail))
    return (int(digits), tail[len(digits) :]) if digits else None


def arch_covers(capability: str, arch_list: list[str]) -> bool:
    """Whether a build with `arch_list` (torch.cuda.get_arch_list()) runs kernels on a GPU of
    compute capability `capability` ("8.9").

    SASS for sm_XY runs on every GPU of major X with minor >= Y (sm_86 runs on an 8.9 Ada card,
    which is how PyPI's wheels without sm_89 run there), never across majors. PTX (compute_XY)
    is compiled by the driver for any newer GPU. Arch-specific code (sm_90a, compute_90a) runs
    on exactly that GPU; family-specific code (sm_100f) on that major from its minor up.
    """
    major, _, minor = capability.partition(".")
    cap = (int(major), int(minor or 0))
    for entry in arch_list:
        parsed = _arch_number(entry)
        if parsed is None:
            continue
        number, suffix = parsed
        built = (number // 10, number % 10)
        if suffix == "a":
            runs = built == cap
        elif entry.startswith("sm_") or suffix == "f":
            runs = built[0] == cap[0] and built[1] <= cap[1]
        else:
            runs = entry.startswith("compute_") and built <= cap
        if runs:
            return True
    return False


def driver_verdict(driver: str, floor: dict[str, str], cuda: str) -> tuple[str | None, str | None]:
    """(problem, note) for an NVIDIA driver against a CUDA release's floors from the compat data.

    Below the minor-version-compatibility floor nothing runs; between it and the full-support
    floor kernels run, but features that need a newer driver (e.g. PTX JIT of newer code) do not.
    """
    if version_tuple(driver) < version_tuple(floor["minor_floor"]):
        return f"driver {driver} is older than {floor['minor_floor']}, the oldest that runs CUDA {cuda}", None
    if version_tuple(driver) < version_tuple(floor["min_driver"]):
        return None, (
            f"driver {driver} runs CUDA {cuda} through minor-version compatibility "
            f"(full support from {floor['min_driver']})"
        )
    return None, None


def check_gpu(ctx: Context, r: Result) -> None:
    if ctx.accelerator == "cpu":
        raise Skip("CPU profile: no GPU checks")
    if ctx.gpus == "none":
        raise Skip("--gpus none: GPU checks skipped on purpose")
    import torch

    if not torch.cuda.is_available():
        refused = os.environ.get(GPU_REFUSED_ENV)
        if refused:
            # envbuild asked the engine for GPUs, was refused, and ran this container without them
            raise CheckFailed(
                f"the container engine gave this container no GPU: {refused}",
                "install the NVIDIA container toolkit and configure docker's runtime "
                "(nvidia-ctk runtime configure --runtime=docker, then restart dockerd)"
                if ctx.accelerator == "cuda"
                else "load the amdgpu kernel driver so that /dev/kfd and /dev/dri exist on the host",
            )
        raise CheckFailed(
            "no GPU visible: torch.cuda.is_available() is False",
            "run on a GPU host with the GPU passed in (docker run --gpus all, or /dev/kfd and /dev/dri for ROCm); "
            "--gpus none checks only the versions and libraries",
        )
    count = torch.cuda.device_count()
    ctx.devices = count
    r.facts["device_count"] = count
    want = None if ctx.gpus in {"all", "auto"} else int(ctx.gpus)
    # too few GPUs does not stop the check: the report should say which ones were seen, and how they did
    short = f"{count} GPU(s) visible, {want} expected" if want is not None and count < want else None
    devices, problems = [], []
    arch_list = torch.cuda.get_arch_list()
    r.facts["arch_list"] = arch_list
    for i in range(count):
        props = torch.cuda.get_device_properties(i)
        cap = f"{props.major}{props.minor}"
        info = {
            "index": i,
            "name": props.name,
            "capability": f"{props.major}.{props.minor}",
            "memory_gib": round(props.total_memory / 2**30, 1),
        }
        if ctx.accelerator == "rocm":
            info["arch"] = getattr(props, "gcnArchName", "?")
        devices.append(info)
        if ctx.accelerator == "cuda" and not arch_covers(f"{props.major}.{props.minor}", arch_list):
            problems.append(
                f"GPU {i} ({props.name}, sm_{cap}): no kernels for it in this build's architectures {arch_list}"
            )
            continue
        try:
            # A real kernel with a known answer: is_available() alone passes where kernels cannot run.
            # Integers, so the answer is exact whatever order the reduction adds in.
            n = 1 << 20
            x = torch.arange(n, device=f"cuda:{i}", dtype=torch.int64)
            got = int((x * 2 + 1).sum().item())
            a = torch.randn(256, 256, generator=torch.Generator().manual_seed(i))
            mm = (a.to(f"cuda:{i}") @ a.to(f"cuda:{i}")).cpu().double()
            ref = a.double() @ a.double()
            torch.cuda.synchronize(i)
            wrong = []
            if got != n * n:  # the sum of 2k+1 for k < n is n^2
                wrong.append(f"elementwise kernel returned {got}, expected {n * n}")
            if not torch.allclose(mm, ref, rtol=1e-2, atol=1e-1):
                wrong.append("matmul differs from the CPU reference")
            info["kernel"] = "wrong answer" if wrong else "ok"
            problems += [f"GPU {i}: {w}" for w in wrong]
        except RuntimeError as exc:
            info["kernel"] = "launch failed"
            problems.append(f"GPU {i} ({props.name}): kernel launch failed: {str(exc).splitlines()[0]}")
    r.facts["devices"] = devices
    if ctx.accelerator == "cuda":
        driver = driver_version()
        r.facts["driver"] = driver
        floor = ctx.expect.get("driver_floor") or {}
        if driver and floor:
            problem, note = driver_verdict(driver, floor, str(ctx.expect.get("cuda")))
            if problem:
                problems.append(problem)
            if note:
                r.facts["driver_note"] = note
    remedies = ["check CUDA_VISIBLE_DEVICES and --gpus"] if short else []
    if problems:
        remedies.append(
            "use a profile whose build covers this GPU (Blackwell needs cu128+), or upgrade the driver "
            f"to >= {(ctx.expect.get('driver_floor') or {}).get('min_driver', 'the floor for this CUDA')}"
        )
    if short or problems:
        raise CheckFailed("; ".join(([short] if short else []) + problems), "; ".join(remedies))


def check_cudnn(ctx: Context, r: Result) -> None:
    if not ctx.use_gpu:
        raise Skip("CPU profile: no cuDNN" if ctx.accelerator == "cpu" else "--gpus none: cuDNN skipped")
    import torch

    if not torch.cuda.is_available():
        raise CheckFailed("no GPU visible, cuDNN cannot run", "see the gpu check")
    backends = torch.backends.cudnn
    r.facts.update(
        available=backends.is_available(),
        enabled=backends.enabled,
        version=backends.version(),
        library="MIOpen" if ctx.accelerator == "rocm" else "cuDNN",
    )
    if not backends.is_available() or not backends.enabled:
        raise CheckFailed(
            "cuDNN is not available or disabled", "the image lacks nvidia-cudnn; rebuild from its lockfile"
        )
    old_tf32 = backends.allow_tf32
    backends.allow_tf32 = False
    try:
        gen = torch.Generator().manual_seed(0)
        x64 = torch.randn(4, 3, 32, 32, generator=gen, dtype=torch.float64, requires_grad=True)
        w64 = torch.randn(8, 3, 3, 3, generator=gen, dtype=torch.float64, requires_grad=True)
        torch.nn.functional.conv2d(x64, w64, padding=1).square().sum().backward()
        x = x64.detach().float().cuda().requires_grad_()
        w = w64.detach().float().cuda().requires_grad_()
        out = torch.nn.functional.conv2d(x, w, padding=1)
        out.square().sum().backward()
        torch.cuda.synchronize()
    finally:
        backends.allow_tf32 = old_tf32
    ok_fwd = torch.allclose(
        out.detach().cpu().double(), torch.nn.functional.conv2d(x64, w64, padding=1).detach(), rtol=1e-3, atol=1e-3
    )
    ok_bwd = torch.allclose(w.grad.cpu().double(), w64.grad, rtol=1e-3, atol=1e-2)
    r.facts.update(forward_matches=ok_fwd, backward_matches=ok_bwd)
    if not (ok_fwd and ok_bwd):
        raise CheckFailed(
            "conv2d on the GPU differs from the float64 CPU reference", "report this with the facts above"
        )
