"""What every command shares: the typer app, the common options, and the helpers that print."""

import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from envbuild import output

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


NameArg = Annotated[str, typer.Argument(help="A profile's name (its file is profiles/NAME.yaml).")]


JsonOpt = Annotated[
    bool, typer.Option("--json", help="Machine-readable output on stdout.", callback=output.json_requested)
]


# Options several stages take with one meaning; each command still checks the values it uses.
RepoOpt = Annotated[
    str | None,
    typer.Option(
        "--tag", help="Local image repository (default: envbuild.toml's `repository`, else envbuild/<project name>)."
    ),
]
FindLinksOpt = Annotated[
    list[str] | None, typer.Option("--find-links", help="A local wheelhouse for the locked wheels (repeatable).")
]
IndexUrlOpt = Annotated[str | None, typer.Option("--index-url", help="A PyPI mirror (may carry credentials).")]
TorchIndexOpt = Annotated[
    str | None, typer.Option("--torch-index", help="A mirror of the PyTorch index (URL or folder).")
]


def say_no_profiles(proj: Any) -> None:
    why, fix = proj.no_profiles()
    output.err().print(f"no profiles: {why}\n  fix: {fix}")


def profile_table(proj: Any, as_json: bool, report: Any, columns: list[str], rows: list[list[str]]) -> bool:
    """A per-profile command's answer: its report with --json; else its table, or, in a project
    without profiles, how to start one. True when the table was printed (more may follow it)."""
    if as_json:
        output.emit_json(report)
        return False
    if not rows:
        say_no_profiles(proj)
        return False
    output.out().print(output.table(None, columns, rows))
    return True


def project_at(path: str | None) -> Any:
    from envbuild.project import open_project

    return open_project(path)


def check_indexes(index_url: str | None, torch_index: str | None) -> None:
    """--index-url and --torch-index, checked as the profile's fields are, before any work."""
    from envbuild import refs

    refs.check("--index-url", index_url, "url")
    refs.check("--torch-index", torch_index, "url")


def pick_profiles(proj: Any, names: list[str] | None, all_: bool, verb: str) -> list[str]:
    """The profiles a command was given, in order, then (--all) the rest of the project's."""
    from envbuild.errors import UsageError

    chosen = list(names or [])
    if all_:
        chosen += [n for n in proj.profile_names() if n not in chosen]
    if not chosen and all_:
        why, fix = proj.no_profiles()
        raise UsageError(f"nothing to {verb}: {why}", hint=fix)
    if not chosen:
        raise UsageError(f"nothing to {verb}", hint="name profiles or pass --all")
    return chosen


def load_profile(proj: Any, name: str) -> Any:
    from envbuild import validate

    return validate.load_named(proj, name)


def note_if_stale(proj: Any, prof: Any, ref: str, labels: dict[str, str], cli: Any, facts: Any = None) -> None:
    """A note when the image a profile's name stands for is not a build of today's profile and
    lockfiles (a re-lock or an edit not built yet): `run` would run the old packages and settings,
    and `smoke` test them, without a word, while `status` said stale. `facts`: the profile's
    localimage.local_facts where the caller has them."""
    from envbuild import localimage, publish

    stale = publish.mismatches(localimage.local_facts(proj, prof) if facts is None else facts, labels)
    if stale:
        output.err().print(
            f"note: {ref} was not built from today's profile and lockfiles ({stale[0]}); "
            f"`envbuild build {prof.name}` builds them (`envbuild status` shows it stale)"
        )
    from envbuild.names import UNTESTED, moving_tag

    moving = moving_tag(ref.rpartition(":")[0], prof.name)  # the same repository as the build it took
    if ref not in (moving, moving + UNTESTED) and _another_image(cli, moving, ref):
        output.err().print(
            f"note: {moving} names another build (other lockfiles: another clone's build on this engine, or a "
            f"pull); this command takes {ref}, the build of this checkout's profile and lockfiles"
        )


def _another_image(cli: Any, ref: str, taken: str) -> bool:
    """Whether `ref` names an image, and another one than `taken` names."""
    from envbuild import engine
    from envbuild.errors import ImageMissing

    try:
        return str(engine.local_image(cli, ref).id) != str(engine.local_image(cli, taken).id)
    except ImageMissing:
        return False


def step_printer() -> Any:
    """Progress as a person expects: the current step of N and the elapsed time. On stderr with
    --json too (stdout then carries only the report): a CI job that keeps the report still shows
    a long build's progress and its warnings in its log; it used to be silent for minutes."""
    import time as _time

    console = output.err()
    started = _time.monotonic()
    last_transfer = [0.0]

    def events(kind: str, key: str, text: str) -> None:
        elapsed = _time.monotonic() - started
        if kind == "step":
            console.print(f"[{elapsed:6.1f}s] step {key}: {text}")
        elif kind == "phase":
            console.print(f"[{elapsed:6.1f}s] {key}: {text}")
        elif kind == "warning":
            console.print(f"[{elapsed:6.1f}s] warning: {text}", style="yellow")
        elif kind == "remove":
            console.print(f"[{elapsed:6.1f}s] removing {key} ({text})")
        elif kind == "retry":
            console.print(f"[{elapsed:6.1f}s] {key}: {text}", style="yellow")
        elif kind == "transfer" and elapsed - last_transfer[0] >= 2:
            # a line every 2 s at most: the engine sends one per layer per megabyte or so
            last_transfer[0] = elapsed
            console.print(f"[{elapsed:6.1f}s] {key}: {text}")

    return events


def check_jobs(jobs: int | None) -> None:
    from envbuild.errors import UsageError

    if jobs is not None and jobs < 1:
        raise UsageError(f"--jobs {jobs}: must be 1 or more", hint="e.g. -j 4")


def check_python(python: str | None) -> None:
    """--python must name something runnable; a typo is a usage error before any work, not a failed run."""
    import os
    import shutil

    from envbuild.errors import UsageError

    if python is None or shutil.which(python):
        return
    path = Path(python)
    if path.is_dir():
        why = "is a folder"
    elif path.exists():
        why = "is not executable"
    elif os.sep in python:
        why = "does not exist"
    else:
        why = "is not on PATH"
    raise UsageError(f"--python {python}: {why}", hint="give a Python interpreter, e.g. --python /usr/bin/python3.11")


def size_text(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB"


def write_or_check(text: str, output_file: Path | None, check: bool, what: str, command: str) -> None:
    """Generated files: print, write atomically, or (--check) exit 1 when the committed copy drifted."""
    from envbuild.errors import GeneratedDrift, UsageError
    from envbuild.fsutil import atomic_write_many

    if check:
        if output_file is None:
            raise UsageError("--check needs -o FILE", hint=f"{command} --check -o FILE")
        if not output_file.is_file():
            raise GeneratedDrift(f"{output_file} is missing", hint=f"write it: {command} -o {output_file}")
        if output_file.read_text(encoding="utf-8", errors="replace") != text:
            raise GeneratedDrift(
                f"{output_file} differs from {what}", hint=f"regenerate it: {command} -o {output_file}"
            )
        output.out().print(f"{output_file} is current")
        return
    if output_file is None:
        sys.stdout.write(text)
        return
    atomic_write_many({output_file: text})
    output.err().print(f"wrote {output_file}")
