"""The engine connection: a failure says why in words and what to do."""

from __future__ import annotations

import os
import pathlib
from collections.abc import Callable

import pytest

from envbuild import engine
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


def test_a_socket_the_user_may_not_open_points_at_the_docker_group() -> None:
    # docker-py's text when /var/run/docker.sock is root:docker 0660 and the user is not in the group.
    sdk = "Error while fetching server API version: ('Connection aborted.', PermissionError(13, 'Permission denied'))"
    cause, fix = engine.unreachable_cause("the default socket", sdk)
    assert cause == "this user may not open the socket"
    assert "usermod -aG docker" in fix


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
