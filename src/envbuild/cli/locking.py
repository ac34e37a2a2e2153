"""Commands on lockfiles: lock, and venv (a local environment from one)."""

import shlex
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from envbuild import output
from envbuild.cli._common import (
    FindLinksOpt,
    IndexUrlOpt,
    JsonOpt,
    NameArg,
    ProjectOpt,
    TorchIndexOpt,
    app,
    check_indexes,
    check_jobs,
    check_python,
    load_profile,
    pick_profiles,
    project_at,
    step_printer,
)


@app.command()
def lock(
    names: Annotated[list[str] | None, typer.Argument(help="Profiles to lock.")] = None,
    all_: Annotated[bool, typer.Option("--all", help="Every profile in the project.")] = False,
    check: Annotated[
        bool, typer.Option("--check", help="Offline: exit 1 if any lockfile is stale or missing.")
    ] = False,
    upgrade: Annotated[bool, typer.Option("--upgrade", help="Re-resolve everything on purpose.")] = False,
    upgrade_package: Annotated[
        list[str] | None, typer.Option("--upgrade-package", "-P", help="Re-resolve this package.")
    ] = None,
    index_url: IndexUrlOpt = None,
    torch_index: TorchIndexOpt = None,
    find_links: FindLinksOpt = None,
    platform: Annotated[
        list[str] | None,
        typer.Option("--platform", help="x86_64 and/or aarch64 (default: the profile's)."),
    ] = None,
    solver: Annotated[str, typer.Option(help="conda flavor: auto, conda-lock or rattler.")] = "auto",
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Resolve and say what would change; write nothing.")
    ] = False,
    jobs: Annotated[int | None, typer.Option("--jobs", "-j", help="Profiles locked at once.")] = None,
    base: Annotated[
        str | None, typer.Option(help="The base image apt.lock is resolved against (default: the profile's).")
    ] = None,
    apt: Annotated[
        bool, typer.Option("--apt/--no-apt", help="Also lock the OS packages (apt.lock); needs the engine.")
    ] = True,
    project: ProjectOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Resolve profiles into hashed lockfiles under lockfiles/<profile>/ (Python, and apt.lock for the OS)."""
    from envbuild import lock as lk
    from envbuild.errors import LockCheckFailed, LockError, UsageError

    check_jobs(jobs)
    check_indexes(index_url, torch_index)
    from envbuild import refs

    refs.check("--base", base, "image")
    proj = project_at(project)
    chosen = pick_profiles(proj, names, all_, "lock")
    from envbuild import lockahead

    lockahead.keep_if(len(chosen) == 1 and not check)  # a guess at one profile's resolve
    if check and dry_run:
        raise UsageError("--check and --dry-run do not go together", hint="--check is offline; --dry-run resolves")
    if check and (upgrade or upgrade_package):
        option = "--upgrade" if upgrade else "-P"
        raise UsageError(
            f"--check and {option} do not go together: --check is offline and changes nothing",
            hint=f"upgrade first (envbuild lock ... {option}{' PKG' if option == '-P' else ''}), then check",
        )
    if check:
        stale = lk.check(proj, chosen)
        if as_json:
            output.emit_json({"fresh": not stale, "stale": [s.__dict__ for s in stale]})
        elif not stale:
            output.out().print(f"{len(chosen)} lockfile(s) fresh")
        if stale:
            raise LockCheckFailed(stale)
        return
    for p in platform or []:
        if p not in {"x86_64", "aarch64"}:
            raise UsageError(f"--platform {p}: unknown", hint="use x86_64 or aarch64")
    if solver not in {"auto", "conda-lock", "rattler"}:
        raise UsageError(f"--solver {solver}: unknown", hint="use auto, conda-lock or rattler")
    opts = lk.LockOptions(
        index_url=index_url,
        torch_index=torch_index,
        find_links=tuple(find_links or ()),
        upgrade=upgrade,
        upgrade_packages=tuple(upgrade_package or ()),
        platforms=tuple(platform or ()),
        solver=solver,
        dry_run=dry_run,
        base=base,
        apt=apt,
    )
    at_once = jobs or proj.config.lock_jobs
    started = time.monotonic()
    outcomes = _with_progress(chosen, lambda events: lk.lock_many(proj, chosen, opts, at_once, events))
    took = time.monotonic() - started
    failed = [o for o in outcomes if o.state == "failed"]
    if as_json:
        output.emit_json(
            [
                {
                    "profile": o.name,
                    "state": o.state,
                    "message": o.message,
                    "seconds": round(o.seconds, 3),
                    "packages": o.packages,
                    "files": [proj.rel(f) for f in o.files],
                    "changes": None if o.changes is None else [c.as_dict() for c in o.changes],
                }
                for o in outcomes
            ]
        )
    else:
        _print_lock_changes(outcomes, dry_run)
        if len(outcomes) > 1:  # the matrix as a whole: what a person waits for
            done = sum(o.state == "locked" for o in outcomes)
            fresh = sum(o.state == "fresh" for o in outcomes)
            output.err().print(
                f"{len(outcomes)} profile(s) in {took:.1f}s, up to {min(at_once, len(outcomes))} at a time: "
                f"{done} locked, {fresh} already fresh, {len(failed)} failed"
            )
    if not as_json and len(failed) > 1:
        # One failure is reported once, by the error it raises below; several each get theirs here.
        for o in failed:
            output.err().print(f"{o.name}: {o.message}")
    if len(failed) == 1 and failed[0].error is not None:
        raise failed[0].error
    if failed:
        raise LockError(
            f"{len(failed)} of {len(outcomes)} profile(s) failed to lock: {', '.join(o.name for o in failed)}"
        )


def _print_lock_changes(outcomes: list[Any], dry_run: bool = False) -> None:
    """What each re-lock moved: a reviewer reads this instead of a diff of hashes."""
    con = output.out()
    for o in outcomes:
        if o.state != "locked" or o.changes is None:
            continue
        if not o.changes:
            con.print(f"{o.name}: no package {'would change' if dry_run else 'changed'}")
            continue
        verb = "would change (dry run, nothing written)" if dry_run else "changed"
        con.print(f"{o.name}: {len(o.changes)} package(s) {verb}")
        for change in o.changes:
            con.print(f"  {change.render()}")


def _with_progress(names: list[str], work: Any) -> Any:
    """Run `work(events)` while a live table shows each profile's state (stderr, TTY or not; with
    --json too, as build's progress: stdout carries only the report)."""
    import threading
    import time as _time

    states = dict.fromkeys(names, ("queued", ""))
    started = _time.monotonic()
    lock_ = threading.Lock()

    def events(name: str, state: str, detail: str) -> None:
        if state == "note":  # kept on screen, not overwritten by the next state
            console.print(f"note: {name}: {detail}")
            return
        with lock_:
            states[name] = (state, detail)
        if not console.is_terminal:
            console.print(f"{name}: {state} {detail}".rstrip())

    console = output.err()
    if not console.is_terminal:
        return _with_heartbeat(states, lock_, started, console, lambda: work(events))
    from rich.live import Live

    def view() -> Any:
        with lock_:
            rows = [[n, s, d] for n, (s, d) in states.items()]
        return output.table(f"envbuild ({_time.monotonic() - started:.0f}s)", ["profile", "state", "detail"], rows)

    with Live(view(), console=console, refresh_per_second=4, get_renderable=view):
        return work(events)


HEARTBEAT_S = 30.0


def _with_heartbeat(states: dict[str, tuple[str, str]], lock_: Any, started: float, console: Any, work: Any) -> Any:
    """Without a live table (a CI log), a line every HEARTBEAT_S for each profile still resolving:
    a stalled index (uv retries for minutes) otherwise looks like a hung job."""
    import threading
    import time as _time

    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(HEARTBEAT_S):
            with lock_:
                busy = [n for n, (state, _) in states.items() if state == "resolving"]
            for name in busy:
                console.print(f"{name}: still resolving ({_time.monotonic() - started:.0f}s)")

    beater = threading.Thread(target=beat, daemon=True)
    beater.start()
    try:
        return work()
    finally:
        stop.set()
        beater.join()


@app.command()
def venv(
    name: NameArg,
    directory: Annotated[
        Path, typer.Argument(help="Where the venv goes: a new or empty folder (--force: a venv to replace).")
    ],
    python: Annotated[
        str | None,
        typer.Option(help="Interpreter to base the venv on (default: python3.X on PATH)."),
    ] = None,
    force: Annotated[bool, typer.Option(help="Replace the venv already in DIRECTORY.")] = False,
    find_links: FindLinksOpt = None,
    index_url: IndexUrlOpt = None,
    torch_index: TorchIndexOpt = None,
    no_compile: Annotated[
        bool, typer.Option("--no-compile", help="Skip compiling to bytecode: faster to make, slower to import.")
    ] = False,
    project: ProjectOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Create a local virtual environment from a profile's lockfile (hash-checked)."""
    from envbuild import plan as pl
    from envbuild import venv as vv

    check_indexes(index_url, torch_index)
    check_python(python)
    proj = project_at(project)
    prof = load_profile(proj, name)
    opts = pl.PlanOptions(index_url=index_url, torch_index=torch_index, find_links=tuple(find_links or ()))
    result = vv.create(
        proj,
        prof,
        directory,
        python=python,
        options=opts,
        force=force,
        compile_bytecode=not no_compile,
        events=step_printer(),
    )
    if as_json:
        output.emit_json(result)
    else:
        output.out().print(
            f"created {result['path']}: Python {result['python']}, {result['packages']} packages "
            f"from {proj.rel(Path(str(result['lockfile'])))}"
        )
        warnings = result["warnings"]
        for warning in warnings if isinstance(warnings, list) else ():
            output.err().print(f"warning: {warning}")
        if not result["pip"]:
            output.err().print(
                "note: the venv has no pip (this Python has no bundled pip wheel and no working ensurepip, as "
                "Debian's without python3-venv and python3-pip-whl): install with uv pip install -p "
                + shlex.quote(str(result["path"]))
                + (f" -c {shlex.quote(str(result['constraints']))}" if result["constraints"] else "")
                + " ..."
            )
        elif result["constraints"]:
            output.err().print(
                "note: later installs keep the locked torch build and numpy: pip in the venv reads them "
                "from its pip.conf; with uv, pass them: uv pip install -c "
                f"{shlex.quote(str(result['constraints']))} ..."
            )


@app.command("cache")
def cache_(
    prune: Annotated[
        bool,
        typer.Option(
            "--prune",
            help="Remove the wheels no lockfile pins any more (this project's, or another's that used the cache).",
        ),
    ] = False,
    all_: Annotated[bool, typer.Option("--all", help="With --prune: empty the cache.")] = False,
    project: ProjectOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """The wheel cache that build and venv share (ENVBUILD_CACHE_DIR): its size; --prune frees it."""
    from envbuild import tmpdirs, wheelcache
    from envbuild.errors import UsageError

    if all_ and not prune:
        raise UsageError("--all goes with --prune", hint="envbuild cache --prune --all")
    removed = None
    others: list[Path] = []
    if prune:
        keep: set[str] = set()
        if not all_:
            own = project_at(project).lockfiles_dir
            others = [u.lockfiles for u in wheelcache.other_users(own)]  # the cache is the host's: theirs stay
            for folder in [own, *others]:
                keep |= wheelcache.needed(folder)
        removed = wheelcache.prune(keep)
    now = wheelcache.usage()
    run_cache = tmpdirs.run_cache()
    run_bytes = tmpdirs.folder_bytes(run_cache)
    if as_json:
        output.emit_json(
            {
                "root": str(now.root),
                "wheels": now.wheels,
                "bytes": now.bytes,
                "removed_wheels": removed.wheels if removed else 0,
                "freed_bytes": removed.bytes if removed else 0,
                "kept_for": [str(f) for f in others],
                "run_cache": {"root": str(run_cache), "bytes": run_bytes},
            }
        )
        return
    con = output.out()
    if removed is not None:
        con.print(f"removed {removed.wheels} wheel(s), {removed.bytes / 1e6:,.0f} MB")
        if others:
            kept = ", ".join(str(f) for f in others)
            con.print(
                f"kept what the lockfiles of {len(others)} other project(s) pin: {kept} (--all empties the cache)"
            )
    con.print(f"wheel cache {now.root}: {now.wheels} wheel(s), {now.bytes / 1e6:,.0f} MB")
    if run_bytes:
        # `run` fills it without asking (models, torch.compile's kernels): say where the disk went
        con.print(
            f"run's download cache {run_cache}: {run_bytes / 1e6:,.0f} MB (what jobs downloaded and compiled; "
            "not pruned here: remove what you no longer need, or all of it)"
        )
