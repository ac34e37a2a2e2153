"""YAML loading that keeps line numbers and refuses hostile documents.

PyYAML's composer gives a node graph with marks; this module turns it into
plain data itself so that every value keeps the line it came from, aliases
cannot expand into a "billion laughs", and no tag ever builds an object.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from envbuild.names import CONFLICT_FIX, CONFLICT_SAID, NOT_UTF8_FIX, conflict_line, not_utf8

MAX_BYTES = 256 * 1024
MAX_NODES = 5_000  # a real profile has well under 500 values
MAX_DEPTH = 32

Path_ = tuple[str | int, ...]


@dataclass
class Located:
    """A loaded document: the data and, for each path into it, the line it came from."""

    data: Any
    lines: dict[Path_, int] = field(default_factory=dict)
    raw_scalars: dict[Path_, str] = field(default_factory=dict)


class YamlProblem(Exception):
    def __init__(self, message: str, line: int | None = None, column: int | None = None, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.line = line
        self.column = column
        self.hint = hint


_scalar_loader = yaml.SafeLoader("")
# libyaml's composer when PyYAML has it: the same nodes and marks, several times faster.
_COMPOSER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_PLAIN_COLLECTION_TAGS = {"tag:yaml.org,2002:seq", "tag:yaml.org,2002:map"}


def _scalar(node: yaml.ScalarNode) -> Any:
    try:
        return _scalar_loader.construct_object(node, deep=True)
    except yaml.YAMLError as exc:
        raise YamlProblem(
            f"unsupported YAML tag {node.tag!r}",
            node.start_mark.line + 1,
            node.start_mark.column + 1,
        ) from exc


def parse(text: str) -> Located:
    if len(text.encode("utf-8", "surrogatepass")) > MAX_BYTES:
        raise YamlProblem(f"file is larger than {MAX_BYTES // 1024} KiB; a profile is a few lines")
    marker = conflict_line(text)
    if marker is not None:  # YAML's own word for it: "could not find expected ':'"
        raise YamlProblem(CONFLICT_SAID, marker, hint=CONFLICT_FIX)
    try:
        root = yaml.compose(text, Loader=_COMPOSER)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or exc.context or "malformed YAML"
        lines = text.split("\n")
        here = lines[mark.line] if mark is not None and mark.line < len(lines) else ""
        tab = mark is not None and here[mark.column : mark.column + 1] == "\t"
        raise YamlProblem(
            f"malformed YAML: {problem}"
            + (" (a tab: YAML indents with spaces only)" if tab and "tab" not in problem else ""),
            mark.line + 1 if mark else None,
            mark.column + 1 if mark else None,
            hint="replace the tab with spaces (e.g. two per level)" if tab else "",
        ) from exc
    except yaml.YAMLError as exc:
        raise YamlProblem(f"malformed YAML: {exc}") from exc
    except (
        ValueError,
        RecursionError,
    ) as exc:  # odd bytes or nesting deep enough to hit the C stack
        raise YamlProblem(f"malformed YAML: {exc}") from exc
    located = Located(data=None)
    if root is None:
        return located
    budget = [MAX_NODES]
    located.data = _walk(root, (), located, budget, 0)
    return located


def _walk(node: yaml.Node, path: Path_, out: Located, budget: list[int], depth: int) -> Any:
    budget[0] -= 1
    if budget[0] < 0:
        raise YamlProblem(
            f"document expands to more than {MAX_NODES} values (alias bomb?)",
            node.start_mark.line + 1,
        )
    if depth > MAX_DEPTH:
        raise YamlProblem(f"nesting deeper than {MAX_DEPTH} levels", node.start_mark.line + 1)
    out.lines.setdefault(path, node.start_mark.line + 1)
    if not isinstance(node, yaml.ScalarNode) and node.tag not in _PLAIN_COLLECTION_TAGS:
        raise YamlProblem(
            f"unsupported YAML tag {node.tag!r}",
            node.start_mark.line + 1,
            node.start_mark.column + 1,
        )
    if isinstance(node, yaml.ScalarNode):
        out.raw_scalars[path] = node.value
        return _scalar(node)
    if isinstance(node, yaml.SequenceNode):
        return [_walk(child, (*path, i), out, budget, depth + 1) for i, child in enumerate(node.value)]
    if isinstance(node, yaml.MappingNode):
        result: dict[str, Any] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise YamlProblem("mapping keys must be plain strings", key_node.start_mark.line + 1)
            if key_node.tag == "tag:yaml.org,2002:merge":
                raise YamlProblem(
                    "YAML merge keys (<<) are not supported; use `extends:`",
                    key_node.start_mark.line + 1,
                )
            key = str(_scalar(key_node))
            if key in result:
                raise YamlProblem(f"duplicate key {key!r}", key_node.start_mark.line + 1)
            child: Path_ = (*path, key)
            out.lines[child] = key_node.start_mark.line + 1
            result[key] = _walk(value_node, child, out, budget, depth + 1)
            # The key's line, not its value's, is where a person looks for the field.
            out.lines[child] = key_node.start_mark.line + 1
        return result
    raise YamlProblem(f"unsupported YAML node {type(node).__name__}")


def read(path: Path) -> Located:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise YamlProblem(f"cannot read: {exc.strerror or exc}") from exc
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        said, line, column = not_utf8(exc)
        raise YamlProblem(said, line, column, hint=NOT_UTF8_FIX) from exc
    return parse(text)
