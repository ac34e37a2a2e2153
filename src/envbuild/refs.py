"""Image references as Docker reads them, checked before the engine is asked.

The engine answers a malformed reference with "invalid reference format" only once a build, a tag
or a push reaches it; checked here, the option or setting is named before any work starts.
Kept free of pydantic: `envbuild.toml` is read by every command, `list` and `--help` included.
"""

from __future__ import annotations

import re

from envbuild.errors import UsageError

# Docker's reference grammar (distribution/reference), lower-cased path components.
_COMP = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_LABEL = r"[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?"
_DOMAIN = rf"(?:{_LABEL}(?:\.{_LABEL})*(?::\d+)?)"
IMAGE_RE = re.compile(rf"^(?:{_DOMAIN}/)?{_COMP}(?:/{_COMP})*(?::[\w][\w.-]{{0,127}})?(?:@sha256:[a-f0-9]{{64}})?$")
# Where images are pushed: a host, then a path envbuild adds `:NAME` tags to. The path is required:
# `localhost:5000` alone would make `localhost:5000:cpu-py311`, which is not a reference at all.
REGISTRY_RE = re.compile(rf"^{_DOMAIN}(?:/{_COMP})+$")
# A local image repository (`build --tag`, envbuild.toml's `repository`): no tag, no digest.
REPOSITORY_RE = re.compile(rf"^(?:{_DOMAIN}/)?{_COMP}(?:/{_COMP})*$")

DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
# An index or mirror (index_url, torch_index): no quote, space, $ or backslash, which would break
# out of the rendered Dockerfile and the resolver's command line.
URL_RE = re.compile(r"^(https?|file)://[^\s\"'`$\\]+$")

_KINDS = {
    "image": (IMAGE_RE, "an image reference", "ubuntu:22.04@sha256:<digest>"),
    "registry": (REGISTRY_RE, "a registry path (HOST[:PORT]/PATH)", "ghcr.io/acme/envs"),
    "repository": (REPOSITORY_RE, "an image repository (lower case, no tag)", "envbuild or registry.local/team/envs"),
    "digest": (DIGEST_RE, "a manifest digest", "sha256:<64 hex>, as push printed it"),
    "url": (URL_RE, "an http(s):// or file:// URL", "https://pypi.example/simple"),
}


_CREDENTIALS = re.compile(r"(?<=://)[^/@\s]+@")


def redact(text: str) -> str:
    """URLs with their user:password@ part replaced, for anything written or printed."""
    return _CREDENTIALS.sub("***@", text)


def check(where: str, value: str | None, kind: str) -> None:
    """UsageError naming `where` (an option or a setting) when `value` is not a `kind` reference."""
    pattern, what, example = _KINDS[kind]
    if value is not None and not pattern.fullmatch(value):
        raise UsageError(
            f"{where} {value!r} is not {what}", hint=near_miss_fix(pattern, value) or f"write e.g. {example}"
        )


def near_miss_fix(pattern: re.Pattern[str], value: str) -> str | None:
    """The fix where a registry path or repository is one small slip from a good one: an
    organisation's name as GitHub shows it (Acme/Envs), a registry written as a URL
    (http://localhost:5000/envs/), a registry host with no path. An image reference's tag keeps
    its case."""
    if pattern not in (REGISTRY_RE, REPOSITORY_RE):
        return None
    bare = re.sub(r"^[a-zA-Z][a-zA-Z0-9+.-]*://", "", value.strip()).rstrip("/")
    fixed = bare.lower()
    why = []
    if bare != value.strip().rstrip("/"):
        why.append(f"no {value.split('://', 1)[0]}://: the engine picks the protocol")
    if fixed != bare:
        why.append("image paths are lower case")
    if pattern is REGISTRY_RE and re.fullmatch(_DOMAIN, fixed):
        why.append(f"a registry path needs a path after the host (images go to {fixed}/envs:NAME)")
        fixed += "/envs"
        return f"{'; '.join(why)}: write e.g. {fixed}"
    if why and pattern.fullmatch(fixed):
        return f"{'; '.join(why)}: write {fixed}"
    return None


_EXPRESSION = re.compile(r"\$\{\{[^{}]*\}\}")


def check_workflow(where: str, value: str, kind: str) -> None:
    """`check` for a value written into a CI workflow, where `${{ ... }}` expressions may stand for
    parts of it (`ghcr.io/${{ github.repository }}`); each is judged as one path component."""
    pattern, what, example = _KINDS[kind]
    if not pattern.fullmatch(_EXPRESSION.sub("x", value)):
        raise UsageError(
            f"{where} {value!r} is not {what}, even with its ${{{{ ... }}}} expressions filled in",
            hint=f"write e.g. {example} or ghcr.io/${{{{ github.repository }}}}",
        )
