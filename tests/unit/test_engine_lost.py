"""An engine that answers the first ping, then hangs or drops a later call (a wedged dockerd, a
daemon restarted mid-command): a named engine error with exit 5, never "internal error: ReadTimeout
... this is a bug in envbuild" after the client's whole timeout."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from envbuild import engine, enginelost
from envbuild.errors import EngineNoAnswer
from tests.conftest import Result


class _Half(BaseHTTPRequestHandler):
    """The Docker API's version and ping, then nothing: a hang, or a dropped connection."""

    mode = "hang"
    release = threading.Event()

    def do_GET(self) -> None:
        if self.path.endswith(("/_ping", "/version")):
            body = b"OK" if self.path.endswith("/_ping") else json.dumps({"ApiVersion": "1.41"}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json" if body != b"OK" else "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        elif self.mode == "hang":
            self.release.wait(30)
        else:
            self.close_connection = True  # no status line at all: the daemon went away mid-call

    do_POST = do_GET

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(params=["hang", "drop"])
def half_engine(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    handler: Any = type("Handler", (_Half,), {"mode": request.param, "release": threading.Event()})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    worker = threading.Thread(target=server.serve_forever, daemon=True)
    worker.start()
    monkeypatch.setenv("DOCKER_HOST", f"tcp://127.0.0.1:{server.server_address[1]}")
    monkeypatch.setenv("ENVBUILD_ENGINE_TIMEOUT", "1")
    yield str(request.param)
    handler.release.set()
    server.shutdown()
    server.server_close()


def test_a_call_after_the_ping_names_the_call_and_the_engine(half_engine: str) -> None:
    cli = engine.client(timeout=1)
    with pytest.raises(EngineNoAnswer) as caught:
        cli.api.containers(all=True)
    err = caught.value
    assert err.timed_out is (half_engine == "hang")
    expected = "GET /containers/json got no reply in 1 s" if half_engine == "hang" else "dropped the connection during"
    assert expected in err.message and engine.engine_url()[0] in err.message
    assert "docker info" in err.hint


def test_images_and_status_say_so_within_the_engine_timeout(
    cli: Callable[..., Result], engineless_project: Path, half_engine: str
) -> None:
    """`images` was an internal error (exit 70) after 60 s; `status` the same, instead of "unknown"."""
    t0 = time.monotonic()
    images = cli("images")
    status = cli("status", "cpu-py311", "--json")
    took = time.monotonic() - t0
    assert images.code == 5, images.err
    assert "the Docker engine at tcp://127.0.0.1:" in images.err and "internal error" not in images.err
    assert status.code == 0, status.err
    report = json.loads(status.out)
    assert (report["profiles"][0]["image"], report["profiles"][0]["next"]) == ("unknown", "envbuild doctor")
    assert "GET /containers/json" in report["note"]
    assert took < 20  # two commands, each about ENVBUILD_ENGINE_TIMEOUT (1 s), not the client's 60


def test_an_engine_error_answer_stays_what_it_is() -> None:
    """A 404 or 500 is an answer (docker-py's APIError is a requests HTTPError), not a lost engine."""
    import docker

    assert enginelost.lost(docker.errors.APIError("404 Client Error: no such image"), "unix://x", "GET /x") is None
    assert enginelost.lost(ValueError("not a transport failure"), "unix://x", "GET /x") is None


def test_a_build_whose_stream_goes_quiet_names_the_step_and_the_log(tmp_path: Path) -> None:
    """The build stream is read outside requests' send: a stalled read is urllib3's own exception."""
    from urllib3.exceptions import ReadTimeoutError

    from envbuild import build
    from envbuild.buildctx import BuildOptions
    from envbuild.buildfail import BuildLog
    from envbuild.names import quiet
    from tests.conftest import VALID

    def stream() -> Iterator[dict[str, Any]]:
        yield {"stream": "Step 7/55 : RUN apt-get install -y python3.11\n"}
        raise ReadTimeoutError(None, "/build", "Read timed out.")  # type: ignore[arg-type]

    class Api:
        timeout = 600

        def build(self, **_: Any) -> Iterator[dict[str, Any]]:
            return stream()

    class Cli:
        api = Api()

    log = BuildLog(tmp_path / "build.log")
    from envbuild.profile import Profile

    with pytest.raises(EngineNoAnswer) as caught:
        build._sdk_build(
            Cli(), tmp_path, Profile.model_validate(VALID), buildargs={}, opts=BuildOptions(), log=log, say=quiet
        )
    log.close()
    err = caught.value
    assert "Step 7/55 : RUN apt-get install" in err.message and "got no reply in 600 s" in err.message
    assert str(tmp_path / "build.log") in err.hint
    assert "a step that runs longer without output: raise ENVBUILD_STEP_TIMEOUT" in err.hint


@pytest.mark.parametrize("timed_out", [True, False], ids=["smoke-timeout", "engine-gone"])
def test_a_smoke_wait_that_runs_out_is_the_smoke_timeout_and_a_lost_engine_is_not(timed_out: bool) -> None:
    """container.wait(timeout) ends with the same read timeout a hung engine gives: that one is the
    smoke test's own limit; a dropped connection was reported as a timeout too, and is now the engine's."""
    from envbuild.errors import SmokeError
    from envbuild.smoke import host

    removed: list[bool] = []

    class Container:
        def start(self) -> None:
            pass

        def wait(self, timeout: float) -> dict[str, int]:
            raise EngineNoAnswer("the Docker engine at unix://x stopped answering", timed_out=timed_out)

        def remove(self, force: bool) -> None:
            removed.append(force)

        def put_archive(self, path: str, data: bytes) -> bool:
            return True

    class Containers:
        def create(self, *_: Any, **__: Any) -> Container:
            return Container()

        def list(self, **_: Any) -> list[Any]:
            return []

    class Api:
        def inspect_image(self, image: str) -> dict[str, Any]:
            return {"Config": {"Labels": {"io.envbuild.profile": "cpu-py311"}}}

    class Cli:
        containers = Containers()
        api = Api()

    with pytest.raises(EngineNoAnswer if not timed_out else SmokeError) as caught:
        host.run_in_image(Cli(), "sha256:abc", gpus="none", timeout=5)
    assert removed == [True]  # the container goes either way
    if timed_out:
        assert "did not finish within 5s" in caught.value.message


def test_a_side_build_that_loses_the_engine_ends_the_build_at_once(
    half_engine: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stage run beside the others (buildahead) that meets a hung or vanished engine: the build
    ends with the engine error naming that side build's log, instead of waiting for the engine once
    more in the whole build that would follow."""
    from envbuild import buildahead
    from envbuild.layering import SideStage
    from envbuild.names import quiet

    monkeypatch.setenv("ENVBUILD_STEP_TIMEOUT", "1")
    (tmp_path / "context").mkdir()
    (tmp_path / "context" / "file").write_text("x")
    stage = SideStage("runtime-os", "FROM scratch\n", "", "", ())
    t0 = time.monotonic()
    with pytest.raises(EngineNoAnswer) as caught:
        buildahead.run_stages([stage], [stage], tmp_path / "context", {}, tmp_path / "stages", quiet)
    assert time.monotonic() - t0 < 10
    err = caught.value
    assert err.timed_out is (half_engine == "hang")
    assert "POST /" in err.message and "/build" in err.message and engine.engine_url()[0] in err.message
    assert str(tmp_path / "stages" / "runtime-os.log") in err.hint


def test_a_build_on_an_engine_that_hangs_ends_within_the_step_timeout(
    half_engine: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docker-py reads a build's stream with no time limit unless given one: a build on a wedged
    engine waited for as long as the engine kept the connection (forever, for a hung dockerd)."""
    from envbuild import build
    from envbuild.buildctx import BuildOptions
    from envbuild.buildfail import BuildLog
    from envbuild.names import quiet
    from envbuild.profile import Profile
    from tests.conftest import VALID

    monkeypatch.setenv("ENVBUILD_STEP_TIMEOUT", "1")
    (tmp_path / "Dockerfile").write_text("FROM scratch\n")
    cli = engine.client(timeout=enginelost.step_timeout())
    log = BuildLog(tmp_path / "build.log")
    t0 = time.monotonic()
    with pytest.raises(EngineNoAnswer) as caught:
        build._sdk_build(
            cli, tmp_path, Profile.model_validate(VALID), buildargs={}, opts=BuildOptions(), log=log, say=quiet
        )
    log.close()
    assert time.monotonic() - t0 < 10  # the server holds a hung request for 30 s
    assert caught.value.timed_out is (half_engine == "hang")
    assert "POST /" in caught.value.message and "/build" in caught.value.message


def test_a_pull_on_an_engine_that_hangs_is_stalled_within_the_stall_limit(
    half_engine: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docker-py's pull asks for no read limit at all (timeout=None): a pull the engine never
    answered was read until the engine let go (forever, for a hung dockerd or a silent registry)."""
    import docker

    monkeypatch.setenv(enginelost.STALL_ENV, "1")
    cli = engine.client()
    own = cli.api.timeout
    t0 = time.monotonic()
    with pytest.raises((docker.errors.APIError, EngineNoAnswer)) as caught:
        engine.transfer(cli, "pull", lambda: cli.api.pull("example.test/x", tag="1", stream=True, decode=True))
    assert time.monotonic() - t0 < 10  # the server holds a hung request for 30 s
    if half_engine == "hang":
        assert str(caught.value).startswith("stalled: the pull moved nothing for 1 s")
    # and the client is as it was: its own read limit, docker-py's own calls
    assert cli.api.timeout == own and "_post" not in vars(cli.api)
