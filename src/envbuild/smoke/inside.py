"""envbuild smoke test: prove that this environment really trains.

Runs inside every envbuild image (`envbuild-smoke`) or in any interpreter
(`python -m envbuild.smoke.inside`). Needs only the standard library, torch
and numpy, so it can be copied into an image as a single file.

Each check reports pass / fail / skip with a reason, its duration, the facts
it found, and on failure a remedy. Exit 0 only when every required check
passes. `--json FILE` (or `-` for stdout) writes a versioned report.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import datetime
import glob
import itertools
import json
import math
import multiprocessing as mp
import os
import platform
import socket
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from importlib import metadata
from typing import Any

REPORT_VERSION = 1
DEFAULT_EXPECT = "/opt/envbuild/expect.json"
# Set by `envbuild smoke` when the engine refused the container's GPU request (host.GPU_REFUSED_ENV).
GPU_REFUSED_ENV = "ENVBUILD_SMOKE_GPU_REFUSED"
SHM_MIN_BYTES = 1 << 30
BOOTSTRAP = {"pip", "setuptools", "wheel"}  # installed by venv itself, not by the lock
# cuBLAS needs this before its first handle for deterministic results.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


@dataclass
class Result:
    name: str
    status: str = "pass"  # pass | fail | skip
    reason: str = ""
    remedy: str = ""
    seconds: float = 0.0
    facts: dict[str, Any] = field(default_factory=dict)


class CheckFailed(Exception):
    def __init__(self, reason: str, remedy: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.remedy = remedy


class Skip(Exception):
    pass


@dataclass
class Context:
    expect: dict[str, Any]
    gpus: str  # "auto" | "all" | "none" | a number
    timeout: float
    lock_match: str  # exact | pins | none
    local: bool = False  # `envbuild smoke --local`: an interpreter on the host, not an image
    torch: Any = None
    devices: int = 0

    def environment_remedy(self, *, or_change_profile: bool = False) -> str:
        """How to get an environment that matches the profile, where this run is (image or host)."""
        name = self.expect.get("profile") or "NAME"
        if self.local:
            return (
                f"make the environment from the lockfile (envbuild venv {name} DIR) and pass --python DIR/bin/python"
                + (
                    "; or, if this interpreter is the one you want, change the profile to match it"
                    if or_change_profile
                    else ""
                )
            )
        return (
            f"rebuild the image from a fresh lockfile (envbuild lock {name} && envbuild build {name}); "
            "do not pip install into an envbuild environment"
        )

    @property
    def accelerator(self) -> str:
        return str(self.expect.get("accelerator") or _detect_accelerator(self.torch))

    @property
    def use_gpu(self) -> bool:
        return self.gpus != "none" and self.accelerator in {"cuda", "rocm"}


def _detect_accelerator(torch: Any) -> str:
    if torch is None:
        return "cpu"
    if getattr(torch.version, "hip", None):
        return "rocm"
    return "cuda" if torch.version.cuda else "cpu"


def _public(version: str) -> str:
    return version.split("+", 1)[0]


def _canon(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


# ---- checks -----------------------------------------------------------------------------------


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
    locked = {_canon(k): v for k, v in (exp.get("packages") or {}).items()}
    if locked and ctx.lock_match != "none":
        installed = {}
        for dist in metadata.distributions():
            name = dist.metadata["Name"]
            if name:
                installed[_canon(name)] = dist.version
        missing = sorted(n for n in locked if n not in installed)
        other = sorted(
            f"{n} {installed[n]} (lock: {v})" for n, v in locked.items() if n in installed and installed[n] != v
        )
        extra = sorted(n for n in installed if n not in locked and n not in BOOTSTRAP)
        r.facts.update(locked_packages=len(locked), installed_packages=len(installed))
        if missing:
            problems.append("missing from the environment: " + ", ".join(missing))
        if other:
            problems.append("versions differ from the lockfile: " + "; ".join(other))
        if extra and ctx.lock_match == "exact":
            problems.append("not in the lockfile: " + ", ".join(extra))
        elif extra:
            r.facts["not_in_lockfile"] = extra
    if problems:
        raise CheckFailed("; ".join(problems), ctx.environment_remedy(or_change_profile=True))


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


def _shm_bytes() -> int | None:
    try:
        st = os.statvfs("/dev/shm")
    except OSError:
        return None
    return st.f_frsize * st.f_blocks


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _sgd_step(params: Any, lr: float) -> None:
    """A plain SGD update. torch.optim's first step() imports TorchDynamo (seconds on a small
    machine), which would dominate a smoke run that only needs to see the weights move."""
    import torch

    with torch.no_grad():
        for param in params:
            if param.grad is not None:
                param.sub_(lr * param.grad)
                param.grad = None


def _ranks_context() -> Any:
    """Processes for DDP ranks: forked from a clean single-threaded server that imported torch once.

    Plain fork from this process can deadlock when a library thread holds a lock at fork time
    (seen once on a cold start), and spawn re-imports torch in every rank (seconds each here).
    """
    ctx = mp.get_context("forkserver")
    # DDP imports TorchDynamo on construction: preloading it here pays for that once, not per rank.
    ctx.set_forkserver_preload(["torch", "torch.distributed", "torch.nn.parallel", "torch._dynamo"])
    return ctx


def _ddp_worker(rank: int, job: dict[str, Any], queue: Any, release: Any) -> None:
    world, port, backend, timeout = job["world"], job["port"], job["backend"], job["timeout"]

    def stage(name: str) -> None:
        queue.put({"rank": rank, "stage": name})

    try:
        stage("import")
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        device = torch.device(f"cuda:{rank}") if backend == "nccl" else torch.device("cpu")
        if backend == "nccl":
            torch.cuda.set_device(rank)
        else:
            # Every rank is on this host: keep gloo on loopback instead of the hostname's interface.
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        stage("init_process_group")
        dist.init_process_group(
            backend,
            init_method=f"tcp://127.0.0.1:{port}",
            world_size=world,
            rank=rank,
            timeout=datetime.timedelta(seconds=timeout),
        )
        t = torch.tensor([float(rank + 1)], device=device)
        stage("all_reduce")
        dist.all_reduce(t)
        total = float(t.item())
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)).to(device)
        stage("DistributedDataParallel")
        ddp = DistributedDataParallel(model, device_ids=[rank] if backend == "nccl" else None)
        stage("training steps")
        gen = torch.Generator().manual_seed(100 + rank)  # different data per rank
        for _ in range(3):
            x = torch.randn(8, 16, generator=gen).to(device)
            loss = ddp(x).square().mean()
            loss.backward()  # DDP averages the gradients across ranks here
            _sgd_step(ddp.parameters(), 0.1)
        flat = torch.cat([p.detach().flatten() for p in model.parameters()])
        gathered = [torch.zeros_like(flat) for _ in range(world)]
        stage("all_gather")
        dist.all_gather(gathered, flat)
        identical = all(torch.equal(gathered[0], g) for g in gathered[1:])
        stage("barrier")
        dist.barrier()
        queue.put({"rank": rank, "all_reduce": total, "identical": identical})
        # No rank tears down before the parent has every rank's result: a rank that left right after
        # the last collective was seen (in containers, ~1 run in 10) to strand its peer inside it.
        release.wait(timeout + 30)
        dist.destroy_process_group()
    except BaseException as exc:  # report everything: the parent decides
        queue.put({"rank": rank, "error": f"{type(exc).__name__}: {exc}".splitlines()[0]})


def check_ddp(ctx: Context, r: Result) -> None:
    import torch

    shm = _shm_bytes()
    r.facts["shm_bytes"] = shm
    if shm is not None and shm < SHM_MIN_BYTES:
        r.facts["shm_warning"] = (
            f"/dev/shm is {shm // 2**20} MiB (< 1 GiB): NCCL and DataLoader workers may fail; "
            "run with --shm-size=8g or --ipc=host"
        )
    gpu = ctx.use_gpu and torch.cuda.is_available()
    world = max(torch.cuda.device_count(), 1) if gpu else 2
    backend = "nccl" if gpu else "gloo"
    if gpu and world < 2:
        r.facts["note"] = "one GPU: DDP runs a single NCCL rank"
    r.facts.update(world_size=world, backend=backend)
    if gpu and not torch.distributed.is_nccl_available():
        raise CheckFailed("torch was built without NCCL", "use an official CUDA build of torch")
    mpc = _ranks_context()
    queue = mpc.Queue()
    release = mpc.Event()
    port = _free_port()
    procs = [
        mpc.Process(
            target=_ddp_worker,
            args=(rank, {"world": world, "port": port, "backend": backend, "timeout": ctx.timeout}, queue, release),
            daemon=True,
        )
        for rank in range(world)
    ]
    for p in procs:
        p.start()
    results: list[dict[str, Any]] = []
    stages: dict[int, str] = {}
    deadline = time.monotonic() + ctx.timeout + 30
    while len(results) < world and time.monotonic() < deadline:
        try:
            msg = queue.get(timeout=1)
        except Exception:  # queue.Empty, or a rank died mid-message
            msg = None
        if msg is not None and "stage" in msg:
            stages[msg["rank"]] = msg["stage"]
        elif msg is not None:
            results.append(msg)
        if all(not p.is_alive() for p in procs) and queue.empty() and len(results) < world:
            break
    release.set()
    for p in procs:
        p.join(timeout=10)
        if p.is_alive():
            p.kill()
            r.facts.setdefault("killed_after_report", []).append(p.name)
    errors = [f"rank {x['rank']}: {x['error']}" for x in results if "error" in x]
    r.facts["last_stage"] = {str(k): v for k, v in sorted(stages.items())}
    if len(results) < world and not errors:
        done = {x["rank"] for x in results}
        stuck = ", ".join(f"rank {k} in {v}" for k, v in sorted(stages.items()) if k not in done)
        dead = [f"rank {i} exit {p.exitcode}" for i, p in enumerate(procs) if p.exitcode not in (0, None)]
        dead.append(f"stuck: {stuck or 'before starting'}")
        raise CheckFailed(
            f"DDP did not finish within {ctx.timeout + 30:.0f}s ({', '.join(dead) or 'collective hung'})",
            "a hung collective: check NCCL_DEBUG=INFO output, run with --ipc=host or --shm-size=8g",
        )
    if errors:
        remedy = (
            "run with --ipc=host or --shm-size=8g"
            if shm is not None and shm < SHM_MIN_BYTES
            else "set NCCL_DEBUG=INFO and rerun"
        )
        raise CheckFailed("; ".join(errors), remedy)
    expected = world * (world + 1) / 2
    got = [x["all_reduce"] for x in results]
    r.facts["all_reduce"] = got[0] if got else None
    if any(g != expected for g in got):
        raise CheckFailed(f"all_reduce gave {got}, expected {expected} on every rank", "the collective is broken")
    if not all(x["identical"] for x in results):
        raise CheckFailed("parameters differ across ranks after DDP steps", "gradient synchronisation is broken")


def check_amp(ctx: Context, r: Result) -> None:
    import torch

    gpu = ctx.use_gpu and torch.cuda.is_available()
    runs: list[tuple[str, Any]] = []
    if gpu:
        runs.append(("cuda", torch.float16))
        if torch.cuda.is_bf16_supported():
            runs.append(("cuda", torch.bfloat16))
    else:
        runs.append(("cpu", torch.bfloat16))
    done = []
    for device, dtype in runs:
        torch.manual_seed(0)
        model = torch.nn.Linear(64, 64).to(device)
        use_scaler = device == "cuda" and dtype == torch.float16
        scaler = torch.amp.GradScaler(device, enabled=use_scaler)
        before = model.weight.detach().clone()
        x = torch.randn(32, 64, device=device)
        with torch.autocast(device_type=device, dtype=dtype):
            out = model(x)
            loss = out.float().square().mean()
        if out.dtype != dtype:
            raise CheckFailed(
                f"{device} autocast ran Linear in {out.dtype}, expected {dtype}", "autocast is not active"
            )
        if not torch.isfinite(loss):
            raise CheckFailed(f"{device} {dtype} loss is not finite: {loss.item()}", "numerics are broken")
        if use_scaler:
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            _sgd_step(model.parameters(), 0.1)
        if torch.equal(before, model.weight.detach()):
            raise CheckFailed(
                f"{device} {dtype}: the weights did not change after a step", "the optimizer step was skipped"
            )
        scale = scaler.get_scale() if use_scaler else 1.0
        if not math.isfinite(scale):
            raise CheckFailed(f"GradScaler scale is {scale}", "fp16 overflow on every step")
        done.append(f"{device}/{str(dtype).replace('torch.', '')}")
    r.facts["steps"] = done


class _Squares:
    """A dataset whose items are big enough that worker batches go through /dev/shm."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> Any:
        import torch

        return torch.full((256, 256), float(i)), i


def check_dataloader(ctx: Context, r: Result) -> None:
    import torch
    from torch.utils.data import DataLoader

    pin = ctx.use_gpu and torch.cuda.is_available()
    # Workers never touch CUDA, so fork is fine even after the GPU checks (PyTorch's default on Linux).
    loader = DataLoader(
        _Squares(),
        batch_size=8,
        num_workers=2,
        pin_memory=pin,
        timeout=ctx.timeout,
        multiprocessing_context=mp.get_context("fork"),
        persistent_workers=False,
    )
    seen: list[int] = []
    try:
        for batch, idx in loader:
            if pin and not batch.is_pinned():
                raise CheckFailed("batches are not in pinned memory although pin_memory=True", "check the CUDA setup")
            if not torch.equal(batch[:, 0, 0], idx.float()):
                raise CheckFailed("a batch does not hold the items it names", "the DataLoader returned corrupt data")
            seen += idx.tolist()
    except RuntimeError as exc:
        text = str(exc)
        shm = _shm_bytes()
        r.facts["shm_bytes"] = shm
        shm_markers = (
            "shared memory",
            "Bus error",
            "killed by signal",
            "No space left on device",
            "unable to write to file",
        )
        if any(marker in text for marker in shm_markers):
            raise CheckFailed(
                f"a DataLoader worker died: {text.splitlines()[0]}",
                f"/dev/shm is too small ({(shm or 0) // 2**20} MiB): run with --shm-size=8g or --ipc=host",
            ) from exc
        raise CheckFailed(
            f"DataLoader failed: {text.splitlines()[0]}", "rerun with num_workers=0 to see the error"
        ) from exc
    r.facts.update(batches=len(seen) // 8, workers=2, pin_memory=pin)
    if sorted(seen) != list(range(64)):
        raise CheckFailed(f"{len(seen)} of 64 items delivered", "workers lost data")


def check_determinism(ctx: Context, r: Result) -> None:
    import torch

    device = "cuda" if ctx.use_gpu and torch.cuda.is_available() else "cpu"

    def once() -> Any:
        torch.manual_seed(1234)
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 8)).to(device)
        for _ in range(3):
            x = torch.randn(16, 32, device=device)
            loss = model(x).square().mean()
            loss.backward()
            _sgd_step(model.parameters(), 1e-2)
        return torch.cat([p.detach().flatten().cpu() for p in model.parameters()])

    # On GPUs some kernels (atomics in cuDNN and scatter) are nondeterministic unless asked; CPU
    # kernels used here are deterministic already, and the switch costs a TorchDynamo import.
    strict = device == "cuda"
    previous = torch.are_deterministic_algorithms_enabled()
    if strict:
        torch.use_deterministic_algorithms(True)
    try:
        a, b = once(), once()
    finally:
        if strict:
            torch.use_deterministic_algorithms(previous)
    r.facts.update(device=device, deterministic_algorithms=strict)
    if not torch.equal(a, b):
        raise CheckFailed(
            "two seeded runs differ", "a nondeterministic kernel ran despite use_deterministic_algorithms"
        )


CHECKS: list[tuple[str, Callable[[Context, Result], None]]] = [
    ("versions", check_versions),
    ("libs", check_libs),
    ("gpu", check_gpu),
    ("cudnn", check_cudnn),
    ("ddp", check_ddp),
    ("amp", check_amp),
    ("dataloader", check_dataloader),
    ("determinism", check_determinism),
]


def run(ctx: Context, only: list[str] | None = None) -> dict[str, Any]:
    results = []
    started = time.time()
    for name, fn in CHECKS:
        if only and name not in only:
            continue
        r = Result(name)
        t0 = time.monotonic()
        try:
            fn(ctx, r)
        except Skip as exc:
            r.status, r.reason = "skip", str(exc)
        except CheckFailed as exc:
            r.status, r.reason, r.remedy = "fail", exc.reason, exc.remedy
        except ModuleNotFoundError as exc:  # an interpreter without the environment: say which
            r.status, r.reason = "fail", f"{exc.name} is not installed in {sys.executable}"
            r.remedy = ctx.environment_remedy()
        except Exception as exc:  # a check that crashes is a failed check, with its traceback as fact
            r.status, r.reason = "fail", f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            r.remedy = "see facts.traceback"
            r.facts["traceback"] = traceback.format_exc(limit=5)
        r.seconds = round(time.monotonic() - t0, 3)
        results.append(r)
    failed = [r.name for r in results if r.status == "fail"]
    return {
        "report_version": REPORT_VERSION,
        "tool": "envbuild-smoke",
        "started": datetime.datetime.fromtimestamp(started, datetime.timezone.utc).isoformat(timespec="seconds"),
        "seconds": round(time.time() - started, 3),
        "host": {"hostname": socket.gethostname(), "machine": platform.machine(), "python": platform.python_version()},
        "expect": {k: v for k, v in ctx.expect.items() if k != "packages"},
        "gpus": ctx.gpus,
        "passed": not failed,
        "failed": failed,
        "checks": [asdict(r) for r in results],
    }


SUMMARY_FACTS = (
    "torch",
    "numpy",
    "device_count",
    "version",
    "world_size",
    "backend",
    "all_reduce",
    "steps",
    "batches",
    "driver",
    "device",
)


def detail(check: dict[str, Any]) -> str:
    """One line for a check: its reason, or the facts a person looks at first."""
    facts = check["facts"]
    return str(check["reason"]) or ", ".join(f"{k}={facts[k]}" for k in SUMMARY_FACTS if k in facts)


def table(report: dict[str, Any]) -> str:
    lines = [f"{'check':<12} {'result':<6} {'seconds':>7}  detail"]
    for c in report["checks"]:
        lines.append(f"{c['name']:<12} {c['status'].upper():<6} {c['seconds']:>7.2f}  {detail(c)}")
        if c["status"] == "fail" and c["remedy"]:
            lines.append(f"{'':<12} {'fix':<6} {'':>7}  {c['remedy']}")
    verdict = "PASSED" if report["passed"] else "FAILED: " + ", ".join(report["failed"])
    lines.append(f"smoke {verdict} in {report['seconds']:.1f}s")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="envbuild-smoke", description=__doc__.splitlines()[0])
    parser.add_argument("--expect", default=None, help=f"expectations JSON (default {DEFAULT_EXPECT} if present)")
    parser.add_argument("--json", dest="json_out", default=None, help="write the JSON report here ('-' = stdout)")
    parser.add_argument("--gpus", default="auto", help="auto | all | none | N")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds for a collective or a DataLoader")
    parser.add_argument("--lock-match", choices=["exact", "pins", "none"], default="exact")
    parser.add_argument("--only", action="append", help="run only this check (repeatable)")
    parser.add_argument("--local", action="store_true", help="on the host, not in an image (changes the remedies)")
    args = parser.parse_args(argv)
    path = args.expect or (DEFAULT_EXPECT if os.path.exists(DEFAULT_EXPECT) else None)
    expect: dict[str, Any] = {}
    if path:
        with open(path, encoding="utf-8") as fh:
            expect = json.load(fh)
    ctx = Context(expect=expect, gpus=args.gpus, timeout=args.timeout, lock_match=args.lock_match, local=args.local)
    report = run(ctx, args.only)
    text = table(report)
    if args.json_out == "-":
        print(text, file=sys.stderr)
        print(json.dumps(report, indent=2))
    else:
        print(text)
        if args.json_out:
            with open(args.json_out, "w", encoding="utf-8") as fh:
                json.dump(report, fh, indent=2)
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
