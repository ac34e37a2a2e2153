"""The engine connection: a failure says why in words and what to do."""

from __future__ import annotations

import json
import os
import pathlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from envbuild import engine, enginelost
from envbuild.errors import EngineNoAnswer
from tests.conftest import Result


@pytest.mark.parametrize(
    ("host", "cause", "fix"),
    [
        (
            "unix:///nonexistent/docker.sock",
            "no socket there: the engine is not running",
            "sudo systemctl start docker",
        ),
        ("tcp://127.0.0.1:1", "nothing listens there", "check the port in DOCKER_HOST"),
    ],
)
def test_an_unreachable_engine_says_why_in_words(
    cli: Callable[..., Result], monkeypatch: pytest.MonkeyPatch, host: str, cause: str, fix: str
) -> None:
    """A real failed connection (nothing listens at these addresses), not the SDK's nested exception text."""
    monkeypatch.setenv("DOCKER_HOST", host)
    res = cli("images")
    assert res.code == 5
    assert f"cannot reach the Docker engine at {host} (from DOCKER_HOST): {cause}" in res.err
    assert fix in res.err
    assert "HTTPConnectionPool" not in res.err and "Connection aborted" not in res.err


_FOREIGN = {
    # a web server's error page, another protocol's banner, a JSON body that does not parse
    "html": b"HTTP/1.1 404 Not Found\r\nContent-Type: text/html\r\nContent-Length: 44\r\n\r\n"
    b"<!DOCTYPE HTML><html><body>nginx</body></html>",
    "banner": b"\x00\x17\xffSSH-2.0-OpenSSH_9.2\r\nnot http\r\n",
    "json": b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 9\r\n\r\n{broken: ",
}


@pytest.mark.parametrize(
    ("kind", "what"),
    [("html", "an HTML page"), ("banner", "bytes that are not HTTP"), ("json", "a body that is not JSON")],
)
def test_a_service_that_is_not_docker_is_named_so_not_quoted_raw(
    cli: Callable[..., Result], monkeypatch: pytest.MonkeyPatch, kind: str, what: str
) -> None:
    """A real server on a real port answers every request with something that is not the Docker API."""
    import socket
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    stop = threading.Event()

    def answer() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                conn.recv(65536)
                conn.sendall(_FOREIGN[kind])

    worker = threading.Thread(target=answer, daemon=True)
    worker.start()
    try:
        monkeypatch.setenv("DOCKER_HOST", f"tcp://127.0.0.1:{server.getsockname()[1]}")
        res = cli("images")
        js = cli("build", "cpu-py311", "--json")
    finally:
        stop.set()
        worker.join()
        server.close()
    assert res.code == 5
    assert f"something answers there, but not the Docker API ({what})" in res.err
    assert "DOCKER_HOST points at another service" in res.err
    for raw in ("<!DOCTYPE", "BadStatusLine", "Expecting property", "\x00", "Client Error"):
        assert raw not in res.err
    assert js.code == 5
    error = json.loads(js.out)["error"]
    assert error["exit_code"] == 5 and error["type"] == "EngineUnavailable"
    assert f"not the Docker API ({what})" in error["message"]


def test_a_socket_the_user_may_not_open_points_at_the_docker_group() -> None:
    # docker-py's text when /var/run/docker.sock is root:docker 0660 and the user is not in the group.
    sdk = "Error while fetching server API version: ('Connection aborted.', PermissionError(13, 'Permission denied'))"
    cause, fix = enginelost.unreachable_cause("the default socket", sdk)
    assert cause == "this user may not open the socket"
    assert "usermod -aG docker" in fix


def test_an_ssh_engine_without_paramiko_says_what_to_install(
    cli: Any, engineless_project: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DOCKER_HOST=ssh://..., the form envbuild's own fixes suggest, failed every command with
    docker-py's "Install paramiko package to enable ssh:// support" and the fix for a stopped engine."""
    import importlib.util

    if importlib.util.find_spec("paramiko") is not None:
        pytest.skip("paramiko is installed here: ssh:// would be tried for real")
    monkeypatch.setenv("DOCKER_HOST", "ssh://me@gpu-box.invalid")
    res = cli("images", "--json")
    assert res.code == 5
    error = json.loads(res.out)["error"]
    assert "docker-py reaches ssh:// engines only with paramiko installed" in error["message"]
    assert error["hint"].startswith("pip install 'envbuild[ssh]'")


def test_a_socket_that_takes_the_connection_and_stays_silent_is_a_stuck_engine(
    cli: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path
) -> None:
    """The fix said "check that the host is up and the port is open" for a unix socket."""
    import socket

    monkeypatch.setenv(enginelost.PING_TIMEOUT_ENV, "0.5")
    path = tmp_path / "engine.sock"
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(path))
        server.listen(4)  # accepted by the kernel, never answered
        monkeypatch.setenv("DOCKER_HOST", f"unix://{path}")
        res = cli("images")
    assert res.code == 5, res.err
    assert "something holds the socket but does not answer" in res.err
    assert "journalctl -u docker" in res.err and "port" not in res.err


def test_disk_room_is_read_only_for_an_engine_on_this_machine(
    monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path
) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///var/run/docker.sock")
    root, free = engine.disk({"DockerRootDir": str(tmp_path)})
    st = os.statvfs(tmp_path)
    assert root == str(tmp_path)
    assert free is not None and abs(free - st.f_frsize * st.f_bavail) < 64 * 2**20  # other writers may move it a bit
    # Another machine's engine: the path names its disk, not ours.
    monkeypatch.setenv("DOCKER_HOST", "tcp://build-box:2376")
    assert engine.disk({"DockerRootDir": str(tmp_path)}) == (str(tmp_path), None)
    monkeypatch.setenv("DOCKER_HOST", "unix:///var/run/docker.sock")
    assert engine.disk({"DockerRootDir": str(tmp_path / "gone")}) == (str(tmp_path / "gone"), None)


def test_the_disk_warning_scales_with_what_the_profile_builds() -> None:
    five_gb = 5 * 10**9
    assert engine.disk_note("/var/lib/docker", five_gb, "cpu") is None
    cuda = engine.disk_note("/var/lib/docker", five_gb, "cuda")
    assert cuda is not None
    assert cuda.startswith("the engine's disk has 5.0 GB free (/var/lib/docker): a CUDA build needs about 15 GB")
    assert "envbuild images --prune" in cuda
    rocm = engine.disk_note("/var/lib/docker", 20 * 10**9, "rocm")
    assert rocm is not None and "a ROCm build needs about 40 GB" in rocm
    cpu = engine.disk_note("/var/lib/docker", 10**9, "cpu")
    assert cpu is not None and "a CPU build needs about 4 GB" in cpu
    assert engine.disk_note(None, None, "cuda") is None  # nothing known, nothing said


def _replay(verb: str) -> list[str]:
    streams = json.loads((pathlib.Path(__file__).parent / "data" / "transfer_streams.json").read_text())
    progress = engine.Transfer()
    return [s for s in (progress.feed(chunk) for chunk in streams[verb]) if s]


def test_a_push_is_summed_over_its_layers() -> None:
    """A recorded push (two layers at once): how much of the whole moved, not one layer's bar after another's."""
    lines = _replay("push")
    assert lines[-1] == "2 of 2 layers done, 38 MB of 38 MB moved"
    assert "1 of 2 layers done, 18 MB of 38 MB moved" in lines  # the small layer finished first
    sizes = [int(line.split(", ")[1].split(" MB")[0]) for line in lines if " MB" in line]
    assert sizes == sorted(sizes)  # never goes backwards
    # before the second layer reports its size, no total is claimed that would grow later
    assert lines[2] == "0 of 2 layers done, 0 MB moved"


def test_a_pull_says_which_layer_it_is_unpacking_and_how_far() -> None:
    lines = _replay("pull")
    assert "0 of 2 layers done, 38 MB of 38 MB moved, extracting 8f80f89f93e0 (17 MB of 30 MB)" in lines
    assert lines[-1] == "2 of 2 layers done, 38 MB of 38 MB moved"
    # the stream's own chatter (Pulling from, Digest:, Status:) is not a layer
    assert not any("Digest" in line or "Status" in line for line in lines)


def test_retries_and_transfers_reach_the_terminal(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """push and pull used to print nothing for a minute: their events were of kinds the printer dropped."""
    import time

    from envbuild.cli._common import step_printer

    now = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    events = step_printer()
    events("retry", "push 127.0.0.1:5000/x:cpu", "attempt 1 failed (EOF); retrying in 1.0s")
    events("transfer", "push", "0 of 2 layers done")  # within 2 s of the start: held back
    err = capsys.readouterr().err
    assert "push 127.0.0.1:5000/x:cpu: attempt 1 failed (EOF); retrying in 1.0s" in err
    assert "layers done" not in err
    now[0] += 2.5
    events("transfer", "push", "1 of 2 layers done, 18 MB of 38 MB moved")
    events("transfer", "push", "1 of 2 layers done, 19 MB of 38 MB moved")  # a line every 2 s, not every chunk
    assert capsys.readouterr().err.strip() == "[   2.5s] push: 1 of 2 layers done, 18 MB of 38 MB moved"
    events("remove", "5989ed286d26", "envbuild:cpu-py311-77178d7d433e")  # images --prune, one line per image
    assert capsys.readouterr().err.strip() == "[   2.5s] removing 5989ed286d26 (envbuild:cpu-py311-77178d7d433e)"


def test_push_progress_never_counts_a_retried_layer_as_sent_nor_passes_100_percent() -> None:
    """Seen: "1,113 MB of 1,113 MB moved" for 50 s while the engine retried, and "1,124 MB of 1,113 MB"."""
    from envbuild.engine import Transfer

    t = Transfer()
    mb = 1024 * 1024
    over = t.feed({"id": "a", "status": "Pushing", "progressDetail": {"current": 600 * mb, "total": 500 * mb}})
    assert over == "0 of 1 layers done, 524 MB of 524 MB moved"  # capped: never past the total
    assert t.feed({"id": "a", "status": "Retrying in 5 seconds"}) == "0 of 1 layers done, 0 MB of 524 MB moved"
    assert t.feed({"id": "a", "status": "Pushed"}) == "1 of 1 layers done, 524 MB of 524 MB moved"


def test_a_stream_that_repeats_itself_without_moving_is_stalled(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine keeps talking ("Retrying in 5 seconds") but no byte moves: that is a stall too."""
    import time

    import docker

    def stream() -> Iterator[dict[str, Any]]:
        yield {"status": "Pushing", "id": "aaa", "progressDetail": {"current": 10, "total": 100}}
        while True:
            time.sleep(0.05)
            yield {"status": "Retrying in 5 seconds", "id": "aaa"}

    seen: list[str] = []
    with pytest.raises(docker.errors.APIError) as err:
        engine.follow("push", stream(), lambda *a: seen.append(a[-1]), stall=0.3)
    assert str(err.value.args[0]).startswith("stalled: the push moved nothing for 0.3 s")
    assert seen  # progress was relayed up to the stall


def test_a_silent_stream_is_stalled_not_a_traceback() -> None:
    import docker
    import urllib3

    def stream() -> Iterator[dict[str, Any]]:
        yield {"status": "Pushing", "id": "aaa", "progressDetail": {"current": 10, "total": 100}}
        raise urllib3.exceptions.ReadTimeoutError(None, "", "Read timed out.")  # type: ignore[arg-type]

    with pytest.raises(docker.errors.APIError, match=r"^stalled: the pull moved nothing for 7 s \(at "):
        engine.follow("pull", stream(), stall=7)
    # without a stall limit it is the engine that went quiet, named so (not urllib3's bare error)
    with pytest.raises(EngineNoAnswer, match="stopped answering: the pull got no reply"):
        engine.follow("pull", stream())


def test_a_moving_stream_is_never_stalled() -> None:
    import time

    def stream() -> Iterator[dict[str, Any]]:
        for i in range(1, 8):
            time.sleep(0.06)
            yield {"status": "Pushing", "id": "aaa", "progressDetail": {"current": i * 10, "total": 100}}
        yield {"status": "Pushed", "id": "aaa"}
        yield {"aux": {"Digest": "sha256:" + "a" * 64}}

    assert engine.follow("push", stream(), stall=0.2) == "sha256:" + "a" * 64


@pytest.mark.parametrize(("raw", "expected"), [("", 120.0), ("5", 5.0), ("nope", 120.0), ("-3", 120.0)])
def test_the_stall_limit_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch, raw: str, expected: float) -> None:
    monkeypatch.setenv(enginelost.STALL_ENV, raw)
    assert enginelost.stall_timeout() == expected


@pytest.mark.parametrize(("raw", "expected"), [("", 600.0), ("3600", 3600.0), ("nope", 600.0), ("0", 600.0)])
def test_a_build_steps_quiet_limit_comes_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, raw: str, expected: float
) -> None:
    """A step that runs quietly past it (a long sdist build) read as a hung engine, with no way out."""
    monkeypatch.setenv(enginelost.STEP_TIMEOUT_ENV, raw)
    assert enginelost.step_timeout() == expected
