"""Check a resolution against the profile before anything is written.

A resolver answers the question it was asked; this module checks that the
answer is the environment the profile meant: the exact torch release and
build, the pinned numpy, the matching torchvision/torchaudio, and every
artifact from the place it may come from.
"""

from __future__ import annotations

import re
from fnmatch import fnmatch

from packaging.version import Version

from envbuild import compat
from envbuild.errors import LockError
from envbuild.lockfile import Pin
from envbuild.names import TORCH_FAMILY_RE
from envbuild.profile import Profile
from envbuild.torchsource import TorchSource

_CUDA_RUNTIME = re.compile(r"^nvidia-cuda-runtime(-cu\d+)?$|^cuda-toolkit$")


def cuda_runtime(pins: dict[str, Pin]) -> tuple[str, Pin] | None:
    """(major.minor, pin) of the CUDA runtime wheel torch brought along, if any."""
    for pin in pins.values():
        if _CUDA_RUNTIME.fullmatch(pin.name):
            v = Version(pin.public_version)
            return f"{v.major}.{v.minor}", pin
    return None


def _same_place(source: str, allowed: str) -> bool:
    return source.rstrip("/") == allowed.rstrip("/")


def verify(profile: Profile, pins: dict[str, Pin], src: TorchSource, platform: str) -> None:
    problems: list[str] = []
    torch = pins.get("torch")
    origin = f" from {torch.source}" if torch and torch.source else ""
    if torch is None:
        raise LockError(f"{profile.name}: the resolution has no torch at all")
    if torch.public_version != profile.torch:
        problems.append(f"torch: expected {profile.torch}, the resolver chose {torch.version}{origin}")
    problems += _check_build(profile, pins, torch, origin, platform)
    numpy = pins.get("numpy")
    if numpy is None or numpy.version != profile.numpy:
        got = numpy.version if numpy else "nothing"
        problems.append(f"numpy: expected {profile.numpy}, the resolver chose {got}")
    row = compat.load().release(profile.torch)
    for lib, paired in (compat.companions(row, profile.torch) if row else {}).items():
        wanted = getattr(profile, lib)
        if not wanted:
            continue
        exact = paired if wanted == "auto" else wanted
        pin = pins.get(lib)
        if pin is None or not fnmatch(pin.public_version, exact):
            problems.append(f"{lib}: expected {exact}, the resolver chose {pin.version if pin else 'nothing'}")
    problems += _check_sources(pins, src)
    # A package of the profile's (timm) needs torchvision: uv takes a dependency's from PyPI, the
    # CUDA build, whatever index torch came from; only a companion the profile names is routed.
    pulled = [n for n in ("torchvision", "torchaudio") if n in pins and not getattr(profile, n)]
    if problems:
        raise LockError(
            f"{profile.name} ({platform}): the resolution does not match the profile; nothing was written:\n  "
            + "\n  ".join(problems),
            hint=f"a package of the profile needs {' and '.join(pulled)}: add "
            + " and ".join(f"`{n}: auto`" for n in pulled)
            + " to the profile, so it is locked with torch, from the same index and in the same build"
            if pulled and src.route == "index"
            else "point --torch-index at an index that serves this build, or change the profile",
        )


def _check_build(profile: Profile, pins: dict[str, Pin], torch: Pin, origin: str, platform: str) -> list[str]:
    runtime = cuda_runtime(pins)
    tag = profile.build_tag
    if profile.accelerator == "cuda":
        if torch.local and torch.local != tag:
            return [f"torch: expected the {tag} build, the resolver chose {torch.version}{origin}"]
        if runtime is None and not torch.local:
            return [
                f"torch: expected a CUDA {profile.cuda} build, the resolver chose {torch.version}{origin}, "
                "which brings no CUDA runtime (a CPU build)"
            ]
        if runtime and runtime[0] != profile.cuda:
            return [
                f"torch: expected a CUDA {profile.cuda} build (+{tag}), the resolver chose torch "
                f"{torch.version}{origin} with {runtime[1].name} {runtime[1].version} (CUDA {runtime[0]})"
            ]
        return []
    if profile.accelerator == "rocm":
        if torch.local != tag:
            return [
                f"torch: expected the ROCm {profile.rocm} build (+{tag}), the resolver chose {torch.version}{origin}"
            ]
        return []
    if torch.local and torch.local != "cpu":
        return [f"torch: expected the CPU build (+cpu), the resolver chose {torch.version}{origin}"]
    if runtime is not None or any(p.name.startswith("nvidia-") for p in pins.values()):
        return [f"torch: expected the CPU build, the resolver chose {torch.version}{origin} with CUDA libraries"]
    if not torch.local and platform == "x86_64":
        return [
            f"torch: expected the CPU build (+cpu), the resolver chose {torch.version}{origin} "
            "(PyPI's x86_64 torch is a CUDA build)"
        ]
    return []


def _check_sources(pins: dict[str, Pin], src: TorchSource) -> list[str]:
    problems: list[str] = []
    if src.torch_index is not None and _same_place(src.torch_index, src.index_url):
        return problems  # one index serves everything: there is nothing to confuse
    for pin in pins.values():
        if not pin.source:
            continue
        family = bool(TORCH_FAMILY_RE.fullmatch(pin.name))
        from_torch_index = src.torch_index is not None and _same_place(pin.source, src.torch_index)
        if src.route == "index" and not family and from_torch_index:
            problems.append(f"{pin.name}: came from the PyTorch index {pin.source}; only the torch family may")
        if src.route == "index" and pin.name in {"torch", "torchvision", "torchaudio"} and not from_torch_index:
            local = any(_same_place(pin.source, f) or pin.source.startswith("file://") for f in src.find_links)
            if not local:
                problems.append(f"{pin.name}: came from {pin.source}, not from the PyTorch index {src.torch_index}")
    return problems
