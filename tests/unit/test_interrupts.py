"""Interrupts, file-system faults and a silent engine: every promise of the README's exit-code table
holds at these edges (issue 25)."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import Result

# A shell without job control starts background commands with SIGINT ignored, and children
# inherit that (Python then installs no KeyboardInterrupt handler): a suite started with `&` saw
# every Ctrl-C test hang. A user's terminal gives the default; so does this, then runs the program.
_CTRL_C_AS_A_TERMINAL_GIVES_IT = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.executable, sys.argv[1:])"
)


def _envbuild(project: Path, *args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", _CTRL_C_AS_A_TERMINAL_GIVES_IT, sys.executable, "-m", "envbuild", *args],
        cwd=project,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **env},
    )


@pytest.fixture
def stalling_uv(tmp_path: Path) -> Path:
    """A uv that starts, says so, and never answers: an index that stopped responding."""
    marker = tmp_path / "uv-started"
    script = tmp_path / "uv"
    script.write_text(f"#!/bin/sh\necho $$ >> {marker}\nexec sleep 120\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_an_interrupted_lock_stops_its_resolvers_and_writes_nothing(
    engineless_project: Path, stalling_uv: Path, sig: int, code: int
) -> None:
    """It used to print "locked 12 packages", write the lockfiles, then exit 143: the resolution ran in a
    worker thread the pool waited for."""
    before = sorted(p.relative_to(engineless_project) for p in (engineless_project / "lockfiles").rglob("*"))
    run = _envbuild(engineless_project, "lock", "cpu-py312", "cu118-py310", env={"ENVBUILD_UV": str(stalling_uv)})
    marker = stalling_uv.with_name("uv-started")
    deadline = time.monotonic() + 30
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.exists(), "the lock never started its resolver"
    run.send_signal(sig)
    out, err = run.communicate(timeout=20)
    assert run.returncode == code, err
    assert "locked" not in out + err
    said = "terminated" if sig == signal.SIGTERM else "interrupted"
    assert f"envbuild: {said}; cleaned up what it had started" in err  # SIGINT said nothing before
    after = sorted(p.relative_to(engineless_project) for p in (engineless_project / "lockfiles").rglob("*"))
    assert after == before
    for pid in marker.read_text().split():  # the stalled resolvers were stopped, not left running
        with pytest.raises(ProcessLookupError):
            os.kill(int(pid), 0)


_WORKER_TAKES_THE_SIGNAL = """
import os, signal, sys, threading, time
from envbuild import proc
from envbuild.errors import EnvbuildError
# The main thread (and every thread it starts) blocks SIGINT, so the kernel must hand it to a
# worker: what happens by chance when a worker is starting a program as the signal arrives.
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})

def work(i):
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    proc.run(["sleep", "30"], error=EnvbuildError, timeout=60)  # a stalled resolver

threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT)).start()
t0 = time.monotonic()
try:
    proc.gather(work, [0, 1], jobs=2)
except KeyboardInterrupt:
    print(f"interrupted {time.monotonic() - t0:.1f}")
"""


def test_an_interrupt_a_worker_thread_takes_still_stops_the_work() -> None:
    """A SIGINT that landed in a worker thread went unanswered until every stalled program ended
    (a CI run's lock waited out its 20 s): the main thread now notices it within a fraction of a
    second, stops the programs, and raises KeyboardInterrupt."""
    done = subprocess.run(
        [sys.executable, "-c", _CTRL_C_AS_A_TERMINAL_GIVES_IT, sys.executable, "-c", _WORKER_TAKES_THE_SIGNAL],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stdout.startswith("interrupted "), done.stdout + done.stderr
    assert float(done.stdout.split()[1]) < 10  # 30 s when it waited for the programs


def test_an_unreadable_envbuild_toml_is_exit_11_naming_it(
    cli: Callable[..., Result], engineless_project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every command failed with "internal error" (exit 70). Root reads any file, so the fault is injected."""
    config = engineless_project / "envbuild.toml"
    config.write_text("[envbuild]\n")
    real = Path.read_text

    def unreadable(self: Path, *args: object, **kwargs: object) -> str:
        if self.name == "envbuild.toml":
            raise PermissionError(13, "Permission denied", str(self))
        return real(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "read_text", unreadable)
    res = cli("list", "--json")
    assert res.code == 11, res.err
    assert f"cannot read or write {config}: Permission denied" in res.err
    assert json.loads(res.out)["error"]["exit_code"] == 11


def test_a_read_only_build_folder_is_exit_11_with_the_json_envelope(
    cli: Callable[..., Result], engineless_project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`build --context-only` with a .envbuild/ it cannot write was an internal error (exit 70)."""
    work = engineless_project / ".envbuild"
    work.write_text("a file where the build folder should be\n")
    res = cli("build", "cpu-py311", "--context-only", "--json")
    assert res.code == 11, res.err
    error = json.loads(res.out)["error"]
    assert error["exit_code"] == 11 and ".envbuild" in error["message"]


def test_a_full_disk_leaves_no_temporary_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    from envbuild import fsutil
    from envbuild.errors import WriteFailed

    real_fdopen = os.fdopen

    def full(fd: int, *args: object, **kwargs: object) -> object:
        handle = real_fdopen(fd, *args, **kwargs)  # type: ignore[call-overload]

        def write(_: str) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

        handle.write = write
        return handle

    monkeypatch.setattr(os, "fdopen", full)
    with pytest.raises(WriteFailed, match="No space left on device"):
        fsutil.atomic_write_many({tmp_path / "requirements.lock": "x" * 100})
    assert list(tmp_path.iterdir()) == []


_KILLED_WHILE_WRITING = """
import os, signal, sys
from pathlib import Path
from envbuild import fsutil
{setup}
real_fsync = os.fsync
synced = []
def fsync(fd):
    real_fsync(fd)
    synced.append(fd)
    if len(synced) == 2:  # both files complete, neither renamed yet
        os.kill(os.getpid(), signal.SIGKILL)
os.fsync = fsync
folder = Path(sys.argv[1])
fsutil.atomic_write_many({{folder / "requirements.lock": "new" * 4, folder / "pylock.toml": "new" * 4}})
"""


def _kill_a_writer(folder: Path, setup: str = "") -> subprocess.CompletedProcess[str]:
    code = _KILLED_WHILE_WRITING.format(setup=setup)
    return subprocess.run([sys.executable, "-c", code, str(folder)], capture_output=True, text=True, check=False)


def test_a_writer_killed_before_its_renames_leaves_the_old_files_and_no_temporary_one(tmp_path: Path) -> None:
    (tmp_path / "requirements.lock").write_text("old\n")
    (tmp_path / "pylock.toml").write_text("old\n")
    res = _kill_a_writer(tmp_path)
    assert res.returncode == -signal.SIGKILL, res.stderr
    # SIGKILL runs no clean-up: the new contents had no name yet, so nothing is left beside the lockfiles
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pylock.toml", "requirements.lock"]
    assert (tmp_path / "requirements.lock").read_text() == "old\n"


def test_without_o_tmpfile_the_next_write_sweeps_what_a_killed_writer_left(tmp_path: Path) -> None:
    from envbuild import fsutil

    (tmp_path / "requirements.lock").write_text("old\n")
    res = _kill_a_writer(tmp_path, setup="del os.O_TMPFILE  # a filesystem or platform without it")
    assert res.returncode == -signal.SIGKILL, res.stderr
    left = sorted(p.name for p in tmp_path.glob(".*.tmp"))
    assert len(left) == 2 and (tmp_path / "requirements.lock").read_text() == "old\n"
    fsutil.atomic_write_many({tmp_path / "other.lock": "x"})
    assert len(list(tmp_path.glob(".*.tmp"))) == 2  # another file's write: not its business
    fsutil.atomic_write_many({tmp_path / "pylock.toml": "new\n"})
    # written a moment ago: the writer may live in a container's PID namespace, so they stay for now
    assert len(list(tmp_path.glob(".*.tmp"))) == 2
    for name in left:
        os.utime(tmp_path / name, (time.time() - 120, time.time() - 120))
    live = tmp_path / f".requirements.lock.{os.getpid()}.abcd.tmp"  # a writer still at work: not touched
    live.write_text("partial")
    os.utime(live, (time.time() - 120, time.time() - 120))
    fsutil.atomic_write_many({tmp_path / "requirements.lock": "new\n", tmp_path / "pylock.toml": "new\n"})
    assert sorted(p.name for p in tmp_path.iterdir()) == [live.name, "other.lock", "pylock.toml", "requirements.lock"]
    assert (tmp_path / "requirements.lock").read_text() == "new\n"


def test_a_symlinked_lockfile_is_written_through(tmp_path: Path) -> None:
    from envbuild import fsutil

    shared = tmp_path / "shared.lock"
    shared.write_text("old\n")
    link = tmp_path / "requirements.lock"
    link.symlink_to(shared)
    fsutil.atomic_write_many({link: "new\n"})
    assert link.is_symlink() and shared.read_text() == "new\n"


@pytest.fixture
def silent_engine(tmp_path: Path) -> Iterator[str]:
    """A socket that accepts connections and never answers: a hung dockerd."""
    path = tmp_path / "docker.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
                held.append(conn)
            except OSError:
                continue

    worker = threading.Thread(target=accept, daemon=True)
    worker.start()
    yield f"unix://{path}"
    stop.set()
    worker.join()
    for conn in held:
        conn.close()
    server.close()


def test_status_answers_soon_and_never_says_ready_when_the_engine_hangs(
    engineless_project: Path, silent_engine: str
) -> None:
    """`status` took exactly 600 s (the client's timeout), then said next "ready" with exit 0."""
    t0 = time.monotonic()
    run = _envbuild(
        engineless_project,
        "status",
        "cpu-py311",
        "--json",
        env={"DOCKER_HOST": silent_engine, "ENVBUILD_ENGINE_TIMEOUT": "2"},
    )
    out, err = run.communicate(timeout=60)
    elapsed = time.monotonic() - t0
    assert run.returncode == 0, err
    report = json.loads(out)
    row = report["profiles"][0]
    assert (row["image"], row["next"]) == ("unknown", "envbuild doctor")
    assert "no answer in time" in report["note"]
    assert elapsed < 30


def test_an_extends_loop_is_reported_with_every_link(cli: Callable[..., Result], engineless_project: Path) -> None:
    """`_a -> _b -> _a` was reported as `_a -> _a`."""
    profiles = engineless_project / "profiles"
    (profiles / "_a.yaml").write_text("extends: _b\n")
    (profiles / "_b.yaml").write_text("extends: _a\n")
    path = profiles / "cpu-py311.yaml"
    path.write_text(path.read_text().replace("extends: _base", "extends: _a"))
    res = cli("validate", "cpu-py311")
    assert res.code == 2 and "extends forms a cycle (cpu-py311 -> _a -> _b -> _a)" in res.out + res.err


def test_one_dangling_link_does_not_stop_validate_all(cli: Callable[..., Result], engineless_project: Path) -> None:
    (engineless_project / "profiles" / "cu999-py311.yaml").symlink_to(engineless_project / "nowhere.yaml")
    res = cli("validate", "--all", "--json")
    assert res.code == 2
    report = json.loads(res.out)
    files = {p["file"]: p for p in report["profiles"]}
    assert files["profiles/cu999-py311.yaml"]["valid"] is False
    assert "a link that leads nowhere" in files["profiles/cu999-py311.yaml"]["errors"][0]["message"]
    assert files["profiles/cpu-py311.yaml"]["valid"] is True  # the others were still checked


def test_extends_fragments_cannot_add_up_past_the_value_limit(
    cli: Callable[..., Result], engineless_project: Path
) -> None:
    """The 5,000-value limit was per file: 40 chained fragments gave 96,000 env entries that validated."""
    profiles = engineless_project / "profiles"
    parent = "_base"
    for i in range(3):
        entries = "".join(f"  V{i}_{k}: x\n" for k in range(2_000))
        (profiles / f"_f{i}.yaml").write_text(f"extends: {parent}\nenv:\n{entries}")
        parent = f"_f{i}"
    path = profiles / "cpu-py311.yaml"
    path.write_text(path.read_text().replace("extends: _base", f"extends: {parent}"))
    res = cli("validate", "cpu-py311")
    assert res.code == 2 and "over the 5,000 one file may hold" in res.out + res.err


def _as_user(uid: int, work: Callable[[], object]) -> object:
    """`work`'s result, computed in a child process that has dropped to `uid` (as a team's user is
    who meets a folder another user's command made). Forked, so no interpreter has to be found."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child's coverage is not collected
        code = 0
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            os.write(write, json.dumps(work()).encode())
        except BaseException as exc:  # anything the child meets is the parent's failure
            os.write(write, json.dumps({"child failed": repr(exc)}).encode())
            code = 1
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        data = pipe.read()
    os.waitpid(pid, 0)
    return json.loads(data)


@pytest.mark.skipif(os.geteuid() != 0, reason="making another user's files needs root (CI runs as root)")
def test_a_build_folder_left_by_sudo_names_its_owner_and_the_command_that_gives_it_back(
    cli: Callable[..., Result], engineless_project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One `sudo envbuild build` leaves `.envbuild/` root's. The project's own user then got, from
    every command (even `status`, which writes nothing), "cannot read or write
    .../mutex/build-cpu-py311: Permission denied" and "fix its permissions or ownership"."""
    import shutil
    import tempfile

    from envbuild import build
    from envbuild.project import open_project

    user = 4242
    with tempfile.TemporaryDirectory(dir="/tmp") as place:  # pytest's own temp root is root's alone (0700)
        os.chmod(place, 0o755)  # noqa: S103 - the other user must reach the project in it
        root = Path(place) / "proj"
        shutil.copytree(engineless_project, root)
        os.chown(root, user, user)
        for folder, dirs, files in os.walk(root):
            for name in dirs + files:
                os.chown(Path(folder) / name, user, user)
        monkeypatch.chdir(root)
        with build.exclusive(open_project(str(root)), "cpu-py311", lambda *_: None):  # root's build, now done
            pass
        assert (root / ".envbuild").stat().st_uid == 0

        def meets() -> object:
            held = build.building(open_project(str(root)), "cpu-py311")
            res = cli("lock", "cpu-py311", "--json")
            return {"held": held, "code": res.code, "fix": json.loads(res.out)["error"]["hint"]}

        seen = _as_user(user, meets)
    assert seen == {
        "held": False,  # asked without failing: `status` and `images` answer
        "code": 11,
        "fix": f"{root}/.envbuild belongs to root, not to this user (a command run as root, with sudo?, made it): "
        f"sudo chown -R {user}:{user} {root}/.envbuild",
    }
