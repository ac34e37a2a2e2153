"""Read a failed build's last lines for the causes a user can fix, and name the fix.

The engine's own message is "The command '...' returned a non-zero code: 100", which is
true and useless; the line that matters (apt's "Unable to locate package", pip's hash
mismatch) is somewhere in the tail. Pure text in, text out: build.py keeps the step, the
tail and the log path under whatever this says.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from envbuild import fetchfail
from envbuild.errors import BuildError, BuildFailure, WriteFailed

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def plain(line: str) -> str:
    """A build-output line without the colour codes the legacy builder puts around stderr."""
    return _ANSI.sub("", line)


@dataclass(frozen=True)
class Diagnosis:
    message: str
    hint: str


def _hash_mismatch(tail: list[str], name: str) -> Diagnosis | None:
    # pip: "THESE PACKAGES DO NOT MATCH THE HASHES", then "    numpy==2.1.3 from URL:";
    # uv: "  cause: Hash mismatch for `numpy==2.1.3`"
    uv = [m.group(1) for line in tail if (m := re.search(r"Hash mismatch for `([^`]+)`", line))]
    if not uv and not any("DO NOT MATCH THE HASHES" in line for line in tail):
        return None
    pkgs = uv + [m.group(1) for line in tail if (m := re.match(r"^\s*([A-Za-z0-9_.-]+==\S+) from ", line))]
    return Diagnosis(
        f"hash mismatch for {', '.join(dict.fromkeys(pkgs)) or 'a locked file'}: "
        "the downloaded file is not the one the lockfile pinned",
        f"if the lockfile was edited, restore it; else re-lock on purpose: envbuild lock {name} --upgrade",
    )


def _first(pattern: str, tail: list[str]) -> re.Match[str] | None:
    compiled = re.compile(pattern)
    return next((m for line in tail if (m := compiled.search(line))), None)


@dataclass(frozen=True)
class _Rule:
    """A line pattern and what it means. Templates see {name} (the profile), {g1}, {g2} (the
    pattern's groups) and {where} (" (first group)" when one matched, else nothing)."""

    pattern: str
    message: str
    hint: str


# Causes before their symptoms: pip prints "No matching distribution" after a TLS or network
# failure too, and apt "Unable to locate package" when `apt-get update` could not reach its mirror.
_RULES = (
    _Rule(
        # pip, apt, curl; then uv (rustls): "invalid peer certificate: UnknownIssuer"
        r"CERTIFICATE_VERIFY_FAILED|Certificate verification failed|certificate verify failed"
        r"|self[- ]signed certificate|invalid peer certificate",
        "a download inside the build was refused: the server's TLS certificate is not trusted",
        "behind a TLS-intercepting proxy, pass its CA bundle: envbuild build {name} "
        "--ca-bundle /etc/ssl/certs/ca-certificates.crt (it stays in the builder stage)",
    ),
    _Rule(
        r"Temporary failure resolving '([^']+)'|Failed to establish a new connection|Could not resolve host: (\S+)"
        r"|Could not fetch URL (\S+)|failed to lookup address information|client error \(Connect\)",
        "the build could not reach the network{where}",
        "check the engine's DNS and proxy settings, or build from a wheelhouse: envbuild build {name} --find-links DIR",
    ),
    _Rule(
        r"E: Unable to locate package (\S+)",
        "apt has no package '{g1}' in the base image's distribution",
        "fix or remove it in the `apt:` list of {name}'s profile (`apt-cache search` in the base image finds names)",
    ),
    _Rule(
        r"^\s*envbuild-apt: base-differs",
        "the base image's own packages are not the ones apt.lock was resolved against (a different or updated base)",
        "re-lock against this base: envbuild lock {name} --base IMAGE (the build log shows the differing packages)",
    ),
    _Rule(
        r"^\s*envbuild-apt: sha256-mismatch",
        "a downloaded .deb is not the file apt.lock records (its sha256 differs)",
        "if apt.lock was edited, restore it; else the archive or a proxy changed the file: re-lock on purpose "
        "with envbuild lock {name}",
    ),
    _Rule(
        r"^\s*envbuild-apt: packages-differ",
        "after the install, dpkg lists other packages than apt.lock expects",
        "re-lock with envbuild lock {name} (the build log shows the difference)",
    ),
    _Rule(
        r"E: Version '([^']+)' for '([^']+)' was not found",
        "apt has no version {g1} of {g2} in the base image's distribution",
        "if apt.lock pins it, the archive dropped that version (Debian point releases do): set `apt_snapshot: auto` "
        "(or a timestamp) in {name}'s profile or envbuild.toml and re-lock, so the build reads the dated snapshot "
        "archive; if the `apt:` list pins it, change or drop the version pin of {g2}",
    ),
    _Rule(
        # uv, under "Failed to build": the sdist's setup.py imports a package it does not declare
        fetchfail.UNDECLARED.pattern,
        "{g1}'s build imports {g2}, which it does not declare, so its isolated build environment lacks it",
        "add `build_requires: {{{g1}: [{g2}]}}` to {name}'s profile and re-lock: its build then gets the locked {g2}",
    ),
    _Rule(
        # uv: "error: Failed to build `pkg==1.0`" for a package with no wheel (requirements.source.lock)
        r"Failed to build `([^`]+)`",
        "{g1} has no wheel for this platform, and building it from its sdist in the builder failed (the builder "
        "has Python and the build backend the lockfile pins, and a C/C++ compiler only for a profile with "
        "build_requires; the log shows the build's error)",
        "pin a version of it that has a wheel for this platform (PyPI's file list shows which), or drop it from "
        "{name}'s profile and re-lock",
    ),
    _Rule(
        r"No matching distribution found for (\S+)",
        "pip found no file for {g1} where the lockfile says it comes from",
        "pass the wheelhouse it was locked from (envbuild build {name} --find-links DIR), "
        "or re-lock: envbuild lock {name} --upgrade",
    ),
)


# Before everything, the hash check included: a download cut short by a full disk fails its hash too.
_DISK_FULL = _Rule(
    r"[Nn]o space left on device",
    "the engine ran out of disk space",
    "free space where the engine keeps images (`docker info`: Docker Root Dir): `envbuild images --prune` "
    "removes this project's old images, `docker builder prune` and `docker image prune` the engine's caches; "
    "a CUDA build needs room for the wheels, the builder stage and the ~6 GB image at once",
)


def _apply(rule: _Rule, tail: list[str], profile: str) -> Diagnosis | None:
    m = _first(rule.pattern, tail)
    if m is None:
        return None
    groups = [g for g in m.groups() if g]
    fields = {"name": profile, "where": f" ({groups[0]})" if groups else ""}
    fields |= {f"g{i}": g or "" for i, g in enumerate(m.groups(), 1)}
    return Diagnosis(rule.message.format(**fields), rule.hint.format(**fields))


def diagnose(tail: list[str], profile: str) -> Diagnosis | None:
    """What went wrong in a build whose last lines are `tail`, when it is something the user can fix."""
    found = _apply(_DISK_FULL, tail, profile) or _hash_mismatch(tail, profile)
    if found is not None:
        return found
    return next((d for rule in _RULES if (d := _apply(rule, tail, profile)) is not None), None)


TAIL = 40
LINE_MAX = 500


class BuildLog:
    """The full build log on disk plus the last lines in memory for the error message."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.fh = path.open("w", encoding="utf-8")
        self.tail: list[str] = []
        self.step = ""
        self.steps = 0
        self.ran = 0  # steps that executed a container ("Running in"), i.e. were not cached
        self._partial = ""

    def feed(self, chunk: str) -> list[str]:
        """The complete lines a stream chunk finishes. The engine's chunks are not lines: a step's
        stderr can arrive as "E", ": ", "Unable to locate package x\n"."""
        *done, self._partial = (self._partial + chunk).split("\n")
        for text in done:
            self.line(text)
        return done

    def flush(self) -> list[str]:
        rest, self._partial = self._partial, ""
        if not plain(rest):  # nothing, or only the colour reset that ends a step's stderr
            return []
        self.line(rest)
        return [rest]

    def line(self, text: str) -> None:
        text = plain(text)
        self.fh.write(text + "\n")
        self.fh.flush()
        if text.strip():
            self.tail = [*self.tail[-(TAIL * 4) :], text]

    def close(self) -> None:
        self.fh.close()

    def error(self, profile: str, message: str) -> BuildError:
        """The build's error: what went wrong in words where diagnose knows it, else the engine's."""
        found = diagnose(self.tail, profile)
        if found is None:
            return BuildError(f"build of {profile} failed: {message.strip()}", self.failure(), hint=f"see {self.path}")
        return BuildError(f"build of {profile} failed: {found.message}", self.failure(), hint=found.hint)

    def failure(self) -> BuildFailure:
        # One line can be megabytes (pip prints every file a failed copy left behind on one line);
        # the error shows its start, the log keeps all of it.
        tail = [
            t if len(t) <= LINE_MAX else f"{t[:LINE_MAX]}... ({len(t)} characters, all in the log)" for t in self.tail
        ]
        return BuildFailure(step=self.step or "(before the first step)", tail=tail[-TAIL:], log_path=str(self.path))


def packing_error(ctx: Path, exc: OSError) -> WriteFailed:
    """The error for an OSError while the SDK packs the build context: a full TMPDIR named as such."""
    import errno
    import tempfile

    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno == errno.ENOSPC:
            where = tempfile.gettempdir()
            return WriteFailed(
                f"no space left in {where} to pack the build context ({ctx})",
                hint="free space there, or point TMPDIR at a disk with room (the context is packed there first)",
            )
        seen = seen.__cause__ or seen.__context__
    return WriteFailed(f"cannot pack the build context {ctx}: {exc}", hint="check the folder's files and permissions")
