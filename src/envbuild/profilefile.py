"""Reading profile files: YAML with line numbers, and `extends` merged, without the model.

Kept free of pydantic so that `envbuild list` answers fast; `profile.load` adds the strict
model on top of what `read_raw` returns.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envbuild import yamlsrc
from envbuild.errors import Diagnostic
from envbuild.names import canonical

VERSION_FIELDS = {"python", "torch", "torchvision", "torchaudio", "numpy", "cuda", "rocm"}
# fields that take a whole release (X.Y.Z): YAML reads a bare series (2.8) as a number, and quoting
# it alone would only lead to the next error
RELEASE_FIELDS = {"torch", "torchvision", "torchaudio", "numpy"}


def free_threaded(python: str) -> tuple[str, str] | None:
    """The problem and fix for a free-threaded Python ("3.13t"), else None. torch's cp313t wheels
    need a free-threaded interpreter, which no default base's OS Python is."""
    if not re.fullmatch(r"3\.\d{1,2}t", python):
        return None
    problem = f"{python!r} is free-threaded Python (PEP 703): envbuild does not build it"
    return problem, f'write "{python[:-1]}", the standard interpreter of that version'


def odd_path(path: str) -> tuple[str, str] | None:
    """The problem and fix for a check's path with characters it may not hold (a space, an accent),
    else None: "not a Python script in the project" was wrong about the script and silent on why."""
    odd = sorted({c for c in path if not re.fullmatch(r"[A-Za-z0-9_./-]", c)})
    if not odd:
        return None
    named = ", ".join("a space" if c == " " else repr(c) for c in odd)
    problem = f"{path[:80]!r} holds {named}: a check's path may hold letters, digits and _ . / - only"
    problem += " (it is copied into the image and run by name)"
    return problem, f"rename the file, e.g. {re.sub(r'[^A-Za-z0-9_./-]', '_', path)[:80]}"


def _quote_fix(key: str, raw: str) -> str:
    if key in RELEASE_FIELDS and re.fullmatch(r"\d+\.\d+", raw):
        return f'quote it as a whole release: {key}: "{raw}.0" is the {raw} series\' first' + series_newest(key, raw)
    return f'quote it: {key}: "{raw}"'


def series_newest(package: str, series: str) -> str:
    """Where a bare series' newest release is found, for the fix that names its first."""
    if package not in {"torch", "numpy"}:
        return ""
    return (
        f"; `envbuild outdated` names the newest {series}.x of a locked profile, "
        f"`envbuild new NAME --{package} {series}` picks it for a new one"
    )


@dataclass
class Loaded:
    """What loading a profile file gives: the merged data, where each key came from, problems."""

    path: Path
    shown: str
    data: dict[str, Any] = field(default_factory=dict)
    origin: dict[str, tuple[str, int | None]] = field(default_factory=dict)
    diagnostics: list[Diagnostic] = field(default_factory=list)
    profile: Any = None  # a Profile once the model accepted the data
    bad_fields: set[str] = field(default_factory=set)
    nested_lines: dict[tuple[str | int, ...], int] = field(default_factory=dict)
    extends: list[str] = field(default_factory=list)  # the profiles this one extends, nearest first

    def line(self, key: str, loc: tuple[str | int, ...] = ()) -> int | None:
        return self.nested_lines.get(loc) or self.origin.get(key, (self.shown, None))[1]

    def file_of(self, key: str) -> str:
        return self.origin.get(key, (self.shown, None))[0]

    def add(
        self,
        severity: str,
        key: str,
        message: str,
        fix: str = "",
        value: Any = None,
        loc: tuple[str | int, ...] = (),
    ) -> None:
        top = key.split("[", 1)[0].split(".", 1)[0]
        self.diagnostics.append(
            Diagnostic(
                severity=severity,
                file=self.file_of(top) if top else self.shown,
                line=self.line(top, loc) if top else None,
                field=key,
                message=message,
                fix=fix,
                value=None if value is None else str(value)[:200],
            )
        )

    @property
    def errors(self) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.severity == "error"]

    @property
    def warnings(self) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.severity == "warning"]

    def report(self) -> dict[str, Any]:
        """This file's entry in `validate --json`."""
        return {
            "file": self.shown,
            "valid": not self.errors,
            "errors": [d.as_dict() for d in self.errors],
            "warnings": [d.as_dict() for d in self.warnings],
        }


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def _read_chain(path: Path, shown: str, loaded: Loaded, seen: tuple[Path, ...]) -> dict[str, Any] | None:
    """Read one file and, first, whatever it extends. Records origins; None on a fatal problem."""
    try:
        doc = yamlsrc.read(path)
    except yamlsrc.YamlProblem as exc:
        where = f" (column {exc.column})" if exc.column else ""
        loaded.diagnostics.append(
            Diagnostic(
                "error",
                shown,
                exc.line,
                "",
                exc.message + where,
                exc.hint or ("fix the YAML syntax at that spot" if exc.line else ""),
            )
        )
        return None
    if doc.data is None:
        doc.data = {}
    if not isinstance(doc.data, dict):
        loaded.diagnostics.append(
            Diagnostic(
                "error",
                shown,
                1,
                "",
                f"a profile is a mapping of keys, not a {type(doc.data).__name__}",
                "write `key: value` lines",
            )
        )
        return None
    data: dict[str, Any] = doc.data
    for key, value in data.items():
        raw = doc.raw_scalars.get((key,))
        if (
            key in VERSION_FIELDS
            and isinstance(value, (int, float))
            and not isinstance(value, bool)
            and raw is not None
        ):
            # YAML reads 3.10 as the float 3.1: keep what the user typed, and say so.
            loaded.diagnostics.append(
                Diagnostic(
                    "error",
                    shown,
                    doc.lines.get((key,)),
                    key,
                    f"{raw} is a number in YAML (it reads as {value!r})",
                    _quote_fix(key, raw),
                    raw,
                )
            )
            loaded.bad_fields.add(key)
    parent_name = data.get("extends")
    merged: dict[str, Any] = {}
    if parent_name is not None:
        if not isinstance(parent_name, str) or not re.fullmatch(r"[A-Za-z0-9_.-]{1,100}", parent_name):
            loaded.diagnostics.append(
                Diagnostic(
                    "error",
                    shown,
                    doc.lines.get(("extends",)),
                    "extends",
                    f"{str(parent_name)[:80]!r} is not a profile name in this folder",
                    "write e.g. extends: _base",
                )
            )
        else:
            parent = path.parent / f"{parent_name}.yaml"
            if parent.resolve() in seen or parent.resolve() == path.resolve():
                chain = " -> ".join(p.stem for p in (*seen, path, parent))
                loaded.diagnostics.append(
                    Diagnostic(
                        "error",
                        shown,
                        doc.lines.get(("extends",)),
                        "extends",
                        f"extends forms a cycle ({chain})",
                        "remove one `extends`",
                    )
                )
            elif not parent.is_file():
                names = sorted(p.stem for p in path.parent.glob("*.yaml"))
                close = difflib.get_close_matches(parent_name, names, n=2)
                loaded.diagnostics.append(
                    Diagnostic(
                        "error",
                        shown,
                        doc.lines.get(("extends",)),
                        "extends",
                        f"{parent_name}.yaml does not exist next to this profile",
                        f"did you mean {' or '.join(close)}?" if close else "create it or remove `extends`",
                    )
                )
            else:
                parent_shown = str(Path(shown).parent / parent.name)
                loaded.extends.append(parent.stem)
                got = _read_chain(parent, parent_shown, loaded, (*seen, path.resolve()))
                if got is None:
                    return None
                merged = got
    for key in data:
        line = doc.lines.get((key,))
        loaded.origin[key] = (shown, line)
        for loc in [p for p in doc.lines if len(p) > 1 and p[0] == key]:
            loaded.nested_lines[loc] = doc.lines[loc]
    if merged and isinstance(parent_name, str):
        dropped = _dropped(merged.get("packages"), data.get("packages"))
        if dropped:
            it = "them" if len(dropped) > 1 else "it"
            loaded.diagnostics.append(
                Diagnostic(
                    "warning",
                    shown,
                    doc.lines.get(("packages",)),
                    "packages",
                    f"this list replaces {parent_name}'s (lists are not merged), which leaves out {', '.join(dropped)}",
                    f"repeat {it} here to keep {it}; ignore this if the profile means to drop {it}",
                )
            )
    merged = _deep_merge(merged, {k: v for k, v in data.items() if k != "extends"})
    return merged


_NAME = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def _dropped(inherited: Any, own: Any) -> list[str]:
    """The packages of the inherited list that `own`, which replaces it, leaves out (as written).
    A variant written as `extends: cpu-py311` plus `packages: [tqdm]` lost cpu-py311's einops
    without a word; its image then failed on the team's code, not at validate."""
    if not isinstance(inherited, list) or not isinstance(own, list):
        return []
    kept = {canonical(m.group(1)) for e in own if isinstance(e, str) and (m := _NAME.match(e))}
    return [
        e.strip()
        for e in inherited
        if isinstance(e, str) and (m := _NAME.match(e)) and canonical(m.group(1)) not in kept
    ]


def read_raw(path: Path, shown: str | None = None) -> Loaded:
    """The merged data of a profile file and where each key came from; never raises for bad input."""
    loaded = Loaded(path=path, shown=shown or str(path))
    merged = _read_chain(path, loaded.shown, loaded, ())
    if merged is not None:
        loaded.data = merged
    return loaded


# how a `packages` entry names what is not a release on an index (profile and packagerules say it)
OWN_BUILD = (
    "for a build of your own (a git checkout, a private wheel), put its wheel in a find_links folder "
    "and pin its version"
)
# what pip takes on its command line but a requirement is not: a VCS or other URL, a path, an option ("-e .")
_NOT_A_RELEASE = re.compile(r"^(?:[a-z]+\+[a-z]+://|[a-z]+://|[-./~])", re.IGNORECASE)


def unparsable_fix(item: str) -> str:
    """The fix for a `packages` entry that is no PEP 508 requirement."""
    if _NOT_A_RELEASE.match(item.strip()):
        return f"packages are releases (NAME==VERSION); {OWN_BUILD}"
    # a pin written as YAML or pip's freeze of another tool would have it: "einops = 0.8.1", "einops 0.8.1"
    near = re.fullmatch(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:=|:|\s)\s*v?([0-9][0-9A-Za-z.+!-]*)\s*", item)
    if near:
        return f'write "{near[1]}=={near[2]}"'
    return 'write e.g. "einops==0.8.0"'
