"""Commands that move images through registries: push, pull."""

from typing import Annotated

import typer

from envbuild import output, refs
from envbuild.cli._common import (
    JsonOpt,
    NameArg,
    ProjectOpt,
    RepoOpt,
    app,
    load_profile,
    project_at,
    step_printer,
)


@app.command()
def push(
    name: NameArg,
    tag: RepoOpt = None,
    registry: Annotated[str | None, typer.Option(help="HOST[:PORT]/PATH to push to.")] = None,
    project: ProjectOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Push a smoke-tested image as REGISTRY/PATH:NAME and :NAME-<lock digest>."""
    from envbuild import publish

    refs.check("--tag", tag, "repository")
    refs.check("--registry", registry, "registry")

    proj = project_at(project)
    res = publish.push(proj, load_profile(proj, name), repo=tag, registry=registry, events=step_printer())
    if as_json:
        output.emit_json({"image_id": res.image_id, "refs": res.refs, "digest": res.digest})
        return
    con = output.out()
    for ref in res.refs:
        con.print(f"pushed {ref}")
    con.print(f"manifest digest: {res.digest}")


@app.command()
def pull(
    name: NameArg,
    registry: Annotated[str | None, typer.Option(help="HOST[:PORT]/PATH to pull from.")] = None,
    digest: Annotated[str | None, typer.Option(help="Pull by digest (sha256:...) instead of the moving tag.")] = None,
    tag: RepoOpt = None,
    verify: Annotated[
        bool, typer.Option("--verify", help="Fail when the image differs from the local lockfile.")
    ] = False,
    project: ProjectOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Pull a profile's published image and compare it with the local profile and lockfile."""
    from envbuild import publish

    refs.check("--tag", tag, "repository")
    refs.check("--registry", registry, "registry")
    refs.check("--digest", digest, "digest")
    proj = project_at(project)
    res = publish.pull(
        proj,
        load_profile(proj, name),
        registry=registry,
        repo=tag,
        digest=digest,
        verify=verify,
        events=step_printer(),
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
        "smoke": res.smoke,  # passed | untested | altered: the record checked, not the label read
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
        output.err().print(f"warning: {m} (use --verify to make this an error)")
