"""One freshness query for a profile's lockfiles, and the snapshot every later stage reads.

`query` answers `lock --check`, `status`, `build`, `venv`, `smoke --local` and `images`: each file
is read once, its lock record compared with today's plan, its body with the record (a hand edit
shows), and siblings with each other. A fresh answer carries a `LockSnapshot` per platform: the
text, record and pins as read, so a stage never opens the lockfile a second time (a re-lock landing
in between cannot mix two lockfiles into one image).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envbuild import aptfile, profilefile
from envbuild._compat import tomllib
from envbuild.aptfile import AptLock, apt_lock_name
from envbuild.errors import LockMissing
from envbuild.lockfile import (
    LockRecord,
    Pin,
    RecordError,
    conda_pins,
    conflicted,
    followed_profile,
    follows_record,
    lock_sha256,
    parse_requirements,
    read_record,
    resolution_id,
    sdist_only,
    stray_line,
)
from envbuild.names import CONDA_SUBDIRS, canonical, lock_names, not_utf8
from envbuild.plan import Plan
from envbuild.project import Project


@dataclass(frozen=True)
class LockSnapshot:
    """One platform's primary lockfile as read."""

    path: Path
    text: str
    record: LockRecord
    pins: dict[str, Pin] = field(default_factory=dict)  # venv flavor; empty for conda
    apt: AptLock | None = None  # the platform's apt.lock, when the profile has one
    apt_text: str = ""  # its text as read
    pylock_text: str = ""  # pylock.toml as read (venv): the wheel URLs, for the wheel cache

    @functools.cached_property
    def from_source(self) -> frozenset[str]:
        """The packages pylock.toml has no wheel of, only an sdist: the build makes their wheels."""
        return sdist_only(self.pylock_text)

    @functools.cached_property
    def _conda_packages(self) -> list[dict[str, Any]]:
        if self.record.route != "conda":
            return []
        import yaml

        doc = yaml.safe_load(self.text)
        return [e for e in doc["package"] if isinstance(e, dict)]

    def conda_entries(self, platform: str) -> list[dict[str, Any]]:
        """conda-lock.yml's package entries for `platform` (x86_64, aarch64): conda flavor; [] for venv."""
        return [e for e in self._conda_packages if e.get("platform") == CONDA_SUBDIRS[platform]]

    @property
    def apt_sha256(self) -> str:
        return lock_sha256(self.apt_text) if self.apt_text else ""

    @property
    def sha256(self) -> str:
        return lock_sha256(self.text)


@dataclass(frozen=True)
class Freshness:
    state: str  # fresh | missing | stale | edited
    reason: str = ""
    snapshots: dict[str, LockSnapshot] = field(default_factory=dict)  # platform -> primary, when fresh

    @property
    def fresh(self) -> bool:
        return self.state == "fresh"


def lock_dir(project: Project, name: str) -> Path:
    return project.lockfiles_dir / name


def primary_lock(project: Project, plan: Plan) -> Path:
    """The lockfile an image of the plan's first platform installs (requirements.lock or conda-lock.yml)."""
    return lock_dir(project, plan.name) / lock_names(plan.platforms[0], plan.profile.flavor)[0]


def _conda_pins(text: str, fmt: int) -> dict[str, Pin]:
    import yaml

    doc: Any = yaml.safe_load(text)
    return conda_pins(doc.get("package") if isinstance(doc, dict) else None, fmt)


def _pylock_agrees(text: str, pins: dict[str, Pin]) -> bool:
    """pylock.toml pins what requirements.lock pins: the same versions, and no artifact whose hash
    requirements.lock lacks (it lists every platform's files; pylock.toml the locked platform's).
    CI installs from either file directly, so a hash swapped in pylock.toml alone is an edit too."""
    doc = tomllib.loads(text)
    seen: dict[str, str] = {}
    for pkg in doc.get("packages", []):
        name, pin = canonical(pkg["name"]), pins.get(canonical(pkg["name"]))
        artifacts = [*pkg.get("wheels", []), *(pkg[k] for k in ("sdist", "archive") if k in pkg)]
        hashes = {f"sha256:{(a.get('hashes') or {}).get('sha256', '')}" for a in artifacts}
        if pin is None or name in seen or not hashes or not hashes <= set(pin.hashes):
            return False
        seen[name] = str(pkg["version"])
    return seen == {p.name: p.version for p in pins.values()}


def followed(project: Project, name: str, file_name: str) -> str:
    """ "PROFILE@RESOLUTION" of the nearest profile `name` extends whose lockfile `file_name` has a
    readable record: the pins a variant's lock keeps (its own where that one has none), and what
    its lockfile must record to be fresh. "" when no profile it extends is locked.

    A variant kept its parent's versions at its first lock, but a re-lock of the parent (a torch
    patch release, a security bump) left it on the old ones without a word: its image no longer
    shared the parent's layers, and it ran other versions than the profile it claims to extend."""
    for parent in profilefile.read_raw(project.profile_path(name)).extends:
        try:
            text = (lock_dir(project, parent) / file_name).read_text("utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        try:
            return follows_record(parent, read_record(text).resolution)
        except RecordError:
            return ""  # the parent's own lockfile needs a re-lock first; its status says so
    return ""


def _follows_problem(project: Project, plan: Plan, snap: LockSnapshot, shown: str) -> str:
    """Why a variant's lockfile no longer follows the profile it extends; "" when it does."""
    want = followed(project, plan.name, snap.path.name)
    if not want or want == snap.record.follows:
        return ""
    parent = followed_profile(want)
    if followed_profile(snap.record.follows) == parent:
        return (
            f"{shown} kept the versions of an older lock of {parent}, which it extends ({parent} was re-locked since)"
        )
    return f"{shown} was locked before {parent}, which it extends, was: it does not share {parent}'s versions"


def read_previous(path: Path) -> str:
    """A lockfile's text for the pins a re-lock keeps. A hand edit saved in Latin-1 (a comment)
    makes it stale, not its pins void: the re-lock `status` names as the fix must not stop on it,
    nor a prune drop what it pins. Bytes that are not UTF-8 read as U+FFFD."""
    return path.read_bytes().decode("utf-8", errors="replace")


def _read(path: Path, shown: str) -> tuple[str | None, str]:
    """A lockfile's text, or None and why it cannot be used as it is."""
    try:
        text = path.read_text("utf-8")
        if conflicted(text):  # said first: its record is one side's, and "the profile changed" would mislead
            return None, f"{shown} has a merge's conflict markers (two re-locks merged)"
        if text.startswith("\ufeff"):  # invisible in the editor that added it; "line 1 is not a pin" misled
            return None, f"{shown} starts with a byte-order mark (U+FEFF): an editor saved it with one"
        return text, ""
    except FileNotFoundError:
        return None, f"{shown} is missing"
    except UnicodeDecodeError as exc:
        said, line, column = not_utf8(exc)  # an edit saved in another encoding: `lock` writes it anew
        return None, f"{shown}:{line}: {said} (column {column})"
    except OSError as exc:
        return None, f"{shown} cannot be read ({exc.strerror or exc})"


def _with_apt_lock(project: Project, plan: Plan, primary: LockSnapshot, path: Path) -> LockSnapshot | Freshness:
    """The snapshot with the platform's apt.lock as read (unchanged without one), or why it is unusable."""
    shown = project.rel(path)
    text, why = _read(path, shown)
    if text is None:
        return primary if why.endswith("missing") else Freshness("stale", why)
    state, why, apt = aptfile.check(text, plan.apt_digest)
    if apt is None:
        return Freshness(state, f"{shown}: {why}")
    return dataclasses.replace(primary, apt=apt, apt_text=text)


def query(project: Project, plan: Plan, platforms: Sequence[str] | None = None, *, with_apt: bool = True) -> Freshness:
    """Whether the profile's lockfiles are usable as they are, and what they say when they are.
    `with_apt=False`: the Python (or conda) lockfiles alone, apt.lock unread."""
    directory = lock_dir(project, plan.name)
    digest = plan.input_digest
    flavor = plan.profile.flavor
    snapshots: dict[str, LockSnapshot] = {}
    for platform in platforms or plan.platforms:
        names = lock_names(platform, flavor)
        primary: LockSnapshot | None = None
        for name in names:
            path = directory / name
            shown = project.rel(path)
            text, why = _read(path, shown)
            if text is None:
                return Freshness("missing" if why.endswith("missing") else "stale", why)
            try:
                record = read_record(text)
            except RecordError as exc:
                return Freshness("stale", f"{shown}: {exc}")
            if record.input_digest != digest:
                return Freshness("stale", f"{shown} was locked from other inputs (the profile changed)")
            edited = f"{shown} was edited by hand: its packages no longer match the resolution it records"
            try:
                if name.endswith(".toml"):
                    assert primary is not None  # noqa: S101  # lock_names puts the primary first
                    if primary.record.resolution != record.resolution:
                        return Freshness("stale", f"{' and '.join(names)} disagree (an interrupted lock?)")
                    if not _pylock_agrees(text, primary.pins):
                        return Freshness("edited", edited)
                    primary = dataclasses.replace(primary, pylock_text=text)
                    continue
                stray = None if flavor == "conda" else stray_line(text)
                if stray is not None:  # pip would install it; the pins below would not show it
                    raise ValueError(f"line {stray[0]} is not a pinned requirement: {stray[1][:80]}")
                pins = _conda_pins(text, record.format) if flavor == "conda" else parse_requirements(text)
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                return Freshness("edited", f"{edited} ({exc})")
            if resolution_id(pins, record.format) != record.resolution:
                return Freshness("edited", edited)
            primary = LockSnapshot(path, text, record, {} if flavor == "conda" else pins)
            behind = "" if flavor == "conda" else _follows_problem(project, plan, primary, shown)
            if behind:
                return Freshness("stale", behind)
        if primary is not None and with_apt and plan.apt_stages:
            got = _with_apt_lock(project, plan, primary, directory / apt_lock_name(platform))
            if isinstance(got, Freshness):
                return got
            primary = got
        if primary is not None:
            snapshots[platform] = primary
    return Freshness("fresh", "", snapshots)


def require_fresh(project: Project, plan: Plan, platform: str | None = None) -> LockSnapshot:
    """The snapshot of one platform's lockfile (default: the plan's first platform), which must be
    fresh; else LockMissing saying why and how to fix it."""
    target = platform or plan.platforms[0]
    found = query(project, plan, [target])
    if not found.fresh:
        hint = f"run `envbuild lock {plan.name}`"
        if found.state == "edited":
            hint = f"lockfiles are generated: run `envbuild lock {plan.name}` (add packages in the profile instead)"
        raise LockMissing(f"{plan.name}: {found.reason}", hint=hint)
    return found.snapshots[target]
