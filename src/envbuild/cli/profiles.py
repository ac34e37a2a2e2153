"""Commands on profiles: list, show, validate, new, outdated, render, compat, schema."""

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from envbuild import output, refs

if TYPE_CHECKING:
    from rich.text import Text
from envbuild.cli._common import (
    JsonOpt,
    NameArg,
    ProjectOpt,
    app,
    check_jobs,
    load_profile,
    pick_profiles,
    profile_table,
    project_at,
    say_no_profiles,
    write_or_check,
)


@app.command("list")
def list_(project: ProjectOpt = None, as_json: JsonOpt = False) -> None:
    """List the project's profiles."""
    from envbuild import profilefile

    proj = project_at(project)
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
    table = [
        [
            r["name"],
            r["accelerator"] + (f" {r['accelerator_version']}" if r["accelerator_version"] else ""),
            r["python"],
            r["torch"],
            r["numpy"],
            r["flavor"],
        ]
        for r in rows
    ]
    if profile_table(proj, as_json, rows, ["name", "accelerator", "python", "torch", "numpy", "flavor"], table):
        output.err().print(f"images: {proj.repository}:NAME")


@app.command()
def show(name: NameArg, project: ProjectOpt = None, as_json: JsonOpt = False) -> None:
    """Show a profile as resolved after `extends`."""

    proj = project_at(project)
    prof = load_profile(proj, name)
    data = prof.model_dump(mode="json")
    data["digest"] = prof.digest()
    if as_json:
        output.emit_json(data)
        return
    import yaml

    # What the profile sets and what it inherits, not a page of unset fields (`--json` has them all)
    shown = {k: v for k, v in data.items() if v is not None and v not in ([], {})}
    if prof.flavor != "conda":  # conda channels: a venv profile has the field's default, never reads it
        shown.pop("channels", None)
    output.out().print(yaml.safe_dump(shown, sort_keys=False).rstrip())


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
    from envbuild.errors import Diagnostic, ProfileError, UsageError
    from envbuild.profilefile import Loaded

    proj = project_at(project)
    names = pick_profiles(proj, targets, all_, "validate")
    results = []
    for target in names:
        try:
            path = proj.profile_path(target)
        except UsageError as exc:
            if not all_:
                raise
            # one broken entry (a link that leads nowhere) must not stop the others from being checked
            shown = f"{proj.rel(proj.profiles_dir)}/{target}.yaml"
            broken = Loaded(path=proj.profiles_dir / f"{target}.yaml", shown=shown)
            message = exc.message.removeprefix(f"{shown}: ")
            broken.diagnostics.append(Diagnostic("error", shown, None, "", message, exc.hint))
            results.append(broken)
            continue
        results.append(v.check(path, proj.rel(path), proj.root))
    failed = [r for r in results if r.errors or (strict and r.warnings)]
    if as_json:
        output.emit_json({"valid": not failed, "profiles": [r.report() for r in results]})
    else:
        con = output.out()
        for r in results:
            for d in r.errors:
                con.print(output.styled(("error", "red"), " ", d.render()))
            for d in r.warnings:
                con.print(output.styled(("warning", "yellow"), " ", d.render()))
        ok = len(results) - len(failed)
        con.print(f"{ok} of {len(results)} profile(s) valid")
    from envbuild import lock

    lock.prepare_validated(proj, results)  # the lock that comes next starts early (lockahead)
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
    extends: Annotated[
        str | None,
        typer.Option(help="Derive it from this profile: its torch, numpy and settings; its pins at the first lock."),
    ] = None,
    project: ProjectOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Write a new profile, choosing torch and numpy from the compat data; it validates before it is written."""
    from envbuild import scaffold

    proj = project_at(project)
    made = scaffold.create(
        proj, name, torch=torch, numpy=numpy, index_url=index_url, base=base, force=force, extends=extends
    )
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
    err.print(f"wrote {proj.rel(made.path)}")
    for line in made.notes:
        err.print(f"note: {line}")
    for line in made.warnings:
        err.print(f"warning: {line}")
    err.print(f"next: {' && '.join(nxt)}")


@app.command()
def outdated(
    names: Annotated[list[str] | None, typer.Argument(help="Profiles (default: all of them).")] = None,
    check: Annotated[bool, typer.Option(help="Exit 1 when any profile is behind (a scheduled CI job).")] = False,
    jobs: Annotated[int, typer.Option("--jobs", "-j", help="Profiles looked up at once.")] = 4,
    project: ProjectOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """What upstream released since the profiles were pinned: newer patches, and newer releases that fit."""
    from envbuild import outdated as od
    from envbuild.errors import LockError, ProfileError, ProfilesBehind

    proj = project_at(project)
    check_jobs(jobs)
    invalid: list[str] = []
    if names:
        drifts = od.report(proj, [load_profile(proj, n) for n in names], jobs)
    else:
        drifts, invalid = od.report_all(proj, jobs)
    if as_json:
        output.emit_json([d.as_dict() for d in drifts])
    elif not drifts:
        say_no_profiles(proj)
    else:

        def newer(d: od.Drift, value: str | None) -> "str | Text":
            if not d.checked:
                return "n/a"
            return output.styled((value, "yellow")) if value else "-"

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
                err.print(f"{d.profile}: {line}")
    if invalid:
        raise ProfileError(f"{len(invalid)} profile(s) invalid: {', '.join(invalid)}", hint="envbuild validate --all")
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
    name: NameArg,
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
    from envbuild import plan as pl
    from envbuild import render as r

    refs.check("--base", base, "image")
    proj = project_at(project)
    prof = load_profile(proj, name)
    plan = pl.make(proj, prof, pl.PlanOptions(base=base, templates_dir=templates), strict=False)
    outputs = r.render(plan)
    if output_dir is None:
        sys.stdout.write(outputs["Dockerfile"])
        return
    written = r.write_outputs(outputs, output_dir)
    for p in written:
        output.err().print(f"wrote {p}")


@app.command("compat")
def compat_(
    spec: Annotated[str | None, typer.Argument(help='e.g. "torch==2.3.1"')] = None,
    sources: Annotated[
        bool, typer.Option("--sources", help="Where each value came from, and how sure envbuild is of it.")
    ] = False,
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
    if sources:
        table = compat.provenance(db, rows)
        if as_json:
            output.emit_json({"sources": db.sources, "values": table})
            return
        output.out().print(
            output.table(
                "Where each value came from",
                ["torch", "field", "source", "confidence"],
                [[t["torch"], t["field"], t["source"], t["confidence"]] for t in table],
                caption="\n".join(f"{k}: {v}" for k, v in sorted(db.sources.items())),
            )
        )
        return
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


@app.command()
def schema(
    output_file: Annotated[Path | None, typer.Option("--output", "-o", help="Write the schema here.")] = None,
    check: Annotated[
        bool, typer.Option("--check", help="Exit 1 if the file differs from what would be generated.")
    ] = False,
) -> None:
    """The JSON Schema of a profile file, for editors (completion, descriptions, typos, unquoted versions)."""
    from envbuild.profile import file_schema_text

    write_or_check(file_schema_text(), output_file, check, "this envbuild's profile schema", "envbuild schema")
