"""The build plan: everything the later stages need to know about one profile, worked out once.

`make(project, profile, options)` applies the precedence rules (option > profile > envbuild.toml >
compat data) and returns an immutable `Plan`. render, lock, verify, venv, build, the smoke
expectations, publish, status and images read it; none of them derives these facts again.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from envbuild import compat
from envbuild.errors import RenderError, UsageError
from envbuild.names import INIT_PACKAGE, json_sha256
from envbuild.profile import Profile
from envbuild.project import Project, read_text
from envbuild.torchsource import TorchSource, torch_source

TEMPLATE_NAMES = {
    "venv": ("Dockerfile.venv.j2", "requirements.in.j2", "lock-input.toml.j2"),
    "conda": ("Dockerfile.conda.j2", "environment.yml.j2"),
}
TEMPLATE_PARTS = ("_apt.j2", "_login.j2")  # imported by the Dockerfile templates, not rendered on their own
LOCK_FORMAT = 1
"""Version of what the input digest covers; a change here makes every lockfile stale on purpose."""


@dataclass(frozen=True)
class PlanOptions:
    """What the command line may say about where things come from. None/empty: not given."""

    base: str | None = None
    index_url: str | None = None
    torch_index: str | None = None
    find_links: tuple[str, ...] = ()
    platforms: tuple[str, ...] = ()
    templates_dir: Path | None = None  # `render --templates`: instead of the project's templates/


def _expand(project: Project, location: str) -> str:
    """Expand $VARS and make relative folders relative to the project, as users write them."""
    text = os.path.expandvars(location)
    if "://" in text or Path(text).is_absolute():
        return text
    return str((project.root / text).resolve())


_UNSET = re.compile(r"\$\{?[A-Za-z_][A-Za-z0-9_]*\}?")


def find_links_of(
    project: Project, prof: Profile, given: tuple[str, ...], *, strict: bool = True
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(wheelhouses, notes): the option, else the profile's, else envbuild.toml's; expanded, and
    (strict) each local one checked to exist. A wheelhouse named by a variable that is unset here
    (`${PIP_FIND_LINKS}` on a machine without one) means "no wheelhouse", with a note saying so."""
    cfg = project.config
    named = given or tuple(prof.find_links) or tuple(cfg.find_links)
    where = "--find-links" if given else f"{prof.name}'s find_links" if prof.find_links else "envbuild.toml"
    notes = tuple(
        f"{where}: {f} names an unset variable: no wheelhouse from it"
        for f in named
        if _UNSET.search(os.path.expandvars(f))
    )
    links = tuple(f for f in named if not _UNSET.search(os.path.expandvars(f)))
    expanded = tuple(_expand(project, f) for f in links)
    for raw, path in zip(links, expanded, strict=True) if strict else ():
        # a missing folder would otherwise surface late: as a resolution without the local wheels,
        # or as a build whose context lacks the files its lockfile points at
        if "://" not in path and not Path(path).exists():
            raise UsageError(
                f"{where}: {raw} does not exist" + (f" ({path})" if path != raw else ""),
                hint="name a folder of wheels (or a URL), or leave it out to use the indexes",
            )
    return expanded, notes


@dataclass(frozen=True)
class Base:
    image: str
    python_from: str  # "apt": the OS package pythonX.Y
    origin: str  # option | profile | devel | compat


def base_of(profile: Profile, option: str | None, configured: str | None = None) -> Base:
    """The base image: --base, else the profile's `base:`, else envbuild.toml's `base` (for all, or
    for the profile's Python), else the CUDA devel image (devel: true), else the compat data's
    default for the Python version."""
    db = compat.load()
    if option:
        return Base(option, "apt", "option")
    if profile.base:
        return Base(profile.base, "apt", "profile")
    if configured:
        return Base(configured, "apt", "envbuild.toml")
    if profile.devel and profile.accelerator == "cuda":
        return Base(db.bases.devel.image_pattern.format(cuda=profile.cuda), "apt", "devel")
    info = db.bases.python.get(profile.python)
    if info is None:
        raise RenderError(f"no default base image for Python {profile.python}", hint="set `base:` in the profile")
    return Base(info.image, info.python_from, "compat")


def requirements_of(profile: Profile) -> tuple[tuple[str, ...], tuple[str, ...], tuple[tuple[str, str], ...]]:
    """(requirement lines, torch family names, the companions that pair with torch): torch, its
    companions with `auto` resolved, numpy, then the profile's packages."""
    db = compat.load()
    row = db.release(profile.torch)
    if row is None:
        raise RenderError(f"torch {profile.torch} is not in the compat data; cannot pick matching packages")
    pairs = compat.companions(row, profile.torch)
    asked = {"torchvision": profile.torchvision, "torchaudio": profile.torchaudio}
    extras = [(n, pairs[n] if v == "auto" else v) for n, v in asked.items() if v]
    reqs = [f"torch=={profile.torch}", *(f"{n}=={v}" for n, v in extras), f"numpy=={profile.numpy}"]
    reqs += sorted(profile.packages, key=str.lower)
    held = tuple(sorted((n, db.one_release(v)) for n, v in pairs.items()))  # exact: a build label needs one
    return tuple(reqs), tuple(sorted({"torch", *(n for n, _ in extras)})), held


def default_templates_dir() -> Path:
    """Templates shipped with envbuild: in the wheel, or the checkout's top-level templates/."""
    packaged = Path(str(resources.files("envbuild"))) / "_templates"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parents[2] / "templates"


def template_text(templates_dir: Path | None, name: str) -> str | None:
    """A template's source as rendering would find it: the project's override, else envbuild's."""
    for folder in (templates_dir, default_templates_dir()):
        if folder is not None and (folder / name).is_file():
            return (folder / name).read_text("utf-8")
    return None


def templates_of(flavor: str, templates_dir: Path | None) -> dict[str, str]:
    """The flavor's template sources, {name: text}, as rendering will find them, with the parts they
    import: a changed part changes the image as much as a changed template."""
    names = (*TEMPLATE_NAMES[flavor], *TEMPLATE_PARTS)
    return {n: t for n in names if (t := template_text(templates_dir, n)) is not None}


def smoke_sources() -> dict[str, str]:
    """The in-image smoke package, {file name: text}: what every image carries under /opt/envbuild."""
    files = sorted(resources.files("envbuild.smoke.inside").iterdir(), key=lambda p: p.name)
    return {p.name: p.read_text("utf-8") for p in files if p.name.endswith(".py") and p.is_file()}


# Profile fields that cannot change an image: where it goes, its text, where its artifacts come from
_NOT_IN_IMAGE = frozenset({"description", "registry", "index_url", "torch_index", "find_links", "extends"})


@dataclass(frozen=True)
class Plan:
    """One profile, ready for every stage. Immutable; build one with `make`."""

    profile: Profile
    platforms: tuple[str, ...]
    base: Base
    source: TorchSource
    requirements: tuple[str, ...]
    torch_family: tuple[str, ...]
    companions: tuple[tuple[str, str], ...]  # (torchvision/torchaudio, one release pairing with torch)
    templates_dir: Path | None
    templates: dict[str, str] = field(repr=False)  # the flavor's template sources, by name
    torch_mirror: str | None = None  # a mirror of the PyTorch index given today (option > profile > toml)
    checks: dict[str, str] = field(default_factory=dict, repr=False)  # the project's own checks: {file: text}
    notes: tuple[str, ...] = ()  # what a person should know about this plan (an unset ${VAR} wheelhouse)
    apt_snapshot: str | None = None  # profile > envbuild.toml: a snapshot timestamp, "auto", or None

    def source_as_locked(self, route: str, index: str) -> TorchSource:
        """Where the torch family comes from for a lockfile that recorded (route, canonical index):
        the lock decides what and which index; today's mirrors and wheelhouses only how to reach it."""
        if route not in {"pypi", "index"}:
            return self.source  # conda: channels, not indexes
        return torch_source(
            self.profile,
            index_url=self.source.index_url,
            torch_index=self.torch_mirror,
            find_links=self.source.find_links,
            route=(route, index if index.startswith(("http://", "https://")) else self.source.canonical_index),
        )

    @property
    def name(self) -> str:
        return self.profile.name

    @property
    def python_bin(self) -> str:
        return f"python{self.profile.python}"

    @property
    def compile_packages(self) -> tuple[str, ...]:
        """OS packages torch.compile and torch.utils.cpp_extension need at run time: a C/C++ compiler
        for inductor (and Triton's launcher on GPUs), ninja, which `cpp_extension.load` builds a user's
        C++ extension with (torch refuses to without it), and an OS Python's headers. () if opted out."""
        if not self.profile.compile:
            return ()
        return ("g++", "ninja-build") if self.profile.flavor == "conda" else self.toolchain  # conda has headers

    @property
    def toolchain(self) -> tuple[str, ...]:
        """A C/C++ compiler, ninja and the OS Python's headers: what a C++ extension builds with."""
        return ("g++", "ninja-build", f"{self.python_bin}-dev")

    @property
    def apt_stages(self) -> dict[str, tuple[str, ...]]:
        """The OS packages each Dockerfile stage installs on top of the base, as apt is asked for
        them (apt.lock pins them with their dependencies). A conda image's Python and libraries come
        from conda-lock.yml: only its runtime's compiler and `apt:` list come from the archive."""
        # Every runtime gets tini, the image's PID 1 (names.IMAGE_ENTRYPOINT says why).
        if self.profile.flavor == "conda":
            return {"runtime": (INIT_PACKAGE, *self.compile_packages, *sorted(set(self.profile.apt)))}
        # The runtime's ca-certificates: the public CAs, without which urllib (torch.hub,
        # torchvision's dataset downloads) and curl cannot verify any HTTPS server. debian and
        # ubuntu base images leave them out; conda's Python brings its own.
        return {
            # build_requires names packages built against torch there: C++ extensions
            "builder": (self.python_bin, f"{self.python_bin}-venv", "ca-certificates")
            + (self.toolchain if self.profile.build_requires else ()),
            "runtime": (
                self.python_bin,
                "ca-certificates",
                INIT_PACKAGE,
                *self.compile_packages,
                *sorted(set(self.profile.apt)),
            ),
        }

    @property
    def apt_digest(self) -> str:
        """sha256 of what decides apt.lock: the packages each stage asks for, the platforms and the
        snapshot setting. Not the base image: apt.lock records the base's package list, and the build
        compares the real base with it."""
        return json_sha256(
            {
                "apt_format": 1,
                "platforms": sorted(self.platforms),
                "stages": self.apt_stages,
                "snapshot": self.apt_snapshot or "",
            }
        )

    @property
    def input_digest(self) -> str:
        """sha256 of what decides the resolution, and nothing else: flavor, Python, torch build, platforms,
        the requirements (`auto` companions resolved), for conda the channels and specs. Not mirrors or
        wheelhouses (where the same artifacts come from). A lockfile that records another one is stale."""
        prof = self.profile
        payload: dict[str, object] = {
            "format": LOCK_FORMAT,
            "flavor": prof.flavor,
            "python": prof.python,
            "accelerator": prof.accelerator,
            "build": prof.build_tag,
            "platforms": sorted(prof.platforms),
            "requirements": list(self.lock_requirements),
            "channels": prof.channels if prof.flavor == "conda" else [],
            "conda_packages": sorted(prof.conda_packages) if prof.flavor == "conda" else [],
        }
        if prof.build_requires:  # what an sdist's metadata is built with; absent, every digest stays
            payload["build_requires"] = {k: sorted(v) for k, v in sorted(prof.build_requires.items())}
        return json_sha256(payload)

    @property
    def lock_requirements(self) -> tuple[str, ...]:
        """What the resolver is asked for: the requirement lines (venv) or the conda specs."""
        if self.profile.flavor == "conda":
            return (*self.conda_specs, *(f"pip:{p}" for p in self.pip_specs))
        return self.requirements

    @property
    def conda_specs(self) -> tuple[str, ...]:
        """The conda flavor's match specs, in environment.yml's order ("pip" last when pip packages follow).
        torchvision/torchaudio as the profile asks (its channel's build: PyPI's fail beside its torch)."""
        prof = self.profile
        specs = [f"python={prof.python}", f"numpy={prof.numpy}"]
        if prof.accelerator == "cuda":
            specs += [f"pytorch={prof.torch}=cuda*", f"cuda-version={prof.cuda}"]
        else:
            specs.append(f"pytorch={prof.torch}=cpu*")
        specs += [f"{n}={v}" for n, v in sorted(self.asked_companions.items())]
        specs += sorted(prof.conda_packages)
        if prof.packages:
            specs.append("pip")
        return tuple(specs)

    @property
    def asked_companions(self) -> dict[str, str]:
        """The torchvision/torchaudio the profile asks for, `auto` resolved: {name: version}."""
        pinned = (r.partition("==") for r in self.requirements)
        return {n: v for n, _, v in pinned if n in self.torch_family and n != "torch"}

    @property
    def pip_specs(self) -> tuple[str, ...]:
        """The conda flavor's pip requirements (the profile's packages), sorted."""
        return tuple(sorted(self.profile.packages))

    @property
    def image_digest(self) -> str:
        """sha256 of image_inputs: an image whose io.envbuild.image-digest differs would be built otherwise today."""
        return json_sha256(self.image_inputs)

    @property
    def image_inputs(self) -> dict[str, object]:
        """All that reaches the image but the lockfile (lock-sha256 covers it), by part: the profile's fields
        but _NOT_IN_IMAGE, the templates', checks', smoke package's sources (not --base: a one-off)."""
        fields = {k: v for k, v in self.profile.model_dump(mode="json").items() if k not in _NOT_IN_IMAGE}
        return {
            "profile": fields,
            # a project-wide base reaches every image it builds (a --base option is a one-off: not here)
            "configured_base": self.base.image if self.base.origin == "envbuild.toml" else None,
            "templates": {k: hashlib.sha256(v.encode()).hexdigest() for k, v in sorted(self.templates.items())},
            "checks": {k: hashlib.sha256(v.encode()).hexdigest() for k, v in sorted(self.checks.items())},
            "smoke": {k: hashlib.sha256(v.encode()).hexdigest() for k, v in smoke_sources().items()},
        }


def make(project: Project, profile: Profile, options: PlanOptions | None = None, *, strict: bool = True) -> Plan:
    """The plan of one profile under today's options and envbuild.toml. `strict=False` for commands
    that only compare (status, images): a wheelhouse missing on this machine is no error there."""
    opts = options or PlanOptions()
    cfg = project.config
    links, notes = find_links_of(project, profile, opts.find_links, strict=strict)
    mirror = opts.torch_index or profile.torch_index or cfg.torch_index
    source = torch_source(
        profile, index_url=opts.index_url or profile.index_url or cfg.index_url, torch_index=mirror, find_links=links
    )
    for platform in opts.platforms:
        if platform not in profile.platforms:
            raise UsageError(
                f"--platform {platform}: {profile.name} is not locked for it "
                f"(platforms: {', '.join(profile.platforms)})",
                hint=f"add {platform} to the profile's platforms and run `envbuild lock {profile.name}`",
            )
    requirements, family, pairs = requirements_of(profile)
    templates_dir = opts.templates_dir or project.templates_dir
    base = base_of(profile, opts.base, cfg.base_for(profile.python))
    if base.origin == "envbuild.toml" and "@sha256:" not in base.image:
        # validate warns about a profile's own unpinned `base:`; the project-wide one moves every image
        notes += (f"envbuild.toml: base {base.image} is not pinned by digest; append @sha256:... (tags move)",)
    return Plan(
        profile=profile,
        platforms=tuple(opts.platforms) or tuple(profile.platforms),
        base=base,
        source=source,
        requirements=requirements,
        torch_family=family,
        companions=pairs,
        templates_dir=templates_dir,
        templates=templates_of(profile.flavor, templates_dir),
        torch_mirror=mirror,
        checks=_read_checks(project, profile),
        notes=notes,
        apt_snapshot=profile.apt_snapshot or cfg.apt_snapshot,
    )


def _read_checks(project: Project, profile: Profile) -> dict[str, str]:
    """The profile's `checks:` scripts, {file name: text}; each must exist, and their file names must
    differ (they travel to one folder of the image)."""
    out: dict[str, str] = {}
    for rel in profile.checks:
        path = project.root / rel
        name = Path(rel).name
        if name in out:
            raise UsageError(
                f"{profile.name}'s checks: two scripts are named {name}", hint="give each check its own file name"
            )
        try:
            out[name] = read_text(path, f"{profile.name}'s checks: {rel}")
        except OSError as exc:
            why = exc.strerror or str(exc)
            raise UsageError(
                f"{profile.name}'s checks: {rel} cannot be read ({why})",
                hint="name a Python script in the project, relative to its folder (checks/train_tiny.py)",
            ) from exc
    return out


def for_profile(profile: Profile, *, base: str | None = None, templates_dir: Path | None = None) -> Plan:
    """A plan outside any project (render of a file, the golden tests): no envbuild.toml, no wheelhouse check."""
    requirements, family, pairs = requirements_of(profile)
    return Plan(
        profile=profile,
        platforms=tuple(profile.platforms),
        base=base_of(profile, base),
        source=torch_source(profile),
        requirements=requirements,
        torch_family=family,
        companions=pairs,
        templates_dir=templates_dir,
        templates=templates_of(profile.flavor, templates_dir),
        apt_snapshot=profile.apt_snapshot,
    )
