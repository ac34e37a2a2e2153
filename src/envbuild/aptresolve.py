"""Resolving apt.lock: apt itself, in a throwaway container of the profile's base image.

apt is the only resolver that knows Debian's and Ubuntu's dependency rules and what the archive
serves today, so envbuild asks it rather than re-implementing either: `apt-get install -s` says
which packages (dependencies included) the install would unpack, `--print-uris` gives each one's
URL, size and sha256, and dpkg lists what the base already has. Nothing is installed.
"""

from __future__ import annotations

import contextlib
import datetime
import shlex
from typing import Any

from envbuild import aptfile, engine, lockfile, proc
from envbuild.aptfile import AptLock, apt_lock_name
from envbuild.errors import LockError
from envbuild.freshness import lock_dir
from envbuild.fsutil import atomic_write_many
from envbuild.plan import Plan
from envbuild.project import Project

_ENGINE_ARCH = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}
RESOLVE_TIMEOUT_S = 600


def _script(plan: Plan, snapshot: str) -> str:
    lines = [
        "set -e",
        "export DEBIAN_FRONTEND=noninteractive",
        aptfile.snapshot_script(snapshot),
        "apt-get update -qq -o Acquire::Retries=3 >/dev/null",
        "echo '@@ base'",
        aptfile.DPKG_LIST,
    ]
    for stage, packages in sorted(plan.apt_stages.items()):
        words = " ".join(shlex.quote(p) for p in packages)
        lines += [
            f"echo '@@ sim {stage}'",
            f"apt-get install -s -y --no-install-recommends {words}",
            f"echo '@@ uris {stage}'",
            f"apt-get install --print-uris -qq -y --no-install-recommends {words}",
            f"echo '@@ show {stage}'",
            # name=version of each package the simulation would unpack ("Inst NAME [OLD] (VERSION ...")
            f"pins=$(apt-get install -s -y --no-install-recommends {words}"
            ' | awk \'$1=="Inst" {v=($3 ~ /^\\[/) ? $4 : $3; sub(/^\\(/, "", v); print $2 "=" v}\')',
            'if [ -n "$pins" ]; then apt-cache show $pins; fi',
        ]
    return "\n".join(lines) + "\n"


def _sections(output: str) -> dict[str, str]:
    parts: dict[str, list[str]] = {}
    current = ""
    for line in output.splitlines():
        if line.startswith("@@ "):
            current = line[3:].strip()
            parts[current] = []
        elif current:
            parts[current].append(line)
    return {k: "\n".join(v) for k, v in parts.items()}


def _run(cli: Any, image: str, script: str) -> tuple[int, str]:
    """Run `script` as root in a container of `image`; (exit code, output). The container is
    removed whatever happens, an interrupt included."""
    import docker

    container = cli.containers.create(image, ["sh", "-c", script], user="0", labels={"io.envbuild.apt-resolve": "1"})
    try:
        container.start()
        code = int(container.wait(timeout=RESOLVE_TIMEOUT_S).get("StatusCode", 1))
        return code, container.logs(stdout=True, stderr=True).decode("utf-8", "replace")
    except docker.errors.APIError as exc:
        raise LockError(f"apt.lock: the engine could not run {image}: {exc.explanation or exc}") from exc
    finally:
        with contextlib.suppress(docker.errors.APIError):
            container.remove(force=True)


def _hint(plan: Plan, output: str) -> str:
    low = output.lower()
    if "unable to locate package" in low or "has no installation candidate" in low:
        return (
            f"a package of {plan.name}'s `apt:` list (or {plan.python_bin}) does not exist in this base's "
            "archive: check the name, or set `base:` to a release that has it"
        )
    if "version" in low and "was not found" in low:
        return "the archive no longer serves that pinned version: set apt_snapshot to a date it was current"
    if "could not resolve" in low or "failed to fetch" in low or "temporary failure" in low:
        return "the engine's containers cannot reach the archive: check their network or proxy"
    return f"see the output above; `docker run --rm -it {plan.base.image} bash` reproduces it"


def resolve(plan: Plan, snapshot: str) -> dict[str, AptLock]:
    """apt.lock for each of the plan's platforms that the engine runs natively, resolved against
    the plan's base. LockError when apt fails; EngineUnavailable/BaseImageError when the engine or
    the base cannot be had."""
    cli = engine.client()
    arch = _ENGINE_ARCH.get(str(cli.info().get("Architecture", "")), "")
    platforms = [p for p in plan.platforms if p == arch]
    if not platforms:
        return {}
    engine.ensure_image(cli, plan.base.image)
    proc.check_cancelled()
    code, output = _run(cli, plan.base.image, _script(plan, snapshot))
    if code != 0:
        tail = "\n".join(output.strip().splitlines()[-8:])
        raise LockError(
            f"apt.lock: apt could not resolve {plan.name}'s OS packages on {plan.base.image}:\n{tail}",
            hint=_hint(plan, output),
        )
    parts = _sections(output)
    try:
        base = tuple(sorted(aptfile.from_line(line) for line in parts.get("base", "").splitlines() if line.strip()))
        stages = {
            s: aptfile.read_simulation(
                parts.get(f"sim {s}", ""), parts.get(f"uris {s}", ""), parts.get(f"show {s}", "")
            )
            for s in plan.apt_stages
        }
    except (ValueError, TypeError) as exc:
        raise LockError(f"apt.lock: apt's answer could not be read ({exc})") from exc
    archive = next((d.url.split("/pool/", 1)[0] for debs in stages.values() for d in debs if "/pool/" in d.url), "")
    out = {}
    for platform in platforms:
        record = lockfile.new_record(
            profile=plan.name,
            python=plan.profile.python,
            platform=platform,
            build=plan.profile.build_tag,
            route="apt",
            index=archive or "the base's apt sources",
            input_digest=plan.apt_digest,
            resolution=aptfile.resolution_of(base, stages, snapshot),
        )
        out[platform] = AptLock(record, plan.base.image, snapshot, base, stages)
    return out


def snapshot_of(plan: Plan, now: datetime.datetime | None = None) -> str:
    """The snapshot timestamp a new apt.lock records: the configured one, today's for `auto`."""
    if plan.apt_snapshot == "auto":
        when = now or datetime.datetime.now(datetime.timezone.utc)
        return when.strftime("%Y%m%dT%H%M%SZ")
    return plan.apt_snapshot or ""


def lock(project: Project, plan: Plan, *, dry_run: bool = False) -> tuple[str, int]:
    """Resolve and write the plan's apt.lock files; (what was done, packages locked)."""
    locks = resolve(plan, snapshot_of(plan))
    if not locks:
        return "apt.lock: no platform of this profile runs on this engine; not locked", 0
    directory = lock_dir(project, plan.name)
    files = {directory / apt_lock_name(p): aptfile.text(apt, f"envbuild lock {plan.name}") for p, apt in locks.items()}
    proc.check_cancelled()
    if not dry_run:
        atomic_write_many(files)
    count = max(sum(len(d) for d in apt.stages.values()) for apt in locks.values())
    return f"apt.lock: {count} OS packages on {plan.base.image}", count
