"""`envbuild run`: the profile's image with the right GPU flags, shared memory and mounts."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from envbuild import hostgpu, tmpdirs
from envbuild.errors import UsageError
from envbuild.names import RUN_SHM_SIZE
from envbuild.profile import Profile


def check_env(item: str) -> str:
    """`-e NAME=VALUE` or `-e NAME` (taken from this shell), as docker reads them."""
    name = item.split("=", 1)[0]
    if not name or not (name[0].isalpha() or name[0] == "_") or not all(c.isalnum() or c == "_" for c in name):
        raise UsageError(
            f"-e {item!r}: not NAME=VALUE", hint="e.g. -e WANDB_MODE=offline, or -e HF_TOKEN to pass yours"
        )
    return item


def check_volume(item: str, *, elsewhere: str | None = None) -> str:
    """`-v HOST:CONTAINER[:ro]`: a host folder that exists, made absolute; or `-v NAME:CONTAINER`, a
    docker volume (a bare name, as docker reads it, where no such folder is here). With the engine
    on another machine (`elsewhere`), an absolute path is that machine's, and not looked for here."""
    parts = item.split(":")
    if len(parts) not in (2, 3) or not parts[0] or not parts[1].startswith("/"):
        raise UsageError(f"-v {item!r}: not HOST:CONTAINER[:ro]", hint="e.g. -v ~/datasets:/data:ro")
    if volume_name(item) or (elsewhere and parts[0].startswith("/")):
        return item
    host = Path(parts[0]).expanduser()
    if not host.exists():
        raise UsageError(f"-v {item!r}: {host} does not exist", hint="create it, or name a folder that exists")
    return ":".join([str(host.resolve()), *parts[1:]])


def volume_name(item: str) -> str:
    """The docker volume a `-v SOURCE:...` mounts: SOURCE when it is a name by docker's rule (no
    path: [a-zA-Z0-9][a-zA-Z0-9_.-]+) and no folder of that name is here; else ""."""
    source = item.split(":", 1)[0]
    named = re.fullmatch(r"[a-zA-Z0-9][a-zA-Z0-9_.-]+", source) is not None
    return source if named and not Path(source).exists() else ""


def check_publish(item: str) -> str:
    """`-p PORT`, `-p HOST:CONTAINER` or `-p IP:HOST:CONTAINER` (each with /tcp or /udp), as docker's
    -p; a port given without an address is published on 127.0.0.1 only. docker's own default is
    every interface, and its rules go in ahead of a host firewall, so a notebook server started for
    one user would answer the whole network."""
    spec, _, proto = item.partition("/")
    if spec.startswith("["):  # [IPv6]:HOST:CONTAINER
        address, _, ports = spec.partition("]:")
        parts = [address + "]", *ports.split(":")]
    else:
        parts = spec.split(":")
    *front, container = parts
    ok = proto in ("", "tcp", "udp") and _port(container) and len(front) <= 2
    if len(front) == 1:
        ok = ok and _port(front[0])
    elif len(front) == 2:  # the host port may be left out: docker picks a free one
        ok = ok and _address(front[0].strip("[]")) and (front[1] == "" or _port(front[1]))
    if not ok:
        raise UsageError(
            f"-p {item!r}: not PORT, HOST_PORT:CONTAINER_PORT or IP:HOST_PORT:CONTAINER_PORT",
            hint="e.g. -p 8888 (Jupyter at 127.0.0.1:8888), -p 6006:6006, -p 0.0.0.0:8000:8000 for other machines",
        )
    if len(parts) == 1:
        parts = [parts[0], parts[0]]
    if len(parts) == 2:
        parts = ["127.0.0.1", *parts]
    return ":".join(parts) + (f"/{proto}" if proto else "")


def published(spec: str) -> str:
    """Where a checked -p spec answers, and the mistake that makes it answer nothing: a server in
    the container listening on its own 127.0.0.1 (Jupyter's and many dev servers' default)."""
    ports, _, proto = spec.partition("/")
    address, host, container = ports.rsplit(":", 2)
    where = f"{address}:{host}" if host else f"{address}:(a free port: docker port shows it)"
    return (
        f"container port {container}{'/' + proto if proto else ''} is at {where}; a server in the job must listen "
        f"on 0.0.0.0 (jupyter lab --ip 0.0.0.0), not 127.0.0.1"
    )


def _port(text: str) -> bool:
    return text.isdigit() and 1 <= int(text) <= 65535


def _address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def check_network(network: str | None, publish: Sequence[str]) -> None:
    """--network: `host` (multi-node NCCL, a server on the host's ports) or a docker network (a
    database or tracking server in a container beside the job)."""
    if network is None:
        return
    if not network or not all(c.isalnum() or c in "-_." for c in network):
        raise UsageError(
            f"--network {network!r}: not a network name", hint="e.g. --network host, or a `docker network ls` name"
        )
    if network in ("host", "none") and publish:
        raise UsageError(
            f"-p and --network {network} do not go together: "
            + ("the job already listens on the host's own ports" if network == "host" else "the job has no network"),
            hint="drop -p" if network == "host" else "drop one of them",
        )


# What torch.compile builds lives outside ~/.cache by default (inductor's kernels, compiled graphs
# and vec-ISA probe in /tmp/torchinductor_USER; Triton's own in ~/.triton), so each run compiled its
# model from nothing again. In the download cache they are there for the next run. Inductor's cache
# keys carry torch's build, the hardware and the compiler command, so one folder serves every image
# and host; a -e of the same name wins.
JOB_CACHE = "/tmp/.cache"  # noqa: S108 - the job's ~/.cache in its container (HOME=/tmp), no file here
COMPILE_CACHES = {"TORCHINDUCTOR_CACHE_DIR": f"{JOB_CACHE}/torchinductor", "TRITON_HOME": JOB_CACHE}


def download_cache(choice: str, user: str | None = None) -> Path | None:
    """The host folder `run` mounts as the job's ~/.cache (HOME is /tmp): what Hugging Face,
    torch.hub and pip download there is kept for the next run, instead of vanishing with each
    container (a 7B model's 14 GB fetched again per run). "auto": ENVBUILD_RUN_CACHE, else
    $XDG_CACHE_HOME/envbuild/run or ~/.cache/envbuild/run; "none": no mount; else that folder.
    "auto" only for a job run as this user (the default): the folder is this user's, and another
    uid (--user) could not write it, where the container's own /tmp serves it."""
    if choice == "none" or (choice == "auto" and user not in (None, f"{os.getuid()}:{os.getgid()}")):
        return None
    folder = tmpdirs.run_cache() if choice == "auto" else Path(choice).expanduser()
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise UsageError(
            f"--download-cache: cannot make {folder}: {exc.strerror}",
            hint=f"name a folder you can write (--download-cache DIR, or {tmpdirs.RUN_CACHE_ENV}), "
            "or --download-cache none",
        ) from exc
    return folder.resolve()


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
    env: Sequence[str] = (),
    volumes: Sequence[str] = (),
    container_workdir: str | None = None,
    user: str | None = None,
    publish: Sequence[str] = (),
    network: str | None = None,
    cache: Path | None = None,
    elsewhere: str | None = None,
) -> list[str]:
    """The docker CLI call for an interactive-capable run (TTYs pass through the CLI untouched)."""
    gpus = hostgpu.gpus_for(gpus, prof.accelerator, absent_ok=False)
    if gpus != "none" and elsewhere is None and not hostgpu.host_has_gpu(prof.accelerator):
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
        argv += [arg for node in hostgpu.ROCM_DEVICES for arg in ("--device", node)]
        argv += [arg for group in hostgpu.rocm_groups() for arg in ("--group-add", group)]
    argv += ["--ipc=host"] if ipc_host else ["--shm-size", shm_size]
    argv += ["-v", f"{workdir.resolve()}:/workspace", "-w", container_workdir or "/workspace"]
    # As the host user by default, so what the job writes in /workspace (checkpoints, logs) is the
    # user's own file; HOME then points at a folder any user may write (the image's home is uid 1000's).
    argv += ["--user", user or f"{os.getuid()}:{os.getgid()}", "-e", "HOME=/tmp"]
    if cache is not None:
        argv += ["-v", f"{cache}:{JOB_CACHE}"]
        named = {item.partition("=")[0] for item in env}
        argv += [arg for key, value in COMPILE_CACHES.items() if key not in named for arg in ("-e", f"{key}={value}")]
    if os.environ.get("TERM"):
        argv += ["-e", f"TERM={os.environ['TERM']}"]
    for item in env:
        argv += ["-e", check_env(item)]
    for item in volumes:
        argv += ["-v", check_volume(item, elsewhere=elsewhere)]
    check_network(network, publish)
    if network is not None:
        argv += ["--network", network]
    for item in publish:
        argv += ["-p", check_publish(item)]
    argv.append(image)
    argv += command
    return argv


def call(argv: list[str], *, stdin_is_tty: bool) -> int:
    """Run the docker CLI until it exits, and return its exit code (the job's).

    A signal envbuild gets is passed on to the CLI, which passes it to the job (docker's
    sig-proxy, then the container's init), so SIGTERM from a CI timeout, `kill` or a job scheduler
    lets the job stop its own way, as a plain `docker run` does. subprocess.call SIGKILLed the CLI
    instead: the container ran on, GPUs and all, while envbuild said it had cleaned up. Where stdin
    is not a terminal the CLI gets a session of its own, so a Ctrl-C reaches it once, through
    envbuild; a terminal's Ctrl-C reaches the whole group at once (the CLI must stay in the
    terminal's group to read it), so there SIGINT is not passed on twice."""
    proc = subprocess.Popen(argv, start_new_session=not stdin_is_tty)

    def forward(signum: int, frame: FrameType | None) -> None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signum)

    passed = [signal.SIGTERM, signal.SIGHUP, *([] if stdin_is_tty else [signal.SIGINT])]
    before = {sig: signal.signal(sig, forward) for sig in passed}
    ignored = signal.signal(signal.SIGINT, signal.SIG_IGN) if stdin_is_tty else None
    try:
        code = proc.wait()  # PEP 475: resumed after each forward
        return 128 - code if code < 0 else code  # a CLI killed by a signal: as a shell says it
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
        if ignored is not None:
            signal.signal(signal.SIGINT, ignored)
