"""Read a failed build's last lines for the causes a user can fix, and name the fix.

The engine's own message is "The command '...' returned a non-zero code: 100", which is
true and useless; the line that matters (apt's "Unable to locate package", pip's hash
mismatch) is somewhere in the tail. Pure text in, text out: build.py keeps the step, the
tail and the log path under whatever this says.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def plain(line: str) -> str:
    """A build-output line without the colour codes the legacy builder puts around stderr."""
    return _ANSI.sub("", line)


@dataclass(frozen=True)
class Diagnosis:
    message: str
    hint: str


def _hash_mismatch(tail: list[str], name: str) -> Diagnosis | None:
    if not any("DO NOT MATCH THE HASHES" in line for line in tail):
        return None
    pkgs = [m.group(1) for line in tail if (m := re.match(r"^\s*([A-Za-z0-9_.-]+==\S+) from ", line))]
    return Diagnosis(
        f"hash mismatch for {', '.join(dict.fromkeys(pkgs)) or 'a locked file'}: "
        "the downloaded file is not the one the lockfile pinned",
        f"if the lockfile was edited, restore it; else re-lock on purpose: envbuild lock {name} --upgrade",
    )


def _first(pattern: str, tail: list[str]) -> re.Match[str] | None:
    compiled = re.compile(pattern)
    return next((m for line in tail if (m := compiled.search(line))), None)


def _apt_package(tail: list[str], name: str) -> Diagnosis | None:
    m = _first(r"E: Unable to locate package (\S+)", tail)
    if m is None:
        return None
    return Diagnosis(
        f"apt has no package {m.group(1)!r} in the base image's distribution",
        f"fix or remove it in the `apt:` list of {name}'s profile (`apt-cache search` in the base image finds names)",
    )


def _apt_version(tail: list[str], name: str) -> Diagnosis | None:
    m = _first(r"E: Version '([^']+)' for '([^']+)' was not found", tail)
    if m is None:
        return None
    return Diagnosis(
        f"apt has no version {m.group(1)} of {m.group(2)} in the base image's distribution",
        f"change or drop the version pin of {m.group(2)} in the `apt:` list of {name}'s profile",
    )


def _tls(tail: list[str], name: str) -> Diagnosis | None:
    if _first(r"CERTIFICATE_VERIFY_FAILED|Certificate verification failed|self[- ]signed certificate", tail) is None:
        return None
    return Diagnosis(
        "a download inside the build was refused: the server's TLS certificate is not trusted",
        "behind a TLS-intercepting proxy, pass its CA bundle: "
        f"envbuild build {name} --ca-bundle /etc/ssl/certs/ca-certificates.crt (it stays in the builder stage)",
    )


def _network(tail: list[str], name: str) -> Diagnosis | None:
    m = _first(
        r"Temporary failure resolving '([^']+)'|Failed to establish a new connection|Could not resolve host: (\S+)"
        r"|Could not fetch URL (\S+)",
        tail,
    )
    if m is None:
        return None
    host = next((g for g in m.groups() if g), "")
    return Diagnosis(
        f"the build could not reach the network{f' ({host})' if host else ''}",
        "check the engine's DNS and proxy settings, or build from a wheelhouse: "
        f"envbuild build {name} --find-links DIR",
    )


def _no_distribution(tail: list[str], name: str) -> Diagnosis | None:
    m = _first(r"No matching distribution found for (\S+)", tail)
    if m is None:
        return None
    return Diagnosis(
        f"pip found no file for {m.group(1)} where the lockfile says it comes from",
        f"pass the wheelhouse it was locked from (envbuild build {name} --find-links DIR), or re-lock: "
        f"envbuild lock {name} --upgrade",
    )


# Causes before their symptoms: pip prints "No matching distribution" after a TLS or network
# failure too, and apt "Unable to locate package" when `apt-get update` could not reach its mirror.
_RULES: tuple[Callable[[list[str], str], Diagnosis | None], ...] = (
    _hash_mismatch,
    _tls,
    _network,
    _apt_package,
    _apt_version,
    _no_distribution,
)


def diagnose(tail: list[str], profile: str) -> Diagnosis | None:
    """What went wrong in a build whose last lines are `tail`, when it is something the user can fix."""
    for rule in _RULES:
        found = rule(tail, profile)
        if found is not None:
            return found
    return None
