"""Atomic file writing: a reader sees the old files or the new ones, never half of either."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import tempfile
from pathlib import Path

from envbuild.errors import WriteFailed


def atomic_write_many(files: dict[Path, str]) -> list[Path]:
    """Write every file to a temp name first, then rename them all into place.

    The renames happen only after every temp file is complete and fsynced, so a
    kill before that point leaves the previous versions untouched.
    """
    staged: list[tuple[Path, Path]] = []
    path = Path()
    try:
        for given, text in files.items():
            # a link (a lockfile shared between checkouts, say) is written through, never replaced
            path = given.resolve() if given.is_symlink() else given
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
            # registered before a byte is written: a full disk mid-write must not leave it behind
            staged.append((Path(tmp_name), path))
            # mkstemp makes 0600 files; lockfiles and build context files must be world-readable
            # (a non-root user in the image reads what COPY put there).
            os.fchmod(fd, 0o644)
            with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as fh:
                fh.write(text)
                fh.flush()
                os.fsync(fh.fileno())
        for tmp, path in staged:
            os.replace(tmp, path)
    except OSError as exc:
        raise _failed(exc, path) from exc
    finally:
        for tmp, _ in staged:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
    return [path for _, path in staged]


def file_error(exc: OSError) -> WriteFailed:
    """A failed read or write anywhere below the CLI, as the error users get for it: exit 11,
    naming the path and what to do, instead of an internal error."""
    path = Path(str(exc.filename))
    if exc.errno in {errno.EACCES, errno.EPERM, errno.EROFS}:
        return WriteFailed(
            f"cannot read or write {path}: {exc.strerror}",
            hint=f"{path} (or its folder) is not accessible for this user: fix its permissions or ownership",
        )
    return _failed(exc, path)


def check_writable(path: Path) -> None:
    """Fail now, not after a long run whose result would then be lost, when `path` cannot be written."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".probe", dir=path.parent)
        os.close(fd)
        os.unlink(probe)
        if path.is_dir():
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
    except OSError as exc:
        raise _failed(exc, path) from exc


def _failed(exc: OSError, path: Path) -> WriteFailed:
    blocker = next((p for p in path.parents if p.exists() and not p.is_dir()), None)
    if blocker is not None:  # mkdir says "File exists", open says "Not a directory"
        return WriteFailed(
            f"cannot write {path}: {blocker} is a file, not a folder",
            hint=f"move {blocker} out of the way, or choose another path",
        )
    if exc.errno == errno.EISDIR:
        return WriteFailed(f"cannot write {path}: it is a folder", hint="name a file in it instead")
    return WriteFailed(f"cannot write {path}: {exc.strerror or exc}", hint=_write_hint(exc, path))


def _write_hint(exc: OSError, path: Path) -> str:
    if exc.errno in {errno.ENOSPC, errno.EDQUOT}:
        return f"free some space on the filesystem that holds {path.parent} (nothing was half-written)"
    if exc.errno in {errno.EACCES, errno.EPERM, errno.EROFS}:
        return f"{path.parent} is not writable for this user: choose another place or fix its permissions"
    return f"choose a path in a folder that exists and can be written ({path.parent})"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
