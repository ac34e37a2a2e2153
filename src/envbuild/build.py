"""`envbuild build`: the build context (buildctx), the Docker SDK (or BuildKit), the smoke test, tags.

Tags move only at the very end, after the build and the smoke test passed, so
a failure at any point leaves every existing tag where it was.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import platform as host_platform
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from envbuild import buildahead, buildctx, buildfail, buildkit, engine, enginelost, hostgpu, smokerecord
from envbuild import plan as plan_mod
from envbuild.buildctx import BuildOptions
from envbuild.buildfail import BuildLog
from envbuild.errors import EngineNoAnswer, SmokeFailed, UsageError
from envbuild.fsutil import atomic_write_many, held
from envbuild.localimage import own_repository_fix, repository, taken_from
from envbuild.names import (
    LABEL_CONTENT_DIGEST,
    LABEL_SMOKE_GPU,
    MACHINE_PLATFORMS,
    UNTESTED,
    Events,
    immutable_tag,
    moving_tag,
    mutex_path,
    quiet,
)
from envbuild.plan import Plan
from envbuild.profile import Profile
from envbuild.project import Project
from envbuild.smoke.labels import mark_smoke_passed

__all__ = ["BuildOptions", "BuildResult", "build", "building", "context_only", "exclusive", "mark_smoke_passed"]
STEP_RE = re.compile(r"^Step (\d+)/(\d+) : (.*)$")
BUILDKIT_STEP_RE = re.compile(r"^#\d+ \[(?:[\w-]+ )?(\d+)/(\d+)\] (.*)$")


@dataclass
class BuildResult:
    profile: str
    image_id: str
    tags: list[str]
    labels: dict[str, str]
    log_path: str
    seconds: float
    steps: int = 0
    ran_steps: int = 0
    smoke: dict[str, Any] | None = None
    context: str = ""
    built_image_id: str = ""
    timings: dict[str, float] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    platform: str = ""


# ---- building ------------------------------------------------------------------------------------


def _sdk_build(
    cli: Any,
    ctx: Path,
    prof: Profile,
    *,
    buildargs: dict[str, str],
    opts: BuildOptions,
    log: BuildLog,
    say: Events,
    source: Callable[[], dict[str, Any]] | None = None,  # what to send (buildahead.whole_build_source)
) -> str:
    try:
        sent: dict[str, Any] = source() if source is not None else buildahead.whole_folder(ctx)
        stream = cli.api.build(
            **sent,
            target="runtime",
            buildargs=buildargs,
            rm=True,
            forcerm=True,
            nocache=opts.no_cache,
            pull=opts.pull,
            decode=True,
            timeout=cli.api.timeout,  # docker-py's default (None) reads a build's stream with no time limit
        )
    except OSError as exc:
        # the context is packed into a temporary file first (by the SDK or buildahead); the SDK's
        # own message ("Can not read file in context") hides a full disk there
        raise buildfail.packing_error(ctx, exc) from exc
    pulling = engine.Transfer()  # --pull: the base image's layers come through this stream
    try:
        image_id = _follow_build(stream, prof, log, pulling, say)
    except Exception as exc:  # a read of the stream timed out or lost the engine: not an envbuild bug
        found = _engine_lost(exc, log, cli.api.timeout)
        if found is None:
            raise
        raise found from exc
    finally:
        if "fileobj" in sent:  # a temporary file
            sent["fileobj"].close()
    if not image_id:
        raise log.error(prof.name, "the engine finished without an image ID")
    return image_id


def _engine_lost(exc: Exception, log: BuildLog, waited: Any) -> EngineNoAnswer | None:
    """The error for `exc`, met while a build streamed its output, when it is the engine's silence
    or lost link: with the step and the log. None for anything else."""
    found = enginelost.lost(exc, engine.engine_url()[0], f"the build, at {log.step[:80] or 'its start'},", waited)
    if found is None:
        return None
    quiet = f"; a step that runs longer without output: raise {enginelost.STEP_TIMEOUT_ENV}"
    found.hint += f"; the build's output so far is in {log.path}" + (quiet if found.timed_out else "")
    return found


def _follow_build(stream: Any, prof: Profile, log: BuildLog, pulling: engine.Transfer, say: Events) -> str:
    """The engine's build stream into the log and step events; the image ID it ends with."""
    image_id = ""
    for chunk in stream:
        if "stream" in chunk:
            for text in log.feed(str(chunk["stream"])):
                m = STEP_RE.match(text)
                if m:
                    log.step = text
                    log.steps = int(m.group(2))
                    say("step", f"{m.group(1)}/{m.group(2)}", m.group(3)[:120])
                elif text.strip().startswith("---> Running in "):
                    log.ran += 1
        elif "status" in chunk:
            log.flush()
            log.line(f"{chunk.get('id', '')} {chunk['status']} {chunk.get('progress', '')}".strip())
            summary = pulling.feed(chunk)
            if summary:
                say("transfer", "pull", summary)
        elif "aux" in chunk and "ID" in chunk["aux"]:
            image_id = chunk["aux"]["ID"]
        if "error" in chunk:
            log.flush()
            log.line(str(chunk["error"]))
            raise log.error(prof.name, str(chunk["error"]))
    log.flush()
    return image_id


def _buildkit_build(
    ctx: Path, prof: Profile, buildargs: dict[str, str], opts: BuildOptions, log: BuildLog, say: Events
) -> str:
    iid = ctx.parent / "image.id"
    iid.unlink(missing_ok=True)
    cmd = buildkit.command(ctx, iid, buildargs, no_cache=opts.no_cache, pull=opts.pull)
    env = {**os.environ, "DOCKER_BUILDKIT": "1"}
    # In a session of its own, the CLI hears of an interrupt from envbuild, also one only envbuild
    # was sent (SIGTERM: a CI timeout); told nothing, it built on after envbuild had left.
    with subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True
    ) as proc:
        try:
            for text in buildkit.lines(proc, enginelost.step_timeout()):
                log.line(text)
                m = BUILDKIT_STEP_RE.match(text)
                if m:
                    log.step = text
                    log.steps = max(log.steps, int(m.group(2)))
                    say("step", f"{m.group(1)}/{m.group(2)}", m.group(3)[:120])
                elif re.match(r"^#\d+ \[.*\] (RUN|COPY|ADD) ", text) and not text.endswith(" CACHED"):
                    log.ran += 1
        except BaseException as exc:
            buildkit.stop(proc)  # a hung engine holds the CLI too: silence for a step's limit stops it
            found = _engine_lost(exc, log, enginelost.step_timeout()) if isinstance(exc, TimeoutError) else None
            if found is None:
                raise
            raise found from exc
        rc = proc.wait()
    if rc != 0 or not iid.exists():
        raise log.error(prof.name, f"BuildKit exited with {rc}")
    return iid.read_text("utf-8").strip()


def _build_lock(project: Project, name: str) -> Path:
    return mutex_path(project.build_dir, "build", name)


@contextlib.contextmanager
def exclusive(project: Project, name: str, say: Events) -> Iterator[None]:
    """One build of a profile at a time in a project: a second one would rewrite the context the
    first is sending, and `images --prune` must not take the first one's not yet tagged image."""
    from filelock import FileLock, Timeout

    _build_lock(project, name).parent.mkdir(parents=True, exist_ok=True)
    guard = FileLock(str(_build_lock(project, name)))
    try:
        guard.acquire(timeout=0)
    except Timeout:
        say("phase", "wait", f"another build of {name} is running in this project; waiting for it")
        guard.acquire()
    try:
        yield
    finally:
        guard.release()


def building(project: Project, name: str) -> bool:
    """Whether a build of `name` holds its lock right now (in any process)."""
    return held(_build_lock(project, name))


def _target_platform(plan: Plan, wanted: str | None, runs: str | None) -> str:
    """--platform, else what the engine (without one, this machine) runs; a profile not locked for it
    is refused before anything is copied or downloaded: envbuild does not build under emulation."""
    native = MACHINE_PLATFORMS.get((runs or host_platform.machine()).lower(), runs or host_platform.machine())
    target = wanted or native
    if target not in plan.platforms:
        raise UsageError(
            f"{plan.name} is locked for {', '.join(plan.platforms)}, and "
            + (f"--platform asks for {target}" if wanted else f"this engine runs {native}"),
            hint=f"add {target} to the profile's platforms and run `envbuild lock {plan.name}`, "
            f"or build on an engine that runs {plan.platforms[0]}",
        )
    if wanted and wanted != native and runs is not None:
        raise UsageError(
            f"--platform {wanted}: this engine runs {native}, and envbuild does not build under emulation",
            hint=f"build on an engine that runs {wanted}",
        )
    return target


def context_only(project: Project, prof: Profile, opts: BuildOptions, events: Events | None = None) -> dict[str, Any]:
    """The build context alone, for docker buildx bake or another builder: no engine needed."""
    say = events or quiet
    plan = plan_mod.make(project, prof, opts.plan_options())
    for text in plan.notes:
        say("warning", "plan", text)
    platform = _target_platform(plan, opts.platform, None)
    with exclusive(project, prof.name, say):
        # no downloads for a context only: it places what the wheel cache and wheelhouses hold
        ctx = buildctx.prepare(project, plan, opts, platform, say, fetch=False)
        if ctx.pending is not None:
            ctx.pending()
    return {
        "profile": prof.name,
        "context": str(ctx.directory),
        "dockerfile": str(ctx.dockerfile),
        "target": "runtime",
        "lockfile": str(ctx.lock.path),
        "platform": platform,
        "labels": ctx.labels,
        "warnings": list(plan.notes),
    }


def build(project: Project, prof: Profile, opts: BuildOptions, events: Events | None = None) -> BuildResult:
    say = events or quiet
    if opts.smoke:
        hostgpu.check_gpus(opts.smoke_gpus)  # a typo found after a two-minute build is found too late
    plan = plan_mod.make(project, prof, opts.plan_options())
    with exclusive(project, prof.name, say):
        return _build(project, plan, opts, say)


def _run_builder(cli: Any, ctx: buildctx.Context, prof: Profile, opts: BuildOptions, log: BuildLog, say: Events) -> str:
    """The built image's ID, from the builder `opts` names; a BuildError that reads the log if it fails."""
    try:
        if opts.builder == "buildkit":
            # BuildKit >= 0.11 stamps layer and history times with SOURCE_DATE_EPOCH (0.13 rewrites the
            # files' times with rewrite-timestamp=true); the classic builder would only warn about it
            buildargs = {**ctx.buildargs, "SOURCE_DATE_EPOCH": str(ctx.epoch)}
            return _buildkit_build(ctx.directory, prof, buildargs, opts, log, say)
        import docker

        try:
            source = None
            if not opts.no_cache:  # the whole build would not use what side builds make, nor take their images
                log.ran += buildahead.run(cli, ctx.sides, ctx.directory, ctx.buildargs, log.path.parent / "stages", say)
                source = functools.partial(buildahead.whole_build_source, cli, ctx, say)
            return _sdk_build(
                cli, ctx.directory, prof, buildargs=ctx.buildargs, opts=opts, log=log, say=say, source=source
            )
        except docker.errors.APIError as exc:
            log.line(str(exc))
            raise log.error(prof.name, str(exc.explanation or exc)) from exc
    finally:
        log.close()


def _build(project: Project, plan: Plan, opts: BuildOptions, say: Events) -> BuildResult:
    t0 = time.monotonic()
    prof = plan.profile
    timings: dict[str, float] = {}
    # The engine first: what it runs decides the platform, and a silent engine is found before
    # hundreds of MB of wheels are linked into a context.
    cli = engine.client(timeout=enginelost.step_timeout())
    info = cli.info()
    platform = _target_platform(plan, opts.platform, str(info.get("Architecture") or "") or None)
    # Said before anything is downloaded: a full disk otherwise shows only minutes later, mid-layer.
    disk_note = engine.disk_note(*engine.disk(info), prof.accelerator)
    for text in plan.notes:
        say("warning", "plan", text)
    warnings = [*plan.notes, *([disk_note] if disk_note else [])]
    if disk_note:
        say("warning", "disk", disk_note)
    say("phase", "context", "assembling the build context")
    ctx = buildctx.prepare(project, plan, opts, platform, say)
    say("phase", "base", plan.base.image)
    engine.ensure_image(cli, plan.base.image, pull=opts.pull, events=say)
    work = project.work_dir(prof.name)
    log = BuildLog(work / "build.log")
    say("phase", "build", f"{opts.builder} builder")
    # The context's pending check runs beside the builder (which works in other processes); it is
    # waited for, and must pass, before the smoke test and any tag
    with ThreadPoolExecutor(max_workers=1) as checks:
        checked = checks.submit(ctx.pending) if ctx.pending is not None else None
        built = _run_builder(cli, ctx, prof, opts, log, say)
    if checked is not None:
        checked.result()
    timings["build"] = time.monotonic() - t0
    report = None
    saved = project.smoke_report(prof.name)
    if opts.smoke and (report := smokerecord.passed_before(cli, built, saved, prof.accelerator)):
        say("phase", "smoke", f"passed on this very image before, not run again (`envbuild smoke {prof.name}` runs it)")
        report = {**report, "reused": True}
    elif opts.smoke:
        from envbuild.smoke import host

        say("phase", "smoke", "running the smoke test in the image")
        t1 = time.monotonic()
        # an engine elsewhere has the GPUs its NVIDIA runtime serves, whatever this host has (ROCm's
        # devices cannot be seen from here: its GPU checks then wait for `envbuild smoke`)
        elsewhere = engine.engine_elsewhere()
        present = prof.accelerator == "cuda" and "nvidia" in (info.get("Runtimes") or {}) if elsewhere else None
        gpus = hostgpu.gpus_for(opts.smoke_gpus, prof.accelerator, absent_ok=True, present=present)
        if prof.accelerator != "cpu" and gpus == "none" and opts.smoke_gpus == "auto":
            text = (
                f"no GPU on {f'the engine machine {elsewhere} (none its runtimes show)' if elsewhere else 'this host'}"
                ": "
                f"the smoke test checks {prof.name} without its GPU checks and labels it "
                f"so ({LABEL_SMOKE_GPU}=skip); `envbuild smoke {prof.name}` on a GPU host runs them"
            )
            warnings.append(text)
            say("warning", "smoke", text)
        report = host.run_in_image(cli, built, gpus=gpus, timeout=opts.smoke_timeout, accelerator=prof.accelerator)
        host.save_report(saved, report)
        timings["smoke"] = time.monotonic() - t1
        if not report["passed"]:
            raise SmokeFailed(
                f"the smoke test failed in image {built[:19]} ({', '.join(report['failed'])}); no tag was moved\n"
                + host.summary(report),
                hint=f"the report is in {project.rel(saved)}",
            )
    final_id = mark_smoke_passed(cli, built, report)
    repo = repository(project, opts.repo)
    moving, immutable = moving_tag(repo, prof.name), immutable_tag(repo, prof.name, ctx.labels[LABEL_CONTENT_DIGEST])
    # Only a smoke-tested image may carry the profile's tags; an untested one gets its own name.
    refs = [immutable, moving] if opts.smoke else [moving + UNTESTED]
    image = cli.images.get(final_id)
    other = taken_from(cli, project, moving) if opts.smoke else ""
    if other:
        text = (
            f"{moving} named an image of another project ({other}), and now names this build: that project's "
            f"run and push refuse it until it builds again; {own_repository_fix(project)}"
        )
        warnings.append(text)
        say("warning", "tag", text)
    for ref in refs:  # the moving tag last: it is the one users pull
        name, tag = ref.rsplit(":", 1)
        image.tag(name, tag=tag)
    result = BuildResult(
        profile=prof.name,
        image_id=final_id,
        tags=refs[::-1],
        labels=dict(cli.images.get(final_id).labels or {}),
        log_path=str(log.path),
        seconds=time.monotonic() - t0,
        steps=log.steps,
        ran_steps=log.ran,
        smoke=report,
        context=str(ctx.directory),
        built_image_id=built,
        timings=timings,
        warnings=warnings,
        platform=platform,
    )
    record = {k: v for k, v in asdict(result).items() if k != "smoke"}
    atomic_write_many({work / "result.json": json.dumps(record, indent=2, sort_keys=True) + "\n"})
    return result
