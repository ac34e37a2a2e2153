"""A tiny but real training run, as a project's own smoke check (`checks:` in a profile).

A small CNN learns a synthetic task (is the bright square in the left or the right half?) for
60 steps through a DataLoader with two worker processes; the loss must fall at least 4x, and a
checkpoint saved and loaded back must give the same predictions. Exit 0 means it trains here.
"""

from __future__ import annotations

import os
import sys
import tempfile

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

STEPS = 60
MUST_FALL_BY = 4.0


class Squares(Dataset[tuple[torch.Tensor, int]]):
    """16x16 noise with a bright 4x4 square; the label is the half it lies in."""

    def __len__(self) -> int:
        return 512

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        g = torch.Generator().manual_seed(i)
        image = torch.randn(1, 16, 16, generator=g)
        label = i % 2
        row = int(torch.randint(0, 12, (1,), generator=g))
        col = int(torch.randint(0, 4, (1,), generator=g)) + 8 * label
        image[:, row : row + 4, col : col + 4] += 1.5
        return image, label


def model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d((1, 2)),
        nn.Flatten(),
        nn.Linear(32, 2),
    )


def main() -> int:
    torch.manual_seed(0)
    net = model()
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    loader = DataLoader(Squares(), batch_size=32, shuffle=True, num_workers=2, persistent_workers=True)
    losses: list[float] = []
    while len(losses) < STEPS:
        for images, labels in loader:
            loss = nn.functional.cross_entropy(net(images), labels)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
            if len(losses) == STEPS:
                break
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    print(f"loss {first:.3f} -> {last:.3f} over {STEPS} steps ({first / last:.1f}x)")
    if first / last < MUST_FALL_BY:
        print(f"the loss fell {first / last:.1f}x, less than {MUST_FALL_BY:g}x", file=sys.stderr)
        return 1
    probe = torch.stack([Squares()[i][0] for i in range(8)])
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "ckpt.pt")
        torch.save({"model": net.state_dict(), "optimizer": opt.state_dict()}, path)
        again = model()
        again.load_state_dict(torch.load(path, weights_only=True)["model"])
    net.eval()
    again.eval()
    with torch.no_grad():
        if not torch.equal(net(probe), again(probe)):
            print("the reloaded checkpoint predicts differently", file=sys.stderr)
            return 1
    print("checkpoint saved and reloaded: same predictions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
