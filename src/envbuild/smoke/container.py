"""The smoke container: how it is made to run this envbuild's smoke test on an image's own
environment, with the GPUs the accelerator needs."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

from envbuild import buildctx, enginelost, hostgpu
from envbuild import plan as plan_mod
from envbuild.errors import SmokeError
from envbuild.names import ENTRY_SCRIPT, LABEL_SMOKE_CONTAINER
from envbuild.smoke.inside.core import WORKDIR_ENV

# Where the host puts its own copy of the smoke test in the container (see with_host_smoke).
HOST_SMOKE_DIR = "/.envbuild-smoke"


_HEAD = ("python", "-m", buildctx.SMOKE_PACKAGE)
# The scan of an image's environment (smoke.scan); -S: none of the image's site hooks run
SCAN_HEAD = ("python", "-S", "-m", f"{buildctx.SMOKE_PACKAGE}.manifest")


def is_smoke_command(cmd: list[str]) -> bool:
    """A smoke or scan container's command: this envbuild's, or an earlier one's (the image's envbuild-smoke)."""
    return any(tuple(cmd[: len(head)]) == head for head in (_HEAD, SCAN_HEAD)) or cmd[:1] == [buildctx.SMOKE_ENTRY]


def gpu_kwargs(accelerator: str, gpus: str) -> dict[str, Any]:
    if gpus == "none" or accelerator == "cpu":
        return {}
    if accelerator == "rocm":
        return {
            "devices": [f"{node}:{node}:rwm" for node in hostgpu.ROCM_DEVICES],
            "group_add": hostgpu.rocm_groups(),
            "security_opt": ["seccomp=unconfined"],
        }
    import docker

    count = -1 if gpus in {"all", "auto"} else int(gpus)
    return {"device_requests": [docker.types.DeviceRequest(count=count, capabilities=[["gpu"]])]}


def not_envbuild(image: str) -> SmokeError:
    return SmokeError(
        f"{image} has no envbuild-smoke: it is not an envbuild image",
        hint="only envbuild images carry the smoke test; build one with `envbuild build NAME`",
    )


def cannot_run(image: str, why: str, what: str = "the smoke test") -> SmokeError:
    """An envbuild image (its labels say so) in which the smoke test (or the scan) cannot start."""
    return SmokeError(
        f"{what} cannot start in {image}: {why.strip()[-300:]}",
        hint="it runs the image's /bin/sh and `python` (first on PATH); a derived image that removed "
        "or replaced them cannot be checked: rebuild from the envbuild image",
    )


def settings(
    inspected: dict[str, Any],
    gpus: str,
    check_timeout: float,
    *,
    min_peak: float | None,
    lock_match: str | None,
    ipc_host: bool,
    shm_size: str | None,
    only: Sequence[str] = (),
) -> tuple[list[str], dict[str, Any]]:
    """(command, create() arguments) of a smoke container, GPUs aside."""
    command = [*_HEAD, "--json", "-", "--gpus", gpus, "--timeout", str(check_timeout)]
    if min_peak is not None:
        command += ["--min-peak", str(min_peak)]
    if lock_match is not None:
        command += ["--lock-match", lock_match]
    command += only_args(only)
    kwargs = with_host_smoke(inspected)
    if ipc_host:
        kwargs["ipc_mode"] = "host"
    elif shm_size:
        kwargs["shm_size"] = shm_size
    return command, kwargs


def only_args(only: Sequence[str]) -> list[str]:
    """envbuild-smoke's arguments for `--only`, in a container or an interpreter here."""
    return [arg for name in only for arg in ("--only", name)]


def smoke_first(own: str, theirs: str) -> str:
    """A PYTHONPATH with the smoke package's folder first, then the one the environment had: what
    that puts first is part of the environment under test (integrity fails a shadowed locked package)."""
    return own + (f":{theirs}" if theirs else "")


def with_host_smoke(inspected: dict[str, Any]) -> dict[str, Any]:
    """What makes the container run this envbuild's smoke test, not the image's copy of it.

    An image's own envbuild-smoke, its entrypoint and its smoke package are files a derived or
    tampered image can replace, and a replaced one can print any report (a passing one included).
    The container therefore starts the image's Python on the package as this host has it (put in
    by create(), on the engine's side, so a remote engine works too), through this envbuild's entry
    script, under the engine's own init: an ENTRYPOINT a derived image set is not run either. The
    image's expect.json, manifest and checks are still read where the build put them; what they
    say is held against the files (integrity) and the labels (labels check)."""
    config = inspected.get("Config") or {}
    env = config.get("Env") or []
    theirs = next((e.split("=", 1)[1] for e in env if e.startswith("PYTHONPATH=")), "")
    # the checks run elsewhere, so integrity is told where the image's users start
    workdir = {WORKDIR_ENV: config["WorkingDir"]} if config.get("WorkingDir") else {}
    return {
        "entrypoint": ["/bin/sh", f"{HOST_SMOKE_DIR}/{ENTRY_SCRIPT}"],
        "init": True,
        # -m puts the working folder first on sys.path: ours, so a package of the same name in the
        # image's WORKDIR is not what runs
        "working_dir": HOST_SMOKE_DIR,
        "environment": {
            "PYTHONPATH": smoke_first(HOST_SMOKE_DIR, theirs),
            "PYTHONDONTWRITEBYTECODE": "1",
            **workdir,
        },
    }


def host_smoke_tar() -> bytes:
    """The host's smoke package and entry script as a tar for put_archive at /: readable by any
    uid the image runs as, owned by root, so the checks cannot change them."""
    import io
    import tarfile

    files = {f"{buildctx.SMOKE_PACKAGE}/{n}": t for n, t in plan_mod.smoke_sources().items()}
    files[ENTRY_SCRIPT] = buildctx.ENTRY_SCRIPT_TEXT
    root = HOST_SMOKE_DIR.lstrip("/")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for folder in (root, f"{root}/{buildctx.SMOKE_PACKAGE}"):
            info = tarfile.TarInfo(folder)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        for name, text in sorted(files.items()):
            data = text.encode("utf-8")
            info = tarfile.TarInfo(f"{root}/{name}")
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def cannot_exec(message: str) -> bool:
    return "executable file not found" in message or "no such file or directory" in message.lower()


def start(container: Any, shown: str, what: str = "the smoke test") -> None:
    """Start a created smoke or scan container. An image whose shell or `python` is gone is
    cannot_run (no retry helps); any other refusal is the engine's APIError, for the caller."""
    import docker

    try:
        container.start()
    except docker.errors.APIError as exc:
        why = str(exc.explanation or exc)
        if cannot_exec(why):
            raise cannot_run(shown, why, what) from exc
        raise


def inspect(cli: Any, image: str, shown: str | None) -> dict[str, Any]:
    import docker

    try:
        found: dict[str, Any] = cli.api.inspect_image(image)
    except docker.errors.ImageNotFound as exc:
        raise SmokeError(
            f"no image {shown or image} in the engine", hint="build it (envbuild build NAME) or pull it"
        ) from exc
    return found


def finish(container: Any, timeout: float, timed_out: SmokeError) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of a started container once it has ended; `timed_out` is
    raised when it runs past `timeout` (the caller removes the container either way)."""
    import docker

    try:
        status = container.wait(timeout=timeout)
    except Exception as exc:  # EngineNoAnswer from engine.client's; requests' own from a bare SDK client
        if isinstance(exc, docker.errors.APIError) or not enginelost.is_timeout(exc):
            raise
        raise timed_out from exc
    out = container.logs(stdout=True, stderr=False).decode("utf-8", "replace")
    err = container.logs(stdout=False, stderr=True).decode("utf-8", "replace")
    return int(status.get("StatusCode", 1)), out, err


def create(cli: Any, image: str, command: list[str], kwargs: dict[str, Any]) -> Any:
    import docker

    try:
        # create, then start: docker-py's containers.run() leaves the created container behind
        # when the start fails (a GPU request on a host without the NVIDIA runtime does)
        container = cli.containers.create(image, command, labels={LABEL_SMOKE_CONTAINER: image}, **kwargs)
    except docker.errors.ImageNotFound as exc:
        raise SmokeError(f"no image {image} in the engine", hint="build it (envbuild build NAME) or pull it") from exc
    except docker.errors.APIError as exc:
        raise SmokeError(f"the smoke container could not be created: {exc.explanation or exc}") from exc
    try:
        container.put_archive("/", host_smoke_tar())
    except BaseException as exc:  # an interrupt here too: the caller's cleanup has no container yet
        with contextlib.suppress(docker.errors.APIError):
            container.remove(force=True)
        if isinstance(exc, docker.errors.APIError):
            raise SmokeError(f"the smoke test could not be put into the container: {exc.explanation or exc}") from exc
        raise
    return container
