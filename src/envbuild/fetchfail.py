"""One line that says why a resolver failed, and a fix a person can act on.

uv and rattler report an unreachable index as a chain of causes that ends in the
socket error, and the first line of that chain ("Request failed after 3 retries")
is what a progress display or a CI summary shows. This reads the chain and names
the host, the cause and the setting that routes around it. Pure text in, text
out: the callers keep the resolver's whole message below the summary.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import urlsplit

from envbuild.errors import EnvbuildError
from envbuild.names import TORCH_FAMILY_RE, canonical
from envbuild.refs import redact

E = TypeVar("E", bound=EnvbuildError)

# uv: "Because NAME was not found in the package registry and ..." (an index or a wheelhouse alike)
_MISSING = re.compile(r"\b(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)\s+was\s+not\s+found\s+in\s+the\s+package\s+registry")
# uv, when an sdist's build fails on an import (buildfail reads a build's log with it too): "This
# error likely indicates that `torch-scatter@2.1.2` depends on `torch`, but doesn't declare it as a
# build dependency"
UNDECLARED = re.compile(
    r"indicates that `(?P<name>[^`@]+)@[^`]*` depends on `(?P<dep>[^`]+)`, but doesn't declare it as a build dependency"
)
# uv: "failed to write to file `PATH`: No space left on device (os error 28)"; rattler alike
_FULL = re.compile(r"(?:`(?P<path>/[^`]+)`[^\n]*?)?(?:No space left on device|Disk quota exceeded)", re.I)
_URL = re.compile(r"(?:Failed to fetch:|request for url \(|Failed to download)\s*`?(?P<url>\w+://[^\s`)]+)")
# reqwest, under both uv and rattler: "HTTP status client error (401 Unauthorized) for url (...)".
_REFUSED = re.compile(r"\b(?P<code>40[13]) (?:Unauthorized|Forbidden)\b")
# The socket-level causes, most specific first: uv and rattler both chain reqwest's errors.
_CAUSES = (
    ("dns error", "its name does not resolve (DNS)"),
    ("failed to lookup address", "its name does not resolve (DNS)"),
    ("connection refused", "the connection was refused"),
    ("timed out", "the connection timed out"),
    ("invalid peer certificate", "its TLS certificate is not trusted"),
    ("certificate verify failed", "its TLS certificate is not trusted"),
    ("network is unreachable", "the network is unreachable"),
    ("connection reset", "the connection was reset"),
)


@dataclass(frozen=True)
class Explanation:
    summary: str
    hint: str

    def with_detail(self, detail: str) -> str:
        """The summary over the tool's own message, without repeating a line the summary quotes."""
        lines = detail.strip().splitlines()
        if lines and lines[0].strip() in self.summary:
            lines = lines[1:]
        return "\n".join([self.summary, *lines])


def explain(tool: str, text: str, route: str, unsolved: Explanation | None = None) -> Explanation | None:
    """Why `tool` failed, when its message says so in a way this recognises; else None.

    `route` is the caller's way around an unreachable source ("point `index_url:` at a mirror");
    `unsolved`, what a resolution that found no answer means to a caller that is not a profile's lock.
    """
    lowered = text.lower()
    full = _FULL.search(text)
    if full is not None:  # before all else: a download cut short by it reads as a network error too
        where = f" writing {full.group('path')}" if full.group("path") else ""
        return Explanation(
            f"{tool} ran out of disk space{where}",
            "free space where it writes, or move that there: TMPDIR (envbuild's temporary folders), "
            "UV_CACHE_DIR (uv's cache, ~/.cache/uv by default); `envbuild cache --prune` frees the wheel cache",
        )
    undeclared = UNDECLARED.search(text)
    if undeclared is not None:  # uv's own hint names its settings files, which envbuild writes for the user
        name, dep = undeclared.group("name"), undeclared.group("dep")
        return Explanation(
            f"{tool} could not build {name} from its sdist: its build imports {dep}, which it does not declare",
            f"add `build_requires: {{{name}: [{dep}]}}` to the profile: {name}'s build then gets {dep} at the "
            "version the profile pins (in the image, the version the lockfile pins)",
        )
    if "no solution found" in lowered:
        missing = _MISSING.search(text)
        if missing is not None:
            return _not_found(tool, missing.group("name"))
        return unsolved or Explanation(
            f"{tool} found no set of versions that satisfies the profile's pins",
            "the resolver's reasoning follows; change the pin it names "
            "(`envbuild compat torch==X.Y.Z` shows what a torch release pairs with)",
        )
    found = _URL.search(text)
    if found is None:
        return None
    url = found.group("url")
    host = urlsplit(url).hostname or url
    refused = _REFUSED.search(text)
    if refused is not None:
        return Explanation(
            f"{tool}: {host} refused the request (HTTP {refused.group('code')}) for {url}",
            "the index needs credentials: put them in the index URL or in ~/.netrc",
        )
    cause = next((said for key, said in _CAUSES if key in lowered), None)
    if cause is None:
        return None
    return Explanation(f"{tool} cannot reach {host}: {cause} ({url})", _hint_for(host, cause, route))


def _not_found(tool: str, name: str) -> Explanation:
    """A package no index or wheelhouse has: no pin can fix that, so the usual hint would mislead."""
    summary = f"{tool} found no package {name} in the indexes and wheelhouses this lock reads"
    if TORCH_FAMILY_RE.fullmatch(canonical(name)):
        return Explanation(
            summary,
            "the torch family comes from one place: the PyTorch index, or a wheelhouse (--find-links, "
            f"`find_links:`) that then stands in for it and must hold {name}'s wheel too; add it there, or "
            "point --torch-index (`torch_index:`) at an index that has it",
        )
    return Explanation(
        summary,
        f"check the spelling of {name} in the profile's `packages` (or, when a package requires it, that "
        "package's version), or add the index it is on (`index_url:`, --index-url)",
    )


def _hint_for(host: str, cause: str, route: str) -> str:
    if "certificate" in cause:
        return "behind a TLS-intercepting proxy, point SSL_CERT_FILE at the proxy's CA bundle (uv and rattler read it)"
    return f"check the network path to {host} (HTTPS_PROXY), or {route}"


def describe(tool: str, text: str, route: str, fallback_hint: str, unsolved: Explanation | None = None) -> Explanation:
    """`explain`, or the message's first line under the caller's generic fix."""
    why = explain(tool, text, route, unsolved)
    if why is not None:
        return why
    first = next((line.strip() for line in text.splitlines() if line.strip()), "no message")
    return Explanation(f"{tool} failed: {first}", fallback_hint)


def failure(
    kind: type[E], tool: str, output: str, route: str, fallback_hint: str, unsolved: Explanation | None = None
) -> E:
    """The error for a tool's failed run: credentials redacted, summarised, the tool's own words kept below."""
    message = redact(output.strip())
    why = describe(tool, message, route, fallback_hint, unsolved)
    return kind(why.with_detail(message[-3000:]), hint=why.hint)
