"""The host's wheel cache: by sha256, filled from wheelhouses and the lockfile's own URLs, pruned by
what the project's lockfiles still pin, and read by build and venv."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from envbuild import lockfile, wheelcache
from envbuild.errors import WriteFailed
from envbuild.fsutil import Staged
from envbuild.names import FIXED_MTIME
from tests.conftest import Result

REPO = Path(__file__).resolve().parents[2]
WHEELS = Path(os.environ.get("PIP_FIND_LINKS", "/opt/wheels"))


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(wheelcache.CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def _committed() -> tuple[dict[str, lockfile.Pin], str]:
    folder = REPO / "lockfiles" / "cpu-py311"
    return lockfile.parse_requirements((folder / "requirements.lock").read_text()), (folder / "pylock.toml").read_text()


def test_the_lock_says_which_wheel_of_each_package_with_its_url_and_hash() -> None:
    pins, pylock = _committed()
    items = {i.name: i for i in wheelcache.wanted(pylock, pins)}
    assert set(items) == set(pins) - {"setuptools"} or set(items) == set(pins)
    torch = items["torch"]
    assert torch.filename == "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
    assert f"sha256:{torch.sha256}" in pins["torch"].hashes
    numpy = items["numpy"]
    assert numpy.url.startswith("https://files.pythonhosted.org/") and numpy.size > 10e6


def test_a_file_is_stored_only_under_its_own_hash(cache: Path, tmp_path: Path) -> None:
    wheel = tmp_path / "demo-1.0-py3-none-any.whl"
    wheel.write_bytes(b"not really a wheel, but bytes with a hash")
    sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    assert wheelcache.add(wheel, "0" * 64) is None  # another hash: refused, nothing left behind
    assert not any(p.is_file() for p in cache.rglob("*"))
    stored = wheelcache.add(wheel, sha)
    assert stored is not None and wheelcache.find(sha) == stored
    assert stored.read_bytes() == wheel.read_bytes() and stored.stat().st_mtime == 315532800
    usage = wheelcache.usage()
    assert (usage.wheels, usage.bytes) == (1, wheel.stat().st_size)


def test_a_full_disk_under_the_cache_is_named_with_its_fix(
    cache: Path, tmp_path: Path, cli: Callable[..., Result], engineless_project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It was "internal error: OSError: [Errno 28] No space left on device ... a bug in envbuild"
    (the write has no file name). The kernel's own ENOSPC here: the part file is /dev/full."""
    wheel = tmp_path / "demo-1.0-py3-none-any.whl"
    wheel.write_bytes(b"x" * 4096)
    sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    real_open = Staged.open

    def full(path: Path) -> Staged:
        staged = real_open(path)
        device = os.open("/dev/full", os.O_WRONLY)
        os.dup2(device, staged.fd)  # the copy's own descriptor now writes to a disk with no room
        os.close(device)
        return staged

    monkeypatch.setattr(Staged, "open", staticmethod(full))
    with pytest.raises(WriteFailed) as caught:
        wheelcache.add(wheel, sha)
    assert "the wheel cache is full: cannot write" in caught.value.message and "No space left" in caught.value.message
    assert "envbuild cache --prune" in caught.value.hint and wheelcache.CACHE_ENV in caught.value.hint
    assert not any(p.is_file() for p in cache.rglob("*"))  # no part file left under the hash
    # through the CLI: exit 11 with the message, not exit 70
    house = tmp_path / "house"
    house.mkdir()
    pins, pylock = _committed()
    item = next(i for i in wheelcache.wanted(pylock, pins) if i.name == "einops")
    (house / item.filename).write_bytes(b"y")
    res = cli("build", "cpu-py311", "--context-only", "--find-links", str(house))
    assert res.code == 11, res.err
    assert "the wheel cache is full" in res.err and "internal error" not in res.err


@pytest.mark.parametrize("code", [errno.EROFS, errno.EACCES])
def test_a_cache_this_user_cannot_write_is_named_with_the_setting_that_moves_it(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    """A read-only home (a CI container's) or a cache on a read-only volume: the hint sent users to
    a writable copy of the project, which is not where the cache lies."""
    wheel = tmp_path / "demo-1.0-py3-none-any.whl"
    wheel.write_bytes(b"x")

    def refused(path: Path) -> Staged:
        raise OSError(code, os.strerror(code), str(path))

    monkeypatch.setattr(Staged, "open", staticmethod(refused))
    with pytest.raises(WriteFailed) as caught:
        wheelcache.add(wheel, hashlib.sha256(b"x").hexdigest())
    assert caught.value.message.startswith(f"the wheel cache cannot be written: {cache}/")
    assert caught.value.hint.startswith(
        f"set {wheelcache.CACHE_ENV} to a folder this user can write (the cache is {cache}"
    )


@pytest.mark.skipif(not any(WHEELS.glob("torch-2.13.0+cpu-*.whl")), reason="needs the CPU torch wheel")
def test_fill_takes_a_wheelhouse_wheel_by_hash_and_a_cut_short_one_is_fetched_again(cache: Path) -> None:
    pins, pylock = _committed()
    torch = next(i for i in wheelcache.wanted(pylock, pins) if i.name == "torch")
    found = wheelcache.fill([torch], [WHEELS], fetch=False)
    assert found[torch.sha256].name == torch.filename
    assert found[torch.sha256].stat().st_ino != next(WHEELS.glob(torch.filename)).stat().st_ino  # a copy
    # a damaged cache entry (its size says so) is dropped, then taken from the wheelhouse again
    found[torch.sha256].write_bytes(b"cut short")
    again = wheelcache.fill([torch], [WHEELS], fetch=False)
    assert again[torch.sha256].stat().st_size == next(WHEELS.glob(torch.filename)).stat().st_size
    # without a wheelhouse and without fetching, nothing is made up
    assert wheelcache.fill([torch], [], fetch=False) == {torch.sha256: again[torch.sha256]}


def test_fill_downloads_a_small_wheel_from_the_lockfiles_own_url(cache: Path) -> None:
    """einops from PyPI, for real: fetched once, checked against the locked hash, then a cache hit."""
    pins, pylock = _committed()
    einops = next(i for i in wheelcache.wanted(pylock, pins) if i.name == "einops")
    said: list[str] = []
    found = wheelcache.fill([einops], ca_bundle=Path("/etc/ssl/certs/ca-certificates.crt"), say=said.append)
    if einops.sha256 not in found:
        pytest.skip("PyPI's file host is not reachable from here")
    assert hashlib.sha256(found[einops.sha256].read_bytes()).hexdigest() == einops.sha256
    assert said and "fetching 1 wheel(s)" in said[0]
    said.clear()
    assert wheelcache.fill([einops], say=said.append) == found and said == []  # a hit: nothing fetched


def test_cache_reports_its_size_and_prunes_what_no_lockfile_pins(
    cli: Callable[..., Result], engineless_project: Path, cache: Path, tmp_path: Path
) -> None:
    pins, _ = _committed()
    kept_sha = pins["einops"].hashes[0].split(":", 1)[1]
    for sha in (kept_sha, "f" * 64):
        slot = cache / sha[:2] / sha
        slot.mkdir(parents=True)
        (slot / f"x-{sha[:4]}-py3-none-any.whl").write_bytes(b"x" * 1000)
    report = json.loads(cli("cache", "--json").out)
    assert (report["wheels"], report["bytes"], report["root"]) == (2, 2000, str(cache))
    pruned = json.loads(cli("cache", "--prune", "--json").out)
    assert (pruned["removed_wheels"], pruned["freed_bytes"], pruned["wheels"]) == (1, 1000, 1)
    assert (cache / kept_sha[:2] / kept_sha).is_dir()  # the committed lockfile still pins it
    assert cli("cache", "--all").code == 2  # --all only with --prune
    emptied = json.loads(cli("cache", "--prune", "--all", "--json").out)
    assert emptied["wheels"] == 0 and emptied["removed_wheels"] == 1


def test_a_prune_keeps_what_a_lockfile_edited_in_latin_1_pins(engineless_project: Path) -> None:
    """A comment saved in Latin-1 makes the lockfile stale, not its pins void: the prune took them
    as pinned by nothing and deleted the wheels the re-lock then keeps (a CUDA lock's 2.5 GB)."""
    lockf = engineless_project / "lockfiles" / "cpu-py311" / "requirements.lock"
    lockf.write_bytes(lockf.read_bytes() + "# vérifié à la main\n".encode("latin-1"))
    pins, _ = _committed()
    own = {h.split(":", 1)[1] for h in pins["torch"].hashes}  # cpu-py311's torch: no other lockfile pins it
    assert own <= wheelcache.needed(engineless_project / "lockfiles")


def test_a_prune_keeps_what_another_project_that_used_the_cache_pins(
    cli: Callable[..., Result], engineless_project: Path, cache: Path, tmp_path: Path
) -> None:
    """The cache is the host's: a prune in one project deleted every wheel of the others (a CUDA
    lock's 2.5 GB fetched again, or gone where it came from a wheelhouse that is gone too)."""
    pins, _ = _committed()
    own = pins["einops"].hashes[0].split(":", 1)[1]
    theirs, nobodys = "e" * 64, "f" * 64
    other = tmp_path / "other" / "lockfiles"
    (other / "p").mkdir(parents=True)
    (other / "p" / "requirements.lock").write_text(f"x==1.0 \\\n    --hash=sha256:{theirs}\n")
    # build and venv note the project that asks: here as they call it, and a context build
    wheelcache.for_lock("", {}, fetch=False, user=(other, other.parent))
    res = cli("build", "cpu-py311", "--context-only")
    assert res.code == 0, res.err
    # each note names the project's root too (`images --prune` opens that checkout from it)
    assert wheelcache.other_users(other) == [
        wheelcache.User(engineless_project.resolve() / "lockfiles", engineless_project.resolve())
    ]
    for sha in (own, theirs, nobodys):
        (cache / sha[:2] / sha).mkdir(parents=True, exist_ok=True)
        (cache / sha[:2] / sha / f"x-{sha[:4]}-py3-none-any.whl").write_bytes(b"x" * 1000)
    pruned = json.loads(cli("cache", "--prune", "--json").out)
    assert (pruned["removed_wheels"], pruned["kept_for"]) == (1, [str(other.resolve())])
    assert (cache / own[:2] / own).is_dir() and (cache / theirs[:2] / theirs).is_dir()
    assert not (cache / nobodys[:2] / nobodys).exists()
    # from the other project, this one's wheels stay too: the context build noted it
    res = cli("cache", "--prune", "--project", str(other.parent))
    assert res.code == 0 and "kept what the lockfiles of 1 other project(s) pin" in res.out
    assert (cache / own[:2] / own).is_dir()
    # a project that is gone keeps nothing, and its note goes with its wheels
    shutil.rmtree(other.parent)
    pruned = json.loads(cli("cache", "--prune", "--json").out)
    assert (pruned["removed_wheels"], pruned["kept_for"]) == (1, [])
    assert not (cache / theirs[:2] / theirs).exists()
    assert len(list((cache / "projects").iterdir())) == 1  # this project's note only


def test_a_note_from_before_roots_were_noted_gains_its_root_at_the_next_build(cache: Path, tmp_path: Path) -> None:
    lockfiles = tmp_path / "proj" / "ci" / "locks"
    lockfiles.mkdir(parents=True)
    wheelcache.register(lockfiles)  # as envbuild wrote them before: the folder alone
    assert wheelcache.other_users(tmp_path) == [wheelcache.User(lockfiles, None)]
    wheelcache.for_lock("", {}, fetch=False, user=(lockfiles, tmp_path / "proj"))
    assert wheelcache.other_users(tmp_path) == [wheelcache.User(lockfiles, tmp_path / "proj")]
    assert len(list((cache / "projects").iterdir())) == 1  # the same note, rewritten


def test_a_copy_killed_halfway_leaves_nothing_in_the_cache(cache: Path, tmp_path: Path) -> None:
    """SIGKILL, which no handler sees, mid-copy: the copy had no name yet, so nothing is left (it
    was a `.part-*` file, up to 2.5 GB for a CUDA wheel, until `cache --prune` an hour later). The
    source is a pipe, so the kill lands while the copy is open and part-written, every time."""
    source = tmp_path / "demo-1.0-py3-none-any.whl"
    os.mkfifo(source)
    sha = "ab" * 32
    code = f"from pathlib import Path; from envbuild import wheelcache; wheelcache.add(Path({str(source)!r}), {sha!r})"
    child = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, wheelcache.CACHE_ENV: str(cache)})
    slot = cache / sha[:2] / sha
    try:
        with source.open("wb") as pipe:
            pipe.write(b"w" * (3 << 20))  # blocks until the child has read (and so written) most of it
            deadline = time.monotonic() + 30
            while not any(str(slot) in _target(fd) for fd in Path(f"/proc/{child.pid}/fd").iterdir()):
                assert time.monotonic() < deadline, "the child never opened its copy"
                time.sleep(0.01)
            child.kill()
            child.wait(10)
    except BrokenPipeError:
        pass  # the child is gone: the pipe has no reader
    finally:
        child.kill()
        child.wait(10)
    assert child.returncode == -signal.SIGKILL
    assert slot.is_dir() and list(slot.iterdir()) == []
    assert wheelcache.usage().bytes == 0


def _target(fd: Path) -> str:
    try:
        return os.readlink(fd)
    except OSError:  # closed since it was listed
        return ""


def test_what_a_killed_copy_left_counts_in_the_size_and_prune_removes_it_once_stale(
    cli: Callable[..., Result], engineless_project: Path, cache: Path
) -> None:
    """A SIGKILL during a copy into the cache leaves a part file in a slot the lockfiles still pin:
    it was invisible to `cache` and never pruned (a CUDA wheel's is 2.5 GB). A part file another run
    is writing right now stays."""
    pins, _ = _committed()
    sha = pins["einops"].hashes[0].split(":", 1)[1]
    slot = cache / sha[:2] / sha
    slot.mkdir(parents=True)
    (slot / "einops-0.8.1-py3-none-any.whl").write_bytes(b"w" * 1000)
    killed, copying = slot / ".part-killed", slot / ".part-copying"
    # what a copy killed where the filesystem has no O_TMPFILE leaves (fsutil's fallback name)
    fallback = slot / ".einops-0.8.1-py3-none-any.whl.4242.0a1b2c3d.tmp"
    killed.write_bytes(b"k" * 300)
    fallback.write_bytes(b"f" * 200)
    copying.write_bytes(b"c" * 20)
    old = time.time() - wheelcache.PART_STALE_S - 60
    os.utime(killed, (old, old))
    os.utime(fallback, (old, old))
    report = json.loads(cli("cache", "--json").out)
    assert (report["wheels"], report["bytes"]) == (1, 1520)
    pruned = json.loads(cli("cache", "--prune", "--json").out)
    assert (pruned["removed_wheels"], pruned["freed_bytes"], pruned["wheels"], pruned["bytes"]) == (0, 500, 1, 1020)
    assert not killed.exists() and not fallback.exists() and copying.exists() and wheelcache.find(sha) is not None


def test_an_entry_without_a_locked_size_is_hashed_again_only_when_written_since(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wheelhouse's lock records no size: an untouched entry is taken as `add` checked it (torch's
    wheel was hashed again on every build), and one written to since is hashed and, changed, dropped."""
    house = tmp_path / "house"
    house.mkdir()
    body = b"a wheel's bytes"
    (house / "demo-1.0-py3-none-any.whl").write_bytes(body)
    item = wheelcache.Wanted("demo", "demo-1.0-py3-none-any.whl", "file:///house", hashlib.sha256(body).hexdigest(), 0)
    stored = wheelcache.fill([item], [house], fetch=False)[item.sha256]
    hashed: list[Path] = []
    from envbuild.fsutil import sha256_file as real

    def counting(path: Path) -> str:
        hashed.append(path)
        return real(path)

    monkeypatch.setattr(wheelcache, "sha256_file", counting)
    assert wheelcache.fill([item], [], fetch=False) == {item.sha256: stored}
    assert hashed == []  # untouched since it was checked: not read again
    stored.write_bytes(b"a wheel's byteZ")  # same size, other bytes: only the hash tells
    assert wheelcache.fill([item], [], fetch=False) == {}  # dropped, and no wheelhouse to take it from
    assert hashed == [stored]
    assert wheelcache.fill([item], [house], fetch=False)[item.sha256].read_bytes() == body


def test_a_damaged_entry_of_the_locked_size_is_hashed_dropped_and_taken_again(cache: Path, tmp_path: Path) -> None:
    """PyPI's locks record each file's size, and only the size was checked: a byte changed in place
    kept the entry, and every build of the profile then failed in the image's install ("Failed to
    extract archive" from uv), with nothing saying the cache was why. A touched but intact entry is
    stamped again (uv records a wheel's mtime in what it installs: shared layers would differ)."""
    house = tmp_path / "house"
    house.mkdir()
    body = b"a wheel's bytes"
    (house / "demo-1.0-py3-none-any.whl").write_bytes(body)
    sha = hashlib.sha256(body).hexdigest()
    item = wheelcache.Wanted("demo", "demo-1.0-py3-none-any.whl", "https://files.example/demo", sha, len(body))
    stored = wheelcache.fill([item], [house], fetch=False)[item.sha256]
    stored.write_bytes(b"a wheel's byteZ")  # the locked size, other bytes
    assert wheelcache.fill([item], [], fetch=False) == {}  # dropped: no wheelhouse, no fetch
    assert not stored.parent.exists()
    again = wheelcache.fill([item], [house], fetch=False)[item.sha256]
    assert again.read_bytes() == body
    os.utime(again, (time.time(), time.time()))  # touched, not changed
    assert wheelcache.fill([item], [], fetch=False) == {item.sha256: again}
    assert again.stat().st_mtime == FIXED_MTIME


def test_cache_says_what_runs_download_cache_holds(
    cli: Callable[..., Result], engineless_project: Path, cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`run` keeps what jobs download and compile (a model's GBs) in a folder of its own, and
    nothing said where that disk went."""
    run_cache = tmp_path / "run-cache"
    monkeypatch.setenv("ENVBUILD_RUN_CACHE", str(run_cache))
    assert "run's download cache" not in cli("cache").out  # nothing run yet: nothing to say
    (run_cache / "huggingface" / "hub").mkdir(parents=True)
    (run_cache / "huggingface" / "hub" / "model.safetensors").write_bytes(b"w" * 3_000_000)
    (run_cache / "torchinductor").mkdir()
    (run_cache / "torchinductor" / "kernel.so").write_bytes(b"k" * 1_000_000)
    res = cli("cache")
    assert f"run's download cache {run_cache}: 4 MB" in res.out and "not pruned here" in res.out
    report = json.loads(cli("cache", "--json").out)
    assert report["run_cache"] == {"root": str(run_cache), "bytes": 4_000_000}
    pruned = json.loads(cli("cache", "--prune", "--all", "--json").out)
    assert pruned["run_cache"]["bytes"] == 4_000_000  # a job's model is not a wheel: the prune leaves it
