"""Publishing: push only smoke-tested images, pull with verification against the local lock."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from envbuild import engine, enginelost, freshness, smokerecord
from envbuild import plan as plan_mod
from envbuild.errors import EnvbuildError, PublishError, UsageError, VerifyError
from envbuild.localimage import local_facts, profile_image, repository
from envbuild.names import (
    EXPECT_PATH,
    LABEL_CONTENT_DIGEST,
    LABEL_IMAGE_DIGEST,
    LABEL_IMAGE_INPUTS,
    LABEL_LOCK_SHA,
    Events,
    immutable_tag,
    moving_tag,
    quiet,
)
from envbuild.profile import Profile
from envbuild.project import Project

RETRIES = 4


def registry_for(project: Project, prof: Profile, option: str | None) -> str:
    """Where the profile's images live: --registry, the profile's `registry`, envbuild.toml's."""
    reg = option or prof.registry or project.config.registry
    if not reg:
        raise UsageError(
            f"no registry for {prof.name}",
            hint="pass --registry HOST[:PORT]/PATH or set `registry` in the profile or envbuild.toml",
        )
    return reg.rstrip("/")


def _backoff() -> float:
    try:
        return float(os.environ.get("ENVBUILD_RETRY_BACKOFF", "1.0"))
    except ValueError:
        return 1.0


def _transient(message: str) -> bool:
    text = message.lower()
    return any(
        s in text
        for s in (
            "connection refused",
            "timeout",
            "temporarily",
            "502",
            "503",
            "504",
            "eof",
            "connection reset",
            "tls handshake",
            "no such host",
            engine.STALLED,
        )
    )


def _push_once(cli: Any, repo: str, tag: str, say: Events) -> str:
    digest = engine.transfer(cli, "push", lambda: cli.images.push(repo, tag=tag, stream=True, decode=True), say)
    if not digest:
        raise PublishError(f"the registry did not report a digest for {repo}:{tag}")
    return digest


def _with_retries(verb: str, ref: str, action: Callable[[], str], say: Events) -> str:
    import docker
    import requests

    what = f"{verb} {ref}"
    delay = _backoff()
    last = ""
    for attempt in range(1, RETRIES + 1):
        try:
            return action()
        except (PublishError, docker.errors.APIError, requests.exceptions.RequestException) as exc:
            last = str(getattr(exc, "explanation", None) or exc).strip()
            if attempt == RETRIES or not _transient(last):
                break
            say("retry", what, f"attempt {attempt} failed ({last.splitlines()[0][:120]}); retrying in {delay:.1f}s")
            time.sleep(delay)
            delay *= 2
    raise PublishError(f"{what} failed; {_what_happened(ref, last)}", hint=registry_hint(ref, last))


def _unreached(text: str) -> bool:
    """Whether nothing took the engine's connection: no listener, no route, no such name."""
    return any(
        s in text for s in ("connection refused", "no such host", "no route to host", "network is unreachable")
    ) or ("dial tcp" in text and "timeout" in text)


def _silent(text: str) -> bool:
    """Whether something took the connection and then sent no answer in the engine's time."""
    return not _unreached(text) and ("timeout" in text or "deadline exceeded" in text)


def _what_happened(ref: str, last: str) -> str:
    """What the engine's last error says happened, in words that do not call silence an answer."""
    host, text = ref.split("/", 1)[0], last.lower()
    first = last.splitlines()[0] if last else "nothing"
    if text.startswith(engine.STALLED):
        return first
    if _unreached(text):
        return f"nothing answered at {host}: {first}"
    if _silent(text):
        return f"{host} took the connection but did not answer in time: {first}"
    return f"the registry answered: {first}"


def registry_hint(ref: str, answer: str) -> str:
    """The fix for what a registry (or the engine on its behalf) answered about `ref` (HOST/PATH:TAG)."""
    host = ref.split("/", 1)[0]
    text = answer.lower()
    if text.startswith(engine.STALLED):
        return (
            f"the link between the engine and {host} stopped moving data: check the network or proxy on the "
            f"way; on a slow link raise {enginelost.STALL_ENV} (now {enginelost.stall_timeout():g} s)"
        )
    if any(s in text for s in ("no basic auth credentials", "unauthorized", "authentication required", "denied")):
        return (
            f"log in to {host}: `docker login {host}` (envbuild pushes and pulls with the Docker CLI's stored "
            "credentials: $DOCKER_CONFIG/config.json, else ~/.docker/config.json)"
        )
    if "http response to https client" in text:
        return (
            f"{host} speaks plain HTTP: add it to insecure-registries in /etc/docker/daemon.json and restart "
            "dockerd, or serve the registry over TLS"
        )
    if "manifest unknown" in text or "not found" in text:
        return f"nothing is published as {ref}: push it first (envbuild push NAME --registry ...), or check the path"
    if "no such host" in text:
        return f"{host} does not resolve: check the --registry value (or `registry:` in the profile / envbuild.toml)"
    if _silent(text):
        return (
            f"something at {host} takes connections but sends no answer: check that it is a registry and not "
            f"overloaded (`curl -v http://{host}/v2/`, or https://, answers 200 or 401 at once) and any proxy between"
        )
    return f"check that the registry at {host} is up and reachable from the Docker engine"


@dataclass
class PushResult:
    image_id: str
    refs: list[str]
    digest: str


def push(
    project: Project, prof: Profile, *, repo: str | None, registry: str | None, events: Events | None = None
) -> PushResult:
    say = events or quiet
    cli = engine.client()
    # the build of this checkout's lockfiles first: REPO:NAME may be another clone's (another branch)
    facts = local_facts(project, prof)
    local, image = profile_image(cli, project, prof, repo, facts)
    labels = dict(image.labels or {})
    smoke = smokerecord.state(image.attrs)
    if smoke != "passed":
        why = "has not passed the smoke test" if smoke == "untested" else smokerecord.ALTERED
        raise PublishError(
            f"{local} ({image.id[:19]}) {why}; refusing to push it",
            hint=f"build it with the smoke test: envbuild build {prof.name} (without --no-smoke)",
        )
    if stale := mismatches(facts, labels):
        # REPO:NAME published as this profile's image, while the checkout's lockfile says otherwise:
        # CI installing the lockfile and a user pulling the tag would get two environments
        raise PublishError(
            f"{local} was not built from this checkout's profile and lockfiles ({stale[0]}); refusing to push it",
            hint=f"build them first (envbuild build {prof.name}), then push; `envbuild status` shows the image stale",
        )
    content = labels.get(LABEL_CONTENT_DIGEST) or labels.get(LABEL_LOCK_SHA, "")  # older images: the lock alone
    if len(content) != 64:
        raise PublishError(f"{local} carries no envbuild lock label; it was not built by envbuild")
    target = f"{registry_for(project, prof, registry)}"
    refs = [immutable_tag(target, prof.name, content), moving_tag(target, prof.name)]
    digest = ""
    for ref in refs:  # immutable first, the moving tag last
        name, tag = ref.rsplit(":", 1)
        before = _local_id(cli, ref)
        image.tag(name, tag=tag)
        say("phase", "push", ref)

        def attempt(n: str = name, t: str = tag) -> str:
            return _push_once(cli, n, t, say)

        try:
            digest = _with_retries("push", ref, attempt, say)
        except BaseException:
            # the local tag says what the registry has: a push that did not land (or was
            # interrupted) leaves it where it was, not on an image the registry never got
            _restore_tag(cli, ref, before, image.id)
            raise
    return PushResult(image.id, refs, digest)


def _local_id(cli: Any, ref: str) -> str | None:
    import docker

    try:
        return str(cli.images.get(ref).id)
    except docker.errors.ImageNotFound:
        return None


def _restore_tag(cli: Any, ref: str, before: str | None, pushed: str) -> None:
    import docker

    if before == pushed:
        return
    name, tag = ref.rsplit(":", 1)
    with contextlib.suppress(docker.errors.APIError):
        if before is None:
            cli.api.remove_image(ref, noprune=True)  # an untag: the image keeps its project tag
        else:
            cli.api.tag(before, name, tag=tag, force=True)


@dataclass
class PullResult:
    ref: str
    image_id: str
    digest: str
    labels: dict[str, str]
    mismatches: list[str]
    tags: list[str]  # the local tags it now carries, as build would have named it
    smoke: smokerecord.State = "untested"  # whether its passed-smoke record holds (not just the label)


def pull(
    project: Project,
    prof: Profile,
    *,
    registry: str | None,
    repo: str | None = None,
    digest: str | None = None,
    verify: bool = False,
    events: Events | None = None,
) -> PullResult:
    import docker

    say = events or quiet
    cli = engine.client()
    target = registry_for(project, prof, registry)
    ref = f"{target}@{digest}" if digest else f"{target}:{prof.name}"

    def once() -> str:
        name, _, tag = ref.rpartition("@") if digest else ref.rpartition(":")
        engine.transfer(cli, "pull", lambda: cli.api.pull(name, tag=tag, stream=True, decode=True), say)
        return ref

    say("phase", "pull", ref)
    _with_retries("pull", ref, once, say)
    try:
        image = cli.images.get(ref)
    except docker.errors.ImageNotFound as exc:
        raise PublishError(f"{ref} was pulled but is not in the engine") from exc
    repo_digests = [d for d in image.attrs.get("RepoDigests", []) if d.startswith(target + "@")]
    pulled_digest = repo_digests[0].split("@", 1)[1] if repo_digests else (digest or "")
    labels = dict(image.labels or {})
    mismatches = compare(project, prof, labels)
    if any(m.startswith("lockfile sha256") for m in mismatches):
        # two hashes say that the lockfiles differ, not how: name the packages
        mismatches += package_differences(cli, image.id, project, prof)
    smoke = smokerecord.state(image.attrs)
    if smoke == "altered":  # not the image that passed, whatever its labels say: --verify fails on it
        mismatches.append(smokerecord.ALTERED)
    if mismatches and verify:
        raise VerifyError(
            f"{ref} does not match the local profile and lockfile:\n  " + "\n  ".join(mismatches),
            hint=f"pull the image built from this lockfile, or re-lock and rebuild {prof.name}",
        )
    # Tagged as a local build would be, so `envbuild run NAME`, `smoke NAME` and `status` find what
    # was just pulled: they look under the local repository, not under the registry's name.
    content = labels.get(LABEL_CONTENT_DIGEST) or labels.get(LABEL_LOCK_SHA, "")
    local_repo = repository(project, repo)
    moving, immutable = moving_tag(local_repo, prof.name), immutable_tag(local_repo, prof.name, content)
    local = [immutable, moving] if len(content) == 64 else [moving]
    if smoke != "passed":
        # Only an image whose passed-smoke record holds may become the profile's image here.
        why = "it has not passed envbuild's smoke test" if smoke == "untested" else "its smoke test does not hold"
        mismatches.append(f"{why}: not tagged as {moving}")
        local = []
    for local_ref in local:  # the moving tag last, as build does
        name, tag = local_ref.rsplit(":", 1)
        image.tag(name, tag=tag)
    return PullResult(ref, image.id, pulled_digest, labels, mismatches, local[::-1], smoke)


def package_differences(cli: Any, image_id: str, project: Project, prof: Profile) -> list[str]:
    """The packages an image was locked with (its smoke expectations) against the local lockfile's."""
    import json

    text = engine.read_file(cli, image_id, EXPECT_PATH)
    try:
        theirs: dict[str, str] = dict(json.loads(text).get("packages") or {}) if text else {}
        plan = plan_mod.make(project, prof, strict=False)
        ours = {p.name: p.version for p in freshness.require_fresh(project, plan).pins.values()}
    except (ValueError, EnvbuildError):
        return []
    return [
        f"{name}: image has {theirs.get(name, '(none)')}, local lockfile has {ours.get(name, '(none)')}"
        for name in sorted(theirs.keys() | ours.keys())
        if theirs.get(name) != ours.get(name)
    ]


def mismatches(facts: list[tuple[str, str, str]], labels: dict[str, str]) -> list[str]:
    """Differences between an image's labels and `local_facts`, naming both values; for the image
    inputs digest, which of its parts differ, where the image says (its image-inputs label)."""
    out = []
    local = {label: value for _, label, value in facts}
    for what, label, local_value in facts:
        image_value = labels.get(label, "(none)")
        if image_value == local_value or label == LABEL_IMAGE_INPUTS:  # the parts: said on the digest's line
            continue
        line = f"{what}: image has {image_value}, local has {local_value}"
        if label == LABEL_IMAGE_DIGEST:
            parts = _parts_apart(labels.get(LABEL_IMAGE_INPUTS), local.get(LABEL_IMAGE_INPUTS))
            line += f" (it differs in {parts})" if parts else ""
        out.append(line)
    return out


_PARTS = {
    "smoke": "envbuild's smoke test: another envbuild built the image",
    "templates": "the templates",
    "profile": "the profile's fields",
    "checks": "the profile's check scripts",
    "configured_base": "envbuild.toml's base",
}


def _parts_apart(image: str | None, local: str | None) -> str:
    """The parts of the image's inputs (part_digests) that differ from today's, in words; "" where
    the image does not say (built before the label) or says something unreadable."""
    import json

    try:
        theirs, ours = json.loads(image or ""), json.loads(local or "")
    except ValueError:
        return ""
    if not isinstance(theirs, dict) or not isinstance(ours, dict):
        return ""
    return ", ".join(_PARTS.get(k, k) for k in sorted(ours.keys() | theirs.keys()) if theirs.get(k) != ours.get(k))


def compare(project: Project, prof: Profile, labels: dict[str, str]) -> list[str]:
    """Differences between an image's labels and the local profile and lockfile, naming both values."""
    return mismatches(local_facts(project, prof), labels)
