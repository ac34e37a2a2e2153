"""envbuild's command line: parse options, call the library, format the result.

Every command is a thin wrapper. Errors travel up as EnvbuildError subclasses
and become an exit code in `run`, the only place that exits.
"""

import functools
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from envbuild import output
from envbuild.errors import EnvbuildError

app = typer.Typer(
    name="envbuild",
    help="Reproducible PyTorch environments: validate, render, lock, build, smoke-test, publish.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

ProjectOpt = Annotated[
    str | None,
    typer.Option(
        "--project",
        "-C",
        envvar="ENVBUILD_PROJECT",
        help="Project folder (profiles/, lockfiles/, envbuild.toml).",
    ),
]
ProfilesArg = Annotated[list[str] | None, typer.Argument(help="Profiles to look at (default: all).")]
JsonOpt = Annotated[
    bool, typer.Option("--json", help="Machine-readable output on stdout.", callback=output.json_requested)
]


def _say_no_profiles(proj: Any) -> None:
    output.err().print(f"no profiles in {proj.rel(proj.profiles_dir)}/: `envbuild new cu126-py312` starts one")


def _project(path: str | None) -> Any:
    from envbuild.project import open_project

    return open_project(path)


# ---- issue: profiles, compat, validation, rendering -------------------------------------------


@app.command("list")
def list_(project: ProjectOpt = None, as_json: JsonOpt = False) -> None:
    """List the project's profiles."""
    from envbuild import profilefile

    proj = _project(project)
    rows: list[dict[str, Any]] = []
    for name in proj.profile_names():
        ld = profilefile.read_raw(proj.profiles_dir / f"{name}.yaml", proj.rel(proj.profiles_dir / f"{name}.yaml"))
        d = ld.data
        accel = str(d.get("accelerator", "?"))
        version = d.get("cuda") or d.get("rocm") or ""
        rows.append(
            {
                "name": name,
                "accelerator": accel,
                "accelerator_version": str(version) if version else None,
                "python": str(d.get("python", "?")),
                "torch": str(d.get("torch", "?")),
                "numpy": str(d.get("numpy", "?")),
                "flavor": str(d.get("flavor", "venv")),
                "readable": not ld.errors,
            }
        )
    if as_json:
        output.emit_json(rows)
        return
    if not rows:
        _say_no_profiles(proj)
        return
    output.out().print(
        output.table(
            None,
            ["name", "accelerator", "python", "torch", "numpy", "flavor"],
            [
                [
                    r["name"],
                    r["accelerator"] + (f" {r['accelerator_version']}" if r["accelerator_version"] else ""),
                    r["python"],
                    r["torch"],
                    r["numpy"],
                    r["flavor"],
                ]
                for r in rows
            ],
        )
    )


@app.command()
def show(name: str, project: ProjectOpt = None, as_json: JsonOpt = False) -> None:
    """Show a profile as resolved after `extends`."""
    from envbuild import profile

    proj = _project(project)
    path = proj.profile_path(name)
    prof = profile.load_valid(path, proj.rel(path))
    data = prof.model_dump(mode="json")
    data["digest"] = prof.digest()
    if as_json:
        output.emit_json(data)
        return
    import yaml

    output.out().print(yaml.safe_dump(data, sort_keys=False).rstrip())


@app.command()
def validate(
    targets: Annotated[list[str] | None, typer.Argument(help="Profile names or paths to YAML files.")] = None,
    all_: Annotated[bool, typer.Option("--all", help="Every profile in the project.")] = False,
    project: ProjectOpt = None,
    as_json: JsonOpt = False,
    strict: Annotated[bool, typer.Option("--strict", help="Treat warnings as errors.")] = False,
) -> None:
    """Check profiles against PyTorch compatibility data; every problem at once."""
    from envbuild import validate as v
    from envbuild.errors import ProfileError, UsageError

    proj = _project(project)
    names = list(targets or [])
    if all_:
        names += [n for n in proj.profile_names() if n not in names]
    if not names:
        raise UsageError("nothing to validate", hint="name profiles or pass --all")
    results = []
    for target in names:
        path = proj.profile_path(target)
        results.append(v.check(path, proj.rel(path)))
    failed = [r for r in results if r.errors or (strict and r.warnings)]
    if as_json:
        output.emit_json(
            {
                "valid": not failed,
                "profiles": [
                    {
                        "file": r.shown,
                        "valid": not r.errors,
                        "errors": [d.as_dict() for d in r.errors],
                        "warnings": [d.as_dict() for d in r.warnings],
                    }
                    for r in results
                ],
            }
        )
    else:
        con = output.out()
        for r in results:
            for d in r.errors:
                con.print(f"[red]error[/red] {d.render()}", markup=True)
            for d in r.warnings:
                con.print(f"[yellow]warning[/yellow] {d.render()}", markup=True)
        ok = len(results) - len(failed)
        con.print(f"{ok} of {len(results)} profile(s) valid")
    if failed:
        raise ProfileError(f"{len(failed)} profile(s) invalid: {', '.join(r.shown for r in failed)}")


@app.command()
def new(
    name: Annotated[str, typer.Argument(help="The profile's name, e.g. cu126-py312: it says the build and Python.")],
    torch: Annotated[
        str | None, typer.Option(help="A torch release (2.9.1) or series (2.9); default: the newest that fits.")
    ] = None,
    numpy: Annotated[
        str | None, typer.Option(help="A numpy release or series; default: the newest that torch allows.")
    ] = None,
    index_url: Annotated[str | None, typer.Option(help="A PyPI mirror for the newest-patch lookup.")] = None,
    base: Annotated[str | None, typer.Option(help="A base image, pinned by digest (default: per Python).")] = None,
    force: Annotated[bool, typer.Option(help="Replace an existing profile of that name.")] = False,
    project: ProjectOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Write a new profile, choosing torch and numpy from the compat data; it validates before it is written."""
    from envbuild import scaffold

    proj = _project(project)
    made = scaffold.create(proj, name, torch=torch, numpy=numpy, index_url=index_url, base=base, force=force)
    nxt = [f"envbuild lock {name}", f"envbuild build {name}"]
    if as_json:
        output.emit_json(
            {
                "profile": name,
                "path": proj.rel(made.path),
                "torch": made.choice.torch,
                "numpy": made.choice.numpy,
                "notes": made.notes,
                "warnings": made.warnings,
                "next": nxt,
            }
        )
        return
    sys.stdout.write(made.text)
    err = output.err()
    err.print(f"wrote {proj.rel(made.path)}", markup=False)
    for line in made.notes:
        err.print(f"note: {line}", markup=False)
    for line in made.warnings:
        err.print(f"warning: {line}", markup=False)
    err.print(f"next: {' && '.join(nxt)}", markup=False)


@app.command()
def outdated(
    names: Annotated[list[str] | None, typer.Argument(help="Profiles (default: all of them).")] = None,
    check: Annotated[bool, typer.Option(help="Exit 1 when any profile is behind (a scheduled CI job).")] = False,
    jobs: Annotated[int, typer.Option("--jobs", "-j", help="Profiles looked up at once.")] = 4,
    project: ProjectOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """What upstream released since the profiles were pinned: newer patches, and newer releases that fit."""
    from envbuild import ci
    from envbuild import outdated as od
    from envbuild.errors import LockError, ProfilesBehind

    proj = _project(project)
    profiles = [_load(proj, n) for n in names] if names else ci.profiles(proj)
    drifts = od.report(proj, profiles, jobs)
    if as_json:
        output.emit_json([d.as_dict() for d in drifts])
    elif not drifts:
        _say_no_profiles(proj)
    else:

        def newer(d: od.Drift, value: str | None) -> str:
            if not d.checked:
                return "n/a"
            return f"[yellow]{value}[/yellow]" if value else "-"

        rows = [
            [
                d.profile,
                d.torch,
                newer(d, d.torch_patch),
                newer(d, d.newer_torch),
                d.numpy,
                newer(d, d.numpy_patch),
                newer(d, d.newer_numpy),
            ]
            for d in drifts
        ]
        columns = ["profile", "torch", "patch", "release", "numpy", "patch", "release"]
        caption = "patch: newest of the pinned series; release: newest series with the same build and Python"
        output.out().print(output.table(None, columns, rows, caption=caption))
        err = output.err()
        for d in drifts:
            for line in [*d.notes, *([d.error] if d.error else [])]:
                err.print(f"{d.profile}: {line}", markup=False)
    failed = [d.profile for d in drifts if d.error]
    if failed:
        raise LockError(f"could not look up {', '.join(failed)}", hint="the lines above say why")
    behind = [d.profile for d in drifts if d.outdated]
    if check and behind:
        raise ProfilesBehind(
            f"{len(behind)} profile(s) behind upstream: {', '.join(behind)}",
            hint="move a pin on purpose: edit torch/numpy in the profile, `envbuild validate NAME` checks the pair, "
            "`envbuild lock NAME --dry-run` shows what would change, then `envbuild lock NAME`",
        )


@app.command()
def render(
    name: str,
    output_dir: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="Write the files here (default: print the Dockerfile)."),
    ] = None,
    base: Annotated[str | None, typer.Option(help="Override the base image.")] = None,
    templates: Annotated[
        Path | None, typer.Option(help="A folder of templates that override the shipped ones.")
    ] = None,
    project: ProjectOpt = None,
) -> None:
    """Render a profile's Dockerfile and lock inputs."""
    from envbuild import profile
    from envbuild import render as r

    proj = _project(project)
    path = proj.profile_path(name)
    prof = profile.load_valid(path, proj.rel(path))
    outputs = r.render(prof, templates_dir=templates or proj.templates_dir, base=base)
    if output_dir is None:
        sys.stdout.write(outputs["Dockerfile"])
        return
    written = r.write_outputs(outputs, output_dir)
    for p in written:
        output.err().print(f"wrote {p}")


@app.command("compat")
def compat_(
    spec: Annotated[str | None, typer.Argument(help='e.g. "torch==2.3.1"')] = None,
    as_json: JsonOpt = False,
) -> None:
    """Show the PyTorch compatibility table, or what one torch release allows."""
    from envbuild import compat
    from envbuild.errors import UsageError

    db = compat.load()
    rows = db.torch
    if spec:
        version = spec.split("==", 1)[1] if "==" in spec else spec
        if spec.startswith("torch") and "==" not in spec:
            raise UsageError(f"{spec!r}: give an exact release", hint='write "torch==2.3.1"')
        row = db.release(version.strip())
        if row is None:
            known = f"{db.torch[0].release}-{db.newest().release}"
            raise UsageError(
                f"torch {version} is not in the compat data ({known})",
                hint="`envbuild compat` lists the releases envbuild knows; a newer torch needs a newer envbuild",
            )
        rows = [row]
    if as_json:
        payload: dict[str, Any] = {
            "schema_version": db.schema_version,
            "collected": db.collected,
            "torch": [r.model_dump() for r in rows],
        }
        if spec:
            r0 = rows[0]
            payload["drivers"] = [d.model_dump() for d in db.drivers if d.cuda in r0.cuda_builds]
            payload["arches"] = [
                a.model_dump()
                for a in db.arches
                if a.cuda in r0.cuda_builds and db.arches_for(a.cuda, r0.release + ".0") == a
            ]
        output.emit_json(payload)
        return
    con = output.out()
    # Seven columns so the table reads on an 80-column terminal; --json has every field.
    unverified = [r.release for r in rows if r.confidence != "verified"]
    caption = "* PyPI's default wheel; the other CUDA builds come from the PyTorch index"
    if unverified:
        caption += f"\n? unverified compat data: {', '.join(unverified)} (see `compat torch==X --json`)"
    con.print(
        output.table(
            f"PyTorch compatibility (collected {db.collected})",
            ["torch", "python", "CUDA builds", "ROCm", "torch\nvision", "torch\naudio", "numpy 2"],
            [
                [
                    r.release + (" ?" if r.confidence != "verified" else ""),
                    f"{r.python[0]}-{r.python[1]}",
                    ", ".join(c + ("*" if c == r.pypi_cuda else "") for c in r.cuda_builds),
                    ", ".join(r.rocm_builds),
                    r.torchvision,
                    r.torchaudio,
                    "yes" if db.numpy2_allowed(r.release) else "no",
                ]
                for r in rows
            ],
            caption=caption,
        )
    )
    if spec:
        r0 = rows[0]
        con.print(
            output.table(
                "CUDA builds: driver floor and GPU architectures",
                ["CUDA", "min driver", "minor-compat floor", "sm"],
                [
                    [
                        c,
                        ((f := db.driver_floor(c)) and f.min_driver) or "?",
                        (f and f.minor_floor) or "?",
                        " ".join(((a := db.arches_for(c, r0.release + ".0")) and a.sm) or ["?"]),
                    ]
                    for c in r0.cuda_builds
                ],
            )
        )
        if r0.notes:
            con.print(f"note: {r0.notes}")


# ---- lockfiles -------------------------------------------------------------------------------


def _names(proj: Any, names: list[str] | None, all_: bool) -> list[str]:
    from envbuild.errors import UsageError

    chosen = list(names or [])
    if all_:
        chosen += [n for n in proj.profile_names() if n not in chosen]
    if not chosen:
        raise UsageError("no profile named", hint="name profiles or pass --all")
    return chosen


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
    index_url: Annotated[str | None, typer.Option(help="A PyPI mirror.")] = None,
    torch_index: Annotated[str | None, typer.Option(help="A mirror of the PyTorch index (URL or folder).")] = None,
    find_links: Annotated[
        list[str] | None, typer.Option("--find-links", help="A local wheelhouse (repeatable).")
    ] = None,
    platform: Annotated[
        list[str] | None,
        typer.Option("--platform", help="x86_64 and/or aarch64 (default: the profile's)."),
    ] = None,
    solver: Annotated[str, typer.Option(help="conda flavor: auto, conda-lock or rattler.")] = "auto",
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Resolve and say what would change; write nothing.")
    ] = False,
    jobs: Annotated[int | None, typer.Option("--jobs", "-j", help="Profiles locked at once.")] = None,
    project: ProjectOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Resolve profiles into hashed lockfiles under lockfiles/<profile>/."""
    from envbuild import lock as lk
    from envbuild.errors import LockCheckFailed, LockError, UsageError

    proj = _project(project)
    chosen = _names(proj, names, all_)
    if check and dry_run:
        raise UsageError("--check and --dry-run do not go together", hint="--check is offline; --dry-run resolves")
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
    )
    outcomes = _with_progress(
        chosen,
        as_json,
        lambda events: lk.lock_many(proj, chosen, opts, jobs or proj.config.lock_jobs, events),
    )
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
    if not as_json and len(failed) > 1:
        # One failure is reported once, by the error it raises below; several each get theirs here.
        for o in failed:
            output.err().print(f"{o.name}: {o.message}", markup=False)
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
            con.print(f"{o.name}: no package {'would change' if dry_run else 'changed'}", markup=False)
            continue
        verb = "would change (dry run, nothing written)" if dry_run else "changed"
        con.print(f"{o.name}: {len(o.changes)} package(s) {verb}", markup=False)
        for change in o.changes:
            con.print(f"  {change.render()}", markup=False)


def _with_progress(names: list[str], quiet: bool, work: Any) -> Any:
    """Run `work(events)` while a live table shows each profile's state (stderr, TTY or not)."""
    import threading
    import time as _time

    states = dict.fromkeys(names, ("queued", ""))
    started = _time.monotonic()
    lock_ = threading.Lock()

    def events(name: str, state: str, detail: str) -> None:
        with lock_:
            states[name] = (state, detail)
        if not console.is_terminal and not quiet:
            console.print(f"{name}: {state} {detail}".rstrip(), markup=False)

    console = output.err()
    if quiet or not console.is_terminal:
        return work(events)
    from rich.live import Live

    def view() -> Any:
        with lock_:
            rows = [[n, s, d] for n, (s, d) in states.items()]
        return output.table(f"envbuild ({_time.monotonic() - started:.0f}s)", ["profile", "state", "detail"], rows)

    with Live(view(), console=console, refresh_per_second=4, get_renderable=view):
        return work(events)


@app.command()
def venv(
    name: str,
    directory: Path,
    python: Annotated[
        str | None,
        typer.Option(help="Interpreter to base the venv on (default: python3.X on PATH)."),
    ] = None,
    force: Annotated[bool, typer.Option(help="Replace a non-empty DIRECTORY.")] = False,
    find_links: Annotated[
        list[str] | None, typer.Option("--find-links", help="A local wheelhouse (repeatable).")
    ] = None,
    index_url: Annotated[str | None, typer.Option(help="A PyPI mirror.")] = None,
    torch_index: Annotated[str | None, typer.Option(help="A mirror of the PyTorch index.")] = None,
    project: ProjectOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Create a local virtual environment from a profile's lockfile (hash-checked)."""
    from envbuild import lock as lk
    from envbuild import profile
    from envbuild import venv as vv

    proj = _project(project)
    path = proj.profile_path(name)
    prof = profile.load_valid(path, proj.rel(path))
    opts = lk.LockOptions(index_url=index_url, torch_index=torch_index, find_links=tuple(find_links or ()))
    result = vv.create(proj, prof, directory, python=python, opts=opts, force=force)
    if as_json:
        output.emit_json(result)
    else:
        output.out().print(
            f"created {result['path']}: Python {result['python']}, {result['packages']} packages "
            f"from {proj.rel(Path(str(result['lockfile'])))}"
        )


# ---- images ------------------------------------------------------------------------------------


def _check_positive_seconds(option: str, value: float, example: int) -> None:
    from envbuild.errors import UsageError

    if value <= 0:
        raise UsageError(f"{option} {value:g}: must be a positive number of seconds", hint=f"e.g. {option} {example}")


def _check_image_ref(option: str, value: str | None) -> None:
    from envbuild.errors import UsageError
    from envbuild.profile import IMAGE_RE

    if value is not None and not IMAGE_RE.fullmatch(value):
        raise UsageError(
            f"{option} {value!r} is not an image reference", hint='write e.g. "ubuntu:22.04@sha256:<digest>"'
        )


def _step_printer(as_json: bool) -> Any:
    """Progress as a person expects: the current step of N and the elapsed time."""
    import time as _time

    console = output.err()
    started = _time.monotonic()
    last_pull = [0.0]

    def events(kind: str, key: str, text: str) -> None:
        if as_json:
            return
        elapsed = _time.monotonic() - started
        if kind == "step":
            console.print(f"[{elapsed:6.1f}s] step {key}: {text}", markup=False, highlight=False)
        elif kind == "phase":
            console.print(f"[{elapsed:6.1f}s] {key}: {text}", markup=False, highlight=False)
        elif kind == "warning":
            console.print(f"[{elapsed:6.1f}s] warning: {text}", style="yellow", markup=False, highlight=False)
        elif kind == "pull" and elapsed - last_pull[0] > 2:
            last_pull[0] = elapsed
            console.print(f"[{elapsed:6.1f}s] pulling {key} {text}", markup=False, highlight=False)

    return events


def _print_smoke(report: dict[str, Any]) -> None:
    from envbuild.smoke import inside

    rows = []
    for c in report["checks"]:
        status = {"pass": "[green]PASS[/green]", "fail": "[red]FAIL[/red]", "skip": "[yellow]SKIP[/yellow]"}[
            c["status"]
        ]
        detail = inside.detail(c)
        if c["status"] == "fail" and c["remedy"]:
            detail += f"\nfix: {c['remedy']}"
        rows.append([c["name"], status, f"{c['seconds']:.2f}", detail])
    con = output.out()
    con.print(output.table(None, ["check", "result", "seconds", "detail"], rows))
    verdict = "[green]passed[/green]" if report["passed"] else "[red]FAILED[/red]: " + ", ".join(report["failed"])
    con.print(f"smoke {verdict} in {report['seconds']:.1f}s")


@app.command()
def build(
    name: str,
    tag: Annotated[
        str | None, typer.Option("--tag", help="Image repository (default: envbuild.toml's, else 'envbuild').")
    ] = None,
    base: Annotated[str | None, typer.Option(help="Override the base image.")] = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Build every step anew.")] = False,
    pull: Annotated[bool, typer.Option("--pull", help="Pull the base image even if present.")] = False,
    ca_bundle: Annotated[
        Path | None, typer.Option("--ca-bundle", help="CA bundle for TLS inside the build (builder stage only).")
    ] = None,
    find_links: Annotated[
        list[str] | None, typer.Option("--find-links", help="Local wheelhouse for locked wheels.")
    ] = None,
    index_url: Annotated[str | None, typer.Option(help="A PyPI mirror for the build (may carry credentials).")] = None,
    torch_index: Annotated[str | None, typer.Option(help="A mirror of the PyTorch index.")] = None,
    no_smoke: Annotated[
        bool, typer.Option("--no-smoke", help="Skip the smoke test (the image gets no smoke label).")
    ] = False,
    gpus: Annotated[str, typer.Option(help="Smoke test GPUs: auto, all, none or a count.")] = "auto",
    smoke_timeout: Annotated[
        float, typer.Option("--smoke-timeout", help="Seconds the smoke test may take before it fails.")
    ] = 600.0,
    builder: Annotated[str, typer.Option(help="docker (the SDK) or buildkit.")] = "docker",
    context_only: Annotated[
        bool, typer.Option("--context-only", help="Only assemble the build context (for bake).")
    ] = False,
    project: ProjectOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Build a profile's image from its lockfile, smoke-test it, then tag it."""
    from envbuild import build as b
    from envbuild import profile
    from envbuild.errors import UsageError

    if builder not in {"docker", "buildkit"}:
        raise UsageError(f"--builder {builder}: unknown", hint="use docker or buildkit")
    _check_image_ref("--base", base)
    _check_positive_seconds("--smoke-timeout", smoke_timeout, 900)
    proj = _project(project)
    path = proj.profile_path(name)
    prof = profile.load_valid(path, proj.rel(path))
    opts = b.BuildOptions(
        repo=tag,
        base=base,
        no_cache=no_cache,
        pull=pull,
        ca_bundle=ca_bundle,
        find_links=tuple(find_links or ()),
        index_url=index_url,
        torch_index=torch_index,
        smoke=not no_smoke,
        smoke_gpus=gpus,
        smoke_timeout=smoke_timeout,
        builder=builder,
    )
    if context_only:
        ctx = b.context_only(proj, prof, opts, _step_printer(as_json))
        if as_json:
            output.emit_json(ctx)
            return
        output.out().print(f"wrote the build context of {name}: {proj.rel(Path(ctx['context']))}", markup=False)
        output.out().print(
            f"  build it with: docker build --target runtime {proj.rel(Path(ctx['context']))}", markup=False
        )
        return
    result = b.build(proj, prof, opts, _step_printer(as_json))
    if as_json:
        from dataclasses import asdict

        output.emit_json(asdict(result))
        return
    if result.smoke:
        _print_smoke(result.smoke)
    con = output.out()
    ran = f"{result.ran_steps} of {result.steps} steps ran" if result.ran_steps else "every step from cache"
    con.print(f"built {result.image_id[:19]} in {result.seconds:.1f}s ({ran})")
    for t in result.tags:
        con.print(f"  tagged {t}")
    con.print(f"  log: {proj.rel(Path(result.log_path))}")
    _say_prunable(proj, prof.name)


def _say_prunable(proj: Any, name: str) -> None:
    """After a build: older images of this profile that `images --prune` would remove, if any."""
    from envbuild import images as images_mod
    from envbuild.errors import EnvbuildError

    try:
        rows = images_mod.survey(proj, [name])[1].rows
    except EnvbuildError:
        return  # the build succeeded; a failed look at the leftovers must not say otherwise
    doomed = [r for r in rows if not r.keep]
    if doomed:
        output.err().print(f"  {len(doomed)} older image(s) of {name} can go: envbuild images --prune {name}")


@app.command()
def smoke(
    target: Annotated[str | None, typer.Argument(help="A profile name or an image reference.")] = None,
    local: Annotated[bool, typer.Option("--local", help="Run the checks in an interpreter here, no Docker.")] = False,
    python: Annotated[str | None, typer.Option(help="--local: the interpreter (default: this one).")] = None,
    gpus: Annotated[str, typer.Option(help="all, none or a count (auto: all when the host has GPUs).")] = "auto",
    json_file: Annotated[Path | None, typer.Option("--json", help="Also write the JSON report here.")] = None,
    timeout: Annotated[float, typer.Option(help="Seconds before the whole run is stopped.")] = 600.0,
    shm_size: Annotated[str, typer.Option(help="Size of the container's shared memory (shm).")] = "2g",
    ipc_host: Annotated[bool, typer.Option("--ipc-host", help="Share the host's IPC namespace instead.")] = False,
    lock_match: Annotated[str, typer.Option(help="--local: exact, pins or none.")] = "pins",
    tag: Annotated[str | None, typer.Option("--tag", help="Image repository the profile was built into.")] = None,
    project: ProjectOpt = None,
) -> None:
    """Prove that an image (or this interpreter) really trains: GPU kernels, cuDNN, DDP, AMP."""
    import json as _json

    from envbuild import build as b
    from envbuild import engine, profile
    from envbuild.errors import SmokeFailed, UsageError
    from envbuild.smoke import host

    _check_positive_seconds("--timeout", timeout, 600)

    proj = _project(project)
    prof = None
    if (target and (proj.profiles_dir / f"{target}.yaml").is_file()) or (target and target.endswith((".yaml", ".yml"))):
        path = proj.profile_path(target)
        prof = profile.load_valid(path, proj.rel(path))
    if local:
        if prof is None:
            raise UsageError("--local needs a profile name", hint="envbuild smoke --local cpu-py311")
        if lock_match not in {"exact", "pins", "none"}:
            raise UsageError(f"--lock-match {lock_match!r}: use exact, pins or none")
        from envbuild import lock as lk

        # `none` checks the interpreter against the profile alone: a GPU host's own torch install
        # has no lockfile of envbuild's to compare with
        lock_file = None if lock_match == "none" else lk.require_fresh(proj, prof) / "requirements.lock"
        expect = b.expectations(prof, lock_file)
        report = host.run_local(
            expect, python=python, gpus=gpus, timeout=min(timeout, 300), lock_match=lock_match, wall_timeout=timeout
        )
    else:
        if target is None:
            raise UsageError("name a profile or an image")
        cli = engine.client()
        accelerator = "cpu"
        if prof is not None:
            accelerator = prof.accelerator
            result_file = b.build_dir(proj, prof) / "result.json"
            image = f"{b.repository(proj, b.BuildOptions(repo=tag))}:{prof.name}"
            if result_file.is_file():
                image = _json.loads(result_file.read_text())["built_image_id"]
            engine.local_image(cli, image, prof.name)  # an unknown image is a usage error, not a failed smoke run
        else:
            image = target
            accelerator = engine.labels_of(cli, image).get("io.envbuild.accelerator", "cpu")
        if gpus == "auto":
            # A GPU profile asks for its GPUs even where there are none: its gpu check then fails, as it should.
            gpus = "all" if accelerator != "cpu" else "none"
        report = host.run_in_image(
            cli, image, gpus=gpus, timeout=timeout, accelerator=accelerator, shm_size=shm_size, ipc_host=ipc_host
        )
        if prof is not None:
            host.save_report(b.build_dir(proj, prof) / "smoke.json", report)
    if json_file:
        host.save_report(json_file, report)
    _print_smoke(report)
    if not report["passed"]:
        raise SmokeFailed(f"smoke failed: {', '.join(report['failed'])}")


# ---- publishing and using images -----------------------------------------------------------------


def _load(proj: Any, name: str) -> Any:
    from envbuild import profile

    path = proj.profile_path(name)
    return profile.load_valid(path, proj.rel(path))


@app.command()
def push(
    name: str,
    tag: Annotated[str | None, typer.Option("--tag", help="Local image repository (as build --tag named it).")] = None,
    registry: Annotated[str | None, typer.Option(help="HOST[:PORT]/PATH to push to.")] = None,
    project: ProjectOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Push a smoke-tested image as REGISTRY/PATH:NAME and :NAME-<lock digest>."""
    from envbuild import publish

    proj = _project(project)
    res = publish.push(proj, _load(proj, name), repo=tag, registry=registry, events=_step_printer(as_json))
    if as_json:
        output.emit_json({"image_id": res.image_id, "refs": res.refs, "digest": res.digest})
        return
    con = output.out()
    for ref in res.refs:
        con.print(f"pushed {ref}")
    con.print(f"manifest digest: {res.digest}")


@app.command()
def pull(
    name: str,
    registry: Annotated[str | None, typer.Option(help="HOST[:PORT]/PATH to pull from.")] = None,
    digest: Annotated[str | None, typer.Option(help="Pull by digest (sha256:...) instead of the moving tag.")] = None,
    tag: Annotated[
        str | None, typer.Option("--tag", help="Local repository to tag it in (default: envbuild.toml's).")
    ] = None,
    verify: Annotated[
        bool, typer.Option("--verify", help="Fail when the image differs from the local lockfile.")
    ] = False,
    project: ProjectOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Pull a profile's published image and compare it with the local profile and lockfile."""
    from envbuild import publish

    proj = _project(project)
    res = publish.pull(
        proj,
        _load(proj, name),
        registry=registry,
        repo=tag,
        digest=digest,
        verify=verify,
        events=_step_printer(as_json),
    )
    ns = "io.envbuild"
    facts = {
        "ref": res.ref,
        "image_id": res.image_id,
        "digest": res.digest,
        "torch": res.labels.get(f"{ns}.torch"),
        "cuda": res.labels.get(f"{ns}.cuda"),
        "rocm": res.labels.get(f"{ns}.rocm"),
        "python": res.labels.get(f"{ns}.python"),
        "created": res.labels.get("org.opencontainers.image.created"),
        "smoke": res.labels.get(f"{ns}.smoke", "not tested"),
        "mismatches": res.mismatches,
        "tags": res.tags,
    }
    if as_json:
        output.emit_json(facts)
        return
    con = output.out()
    con.print(f"pulled {res.ref} ({res.digest})")
    con.print(
        f"  torch {facts['torch']}, "
        + (f"CUDA {facts['cuda']}, " if facts["cuda"] else "")
        + (f"ROCm {facts['rocm']}, " if facts["rocm"] else "")
        + f"Python {facts['python']}, "
        f"created {facts['created']}, smoke {facts['smoke']}"
    )
    for t in res.tags:
        con.print(f"  tagged {t}")
    for m in res.mismatches:
        output.err().print(f"warning: {m} (use --verify to make this an error)", markup=False)


def _size(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB"


@app.command()
def images(
    names: ProfilesArg = None,
    prune: Annotated[
        bool, typer.Option("--prune", help="Remove stale and leftover images (never current, tagged NAME, or in use).")
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="With --prune: say what would go, remove nothing.")
    ] = False,
    project: ProjectOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """This project's images in the engine: current, stale (an older lockfile), leftovers; --prune frees them."""
    from envbuild import images as images_mod
    from envbuild.errors import UsageError

    if dry_run and not prune:
        raise UsageError("--dry-run goes with --prune", hint="envbuild images --prune --dry-run")
    proj = _project(project)
    if prune:
        result = images_mod.prune(proj, names, dry_run=dry_run, events=_step_printer(as_json))
    else:
        result = images_mod.survey(proj, names)[1]
    if as_json:
        output.emit_json(
            {
                "images": [r.as_dict() for r in result.rows],
                "pruned": prune and not dry_run,
                "freed_bytes": result.freed_bytes,
                "errors": result.errors,
            }
        )
        return
    con = output.out()
    if not result.rows:
        con.print("no images of this project in the engine" + (f" for {', '.join(names)}" if names else ""))
        return

    def tags_cell(r: Any) -> str:
        if r.stage == "builder":
            return "(builder stage)"
        return " ".join(t.rsplit(":", 1)[-1] for t in r.tags) or "-"

    def action(r: Any) -> str:
        if r.removed:
            return "removed"
        if r.keep:
            return f"keep ({r.reason})"
        return "would remove" if prune else "can go"

    con.print(
        output.table(
            None,
            ["profile", "image", "tags", "built", "size", "smoke", "state", "prune"],
            [
                [
                    r.profile,
                    r.image_id[7:19],
                    tags_cell(r),
                    r.created[:16].replace("T", " "),
                    _size(r.size),
                    r.smoke,
                    r.state,
                    action(r),
                ]
                for r in result.rows
            ],
            caption="stale: built from another lockfile or profile; untagged: a failed smoke test or a replaced "
            "build; builder stage: a build's cache (the newest of today's lockfile stays). Sizes count shared layers "
            "in full. --json says why for each.",
        ),
        markup=False,
    )
    doomed = [r for r in result.rows if not r.keep]
    removed = [r for r in result.rows if r.removed]
    if prune and not dry_run:
        freed = result.freed_bytes or 0
        shared = " (their layers are shared with images that stay)" if removed and not freed else ""
        con.print(f"removed {len(removed)} image(s); the engine's disk use fell by {_size(freed)}{shared}")
    elif doomed and dry_run:
        con.print(f"{len(doomed)} image(s) would go; run without --dry-run to remove them")
    elif doomed:
        con.print(f"{len(doomed)} image(s) can go: envbuild images --prune")
    for e in result.errors:
        output.err().print(f"kept {e}", markup=False)


@app.command()
def status(
    names: ProfilesArg = None,
    project: ProjectOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Where each profile stands: valid, lockfile fresh, image built from it and tested; and the next command."""
    from envbuild import status as status_mod

    proj = _project(project)
    if names:
        for name in names:
            proj.profile_path(name)  # an unknown name is a usage error with the list of profiles
    rows, note = status_mod.status(proj, names)
    if as_json:
        output.emit_json({"profiles": [r.as_dict() for r in rows], "note": note or None})
        return
    if not rows:
        _say_no_profiles(proj)
        return
    output.out().print(
        output.table(
            None,
            ["profile", "valid", "lockfile", "image", "next"],
            [
                [
                    r.profile,
                    "yes" if r.valid else "no",
                    r.lockfile,
                    r.image + (f" ({r.image_ref.rsplit('/', 1)[-1]})" if r.image_ref else ""),
                    r.next or "ready",
                ]
                for r in rows
            ],
        ),
        markup=False,
    )
    for r in rows:
        if r.problem:
            output.err().print(f"{r.profile}: {r.problem}", markup=False)
    if note:
        output.err().print(f"note: {note}", markup=False)


@app.command("matrix")
def matrix_(
    fmt: Annotated[str, typer.Option("--format", help="github, json or bake.")] = "github",
    tag: Annotated[str | None, typer.Option("--tag", help="Image repository for bake targets.")] = None,
    project: ProjectOpt = None,
) -> None:
    """The shipped profiles as a CI matrix (GitHub Actions, JSON) or a docker-bake.json."""
    from envbuild import ci
    from envbuild.errors import UsageError

    proj = _project(project)
    if fmt == "github":
        sys.stdout.write(__import__("json").dumps(ci.github_matrix(proj), separators=(",", ":")) + "\n")
    elif fmt == "json":
        output.emit_json(ci.matrix(proj))
    elif fmt == "bake":
        output.emit_json(ci.bake(proj, tag or proj.config.repository))
    else:
        raise UsageError(f"--format {fmt}: unknown", hint="use github, json or bake")


ci_app = typer.Typer(help="Generate CI configuration.", no_args_is_help=True)
app.add_typer(ci_app, name="ci")


@ci_app.command("github")
def ci_github(
    output_file: Annotated[Path | None, typer.Option("--output", "-o", help="Write the workflow here.")] = None,
    check: Annotated[
        bool, typer.Option("--check", help="Exit 1 if the file differs from what would be generated.")
    ] = False,
    registry: Annotated[str, typer.Option(help="Where main pushes images.")] = "ghcr.io/${{ github.repository }}",
    project: ProjectOpt = None,
) -> None:
    """A GitHub Actions workflow: lock check, matrix build + smoke, push on main."""
    from envbuild import ci

    proj = _project(project)
    _write_or_check(
        ci.github_workflow(proj, registry), output_file, check, "the generated workflow", "envbuild ci github"
    )


def _write_or_check(text: str, output_file: Path | None, check: bool, what: str, command: str) -> None:
    """Generated files: print, write atomically, or (--check) exit 1 when the committed copy drifted."""
    from envbuild.errors import LockCheckFailed, StaleLock, UsageError
    from envbuild.fsutil import atomic_write_many

    if check:
        if output_file is None:
            raise UsageError("--check needs -o FILE", hint=f"{command} --check -o FILE")
        current = output_file.read_text() if output_file.is_file() else ""
        if current != text:
            raise LockCheckFailed([StaleLock(str(output_file), f"differs from {what}", f"{command} -o {output_file}")])
        output.out().print(f"{output_file} is current")
        return
    if output_file is None:
        sys.stdout.write(text)
        return
    atomic_write_many({output_file: text})
    output.err().print(f"wrote {output_file}")


@app.command()
def schema(
    output_file: Annotated[Path | None, typer.Option("--output", "-o", help="Write the schema here.")] = None,
    check: Annotated[
        bool, typer.Option("--check", help="Exit 1 if the file differs from what would be generated.")
    ] = False,
) -> None:
    """The JSON Schema of a profile file, for editors (completion, descriptions, typos, unquoted versions)."""
    from envbuild.profile import file_schema_text

    _write_or_check(file_schema_text(), output_file, check, "this envbuild's profile schema", "envbuild schema")


@app.command()
def doctor(project: ProjectOpt = None, as_json: JsonOpt = False) -> None:
    """Check this host: engine, driver, GPUs, container runtime, /dev/shm, and which profiles run here."""
    from envbuild import doctor as d

    proj = _project(project)
    report = d.doctor(proj)
    if as_json:
        output.emit_json(report.as_dict())
        return
    con = output.out()
    eng = report.engine
    if eng.get("reachable"):
        con.print(f"engine: reachable, {eng.get('version')} (API {eng.get('api')}) at {eng.get('url')}")
        if eng.get("free_bytes") is not None:
            con.print(f"  disk: {_size(eng['free_bytes'])} free at {eng.get('data_root')}")
    else:
        con.print(f"engine: NOT reachable: {eng.get('error')}\n  fix: {eng.get('hint')}")
    con.print(
        f"NVIDIA driver: {report.nvidia_driver or 'none'}"
        + (f" (CUDA {report.driver_cuda})" if report.driver_cuda else "")
    )
    for g in report.gpus:
        con.print(f"  GPU {g.index}: {g.name}, sm_{g.capability.replace('.', '')}, {g.memory_mib} MiB")
    con.print(f"ROCm devices: {', '.join(report.rocm_devices) or 'none'}")
    con.print(f"NVIDIA container runtime: {'yes' if report.nvidia_runtime else 'no'}")
    shm = f"{report.shm_bytes // 2**20} MiB" if report.shm_bytes else "unknown"
    con.print(f"shared memory (/dev/shm): {shm}")
    for note in report.notes:
        con.print(f"note: {note}")
    con.print(
        output.table(
            None,
            ["profile", "runs here", "why"],
            [[p["profile"], "yes" if p["runs_here"] else "no", p["why"]] for p in report.profiles],
        )
    )


@app.command("run", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def run_image(
    ctx: typer.Context,
    name: str,
    tag: Annotated[str | None, typer.Option("--tag", help="Image repository (as build --tag named it).")] = None,
    gpus: Annotated[str, typer.Option(help="all, none or a count.")] = "auto",
    ipc_host: Annotated[
        bool, typer.Option("--ipc-host", help="Share the host's IPC namespace (NCCL, DataLoader).")
    ] = False,
    shm_size: Annotated[str, typer.Option(help="Shared memory size when not --ipc-host.")] = "8g",
    project: ProjectOpt = None,
) -> int:
    """Run the profile's image here: GPUs, shared memory, this folder as /workspace. `envbuild run NAME -- CMD`."""
    import subprocess

    from envbuild import engine, runner

    proj = _project(project)
    prof = _load(proj, name)
    image = f"{tag or proj.config.repository}:{prof.name}"
    # `docker run` would otherwise go looking for the image on Docker Hub and fail there.
    engine.local_image(engine.client(), image, prof.name)
    argv = runner.docker_argv(
        prof,
        image,
        list(ctx.args),
        workdir=Path.cwd(),
        gpus=gpus,
        ipc_host=ipc_host,
        shm_size=shm_size,
        tty=sys.stdin.isatty() and sys.stdout.isatty(),
    )
    return subprocess.call(argv)


# ---- entry point -------------------------------------------------------------------------------


def prepare() -> None:
    """Build the command tree now (the entry point does it with the garbage collector paused)."""
    _command()


@functools.cache
def _command() -> Any:
    # Building click's command tree from the typer app costs ~30 ms; build it once per process.
    from envbuild import _typerspeed

    _typerspeed.install()
    return typer.main.get_command(app)


def run(argv: list[str] | None = None) -> int:
    """Run the CLI and return the exit code; the one place errors become numbers."""
    from envbuild.errors import exit_code_for

    command = _command()
    output.reset_json()
    try:
        result = command.main(args=argv, prog_name="envbuild", standalone_mode=False)
    except EnvbuildError as exc:
        code = exit_code_for(exc)
        if output.json_pending():
            output.emit_json({"error": {**exc.as_dict(), "exit_code": code}})
        sys.stdout.flush()  # keep the report above the error line when both go to one terminal
        output.err().print(f"error: {exc}", markup=False)
        return code
    except typer.Exit as exc:
        return int(exc.exit_code)
    except typer.Abort:
        return 130
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        show, usage_code = getattr(exc, "show", None), getattr(exc, "exit_code", None)
        if callable(show) and isinstance(usage_code, int):
            # typer's (vendored click's) usage errors; envbuild must not need click installed
            show()
            return usage_code
        import os
        import traceback

        sys.stdout.flush()
        output.err().print(f"internal error: {type(exc).__name__}: {exc}", markup=False)
        if os.environ.get("ENVBUILD_DEBUG"):
            output.err().print(traceback.format_exc(), markup=False)
        else:
            output.err().print(
                "  this is a bug in envbuild; rerun with ENVBUILD_DEBUG=1 for details and report it", markup=False
            )
        return 70
    return result if isinstance(result, int) else 0
