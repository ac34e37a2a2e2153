"""Checks that train: DDP, mixed precision, DataLoader workers, determinism."""

from __future__ import annotations

import datetime
import math
import multiprocessing as mp
import os
import socket
import time
from typing import Any

from .core import (
    SHM_MIN_BYTES,
    CheckFailed,
    Context,
    Result,
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
