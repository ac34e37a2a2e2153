"""Atomic file writing: a reader sees the old files or the new ones, never half of either."""

from __future__ import annotations

import contextlib
import errno
import glob
import hashlib
import os
import tempfile
import time
from pathlib import Path

from envbuild.errors import WriteFailed
from envbuild.tmpdirs import process_gone


def atomic_write_many(files: dict[Path, str]) -> list[Path]:
    """Write every file unnamed first, then give each its name with one rename.

    The renames happen only after every file is complete and fsynced, so a kill before that
    point leaves the previous versions untouched. The new contents have no name until the
    moment they replace the old (Linux's O_TMPFILE): SIGKILL, which no handler sees, leaves no
    temporary file beside a lockfile; where O_TMPFILE is missing, a later write of the same file
    sweeps what a dead writer left.
    """
    staged: list[Staged] = []
    path = Path()
    try:
        for given, text in files.items():
            # a link (a lockfile shared between checkouts, say) is written through, never replaced
            path = given.resolve() if given.is_symlink() else given
            path.parent.mkdir(parents=True, exist_ok=True)
            # registered before a byte is written: a full disk mid-write must not leave it behind
            staged.append(Staged.open(path))
            fd = staged[-1].fd
            # new files are 0600 (mkstemp) or follow the umask; lockfiles and build context files
            # must be world-readable (a non-root user in the image reads what COPY put there).
            os.fchmod(fd, 0o644)
            with os.fdopen(fd, "w", encoding="utf-8", newline="\n", closefd=False) as fh:
                fh.write(text)
                fh.flush()
                os.fsync(fh.fileno())
        for item in staged:
            path = item.path
            item.publish()
    except OSError as exc:
        raise _failed(exc, path) from exc
    finally:
        for item in staged:
            item.discard()
    return [item.path for item in staged]


_TEMP_SUFFIX = ".tmp"
_LIVE_WRITE_S = 60.0
_PROC_FDS = Path("/proc/self/fd")


class Staged:
    """One file's new contents, written through `fd`; named only when published, unless the
    filesystem has no O_TMPFILE (then `tmp` names it from the start). `discard` always follows
    (a `finally`): after `publish` it only closes, before it the contents are dropped."""

    def __init__(self, path: Path, dir_fd: int, fd: int, tmp: str | None) -> None:
        self.path, self.dir_fd, self.fd, self.tmp = path, dir_fd, fd, tmp

    @classmethod
    def open(cls, path: Path) -> Staged:
        """New contents for `path`, whose folder exists; what a killed writer of it left is swept."""
        _sweep_dead_writers(path)
        dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        # naming the file later goes through /proc, which a minimal container may not mount
        if _PROC_FDS.is_dir():
            try:
                fd = os.open(".", os.O_TMPFILE | os.O_WRONLY, 0o600, dir_fd=dir_fd)
                return cls(path, dir_fd, fd, None)
            except (AttributeError, OSError):  # not Linux, or a filesystem without it (some network ones)
                pass
        try:
            fd, tmp = tempfile.mkstemp(prefix=_temp_prefix(path), suffix=_TEMP_SUFFIX, dir=path.parent)
        except OSError:
            os.close(dir_fd)
            raise
        return cls(path, dir_fd, fd, Path(tmp).name)

    def publish(self) -> None:
        if self.tmp is None:
            # Linking /proc/self/fd/N gives the unnamed file a name; only linkat with a directory fd
            # follows that link (plain link(2) would try to link the /proc entry itself).
            tmp = f"{_temp_prefix(self.path)}{os.urandom(4).hex()}{_TEMP_SUFFIX}"
            os.link(_PROC_FDS / str(self.fd), tmp, dst_dir_fd=self.dir_fd, follow_symlinks=True)
            self.tmp = tmp
        os.replace(self.tmp, self.path.name, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)
        self.tmp = None

    def discard(self) -> None:
        if self.tmp is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.tmp, dir_fd=self.dir_fd)
        os.close(self.fd)
        os.close(self.dir_fd)


def _temp_prefix(path: Path) -> str:
    # the writer's pid in the name lets a later write tell a dead writer's leftover from a live one's
    return f".{path.name}.{os.getpid()}."


def _sweep_dead_writers(path: Path) -> None:
    """Remove temporary files a killed writer of `path` left (only possible without O_TMPFILE,
    or in the instant between naming a file and renaming it)."""
    now = time.time()
    for leftover in path.parent.glob(f".{glob.escape(path.name)}.*{_TEMP_SUFFIX}"):
        pid = leftover.name[len(path.name) + 2 :].split(".", 1)[0]
        # A minute old as well: a folder mounted into a container is shared with a writer that
        # this PID namespace cannot see, and no live writer keeps a temporary file that long.
        with contextlib.suppress(OSError):
            if pid.isdigit() and process_gone(int(pid)) and now - leftover.stat().st_mtime > _LIVE_WRITE_S:
                leftover.unlink()


def file_error(exc: OSError) -> WriteFailed:
    """A failed read or write anywhere below the CLI, as the error users get for it: exit 11,
    naming the path and what to do, instead of an internal error."""
    path = Path(str(exc.filename))
    if exc.errno in {errno.ENOSPC, errno.EDQUOT} and exc.filename2 is not None:
        # a copy or link that ran out of room names the file it read first (shutil's copy, os.link),
        # and its hint sent users to free space on the wrong disk (the wheel cache's)
        path = Path(str(exc.filename2))
    if exc.errno == errno.EROFS:
        return WriteFailed(f"cannot write {path}: {exc.strerror}", hint=_read_only(path))
    if exc.errno in {errno.EACCES, errno.EPERM}:
        return WriteFailed(
            f"cannot read or write {path}: {exc.strerror}",
            hint=owner_fix(path)
            or f"{path} (or its folder) is not accessible for this user: fix its permissions or ownership",
        )
    return _failed(exc, path)


def _read_only(path: Path) -> str:
    # permissions and ownership cannot help here, which is all the hint used to suggest
    return (
        f"{path.parent} is on a read-only filesystem (a read-only checkout or volume): run envbuild in a "
        "writable copy of the project, or choose a writable place (build_dir in envbuild.toml moves .envbuild/)"
    )


def owner_fix(path: Path) -> str | None:
    """The fix where a path (or the folder it would go in) belongs to another user, the usual
    cause in a project: one `sudo envbuild build` leaves `.envbuild/` root's, and every later
    command of the project's own user fails on it. Names the owner and the one command that
    gives back the whole tree that user made (the highest of its folders below one of ours)."""
    me = os.geteuid()
    chain = [p for p in (path, *path.parents) if p.exists() or p.is_symlink()]
    if not chain or me == 0:
        return None
    try:
        owner = chain[0].lstat().st_uid
        if owner == me:
            return None
        top = chain[0]
        for folder in chain[1:]:
            uid = folder.lstat().st_uid
            if uid == me:
                break
            if uid != owner:
                return None  # nothing of ours above it: not a tree another user made in our folder
            top = folder
        else:
            return None
    except OSError:
        return None
    import pwd

    try:
        who = pwd.getpwuid(owner).pw_name
    except KeyError:
        who = f"uid {owner}"
    return (
        f"{top} belongs to {who}, not to this user (a command run as {who}, with sudo?, made it): "
        f"sudo chown -R {os.geteuid()}:{os.getegid()} {top}"
    )


def check_writable(path: Path) -> None:
    """Fail now, not after a long run whose result would then be lost, when `path` cannot be written."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # the same way atomic_write_many writes: the probe has no name, so no kill leaves it behind
        Staged.open(path).discard()
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
    if exc.errno == errno.EROFS:
        return _read_only(path)
    if exc.errno in {errno.EACCES, errno.EPERM}:
        mine = f"{path.parent} is not writable for this user: choose another place or fix its permissions"
        return owner_fix(path) or mine
    return f"choose a path in a folder that exists and can be written ({path.parent})"


def held(path: Path) -> bool:
    """Whether a process holds the lock (filelock's, an flock) on `path` right now. Asked read-only,
    so a lock file another user made (root's, after a `sudo envbuild build`) can still be asked."""
    import fcntl

    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False  # no lock file (nothing ever took it), or one this user cannot even read
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops the lock this probe took
    return False


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
