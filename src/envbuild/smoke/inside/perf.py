"""Check: is this host as fast as it should be? Matrix throughput, memory and host-link bandwidth,
and NCCL's all_reduce bus bandwidth with two GPUs or more, each as a share of the datasheet peak.

What nccl-tests and DCGM do separately: a throttled or power-capped GPU, a PCIe link trained at a
lower width or generation, or NCCL falling back to sockets shows here before a week-long job.
"""

from __future__ import annotations

import time
from typing import Any

from .core import CheckFailed, Context, Result

# Dense (not sparse) peaks from each vendor's datasheet; memory in GB/s; link: the host link's
# one-direction peak in GB/s (PCIe 4.0 x16 32, PCIe 5.0 x16 64). Matched on the device name.
PEAKS: list[dict[str, Any]] = [
    {"match": "H200", "bf16": 989, "fp16": 989, "memory": 4800, "link": 64,
     "source": "NVIDIA H200 Tensor Core GPU datasheet (SXM), 2024"},
    {"match": "H100 PCIe", "bf16": 756, "fp16": 756, "memory": 2000, "link": 64,
     "source": "NVIDIA H100 Tensor Core GPU datasheet (PCIe), 2023"},
    {"match": "H100", "bf16": 989, "fp16": 989, "memory": 3350, "link": 64,
     "source": "NVIDIA H100 Tensor Core GPU datasheet (SXM), 2023"},
    {"match": "A100-PCIE", "bf16": 312, "fp16": 312, "memory": 1555, "link": 32,
     "source": "NVIDIA A100 Tensor Core GPU datasheet (PCIe 40GB), 2021"},
    {"match": "A100", "bf16": 312, "fp16": 312, "memory": 2039, "link": 32,
     "source": "NVIDIA A100 Tensor Core GPU datasheet (SXM 80GB), 2021"},
    {"match": "L40S", "bf16": 362, "fp16": 362, "memory": 864, "link": 32,
     "source": "NVIDIA L40S datasheet, 2023"},
    {"match": "L4", "bf16": 121, "fp16": 121, "memory": 300, "link": 32,
     "source": "NVIDIA L4 Tensor Core GPU datasheet, 2023"},
    {"match": "B200", "bf16": 2250, "fp16": 2250, "memory": 8000, "link": 64,
     "source": "NVIDIA HGX B200 datasheet (per GPU), 2024"},
    {"match": "MI300X", "bf16": 1307, "fp16": 1307, "memory": 5300, "link": 64,
     "source": "AMD Instinct MI300X data sheet, 2023"},
]  # fmt: skip
# A healthy device reaches 75-90% of these on the large, simple kernels below (an H200 here: bf16
# 8192^3 matmul ~790 of 989 TFLOP/s, a device copy ~4.3 of 4.8 TB/s). Under half means something
# is wrong with the host (clocks, power cap, link width), not with the kernel.
WARN_BELOW_PCT = 50.0


def peak_for(name: str) -> dict[str, Any] | None:
    for row in PEAKS:
        if str(row["match"]).lower() in name.lower():
            return row
    return None


def _timed(torch: Any, fn: Any, device: str, repeat: int) -> float:
    fn()  # warm-up: kernel selection, allocation
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(repeat):
        fn()
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)
    return (time.perf_counter() - t0) / repeat


def _matmul_tflops(torch: Any, device: str, dtype: Any, n: int, repeat: int) -> float:
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    seconds = _timed(torch, lambda: torch.mm(a, b), device, repeat)
    return float(2 * n**3 / seconds / 1e12)


def _gpu(torch: Any, index: int) -> dict[str, Any]:
    device = f"cuda:{index}"
    name = torch.cuda.get_device_name(index)
    row = peak_for(name)
    out: dict[str, Any] = {"device": device, "name": name}
    for label, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        out[f"{label}_tflops"] = round(_matmul_tflops(torch, device, dtype, 8192, 10), 1)
    big = torch.empty(1 << 28, dtype=torch.uint8, device=device)  # 256 MiB
    dst = torch.empty_like(big)
    copy_s = _timed(torch, lambda: dst.copy_(big), device, 20)
    out["memory_gbs"] = round(2 * big.numel() / copy_s / 1e9, 1)  # bytes read plus bytes written
    host = torch.empty(1 << 28, dtype=torch.uint8, pin_memory=True)
    out["h2d_gbs"] = round(
        host.numel() / _timed(torch, lambda: big.copy_(host, non_blocking=True), device, 10) / 1e9, 1
    )
    out["d2h_gbs"] = round(
        host.numel() / _timed(torch, lambda: host.copy_(big, non_blocking=True), device, 10) / 1e9, 1
    )
    if row is not None:
        out["peak_source"] = row["source"]
        out["pct"] = {
            "bf16": round(100 * out["bf16_tflops"] / row["bf16"], 1),
            "fp16": round(100 * out["fp16_tflops"] / row["fp16"], 1),
            "memory": round(100 * out["memory_gbs"] / row["memory"], 1),
            "h2d": round(100 * out["h2d_gbs"] / row["link"], 1),
            "d2h": round(100 * out["d2h_gbs"] / row["link"], 1),
        }
    return out


def _all_reduce_busbw(torch: Any, count: int) -> float:
    """NCCL all_reduce across every GPU of this process (torch.cuda.nccl), as nccl-tests reports it:
    bus bandwidth = size / time * 2 (n - 1) / n."""
    from torch.cuda import nccl

    n = torch.cuda.device_count()
    tensors = [torch.ones(1 << 26, dtype=torch.float32, device=f"cuda:{i}") for i in range(n)]  # 256 MiB each

    def run() -> None:
        nccl.all_reduce(tensors)

    run()
    for i in range(n):
        torch.cuda.synchronize(i)
    t0 = time.perf_counter()
    for _ in range(count):
        run()
    for i in range(n):
        torch.cuda.synchronize(i)
    seconds = (time.perf_counter() - t0) / count
    size = tensors[0].numel() * 4
    return float(size / seconds * 2 * (n - 1) / n / 1e9)


def check_perf(ctx: Context, r: Result) -> None:
    import torch

    cpu_gflops = _matmul_tflops(torch, "cpu", torch.float32, 1024, 5) * 1000
    r.facts["cpu_fp32_gflops"] = round(cpu_gflops, 1)
    if not (ctx.use_gpu and torch.cuda.is_available()):
        return  # a CPU has no datasheet here to compare with: GFLOP/s only
    gpus = [_gpu(torch, i) for i in range(torch.cuda.device_count())]
    r.facts["gpus"] = gpus
    if len(gpus) >= 2:
        r.facts["all_reduce_busbw_gbs"] = round(_all_reduce_busbw(torch, 10), 1)
    low = [
        f"{g['device']} {what} at {pct}% of its datasheet peak"
        for g in gpus
        for what, pct in (g.get("pct") or {}).items()
        if pct < WARN_BELOW_PCT
    ]
    if not any("pct" in g for g in gpus):
        r.facts["note"] = "no datasheet peak for " + ", ".join(sorted({g["name"] for g in gpus}))
    if low:
        r.facts["warnings"] = low
    floor = ctx.min_peak
    if floor is not None:
        under = [
            f"{g['device']} {what} {pct}%" for g in gpus for what, pct in (g.get("pct") or {}).items() if pct < floor
        ]
        if under:
            raise CheckFailed(
                f"under --min-peak {floor:g}%: " + ", ".join(under),
                "check clocks and power caps (nvidia-smi -q -d CLOCK,POWER), the PCIe link "
                "(nvidia-smi -q | grep -A3 'Link Width'), and NCCL_DEBUG=INFO for a socket fallback",
            )
