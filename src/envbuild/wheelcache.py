"""The host's wheel cache: every wheel a build or a venv used, stored by its sha256.

A rebuild after a re-lock needs the wheels it already had: torch alone is 180 MB (CPU) to 2.5 GB
(CUDA, with its nvidia-* wheels), and the builder stage used to fetch all of them from the index
again. The cache keeps each verified wheel under its sha256 (`<root>/<2 hex>/<sha256>/<file name>`),
so a lockfile's hash finds it directly and a file can never stand for another. `build` fills it
(from a local wheelhouse, else by downloading the lockfile's own URL and checking the hash) and
copies what the lock needs into the build context; `venv` installs from it; `envbuild cache` shows
its size and prunes what no lockfile of the project needs.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import shutil
import ssl
import time
import urllib.request
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from envbuild import tmpdirs
from envbuild._compat import tomllib
from envbuild.errors import WriteFailed
from envbuild.freshness import read_previous
from envbuild.fsutil import Staged, owner_fix, sha256_file
from envbuild.lockfile import Pin, parse_requirements
from envbuild.names import FIXED_MTIME, canonical

CACHE_ENV = "ENVBUILD_CACHE_DIR"
FETCH_TIMEOUT_S = 60  # per read: a stalled download is given up, the builder then tries the index


def root() -> Path:
    """ENVBUILD_CACHE_DIR, else $XDG_CACHE_HOME/envbuild/wheels, else ~/.cache/envbuild/wheels."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    return tmpdirs.cache_home() / "wheels"


def _slot(sha: str) -> Path:
    return root() / sha[:2] / sha


def find(sha: str) -> Path | None:
    slot = _slot(sha)
    if not slot.is_dir():
        return None
    return next((f for f in sorted(slot.iterdir()) if f.suffix == ".whl"), None)


def add(source: Path, sha: str) -> Path | None:
    """Store a copy of `source` if its sha256 is `sha`; the stored path, or None for a file that is
    not what the lock says. The copy has no name until its hash checked out (fsutil.Staged): a
    half-copied file never sits under a hash, and a killed copy (a CUDA wheel's: 2.5 GB) leaves
    nothing behind. The hash is taken as the bytes go by, not by reading the copy again."""
    slot = _slot(sha)
    target = slot / source.name
    try:
        slot.mkdir(parents=True, exist_ok=True)
        staged = Staged.open(target)
    except OSError as exc:
        raise _cache_error(exc, target) from exc
    try:
        digest = hashlib.sha256()
        with source.open("rb") as src:  # a read's error names the source: the CLI says which file
            try:
                with os.fdopen(staged.fd, "wb", closefd=False) as out:
                    while chunk := src.read(1 << 20):
                        digest.update(chunk)
                        out.write(chunk)
                if digest.hexdigest() != sha:
                    return None
                os.utime(staged.fd, (FIXED_MTIME, FIXED_MTIME))
                staged.publish()
            except OSError as exc:  # a write's error names no file, a rename's a temporary one
                raise _cache_error(exc, target) from exc
        return target
    finally:
        staged.discard()


@dataclass(frozen=True)
class Wanted:
    """One artifact a lock needs: the distribution, the wheel's file name, where it lives, its hash."""

    name: str
    filename: str
    url: str
    sha256: str
    size: int


def wanted(pylock_text: str, pins: dict[str, Pin]) -> list[Wanted]:
    """The wheels a lock installs, from pylock.toml (one wheel per package for the locked platform),
    each with a hash requirements.lock also pins."""
    doc = tomllib.loads(pylock_text)
    out = []
    for pkg in doc.get("packages", []):
        name = canonical(str(pkg.get("name", "")))
        pin = pins.get(name)
        if pin is None:
            continue
        for wheel in pkg.get("wheels", []):
            sha = str((wheel.get("hashes") or {}).get("sha256", ""))
            url = str(wheel.get("url", ""))
            if sha and f"sha256:{sha}" in pin.hashes and url:
                out.append(
                    Wanted(name, url.rsplit("/", 1)[-1].replace("%2B", "+"), url, sha, int(wheel.get("size", 0)))
                )
                break
    return out


def _cache_error(exc: OSError, path: Path) -> OSError | WriteFailed:
    if exc.errno in {errno.EROFS, errno.EACCES, errno.EPERM}:
        # the project's folders are not the cause, which the general hint would have suggested
        return WriteFailed(
            f"the wheel cache cannot be written: {path} ({exc.strerror})",
            hint=owner_fix(path)
            or f"set {CACHE_ENV} to a folder this user can write (the cache is {root()}: `build` and `venv` "
            "keep each locked wheel there, to fetch it once)",
        )
    if exc.errno not in {errno.ENOSPC, errno.EDQUOT}:
        return OSError(exc.errno, exc.strerror, str(path))  # the CLI names the path and the fix
    return WriteFailed(
        f"the wheel cache is full: cannot write {path} ({exc.strerror})",
        hint=f"free space on the disk that holds {root()} (`envbuild cache --prune` removes wheels no "
        f"lockfile pins), or set {CACHE_ENV} to a folder on a disk with room; nothing was half-written",
    )


def _download(item: Wanted, context: ssl.SSLContext) -> Path | None:
    if not item.url.startswith(("https://", "http://")):
        return None  # a file:// URL is a wheelhouse, matched by hash in fill(); nothing else is fetched
    with tmpdirs.private("fetch") as tmp:
        part = Path(tmp) / item.filename
        try:
            resp = urllib.request.urlopen(item.url, timeout=FETCH_TIMEOUT_S, context=context)  # noqa: S310 - http(s) only
            with resp, part.open("wb") as out:
                shutil.copyfileobj(resp, out, 1 << 20)
        except (OSError, ValueError) as exc:
            if isinstance(exc, OSError) and exc.errno in {errno.ENOSPC, errno.EDQUOT}:
                raise _cache_error(exc, part) from exc  # a full disk is not an unreachable URL
            return None  # unreachable here: the builder fetches it from the index, as before
        return add(part, item.sha256)


def _intact(path: Path, item: Wanted) -> bool:
    """The size, when the lock records one (PyPI's do), then the time `add` stamped on the file once
    its hash checked out: any write since moves it, and then the hash decides. Re-hashing an
    untouched torch wheel cost every build ~0.15 s. A size alone let a same-size damaged entry
    through, and the image's install (--require-hashes) then failed on it in every build, as
    "Failed to extract archive" or a hash mismatch, with nothing to say the cache was the cause."""
    stat = path.stat()
    if item.size and stat.st_size != item.size:
        return False
    if stat.st_mtime == FIXED_MTIME:
        return True
    if sha256_file(path) != item.sha256:
        return False
    # intact but touched: stamped again, as uv records a wheel's mtime in what it installs, and two
    # profiles' torch layers must not differ by it
    with contextlib.suppress(OSError):  # a cache shared with another user: theirs to stamp
        os.utime(path, (FIXED_MTIME, FIXED_MTIME))
    return True


def fill(
    items: Iterable[Wanted],
    wheelhouses: Iterable[Path] = (),
    ca_bundle: Path | None = None,
    say: Callable[[str], None] = lambda _: None,
    *,
    fetch: bool = True,
) -> dict[str, Path]:
    """{sha256: cached wheel} for every item the cache has or can get: from the cache, from a local
    wheelhouse (matched by hash), else (with `fetch`) downloaded from the lockfile's URL and checked.
    What cannot be had is left out, not an error."""
    items = list(items)
    found: dict[str, Path] = {}
    missing: list[Wanted] = []
    for item in items:
        hit = find(item.sha256)
        if hit is not None and not _intact(hit, item):
            shutil.rmtree(hit.parent)  # cut short or changed since it was stored: fetched again
            hit = None
        if hit is None:
            for house in wheelhouses:
                candidate = house / item.filename
                if candidate.is_file():
                    hit = add(candidate, item.sha256)
                    if hit is not None:
                        break
        if hit is not None:
            found[item.sha256] = hit
        else:
            missing.append(item)
    if missing and fetch:
        total = sum(i.size for i in missing) / 1e6
        say(f"fetching {len(missing)} wheel(s), {total:,.0f} MB, into the wheel cache ({root()})")
        try:
            context = ssl.create_default_context(cafile=str(ca_bundle) if ca_bundle else None)
        except (ssl.SSLError, OSError):  # a bundle OpenSSL cannot load: the system's store, then
            context = ssl.create_default_context()
        with ThreadPoolExecutor(max_workers=4) as pool:
            for item, got in zip(missing, pool.map(lambda i: _download(i, context), missing), strict=True):
                if got is not None:
                    found[item.sha256] = got
    return found


def for_lock(
    pylock_text: str,
    pins: dict[str, Pin],
    wheelhouses: Iterable[Path] = (),
    ca_bundle: Path | None = None,
    say: Callable[[str], None] = lambda _: None,
    *,
    fetch: bool = True,
    user: tuple[Path, Path] | None = None,
) -> dict[Path, str]:
    """{cached wheel: distribution} for a lock's wheels that the cache has or (see fill) can get;
    `user`, the lockfiles folder and root of the project asking, is noted as one (see register)."""
    if user is not None:
        register(*user)
    items = wanted(pylock_text, pins) if pylock_text else []
    found = fill(items, wheelhouses, ca_bundle, say, fetch=fetch)
    return {found[i.sha256]: i.name for i in items if i.sha256 in found}


def local_sdists(pins: dict[str, Pin], names: Iterable[str], folders: Iterable[Path]) -> dict[Path, str]:
    """{sdist: distribution} for the packages built from their sdists (`names`) whose locked sdist
    lies in a local folder, matched by the locked sha256 as wheels are: the builder cannot read the
    host's folders, so the build context carries them. Not cached: an sdist is a build's input once."""
    from packaging.utils import InvalidSdistFilename, parse_sdist_filename

    wanted_names = {canonical(n) for n in names}
    found: dict[Path, str] = {}
    for folder in folders:
        for path in sorted(folder.iterdir()) if folder.is_dir() else []:
            try:
                name, _ = parse_sdist_filename(path.name)
            except InvalidSdistFilename:
                continue
            pin = pins.get(canonical(str(name)))
            if pin is not None and pin.name in wanted_names and f"sha256:{sha256_file(path)}" in pin.hashes:
                found.setdefault(path, pin.name)
    return found


def complete(pins: dict[str, Pin], placed: dict[Path, str]) -> bool:
    """Every locked distribution has its wheel here: an install from them needs no index at all.
    `placed` is for_lock's: its names are the pins' own keys, canonical already."""
    return set(pins) <= set(placed.values())


@dataclass(frozen=True)
class Usage:
    root: Path
    wheels: int
    bytes: int


# A copy into the cache writes without pause; a temporary file nothing has written to for this long is
# what a killed envbuild left (a CUDA wheel's: 2.5 GB), not another run's copy in progress. Only where
# the filesystem has no O_TMPFILE (a copy is unnamed otherwise), or from an envbuild before 2026-12-04
# (its `.part-*` files).
PART_STALE_S = 3600.0


def usage() -> Usage:
    """The cached wheels, and every byte under the cache: part files a killed copy left count too."""
    files = [f for f in root().glob("*/*/*") if f.is_file()] if root().is_dir() else []
    return Usage(root(), sum(f.suffix == ".whl" for f in files), sum(f.stat().st_size for f in files))


def needed(lockfiles: Path) -> set[str]:
    """The sha256 of every artifact some requirements lockfile under `lockfiles` pins."""
    keep: set[str] = set()
    for path in sorted(lockfiles.glob("*/requirements*.lock")):
        try:
            pins = parse_requirements(read_previous(path))  # a hand edit in Latin-1 still pins them
        except OSError:
            continue  # unreadable: nothing of it is kept for it, and `lock --check` says why
        keep.update(h.split(":", 1)[1] for p in pins.values() for h in p.hashes if h.startswith("sha256:"))
    return keep


# Beside the hash slots (`<2 hex>/<sha256>/`): one small file per project that used the cache, holding
# its lockfiles folder. The cache is the host's, not one project's: a prune in one project keeps
# what the others' lockfiles pin, which it used to delete (a CUDA lock's 2.5 GB fetched again, or
# gone for good where it came from a wheelhouse that is no longer there).
_USERS = "projects"


class User(NamedTuple):
    """A project that used the cache: its lockfiles folder, and its root where the note has it
    (notes written before roots were noted have only the folder)."""

    lockfiles: Path
    root: Path | None


def register(lockfiles: Path, project: Path | None = None) -> None:
    """Note the project whose lockfiles folder is `lockfiles` (and whose root is `project`) as a user
    of the cache. Best effort: a cache it cannot write to fails the copies themselves, with the error
    that names it."""
    where = str(lockfiles.resolve())
    note = where + "\n" + (str(project.resolve()) + "\n" if project is not None else "")
    entry = root() / _USERS / hashlib.sha256(where.encode()).hexdigest()[:16]
    with contextlib.suppress(OSError, UnicodeDecodeError):
        if not entry.is_file() or (project is not None and entry.read_text("utf-8") != note):
            entry.parent.mkdir(parents=True, exist_ok=True)
            entry.write_text(note, "utf-8")  # a reader that meets it half-written skips or walks


def other_users(lockfiles: Path) -> list[User]:
    """The other projects that used the cache and whose lockfiles folders still exist; the notes of
    those that are gone (moved, deleted) are dropped."""
    here = lockfiles.resolve()
    found: list[User] = []
    folder = root() / _USERS
    for entry in sorted(folder.iterdir()) if folder.is_dir() else []:
        try:
            lines = entry.read_text("utf-8").splitlines()
        except (OSError, UnicodeDecodeError):
            continue
        where = Path(lines[0].strip()) if lines else Path()
        if not where.is_absolute():  # a note being written as this reads it
            continue
        if not where.is_dir():
            with contextlib.suppress(OSError):
                entry.unlink()
        elif where != here:
            project = Path(lines[1].strip()) if len(lines) > 1 and lines[1].strip() else None
            found.append(User(where, project if project is not None and project.is_absolute() else None))
    return found


def prune(keep: set[str]) -> Usage:
    """Remove every cached wheel whose sha256 is not in `keep`, and from the slots kept, the part
    files a killed copy left; what was removed (wheels, and all the bytes)."""
    removed = count = 0
    stale = time.time() - PART_STALE_S
    if root().is_dir():
        for slot in sorted(root().glob("*/*")):
            if not slot.is_dir():
                continue
            if slot.name not in keep:
                size = sum(f.stat().st_size for f in slot.iterdir() if f.is_file())
                shutil.rmtree(slot)
                removed += size
                count += 1
                continue
            for part in slot.glob(".*"):  # `.part-*`, or fsutil's `.NAME.PID.*.tmp`
                with contextlib.suppress(FileNotFoundError):  # another run's prune, or its copy ending
                    st = part.stat()
                    if st.st_mtime < stale:
                        part.unlink()
                        removed += st.st_size
    return Usage(root(), count, removed)
