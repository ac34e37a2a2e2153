"""`envbuild build`: a deterministic build context, the Docker SDK (or BuildKit), labels, tags.

Tags move only at the very end, after the build and the smoke test passed, so
a failure at any point leaves every existing tag where it was.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from envbuild import __version__, buildfail, compat, engine, lock, lockfile, render
from envbuild.errors import BuildError, BuildFailure, ImageMissing, SmokeFailed, UsageError
from envbuild.fsutil import atomic_write_many, sha256_file
from envbuild.profile import Profile
from envbuild.project import Project

Events = Callable[[str, str, str], None]
LABEL_NS = "io.envbuild"
SMOKE_LABEL = f"{LABEL_NS}.smoke"
STEP_RE = re.compile(r"^Step (\d+)/(\d+) : (.*)$")
BUILDKIT_STEP_RE = re.compile(r"^#\d+ \[(?:[\w-]+ )?(\d+)/(\d+)\] (.*)$")
TAIL = 40
LINE_MAX = 500


@dataclass(frozen=True)
class BuildOptions:
    repo: str | None = None
    base: str | None = None
    no_cache: bool = False
    pull: bool = False
    ca_bundle: Path | None = None
    find_links: tuple[str, ...] = ()
    index_url: str | None = None
    torch_index: str | None = None
    smoke: bool = True
    smoke_gpus: str = "auto"
    smoke_timeout: float = 600.0
    builder: str = "docker"  # docker (the SDK) | buildkit
    platform: str = "x86_64"


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


def repository(project: Project, opts: BuildOptions) -> str:
    return opts.repo or project.config.repository


# The tag suffix of a `--no-smoke` build: never the profile's own tag, which only a tested image gets.
UNTESTED = "-untested"


def tags_for(repo: str, prof: Profile, lock_sha: str) -> tuple[str, str]:
    """(moving, immutable) tags."""
    return f"{repo}:{prof.name}", f"{repo}:{prof.name}-{lock_sha[:12]}"


def build_dir(project: Project, prof: Profile) -> Path:
    return project.build_dir / prof.name


def profile_image(cli: Any, project: Project, prof: Profile, repo: str | None = None) -> tuple[str, Any]:
    """(ref, image) that a profile's name stands for when a command is given it instead of an image:
    REPO:NAME, the tag `run` starts and `push` publishes, built here or pulled; else, before any
    build passed its smoke test, the newest `--no-smoke` build (REPO:NAME-untested).

    ImageMissing, a usage error naming REPO:NAME, when there is neither."""
    moving = f"{repo or project.config.repository}:{prof.name}"
    try:
        return moving, engine.local_image(cli, moving, prof.name)
    except ImageMissing:
        with contextlib.suppress(ImageMissing):
            return moving + UNTESTED, engine.local_image(cli, moving + UNTESTED, prof.name)
        raise


# ---- the build context -------------------------------------------------------------------------


def _smoke_sources() -> tuple[str, str]:
    pkg = resources.files("envbuild.smoke")
    return pkg.joinpath("inside.py").read_text("utf-8"), pkg.joinpath("envbuild-smoke").read_text("utf-8")


def expectations(prof: Profile, lock_path: Path | None) -> dict[str, Any]:
    """What the smoke test inside the image must find: the profile's versions and the lock's pins."""
    db = compat.load()
    expect: dict[str, Any] = {
        "profile": prof.name,
        "accelerator": prof.accelerator,
        "python": prof.python,
        "torch": prof.torch,
        "numpy": prof.numpy,
        "cuda": prof.cuda,
        "rocm": prof.rocm,
    }
    if prof.flavor == "venv" and lock_path is not None:
        pins = lockfile.parse_requirements(lock_path.read_text("utf-8"))
        expect["packages"] = {p.name: p.version for p in pins.values()}
    if prof.cuda:
        floor = db.driver_floor(prof.cuda)
        arches = db.arches_for(prof.cuda, prof.torch)
        expect["driver_floor"] = floor.model_dump() if floor else None
        expect["arches"] = arches.sm if arches else None
    return expect


def _local_wheel_dirs(opts_links: tuple[str, ...], pins: dict[str, lockfile.Pin]) -> list[Path]:
    dirs = [Path(x) for x in opts_links if "://" not in x or x.startswith("file://")]
    dirs = [Path(unquote(urlparse(str(d)).path)) if str(d).startswith("file:") else d for d in dirs]
    for pin in pins.values():
        if pin.source.startswith("file://"):
            dirs.append(Path(unquote(urlparse(pin.source).path)))
    seen: list[Path] = []
    for d in dirs:
        if d not in seen:
            seen.append(d)
    return seen


def collect_wheels(pins: dict[str, lockfile.Pin], links: tuple[str, ...]) -> list[Path]:
    """The wheel files of the lock that live in local folders (never anything else from them)."""
    dirs = _local_wheel_dirs(links, pins)
    found: list[Path] = []
    for pin in sorted(pins.values(), key=lambda p: p.name):
        local_required = pin.source.startswith("file://")
        stem = re.sub(r"[-_.]+", "_", pin.name)
        candidates = [w for d in dirs if d.is_dir() for w in sorted(d.glob(f"{stem}-{pin.version}-*.whl"))]
        if not candidates:
            candidates = [
                w
                for d in dirs
                if d.is_dir()
                for w in sorted(d.glob("*.whl"))
                if lockfile.canonical(w.name.split("-", 1)[0]) == pin.name and w.name.split("-")[1] == pin.version
            ]
        match = next((w for w in candidates if f"sha256:{sha256_file(w)}" in pin.hashes), None)
        if match is not None:
            found.append(match)
        elif local_required:
            raise UsageError(
                f"{pin.name}=={pin.version} was locked from {pin.source}, but no wheel with a locked hash is there",
                hint="pass --find-links DIR with the folder that holds it",
            )
    return found


def prepare_context(project: Project, prof: Profile, opts: BuildOptions) -> tuple[Path, Path, dict[str, Any]]:
    """Assemble the build folder; returns (context dir, lockfile, facts). Same inputs, same bytes."""
    if prof.flavor == "conda" and opts.find_links:
        raise UsageError("--find-links is for venv profiles; conda profiles install from conda-lock.yml")
    directory = lock.require_fresh(project, prof)
    lock_path = directory / lockfile.lock_names(opts.platform, prof.flavor)[0]
    eff = lock.effective_options(
        project,
        prof,
        lock.LockOptions(index_url=opts.index_url, torch_index=opts.torch_index, find_links=opts.find_links),
    )
    src = render.torch_source(prof, index_url=eff.index_url, torch_index=eff.torch_index, find_links=eff.find_links)
    plain = render.render(prof, templates_dir=project.templates_dir, base=opts.base, source=src)
    base = opts.base or prof.base or _base_of(plain["Dockerfile"])
    epoch = source_date_epoch(project, lock_path)
    facts: dict[str, Any] = {"lock_sha256": sha256_file(lock_path), "base": base, "source": src, "epoch": epoch}
    facts["labels"] = labels_for(project, prof, facts)
    outputs = render.render(
        prof, templates_dir=project.templates_dir, base=opts.base, source=src, labels=facts["labels"]
    )
    ctx = build_dir(project, prof) / "context"
    if ctx.exists():
        shutil.rmtree(ctx)
    for sub in ("certs", "wheels", "smoke"):
        (ctx / sub).mkdir(parents=True)
    smoke_py, smoke_sh = _smoke_sources()
    files: dict[Path, str] = {
        ctx / "Dockerfile": outputs["Dockerfile"],
        ctx / "smoke" / "smoke.py": smoke_py,
        ctx / "smoke" / "envbuild-smoke": smoke_sh,
        ctx / "smoke" / "expect.json": json.dumps(expectations(prof, lock_path), indent=2, sort_keys=True) + "\n",
    }
    atomic_write_many(files)
    shutil.copyfile(lock_path, ctx / lock_path.name)
    (ctx / "smoke" / "envbuild-smoke").chmod(0o755)
    wheels: list[Path] = []
    if prof.flavor == "venv" and lock_path is not None:
        pins = lockfile.parse_requirements(lock_path.read_text("utf-8"))
        wheels = collect_wheels(pins, eff.find_links)
        for wheel in wheels:
            # A hard link when possible: torch wheels are hundreds of MB.
            target = ctx / "wheels" / wheel.name
            try:
                os.link(wheel, target)
            except OSError:
                shutil.copyfile(wheel, target)
    if opts.ca_bundle is not None:
        text = _read_ca(opts.ca_bundle)
        (ctx / "certs" / "ca-bundle.crt").write_text(text)
    for path in sorted(ctx.rglob("*")):
        if not path.is_symlink():
            os.utime(path, (epoch, epoch))
    facts["wheels"] = [w.name for w in wheels]
    return ctx, lock_path, facts


def _base_of(dockerfile: str) -> str:
    m = re.search(r'^ARG BASE_IMAGE="([^"]+)"', dockerfile, re.M)
    if m is None:
        raise BuildError("the Dockerfile template has no ARG BASE_IMAGE line", hint="restore templates/Dockerfile.*.j2")
    return m.group(1)


def _read_ca(path: Path) -> str:
    try:
        text = path.read_text("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--ca-bundle {path}: cannot read it ({exc})") from exc
    if "-----BEGIN CERTIFICATE-----" not in text:
        raise UsageError(
            f"--ca-bundle {path}: not a PEM certificate bundle", hint="pass a file with BEGIN CERTIFICATE blocks"
        )
    return text


def source_date_epoch(project: Project, lock_path: Path) -> int:
    """SOURCE_DATE_EPOCH, else the lockfile's last commit time, else its mtime: stable across rebuilds."""
    if os.environ.get("SOURCE_DATE_EPOCH", "").isdigit():
        return int(os.environ["SOURCE_DATE_EPOCH"])
    try:
        out = subprocess.run(
            ["git", "log", "-1", "--format=%ct", "--", str(lock_path)],
            cwd=project.root,
            capture_output=True,
            text=True,
            check=False,
            timeout=10,
        ).stdout.strip()
        if out.isdigit():
            return int(out)
    except (OSError, subprocess.SubprocessError):
        pass
    return int(lock_path.stat().st_mtime)


def _git(project: Project, *args: str) -> str:
    try:
        proc = subprocess.run(["git", *args], cwd=project.root, capture_output=True, text=True, check=False, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return ""
    return proc.stdout.strip() if proc.returncode == 0 else ""


def project_source(project: Project) -> str:
    """The image source label: the git remote, else the folder. `envbuild images` tells projects apart by it.

    Without credentials: CI clones over URLs with a job token in them (GitLab's
    https://gitlab-ci-token:TOKEN@host/...), and a label travels with every pushed image."""
    remote = _git(project, "config", "--get", "remote.origin.url")
    return render.without_credentials(remote) if remote else f"file://{project.root}"


def labels_for(project: Project, prof: Profile, facts: dict[str, Any]) -> dict[str, str]:
    created = datetime.datetime.fromtimestamp(facts["epoch"], datetime.timezone.utc).isoformat().replace("+00:00", "Z")
    labels = {
        "org.opencontainers.image.created": created,
        "org.opencontainers.image.version": f"{prof.name}-{facts['lock_sha256'][:12]}",
        "org.opencontainers.image.revision": _git(project, "rev-parse", "HEAD") or "unknown",
        "org.opencontainers.image.source": project_source(project),
        "org.opencontainers.image.title": f"envbuild {prof.name}",
        "org.opencontainers.image.description": prof.description or f"PyTorch {prof.torch} ({prof.build_tag})",
        "org.opencontainers.image.base.name": facts["base"],
        f"{LABEL_NS}.version": __version__,
        f"{LABEL_NS}.profile": prof.name,
        f"{LABEL_NS}.profile-digest": prof.digest(),
        f"{LABEL_NS}.lock-sha256": facts["lock_sha256"],
        f"{LABEL_NS}.flavor": prof.flavor,
        f"{LABEL_NS}.python": prof.python,
        f"{LABEL_NS}.torch": prof.torch,
        f"{LABEL_NS}.numpy": prof.numpy,
        f"{LABEL_NS}.accelerator": prof.accelerator,
    }
    if prof.cuda:
        labels[f"{LABEL_NS}.cuda"] = prof.cuda
    if prof.rocm:
        labels[f"{LABEL_NS}.rocm"] = prof.rocm
    return labels


# ---- building ------------------------------------------------------------------------------------


class _Log:
    """The full build log on disk plus the last lines in memory for the error message."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.fh = path.open("w", encoding="utf-8")
        self.tail: list[str] = []
        self.step = ""
        self.steps = 0
        self.ran = 0  # steps that executed a container ("Running in"), i.e. were not cached
        self._partial = ""

    def feed(self, chunk: str) -> list[str]:
        """The complete lines a stream chunk finishes. The engine's chunks are not lines: a step's
        stderr can arrive as "E", ": ", "Unable to locate package x\n"."""
        *done, self._partial = (self._partial + chunk).split("\n")
        for text in done:
            self.line(text)
        return done

    def flush(self) -> list[str]:
        rest, self._partial = self._partial, ""
        if not buildfail.plain(rest):  # nothing, or only the colour reset that ends a step's stderr
            return []
        self.line(rest)
        return [rest]

    def line(self, text: str) -> None:
        text = buildfail.plain(text)
        self.fh.write(text + "\n")
        self.fh.flush()
        if text.strip():
            self.tail = [*self.tail[-(TAIL * 4) :], text]

    def close(self) -> None:
        self.fh.close()

    def failure(self) -> BuildFailure:
        # One line can be megabytes (pip prints every file a failed copy left behind on one line);
        # the error shows its start, the log keeps all of it.
        tail = [
            t if len(t) <= LINE_MAX else f"{t[:LINE_MAX]}... ({len(t)} characters, all in the log)" for t in self.tail
        ]
        return BuildFailure(step=self.step or "(before the first step)", tail=tail[-TAIL:], log_path=str(self.path))


def _sdk_build(
    cli: Any, ctx: Path, prof: Profile, *, buildargs: dict[str, str], opts: BuildOptions, log: _Log, say: Events
) -> str:
    image_id = ""
    stream = cli.api.build(
        path=str(ctx),
        dockerfile="Dockerfile",
        target="runtime",
        buildargs=buildargs,
        rm=True,
        forcerm=True,
        nocache=opts.no_cache,
        pull=opts.pull,
        decode=True,
    )
    pulling = engine.Transfer()  # --pull: the base image's layers come through this stream
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
            raise _build_error(prof, str(chunk["error"]), log)
    log.flush()
    if not image_id:
        raise _build_error(prof, "the engine finished without an image ID", log)
    return image_id


def _build_error(prof: Profile, message: str, log: _Log) -> BuildError:
    found = buildfail.diagnose(log.tail, prof.name)
    if found is None:
        return BuildError(f"build of {prof.name} failed: {message.strip()}", log.failure(), hint=f"see {log.path}")
    return BuildError(f"build of {prof.name} failed: {found.message}", log.failure(), hint=found.hint)


def _buildkit_cli() -> list[str]:
    for cand in ("/usr/bin/docker", shutil.which("docker") or ""):
        if cand and Path(cand).exists():
            probe = subprocess.run([cand, "buildx", "version"], capture_output=True, check=False)
            if probe.returncode == 0:
                return [cand, "buildx", "build", "--load"]
    docker_cli = "/usr/bin/docker" if Path("/usr/bin/docker").exists() else (shutil.which("docker") or "docker")
    return [docker_cli, "build"]


def _buildkit_build(
    ctx: Path, prof: Profile, buildargs: dict[str, str], opts: BuildOptions, log: _Log, say: Events
) -> str:
    iid = ctx.parent / "image.id"
    iid.unlink(missing_ok=True)
    cmd = [
        *_buildkit_cli(),
        "--progress=plain",
        "--target",
        "runtime",
        "--iidfile",
        str(iid),
        "-f",
        str(ctx / "Dockerfile"),
    ]
    for k, v in sorted(buildargs.items()):
        cmd += ["--build-arg", f"{k}={v}"]
    if opts.no_cache:
        cmd.append("--no-cache")
    if opts.pull:
        cmd.append("--pull")
    cmd.append(str(ctx))
    env = {**os.environ, "DOCKER_BUILDKIT": "1"}
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env) as proc:
        for raw in proc.stdout or []:
            text = raw.rstrip("\n")
            log.line(text)
            m = BUILDKIT_STEP_RE.match(text)
            if m:
                log.step = text
                log.steps = max(log.steps, int(m.group(2)))
                say("step", f"{m.group(1)}/{m.group(2)}", m.group(3)[:120])
            elif re.match(r"^#\d+ \[.*\] (RUN|COPY|ADD) ", text) and not text.endswith(" CACHED"):
                log.ran += 1
        rc = proc.wait()
    if rc != 0 or not iid.exists():
        raise _build_error(prof, f"BuildKit exited with {rc}", log)
    return iid.read_text().strip()


def mark_smoke_passed(cli: Any, image_id: str, report: dict[str, Any]) -> str:
    """A child image that only adds labels saying the smoke test passed on `image_id`.

    The record travels with the image ID (to the registry too), so any checkout, machine or
    registry client can tell a tested image from an untested one.
    """
    import io

    gpu_checks = next((c["status"] for c in report["checks"] if c["name"] == "gpu"), "skip")
    dockerfile = (
        f"FROM {image_id}\n"
        f'LABEL {SMOKE_LABEL}="passed" {SMOKE_LABEL}.tested-image="{image_id}" '
        f'{SMOKE_LABEL}.report-version="{report["report_version"]}" {SMOKE_LABEL}.gpu="{gpu_checks}"\n'
    )
    image, _ = cli.images.build(fileobj=io.BytesIO(dockerfile.encode()), rm=True, forcerm=True)
    return str(image.id)


def _build_lock(project: Project, name: str) -> Path:
    return project.build_dir / f".{name}.lock"


@contextlib.contextmanager
def exclusive(project: Project, name: str, say: Events) -> Iterator[None]:
    """One build of a profile at a time in a project: a second one would rewrite the context the
    first is sending, and `images --prune` must not take the first one's not yet tagged image."""
    from filelock import FileLock, Timeout

    project.build_dir.mkdir(parents=True, exist_ok=True)
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
    from filelock import FileLock, Timeout

    path = _build_lock(project, name)
    if not path.exists():
        return False
    guard = FileLock(str(path))
    try:
        guard.acquire(timeout=0)
    except Timeout:
        return True
    guard.release()
    return False


def context_only(project: Project, prof: Profile, opts: BuildOptions, events: Events | None = None) -> dict[str, Any]:
    """The build context alone, for docker buildx bake or another builder: no engine needed."""
    say = events or (lambda *_: None)
    with exclusive(project, prof.name, say):
        ctx, lock_path, facts = prepare_context(project, prof, opts)
    return {
        "profile": prof.name,
        "context": str(ctx),
        "dockerfile": str(ctx / "Dockerfile"),
        "target": "runtime",
        "lockfile": str(lock_path),
        "labels": facts["labels"],
    }


def build(project: Project, prof: Profile, opts: BuildOptions, events: Events | None = None) -> BuildResult:
    say = events or (lambda *_: None)
    if opts.smoke:
        from envbuild.smoke import host

        host.check_gpus(opts.smoke_gpus)  # a typo found after a two-minute build is found too late
    with exclusive(project, prof.name, say):
        return _build(project, prof, opts, say)


def _build(project: Project, prof: Profile, opts: BuildOptions, say: Events) -> BuildResult:
    t0 = time.monotonic()
    timings: dict[str, float] = {}
    say("phase", "context", "assembling the build context")
    ctx, _, facts = prepare_context(project, prof, opts)
    cli = engine.client()
    # Said before anything is downloaded: a full disk otherwise shows only minutes later, mid-layer.
    disk_note = engine.disk_note(*engine.disk(cli.info()), prof.accelerator)
    warnings = [disk_note] if disk_note else []
    for text in warnings:
        say("warning", "disk", text)
    say("phase", "base", facts["base"])
    engine.ensure_image(cli, facts["base"], pull=opts.pull, events=say)
    buildargs: dict[str, str] = {}
    src: render.TorchSource = facts["source"]
    if opts.index_url or prof.index_url or project.config.index_url:
        buildargs["PIP_INDEX_URL"] = src.index_url
    if src.route == "index" and src.torch_index and not src.torch_index_flat:
        buildargs["PIP_EXTRA_INDEX_URL"] = src.torch_index
    log = _Log(build_dir(project, prof) / "build.log")
    say("phase", "build", f"{opts.builder} builder")
    try:
        if opts.builder == "buildkit":
            built = _buildkit_build(ctx, prof, buildargs, opts, log, say)
        else:
            import docker

            try:
                built = _sdk_build(cli, ctx, prof, buildargs=buildargs, opts=opts, log=log, say=say)
            except docker.errors.APIError as exc:
                log.line(str(exc))
                raise _build_error(prof, str(exc.explanation or exc), log) from exc
    finally:
        log.close()
    timings["build"] = time.monotonic() - t0
    final_id = built
    report = None
    if opts.smoke:
        from envbuild.smoke import host

        say("phase", "smoke", "running the smoke test in the image")
        t1 = time.monotonic()
        gpus = host.gpus_for(opts.smoke_gpus, prof.accelerator, absent_ok=True)
        if prof.accelerator != "cpu" and gpus == "none" and opts.smoke_gpus == "auto":
            text = (
                f"no GPU on this host: the smoke test checks {prof.name} without its GPU checks and labels it "
                f"so ({SMOKE_LABEL}.gpu=skip); `envbuild smoke {prof.name}` on a GPU host runs them"
            )
            warnings.append(text)
            say("warning", "smoke", text)
        report = host.run_in_image(cli, built, gpus=gpus, timeout=opts.smoke_timeout, accelerator=prof.accelerator)
        host.save_report(build_dir(project, prof) / "smoke.json", report)
        timings["smoke"] = time.monotonic() - t1
        if not report["passed"]:
            raise SmokeFailed(
                f"the smoke test failed in image {built[:19]} ({', '.join(report['failed'])}); no tag was moved\n"
                + host.summary(report),
                hint=f"the report is in {project.rel(build_dir(project, prof) / 'smoke.json')}",
            )
        final_id = mark_smoke_passed(cli, built, report)
    moving, immutable = tags_for(repository(project, opts), prof, facts["lock_sha256"])
    # Only a smoke-tested image may carry the profile's tags; an untested one gets its own name.
    refs = [immutable, moving] if opts.smoke else [moving + UNTESTED]
    image = cli.images.get(final_id)
    for ref in refs:  # the moving tag last: it is the one users pull
        repo, tag = ref.rsplit(":", 1)
        image.tag(repo, tag=tag)
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
        context=str(ctx),
        built_image_id=built,
        timings=timings,
        warnings=warnings,
    )
    record = {k: v for k, v in asdict(result).items() if k != "smoke"}
    atomic_write_many({build_dir(project, prof) / "result.json": json.dumps(record, indent=2, sort_keys=True) + "\n"})
    return result
