"""Console helpers for the CLI layer only (library code never prints)."""

from __future__ import annotations

import json
import sys
from functools import cache
from typing import Any


@cache
def out() -> Any:
    from rich.console import Console

    return Console(highlight=False, soft_wrap=True)


@cache
def err() -> Any:
    from rich.console import Console

    return Console(stderr=True, highlight=False, soft_wrap=True)


def emit_json(payload: Any) -> None:
    sys.stdout.write(json.dumps(payload, indent=2, sort_keys=True) + "\n")


def table(title: str | None, columns: list[str], rows: list[list[str]]) -> Any:
    from rich.table import Table

    t = Table(title=title, show_lines=False, header_style="bold")
    for col in columns:
        t.add_column(col)
    for row in rows:
        t.add_row(*row)
    return t
