"""`envbuild venv`: a local virtual environment from a profile's lockfile, hash-checked."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from envbuild import fetchfail, lock, lockfile, render
from envbuild.errors import UsageError, VenvError
from envbuild.profile import Profile
from envbuild.project import Project

# The lockfile fixes what is installed, not where from: a mirror or a wheelhouse can stand in.
_SOURCE_ROUTE = (
    "pass --index-url / --torch-index (a mirror) or --find-links DIR (the locked wheels) "
    "so that the hash-checked files come from a source this machine reaches"
)
_PROBE = (
    "import json, platform, sys; "
    "print(json.dumps({'version': '%d.%d' % sys.version_info[:2], 'machine': platform.machine(), "
    "'libc': platform.libc_ver(), 'executable': sys.executable}))"
)


def probe(python: str) -> dict[str, object]:
    try:
        proc = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, check=True, timeout=60)
        return dict(json.loads(proc.stdout))
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        raise VenvError(f"cannot run the interpreter {python}: {exc}") from exc


def find_python(prof: Profile) -> str:
    for candidate in (f"python{prof.python}", "python3", sys.executable):
        path = shutil.which(candidate) or (candidate if Path(candidate).is_file() else None)
        if path and probe(path)["version"] == prof.python:
            return path
    raise VenvError(
        f"no Python {prof.python} found on PATH",
        hint=f"install Python {prof.python} or pass --python /path/to/python{prof.python}",
    )


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
    opts: lock.LockOptions | None = None,
    force: bool = False,
    compile_bytecode: bool = True,
    events: Callable[[str, str, str], None] | None = None,
) -> dict[str, object]:
    say = events or (lambda *_: None)
    check_target(target, force)
    directory = lock.require_fresh(project, prof)
    eff = lock.effective_options(project, prof, opts or lock.LockOptions())
    facts = probe(python) if python else probe(find_python(prof))
    platform = str(facts["machine"])
    if platform not in prof.platforms:
        platform = prof.platforms[0]
    check_interpreter(prof, facts, platform)
    lock_file = directory / lockfile.lock_names(platform)[0]
    src = render.torch_source(prof, index_url=eff.index_url, torch_index=eff.torch_index, find_links=eff.find_links)
    staging = target.with_name(f".{target.name}.envbuild-tmp")
    shutil.rmtree(staging, ignore_errors=True)
    pins = lockfile.parse_requirements(lock_file.read_text("utf-8"))
    say("phase", "venv", f"Python {facts['version']} from {facts['executable']}")
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
        args = [
            "pip",
            "sync",
            str(lock_file),
            "--python",
            str(staging / "bin" / "python"),
            "--require-hashes",
            "--no-config",
            "--quiet",
            "--index-url",
            src.index_url,
        ]
        if src.route == "index" and src.torch_index and not src.torch_index_flat:
            args += ["--extra-index-url", src.torch_index]
        for link in eff.find_links:
            args += ["--find-links", link]
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
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return {
        "path": str(target),
        "python": facts["version"],
        "packages": len(pins),
        "lockfile": str(lock_file),
    }


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
    proc = subprocess.run(
        [lock.uv_binary(), *args],
        capture_output=True,
        text=True,
        check=False,
        env=lock._uv_env(),
        timeout=3600,
    )
    if proc.returncode != 0:
        raise fetchfail.failure(
            VenvError,
            f"uv {' '.join(args[:2])}",
            proc.stderr or proc.stdout,
            _SOURCE_ROUTE,
            "uv's message above says why",
        )
