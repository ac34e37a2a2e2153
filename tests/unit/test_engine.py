"""The engine connection: a failure says why in words and what to do."""

from __future__ import annotations

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
