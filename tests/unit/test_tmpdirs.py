"""envbuild's temporary folders carry their process's pid, and the next run removes what a killed
one left: a real SIGKILLed `envbuild lock --upgrade` (its early uv call's folder) stands in for it."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from envbuild import lockahead, tmpdirs

OLD = time.time() - tmpdirs.STALE_AFTER_S - 60


@pytest.fixture
def temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """envbuild's folder in a private TMPDIR."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(folder))
    monkeypatch.setattr(tmpdirs, "_swept", [])
    home = tmpdirs.home()
    assert home == folder / f"envbuild-{os.getuid()}"
    return home


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _left(temp: Path, name: str, mtime: float = OLD) -> Path:
    path = temp / name
    path.mkdir()
    (path / "pyproject.toml").write_text("x")
    os.utime(path, (mtime, mtime))
    return path


def test_only_old_folders_of_a_gone_process_are_removed(temp: Path) -> None:
    dead = _dead_pid()
    gone = _left(temp, f"envbuild-lock-p{dead}-abc_12xy")
    recent = _left(temp, f"envbuild-lock-ahead-p{dead}-k2j3h4g5", mtime=time.time())
    alive = _left(temp, f"envbuild-smoke-p{os.getppid()}-aaaaaaaa")
    mine = _left(temp, f"envbuild-fetch-p{os.getpid()}-bbbbbbbb")
    other = _left(temp, f"someone-else-p{dead}-cccccccc")
    unnamed = _left(temp, "envbuild-lock-0vwryguq")  # the old naming: no pid to tell by
    (temp / f"envbuild-x-p{dead}-file").write_text("a file, not a folder")
    assert tmpdirs.sweep() == [gone]
    assert not gone.exists()
    for kept in (recent, alive, mine, other, unnamed, temp / f"envbuild-x-p{dead}-file"):
        assert kept.exists(), kept


def test_a_private_folder_names_its_process_is_removed_and_then_sweeps_once(temp: Path) -> None:
    dead = _dead_pid()
    first = _left(temp, f"envbuild-lock-p{dead}-aaaaaaaa")
    with tmpdirs.private("lock") as work:
        assert work.parent == temp and work.name.startswith(f"envbuild-lock-p{os.getpid()}-")
        assert stat.S_IMODE(temp.stat().st_mode) == 0o700
        assert first.exists()  # the sweep comes after the work, not before it
    assert not work.exists() and not first.exists()
    second = _left(temp, f"envbuild-lock-p{dead}-bbbbbbbb")
    with tmpdirs.private("lock"):
        pass
    assert second.exists()  # once a process: the scan reads the whole temporary folder


def test_what_a_sigkilled_relock_leaves_is_removed_by_the_next_run(
    temp: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The early uv call's folder of a `lock --upgrade` killed with SIGKILL (no atexit, no finally)
    stays behind named for the dead process; the next run's sweep removes it once it is old."""
    uv = tmp_path / "uv"
    uv.write_text("#!/bin/sh\nsleep 30\n")
    uv.chmod(0o755)
    cache = tmp_path / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    project = tmp_path / "proj"
    project.mkdir()
    monkeypatch.chdir(project)
    argv = ["lock", "cpu-py311", "--upgrade", "--no-apt"]
    record = lockahead._record_path(argv)
    record.parent.mkdir(parents=True)
    record.write_text('{"args": ["pip", "compile"], "files": {"pyproject.toml": "torch\\n"}, "seeds": {}}')
    # a Python that stops right after the entry point's early start: SIGKILL lands before any cleanup
    script = (
        "import os, signal, sys; from envbuild import lockahead; lockahead.start(sys.argv[1:]); "
        "early = lockahead._state['early']; print(early.work, early.child.pid, flush=True); "
        "os.kill(os.getpid(), signal.SIGKILL)"
    )
    env = {**os.environ, "ENVBUILD_UV": str(uv), "TMPDIR": str(temp.parent)}
    done = subprocess.run([sys.executable, "-c", script, *argv], capture_output=True, text=True, env=env, check=False)
    assert done.returncode == -signal.SIGKILL
    folder, orphan = done.stdout.split()
    os.killpg(int(orphan), signal.SIGKILL)  # the early call lives on (a session of its own): stopped here
    left = Path(folder)
    assert left.parent == temp and left.exists()
    assert tmpdirs.sweep() == []  # young: it could be a live process's in another PID namespace
    os.utime(left, (OLD, OLD))
    assert tmpdirs.sweep() == [left]


@pytest.mark.parametrize("kind", ["open to others", "a link"])
def test_a_folder_of_envbuild_s_name_that_cannot_be_trusted_is_not_used_nor_swept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """Another user can make TMPDIR/envbuild-UID first: envbuild then neither puts its folders in it
    nor removes anything from it."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(folder))
    planted = folder / f"envbuild-{os.getuid()}"
    if kind == "a link":
        (tmp_path / "elsewhere").mkdir()
        planted.symlink_to(tmp_path / "elsewhere")
    else:
        planted.mkdir(mode=0o777)
        planted.chmod(0o777)
    victim = _left(planted, f"envbuild-lock-p{_dead_pid()}-aaaaaaaa")
    assert tmpdirs.home() is None
    assert tmpdirs.make("lock").parent == folder
    assert tmpdirs.sweep() == []
    assert victim.exists()


def test_a_full_disk_under_the_private_folder_is_said_with_tmpdir(temp: Path) -> None:
    """A write's ENOSPC names no file: `lock` on a full TMPDIR was "internal error: OSError"."""
    import errno

    from envbuild.errors import WriteFailed

    with pytest.raises(WriteFailed) as caught, tmpdirs.private("lock"):
        raise OSError(errno.ENOSPC, "No space left on device")
    assert f"no space left in {temp}, where envbuild's lock writes its work" in str(caught.value)
    assert "TMPDIR" in caught.value.hint
    elsewhere = OSError(errno.ENOSPC, "No space left on device", "/elsewhere/file")
    with pytest.raises(OSError) as other, tmpdirs.private("lock"):
        raise elsewhere
    assert other.value is elsewhere  # another disk's: not this folder's to explain
