"""Keep pydantic out of typer's option parsing for values that are already what they should be.

typer 0.29 coerces every parameter through a pydantic TypeAdapter, built the first time the
parameter is seen in a process, even for a `--project` left at None or a `--help` flag. On the
2-core machines this project is measured on that import alone is ~0.2 s of every invocation,
which is the difference between `envbuild list` answering in 0.3 s and in 0.6 s.

`install()` wraps typer's runtime-parameter factory: a str parameter that received a str, a bool
that received a bool and a list[str] that received strings are passed through untouched (what
typer's own adapters return for them). typer's own parameter is built only when a value needs it,
not when the parameter is first seen: an option left at None (`render`'s `--templates`, a Path)
never reaches typer's coercion at all, since typer returns None before asking. Every value that
needs conversion or can be wrong (an int option given "abc", a Path given a string) still goes
through typer's own path unchanged, so its errors and conversions are typer's.

This leans on typer internals (`typer.core.build_runtime_param`, `typer._coercion`). If they
move, `install()` does nothing and the CLI is merely slower; tests/unit/test_cli.py notices.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, get_args, get_origin


def install() -> bool:
    """Patch typer once; True when the fast path is active."""
    try:
        import typer.core as typer_core
        from typer._coercion import RuntimeParam, TypeDescriptor
    except ImportError:
        return False
    found = getattr(typer_core, "build_runtime_param", None)
    if found is None:
        return False
    if getattr(found, "_envbuild_fast", False):
        return True
    original: Callable[[Any], Any] = found

    @dataclass(frozen=True)
    class _PassThrough(RuntimeParam):
        descriptor: TypeDescriptor

        @functools.cached_property
        def typer_param(self) -> Any:
            return original(self.descriptor)

        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            if _already_coerced(self.descriptor.annotation, value):
                return list(value) if isinstance(value, tuple) else value
            return self.typer_param._coerce_value(value, param=param, ctx=ctx)

    def build_runtime_param(descriptor: Any) -> Any:
        # A custom parser or a file argument has side effects or state of its own: typer's, now.
        if descriptor.parameter_info.parser is None and descriptor.file_annotation is None:
            return _PassThrough(
                parameter_info=descriptor.parameter_info,
                annotation=descriptor.annotation,
                descriptor=descriptor,
            )
        return original(descriptor)

    build_runtime_param._envbuild_fast = True  # type: ignore[attr-defined]
    setattr(typer_core, "build_runtime_param", build_runtime_param)  # noqa: B010 (not a public attribute)
    return True


def _already_coerced(annotation: Any, value: Any) -> bool:
    if annotation is str:
        return isinstance(value, str)
    if annotation is bool:
        return isinstance(value, bool)
    if get_origin(annotation) is list and get_args(annotation) == (str,):
        return isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)
    return False
