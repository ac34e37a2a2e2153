"""Commands about the whole project and this host: status, matrix, ci, doctor, run."""

import sys
from pathlib import Path
from typing import Annotated

import typer

from envbuild import output
from envbuild.cli._common import (
    JsonOpt,
    NameArg,
    ProfilesArg,
    ProjectOpt,
    RepoOpt,
    app,
    load_profile,
    note_if_stale,
    profile_table,
    project_at,
    size_text,
    write_or_check,
)


@app.command()
def status(
    names: ProfilesArg = None,
    project: ProjectOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Where each profile stands: valid, lockfile fresh, image built from it and tested; and the next command."""
    from envbuild import status as status_mod

    proj = project_at(project)
    if names:
        for name in names:
            proj.profile_path(name)  # an unknown name is a usage error with the list of profiles
    rows, note = status_mod.status(proj, names)
    table = [
        [
            r.profile,
            "yes" if r.valid else "no",
            r.lockfile,
            r.image
            + (", no GPU" if r.gpu_checks == "skip" else "")
            + (f" ({r.image_ref.rsplit('/', 1)[-1]})" if r.image_ref else ""),
            r.next or "ready",
        ]
        for r in rows
    ]
    report = {"profiles": [r.as_dict() for r in rows], "note": note or None, "repository": proj.repository}
    if not profile_table(proj, as_json, report, ["profile", "valid", "lockfile", "image", "next"], table):
        return
    output.err().print(f"images: {proj.repository}:NAME (this project's repository)")
    for r in rows:
        why_lock = r.lock_reason if r.lockfile in {"stale", "edited"} else ""  # "missing" says it all
        for problem in (r.problem, why_lock, r.image_problem):
            if problem:
                output.err().print(f"{r.profile}: {problem}")
        if r.gpu_checks == "skip":
            output.err().print(
                f"{r.profile}: its smoke test ran without a GPU (built where there is none); "
                f"`envbuild smoke {r.profile}` on a GPU host runs the GPU checks",
            )
    if note:
        output.err().print(f"note: {note}")


@app.command("diff")
def diff_(
    a: Annotated[str, typer.Argument(help="An image (REPO:TAG, ID) or a profile (its lockfile).")],
    b: Annotated[str, typer.Argument(help="The other image or profile.")],
    project: ProjectOpt = None,
    as_json: JsonOpt = False,
) -> int:
    """What differs between two images, or an image and a profile's lockfile: distributions, OS packages, files."""
    from envbuild import diff as diff_mod

    found = diff_mod.diff(project_at(project), a, b)
    if as_json:
        output.emit_json(found.as_dict())
        return 0 if found.same else 1
    con = output.out()
    if found.same:
        con.print(f"{a} and {b}: the same environment")
        return 0
    rows = [[str(c["name"]), c["a"] or "-", c["b"] or "-"] for c in found.distributions]
    if rows:
        con.print(output.table("Python distributions", ["name", a, b], rows))
    rows = [[str(c["name"]), c["a"] or "-", c["b"] or "-"] for c in found.os_packages]
    if rows:
        con.print(output.table("OS packages", ["name", a, b], rows))
    for key, what in (("changed", "changed"), ("only_a", f"only in {a}"), ("only_b", f"only in {b}")):
        count = found.file_counts.get(key, 0)
        if count:
            shown = ", ".join(found.files[key][:5]) + (", ..." if count > 5 else "")
            con.print(f"files {what}: {count} ({shown})")
    return 1


@app.command("sbom")
def sbom_(
    target: Annotated[str, typer.Argument(help="A profile (its lockfile) or an image.")],
    output_file: Annotated[Path | None, typer.Option("--output", "-o", help="Write the document here.")] = None,
    project: ProjectOpt = None,
) -> None:
    """A CycloneDX SBOM: every Python distribution (and, for an image, OS package) with version, hashes, source."""
    from envbuild import fsutil
    from envbuild import sbom as sbom_mod

    if output_file is not None:
        fsutil.check_writable(output_file)
    text = sbom_mod.sbom(project_at(project), target)
    if output_file is None:
        sys.stdout.write(text)
        return
    fsutil.atomic_write_many({output_file: text})
    output.err().print(f"wrote {output_file}")


@app.command("matrix")
def matrix_(
    fmt: Annotated[str, typer.Option("--format", help="github, json or bake.")] = "github",
    tag: RepoOpt = None,
    project: ProjectOpt = None,
) -> None:
    """The shipped profiles as a CI matrix (GitHub Actions, JSON) or a docker-bake.json."""
    from envbuild import ci, refs
    from envbuild.errors import UsageError

    refs.check("--tag", tag, "repository")
    proj = project_at(project)
    if fmt == "github":
        sys.stdout.write(__import__("json").dumps(ci.github_matrix(proj), separators=(",", ":")) + "\n")
    elif fmt == "json":
        output.emit_json(ci.matrix(proj))
    elif fmt == "bake":
        output.emit_json(ci.bake(proj, tag or proj.repository))
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
    from envbuild import ci, refs

    refs.check_workflow("--registry", registry, "registry")
    proj = project_at(project)
    write_or_check(
        ci.github_workflow(proj, registry), output_file, check, "the generated workflow", "envbuild ci github"
    )


@app.command()
def doctor(
    project: ProjectOpt = None,
    as_json: JsonOpt = False,
    no_network: Annotated[bool, typer.Option("--no-network", help="Skip the index and registry checks.")] = False,
) -> None:
    """Check this host: engine, driver, GPUs, runtime, /dev/shm, the indexes and registries, which profiles run."""
    from envbuild import doctor as d

    proj = project_at(project)
    report = d.doctor(proj, check_network=not no_network)
    if as_json:
        output.emit_json(report.as_dict())
        return
    con = output.out()
    eng = report.engine
    if eng.get("reachable"):
        con.print(f"engine: reachable, {eng.get('version')} (API {eng.get('api')}) at {eng.get('url')}")
        if eng.get("free_bytes") is not None:
            con.print(f"  disk: {size_text(eng['free_bytes'])} free at {eng.get('data_root')}")
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
    cxx = report.cxx
    con.print(
        f"C++ compiler: {cxx['path']}, libstdc++ linked {cxx['linkage']}"
        + (f" ({cxx['why']})" if cxx.get("why") else "")
        if cxx
        else "C++ compiler: none (torch.compile on the CPU needs g++ in an environment on this host)"
    )
    for note in report.notes:
        con.print(f"note: {note}")
    for net in report.network:
        line = f"{net['what']}: {net['state']} ({net['url']}): {net['detail']}"
        con.print(line + (f"\n  fix: {net['fix']}" if net["fix"] else ""))
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
    name: NameArg,
    tag: RepoOpt = None,
    gpus: Annotated[str, typer.Option(help="auto (a GPU profile's: all), all, none or a count.")] = "auto",
    ipc_host: Annotated[
        bool, typer.Option("--ipc-host", help="Share the host's IPC namespace (NCCL, DataLoader).")
    ] = False,
    shm_size: Annotated[
        str | None, typer.Option(help="Shared memory size when not --ipc-host (default 8g).", show_default=False)
    ] = None,
    env: Annotated[list[str] | None, typer.Option("--env", "-e", help="NAME=VALUE (or NAME) for the job.")] = None,
    volume: Annotated[
        list[str] | None, typer.Option("--volume", "-v", help="HOST:CONTAINER[:ro], beside /workspace.")
    ] = None,
    workdir: Annotated[str | None, typer.Option(help="Working folder in the container (default /workspace).")] = None,
    user: Annotated[
        str | None, typer.Option(help="UID:GID to run as (default: yours, so /workspace files stay yours).")
    ] = None,
    publish: Annotated[
        list[str] | None,
        typer.Option(
            "--publish", "-p", help="[IP:]HOST_PORT:CONTAINER_PORT or PORT; without an IP, on 127.0.0.1 only."
        ),
    ] = None,
    network: Annotated[
        str | None, typer.Option(help="host, or a docker network (a database or tracker beside the job).")
    ] = None,
    download_cache: Annotated[
        str,
        typer.Option(
            help="Host folder kept as the job's ~/.cache (Hugging Face, torch.hub, torch.compile's caches): auto "
            "(~/.cache/envbuild/run, or ENVBUILD_RUN_CACHE), a folder, or none."
        ),
    ] = "auto",
    project: ProjectOpt = None,
) -> int:
    """Run the profile's image here: GPUs, shared memory, this folder as /workspace. `envbuild run NAME -- CMD`."""
    from envbuild import doctor, engine, hostgpu, localimage, refs, runner, smokerecord
    from envbuild.errors import UsageError
    from envbuild.names import RUN_SHM_SIZE, UNTESTED

    hostgpu.check_gpus(gpus)
    refs.check("--tag", tag, "repository")
    hostgpu.check_shm_choice(shm_size, ipc_host, f"envbuild run {name}")
    for item in env or []:
        runner.check_env(item)  # before the engine is asked anything
    elsewhere = engine.engine_elsewhere()
    for item in volume or []:
        runner.check_volume(item, elsewhere=elsewhere)
    runner.check_network(network, publish or ())
    ports = [runner.check_publish(item) for item in publish or []]
    # A folder of this host's, mounted by an engine elsewhere, is that host's: made there by docker,
    # root's, so the job (this user's uid) could not write its ~/.cache; the container's /tmp serves.
    cache = runner.download_cache("none" if elsewhere and download_cache == "auto" else download_cache, user)
    proj = project_at(project)
    prof = load_profile(proj, name)
    # this host's GPUs and driver are not the job's where the engine runs elsewhere
    problem = None if gpus == "none" or elsewhere else doctor.gpu_problem(prof)
    if problem is not None:
        # torch would not see the GPUs (is_available() False), and a script that falls back to the
        # CPU would train there without a word.
        raise UsageError(
            f"{prof.name}'s GPU work cannot run on this host: {problem}",
            hint="update the NVIDIA driver, or run a profile whose CUDA build suits this host (`envbuild doctor` "
            "lists them); --gpus none starts it without GPUs",
        )
    # Looked up first: `docker run` would otherwise go looking for the image on Docker Hub and fail there.
    cli, facts = engine.client(), localimage.local_facts(proj, prof)
    image, found = localimage.profile_image(cli, proj, prof, tag, facts)
    tested = smokerecord.state(found.attrs)
    if image.endswith(UNTESTED) or tested == "untested":
        output.err().print(f"note: {image} is a --no-smoke build; no smoke test has passed in it")
    elif tested == "altered":  # run, unlike push, takes it: it may be the user's own on purpose
        output.err().print(
            f"note: {image} is not the image that passed the smoke test: {smokerecord.ALTERED}; "
            f"`envbuild build {name}` puts the tested one back under this tag"
        )
    note_if_stale(proj, prof, image, dict(found.labels or {}), cli, facts)
    argv = runner.docker_argv(
        prof,
        image,
        list(ctx.args),
        workdir=Path.cwd(),
        gpus=gpus,
        ipc_host=ipc_host,
        shm_size=RUN_SHM_SIZE if shm_size is None else shm_size,
        tty=sys.stdin.isatty() and sys.stdout.isatty(),
        env=env or (),
        volumes=volume or (),
        container_workdir=workdir,
        user=user,
        publish=ports,
        network=network,
        cache=cache,
        elsewhere=elsewhere,
    )
    if elsewhere:
        output.err().print(
            f"note: the engine runs on {elsewhere}, not here: /workspace is {elsewhere}'s {Path.cwd()} (and -v "
            f"paths are its paths), so the job sees this folder's files only where {elsewhere} shares them; "
            f"run envbuild on {elsewhere} to work there"
            + ("; no download cache (a folder here is not the job's)" if download_cache == "auto" else "")
        )
    for item in ports:
        output.err().print(f"note: {runner.published(item)}")
    for named in filter(None, map(runner.volume_name, volume or [])):
        output.err().print(
            f"note: -v {named}:... mounts the docker volume {named} (there is no folder of that name here; docker "
            "makes the volume if it is new): `docker volume ls` lists them"
        )
    code = runner.call(argv, stdin_is_tty=sys.stdin.isatty())
    if code == 125 and ("--gpus" in argv or "/dev/kfd" in argv):
        # 125 is docker's own failure, before the command ran; with GPUs asked for, it is most often
        # a missing container toolkit
        output.err().print(
            "note: docker could not start the container (its message is above); GPUs need the NVIDIA Container "
            "Toolkit (or /dev/kfd and /dev/dri for ROCm) on the engine's host: `envbuild doctor` checks it",
        )
    return code
