"""BuildKit's path: identical image digests need its rewrite-timestamp, which only 0.13 and later have."""

from __future__ import annotations

from pathlib import Path

import pytest

from envbuild import buildkit

# `docker buildx inspect` as buildx 0.12 and 0.14 print it (the field was renamed in between)
OLD = "Name:      default\nDriver:    docker\n\nNodes:\nName:      default\nBuildkit:  v0.8.3+unknown\n"
NEW = "Name:          default\nDriver:        docker\nNodes:\nName:             default\nBuildKit version: v0.13.2\n"


@pytest.mark.parametrize(
    ("text", "version", "output"),
    [
        (OLD, (0, 8), ["--load"]),
        (NEW, (0, 13), ["--output", "type=docker,rewrite-timestamp=true"]),
        ("Name: default\n", None, ["--load"]),
    ],
)
def test_the_image_comes_back_with_rewritten_times_only_where_buildkit_can(
    text: str, version: tuple[int, int] | None, output: list[str]
) -> None:
    assert buildkit.buildkit_version(text) == version
    assert buildkit.buildx_output(version) == output


def _quiet_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in BuildKit CLI that prints one step, then sleeps (a quiet step, or an engine that
    hangs), and writes the signal that stops it to the file it returns (on SIGINT the real CLI
    cancels its build in the engine)."""
    import sys

    heard = tmp_path / "heard"
    cli = tmp_path / "docker"
    cli.write_text(
        f"#!{sys.executable}\n"
        "import signal, sys, time\n"
        "def stop(signum, frame):\n"
        f"    open({str(heard)!r}, 'w').write(str(signum))\n"
        "    sys.exit(130)\n"
        "signal.signal(signal.SIGINT, stop)\n"
        "print('#5 [2/3] RUN uv pip install --quiet ...', flush=True)\n"
        "time.sleep(60)\n"
    )
    cli.chmod(0o755)
    monkeypatch.setattr(buildkit, "cli", lambda: [str(cli), "build"])
    (tmp_path / "ctx").mkdir()
    return heard


def _build(tmp_path: Path) -> str:
    from envbuild import build, profile
    from envbuild.buildctx import BuildOptions
    from envbuild.buildfail import BuildLog

    prof = profile.Profile.model_validate(
        {"name": "cpu-py311", "accelerator": "cpu", "python": "3.11", "torch": "2.13.0", "numpy": "2.1.3"}
    )
    log = BuildLog(tmp_path / "build.log")
    return build._buildkit_build(tmp_path / "ctx", prof, {}, BuildOptions(builder="buildkit"), log, lambda *a: None)


def test_an_interrupt_during_a_quiet_step_stops_the_cli_and_its_build_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM to envbuild (a CI timeout) during a BuildKit step that prints nothing for a while
    (a quiet install of 2.5 GB of CUDA wheels): envbuild left after `Popen`'s 0.25 s grace, saying
    it had cleaned up, while the CLI, told nothing, built on until its next line of output met the
    closed pipe. Measured with the real docker CLI and a 40 s `RUN sleep`: it built on for 37.3 s
    after envbuild had gone. A stand-in CLI here prints one step, then sleeps, and records the
    signal that stops it."""
    import signal
    import time
    from types import FrameType

    heard = _quiet_cli(tmp_path, monkeypatch)

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    before = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 1.5)
    t0 = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            _build(tmp_path)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)
    assert time.monotonic() - t0 < 10, "envbuild waited for the CLI's step to end"
    assert heard.read_text() == str(int(signal.SIGINT))  # told, as Ctrl-C tells it, so it cancels its build


def test_a_buildkit_build_silent_for_a_steps_limit_stops_as_a_hung_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An engine that hangs holds the CLI, which waits on it without a limit: `build --builder
    buildkit` waited as long (the classic builder's stream has ENVBUILD_STEP_TIMEOUT of silence)."""
    import signal

    from envbuild.errors import EngineNoAnswer

    heard = _quiet_cli(tmp_path, monkeypatch)
    monkeypatch.setenv("ENVBUILD_STEP_TIMEOUT", "1")
    with pytest.raises(EngineNoAnswer) as err:
        _build(tmp_path)
    assert "stopped answering: the build, at #5 [2/3] RUN uv pip install --quiet ..., got no reply in 1 s" in str(
        err.value
    )
    assert err.value.hint is not None and "raise ENVBUILD_STEP_TIMEOUT" in err.value.hint
    assert str(tmp_path / "build.log") in err.value.hint
    assert heard.read_text() == str(int(signal.SIGINT))
