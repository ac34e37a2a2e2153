"""Atomic file writing: a reader sees the old files or the new ones, never half of either."""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from pathlib import Path


def atomic_write_many(files: dict[Path, str]) -> list[Path]:
    """Write every file to a temp name first, then rename them all into place.

    The renames happen only after every temp file is complete and fsynced, so a
    kill before that point leaves the previous versions untouched.
    """
    staged: list[tuple[Path, Path]] = []
    try:
        for path, text in files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
            # mkstemp makes 0600 files; lockfiles and build context files must be world-readable
            # (a non-root user in the image reads what COPY put there).
            os.fchmod(fd, 0o644)
            with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as fh:
                fh.write(text)
                fh.flush()
                os.fsync(fh.fileno())
            staged.append((Path(tmp_name), path))
        for tmp, path in staged:
            os.replace(tmp, path)
    finally:
        for tmp, _ in staged:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
    return [path for _, path in staged]


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
