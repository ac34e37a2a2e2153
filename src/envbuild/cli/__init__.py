"""envbuild's command line: parse options, call the library, format the result.

Every command is a thin wrapper, in a module of its pipeline stage (profiles, locking, building,
publishing, overview). Errors travel up as EnvbuildError subclasses and become an exit code in
`run`, the only place that maps them; the entry point (`envbuild.__main__`) exits with it.
"""

import functools
import importlib
import sys
from typing import Any

import typer

from envbuild import output
from envbuild.cli._common import app
from envbuild.errors import EnvbuildError

__all__ = ["app", "prepare", "run"]

# Importing a command module registers its commands, in the order `envbuild --help` lists them:
# the pipeline's, which an import statement's sorted names would not keep.
for _stage in ("profiles", "locking", "building", "publishing", "overview"):
    importlib.import_module(f"envbuild.cli.{_stage}")


def prepare() -> None:
    """Build the command tree now (the entry point does it with the garbage collector paused)."""
    _command()


@functools.cache
def _command() -> Any:
    # Building click's command tree from the typer app costs ~30 ms; build it once per process.
    return typer.main.get_command(app)


def run(argv: list[str] | None = None) -> int:
    """Run the CLI and return the exit code; the one place errors become numbers."""
    command = _command()
    output.reset_json()
    try:
        result = command.main(args=_bare_json(argv), prog_name="envbuild", standalone_mode=False)
    except EnvbuildError as exc:
        return _report(exc)
    except OSError as exc:
        if exc.filename is None:
            return _internal(exc)
        from envbuild.fsutil import file_error

        return _report(file_error(exc))
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
        return _internal(exc)
    return result if isinstance(result, int) else 0


def _bare_json(argv: list[str] | None) -> list[str] | None:
    """`smoke`'s --json takes a file, where every other command's is a flag for stdout; a bare one
    (last, or before another option) means stdout there too. click cannot make a value optional."""
    if not argv or argv[0] != "smoke":
        return argv
    for i, arg in enumerate(argv):
        if arg == "--":
            break
        if arg == "--json" and (i + 1 == len(argv) or (argv[i + 1].startswith("-") and argv[i + 1] != "-")):
            return [*argv[: i + 1], "-", *argv[i + 1 :]]
    return argv


def _report(exc: EnvbuildError) -> int:
    from envbuild.errors import exit_code_for

    code = exit_code_for(exc)
    if output.json_pending():
        output.emit_json({"error": {**exc.as_dict(), "exit_code": code}})
    sys.stdout.flush()  # keep the report above the error line when both go to one terminal
    output.err().print(f"error: {exc}")
    return code


def _internal(exc: BaseException) -> int:
    import os
    import traceback

    sys.stdout.flush()
    output.err().print(f"internal error: {type(exc).__name__}: {exc}")
    if os.environ.get("ENVBUILD_DEBUG"):
        output.err().print(traceback.format_exc())
    else:
        output.err().print("  this is a bug in envbuild; rerun with ENVBUILD_DEBUG=1 for details and report it")
    return 70
