"""What a build installs where: the environment split into image layers, the OS packages pinned by
apt.lock, and the installer the builder runs. Read from the lock, rendered by render, assembled
into the context by buildctx; the golden files render through here too.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform as host
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from envbuild import aptfile, buildreqs, lockfile, render, uvtool
from envbuild.aptfile import AptLock
from envbuild.errors import BuildError
from envbuild.freshness import LockSnapshot
from envbuild.lockfile import Pin
from envbuild.names import FIXED_MTIME, LABEL_PROFILE, LABEL_STAGE_SHA
from envbuild.plan import Plan

_MACHINES = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}


def installer(plan: Plan, platform: str) -> tuple[str, Path | None]:
    """("uv", its binary) when this machine's uv can run in the builder (venv flavor, the image's
    platform is this machine's): uv installs torch in seconds where pip takes half a minute, with the
    same hash checks. Else ("pip", None)."""
    if plan.profile.flavor != "venv" or _MACHINES.get(host.machine().lower()) != platform:
        return "pip", None
    binary = Path(uvtool.binary())
    if not binary.is_file() or not os.access(binary, os.X_OK):
        return "pip", None
    return "uv", binary


# The torch family's own runtime: CUDA/ROCm libraries and Triton come as wheels of their own.
_TORCH_RUNTIME = ("nvidia-", "triton", "pytorch-triton", "cuda-")
# Never in a layer of their own: what `python -m venv` puts in the venv itself, which the locked
# version must replace in place (two setuptools merged from two layers make a broken one)
_IN_THE_VENV = frozenset({"pip", "setuptools", "wheel"})
# numpy, which the profile pins, changes as rarely as torch but is 60 MB: a layer of its own keeps
# it out of what a re-lock of the profile's small packages rebuilds and pushes
_OWN_LAYER = "numpy"


def layer_groups(
    plan: Plan, pins: dict[str, Pin], lock_text: str = "", from_source: frozenset[str] = frozenset()
) -> dict[str, tuple[str, ...]]:
    """The image's environment layers, biggest and least often changed first, chosen from the lock:
    `torch` (torch and its CUDA/ROCm/Triton runtime wheels), `torch-extras` (torchvision and
    torchaudio), `torch-deps` (what only those pull in: sympy, networkx, jinja2, ..., by uv's `# via`
    annotations), `numpy`, and `rest` (the profile's own packages and theirs, the venv itself with
    pip and setuptools). Two profiles on one base with the same torch build get the same `torch` layer,
    byte for byte, whatever else they lock; a re-lock of the profile's own packages changes only
    `rest`. A package built from its sdist (`from_source`) is built in the `builder` stage, so it
    is in `rest` too."""
    torch = tuple(sorted(n for n in pins if n == "torch" or n.startswith(_TORCH_RUNTIME)))
    extras = tuple(sorted(n for n in pins if n in plan.torch_family and n not in torch))
    parents = lockfile.via(lock_text) if lock_text else {}
    family = set(torch + extras)
    deps: set[str] = set()
    grew = True
    while grew:  # the closure: a package whose every parent is in the family or already a dependency
        grew = False
        for name in sorted(set(pins) - family - deps - _IN_THE_VENV - {_OWN_LAYER} - from_source):
            up = parents.get(name, set())
            if up and up <= family | deps:
                deps.add(name)
                grew = True
    own = (_OWN_LAYER,) if _OWN_LAYER in pins else ()
    groups = {"torch": torch, "torch-extras": extras, "torch-deps": tuple(sorted(deps)), _OWN_LAYER: own}
    rest = tuple(sorted(n for n in pins if n not in family | deps | set(own)))
    return {**{g: names for g, names in groups.items() if names}, "rest": rest}


SOURCE_FILE = "requirements.source.lock"
CONSTRAINTS = "constraints.txt"  # in the image's /opt/envbuild; PIP_CONSTRAINT and UV_CONSTRAINT name it
VENV_CONSTRAINTS = "envbuild-constraints.txt"  # in `envbuild venv`'s environment; its pip.conf names it


def constraints(plan: Plan, pins: dict[str, Pin], groups: dict[str, tuple[str, ...]], venv: Path | None = None) -> str:
    """The pins a derived image's `pip install` may not move: the `torch`, `torch-extras` and numpy
    layers (torch, its CUDA/ROCm/Triton wheels, torchvision, torchaudio, numpy), as locked and
    smoke-tested. A package that wants another torch otherwise made pip fetch PyPI's default (CUDA)
    build over the tested one, silently; with them, pip stops with "(constraint)" in its conflict.
    A companion the lock does not hold is held to the release that pairs with torch, in torch's
    build (`+cpu`): PyPI's torchvision for a CPU torch installed without a word and failed on import
    ("operator torchvision::nms does not exist"). The rest stays the derived image's to change.
    `venv`: the same pins for `envbuild venv`'s environment there (its pip.conf names them)."""
    held = sorted(n for g in ("torch", "torch-extras", _OWN_LAYER) for n in groups.get(g, ()))
    pinned = {n: pins[n].version for n in held}
    local = pins["torch"].version.partition("+")[2] if "torch" in pins else ""
    for name, version in plan.companions if "torch" in pins else ():
        if name in pins:  # locked, if only as a dependency of the profile's packages (timm's)
            pinned[name] = pins[name].version
        else:
            pinned[name] = f"{version}+{local}" if local else version
    return constraints_head(plan, venv) + "".join(f"{n}=={pinned[n]}\n" for n in sorted(pinned))


def constraints_head(plan: Plan, venv: Path | None = None) -> str:
    """constraints.txt's comment lines: what it holds, where its torch build comes from, and how to
    change it; in an image, or in `envbuild venv`'s environment at `venv`."""
    src = plan.source
    where = (
        f"# torch, torchvision and torchaudio of this build are on {src.canonical_index}, not on PyPI: add one\n"
        f"# with pip install --extra-index-url {src.canonical_index} ...\n"
        if src.route == "index" and plan.profile.flavor == "venv"
        else "# torchvision and torchaudio for this torch come from its conda channel; PyPI's fail on import beside\n"
        "# it, so one the environment lacks is held at <0: add `torchvision: auto` (or torchaudio) to the profile.\n"
        if plan.profile.flavor == "conda"
        else ""
    )
    name = plan.profile.name
    if venv is not None:  # uv reads no configuration from a venv: its installs name the file
        return (
            f"# The locked torch build and numpy of envbuild profile {name}, written by envbuild venv.\n"
            f"# pip in this venv keeps these (its pip.conf names this file); uv reads no pip.conf, so:\n"
            f"# uv pip install -c {shlex.quote(str(venv / VENV_CONSTRAINTS))} ...\n{where}"
            f"# To change them, change the profile (envbuild lock {name} && envbuild venv {name} "
            f"{shlex.quote(str(venv))} --force).\n"
        )
    return (
        f"# The tested torch build and numpy of envbuild profile {name}, written by envbuild build.\n"
        f"# pip (PIP_CONSTRAINT) and uv (UV_CONSTRAINT) in this image and in images built FROM it keep these.\n{where}"
        f"# To change them, change the profile and rebuild (envbuild lock {name} && envbuild build {name});\n"
        "# for one install, clear it: PIP_CONSTRAINT= pip install ...\n"
    )


def source_built(groups: dict[str, tuple[str, ...]], from_source: frozenset[str]) -> tuple[str, ...]:
    """The `rest` packages the builder stage builds from their sdists, in the group's order."""
    return tuple(n for n in groups.get("rest", ()) if n in from_source)


SEED_FILE = "requirements.seed.lock"


def seeded(groups: dict[str, tuple[str, ...]], uv_installs: bool) -> tuple[str, ...]:
    """The `rest` packages that `python -m venv` puts in the venv (setuptools, pip, wheel) where the
    lock pins them: the builder stage installs them in a step of their own before the rest, which
    stays cached across a re-lock of the profile's own packages (replacing setuptools and compiling
    its ~900 files was most of a re-lock's install). With uv only: the builder's pip path installs
    the rest in one step, as before."""
    return tuple(n for n in groups.get("rest", ()) if n in _IN_THE_VENV) if uv_installs else ()


def group_files(
    lock_text: str,
    groups: dict[str, tuple[str, ...]],
    from_source: frozenset[str] = frozenset(),
    seed: tuple[str, ...] = (),
) -> dict[str, str]:
    """requirements.<group>.lock for each layer: the lockfile's own blocks (hashes and all), split.
    With `from_source`, those leave requirements.rest.lock for SOURCE_FILE, which the builder
    installs allowing a build; with `seed` (`seeded`), those leave it for SEED_FILE. The layer
    digests are of the files without either split."""
    blocks = lockfile.blocks(lock_text)
    head = "# A part of requirements.lock (envbuild build splits it by image layer); do not edit.\n"
    apart = set(from_source) | set(seed)
    files = {
        f"requirements.{g}.lock": head + "".join(blocks[n] for n in names if g != "rest" or n not in apart)
        for g, names in groups.items()
    }
    apart_files = {SOURCE_FILE: source_built(groups, from_source), SEED_FILE: seed}
    return {**files, **{f: head + "".join(blocks[n] for n in names) for f, names in apart_files.items() if names}}


def layer_digests(plan: Plan, lock_text: str, pylock_text: str = "") -> dict[str, str]:
    """{layer: sha256 of its requirements.<layer>.lock}: what each layer stage's cache image is
    labelled with, and what `envbuild images` tells the current ones by. Empty for conda."""
    if plan.profile.flavor != "venv":
        return {}
    pins = lockfile.parse_requirements(lock_text)
    return _digests(lock_text, layer_groups(plan, pins, lock_text, lockfile.sdist_only(pylock_text)))


def _digests(lock_text: str, groups: dict[str, tuple[str, ...]]) -> dict[str, str]:
    files = group_files(lock_text, groups)
    return {g: hashlib.sha256(files[f"requirements.{g}.lock"].encode()).hexdigest() for g in groups}


Taking = Callable[[dict[str, str]], str]  # {layer: image ID} -> the Dockerfile taking them for those stages


@dataclass(frozen=True)
class SideStage:
    """A stage of a layered Dockerfile that a build can run as a build of its own, beside the others
    (buildahead.py): the classic builder runs a Dockerfile's stages one after another."""

    name: str  # venv-base, layer-GROUP, builder (the rest), runtime-os (the runtime before the environment)
    dockerfile: str  # the stage alone, with the stages it starts from: the very lines of the whole
    wheels: str  # its wheel folder in the context ("wheels/GROUP"); "" when it installs none
    after: str  # the side stage it starts from ("venv-base"); "" for none
    cached_by: tuple[tuple[str, str], ...]  # the labels its last cache image carries; () when none


def render_for(
    plan: Plan,
    pins: dict[str, Pin],
    apt: AptLock | None,
    labels: dict[str, str] | None = None,
    installer_name: str = "pip",
    lock_text: str = "",
    *,
    from_source: frozenset[str] = frozenset(),
    stage_inputs: str = "",
    stage_images: dict[str, str] | None = None,
    stage_digests: dict[str, str] | None = None,
) -> tuple[dict[str, str], dict[str, tuple[str, ...]], tuple[SideStage, ...]]:
    """What `build` renders from a lock: the outputs, with the environment split into layers and the
    OS packages pinned by apt.lock; the layer groups it split by; and, for a build (`labels`) of a
    layered Dockerfile, the stages a side build can run. `from_source`: the packages with no wheel
    (lockfile.sdist_only), built from their sdists in the builder stage. `stage_inputs`: a digest of
    the files the layer stages copy in besides wheels and their lockfile parts (buildctx); with
    `stage_images` ({layer: image}) the Dockerfile takes those images for those layers' stages, and
    `stage_digests` ({layer: LABEL_STAGE_SHA}, from the render without them) spares working those out again."""
    groups = layer_groups(plan, pins, lock_text, from_source) if plan.profile.flavor == "venv" else {}
    built = list(source_built(groups, from_source))
    extra: dict[str, Any] = {
        "installer": installer_name,
        "fixed_mtime": FIXED_MTIME,
        "from_source": built,
        # build_requires for the sdists built here: uv's configuration, and the lock's wheels to hand
        "build_config": bool(built) and bool(plan.profile.build_requires),
        "seed": list(seeded(groups, installer_name == "uv")),
    }
    digests = _digests(lock_text, groups) if labels else {}  # they go only into the labels
    # stage -> (its group's wheel folder, the stage it starts from, the group its cache labels are of)
    shape = {"venv-base": ("", "", ""), "runtime-os": ("", "", "")}
    shape.update({f"layer-{g}": (f"wheels/{g}", "venv-base", g) for g in groups if g != "rest"})
    shape["builder"] = ("wheels/rest", "venv-base", "rest")
    layered = bool(labels) and len(groups) > 1
    stages = tuple(shape) if layered and not stage_images else ()  # a Dockerfile taking images has no side builds
    layers = [g for g in groups if g != "rest"] if layered and stage_digests is None else []
    # what each layer stage is made of: its lines and venv-base's (rendered without the label they go
    # into), the files they copy in and its part of the lockfile; the base image is checked apart
    stage_texts = tuple(f"layer-{g}" for g in layers)
    bare = (
        render.render(plan, apt=aptfile.template_context(apt), layers=groups, extra=extra, stages=stage_texts)
        if layers
        else {}
    )
    parts = group_files(lock_text, groups, from_source) if layers else {}
    made_of = stage_digests or {
        g: hashlib.sha256(
            "\0".join((bare[f"Dockerfile@layer-{g}"], stage_inputs, parts[f"requirements.{g}.lock"])).encode()
        ).hexdigest()
        for g in layers
    }
    extra["stage_images"] = stage_images or {}
    outputs = render.render(
        plan,
        labels=labels,
        apt=aptfile.template_context(apt),
        layers=groups,
        layer_digests=digests,
        extra=extra,
        stages=stages,
        stage_digests=made_of,
    )
    # a stage's cache image as any profile of this project leaves it: a second profile with the same
    # torch layer on the same base finds the first one's steps in the cache
    cache_labels = {
        g: tuple((k, v) for k, v in pairs if k != LABEL_PROFILE)
        for g, pairs in render.layer_cache_labels(labels or {}, digests, made_of).items()
    }
    sides = tuple(
        SideStage(s, outputs.pop(f"Dockerfile@{s}"), shape[s][0], shape[s][1], cache_labels.get(shape[s][2], ()))
        for s in stages
    )
    return outputs, groups, sides


def dockerfile_from(plan: Plan, folder: Path) -> str | None:
    """The Dockerfile `build` renders from a lockfile folder, labels aside (the golden files keep
    it); None without a requirements.lock."""
    if not (folder / "requirements.lock").is_file():
        return None
    text = (folder / "requirements.lock").read_text("utf-8")
    pins = lockfile.parse_requirements(text)
    apt = aptfile.parse((folder / "apt.lock").read_text("utf-8")) if (folder / "apt.lock").is_file() else None
    pylock = (folder / "pylock.toml").read_text("utf-8") if (folder / "pylock.toml").is_file() else ""
    built = lockfile.sdist_only(pylock)
    return render_for(plan, pins, apt, installer_name="uv", lock_text=text, from_source=built)[0]["Dockerfile"]


def apt_files(lock: LockSnapshot) -> dict[str, str]:
    """The context's apt/ folder (the image's /opt/envbuild/apt/): apt.lock itself, the base's package
    list, and per stage the sha256 list of its downloads and dpkg's expected list afterwards."""
    apt = lock.apt
    assert apt is not None  # noqa: S101  # callers check
    files = {"apt.lock": lock.apt_text, "base.list": "".join(f"{line}\n" for line in sorted(d.line for d in apt.base))}
    for stage in apt.stages:
        files[f"{stage}.sha256"] = apt.sha256_list(stage)
        files[f"{stage}.expect"] = "".join(f"{line}\n" for line in apt.expected(stage))
    return files


def stage_inputs(lock: LockSnapshot, ca_text: str | None, uv_binary: Path | None) -> str:
    """A digest of what the layer stages copy in besides their wheels and lockfile parts: the CA
    bundle (certs/), uv and manifest.py (tools/), the apt/ files. Part of each layer stage's
    LABEL_STAGE_SHA: the same digest, the same steps' inputs."""
    from envbuild.plan import smoke_sources

    digest = hashlib.sha256()
    apt = apt_files(lock) if lock.apt is not None else {}
    for name, text in [("ca", ca_text or ""), ("manifest.py", smoke_sources()["manifest.py"]), *sorted(apt.items())]:
        digest.update(f"{name}\0{text}\0".encode())
    if uv_binary is not None:
        with uv_binary.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


class BuildRender(NamedTuple):
    """What `for_build` gives the build context."""

    outputs: dict[str, str]  # render_for's files: the Dockerfile among them
    groups: dict[str, tuple[str, ...]]  # the layer groups (layer_groups)
    sides: tuple[SideStage, ...]
    taking: Taking
    uv_binary: Path | None  # the uv the context gets, if uv installs
    parts: dict[str, str]  # requirements.<group>.lock and the builder's own parts (group_files)
    seed: tuple[str, ...]  # the rest packages the builder installs first (seeded), in wheels/seed


def for_build(
    plan: Plan, lock: LockSnapshot, labels: dict[str, str], platform: str, ca_text: str | None
) -> BuildRender:
    """A build's render (`render_for`) with the installer for `platform`, the same render taking
    images for layer stages (`dockerfile_taking`), and the lockfile's parts the Dockerfile copies,
    split as the render split them."""
    tool, uv_binary = installer(plan, platform)
    inputs = stage_inputs(lock, ca_text, uv_binary)
    outputs, groups, sides = render_for(
        plan, lock.pins, lock.apt, labels, tool, lock.text, from_source=lock.from_source, stage_inputs=inputs
    )
    made_of = {
        s.name.removeprefix("layer-"): dict(s.cached_by)[LABEL_STAGE_SHA] for s in sides if s.name.startswith("layer-")
    }
    taking = functools.partial(dockerfile_taking, plan, lock, labels, tool, made_of)
    seed = seeded(groups, tool == "uv")  # as render_for decided it for the Dockerfile: same groups, same tool
    parts = group_files(lock.text, groups, lock.from_source, seed)
    built = source_built(groups, lock.from_source)
    if built and plan.profile.build_requires:
        if tool != "uv":
            raise BuildError(
                f"{plan.name}: {', '.join(built)} must be built from the sdist with build_requires, which needs uv "
                f"in the builder, and this machine's uv cannot run in a {platform} image",
                hint=f"build {plan.name} on a {platform} machine, or put a wheel of {built[0]} in a find_links folder",
            )
        versions = {n: p.version for n, p in lock.pins.items()}
        parts[buildreqs.CONFIG_FILE] = buildreqs.config(buildreqs.for_build(plan.profile, versions))
    return BuildRender(outputs, groups, sides, taking, uv_binary, parts, seed)


def dockerfile_taking(
    plan: Plan, lock: LockSnapshot, labels: dict[str, str], tool: str, made_of: dict[str, str], images: dict[str, str]
) -> str:
    """The build's Dockerfile with `images` ({layer: image ID}) taken for those layers' stages; the
    other layer stages' labels as the build's own render gave them (`made_of`)."""
    outputs, _, _ = render_for(
        plan,
        lock.pins,
        lock.apt,
        labels,
        tool,
        lock.text,
        from_source=lock.from_source,
        stage_images=images,
        stage_digests=made_of,
    )
    return outputs["Dockerfile"]


def wheel_places(
    ctx: Path, placed: dict[Path, str], groups: dict[str, tuple[str, ...]], seed: tuple[str, ...], to_rest: bool
) -> list[tuple[Path, Path]]:
    """(cached wheel, its place in the context): each layer's wheels in a folder of their own, so its
    install step's cache key is only theirs. `to_rest`: the builder builds an sdist against the lock
    (build_requires), so the other layers' wheels go to its folder, wheels/rest, as well."""
    member = {name: group for group, names in groups.items() for name in names} | dict.fromkeys(seed, "seed")
    places = [(w, ctx / "wheels" / member.get(d, "rest") / w.name) for w, d in sorted(placed.items())]
    if to_rest:
        places += [
            (w, ctx / "wheels" / "rest" / w.name) for w, d in sorted(placed.items()) if member.get(d, "rest") != "rest"
        ]
    return places
