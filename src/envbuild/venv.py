"""`envbuild venv`: a local virtual environment from a profile's lockfile, hash-checked."""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path

from envbuild import buildreqs, freshness, fsutil, layering, proc, tmpdirs, uvtool, wheelcache
from envbuild import plan as plan_mod
from envbuild.errors import UsageError, VenvError
from envbuild.names import Events, lock_names, quiet
from envbuild.profile import Profile
from envbuild.project import Project
from envbuild.torchsource import TorchSource

# The lockfile fixes what is installed, not where from: a mirror or a wheelhouse can stand in.
_SOURCE_ROUTE = (
    "pass --index-url / --torch-index (a mirror) or --find-links DIR (the locked wheels) "
    "so that the hash-checked files come from a source this machine reaches"
)
# `bootstrap`: the wheels the interpreter's ensurepip would install (pip; setuptools too before 3.12),
# from its own _bundled folder or, where Debian moved them, /usr/share/python-wheels.
_PROBE = (
    "import glob, importlib.util, json, os, platform, sys; "
    "s = importlib.util.find_spec('ensurepip'); "
    "b = sorted(glob.glob(os.path.join(os.path.dirname(s.origin), '_bundled', '*.whl'))) if s and s.origin else []; "
    "d = ['pip'] + (['setuptools'] if sys.version_info < (3, 12) else []); "
    "b = b or [w for n in d for w in sorted(glob.glob('/usr/share/python-wheels/%s-*.whl' % n))[-1:]]; "
    "print(json.dumps({'version': '%d.%d' % sys.version_info[:2], 'machine': platform.machine(), "
    "'libc': platform.libc_ver(), 'executable': sys.executable, 'bootstrap': b}))"
)


def probe(python: str) -> dict[str, object]:
    done = proc.run([python, "-c", _PROBE], error=VenvError, timeout=60, what=f"the interpreter {python}")
    try:
        if done.returncode != 0:
            raise ValueError(done.stderr.strip()[-300:] or f"exit {done.returncode}")
        return dict(json.loads(done.stdout))
    except ValueError as exc:
        raise VenvError(f"cannot run the interpreter {python}: {exc}") from exc


def find_python(prof: Profile) -> str:
    """The first interpreter on PATH that is the profile's Python. One that does not run (a pyenv
    shim for a version that is installed but not selected, a dangling link) is passed over, not
    the end of the search, and the error names each one tried and what it was."""
    tried: list[str] = []
    for candidate in dict.fromkeys((f"python{prof.python}", "python3", sys.executable)):
        path = shutil.which(candidate) or (candidate if Path(candidate).is_file() else None)
        if not path:
            continue
        try:
            version = probe(path)["version"]
        except VenvError as exc:
            why = str(exc).removeprefix(f"cannot run the interpreter {path}: ")
            tried.append(f"{path} does not run ({_first_line(why)})")
            continue
        if version == prof.python:
            return path
        tried.append(f"{path} is Python {version}")
    seen = f": {'; '.join(tried)}" if tried else ""
    raise VenvError(
        f"no Python {prof.python} found on PATH{seen}",
        hint=f"put a Python {prof.python} on PATH (a pyenv shim runs only when its version is selected) "
        f"or pass --python /path/to/python{prof.python}",
    )


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), text)


def check_interpreter(prof: Profile, facts: dict[str, object], platform: str) -> None:
    if facts["version"] != prof.python:
        raise VenvError(
            f"{facts['executable']} is Python {facts['version']}, "
            f"but the lock of {prof.name} is for Python {prof.python}",
            hint=f"pass --python pointing at a Python {prof.python}",
        )
    if facts["machine"] != platform:
        raise VenvError(
            f"this machine is {facts['machine']}, the lock of {prof.name} is for {platform}",
            hint=f"lock for it: add {facts['machine']} to the profile's platforms",
        )
    libc = facts.get("libc")
    if isinstance(libc, list) and libc and libc[0] == "glibc":
        major, minor = (int(x) for x in str(libc[1]).split(".")[:2])
        if (major, minor) < (2, 28):
            raise VenvError(f"glibc {libc[1]} is older than 2.28, which the locked wheels (manylinux_2_28) need")


def create(
    project: Project,
    prof: Profile,
    target: Path,
    *,
    python: str | None = None,
    options: plan_mod.PlanOptions | None = None,
    force: bool = False,
    compile_bytecode: bool = True,
    events: Events | None = None,
) -> dict[str, object]:
    say = events or quiet
    if prof.flavor == "conda":  # uv read conda-lock.yml as a requirements file and failed on line 2
        lock = project.rel(freshness.lock_dir(project, prof.name) / lock_names(prof.platforms[0], "conda")[0])
        raise UsageError(
            f"{prof.name} is a conda profile: `envbuild venv` makes a Python venv from a venv profile's lockfile",
            hint=f"create its environment with `micromamba create -p {target} -f {lock}` (or `conda-lock install "
            f"-p {target} {lock}`)",
        )
    check_target(target, force)
    final = target.resolve()  # where the venv's files will say they are
    plan = plan_mod.make(project, prof, options)
    facts = probe(python) if python else probe(find_python(prof))
    platform = str(facts["machine"])
    if platform not in prof.platforms:
        platform = prof.platforms[0]
    check_interpreter(prof, facts, platform)
    snap = freshness.require_fresh(project, plan, platform)
    # The lock's own record says where the torch family lives; today's options only say how to reach it.
    src = plan.source_as_locked(snap.record.route, snap.record.index)
    lock_file = snap.path
    staging = target.with_name(f".{target.name}.envbuild-tmp")
    shutil.rmtree(staging, ignore_errors=True)
    pins = snap.pins
    say("phase", "venv", f"Python {facts['version']} from {facts['executable']}")
    # uv's other inputs (the bootstrap wheels' requirements, the build settings) go in a private
    # temporary folder, not beside the venv, whose disk may be another (or full)
    with tmpdirs.private("venv") as work:
        try:
            # --relocatable: the venv is made under a staging name and renamed into place when complete.
            _uv(
                [
                    "venv",
                    str(staging),
                    "--python",
                    str(facts["executable"]),
                    "--no-config",
                    "--quiet",
                    "--relocatable",
                ]
            )
            args = _sync_args(project, prof, snap, src, staging=staging, work=work, say=say)
            bootstrap = _bootstrap(facts, pins, work / "bootstrap.txt")
            if bootstrap is not None:
                args.insert(3, str(bootstrap))  # a second requirements file beside the lockfile
            if compile_bytecode:
                # pip compiles on install and uv does not: without it every process that imports torch
                # compiles its ~2,000 modules in memory again (3-4 s each here; PYTHONDONTWRITEBYTECODE,
                # set in many CI images, stops Python from keeping the result) instead of once
                args.append("--compile-bytecode")
            say(
                "phase",
                "install",
                f"{len(pins)} packages from {project.rel(lock_file)}, hash-checked"
                + (", then compiled to bytecode" if compile_bytecode else ""),
            )
            _uv(args)
            pip = _pip_version(staging) if bootstrap is not None else _add_pip(staging)
            held = _hold(plan, snap, staging, final)
            if target.exists():
                shutil.rmtree(target)
            staging.rename(target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    warnings = []
    if _has_space(final):
        # torch joins -I/-L folders into its compiler commands unquoted (the smoke test names it too)
        warnings.append(
            f"{final} has a space in its path: torch.compile on the CPU and C++ extensions fail in "
            "this venv (torch passes its folders to the compiler unquoted); make it in a folder whose path has none"
        )
    return {
        "path": str(target),
        "python": facts["version"],
        "packages": len(pins),
        "lockfile": str(lock_file),
        "constraints": str(held or ""),
        "pip": pip,
        "warnings": warnings,
    }


def _sync_args(
    project: Project,
    prof: Profile,
    snap: freshness.LockSnapshot,
    src: TorchSource,
    *,
    staging: Path,
    work: Path,
    say: Events,
) -> list[str]:
    """`uv pip sync` of the lockfile into the staging venv: hash-checked, its sdists built with the
    locked build backend (and what they import undeclared), from the wheel cache and the sources."""
    args = [
        "pip",
        "sync",
        str(snap.path),
        "--python",
        str(staging / "bin" / "python"),
        "--require-hashes",
        "--no-config",
        "--quiet",
    ]
    if snap.from_source:  # built from sdists: their build backend at the version the lock pins
        args += ["--build-constraints", str(snap.path)]
        if prof.build_requires:  # and what they import undeclared (torch), at its locked version
            versions = {n: p.version for n, p in snap.pins.items()}
            config = work / buildreqs.CONFIG_FILE
            config.write_text(buildreqs.config(buildreqs.for_build(prof, versions)), "utf-8")
            args += ["--config-file", str(config)]
    args += _sources(project, snap, src, say)
    return args


def _sources(project: Project, snap: freshness.LockSnapshot, src: TorchSource, say: Events) -> list[str]:
    """Where `uv pip sync` takes the locked files from. The wheels a build already fetched
    (envbuild's wheel cache) are not fetched again; with all of them there, no index is asked (an
    offline laptop, a mirror that is down). uv reads each in its own folder in the cache: they were
    linked into a folder beside the venv, new for each venv, and copied where that is another disk
    than the cache's. uv keeps what it unpacked by the file's path, so each new venv unpacked torch
    again (3-5 s here; the CUDA wheels, gigabytes); from the cache's own paths it does so once."""
    cached = wheelcache.for_lock(snap.pylock_text, snap.pins, fetch=False, user=(project.lockfiles_dir, project.root))
    offline = wheelcache.complete(snap.pins, cached)
    args = []
    if offline:
        args.append("--no-index")
    else:
        args += ["--index-url", src.index_url]
        if src.extra_index:
            args += ["--extra-index-url", src.extra_index, "--index-strategy", src.index_strategy]
        for link in src.find_links:
            args += ["--find-links", link]
    for folder in sorted({wheel.parent for wheel in cached}):
        args += ["--find-links", str(folder)]
    if cached:
        every = ": every one, so no package index is asked" if offline else ""
        say("phase", "wheels", f"{len(cached)} of {len(snap.pins)} wheel(s) from the wheel cache{every}")
    return args


# What uv writes at the top of a relocatable venv's scripts: sh finds the python beside the script.
_RELOCATABLE_HEAD = b"#!/bin/sh\n'''exec' \"$(dirname -- \"$(realpath -- \"$0\")\")\"/'python' \"$0\" \"$@\"\n' '''\n"


def _bootstrap(facts: dict[str, object], pins: Mapping[str, object], into: Path) -> Path | None:
    """A requirements file of the wheels `python -m venv` would put in the venv (the interpreter's
    bundled pip, and setuptools before Python 3.12), each by its hash, that the lockfile does not
    pin itself; installed by the same `uv pip sync` as the lockfile, as uv installs everything (its
    scripts relocatable, compiled with the rest): ensurepip, run after, cost 3.6 s of the venv's
    5 s. None where the interpreter has no such wheel: `_add_pip` then asks its ensurepip."""
    wheels = facts.get("bootstrap")
    found = [Path(str(w)) for w in wheels] if isinstance(wheels, list) else []
    if not any(w.name.startswith("pip-") for w in found):
        return None
    lines = []
    for wheel in found:
        name = wheel.name.split("-", 1)[0]
        if name not in pins:
            lines.append(f"{name} @ {wheel.absolute().as_uri()} --hash=sha256:{fsutil.sha256_file(wheel)}\n")
    into.write_text("".join(lines), "utf-8")
    return into


def _pip_version(venv: Path) -> str | None:
    installed = sorted(venv.glob("lib/python*/site-packages/pip-*.dist-info"))
    return installed[0].name.removeprefix("pip-").removesuffix(".dist-info") if installed else None


def _add_pip(venv: Path) -> str | None:
    """pip in the venv, from the interpreter's own ensurepip: offline, the version that Python ships,
    as `python -m venv` and the image's venv get it (uv's venv has none, and `uv pip sync` installs
    only the lockfile). Without it `pip install` in the activated venv ran whatever pip came next
    on PATH, which installs somewhere else, past the pins the venv's pip.conf holds. Its scripts
    are made to find the python beside them, as uv's are: the venv is renamed into place after.
    pip's version, or None where the interpreter has no working ensurepip (Debian's system Python
    without python3-venv); the venv is whole without it."""
    python = venv / "bin" / "python"
    # ensurepip itself ignores PIP_* settings and pip's config files
    done = proc.run([str(python), "-m", "ensurepip", "--default-pip"], error=VenvError, timeout=300, what="ensurepip")
    if done.returncode != 0:
        return None
    here = (venv / "bin").absolute()
    for script in here.glob("pip*"):
        first, _, rest = script.read_bytes().partition(b"\n")
        if first.startswith(b"#!") and Path(first[2:].decode(errors="replace").strip()).parent == here:
            script.write_bytes(_RELOCATABLE_HEAD + rest)
    return _pip_version(venv)


def _hold(plan: plan_mod.Plan, snap: freshness.LockSnapshot, staging: Path, final: Path) -> Path | None:
    """The image's PIP_CONSTRAINT, for the venv: the locked torch build and numpy, which a later
    `pip install torchvision` (or a package wanting another torch) would otherwise replace with
    PyPI's default build without a word. pip reads a venv's own pip.conf; uv reads no
    configuration from a venv, so the file's first lines name `uv pip install -c`. The paths are
    where the venv ends up, not the staging folder. The file's path there, or None without torch."""
    if "torch" not in snap.pins:
        return None
    groups = layering.layer_groups(plan, snap.pins, snap.text, snap.from_source)
    (staging / layering.VENV_CONSTRAINTS).write_text(layering.constraints(plan, snap.pins, groups, venv=final), "utf-8")
    path = final / layering.VENV_CONSTRAINTS
    # pip splits a list setting of its config files at whitespace: a venv in "/tmp/my venv" made every
    # install there fail ("Could not open requirements file: '/tmp/my'"); a file: URL has none
    named = path.as_uri() if _has_space(path) else str(path)
    (staging / "pip.conf").write_text(
        "# Written by envbuild venv: pip in this venv keeps the locked torch build and numpy.\n"
        f"[install]\nconstraint = {named}\n",
        "utf-8",
    )
    return path


def _has_space(path: Path) -> bool:
    return any(c.isspace() for c in str(path))


def check_target(target: Path, force: bool) -> None:
    """Where the venv goes: a new or empty folder, or (--force) a venv to replace, and nothing else.

    --force deletes the folder, so it must be a venv: `--force` on a project or home folder by
    mistake must not wipe it.
    """
    if target.is_symlink():
        raise UsageError(f"{target} is a link", hint="name the folder it points to, or another one")
    if not target.exists():
        return
    if not target.is_dir():
        raise UsageError(f"{target} is a file, not a folder", hint="choose a new or empty folder for the venv")
    if not any(target.iterdir()):
        return
    if not force:
        raise UsageError(f"{target} exists and is not empty", hint="choose another folder; --force replaces a venv")
    if not (target / "pyvenv.cfg").is_file():
        raise UsageError(
            f"{target} is not a virtual environment (no pyvenv.cfg); --force replaces only a venv",
            hint="choose a new or empty folder, or remove this one yourself",
        )


def _uv(args: list[str]) -> None:
    uvtool.run(
        args,
        error=VenvError,
        route=_SOURCE_ROUTE,
        fallback_hint="uv's message above says why",
        what=f"uv {' '.join(args[:2])}",
    )
