"""`envbuild lock`: resolve profiles with uv (venv) or a conda solver, verify, write atomically."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from envbuild import fetchfail, lockfile, lockverify, render
from envbuild import profile as profile_mod
from envbuild.errors import EnvbuildError, LockError, LockMissing, StaleLock, UsageError
from envbuild.fsutil import atomic_write_many
from envbuild.lockfile import PLATFORM_TAGS, Pin
from envbuild.profile import Profile
from envbuild.project import Project

Events = Callable[[str, str, str], None]
# UV_* settings of the caller's shell would silently change what gets locked.
_UV_ENV_KEEP = {
    "UV_CACHE_DIR",
    "UV_NATIVE_TLS",
    "UV_HTTP_TIMEOUT",
    "UV_HTTP_RETRIES",
    "UV_OFFLINE",
    "UV_INSECURE_HOST",
}
# What a user changes when an index is out of reach (fetchfail names the host and the cause).
_UV_ROUTE = (
    "point `torch_index:` (the PyTorch index) or `index_url:` (PyPI) at a mirror this machine reaches, "
    "in the profile or with --torch-index / --index-url; or lock on a connected machine and commit the lockfiles"
)


def uv_binary() -> str:
    """The uv that came with envbuild (the `uv` package), else one on PATH."""
    candidate = Path(sysconfig.get_path("scripts")) / "uv"
    if candidate.is_file():
        return str(candidate)
    found = shutil.which("uv") or shutil.which("uv", path=str(Path(sys.executable).parent))
    if found:
        return found
    raise LockError("uv is not installed", hint="pip install uv (envbuild depends on it)")


def _uv_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("UV_") or k in _UV_ENV_KEEP}


@dataclass(frozen=True)
class LockOptions:
    index_url: str | None = None
    torch_index: str | None = None
    find_links: tuple[str, ...] = ()
    upgrade: bool = False
    upgrade_packages: tuple[str, ...] = ()
    platforms: tuple[str, ...] = ()
    solver: str = "auto"  # conda only: auto | conda-lock | rattler
    offline: bool = False
    dry_run: bool = False  # resolve and report the changes, write nothing


@dataclass
class LockOutcome:
    name: str
    state: str  # fresh | locked | failed
    message: str = ""
    seconds: float = 0.0
    packages: int = 0
    files: list[Path] = field(default_factory=list)
    error: EnvbuildError | None = None
    changes: list[lockfile.Change] | None = None  # None: nothing was locked before


def _expand(project: Project, location: str) -> str:
    """Expand $VARS and make relative folders relative to the project, as users write them."""
    text = os.path.expandvars(location)
    if "://" in text or Path(text).is_absolute():
        return text
    return str((project.root / text).resolve())


def effective_options(project: Project, prof: Profile, opts: LockOptions) -> LockOptions:
    """Options, then the profile, then envbuild.toml: the first that says something wins."""
    cfg = project.config
    links = opts.find_links or tuple(prof.find_links) or tuple(cfg.find_links)
    where = "--find-links" if opts.find_links else f"{prof.name}'s find_links" if prof.find_links else "envbuild.toml"
    expanded = tuple(_expand(project, f) for f in links)
    for given, path in zip(links, expanded, strict=True):
        # a missing folder would otherwise surface late: as a resolution without the local wheels,
        # or as a build whose context lacks the files its lockfile points at
        if "://" not in path and not Path(path).exists():
            raise UsageError(
                f"{where}: {given} does not exist" + (f" ({path})" if path != given else ""),
                hint="name a folder of wheels (or a URL), or leave it out to use the indexes",
            )
    return LockOptions(
        index_url=opts.index_url or prof.index_url or cfg.index_url,
        torch_index=opts.torch_index or prof.torch_index or cfg.torch_index,
        find_links=expanded,
        upgrade=opts.upgrade,
        upgrade_packages=opts.upgrade_packages,
        platforms=opts.platforms or tuple(prof.platforms),
        solver=opts.solver,
        offline=opts.offline,
        dry_run=opts.dry_run,
    )


def requirements_of(prof: Profile) -> list[str]:
    return list(render.context(prof)["requirements"])


def digest_of(prof: Profile, templates_dir: Path | None = None) -> str:
    if prof.flavor == "conda":
        from envbuild import conda

        return lockfile.input_digest(prof, conda.specs_of(prof, templates_dir))
    return lockfile.input_digest(prof, requirements_of(prof))


def lock_dir(project: Project, name: str) -> Path:
    return project.lockfiles_dir / name


def _staleness(project: Project, prof: Profile, platforms: Sequence[str] | None = None) -> tuple[str, str] | None:
    """("missing" | "stale", why) when the profile's lockfiles are not usable as they are; None when fresh."""
    directory = lock_dir(project, prof.name)
    digest = digest_of(prof, project.templates_dir)
    for platform in platforms or prof.platforms:
        names = lockfile.lock_names(platform, prof.flavor)
        resolutions = set()
        for name in names:
            path = directory / name
            if not path.is_file():
                return "missing", f"{project.rel(path)} is missing"
            found = lockfile.read_digest(path)
            if found is None:
                return "stale", f"{project.rel(path)} has no envbuild header"
            if found != digest:
                return "stale", f"{project.rel(path)} was locked from other inputs (the profile changed)"
            resolutions.add(lockfile.read_resolution(path))
        if len(resolutions) > 1:
            return "stale", f"{' and '.join(names)} disagree (an interrupted lock?)"
    return None


def stale_reason(project: Project, prof: Profile, platforms: Sequence[str] | None = None) -> str | None:
    """Why the profile's lockfiles are not usable as they are, or None when they are fresh."""
    found = _staleness(project, prof, platforms)
    return found[1] if found else None


def lock_state(project: Project, prof: Profile) -> tuple[str, str]:
    """("fresh" | "missing" | "stale", why) for `envbuild status`."""
    return _staleness(project, prof) or ("fresh", "")


def check(project: Project, names: Sequence[str]) -> list[StaleLock]:
    """Offline freshness check for CI: no resolver, no network."""
    stale = []
    for name in names:
        path = project.profile_path(name)
        prof = profile_mod.load_valid(path, project.rel(path))
        reason = stale_reason(project, prof)
        if reason:
            stale.append(StaleLock(prof.name, reason, f"envbuild lock {prof.name}"))
    return stale


def require_fresh(project: Project, prof: Profile) -> Path:
    """The lock folder of a profile whose lockfiles exist and match it; else LockMissing."""
    reason = stale_reason(project, prof)
    if reason:
        raise LockMissing(f"{prof.name}: {reason}", hint=f"run `envbuild lock {prof.name}`")
    return lock_dir(project, prof.name)


# ---- venv flavor: uv ------------------------------------------------------------------------


def _run_uv(args: list[str], cwd: Path, *, stdin: str | None = None, route: str = _UV_ROUTE) -> str:
    proc = subprocess.run(
        [uv_binary(), *args],
        cwd=cwd,
        input=stdin,
        capture_output=True,
        text=True,
        env=_uv_env(),
        check=False,
        timeout=1800,
    )
    if proc.returncode != 0:
        raise fetchfail.failure(
            LockError, "uv", proc.stderr.strip() or proc.stdout, route, "the resolver's message above says why"
        )
    return proc.stdout


def newest_versions(
    requirements: Sequence[str],
    python: str,
    *,
    index_url: str = render.PYPI_SIMPLE,
    with_deps: bool = False,
    route: str = _UV_ROUTE,
) -> dict[str, str]:
    """What uv picks for `requirements` on Linux x86_64 and a target Python: {name: version}, no hashes."""
    args = [
        "pip",
        "compile",
        "-",
        "--python-version",
        python,
        "--python-platform",
        PLATFORM_TAGS["x86_64"],
        "--no-header",
        "--no-annotate",
        "--no-config",
        "--no-python-downloads",
        "--index-url",
        index_url,
        "--quiet",
    ]
    if not with_deps:
        args.append("--no-deps")
    out = _run_uv(args, Path.cwd(), stdin="".join(f"{r}\n" for r in requirements), route=route)
    pins = {}
    for line in out.splitlines():
        name, sep, version = line.strip().partition("==")
        if sep:
            pins[name.lower()] = version
    return pins


def _compile_args(
    input_file: Path,
    output: Path,
    prof: Profile,
    platform: str,
    opts: LockOptions,
    src: render.TorchSource,
) -> list[str]:
    args = [
        "pip",
        "compile",
        str(input_file),
        "-o",
        str(output),
        "--python-version",
        prof.python,
        "--python-platform",
        PLATFORM_TAGS[platform],
        "--generate-hashes",
        "--emit-index-annotation",
        "--no-header",
        "--no-config",
        # The target Python is only a resolution setting: never fetch an interpreter for it.
        "--no-python-downloads",
        "--index-url",
        src.index_url,
        "--quiet",
    ]
    for link in src.find_links:
        args += ["--find-links", link]
    if opts.upgrade:
        args.append("--upgrade")
    for pkg in opts.upgrade_packages:
        args += ["--upgrade-package", pkg]
    if opts.offline:
        args.append("--offline")
    return args


def _lock_input(prof: Profile, src: render.TorchSource, requirements: list[str], family: list[str]) -> str:
    return render.render_one(
        prof,
        "lock-input.toml.j2",
        source=src,
        overrides={"requirements": requirements, "torch_family_names": family},
    )


def _resolve_platform(
    prof: Profile,
    platform: str,
    opts: LockOptions,
    src: render.TorchSource,
    previous: Path | None,
    work: Path,
) -> tuple[dict[str, Pin], str, str]:
    """Resolve one platform: (pins, requirements text, pylock text)."""
    reqs = requirements_of(prof)
    family = sorted(render.context(prof, source=src)["torch_family_names"])
    out = work / f"requirements-{platform}.txt"
    if previous is not None and previous.is_file() and not opts.upgrade:
        # uv keeps the pins already in the output file: a re-lock changes only what must change.
        out.write_text(previous.read_text("utf-8"))
    pyproject = work / "pyproject.toml"
    pyproject.write_text(_lock_input(prof, src, reqs, family))
    _run_uv(_compile_args(pyproject, out, prof, platform, opts, src), work)
    pins = lockfile.parse_requirements(out.read_text("utf-8"))
    if src.route == "index" and not src.torch_index_flat:
        # The GPU runtime wheels that torch pulls in belong to the torch family too: pin them to
        # the same index and resolve again, so nothing of the build comes from elsewhere.
        extra = sorted(n for n in pins if render.TORCH_FAMILY_RE.fullmatch(n) and n not in family)
        if extra:
            family = sorted({*family, *extra})
            pyproject.write_text(_lock_input(prof, src, reqs, family))
            _run_uv(_compile_args(pyproject, out, prof, platform, opts, src), work)
            pins = lockfile.parse_requirements(out.read_text("utf-8"))
    lockverify.verify(prof, pins, src, platform)
    # pylock.toml from the exact pins, through the same routing, so both files say the same.
    exact = [f"{p.name}=={p.version}" for p in sorted(pins.values(), key=lambda p: p.name)]
    pyproject.write_text(_lock_input(prof, src, exact, family))
    pylock = work / f"pylock.{platform.replace('_', '')}.toml"
    args = _compile_args(pyproject, pylock, prof, platform, LockOptions(offline=opts.offline), src)
    args[args.index("--generate-hashes")] = "--format=pylock.toml"
    args.remove("--emit-index-annotation")
    _run_uv(args, work)
    return pins, out.read_text("utf-8"), pylock.read_text("utf-8")


def _lock_venv(project: Project, prof: Profile, opts: LockOptions, digest: str) -> LockOutcome:
    src = render.torch_source(prof, index_url=opts.index_url, torch_index=opts.torch_index, find_links=opts.find_links)
    where = src.torch_index if src.route == "index" else src.index_url
    files: dict[Path, str] = {}
    directory = lock_dir(project, prof.name)
    count = 0
    before: dict[str, dict[str, Pin]] = {}
    after: dict[str, dict[str, Pin]] = {}
    with tempfile.TemporaryDirectory(prefix="envbuild-lock-") as tmp:
        for platform in opts.platforms:
            primary, secondary = lockfile.lock_names(platform)
            if (directory / primary).is_file():
                before[platform] = lockfile.parse_requirements((directory / primary).read_text("utf-8"))
            pins, req_text, pylock_text = _resolve_platform(prof, platform, opts, src, directory / primary, Path(tmp))
            after[platform] = pins
            resolution = lockfile.resolution_id(pins)
            head = lockfile.header(
                prof, digest, resolution, PLATFORM_TAGS[platform], render.redact(f"{src.route} {where}")
            )
            # Secondary first, primary last: the primary's rename is what makes the lock current.
            files[directory / secondary] = head + render.redact(pylock_text)
            files[directory / primary] = head + render.redact(req_text)
            count = max(count, len(pins))
    written = [] if opts.dry_run else atomic_write_many(files)
    return LockOutcome(
        prof.name,
        "locked",
        f"{count} packages" + (" (dry run: nothing written)" if opts.dry_run else ""),
        packages=count,
        files=written,
        changes=lockfile.changes(before, after) if before or opts.dry_run else None,
    )


# ---- orchestration ----------------------------------------------------------------------------


def lock_one(project: Project, name: str, opts: LockOptions, events: Events | None = None) -> LockOutcome:
    from filelock import FileLock

    say = events or (lambda *_: None)
    start = time.monotonic()
    try:
        path = project.profile_path(name)
        prof = profile_mod.load_valid(path, project.rel(path))
        eff = effective_options(project, prof, opts)
        _check_upgrade_packages(project, prof, eff.upgrade_packages)
        digest = digest_of(prof, project.templates_dir)
        project.lockfiles_dir.mkdir(parents=True, exist_ok=True)
        # One writer per profile at a time, across processes; the second re-checks freshness.
        with FileLock(str(project.lockfiles_dir / f".{prof.name}.lock"), timeout=3600):
            fresh = stale_reason(project, prof, eff.platforms) is None
            if fresh and not eff.upgrade and not eff.upgrade_packages:
                say(name, "fresh", "lockfile is up to date")
                return LockOutcome(name, "fresh", "up to date", time.monotonic() - start)
            say(name, "resolving", f"{prof.flavor}: {', '.join(eff.platforms)}")
            if prof.flavor == "conda":
                from envbuild import conda

                outcome = conda.lock(project, prof, eff, digest)
            else:
                outcome = _lock_venv(project, prof, eff, digest)
    except EnvbuildError as exc:
        say(name, "failed", str(exc).splitlines()[0])
        return LockOutcome(name, "failed", str(exc), time.monotonic() - start, error=exc)
    outcome.seconds = time.monotonic() - start
    say(name, "locked", f"{outcome.message} in {outcome.seconds:.1f}s")
    return outcome


def _check_upgrade_packages(project: Project, prof: Profile, packages: tuple[str, ...]) -> None:
    """-P names packages of the current lockfile: a typo there would re-lock, change nothing and
    say so, as if the package had no newer release."""
    path = lock_dir(project, prof.name) / lockfile.lock_names("x86_64", prof.flavor)[0]
    if not packages or prof.flavor != "venv" or not path.is_file():
        return  # a first lock, or a conda lock (always solved from scratch): nothing to compare with
    import difflib

    from packaging.requirements import InvalidRequirement, Requirement

    locked = {lockfile.canonical(n) for n in lockfile.parse_requirements(path.read_text("utf-8"))}
    for line in requirements_of(prof):  # one just added to the profile is not in the lockfile yet
        with contextlib.suppress(InvalidRequirement):
            locked.add(lockfile.canonical(Requirement(line).name))
    for pkg in packages:
        if lockfile.canonical(pkg) not in locked:
            close = difflib.get_close_matches(lockfile.canonical(pkg), sorted(locked), n=1)
            raise UsageError(
                f"-P {pkg}: not in {prof.name}'s lockfile",
                hint=f"did you mean -P {close[0]}?" if close else f"it locks: {', '.join(sorted(locked))}",
            )


def lock_many(
    project: Project,
    names: Sequence[str],
    opts: LockOptions,
    jobs: int = 4,
    events: Events | None = None,
) -> list[LockOutcome]:
    """Lock several profiles, a bounded number at a time; results in the order asked."""
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return list(pool.map(lambda n: lock_one(project, n, opts, events), names))
