"""A small GPT trained the way teams train on GPUs, as a project's own smoke check (`checks:`).

What a training script of 2025-26 leans on, each of which an environment can lack while
`import torch` works: `torch.compile` of a whole model (forward, backward and the optimizer step),
`scaled_dot_product_attention` with its fused kernels (flash attention on a GPU that has it),
bf16 autocast, a fused AdamW, a checkpoint saved and loaded back, and `torch.export` of the
trained model for serving (AOTInductor's package too where torch has it). The task is learnable
in a few dozen steps: each sequence counts up from a random start by a random stride modulo the
vocabulary, so the loss must fall at least MUST_FALL_BY times. Exit 0 means it trains here; the
last line printed is a JSON summary (times, the attention backend, what was exported).

Runs on the first GPU when there is one, else on the CPU (smaller, to stay quick).
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
import time

import torch
from torch import nn
from torch.nn import functional as F

VOCAB = 64
MUST_FALL_BY = 3.0


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    def __init__(self, width: int, layers: int, heads: int, context: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, width)
        self.pos = nn.Embedding(context, width)
        self.blocks = nn.Sequential(*(Block(width, heads) for _ in range(layers)))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, VOCAB, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        return self.head(self.norm(self.blocks(self.tok(idx) + self.pos(pos))))


def batch(n: int, context: int, device: str, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    start = torch.randint(0, VOCAB, (n, 1), generator=g)
    stride = torch.randint(1, 8, (n, 1), generator=g)
    seq = (start + stride * torch.arange(context + 1)) % VOCAB
    return seq[:, :-1].to(device), seq[:, 1:].to(device)


def flash_attention(device: str) -> str:
    """Whether the fused flash kernel runs here in bf16 (what `sdpa` picks on Ampere and later)."""
    if device != "cuda":
        return "cpu: not applicable"
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = torch.randn(2, 4, 128, 64, device=device, dtype=torch.bfloat16)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        fused = F.scaled_dot_product_attention(q, q, q, is_causal=True)
    with sdpa_kernel([SDPBackend.MATH]):
        ref = F.scaled_dot_product_attention(q.float(), q.float(), q.float(), is_causal=True)
    err = (fused.float() - ref).abs().max().item()
    if err > 0.05:
        raise SystemExit(f"flash attention differs from the math kernel by {err:.3g}")
    return f"flash ok (max error {err:.2g} vs fp32 math)"


def export_for_serving(net: nn.Module, x: torch.Tensor, folder: str) -> dict[str, str]:
    done: dict[str, str] = {}
    net.eval()
    with torch.no_grad():
        want = net(x)
        program = torch.export.export(net, (x,))
        path = os.path.join(folder, "gpt.pt2")
        torch.export.save(program, path)
        got = torch.export.load(path).module()(x)
        if not torch.allclose(got, want, atol=1e-4, rtol=1e-4):
            raise SystemExit("the exported program answers differently from the model")
        done["torch.export"] = "saved, loaded, same answer"
        aoti = getattr(torch._inductor, "aoti_compile_and_package", None)
        if aoti is None:
            done["aoti"] = f"skip: torch {torch.__version__} has no aoti_compile_and_package"
            return done
        t0 = time.perf_counter()
        package = aoti(program, package_path=os.path.join(folder, "gpt_aoti.pt2"))
        runner = torch._inductor.aoti_load_package(package)
        got = runner(x)
        if not torch.allclose(got, want, atol=1e-3, rtol=1e-3):
            raise SystemExit("the AOTInductor package answers differently from the model")
        done["aoti"] = f"compiled in {time.perf_counter() - t0:.1f} s, same answer"
    return done


def main() -> int:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    big = device == "cuda"
    width, layers, heads, context, n, steps = (256, 4, 8, 128, 64, 80) if big else (64, 2, 4, 32, 32, 100)
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    net = GPT(width, layers, heads, context).to(device)
    opt = torch.optim.AdamW(net.parameters(), lr=3e-3, fused=big)
    dtype = torch.bfloat16
    summary: dict[str, object] = {"device": torch.cuda.get_device_name(0) if big else "cpu"}
    summary["attention"] = flash_attention(device)

    @torch.compile
    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device, dtype=dtype):
            loss = F.cross_entropy(net(x).flatten(0, 1), y.flatten())
        loss.backward()
        return loss

    losses: list[float] = []
    t0 = time.perf_counter()
    for i in range(steps):
        x, y = batch(n, context, device, g)
        loss = step(x, y)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if i == 0:
            summary["first_step_s"] = round(time.perf_counter() - t0, 1)
    summary["steps_s"] = round(time.perf_counter() - t0, 1)
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    summary["loss"] = f"{first:.3f} -> {last:.3f} over {steps} steps"
    print(f"loss {first:.3f} (ln {VOCAB} = {math.log(VOCAB):.3f}) -> {last:.3f} over {steps} steps")
    if not math.isfinite(last) or first / last < MUST_FALL_BY:
        print(f"the loss fell {first / last:.1f}x, less than {MUST_FALL_BY:g}x", file=sys.stderr)
        return 1

    x, _ = batch(4, context, device, g)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "ckpt.pt")
        torch.save({"model": net.state_dict(), "optimizer": opt.state_dict()}, path)
        again = GPT(width, layers, heads, context).to(device)
        again.load_state_dict(torch.load(path, weights_only=True)["model"])
        net.eval()
        again.eval()
        with torch.no_grad():
            if not torch.equal(net(x), again(x)):
                print("the reloaded checkpoint predicts differently", file=sys.stderr)
                return 1
        t1 = time.perf_counter()
        summary["export"] = export_for_serving(again, x, tmp)
        summary["export_s"] = round(time.perf_counter() - t1, 1)
    print(json.dumps(summary, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
