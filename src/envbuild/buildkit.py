"""BuildKit through the Docker CLI (`--builder buildkit`): which CLI, and how the image comes back.

docker-py drives only the classic builder (docker/docker-py#2230), so BuildKit is reached through
the `docker` CLI: buildx when installed, else `DOCKER_BUILDKIT=1 docker build`.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import shutil
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

_BUILDKIT_VERSION_RE = re.compile(r"^\s*Build[Kk]it(?: version)?:\s*v?(\d+)\.(\d+)", re.M)


def buildkit_version(inspect_output: str) -> tuple[int, int] | None:
    """The builder's BuildKit (major, minor) from `docker buildx inspect`, None when it does not say."""
    m = _BUILDKIT_VERSION_RE.search(inspect_output)
    return (int(m.group(1)), int(m.group(2))) if m else None


def buildx_output(version: tuple[int, int] | None) -> list[str]:
    """How buildx hands the image to the engine: from BuildKit 0.13 on, with every file's time in the
    layers rewritten to SOURCE_DATE_EPOCH (rewrite-timestamp), so two builds of one lockfile can give
    one image digest; before that, --load (layer times are then the build's)."""
    if version is not None and version >= (0, 13):
        return ["--output", "type=docker,rewrite-timestamp=true"]
    return ["--load"]


def docker_cli() -> str:
    """The engine's own `docker` client (Debian's /usr/bin/docker) before any other on PATH: its
    `build` speaks BuildKit with DOCKER_BUILDKIT=1."""
    return "/usr/bin/docker" if Path("/usr/bin/docker").exists() else (shutil.which("docker") or "docker")


def cli() -> list[str]:
    """The command that starts a BuildKit build, up to its options: buildx when the client has it."""
    for cand in dict.fromkeys((docker_cli(), shutil.which("docker") or "")):  # buildx may be either's
        present = bool(cand) and Path(cand).exists()
        if present and subprocess.run([cand, "buildx", "version"], capture_output=True, check=False).returncode == 0:
            inspect = subprocess.run([cand, "buildx", "inspect"], capture_output=True, text=True, check=False)
            return [cand, "buildx", "build", *buildx_output(buildkit_version(inspect.stdout))]
    return [docker_cli(), "build"]


def command(ctx: Path, iid: Path, buildargs: dict[str, str], *, no_cache: bool, pull: bool) -> list[str]:
    """The CLI call that builds the context's runtime stage and writes the image's ID to `iid`."""
    cmd = [*cli(), "--progress=plain", "--target", "runtime", "--iidfile", str(iid), "-f", str(ctx / "Dockerfile")]
    for k, v in sorted(buildargs.items()):
        cmd += ["--build-arg", f"{k}={v}"]
    return [*cmd, *(["--no-cache"] if no_cache else []), *(["--pull"] if pull else []), str(ctx)]


def stop(proc: subprocess.Popen[str]) -> None:
    """Stop a build's CLI (in a session of its own) as Ctrl-C would: on SIGINT it cancels the build
    it started in the engine, and exits; SIGKILL if it has not within 10 s."""
    for sig, grace in ((signal.SIGINT, 10.0), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace)
            return


def lines(proc: subprocess.Popen[str], silence: float) -> Iterator[str]:
    """The lines a build's CLI prints, as they come; TimeoutError when it prints nothing for
    `silence` seconds (an engine that hangs holds the CLI, which would wait on it forever)."""
    got: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        # the pipe may be closed under it once the CLI was stopped (`with Popen` closes it)
        with contextlib.suppress(ValueError, OSError):
            for raw in proc.stdout or []:
                got.put(raw)
        got.put(None)

    threading.Thread(target=pump, name="buildkit-output", daemon=True).start()
    while True:
        try:
            raw = got.get(timeout=silence)
        except queue.Empty:
            raise TimeoutError(f"the BuildKit CLI printed nothing for {silence:g} s") from None
        if raw is None:
            return
        yield raw.rstrip("\n")
