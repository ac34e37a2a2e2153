"""Stages side by side on the classic builder: the stages of a layered Dockerfile that do not wait
for each other run as builds of their own, at once, before the whole build.

docker-py drives only the classic builder, and it runs a Dockerfile's stages one after another: in
a cold cpu-py311 build the runtime's OS packages waited for the torch stage, which waited for the
OS Python of venv-base. Each stage here is rendered alone, from the Dockerfile's very lines (render's
`stage_only`), and sent with only the wheels it installs; the classic builder keys a cached step by
its parent image and the step itself, not by the Dockerfile it came from, so the whole build that
follows finds every step of these stages in the cache and runs only what joins them.

Only where it pays: when a layer stage's cache image is missing from the engine (its labels say
which; render.layer_cache_labels). A rebuild that finds them all, or that changes only the `rest`,
runs as before: side builds would only add the sending of their contexts. Never with --no-cache:
the whole build would not use what they made. BuildKit runs stages side by side by itself.

A side build whose step fails is only written to its log: the whole build runs the same step next
and reports it as it always did. One that lost the engine (no answer within ENVBUILD_STEP_TIMEOUT,
or a dropped connection) ends the build with that error at once. An interrupt closes every side
build's connection, which makes the engine stop it.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from envbuild import engine, enginelost
from envbuild.buildctx import Context
from envbuild.errors import EngineUnavailable
from envbuild.layering import SideStage
from envbuild.names import LABEL_STAGE_SHA, Events

SIDE_DOCKERFILE = "Dockerfile.envbuild-side"  # in a side build's context only, never in the folder


def wanted(cli: Any, sides: Sequence[SideStage]) -> list[SideStage]:
    """The side builds worth starting: none while every layer stage's cache image is in the engine
    or only the rest's is missing; else venv-base, runtime-os and the stages found missing."""
    missing = {s.name for s in sides if s.cached_by and not _cached(cli, s.cached_by)}
    if not any(name.startswith("layer-") for name in missing):
        return []
    return [s for s in sides if not s.cached_by or s.name in missing]


def _cached(cli: Any, labels: Sequence[tuple[str, str]]) -> bool:
    return bool(cli.api.images(filters=_having(labels), quiet=True))


def _having(labels: Sequence[tuple[str, str]]) -> dict[str, list[str]]:
    """The engine's image filter for images that carry every one of these labels."""
    return {"label": [f"{k}={v}" for k, v in labels]}


class _Side(threading.Thread):
    """One side build, on a client of its own: closing it is how an interrupt stops the build."""

    def __init__(self, stage: SideStage, context: Path, exclude: list[str], buildargs: dict[str, str], log: Path):
        super().__init__(name=f"envbuild-side-{stage.name}", daemon=True)  # never holds the process at exit
        self.stage, self.context, self.exclude, self.buildargs, self.log = stage, context, exclude, buildargs, log
        self.client: Any = None
        self.timeout = enginelost.step_timeout()
        self.ran = 0  # steps that ran a container (not cached)
        self.failed = ""
        self.error: Exception | None = None
        self.seconds = 0.0
        self.said = False
        self.stopping = threading.Event()

    def run(self) -> None:
        t0 = time.monotonic()
        try:
            self.client = engine.client(timeout=self.timeout)
            if self.stopping.is_set():  # stopped while it connected: stop() found no client to close
                self.client.close()
                return
            with self.log.open("w", encoding="utf-8") as out:
                archive = context_archive(
                    str(self.context), exclude=self.exclude, dockerfile=SIDE_DOCKERFILE, replaced=self.stage.dockerfile
                )
                with archive:
                    stream = self.client.api.build(
                        fileobj=archive,
                        custom_context=True,
                        dockerfile=SIDE_DOCKERFILE,
                        buildargs=self.buildargs,
                        rm=True,
                        forcerm=True,
                        decode=True,
                        timeout=self.timeout,
                    )
                    for chunk in stream:
                        text = str(chunk.get("stream") or chunk.get("status") or "")
                        out.write(text)
                        self.ran += text.count("---> Running in ")
                        if "error" in chunk:
                            self.failed = str(chunk["error"]).strip()
                            out.write(self.failed + "\n")
        except Exception as exc:  # written down: the whole build runs this step next and says why
            self.failed = self.failed or f"{type(exc).__name__}: {exc}"
            self.error = exc
        finally:
            self.seconds = time.monotonic() - t0

    def stop(self) -> None:
        self.stopping.set()
        if self.client is not None:
            self.client.close()


def run(cli: Any, sides: Sequence[SideStage], context: Path, buildargs: dict[str, str], logs: Path, say: Events) -> int:
    """Run the side builds worth running (`wanted`): venv-base and runtime-os at once, then every
    stage that starts from venv-base at once. Returns how many steps they ran; raises
    EngineUnavailable at once when a side build lost the engine (the whole build would only wait
    for it again)."""
    return run_stages(wanted(cli, sides), sides, context, buildargs, logs, say)


def run_stages(
    chosen: Sequence[SideStage],
    sides: Sequence[SideStage],
    context: Path,
    buildargs: dict[str, str],
    logs: Path,
    say: Events,
) -> int:
    """`run` for the side builds chosen."""
    if not chosen:
        return 0
    logs.mkdir(parents=True, exist_ok=True)
    folders = {s.wheels for s in sides if s.wheels}

    def start(stage: SideStage) -> _Side:
        side = _Side(stage, context, sorted(folders - {stage.wheels}), buildargs, logs / f"{stage.name}.log")
        side.start()
        return side

    say("phase", "stages", f"{len(chosen)} stages side by side: {', '.join(s.name for s in chosen)}")
    first = [start(s) for s in chosen if not s.after]
    later: list[_Side] = []
    try:
        _wait([b for b in first if b.stage.name in {s.after for s in chosen}], say)
        if not any(b.failed for b in first):  # else the whole build meets the failure and says why
            later = [start(s) for s in chosen if s.after]
        _wait([*first, *later], say)
    except BaseException:
        for side in [*first, *later]:
            side.stop()
        raise
    for side in [*first, *later]:
        lost = _lost(side)
        if lost is not None:
            raise lost
    return sum(b.ran for b in [*first, *later])


def _lost(side: _Side) -> EngineUnavailable | None:
    """The engine error a side build met, if it was one: a hung or vanished engine, not a failed step."""
    if side.error is None or isinstance(side.error, EngineUnavailable):
        found = side.error
    else:  # the build's stream is read outside requests' send, where enginelost.guard sees nothing
        found = enginelost.lost(
            side.error, engine.engine_url()[0], f"the side build of {side.stage.name}", side.timeout
        )
    if found is not None:
        found.hint += f"; that build's output so far is in {side.log}"
    return found


def _wait(sides: list[_Side], say: Events) -> None:
    """Until these have ended, saying each as it ends. join() with a timeout: an interrupt still
    reaches this thread while it waits."""
    while True:
        for side in sides:
            if not side.is_alive() and not side.said:
                side.said = True
                outcome = f"failed ({side.failed[:120]}); the build runs it next" if side.failed else "done"
                say("phase", "stages", f"{side.stage.name} {outcome} in {side.seconds:.1f} s, {side.ran} steps ran")
        running = [side for side in sides if side.is_alive()]
        if not running:
            return
        running[0].join(0.2)


MAIN_DOCKERFILE = "Dockerfile.envbuild-taking"  # in the whole build's context when it takes stage images


def substitutes(cli: Any, sides: Sequence[SideStage], base: str) -> dict[str, str]:
    """{layer: image ID} for each layer stage whose image the engine has, made from this build's very
    inputs (its labels: LABEL_STAGE_SHA) on this build's base image (its history holds the base's
    ID: a base rebuilt or pulled anew under the same name is another base). The newest such."""
    base_id = cli.api.inspect_image(base)["Id"]
    found: dict[str, str] = {}
    for side in sides:
        if not side.name.startswith("layer-") or not any(k == LABEL_STAGE_SHA for k, _ in side.cached_by):
            continue
        rows = cli.api.images(filters=_having(side.cached_by))
        for row in sorted(rows, key=lambda r: int(r.get("Created") or 0), reverse=True):
            if base_id in {h.get("Id") for h in cli.api.history(row["Id"])}:
                found[side.name.removeprefix("layer-")] = str(row["Id"])
                break
    return found


def whole_build_source(cli: Any, ctx: Context, say: Events) -> dict[str, Any]:
    """What the whole build sends: the context folder as it is; or, where it can take layer stages'
    images (`substitutes`), the folder without those layers' wheels and with a Dockerfile that takes
    them. docker-py sends the whole folder on every classic build (torch's wheel alone is ~200 MB
    for a CPU profile, gigabytes for CUDA), while a cached step needs none of it."""
    images = substitutes(cli, ctx.sides, ctx.plan.base.image) if ctx.taking is not None else {}
    if not images or ctx.taking is None:
        return whole_folder(ctx.directory)
    say("phase", "stages", f"taking {', '.join(f'layer-{g}' for g in images)} from the engine; their wheels stay here")
    folders = [s.wheels for s in ctx.sides if s.name.removeprefix("layer-") in images and s.wheels]
    archive = context_archive(
        str(ctx.directory), exclude=folders, dockerfile=MAIN_DOCKERFILE, replaced=ctx.taking(images)
    )
    return {"fileobj": archive, "custom_context": True, "dockerfile": MAIN_DOCKERFILE}


def context_archive(
    folder: str, *, exclude: list[str] | None = None, dockerfile: str = "Dockerfile", replaced: str | None = None
) -> Any:
    """A build context as the tar docker-py sends, in a temporary file without a name. docker-py
    packs into a NamedTemporaryFile in TMPDIR, which a killed build (a CI job's timeout, the OOM
    killer, Ctrl-C twice) leaves behind as large as the context: the e2e suite's killed builds left
    40-56 MB each, and a CUDA profile's context is gigabytes. The kernel frees a file with no name
    when the process ends, however it ends. `replaced`: the text of `dockerfile` to send instead of
    the folder's (docker-py's way: a .dockerignore then names it, so no COPY takes it).

    Every entry is root's, as the docker CLI sends a context: the classic builder's cache key for a
    COPY holds the owner of each file, and docker-py sends the files' own. Two users of one engine
    (or a sudo build and a plain one) then had a cache each for one lockfile: a second user's build
    of a built profile re-ran 26 of its 43 steps, the torch layer's install and copy among them.
    The image's files are root's either way (COPY without --chown)."""
    import tempfile

    archive = tempfile.TemporaryFile()  # noqa: SIM115 - returned open: the build reads it, then closes it
    ignored = "\n".join([*(exclude or [".dockerignore"]), dockerfile])
    extra = {} if replaced is None else {".dockerignore": ignored, dockerfile: replaced}
    try:
        _pack(folder, archive, exclude, dockerfile, extra)
    except BaseException:
        archive.close()
        raise
    archive.seek(0)
    return archive


def _pack(folder: str, archive: Any, exclude: list[str] | None, dockerfile: str, extra: dict[str, str]) -> None:
    import io
    import tarfile

    from docker.utils.build import exclude_paths

    with tarfile.open(mode="w", fileobj=archive) as tar:
        for name in sorted(exclude_paths(folder, exclude or [], dockerfile=dockerfile)):
            if name in extra:
                continue
            path = os.path.join(folder, name)
            info = tar.gettarinfo(path, arcname=name)
            if info is None:  # a socket: nothing to send
                continue
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = int(info.mtime)  # a float past tar's range fails (bpo-32713); docker-py guards it too
            if info.isfile():
                with open(path, "rb") as fh:
                    tar.addfile(info, fh)
            else:
                tar.addfile(info)
        for name, text in extra.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def whole_folder(folder: Path) -> dict[str, Any]:
    """What a build sends for the context folder as it is (its Dockerfile): docker-py's arguments."""
    return {"fileobj": context_archive(str(folder)), "custom_context": True, "dockerfile": "Dockerfile"}
