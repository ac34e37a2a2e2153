"""What this host offers the smoke test and `run`: its GPUs, and the --gpus / --shm-size values that
ask for them, checked before any work starts."""

from __future__ import annotations

import contextlib
import re
import shutil
from pathlib import Path

from envbuild.errors import UsageError

ROCM_DEVICES = ("/dev/kfd", "/dev/dri")  # what a ROCm container is given: the compute and render nodes


def host_has_gpu(accelerator: str) -> bool:
    if accelerator == "rocm":
        return Path(ROCM_DEVICES[0]).exists()
    return shutil.which("nvidia-smi") is not None or Path("/dev/nvidia0").exists()


def rocm_groups(devices: tuple[str, ...] | None = None) -> list[str]:
    """The groups a ROCm container's user needs to open the GPU's device nodes: `video`, and the
    host's groups of /dev/kfd and of the render nodes in /dev/dri (`render` on Ubuntu 22.04 and
    later, where both are root:render 0660). The images run as uid 1000, and `run` as the host's
    user, neither of whom is in `render` inside the container. By number: the image's /etc/group
    has no `render`, and the engine refuses a group name it cannot find there."""
    gids: set[int] = set()
    for device in map(Path, ROCM_DEVICES if devices is None else devices):
        for node in device.glob("renderD*") if device.is_dir() else [device]:
            with contextlib.suppress(OSError):
                gids.add(node.stat().st_gid)
    return ["video", *(str(gid) for gid in sorted(gids - {0}))]


def check_gpus(value: str) -> None:
    """`--gpus`: auto, all, none or a number of GPUs; anything else is a usage error, before any work."""
    if value in {"auto", "all", "none"} or (value.isdigit() and int(value) > 0):
        return
    raise UsageError(
        f"--gpus {value!r}: not auto, all, none or a number of GPUs",
        hint="e.g. --gpus all, or --gpus 2 for the first two, or --gpus none to skip the GPU checks",
    )


# What both docker-py and the docker CLI read as a size: a number, then b, k, m or g (and an optional b).
_SIZE_RE = re.compile(r"(?P<n>\d+(?:\.\d+)?)(?:[bkmg]b?)?", re.IGNORECASE)


def check_shm_size(value: str) -> None:
    """`--shm-size`: a size the engine reads; anything else is a usage error, not the SDK's exception."""
    m = _SIZE_RE.fullmatch(value.strip())
    if m and float(m["n"]) > 0:
        return
    raise UsageError(f"--shm-size {value!r}: not a size", hint="e.g. --shm-size 2g (a number, then b, k, m or g)")


def check_shm_choice(shm_size: str | None, ipc_host: bool, command: str) -> None:
    """`--shm-size` (None: not given) and `--ipc-host` together: the engine would ignore the size."""
    if shm_size is not None and ipc_host:
        raise UsageError(
            "--shm-size and --ipc-host: with --ipc-host the container uses the host's /dev/shm; pick one",
            hint=f"{command} --ipc-host, or {command} --shm-size {shm_size}",
        )
    if shm_size is not None:
        check_shm_size(shm_size)


def gpus_for(value: str, accelerator: str, *, absent_ok: bool, present: bool | None = None) -> str:
    """What to ask for: "none", "all" or a count.

    "auto" is every GPU of the host. Asked for directly (`smoke`, `run`), a GPU profile asks
    for them even on a host without any, so its gpu check fails there as it should. A build's
    own smoke test (`absent_ok`) checks the rest instead, so GPU images can be built on CPU
    runners; the image's io.envbuild.smoke.gpu label then says "skip". `present`: whether the
    engine's machine has them, where that is not this host (None: this host is asked).
    """
    check_gpus(value)
    if accelerator == "cpu":
        return "none"
    if value == "auto":
        there = host_has_gpu(accelerator) if present is None else present
        return "none" if absent_ok and not there else "all"
    return value
