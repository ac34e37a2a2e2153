"""The resolve of a re-lock (`envbuild lock NAME --upgrade`, or `-P PKG`), started before the CLI loads.

Python spends ~0.25 s importing the CLI and the libraries the lock path needs (typer, pydantic,
Jinja, rich) before envbuild can work out which uv call to make, and a warm uv re-lock takes about
0.3 s: most of what a user waited for was envbuild, not the resolver. A re-lock typed again in the
same folder with the same arguments almost always makes the same uv call as last time, so the entry
point starts that call at once, from a record the last such run left, and the imports run beside it.
A new profile's first lock starts early too: `envbuild new` records the call it will make, and
`envbuild validate` the call of the lock that comes next (a changed profile's, a fresh clone's).

The record is only a guess of what to start, never an input to a lock: the lock path works out its
call as it always does and takes the early run's result only when it is that very call (the same
uv, arguments, environment and input files, byte for byte) and it succeeded. Anything else stops
the early run and throws it away, so a wrong guess costs a wasted resolve, never a wrong lockfile.

Standard library only, and few of it: it runs before anything else is imported. It is also where
every uv call's program and environment are worked out (uvtool reads them here), so the early call
and the lock path's cannot differ by construction. ENVBUILD_LOCK_AHEAD=0 turns it off.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import os
import signal
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import subprocess

OFF_ENV = "ENVBUILD_LOCK_AHEAD"
WORK = "{work}"  # the call's own folder, in a record: each run resolves in a new temporary folder
# UV_* settings of the caller's shell would silently change what gets locked; these only change how.
UV_ENV_KEEP = frozenset(
    {"UV_CACHE_DIR", "UV_NATIVE_TLS", "UV_HTTP_TIMEOUT", "UV_HTTP_RETRIES", "UV_OFFLINE", "UV_INSECURE_HOST"}
)
KEEP_RECORDS = 64  # one per folder and command line: the least recently re-locked go first
_CREDENTIALS = r"://[^/@\s]+@"  # user:token@ in an index URL: never written to a record


def uv_binary() -> str:
    """ENVBUILD_UV when set (a uv of the user's choosing), else the uv that came with envbuild (the
    `uv` package), else one on PATH. Worked out here, not read from a record: a record names no
    program to run."""
    if os.environ.get("ENVBUILD_UV"):
        return os.environ["ENVBUILD_UV"]
    import sysconfig

    candidate = Path(sysconfig.get_path("scripts")) / "uv"
    if candidate.is_file():
        return str(candidate)
    import shutil
    import sys

    found = shutil.which("uv") or shutil.which("uv", path=str(Path(sys.executable).parent))
    return found or "uv"  # proc.run names it as missing, with the fix


def uv_environment() -> dict[str, str]:
    """The environment every uv call of envbuild runs with."""
    return {k: v for k, v in os.environ.items() if not k.startswith("UV_") or k in UV_ENV_KEEP}


class Early:
    """A uv call started by `start`, and what it was started with. (Not a dataclass: importing
    dataclasses would delay the start by 5 ms.)"""

    def __init__(
        self,
        child: subprocess.Popen[str],
        work: Path,
        binary: str,
        args: list[str],
        env_digest: str,
        files: dict[str, bytes],
    ) -> None:
        self.child, self.work, self.binary = child, work, binary
        self.args = args  # with the folder as WORK
        self.env_digest = env_digest
        self.files = files  # the folder as uv found it

    def deliver(self, work: Path | None) -> None:
        """Copy what the call wrote into `work` (None: throw it away), then remove its folder."""
        if work is not None:
            for name, data in _listing(self.work).items():
                if self.files.get(name) != data:
                    (work / name).write_bytes(data)
        _remove(self.work)

    def stop(self) -> None:
        if self.child.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.child.pid, signal.SIGKILL)
        with contextlib.suppress(OSError, ValueError):
            self.child.communicate(timeout=5)
        self.deliver(None)


def _remove(folder: Path) -> None:
    import shutil  # 10 ms of imports (lzma, bz2): not before uv has started

    shutil.rmtree(folder, ignore_errors=True)


_guard = threading.Lock()
_state: dict[str, object] = {}  # "argv": the eligible command line; "early": an unclaimed Early


def _records() -> Path:
    from envbuild import tmpdirs

    return tmpdirs.cache_home() / "lock-ahead"


# Options of `lock` that change nothing of its uv call: a command line with or without them keeps
# one record (a plain `lock NAME` records the call of its `--upgrade`; the record `validate` leaves
# for `lock NAME` serves `lock NAME --no-apt`).
_SAME_CALL = frozenset({"--upgrade", "--apt", "--no-apt", "--json", "--dry-run"})


def _record_path(argv: Sequence[str]) -> Path:
    """Where the record of a command line is kept: one per folder and command line, wherever the
    options that change nothing of the uv call stand in it."""
    line = [a for a in argv if a not in _SAME_CALL]
    key = hashlib.sha256(json.dumps([os.getcwd(), line]).encode()).hexdigest()[:32]
    return _records() / f"{key}.json"


def enabled() -> bool:
    """False when ENVBUILD_LOCK_AHEAD=0: nothing is started early, and nothing recorded."""
    return os.environ.get(OFF_ENV, "1") != "0"


def _form(argv: Sequence[str]) -> str:
    """ "relock": `lock` with --upgrade or -P, one profile, not --check: a re-lock always resolves,
    so it may start early. "plain": a plain `lock` of one profile, which resolves only when the
    profile changed or has no lockfile yet: it starts only a call recorded for it while the profile
    was new or changed (`new`, `validate`; elsewhere an early resolve would mostly take CPU from a
    lock that resolves nothing), and records the call of the `lock NAME --upgrade` its lockfile's
    header names. "": neither."""
    if not enabled() or not argv or argv[0] != "lock":
        return ""
    if "--check" in argv or "--all" in argv:
        return ""
    upgrading = any(a in {"--upgrade", "-P", "--upgrade-package"} or a.startswith("--upgrade-package=") for a in argv)
    return "relock" if upgrading else "plain"


def _env_digest(env: Mapping[str, str]) -> str:
    return hashlib.sha256(json.dumps(sorted(env.items())).encode()).hexdigest()


def _listing(work: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(work.iterdir()) if p.is_file()}


def _own_record(argv: Sequence[str], form: str) -> dict[str, Any] | None:
    """The record `argv` (of `form`) would start here, or None. A plain lock starts only a record
    made for it before it was typed (`new`, `validate`: the profile is new or changed, so the lock
    resolves); one of a profile already locked resolves nothing, and would only lose CPU to it."""
    try:
        record = json.loads(_record_path(argv).read_text("utf-8"))
    except (OSError, ValueError, RuntimeError):  # RuntimeError: no home
        return None
    if not isinstance(record, dict) or (form == "plain") != (record.get("first") is True):
        return None
    watch = record.get("watch")
    if form == "plain" and isinstance(watch, dict) and _stamp(Path(str(watch.get("path")))) != watch.get("stamp"):
        return None  # locked since it was recorded (`lock --all`, a pull): a plain lock may resolve nothing
    return record


def _stamp(path: Path) -> list[int] | None:
    """A file's size and modification time, None where it is missing: what a write changes."""
    try:
        st = path.stat()
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns]


def recorded(argv: Sequence[str]) -> bool:
    """Whether `argv`, typed in this folder, would find a record of its own to start."""
    form = _form(argv)
    return bool(form) and _own_record(argv, form) is not None


def start(argv: Sequence[str]) -> None:
    """Start the uv call the last run of this command line made here, if there is a record of it.
    Never fails: a missing, unreadable or odd record starts nothing."""
    form = _form(argv)
    if not form:
        return
    _state["argv" if form == "relock" else "plain"] = list(argv)
    record = _own_record(argv, form)
    if record is None:
        return
    try:
        args = [str(a) for a in record["args"]]
        files = {str(k): str(v).encode() for k, v in record["files"].items()}
        for name, source in record["seeds"].items():
            files[str(name)] = Path(str(source)).read_bytes()  # gone: nothing to start
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return
    import subprocess  # only where something is started: `--help` and the rest never pay for it

    from envbuild import tmpdirs

    binary, env = uv_binary(), uv_environment()
    work = tmpdirs.make("lock-ahead")  # named for this process: a SIGKILL leaves it to the next run
    try:
        for name, data in files.items():
            (work / Path(name).name).write_bytes(data)
        # the folder as uv is given it, listed before uv starts: a listing after could catch a fast
        # call's output and then match no lock path's folder (the early result thrown away)
        given = _listing(work)
        child = subprocess.Popen(
            [binary, *(a.replace(WORK, str(work)) for a in args)],
            cwd=work,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            start_new_session=True,  # as proc.run's: stopped as a group, deaf to the terminal's Ctrl-C
        )
    except OSError:
        _remove(work)
        return
    _state["early"] = Early(child, work, binary, args, _env_digest(env), given)
    atexit.register(drop)


def drop() -> None:
    """No early resolve for this process: stop one that is running and record nothing."""
    with _guard:
        early = _state.pop("early", None)
        _state.pop("argv", None)
        _state.pop("plain", None)
    if isinstance(early, Early):
        early.stop()


def keep_if(wanted: bool) -> None:
    """`drop` unless `wanted`: the CLI knows, once it has parsed them, what the arguments name."""
    if not wanted:
        drop()


def claim(binary: str, args: Sequence[str], work: Path, env: Mapping[str, str]) -> Early | None:
    """The early call, if it is exactly `binary args` run in `work` (as its files are now) with
    `env`; it is then the caller's to wait for. A different call is stopped. At most once a process."""
    with _guard:
        early = _state.pop("early", None)
    if not isinstance(early, Early):
        return None
    same = (
        early.binary == binary
        and early.args == [a.replace(str(work), WORK) for a in args]
        and early.env_digest == _env_digest(env)
        and early.files == _listing(work)
    )
    if same:
        return early
    early.stop()
    return None


def remember(
    args: Sequence[str],
    work: Path,
    seeds: Mapping[str, Path],
    relock: Callable[[], Sequence[str]] | None = None,
    output: Path | None = None,
) -> None:
    """Record the first uv call of a re-lock, for its next run to start early. `seeds`: files of
    `work` copied from a lockfile, re-read from it then (it may have changed). After a plain `lock`
    (a first lock, or one after an edit), `relock()` gives the call its `--upgrade` would make in
    `work` less `output`: the first re-lock after it then starts early too, where it had nothing
    to start from. Best effort: a record that cannot be written only means no early start next time."""
    with _guard:
        argv = _state.pop("argv", None)
        plain = _state.pop("plain", None)
    if isinstance(argv, list):
        _record(argv, args, work, seeds)
    elif isinstance(plain, list) and relock is not None:
        _record(plain, relock(), work, {}, leave=output.name if output else "")


def record_next(
    argv: Sequence[str], args: Sequence[str], work: Path, seeds: Mapping[str, Path], lockfile: Path
) -> None:
    """Record `args` (in `work`) as the call the lock `argv` will make here, worked out before the
    user types it (`new`, `validate`): a plain `lock NAME` of a new or changed profile, or the
    `lock NAME --upgrade` of a fresh lockfile in a folder that has no record for it yet (a fresh
    clone). That lock starts it early, and its own record then replaces this one. A plain lock's
    record holds while `lockfile` (the one whose rename makes a lock current) is as it is now: a
    lock that kept no record (`lock --all`) leaves a profile a plain lock would not resolve."""
    form = _form(argv)
    if form:
        _record(list(argv), args, work, seeds, first=form == "plain", watch=lockfile)


def _record(
    argv: list[str],
    args: Sequence[str],
    work: Path,
    seeds: Mapping[str, Path],
    *,
    leave: str = "",
    first: bool = False,
    watch: Path | None = None,
) -> None:
    files = {
        p.name: p.read_text("utf-8")
        for p in sorted(work.iterdir())
        if p.is_file() and p.name not in seeds and p.name != leave
    }
    record: dict[str, object] = {
        "args": [a.replace(str(work), WORK) for a in args],
        "files": files,
        "seeds": {name: str(path.resolve()) for name, path in seeds.items()},
    }
    if first:
        record["first"] = True
        if watch is not None:
            record["watch"] = {"path": str(watch.resolve()), "stamp": _stamp(watch)}
    text = json.dumps(record, indent=1, sort_keys=True)
    import re

    if re.search(_CREDENTIALS, text):
        return
    with contextlib.suppress(OSError, RuntimeError):  # RuntimeError: no home folder to keep it in
        path = _record_path(argv)
        path.parent.mkdir(parents=True, exist_ok=True)
        import tempfile
        import time

        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".record-")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(text)
            os.replace(tmp, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        records = sorted(path.parent.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
        for old in records[KEEP_RECORDS:]:
            old.unlink(missing_ok=True)
        # what a run killed mid-write left: a record is written in a blink, so a minute-old one is dead
        for left in path.parent.glob(".record-*"):
            if left.stat().st_mtime < time.time() - 60:
                left.unlink(missing_ok=True)
