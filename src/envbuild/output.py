"""Console helpers for the CLI layer only (library code never prints)."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from functools import cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.text import Text


# markup=False: what envbuild prints is mostly data (an engine's error, a profile's value, a
# check's reason), and rich would read "[gpu]" in it as a style and drop it, or fail on "[/x]".
# emoji=False likewise: an image called "lab:x" came out as "lab❌" ("lab:x: " holds rich's ":x:").
# Colour is asked for explicitly, with styled().
@cache
def out() -> Any:
    from rich.console import Console

    return Console(highlight=False, soft_wrap=True, markup=False, emoji=False)


@cache
def err() -> Any:
    from rich.console import Console

    return Console(stderr=True, highlight=False, soft_wrap=True, markup=False, emoji=False)


def styled(*parts: str | tuple[str, str]) -> Text:
    """Text from plain strings and (text, style) pairs; nothing in it is read as markup."""
    from rich.text import Text

    return Text.assemble(*parts)


# Whether this invocation asked for --json and whether stdout has had its JSON yet: a command
# that fails before its report still owes a machine reader one JSON document (the error).
_json = {"requested": False, "emitted": False}


def json_requested(value: bool) -> bool:
    """typer callback of every `--json` flag."""
    if value:
        _json["requested"] = True
    return value


def json_pending() -> bool:
    return _json["requested"] and not _json["emitted"]


def reset_json() -> None:
    _json.update(requested=False, emitted=False)


def emit_json(payload: Any) -> None:
    _json["emitted"] = True
    sys.stdout.write(json.dumps(payload, indent=2, sort_keys=True) + "\n")


_MAX_MIN_WIDTH = 16


def table(
    title: str | None, columns: list[str], rows: Sequence[Sequence[str | Text]], caption: str | None = None
) -> Any:
    """A table whose str cells are plain text (never markup); a cell that is a Text keeps its styles."""
    from rich.table import Table
    from rich.text import Text

    t = Table(title=title, caption=caption, show_lines=False, header_style="bold", caption_justify="left")
    for i, col in enumerate(columns):
        # rich shrinks every column alike on a narrow terminal, so "3.10-3.14" became "3.10-…"
        # while a wrappable neighbour had room: a column never gets narrower than its longest
        # word (capped, so one long path cannot push the rest off the screen).
        cells = [col, *(str(r[i]) for r in rows if i < len(r))]
        words = [w for cell in cells for w in cell.split()]
        t.add_column(col, min_width=min(max(map(len, words), default=1), _MAX_MIN_WIDTH))
    for row in rows:
        t.add_row(*(Text(cell) if isinstance(cell, str) else cell for cell in row))
    return t
