"""Commands on images: build, smoke, images."""

from pathlib import Path
from typing import Annotated, Any

import typer

from envbuild import output, refs
from envbuild.cli._common import (
    FindLinksOpt,
    IndexUrlOpt,
    JsonOpt,
    NameArg,
    ProfilesArg,
    ProjectOpt,
    RepoOpt,
    TorchIndexOpt,
    app,
    check_indexes,
    check_python,
    load_profile,
    note_if_stale,
    project_at,
    size_text,
    step_printer,
)


def _check_positive_seconds(option: str, value: float, example: int) -> None:
    from envbuild.errors import UsageError

    if value <= 0:
        raise UsageError(f"{option} {value:g}: must be a positive number of seconds", hint=f"e.g. {option} {example}")


def _print_smoke(report: dict[str, Any], con: Any) -> None:
    from envbuild.smoke.inside.report import detail as check_detail
    from envbuild.smoke.inside.report import only_note

    rows = []
    for c in report["checks"]:
        status = output.styled((c["status"].upper(), {"pass": "green", "fail": "red", "skip": "yellow"}[c["status"]]))
        detail = check_detail(c)
        if c["status"] == "fail" and c["remedy"]:
            detail += f"\nfix: {c['remedy']}"
        rows.append([c["name"], status, f"{c['seconds']:.2f}", detail])
    con.print(output.table(None, ["check", "result", "seconds", "detail"], rows))
    verdict = ("passed", "green") if report["passed"] else ("FAILED", "red")
    failed = f": {', '.join(report['failed'])}" if report["failed"] else ""
    ref, image = report.get("ref"), report.get("image", "")
    # an image named by its id is shown once, short
    tested = f" ({ref}, {image[:19]})" if ref and ref != image else f" ({image[:19]})" if ref else ""
    con.print(output.styled("smoke ", verdict, f"{failed} in {report['seconds']:.1f}s{tested}{only_note(report)}"))


@app.command()
def build(
    name: NameArg,
    tag: RepoOpt = None,
    base: Annotated[str | None, typer.Option(help="Override the base image.")] = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Build every step anew.")] = False,
    pull: Annotated[bool, typer.Option("--pull", help="Pull the base image even if present.")] = False,
    ca_bundle: Annotated[
        Path | None, typer.Option("--ca-bundle", help="CA bundle for TLS inside the build (builder stage only).")
    ] = None,
    find_links: FindLinksOpt = None,
    index_url: IndexUrlOpt = None,
    torch_index: TorchIndexOpt = None,
    no_smoke: Annotated[
        bool, typer.Option("--no-smoke", help="Skip the smoke test (the image gets no smoke label).")
    ] = False,
    gpus: Annotated[
        str | None,
        typer.Option(
            help="Smoke test GPUs: auto (default: all, or none on a host without any), all, none or a count.",
            show_default=False,
        ),
    ] = None,
    smoke_timeout: Annotated[
        float | None,
        typer.Option(
            "--smoke-timeout", help="Seconds the smoke test may take before it fails (default 600).", show_default=False
        ),
    ] = None,
    builder: Annotated[str, typer.Option(help="docker (the SDK) or buildkit.")] = "docker",
    context_only: Annotated[
        bool, typer.Option("--context-only", help="Only assemble the build context (for bake).")
    ] = False,
    project: ProjectOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Build a profile's image from its lockfile, smoke-test it, then tag it."""
    from envbuild import build as b
    from envbuild.errors import UsageError

    if builder not in {"docker", "buildkit"}:
        raise UsageError(f"--builder {builder}: unknown", hint="use docker or buildkit")
    refs.check("--base", base, "image")
    refs.check("--tag", tag, "repository")
    check_indexes(index_url, torch_index)
    if no_smoke or context_only:
        mode = "--no-smoke" if no_smoke else "--context-only"
        for option, given in (("--gpus", gpus), ("--smoke-timeout", smoke_timeout)):
            if given is not None:
                raise UsageError(
                    f"{option} is for the smoke test, and {mode} runs none", hint=f"drop {option}, or drop {mode}"
                )
    if smoke_timeout is not None:
        _check_positive_seconds("--smoke-timeout", smoke_timeout, 900)
    proj = project_at(project)
    prof = load_profile(proj, name)
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
        # None only says "not given" (for the --no-smoke check above): BuildOptions' defaults stand
        smoke_gpus=b.BuildOptions.smoke_gpus if gpus is None else gpus,
        smoke_timeout=b.BuildOptions.smoke_timeout if smoke_timeout is None else smoke_timeout,
        builder=builder,
    )
    if context_only:
        ctx = b.context_only(proj, prof, opts, step_printer())
        if as_json:
            output.emit_json(ctx)
            return
        output.out().print(f"wrote the build context of {name}: {proj.rel(Path(ctx['context']))}")
        output.out().print(f"  build it with: docker build --target runtime {proj.rel(Path(ctx['context']))}")
        return
    result = b.build(proj, prof, opts, step_printer())
    if as_json:
        from dataclasses import asdict

        output.emit_json(asdict(result))
        return
    con = output.out()
    if result.smoke and result.smoke.get("reused"):
        saved = proj.rel(proj.smoke_report(prof.name))
        con.print(output.styled("smoke ", ("passed", "green"), f" before on this very image, not run again ({saved})"))
    elif result.smoke:
        _print_smoke(result.smoke, con)
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
    gpus: Annotated[
        str, typer.Option(help="auto (all; a GPU profile fails its gpu check on a host without any), none or a count.")
    ] = "auto",
    json_file: Annotated[
        Path | None,
        typer.Option(
            "--json",
            help="Also write the JSON report to this file; alone (or -) puts it on stdout, the table on stderr.",
        ),
    ] = None,
    timeout: Annotated[float, typer.Option(help="Seconds before the whole run is stopped.")] = 600.0,
    shm_size: Annotated[
        str | None, typer.Option(help="Size of the container's shared memory (default 2g).", show_default=False)
    ] = None,
    ipc_host: Annotated[bool, typer.Option("--ipc-host", help="Share the host's IPC namespace instead.")] = False,
    lock_match: Annotated[
        str | None,
        typer.Option(
            help="exact (an image's default), pins (--local's default; for a derived image) or none.",
            show_default=False,
        ),
    ] = None,
    min_peak: Annotated[
        float | None,
        typer.Option(help="Fail the perf check when a GPU measures under this % of its datasheet peak."),
    ] = None,
    only: Annotated[
        list[str] | None,
        typer.Option(
            "--only",
            help="Run only these checks (repeatable or comma-separated): versions, ddp, compile, ..., or check:FILE "
            "for a profile's own.",
            show_default=False,
        ),
    ] = None,
    tag: RepoOpt = None,
    project: ProjectOpt = None,
) -> None:
    """Prove that an image (or this interpreter) really trains: GPU kernels, cuDNN, DDP, AMP."""
    from envbuild import hostgpu
    from envbuild.errors import SmokeFailed, UsageError
    from envbuild.names import SMOKE_SHM_SIZE
    from envbuild.smoke import host, options
    from envbuild.smoke.inside.report import only_names

    _check_positive_seconds("--timeout", timeout, 600)
    refs.check("--tag", tag, "repository")
    only = only_names(only)
    options.check(
        local,
        target,
        python=python,
        lock_match=lock_match,
        min_peak=min_peak,
        shm_size=shm_size,
        ipc_host=ipc_host,
        tag=tag,
        only=only,
    )
    hostgpu.check_shm_choice(shm_size, ipc_host, f"envbuild smoke {target or 'NAME'}")
    check_python(python)
    if target is None and json_file is not None and str(json_file) != "-":
        # said before the report's folder is made: `smoke --json IMAGE` takes the image for the file
        raise UsageError(
            f"name a profile or an image; --json took {json_file} for the report's file (`--json -` is stdout)"
        )
    # `--json -`: what `--json` is everywhere else (the report on stdout, for jq), as a file option
    to_stdout = json_file is not None and str(json_file) == "-"
    if to_stdout:
        output.json_requested(True)  # an error before the report then comes as JSON too
    elif json_file:
        from envbuild import fsutil  # not at import: every command's start-up would pay for it

        fsutil.check_writable(json_file)
    proj = project_at(project)
    prof = None
    if (target and (proj.profiles_dir / f"{target}.yaml").is_file()) or (target and target.endswith((".yaml", ".yml"))):
        prof = load_profile(proj, target)
    if local:
        if target is None:
            raise UsageError("--local needs a profile name", hint="envbuild smoke --local cpu-py311")
        if prof is None:
            prof = load_profile(proj, target)  # not a profile: its error names the closest one
        report = host.smoke_profile_here(
            proj,
            prof,
            python=python,
            gpus=gpus,
            timeout=timeout,
            lock_match="pins" if lock_match is None else lock_match,
            min_peak=min_peak,
            only=only,
        )
    else:
        if target is None:
            raise UsageError("name a profile or an image")
        report = host.smoke_image(
            proj,
            target,
            prof,
            repo=tag,
            gpus=gpus,
            timeout=timeout,
            shm_size=SMOKE_SHM_SIZE if shm_size is None else shm_size,
            ipc_host=ipc_host,
            min_peak=min_peak,
            lock_match=lock_match,
            only=only,
        )
    _print_smoke(report, output.err() if to_stdout else output.out())
    if prof is not None and not local:
        from envbuild import engine

        cli = engine.client()
        note_if_stale(proj, prof, report["ref"], dict(engine.local_image(cli, report["ref"]).labels or {}), cli)
    if report.get("smoke_record") == "altered":
        from envbuild import smokerecord

        shown = report.get("ref") or report.get("image", "")[:19]
        output.err().print(f"note: {shown} is not an image that passed before: {smokerecord.ALTERED}")
    if to_stdout:
        output.emit_json(report)
    elif json_file:
        host.save_report(json_file, report)
    if not report["passed"]:
        raise SmokeFailed(f"smoke failed: {', '.join(report['failed'])}")


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
    proj = project_at(project)
    if prune:
        result = images_mod.prune(proj, names, dry_run=dry_run, events=step_printer())
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
        # this project's repository is implied; a registry's or another repository's ref is shown whole,
        # or six pulled and local copies would all read "cpu-py311"
        local = f"{proj.repository}:"
        return " ".join(t.removeprefix(local) for t in r.tags) or "-"

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
                    size_text(r.size),
                    r.smoke + (", no GPU" if r.smoke_gpu == "skip" else ""),
                    r.state,
                    action(r),
                ]
                for r in result.rows
            ],
            caption="stale: built from another lockfile or profile; untagged: a failed smoke test or a replaced "
            "build; builder stage: a build's cache (the newest of today's lockfile stays). Sizes count shared layers "
            "in full. --json says why for each.",
        ),
    )
    doomed = [r for r in result.rows if not r.keep]
    removed = [r for r in result.rows if r.removed]
    if prune and not dry_run:
        freed = result.freed_bytes or 0
        shared = " (their layers are shared with images that stay)" if removed and not freed else ""
        con.print(f"removed {len(removed)} image(s); the engine's disk use fell by {size_text(freed)}{shared}")
    elif doomed and dry_run:
        con.print(f"{len(doomed)} image(s) would go; run without --dry-run to remove them")
    elif doomed:
        con.print(f"{len(doomed)} image(s) can go: envbuild images --prune")
    for e in result.errors:
        output.err().print(f"kept {e}")
