"""`envbuild diff A B`: why does the job behave differently in CI than on my machine?

Each side is an image (its build manifest: every environment file with its sha256, and the OS
packages) or a profile of the project (its lockfile's pins). The report names the Python
distributions, OS packages and files that differ.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from envbuild import condapip, engine, freshness, validate
from envbuild import plan as plan_mod
from envbuild.errors import ImageMissing, UsageError
from envbuild.names import LABEL_PROFILE, MANIFEST_PATH, canonical
from envbuild.project import Project
from envbuild.smoke import scan

# only installed distributions: directly in site-packages (setuptools vendors its own dist-info deeper)
_DIST_INFO = re.compile(r"(?:^|/)site-packages/([A-Za-z0-9_.]+)-([^/-]+)\.dist-info/METADATA$")
SHOWN = 20


@dataclass
class Side:
    label: str
    kind: str  # image | lockfile
    distributions: dict[str, str]
    os_packages: dict[str, str] | None = None  # None: not known (a lockfile says nothing of them)
    files: dict[str, list[Any]] | None = None
    profile: str | None = None  # the profile the lockfile or image is of, where known


@dataclass
class Difference:
    a: str
    b: str
    distributions: list[dict[str, str | None]] = field(default_factory=list)
    os_packages: list[dict[str, str | None]] = field(default_factory=list)
    files: dict[str, list[str]] = field(default_factory=dict)  # changed / only_a / only_b (first SHOWN)
    file_counts: dict[str, int] = field(default_factory=dict)

    @property
    def same(self) -> bool:
        return not (self.distributions or self.os_packages or any(self.file_counts.values()))

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "same": self.same}


def distributions_of(files: dict[str, list[Any]]) -> dict[str, str]:
    """{distribution: version} from the dist-info folders among a manifest's files."""
    found = {}
    for path in files:
        m = _DIST_INFO.search(path)
        if m:
            found[canonical(m.group(1))] = m.group(2)
    return found


def _image_side(project: Project, ref: str) -> Side:
    """The image's environment as it is now (a derived image's additions included), scanned in a
    container by this envbuild's copy of the code that wrote its build manifest (smoke.scan)."""
    cli = engine.client(timeout=600)
    image = engine.local_image(cli, ref)
    recorded = engine.read_file(cli, image.id, MANIFEST_PATH)
    try:
        root = str(json.loads(recorded).get("root") or "/opt/venv") if recorded else ""
    except (ValueError, AttributeError):
        root = ""  # an edited manifest: where the environment is, the image no longer says
    if not root:
        raise UsageError(
            f"{ref} has no readable build manifest ({MANIFEST_PATH})",
            hint="only images envbuild built (this version or later) carry one: rebuild it with envbuild build",
        )
    manifest = scan.environment(cli, image.id, root, shown=ref, inspected=image.attrs)
    files: dict[str, list[Any]] = {**manifest["files"], **_interpreter_files(manifest.get("interpreter"))}
    profile = (image.labels or {}).get(LABEL_PROFILE)
    return Side(ref, "image", distributions_of(files), dict(manifest.get("os_packages") or {}), files, profile)


def _interpreter_files(interpreter: Any) -> dict[str, list[Any]]:
    """The base Python's binary and standard library, by absolute path: every import reaches them
    (a sitecustomize.py there runs in each process), so two images differ there too."""
    if not isinstance(interpreter, dict):
        return {}
    stdlib = str(interpreter.get("stdlib") or "")
    found = {f"{stdlib}/{path}": entry for path, entry in (interpreter.get("files") or {}).items()}
    executable = interpreter.get("executable")
    if isinstance(executable, list) and executable:
        found[str(executable[0])] = executable[1:]
    return found


def _lock_side(project: Project, name: str) -> Side:
    prof = validate.load_named(project, name)
    snap = freshness.require_fresh(project, plan_mod.make(project, prof, strict=False))
    # with an apt.lock, the OS packages of the finished image are known too: the base's and the runtime stage's
    os_packages = snap.apt.packages("runtime") if snap.apt else None
    pins = (  # a conda lock's: its pip packages and the conda packages that are Python's
        condapip.installed(snap.conda_entries(prof.platforms[0]))
        if prof.flavor == "conda"
        else {p.name: p.version for p in snap.pins.values()}
    )
    return Side(f"{name} (lockfile)", "lockfile", pins, os_packages, profile=name)


def side(project: Project, target: str) -> Side:
    """A profile's name means its lockfile; anything else names an image in the engine."""
    if (project.profiles_dir / f"{target}.yaml").is_file():
        return _lock_side(project, target)
    try:
        return _image_side(project, target)
    except ImageMissing as exc:
        raise UsageError(
            f"{target}: neither a profile of this project nor an image in the engine",
            hint="name a profile (its lockfile) or an image (REPO:TAG or an image ID)",
        ) from exc


def _changes(a: dict[str, str], b: dict[str, str]) -> list[dict[str, str | None]]:
    return [{"name": n, "a": a.get(n), "b": b.get(n)} for n in sorted(a.keys() | b.keys()) if a.get(n) != b.get(n)]


BOOTSTRAP = frozenset({"pip", "setuptools", "wheel"})  # made by `python -m venv`, never in a lockfile


def compare(a: Side, b: Side) -> Difference:
    da, db = a.distributions, b.distributions
    if "lockfile" in {a.kind, b.kind}:
        da, db = ({n: v for n, v in d.items() if n not in BOOTSTRAP} for d in (da, db))
    out = Difference(a.label, b.label, distributions=_changes(da, db))
    if a.os_packages is not None and b.os_packages is not None:
        out.os_packages = _changes(a.os_packages, b.os_packages)
    if a.files is not None and b.files is not None:
        changed = sorted(p for p in a.files.keys() & b.files.keys() if a.files[p] != b.files[p])
        only_a = sorted(a.files.keys() - b.files.keys())
        only_b = sorted(b.files.keys() - a.files.keys())
        out.file_counts = {"changed": len(changed), "only_a": len(only_a), "only_b": len(only_b)}
        out.files = {"changed": changed[:SHOWN], "only_a": only_a[:SHOWN], "only_b": only_b[:SHOWN]}
    return out


def diff(project: Project, a: str, b: str) -> Difference:
    return compare(side(project, a), side(project, b))
