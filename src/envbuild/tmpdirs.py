"""envbuild's temporary folders: in one folder of the user's (TMPDIR/envbuild-UID), each named for
the process that made it (`envbuild-WHAT-pPID-XXXXXXXX`).

A process that is SIGKILLed (a CI job's timeout, the OOM killer) cannot remove its folders, and a
runner that is never rebooted gathers them run after run. The next envbuild run that finishes with
a temporary folder of its own removes the ones whose process is gone, as the smoke test's sweep
removes a killed run's containers. One folder of the user's keeps that scan to envbuild's own
entries: a shared /tmp can hold thousands (10,000 here: 10 ms to list, 3% of a re-lock).

Standard library only, and little of it: the lock-ahead start (lockahead) makes its folder here
before uv starts.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from envbuild.errors import WriteFailed

PREFIX = "envbuild-"


def cache_home() -> Path:
    """envbuild's folder of the user's cache: $XDG_CACHE_HOME/envbuild, else ~/.cache/envbuild. The
    wheel cache, the lock-ahead records and `run`'s download cache each have a folder in it."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "envbuild"


RUN_CACHE_ENV = "ENVBUILD_RUN_CACHE"


def run_cache() -> Path:
    """The folder `run --download-cache auto` mounts as the job's ~/.cache: ENVBUILD_RUN_CACHE, else
    the cache home's run/. Here, not in runner: `envbuild cache` reports it without loading `run`."""
    return Path(os.environ.get(RUN_CACHE_ENV) or cache_home() / "run")


def folder_bytes(folder: Path) -> int:
    """The bytes of the files under a folder (0 when it does not exist)."""
    total = 0
    for top, _, files in os.walk(folder):
        for name in files:
            with contextlib.suppress(OSError):  # a file going as it is counted (a job's, a prune's)
                total += (Path(top) / name).lstat().st_size
    return total


# Left alone until then, even with its process gone: a folder in a temporary folder that another
# PID namespace shares (a container's) may belong to a live process that this one cannot see.
STALE_AFTER_S = 24 * 3600.0
_swept: list[bool] = []  # once a process


def home() -> Path | None:
    """TMPDIR/envbuild-UID, made private to this user if it is not there; None when what is there
    cannot be trusted (not a folder, another user's, open to others): the folders then go straight
    into TMPDIR, and nothing there is ever swept."""
    folder = Path(tempfile.gettempdir()) / f"{PREFIX}{os.getuid()}"
    with contextlib.suppress(OSError):  # there already, or not makeable: judged below
        os.mkdir(folder, 0o700)
    try:
        st = os.lstat(folder)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        return None
    return folder


def _prefix(what: str) -> str:
    return f"{PREFIX}{what}-p{os.getpid()}-"


def make(what: str) -> Path:
    """A new private folder for `what`; the caller removes it."""
    return Path(tempfile.mkdtemp(prefix=_prefix(what), dir=home()))


@contextlib.contextmanager
def private(what: str) -> Iterator[Path]:
    """A private folder for `what`, removed afterwards; then (once a process) what killed runs left.
    A full disk under it is said so, naming TMPDIR (it was an internal error)."""
    where = home()
    base = str(where or tempfile.gettempdir())
    try:
        with tempfile.TemporaryDirectory(prefix=_prefix(what), dir=where) as tmp:
            yield Path(tmp)
    except OSError as exc:
        # a write's error names no file; one that names a file elsewhere is not this folder's
        if exc.errno not in {errno.ENOSPC, errno.EDQUOT} or not str(exc.filename or base).startswith(base):
            raise
        raise WriteFailed(
            f"no space left in {base}, where envbuild's {what} writes its work",
            hint="free space there, or point TMPDIR at a disk with room",
        ) from exc
    if not _swept:
        _swept.append(True)
        sweep()


def _owner(name: str) -> int | None:
    """The pid in an envbuild temporary folder's name; None for any other name."""
    if not name.startswith(PREFIX):
        return None
    parts = name.rsplit("-", 2)  # mkdtemp's own suffix has no "-"
    if len(parts) != 3 or not parts[1].startswith("p") or not parts[1][1:].isdigit():
        return None
    return int(parts[1][1:])


def process_gone(pid: int) -> bool:
    """Whether no process of this PID namespace has `pid` (this process is never gone)."""
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # PermissionError: alive, another user's
        return False
    return False


def sweep(older_than: float = STALE_AFTER_S) -> list[Path]:
    """Remove envbuild's temporary folders whose process is gone and that nothing has written to for
    `older_than` seconds. Housekeeping: it never fails, and leaves what it cannot remove."""
    import shutil

    removed: list[Path] = []
    now = time.time()
    folder = home()
    try:
        entries = list(os.scandir(folder)) if folder is not None else []
    except OSError:
        return removed
    for entry in entries:
        pid = _owner(entry.name)
        if pid is None or not process_gone(pid):
            continue
        try:
            if not entry.is_dir(follow_symlinks=False) or now - entry.stat(follow_symlinks=False).st_mtime < older_than:
                continue
        except OSError:
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        if not os.path.lexists(entry.path):
            removed.append(Path(entry.path))
    return removed
