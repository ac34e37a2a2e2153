"""What a failed push or pull tells the user to do, from what the engine and registry answered.

The answers are the ones Debian's docker-registry and dockerd 20.10 gave here; the login case is
also proven end to end in tests/e2e/test_publish.py.
"""

from __future__ import annotations

import pytest

from envbuild.errors import PublishError
from envbuild.names import quiet
from envbuild.publish import _with_retries, registry_hint


@pytest.mark.parametrize(
    ("ref", "answer", "hint"),
    [
        (
            "127.0.0.1:5111/envs:cpu-py311",
            'Head "http://127.0.0.1:5111/v2/envs/manifests/cpu-py311": no basic auth credentials',
            "log in to 127.0.0.1:5111: `docker login 127.0.0.1:5111`",
        ),
        (
            "127.0.0.1:5111/envs:cpu-py311",
            "unauthorized: authentication required",
            "`docker login 127.0.0.1:5111`",
        ),
        (
            "192.0.2.2:5112/envs:cpu-py311-c28107b0c41b",
            'Get "https://192.0.2.2:5112/v2/": http: server gave HTTP response to HTTPS client',
            "192.0.2.2:5112 speaks plain HTTP: add it to insecure-registries",
        ),
        (
            "127.0.0.1:5112/nothing:cpu-py311",
            "manifest for 127.0.0.1:5112/nothing:cpu-py311 not found: manifest unknown: manifest unknown",
            "nothing is published as 127.0.0.1:5112/nothing:cpu-py311: push it first",
        ),
        (
            "registry-1.docker.io/acme/envs:cpu-py311",
            'Get "https://registry-1.docker.io/v2/": dial tcp: lookup registry-1.docker.io on 10.255.255.53:53: '
            "no such host",
            "registry-1.docker.io does not resolve: check the --registry value",
        ),
        (
            "127.0.0.1:5999/envs:cpu-py311",
            'Get "http://127.0.0.1:5999/v2/": dial tcp 127.0.0.1:5999: connect: connection refused',
            "check that the registry at 127.0.0.1:5999 is up",
        ),
    ],
)
def test_registry_hint(ref: str, answer: str, hint: str) -> None:
    assert hint in registry_hint(ref, answer)


@pytest.mark.parametrize(
    ("answer", "said", "hint"),
    [
        (  # a listener that takes the connection and never answers (a hung registry, a wrong service)
            'Get "http://127.0.0.1:5999/v2/": context deadline exceeded (Client.Timeout exceeded while awaiting '
            "headers)",
            "127.0.0.1:5999 took the connection but did not answer in time: ",
            "something at 127.0.0.1:5999 takes connections but sends no answer",
        ),
        (
            'Get "http://127.0.0.1:5999/v2/": dial tcp 127.0.0.1:5999: connect: connection refused',
            "nothing answered at 127.0.0.1:5999: ",
            "check that the registry at 127.0.0.1:5999 is up",
        ),
        (  # a firewall that drops the connection: nothing took it
            'Get "https://10.9.9.9:5000/v2/": dial tcp 10.9.9.9:5000: i/o timeout',
            "nothing answered at 127.0.0.1:5999: ",
            "check that the registry at 127.0.0.1:5999 is up",
        ),
        (
            "unauthorized: authentication required",
            "the registry answered: unauthorized",
            "docker login",
        ),
    ],
)
def test_a_failed_transfer_says_whether_the_registry_answered(
    answer: str, said: str, hint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A registry that took the connection and hung was reported as "the registry answered: context
    deadline exceeded", with the fix for one that is down."""
    import docker

    monkeypatch.setenv("ENVBUILD_RETRY_BACKOFF", "0")

    def fails() -> str:
        raise docker.errors.APIError(answer)

    with pytest.raises(PublishError) as caught:
        _with_retries("push", "127.0.0.1:5999/envs:cpu-py311", fails, quiet)
    assert f"push 127.0.0.1:5999/envs:cpu-py311 failed; {said}" in caught.value.message
    assert hint in (caught.value.hint or "")
