"""The build context of one profile: a folder with the Dockerfile, the lockfile as read once, the
wheels a local wheelhouse holds, the CA bundle and the smoke package; plus the labels that say
what is inside. Same inputs, same bytes. Needs no engine (`build --context-only`).
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import hashlib
import json
import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from envbuild import __version__, buildreqs, compat, freshness, layering, proc, sbomdoc, wheelcache
from envbuild import plan as plan_mod
from envbuild.errors import BuildError, UsageError
from envbuild.freshness import LockSnapshot
from envbuild.fsutil import atomic_write_many
from envbuild.names import (
    ENTRY_SCRIPT,
    LABEL_ACCELERATOR,
    LABEL_APT_LOCK_SHA,
    LABEL_CONTENT_DIGEST,
    LABEL_CUDA,
    LABEL_FLAVOR,
    LABEL_IMAGE_DIGEST,
    LABEL_IMAGE_INPUTS,
    LABEL_LOCK_SHA,
    LABEL_NUMPY,
    LABEL_PROFILE,
    LABEL_PYTHON,
    LABEL_ROCM,
    LABEL_SBOM_SHA,
    LABEL_SOURCE,
    LABEL_TORCH,
    LABEL_VERSION,
    Events,
    content_digest,
    lock_names,
    part_digests,
    quiet,
)
from envbuild.plan import Plan, PlanOptions
from envbuild.project import Project, Provenance, provenance, source_label
from envbuild.torchsource import TorchSource

SMOKE_DIR = "smoke"  # in the context; the image's /opt/envbuild
SMOKE_PACKAGE = "envbuild_smoke"  # the in-image package's import name
SMOKE_ENTRY = "envbuild-smoke"
SBOM_NAME = "sbom.cdx.json"  # beside the manifest: the image's /opt/envbuild/sbom.cdx.json
CHECKS_DIR = "checks"  # the project's own checks, beside expect.json
CHECK_TIMEOUT_S = 600


@dataclass(frozen=True)
class BuildOptions:
    repo: str | None = None
    base: str | None = None
    no_cache: bool = False
    pull: bool = False
    ca_bundle: Path | None = None
    find_links: tuple[str, ...] = ()
    index_url: str | None = None
    torch_index: str | None = None
    smoke: bool = True
    smoke_gpus: str = "auto"
    smoke_timeout: float = 600.0
    builder: str = "docker"  # docker (the SDK) | buildkit
    platform: str | None = None  # None: the engine's (a build) or this machine's (--context-only)

    def plan_options(self) -> PlanOptions:
        return PlanOptions(
            base=self.base, index_url=self.index_url, torch_index=self.torch_index, find_links=self.find_links
        )


@dataclass(frozen=True)
class Context:
    """An assembled build context and what it was made from."""

    directory: Path
    plan: Plan  # with the torch source as the lockfile recorded it
    lock: LockSnapshot
    platform: str
    labels: dict[str, str]
    wheels: tuple[str, ...]
    epoch: int = 0  # SOURCE_DATE_EPOCH of this build (the lockfile's commit time unless set)
    # What is still to be checked of the context (the SBOM's validation, seconds): it may run while
    # the image builds, and must pass before anything is tagged or handed over
    pending: Callable[[], None] | None = None
    # the stages a classic build may run side by side before the whole (buildahead.py)
    sides: tuple[layering.SideStage, ...] = ()
    taking: Callable[[dict[str, str]], str] | None = None  # the Dockerfile, taking images for layer stages

    @property
    def dockerfile(self) -> Path:
        return self.directory / "Dockerfile"

    @property
    def buildargs(self) -> dict[str, str]:
        """The index settings of the install step, from the same source the Dockerfile was rendered with."""
        return {"PIP_INDEX_URL": self.plan.source.index_url, "PIP_EXTRA_INDEX_URL": self.plan.source.extra_index}


ENTRY_SCRIPT_TEXT = (
    "#!/bin/sh\n"
    "# The image's entrypoint after tini (envbuild.names.IMAGE_ENTRYPOINT says why).\n"
    "# A home the user cannot write (HOME=/ for a uid with no passwd entry): /tmp instead, as\n"
    "# `envbuild run` does. A home that works is left alone: uid 1000's, root's.\n"
    'if [ ! -w "${HOME:-/}" ] && [ -d /tmp ] && [ -w /tmp ]; then\n'
    "    HOME=/tmp\n"
    "    export HOME\n"
    "fi\n"
    "# Such a uid has no name either: getpass.getuser() raises KeyError, and torch before 2.13\n"
    "# names torch.compile's cache with it (pytorch/pytorch#140765). USER gives it one.\n"
    'if [ -z "${LOGNAME:-}${USER:-}${LNAME:-}${USERNAME:-}" ] && ! id -un >/dev/null 2>&1; then\n'
    '    USER="uid$(id -u)"\n'
    "    export USER\n"
    "fi\n"
    '[ "$#" -gt 0 ] || set -- python\n'
    'exec "$@"\n'
)
"""The image's /opt/envbuild/entrypoint; the host's smoke run brings its own copy of it."""


PIP_WRAPPERS = ("bin/pip", "bin/pip3")
"""/opt/envbuild/bin, first on the image's PATH: pip, saying how to extend the image when a uid
the environment does not belong to is refused an install (README "Building on an envbuild image")."""


def pip_wrapper() -> str:
    return resources.files("envbuild").joinpath("data/pip-wrapper.sh").read_text("utf-8")


def _flavor_files(plan: Plan, lock: LockSnapshot, groups: dict[str, tuple[str, ...]], sbom: str) -> dict[str, str]:
    """The SBOM, and constraints.txt: a venv image's with the pins its lockfile gives; a conda
    image's only its comment lines, the environment's own pins being appended by the image's build
    (render.conda_held)."""
    if plan.profile.flavor == "venv":
        return {SBOM_NAME: sbom, layering.CONSTRAINTS: layering.constraints(plan, lock.pins, groups)}
    return {SBOM_NAME: sbom, layering.CONSTRAINTS: layering.constraints_head(plan)}


def smoke_files(plan: Plan) -> dict[str, str]:
    """What the context's smoke/ folder holds: the entry script, the in-image package and the
    project's own checks."""
    files = {f"{SMOKE_PACKAGE}/{name}": text for name, text in plan_mod.smoke_sources().items()}
    files.update({f"{CHECKS_DIR}/{name}": text for name, text in plan.checks.items()})
    files[SMOKE_ENTRY] = (
        "#!/bin/sh\n"
        "# Installed in every envbuild image as /usr/local/bin/envbuild-smoke.\n"
        'PYTHONPATH="/opt/envbuild${PYTHONPATH:+:$PYTHONPATH}"\n'
        "export PYTHONPATH\n"
        f'exec python -m {SMOKE_PACKAGE} "$@"\n'
    )
    files[ENTRY_SCRIPT] = ENTRY_SCRIPT_TEXT
    files.update(dict.fromkeys(PIP_WRAPPERS, pip_wrapper()))
    return files


def expectations(plan: Plan, lock: LockSnapshot | None) -> dict[str, Any]:
    """What the smoke test inside the image must find: the profile's versions and the lock's pins."""
    prof = plan.profile
    expect: dict[str, Any] = {
        "profile": prof.name,
        "accelerator": prof.accelerator,
        "python": prof.python,
        "torch": prof.torch,
        "numpy": prof.numpy,
        "cuda": prof.cuda,
        "rocm": prof.rocm,
    }
    if prof.flavor == "venv" and lock is not None:
        expect["packages"] = {p.name: p.version for p in lock.pins.values()}
    expect["compile"] = prof.compile
    # relative to the folder of expect.json (the image's /opt/envbuild), where the scripts are put
    expect["checks"] = [
        {"file": name, "path": f"{CHECKS_DIR}/{name}", "timeout": CHECK_TIMEOUT_S} for name in sorted(plan.checks)
    ]
    if prof.cuda:
        db = compat.load()
        floor = db.driver_floor(prof.cuda)
        arches = db.arches_for(prof.cuda, prof.torch)
        expect["driver_floor"] = floor.model_dump() if floor else None
        expect["arches"] = arches.sm if arches else None
    return expect


def _local_dirs(links: tuple[str, ...]) -> list[Path]:
    """The local folders among find-links entries (paths or file:// URLs) that exist here."""
    out: list[Path] = []
    for link in links:
        if "://" in link and not link.startswith("file://"):
            continue
        path = Path(unquote(urlparse(link).path)) if link.startswith("file:") else Path(link)
        if path not in out and path.is_dir():
            out.append(path)
    return out


def _cached_wheels(
    houses: list[Path], lock: LockSnapshot, ca: Path | None, say: Events, fetch: bool, user: tuple[Path, Path]
) -> dict[Path, str]:
    """{cached wheel: distribution} for the lock's wheels: from the host's wheel cache, a local
    wheelhouse (matched by the locked hash, never anything else from there), or downloaded once from
    the lockfile's own URL. A cache is a shortcut, never a requirement: what it cannot get, the
    builder fetches from the index the lockfile records."""
    return wheelcache.for_lock(
        lock.pylock_text, lock.pins, houses, ca, lambda text: say("phase", "wheels", text), fetch=fetch, user=user
    )


def _build_source(plan: Plan, lock: LockSnapshot, placed: dict[Path, str]) -> TorchSource:
    """The lock's own torch route, reached through today's mirrors; when the wheel cache gave every
    wheel the lock pins, no index is asked at all (offline: the build then needs no network for
    Python packages, nor a CA bundle for them); when it gave every torch-family wheel the lock takes
    from the PyTorch index, that index is not asked."""
    src = plan.source_as_locked(lock.record.route, lock.record.index)
    if wheelcache.complete(lock.pins, placed):
        return dataclasses.replace(src, offline=True)
    if src.route != "index":
        return src
    index = lock.record.index.rstrip("/")
    from_torch_index = {name for name, pin in lock.pins.items() if pin.source.rstrip("/") == index}
    if from_torch_index and from_torch_index <= set(placed.values()):  # for_lock's names: canonical
        return dataclasses.replace(src, torch_index=None, torch_index_flat=True)
    return src


def _read_ca(path: Path) -> str:
    try:
        text = path.read_text("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--ca-bundle {path}: cannot read it ({exc})", hint="check --ca-bundle or ca_bundle") from exc
    if "-----BEGIN CERTIFICATE-----" not in text:
        raise UsageError(
            f"--ca-bundle {path}: not a PEM certificate bundle", hint="pass a file with BEGIN CERTIFICATE blocks"
        )
    return text


def _check_sbom(text: str, marker: Path) -> None:
    """The library's validator on the document the image carries; its key is kept once it passed, so
    the next build of the same document under the same library does not run it again."""
    _validate_sbom(text)
    atomic_write_many({marker: sbomdoc.validation_key(text)})


_VALIDATE = """
import sys
from envbuild.sbomdoc import validate_document
try:
    validate_document(sys.stdin.read())
except ValueError as exc:
    sys.exit(" ".join(str(exc).split()))
"""


def _validate_sbom(text: str) -> None:
    """sbomdoc.validate_document in a process of its own: it is 2 s of pure Python, and in this one it
    would hold the GIL that docker-py needs to tar and send the context beside it."""
    argv = [sys.executable, "-c", _VALIDATE]
    done = proc.run(argv, error=BuildError, timeout=300, what="the SBOM validator", stdin=text)
    if done.returncode != 0:
        # a document envbuild made that its library refuses: a bug, and never shipped
        raise ValueError(done.stderr.strip() or f"the SBOM validator failed (exit {done.returncode})")


def _read_or_empty(path: Path) -> str:
    try:
        return path.read_text("utf-8")
    except (OSError, UnicodeDecodeError):
        return ""


def labels_for(project: Project, plan: Plan, lock_sha: str, made: Provenance, apt_sha: str = "") -> dict[str, str]:
    prof = plan.profile
    created = datetime.datetime.fromtimestamp(made.epoch, datetime.timezone.utc).isoformat().replace("+00:00", "Z")
    content = content_digest(lock_sha, plan.image_digest, apt_sha)
    labels = {
        "org.opencontainers.image.created": created,
        "org.opencontainers.image.version": f"{prof.name}-{content[:12]}",
        "org.opencontainers.image.revision": made.revision,
        LABEL_SOURCE: source_label(project),
        "org.opencontainers.image.title": f"envbuild {prof.name}",
        "org.opencontainers.image.description": prof.description or f"PyTorch {prof.torch} ({prof.build_tag})",
        "org.opencontainers.image.base.name": plan.base.image,
        LABEL_VERSION: __version__,
        LABEL_PROFILE: prof.name,
        LABEL_IMAGE_DIGEST: plan.image_digest,
        LABEL_IMAGE_INPUTS: part_digests(plan.image_inputs),
        LABEL_LOCK_SHA: lock_sha,
        LABEL_CONTENT_DIGEST: content,
        LABEL_FLAVOR: prof.flavor,
        LABEL_PYTHON: prof.python,
        LABEL_TORCH: prof.torch,
        LABEL_NUMPY: prof.numpy,
        LABEL_ACCELERATOR: prof.accelerator,
    }
    optional = {LABEL_APT_LOCK_SHA: apt_sha, LABEL_CUDA: prof.cuda, LABEL_ROCM: prof.rocm}
    return {**labels, **{k: v for k, v in optional.items() if v}}


def _settle(ctx: Path, epoch: int) -> None:
    """One time and one set of modes for what the context holds, whoever assembled it and when."""
    for path in [ctx, *sorted(ctx.rglob("*"))]:
        if path.is_symlink() or path.suffix == ".whl" or path.parent.name == "tools":
            continue  # links to the wheel cache and uv (their times and modes are the cache's)
        os.utime(path, (epoch, epoch))
        # COPY keeps a context file's mode: under a umask of 077 /opt/envbuild's folders were root's
        # alone (the image's user could not read the project's checks nor run the pip wrapper), and
        # each umask gave the image other layer digests. A file linked from elsewhere (an sdist from
        # a local wheelhouse) keeps its owner's mode: only the builder, as root, reads it.
        info = path.stat()
        if path.is_dir() or info.st_nlink == 1:
            path.chmod(0o755 if path.is_dir() or info.st_mode & 0o100 else 0o644)


def prepare(
    project: Project, plan: Plan, opts: BuildOptions, platform: str, events: Events | None = None, *, fetch: bool = True
) -> Context:
    """Assemble the build folder of `plan` for `platform`. Reads the lockfile once."""
    say = events or quiet
    prof = plan.profile
    if prof.flavor == "conda" and opts.find_links:
        raise UsageError("--find-links is for venv profiles; conda profiles install from conda-lock.yml")
    lock = freshness.require_fresh(project, plan, platform)
    ca_path = opts.ca_bundle or (project.root / project.config.ca_bundle if project.config.ca_bundle else None)
    ca_text = _read_ca(ca_path) if ca_path is not None else None
    houses = _local_dirs(plan.source.find_links)  # the local wheelhouses: their wheels, and the sdists to build
    user = (project.lockfiles_dir, project.root)
    placed = _cached_wheels(houses, lock, ca_path, say, fetch, user) if prof.flavor == "venv" else {}
    wheels = sorted(placed, key=lambda w: w.name)
    built = dataclasses.replace(plan, source=_build_source(plan, lock, placed))
    made = provenance(project, lock.path)
    labels = labels_for(project, built, lock.sha256, made, lock.apt_sha256)
    pending: Callable[[], None] | None = None
    # what the image holds, from the lockfiles it is built from: the smoke test's integrity check
    # and the manifest then vouch that the environment is exactly this
    when = datetime.datetime.fromtimestamp(made.epoch, datetime.timezone.utc)
    sbom_text = sbomdoc.of_lock(prof.name, lock, platform, when, check=False)
    marker = project.work_dir(prof.name) / "sbom.validated"
    if sbomdoc.validation_key(sbom_text) != _read_or_empty(marker):
        pending = functools.partial(_check_sbom, sbom_text, marker)
    labels[LABEL_SBOM_SHA] = hashlib.sha256(sbom_text.encode()).hexdigest()
    rendered = layering.for_build(built, lock, labels, platform, ca_text)
    groups, seed, sides, taking = rendered.groups, rendered.seed, rendered.sides, rendered.taking
    ctx = project.work_dir(prof.name) / "context"
    if ctx.exists():
        shutil.rmtree(ctx)
    for sub in ("certs", "wheels", SMOKE_DIR):
        (ctx / sub).mkdir(parents=True)
    # Under the x86_64 name whatever the platform: the Dockerfile copies one lockfile.
    in_context = lock_names("x86_64", prof.flavor)[0]
    files: dict[Path, str] = {ctx / "Dockerfile": rendered.outputs["Dockerfile"], ctx / in_context: lock.text}
    files.update({ctx / name: text for name, text in rendered.parts.items()})
    files.update({ctx / SMOKE_DIR / name: text for name, text in smoke_files(built).items()})
    files[ctx / SMOKE_DIR / "expect.json"] = json.dumps(expectations(built, lock), indent=2, sort_keys=True) + "\n"
    files.update({ctx / SMOKE_DIR / name: text for name, text in _flavor_files(built, lock, groups, sbom_text).items()})
    if ca_text is not None:
        files[ctx / "certs" / "ca-bundle.crt"] = ca_text
    if lock.apt is not None:
        files.update({ctx / "apt" / name: text for name, text in layering.apt_files(lock).items()})
    if groups:  # each layer's step writes its part of the manifest with the image's own module
        files[ctx / "tools" / "manifest.py"] = plan_mod.smoke_sources()["manifest.py"]
    atomic_write_many(files)
    for script in (SMOKE_ENTRY, ENTRY_SCRIPT, *PIP_WRAPPERS):
        (ctx / SMOKE_DIR / script).chmod(0o755)
    if wheels:
        offline = ": every one, so the build asks no package index" if built.source.offline else ""
        say("phase", "wheels", f"{len(wheels)} of {len(lock.pins)} wheel(s) from the wheel cache{offline}")
    (ctx / "tools").mkdir(exist_ok=True)
    for group in [*groups, *(["seed"] if seed else [])]:
        (ctx / "wheels" / group).mkdir()
    binaries = layering.wheel_places(ctx, placed, groups, seed, buildreqs.CONFIG_FILE in rendered.parts)
    binaries += [  # the sdists it builds from a local folder: the builder cannot read the host's folders
        (s, ctx / "wheels" / "rest" / s.name) for s in wheelcache.local_sdists(lock.pins, lock.from_source, houses)
    ]
    binaries += [(rendered.uv_binary, ctx / "tools" / "uv")] if rendered.uv_binary else []
    for source, target in binaries:
        # A hard link when possible: a CUDA lock's wheels are gigabytes. They come from envbuild's
        # own wheel cache (which keeps them at one fixed time: uv records a local wheel's mtime in
        # what it installs, and profiles sharing a torch layer must not differ there) or are uv.
        try:
            os.link(source, target)
        except OSError:
            shutil.copy2(source, target)
    _settle(ctx, made.epoch)
    names = tuple(w.name for w in wheels)
    return Context(ctx, built, lock, platform, labels, names, made.epoch, pending, sides, taking)
