"""`envbuild run`: the profile's image with the right GPU flags, shared memory and mounts."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from envbuild import engine, hostgpu
from envbuild.errors import UsageError
from envbuild.names import RUN_SHM_SIZE
from envbuild.profile import Profile


def docker_argv(
    prof: Profile,
    image: str,
    command: list[str],
    *,
    workdir: Path,
    gpus: str = "auto",
    ipc_host: bool = False,
    shm_size: str = RUN_SHM_SIZE,
    tty: bool = False,
) -> list[str]:
    """The docker CLI call for an interactive-capable run (TTYs pass through the CLI untouched)."""
    gpus = hostgpu.gpus_for(gpus, prof.accelerator, absent_ok=False)
    if gpus != "none" and engine.engine_url()[0].startswith("unix://") and not hostgpu.host_has_gpu(prof.accelerator):
        # docker's own answer would be "could not select device driver "" with capabilities: [[gpu]]"
        kind = "NVIDIA GPU (no nvidia-smi, no /dev/nvidia0)" if prof.accelerator == "cuda" else "ROCm device (/dev/kfd)"
        raise UsageError(
            f"{prof.name} asks for GPUs, and this host has no {kind}",
            hint="run it on a GPU host, or pass --gpus none to start it without (GPU calls then fail inside)",
        )
    exe = shutil.which("docker")
    if exe is None:
        raise UsageError("the docker CLI is not on PATH", hint="install docker (the client) to use `envbuild run`")
    argv = [exe, "run", "--rm", "--init"]
    if tty:
        argv += ["-it"]
    else:
        argv += ["-i"]
    if prof.accelerator == "cuda" and gpus != "none":
        argv += ["--gpus", gpus]
    elif prof.accelerator == "rocm" and gpus != "none":
        argv += ["--device", "/dev/kfd", "--device", "/dev/dri", "--group-add", "video"]
    argv += ["--ipc=host"] if ipc_host else ["--shm-size", shm_size]
    argv += ["-v", f"{workdir.resolve()}:/workspace", "-w", "/workspace"]
    # The image's own non-root user (uid 1000) is kept; HOME is its home folder.
    if os.environ.get("TERM"):
        argv += ["-e", f"TERM={os.environ['TERM']}"]
    argv.append(image)
    argv += command
    return argv
