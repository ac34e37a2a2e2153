"""The README and docs/ stay true: every command and option they name exists, and the README stays short."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# `envbuild CMD [SUB] ...` inside a code span or a line of a code block.
_CALL = re.compile(r"\benvbuild ((?:[a-z][a-z-]*)(?: github)?)\b([^`\n]*)")
_OPTION = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*|-[A-Za-z])\b")
_SPAN = re.compile(r"`([^`\n]+)`")
_FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)
# Not options of envbuild: what a page quotes of other tools on the same line.
_FOREIGN = {"--target", "--platform", "--gpus", "--ipc"}


def _tree() -> dict[str, set[str]]:
    from envbuild.cli import _command

    root: Any = _command()
    out: dict[str, set[str]] = {}

    def add(name: str, cmd: Any) -> None:
        opts = {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)} | {"--help"}
        out[name] = opts
        for sub_name, sub in (getattr(cmd, "commands", None) or {}).items():
            add(f"{name} {sub_name}", sub)

    for name, cmd in root.commands.items():
        add(name, cmd)
    return out


def _calls() -> list[tuple[str, str, str]]:
    found = []
    for page in PAGES:
        text = page.read_text()
        blocks = [m.group(1) for m in _FENCE.finditer(text)]
        spans = [m.group(1) for m in _SPAN.finditer(_FENCE.sub("", text))]
        lines = (line.split(" #", 1)[0] for block in blocks for line in block.splitlines())
        for code in (*spans, *lines):
            for call in _CALL.finditer(code):
                found.append((page.name, call.group(1), call.group(2).split("#", 1)[0]))
    return found


def test_the_docs_name_commands_at_all() -> None:
    assert len(_calls()) > 60


@pytest.mark.parametrize("page", [p.name for p in PAGES])
def test_every_command_and_option_a_page_names_exists(page: str) -> None:
    tree = _tree()
    problems = []
    for where, command, rest in _calls():
        if where != page:
            continue
        if command not in tree and command.split()[0] not in tree:
            problems.append(f"envbuild {command}: no such command")
            continue
        known = tree.get(command) or tree[command.split()[0]]
        for option in _OPTION.findall(rest.split(" -- ", 1)[0]):
            if option not in known and not (option in _FOREIGN and option in {o for s in tree.values() for o in s}):
                problems.append(f"envbuild {command} {option}: no such option")
    assert problems == []


def test_the_readme_is_short_and_has_both_commands() -> None:
    text = (REPO / "README.md").read_text()
    assert len(text) < 10_000
    assert "make run" in text and "make check" in text
    for page in ("COMMANDS", "PROFILES", "LOCKFILES", "IMAGES", "SMOKE", "ARCHITECTURE"):
        assert (REPO / "docs" / f"{page}.md").is_file() and f"docs/{page}.md" in text
