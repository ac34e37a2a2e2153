"""Conda flavor locking: a real conda-lock.yml (conda-lock's v1 format).

Two solvers: conda-lock itself where a conda/mamba/micromamba binary is on PATH,
and py-rattler, which needs no binary and solves against any channel URL,
including a local file:// channel. Either way the result is checked against
the profile before anything is written.
"""

from __future__ import annotations

import asyncio
import shutil
from fnmatch import fnmatch
from pathlib import Path
from typing import Any, cast

import yaml

from envbuild import condapip, fetchfail, lockfile, render, tmpdirs
from envbuild.errors import LockError
from envbuild.freshness import lock_dir, read_previous
from envbuild.fsutil import atomic_write_many
from envbuild.lockopts import LockOptions, LockOutcome
from envbuild.names import CONDA_SUBDIRS
from envbuild.plan import Plan
from envbuild.proc import check_cancelled, run
from envbuild.profile import Profile
from envbuild.project import Project

CONDA_ALIAS = "https://conda.anaconda.org"
# What a user changes when a channel is out of reach (fetchfail names the host and the cause).
_CHANNEL_ROUTE = (
    "set `channels:` to channel URLs this machine reaches (a mirror); "
    "or lock on a connected machine and commit the lockfiles"
)


def channel_url(channel: str) -> str:
    if "://" in channel:
        return channel.rstrip("/")
    if channel.startswith("/"):
        return Path(channel).as_uri()
    return f"{CONDA_ALIAS}/{channel}"


def _virtual_packages(prof: Profile, platform: str) -> list[Any]:
    import rattler

    def vp(name: str, version: str, build: str = "0") -> Any:
        return rattler.GenericVirtualPackage(
            rattler.PackageName(name), rattler.Version(version), rattler.BuildString(build)
        )

    pkgs = [
        vp("__unix", "0"),
        vp("__linux", "5.15"),
        vp("__glibc", "2.28"),
        vp("__archspec", "1", platform),
    ]
    if prof.accelerator == "cuda" and prof.cuda:
        # The driver the image will meet is unknown at lock time; state the profile's CUDA.
        pkgs.append(vp("__cuda", prof.cuda))
    return pkgs


def solve_rattler(plan: Plan, subdir: str, platform: str) -> list[Any]:
    import rattler

    prof = plan.profile
    specs = [rattler.MatchSpec(s, strict=False) for s in plan.conda_specs]
    channels = [channel_url(str(c)) for c in prof.channels]
    try:
        return list(
            asyncio.run(
                rattler.solve(
                    channels,
                    specs,
                    platforms=cast(Any, [subdir, "noarch"]),
                    virtual_packages=_virtual_packages(prof, platform),
                )
            )
        )
    except Exception as exc:  # rattler raises its own exception types per failure kind
        raise fetchfail.failure(
            LockError,
            "rattler",
            f"{type(exc).__name__}: {exc}",
            _CHANNEL_ROUTE,
            "check the channels and that they serve these versions",
        ) from exc


def _conda_entry(rec: Any, subdir: str) -> dict[str, Any]:
    deps: dict[str, str] = {}
    for dep in rec.depends:
        name, _, spec = str(dep).partition(" ")
        deps[name] = spec.strip() or "*"
    hashes = {}
    if rec.md5:
        hashes["md5"] = rec.md5.hex()
    if rec.sha256:
        hashes["sha256"] = rec.sha256.hex()
    return {
        "name": rec.name.normalized,
        "version": str(rec.version),
        "manager": "conda",
        "platform": subdir,
        "dependencies": dict(sorted(deps.items())),
        "url": str(rec.url),
        "hash": hashes,
        "category": "main",
        "optional": False,
    }


def verify(plan: Plan, entries: list[dict[str, Any]], subdir: str) -> None:
    prof = plan.profile
    by_name = {e["name"]: e for e in entries if e["manager"] == "conda"}
    problems = []
    for name, version in plan.asked_companions.items():  # the channel's, never a pip package's
        got = by_name.get(name)
        if got is None or not fnmatch(str(got["version"]), version):  # compat's `2.11.*` too, as lockverify
            problems.append(f"{name}: expected {version}, the solver chose {got['version'] if got else 'nothing'}")
    torch = by_name.get("pytorch")
    if torch is None or torch["version"] != prof.torch:
        problems.append(f"pytorch: expected {prof.torch}, the solver chose {torch['version'] if torch else 'nothing'}")
    elif prof.accelerator == "cuda" and "cuda" not in torch["url"].rsplit("/", 1)[-1]:
        problems.append(f"pytorch: expected a CUDA build, the solver chose {torch['url'].rsplit('/', 1)[-1]}")
    elif prof.accelerator == "cpu" and "cpu" not in torch["url"].rsplit("/", 1)[-1]:
        problems.append(f"pytorch: expected a CPU build, the solver chose {torch['url'].rsplit('/', 1)[-1]}")
    numpy = by_name.get("numpy")
    if numpy is None or numpy["version"] != prof.numpy:
        problems.append(f"numpy: expected {prof.numpy}, the solver chose {numpy['version'] if numpy else 'nothing'}")
    python = by_name.get("python")
    if python is None or not python["version"].startswith(prof.python + "."):
        problems.append(
            f"python: expected {prof.python}.x, the solver chose {python['version'] if python else 'nothing'}"
        )
    if prof.accelerator == "cuda":
        cv = by_name.get("cuda-version")
        if cv is not None and not cv["version"].startswith(f"{prof.cuda}"):
            problems.append(f"cuda-version: expected {prof.cuda}, the solver chose {cv['version']}")
    if problems:
        raise LockError(
            f"{prof.name} ({subdir}): the solution does not match the profile; nothing was written:\n  "
            + "\n  ".join(problems)
        )


_CONDA_BINARIES = ("micromamba", "mamba", "conda")


def _solver(opts: LockOptions) -> str:
    has_binary = any(shutil.which(b) for b in _CONDA_BINARIES)
    if opts.solver == "conda-lock" and not has_binary:
        # conda-lock would try to download micromamba itself, which fails offline with a long trace
        raise LockError(
            "--solver conda-lock needs micromamba, mamba or conda on PATH, and none is there",
            hint="install micromamba (or mamba/conda), or use --solver rattler, which needs no binary",
        )
    if opts.solver != "auto":
        return opts.solver
    return "conda-lock" if has_binary and shutil.which("conda-lock") else "rattler"


def _lock_with_conda_lock(plan: Plan, subdirs: list[str], work: Path) -> str:
    env_file = work / "environment.yml"
    env_file.write_text(render.render(plan)["environment.yml"], "utf-8")
    args = [
        shutil.which("conda-lock") or "conda-lock",
        "lock",
        "--file",
        str(env_file),
        "--lockfile",
        str(work / "conda-lock.yml"),
    ]
    for sd in subdirs:
        args += ["--platform", sd]
    proc = run(
        args,
        error=LockError,
        timeout=3600,
        what="conda-lock",
        cwd=work,
        install_hint="pip install 'envbuild[conda]' (conda-lock) and put micromamba, mamba or conda on PATH; "
        "or use --solver rattler, which needs no binary",
    )
    if proc.returncode != 0:
        raise fetchfail.failure(
            LockError, "conda-lock", proc.stderr or proc.stdout, _CHANNEL_ROUTE, "conda-lock's message above says why"
        )
    return (work / "conda-lock.yml").read_text("utf-8")


def lock(project: Project, plan: Plan, opts: LockOptions) -> LockOutcome:
    prof = plan.profile
    subdirs = [CONDA_SUBDIRS[p] for p in plan.platforms]
    solver = _solver(opts)
    if solver == "conda-lock":
        with tmpdirs.private("conda-lock") as tmp:
            doc = yaml.safe_load(_lock_with_conda_lock(plan, subdirs, Path(tmp)))
        entries = list(doc["package"])
    else:
        entries = []
        for platform, subdir in zip(plan.platforms, subdirs, strict=True):
            records = solve_rattler(plan, subdir, platform)
            conda_entries = sorted((_conda_entry(r, subdir) for r in records), key=lambda e: e["name"])
            entries += conda_entries
            source = (plan.source.index_url, plan.source.find_links)
            installed = condapip.provided(conda_entries)
            entries += condapip.entries(list(plan.pip_specs), prof.python, platform, subdir, source, installed)
    for subdir in subdirs:
        verify(plan, [e for e in entries if e["platform"] == subdir], subdir)
    channels = [{"url": str(c), "used_env_vars": []} for c in prof.channels]
    doc = {
        "version": 1,
        "metadata": {
            "content_hash": dict.fromkeys(subdirs, plan.input_digest),
            "channels": channels,
            "platforms": subdirs,
            "sources": ["environment.yml"],
        },
        "package": sorted(entries, key=lambda e: (e["platform"], e["manager"], e["name"])),
    }
    pins = lockfile.conda_pins(entries)
    record = lockfile.new_record(
        profile=prof.name,
        python=prof.python,
        platform=",".join(subdirs),
        build=prof.build_tag,
        route="conda",
        index=", ".join(str(c["url"]) for c in channels),
        input_digest=plan.input_digest,
        resolution=lockfile.resolution_id(pins),
    )
    head = record.header(f"envbuild lock {prof.name} --upgrade")
    path = lock_dir(project, prof.name) / "conda-lock.yml"
    before = _previous_pins(path)
    check_cancelled()  # an interrupt during the solve: write nothing
    written = [] if opts.dry_run else atomic_write_many({path: head + yaml.safe_dump(doc, sort_keys=False, width=200)})
    return LockOutcome(
        prof.name,
        "locked",
        f"{len(entries)} packages ({solver})" + (" (dry run: nothing written)" if opts.dry_run else ""),
        packages=len(entries),
        files=written,
        changes=lockfile.changes(before or {}, _pins_by_platform(entries))
        if before is not None or opts.dry_run
        else None,
    )


def _previous_pins(path: Path) -> dict[str, dict[str, lockfile.Pin]] | None:
    if not path.is_file():
        return None
    try:
        return _pins_by_platform(yaml.safe_load(read_previous(path))["package"])
    except (yaml.YAMLError, KeyError, TypeError, OSError):
        return None  # a hand-damaged old lock: there is nothing trustworthy to compare with


def _pins_by_platform(entries: list[dict[str, Any]]) -> dict[str, dict[str, lockfile.Pin]]:
    """conda-lock entries as pins per subdir, so `lock` can say what a re-lock changed."""
    out: dict[str, dict[str, lockfile.Pin]] = {}
    for e in entries:
        shown = e["name"] if e.get("manager") == "conda" else f"{e['name']} (pip)"
        out.setdefault(str(e["platform"]), {})[shown] = lockfile.Pin(shown, str(e["version"]), lockfile.conda_hashes(e))
    return out
