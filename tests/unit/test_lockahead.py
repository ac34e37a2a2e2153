"""A re-lock's uv call started before the CLI loads: taken only when it is the very call the lock
path makes, thrown away (stopped, its folder removed) otherwise. A real process stands in for uv."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from envbuild import lockahead, uvtool
from envbuild.errors import LockError

from ..conftest import Result

RELOCK = ["lock", "cpu-py311", "--upgrade", "--no-apt"]

FAKE_UV = """#!/bin/sh
echo "$PWD" >> "{log}"
if [ -n "$FAKE_UV_SLEEP" ]; then sleep "$FAKE_UV_SLEEP"; fi
prev=""
for a in "$@"; do
  if [ "$prev" = "-o" ]; then out="$a"; fi
  prev="$a"
done
cat "$3" > "$out.new"
if [ -f "$out" ]; then cat "$out" >> "$out.new"; fi
echo resolved >> "$out.new"
mv "$out.new" "$out"
exit "${{FAKE_UV_RC:-0}}"
"""


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A uv that copies its input to its output, logging the folder it ran in; a private cache."""
    uv = tmp_path / "uv"
    log = tmp_path / "calls"
    uv.write_text(FAKE_UV.format(log=log))
    uv.chmod(0o755)
    monkeypatch.setenv("ENVBUILD_UV", str(uv))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv(lockahead.OFF_ENV, raising=False)
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(temp))
    project = tmp_path / "proj"
    project.mkdir()
    monkeypatch.chdir(project)
    yield log
    lockahead.drop()


def _work(root: Path, name: str, lock_input: str, seed: str | None = None) -> tuple[Path, list[str]]:
    """A resolve folder as venvlock makes one, and the uv arguments for it."""
    work = root / name
    work.mkdir()
    (work / "pyproject.toml").write_text(lock_input)
    if seed is not None:
        (work / "requirements.txt").write_text(seed)
    return work, ["pip", "compile", f"{work}/pyproject.toml", "-o", f"{work}/requirements.txt", "--upgrade"]


def _first_run(tmp_path: Path, lock_input: str = "torch==2.13.0\n") -> None:
    """The run before: nothing recorded yet, so nothing started early; it leaves the record."""
    lockahead.start(RELOCK)
    work, args = _work(tmp_path, "first", lock_input)
    lockahead.remember(args, work, {})
    assert not uvtool.ran_early(args, error=LockError, cwd=work)
    lockahead.drop()


def _early() -> lockahead.Early:
    early = lockahead._state.get("early")
    assert isinstance(early, lockahead.Early), "nothing was started early"
    return early


def test_the_same_call_typed_again_runs_before_the_cli_loads_and_its_result_is_taken(
    fake: Path, tmp_path: Path
) -> None:
    _first_run(tmp_path)
    lockahead.start(RELOCK)
    early = _early()
    work, args = _work(tmp_path, "second", "torch==2.13.0\n")
    assert uvtool.ran_early(args, error=LockError, cwd=work)
    assert (work / "requirements.txt").read_text() == "torch==2.13.0\nresolved\n"
    assert Path(fake.read_text(encoding="utf-8").split()[-1]).name.startswith("envbuild-lock-ahead-")
    assert not early.work.exists()
    assert [p for p in (tmp_path / "tmp").rglob("*") if p.name != f"envbuild-{os.getuid()}"] == []


def test_a_plain_lock_records_the_call_of_the_upgrade_its_lockfile_names(fake: Path, tmp_path: Path) -> None:
    # `lock NAME` (a new profile's first lock, or one after an edit) starts nothing early, but the
    # `lock NAME --upgrade` typed after it had no record either: every first re-lock paid the
    # CLI's imports before uv started (1.85x the raw uv call)
    lockahead.start(["lock", "cpu-py311"])
    assert "early" not in lockahead._state
    work, args = _work(tmp_path, "first", "torch==2.13.0\n", seed="torch==2.12.0\n")  # its lockfile's pins
    plain = [a for a in args if a != "--upgrade"]
    lockahead.remember(plain, work, {}, lambda: args, work / "requirements.txt")
    assert not uvtool.ran_early(plain, error=LockError, cwd=work)
    lockahead.drop()
    lockahead.start(["lock", "cpu-py311", "--upgrade"])
    _early()
    work, args = _work(tmp_path, "second", "torch==2.13.0\n")  # --upgrade: no seed from the lockfile
    lockahead.remember(args, work, {})
    assert uvtool.ran_early(args, error=LockError, cwd=work)
    assert (work / "requirements.txt").read_text() == "torch==2.13.0\nresolved\n"
    lockahead.drop()
    # a plain lock of an edited profile records the new call: the next --upgrade starts that one
    lockahead.start(["lock", "cpu-py311"])
    work, args = _work(tmp_path, "third", "torch==2.14.0\n")
    lockahead.remember([a for a in args if a != "--upgrade"], work, {}, lambda: args, work / "requirements.txt")
    lockahead.drop()
    lockahead.start(["lock", "--upgrade", "cpu-py311"])  # wherever --upgrade stands
    work, args = _work(tmp_path, "fourth", "torch==2.14.0\n")
    assert uvtool.ran_early(args, error=LockError, cwd=work)


def test_a_call_that_is_done_before_its_start_returns_is_still_taken(
    fake: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a loaded machine uv can finish before the entry point goes on: the folder it was given is
    what the lock path's must match, not the folder with uv's output in it."""
    _first_run(tmp_path)
    popen = subprocess.Popen

    def finished(*args: object, **kwargs: object) -> subprocess.Popen[str]:
        child: subprocess.Popen[str] = popen(*args, **kwargs)  # type: ignore[call-overload]
        child.wait()  # the fake writes nothing to its pipes, so this cannot block on them
        return child

    monkeypatch.setattr(subprocess, "Popen", finished)
    lockahead.start(RELOCK)
    _early()
    work, args = _work(tmp_path, "second", "torch==2.13.0\n")
    assert uvtool.ran_early(args, error=LockError, cwd=work)
    assert (work / "requirements.txt").read_text() == "torch==2.13.0\nresolved\n"


def test_a_different_call_is_stopped_and_thrown_away_and_the_lock_runs_its_own(
    fake: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _first_run(tmp_path)
    monkeypatch.setenv("FAKE_UV_SLEEP", "30")  # still running when the lock path asks
    lockahead.start(RELOCK)
    early = _early()
    work, args = _work(tmp_path, "second", "torch==2.13.0\neinops==0.8.0\n")  # the profile changed
    started = time.monotonic()
    assert not uvtool.ran_early(args, error=LockError, cwd=work)
    assert time.monotonic() - started < 10
    assert early.child.poll() is not None
    assert not early.work.exists()
    assert not (work / "requirements.txt").exists()


def test_another_environment_for_uv_is_another_call(
    fake: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _first_run(tmp_path)
    lockahead.start(RELOCK)
    monkeypatch.setenv("UV_HTTP_TIMEOUT", "5")  # one of the UV_* settings uv is given
    work, args = _work(tmp_path, "second", "torch==2.13.0\n")
    assert not uvtool.ran_early(args, error=LockError, cwd=work)


def test_a_failed_early_call_is_not_taken(fake: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _first_run(tmp_path)
    monkeypatch.setenv("FAKE_UV_RC", "1")
    lockahead.start(RELOCK)
    early = _early()
    work, args = _work(tmp_path, "second", "torch==2.13.0\n")
    assert not uvtool.ran_early(args, error=LockError, cwd=work)  # the lock path runs it again
    assert not (work / "requirements.txt").exists()
    assert not early.work.exists()


def test_a_lockfile_seed_is_read_again_at_the_next_start(fake: Path, tmp_path: Path) -> None:
    """-P re-locks keep the other pins: uv starts from the current lockfile, which the last re-lock
    changed. The early call must start from today's, not the one recorded."""
    lockfile = tmp_path / "requirements.lock"
    lockfile.write_text("torch==2.12.0\n")
    argv = ["lock", "cpu-py311", "-P", "einops"]
    lockahead.start(argv)
    work, args = _work(tmp_path, "first", "torch\n", seed=lockfile.read_text())
    lockahead.remember(args, work, {"requirements.txt": lockfile})
    lockahead.drop()
    lockfile.write_text("torch==2.13.0\n")
    lockahead.start(argv)
    work, args = _work(tmp_path, "second", "torch\n", seed=lockfile.read_text())
    assert uvtool.ran_early(args, error=LockError, cwd=work)
    assert (work / "requirements.txt").read_text() == "torch\ntorch==2.13.0\nresolved\n"


def test_only_a_single_profile_re_lock_starts_anything(
    fake: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _first_run(tmp_path)
    for argv in (
        ["lock", "cpu-py311", "--no-apt"],  # a plain lock of a fresh lockfile runs no resolve
        ["lock", "--all", "--upgrade"],
        ["lock", "--check", "cpu-py311"],
        ["build", "cpu-py311", "--upgrade"],
        [],
    ):
        lockahead.start(argv)
        assert "early" not in lockahead._state and "argv" not in lockahead._state, argv
    monkeypatch.setenv(lockahead.OFF_ENV, "0")
    lockahead.start(RELOCK)
    assert "early" not in lockahead._state


def test_drop_stops_the_early_call_and_records_nothing(
    fake: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _first_run(tmp_path)
    records = list((tmp_path / "cache" / "envbuild" / "lock-ahead").glob("*.json"))
    before = records[0].read_text()
    monkeypatch.setenv("FAKE_UV_SLEEP", "30")
    lockahead.start(RELOCK)
    early = _early()
    lockahead.keep_if(False)  # the CLI found several profiles, or an error came first
    assert early.child.poll() is not None and not early.work.exists()
    work, args = _work(tmp_path, "second", "other\n")
    lockahead.remember(args, work, {})
    assert records[0].read_text() == before


def test_a_record_names_no_program_and_keeps_no_credentials(fake: Path, tmp_path: Path) -> None:
    _first_run(tmp_path)
    (record,) = (tmp_path / "cache" / "envbuild" / "lock-ahead").glob("*.json")
    data = json.loads(record.read_text())
    assert set(data) == {"args", "files", "seeds"}
    assert all(str(tmp_path) not in a for a in data["args"])  # the folder is a placeholder
    record.unlink()
    lockahead.start(RELOCK)
    work, args = _work(tmp_path, "second", "torch\n")
    lockahead.remember([*args, "--index-url", "https://me:s3cret@mirror.example/simple"], work, {})
    assert not record.exists()


def test_a_tampered_or_broken_record_starts_nothing_and_fails_nothing(fake: Path, tmp_path: Path) -> None:
    _first_run(tmp_path)
    (record,) = (tmp_path / "cache" / "envbuild" / "lock-ahead").glob("*.json")
    for text in ("{", "[]", '{"args": 3, "files": {}, "seeds": {}}', '{"args": [], "files": {}, "seeds": {"x": 1}}'):
        record.write_text(text)
        lockahead.start(RELOCK)
        assert "early" not in lockahead._state, text
        lockahead.drop()


def test_old_records_are_removed_past_the_limit(fake: Path, tmp_path: Path) -> None:
    folder = tmp_path / "cache" / "envbuild" / "lock-ahead"
    folder.mkdir(parents=True)
    for i in range(lockahead.KEEP_RECORDS + 5):
        old = folder / f"{i:032x}.json"
        old.write_text("{}")
        os.utime(old, (1000 + i, 1000 + i))
    _first_run(tmp_path)
    left = sorted(folder.glob("*.json"))
    assert len(left) == lockahead.KEEP_RECORDS
    assert not (folder / f"{0:032x}.json").exists()  # the least recent went first


def test_a_record_a_killed_run_left_half_written_is_removed_once_a_minute_old(fake: Path, tmp_path: Path) -> None:
    folder = tmp_path / "cache" / "envbuild" / "lock-ahead"
    folder.mkdir(parents=True)
    dead, writing = folder / ".record-dead", folder / ".record-writing"
    dead.write_text('{"args": [')
    writing.write_text('{"args": [')
    os.utime(dead, (1000, 1000))
    _first_run(tmp_path)
    assert not dead.exists() and writing.exists()
    assert len(list(folder.glob("*.json"))) == 1


def test_the_console_script_starts_it_before_the_cli_is_imported(fake: Path, tmp_path: Path) -> None:
    """The entry point itself: with a record, the early call starts even when the lock then fails
    (no such project), and is stopped and removed when the process ends."""
    import sys

    _first_run(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "envbuild", *RELOCK],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "TMPDIR": str(tmp_path / "tmp"), "FAKE_UV_SLEEP": "30"},
        timeout=60,
    )
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    ran_in = fake.read_text(encoding="utf-8").split()[-1]
    assert Path(ran_in).name.startswith("envbuild-lock-ahead-")
    assert not Path(ran_in).exists()


def test_new_records_the_first_lock_it_names_and_that_lock_starts_it_early(fake: Path, tmp_path: Path) -> None:
    """A new profile's first `lock NAME` started nothing early (a plain lock has no record, and the
    README's tour is `new`, then `lock`): uv began only after the CLI's imports. `new` records the
    call that lock will make here, worked out by the lock's own code; the lock takes it as its own."""
    import shutil

    from envbuild import lock, validate, venvlock
    from envbuild import plan as plan_mod
    from envbuild.lockopts import LockOptions
    from envbuild.project import open_project

    from ..conftest import REPO

    shutil.copytree(REPO / "profiles", Path.cwd() / "profiles")
    project = open_project(str(Path.cwd()))

    def lock_call(folder: str) -> tuple[list[str], Path, Path]:
        """The first uv call `lock cu121-py311` works out, in a new folder: (args, folder, output)."""
        plan = plan_mod.make(project, validate.load_named(project, "cu121-py311"), LockOptions().plan_options())
        work = tmp_path / folder
        work.mkdir()
        args, seeds, _, out = venvlock._first_call(plan, "x86_64", LockOptions(), None, work, None)
        assert seeds == {}  # a first lock: nothing kept from a lockfile
        return args, work, out

    lock.prepare_next(project, validate.load_named(project, "cu121-py311"))
    lockahead.start(["lock", "cu121-py311", "--upgrade"])  # not the command `new` named: nothing
    assert "early" not in lockahead._state
    lockahead.drop()
    lockahead.start(["lock", "cu121-py311"])
    early = _early()
    args, work, out = lock_call("lock")
    assert uvtool.ran_early(args, error=LockError, cwd=work)
    assert out.read_text().endswith("resolved\n") and not early.work.exists()
    lockahead.drop()
    # the profile edited between `new` and the lock: the early call is not the lock's; thrown away
    lock.prepare_next(project, validate.load_named(project, "cu121-py311"))
    edited = Path.cwd() / "profiles" / "cu121-py311.yaml"
    edited.write_text(edited.read_text().replace("einops==0.8.1", "einops==0.8.0"))
    lockahead.start(["lock", "cu121-py311"])
    early = _early()
    edited_args, other, edited_out = lock_call("edited")
    assert not uvtool.ran_early(edited_args, error=LockError, cwd=other)
    assert not early.work.exists() and not edited_out.exists()
    lockahead.drop()
    # that lock's own record replaces the one `new` left: the same plain lock, typed again (the
    # profile now locked), starts nothing
    lockahead.start(["lock", "cu121-py311"])
    lockahead.remember(args, work, {}, lambda: [*args, "--upgrade"], out)
    lockahead.drop()
    lockahead.start(["lock", "cu121-py311"])
    assert "early" not in lockahead._state


def test_validate_records_the_lock_that_comes_next_and_that_lock_starts_it_early(
    fake: Path, tmp_path: Path, cli: Callable[..., Result]
) -> None:
    """A hand-written profile's first lock, and the first re-lock in a fresh clone, started nothing
    early: no record. A user checks a profile before locking it, so `validate` records the call of
    the lock that comes next, worked out by the lock's own code: the plain `lock NAME` where the
    lockfiles are missing or stale, `lock NAME --upgrade` where they are fresh and no record is
    there. Options that change nothing of the uv call (`--no-apt`) share the record."""
    import shutil

    from envbuild import plan as plan_mod
    from envbuild import validate, venvlock
    from envbuild.lockopts import LockOptions
    from envbuild.project import open_project

    from ..conftest import REPO

    shutil.copytree(REPO / "profiles", Path.cwd() / "profiles")
    shutil.copytree(REPO / "checks", Path.cwd() / "checks")
    project = open_project(str(Path.cwd()))
    name = "cu121-py311"

    def lock_call(folder: str, opts: LockOptions) -> tuple[list[str], Path]:
        """The first uv call `lock NAME` (with `opts`) works out, in a new folder."""
        plan = plan_mod.make(project, validate.load_named(project, name), LockOptions().plan_options())
        work = tmp_path / folder
        work.mkdir()
        own = project.lockfiles_dir / name / "requirements.lock"
        args, _, _, _ = venvlock._first_call(plan, "x86_64", opts, own, work, None)
        return args, work

    # no lockfile: the plain lock resolves, and starts what validate recorded
    assert cli("validate", name).code == 0
    lockahead.start(["lock", name, "--no-apt"])
    early = _early()
    args, work = lock_call("first", LockOptions())
    assert uvtool.ran_early(args, error=LockError, cwd=work) and not early.work.exists()
    lockahead.drop()
    # locked since by a lock that keeps no record (`lock --all`): the plain lock, which would
    # resolve nothing now, starts nothing
    assert cli("validate", name).code == 0
    shutil.copytree(REPO / "lockfiles" / name, project.lockfiles_dir / name)
    lockahead.start(["lock", name])
    assert "early" not in lockahead._state
    lockahead.drop()
    # a fresh lockfile (a fresh clone: no record here): validate records the re-lock instead
    assert cli("validate", name).code == 0
    lockahead.start(["lock", name, "--no-apt"])  # the plain lock of a fresh profile resolves nothing
    assert "early" not in lockahead._state
    lockahead.drop()
    lockahead.start(["lock", name, "--upgrade"])
    early = _early()
    args, work = lock_call("relock", LockOptions(upgrade=True))
    assert uvtool.ran_early(args, error=LockError, cwd=work) and not early.work.exists()
    lockahead.drop()
    # the record a lock keeps is left as it is: validate writes only where there is none
    record = lockahead._record_path(["lock", name])
    record.write_text(record.read_text().replace('"--upgrade"', '"--upgrade", "--kept"'))
    assert cli("validate", name).code == 0
    assert '"--kept"' in record.read_text()
    # an invalid profile records nothing
    record.unlink()
    (Path.cwd() / "profiles" / f"{name}.yaml").write_text("name: cu121-py311\npython: '2.7'\n")
    assert cli("validate", name).code != 0
    assert not record.exists()
