"""A resolver that cannot fetch says which host, why, and what to change: once, on its first line."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from pathlib import Path

import pytest

from envbuild import fetchfail, lock
from envbuild.errors import LockError
from envbuild.project import open_project

from ..conftest import Result

ROUTE = "point `index_url:` at a mirror"

# The shapes below are what uv 0.13 and py-rattler printed on this machine for each cause.
UV_DNS = """error: Request failed after 3 retries in 9.8s
  cause: Failed to fetch: https://download.pytorch.org/whl/cu126/torch/
  cause: error sending request for url (https://download.pytorch.org/whl/cu126/torch/)
  cause: client error (Connect)
  cause: dns error
  cause: error resolving DNS
  cause: failed to lookup address information: Name or service not known"""
UV_CERT = """error: Failed to fetch: https://pypi.org/simple/six/
  cause: error sending request for url (https://pypi.org/simple/six/)
  cause: client error (Connect)
  cause: invalid peer certificate: UnknownIssuer"""
UV_401 = """error: Failed to fetch: https://pypi.acme.example/simple/torch/
  cause: HTTP status client error (401 Unauthorized) for url (https://pypi.acme.example/simple/torch/)"""
UV_NO_SOLUTION = """error: No solution found when resolving dependencies
  cause: Because six was not found in the package registry and you require six, we can conclude that your
  requirements are unsatisfiable."""
UV_CONFLICT = """error: No solution found when resolving dependencies
  cause: Because there is no version of torchvision==0.99.0 and you require torchvision==0.99.0, we can
  conclude that your requirements are unsatisfiable."""
# a wheelhouse that stands in for the PyTorch index and holds torch alone
UV_NO_TORCHVISION = """error: No solution found when resolving dependencies
  cause: Because torchvision was not found in the package registry and envbuild-lock-cpu-py311 depends on
  torchvision==0.28.0, we can conclude that your requirements are unsatisfiable."""
RATTLER_DNS = """GatewayError: error sending request for url (https://conda.anaconda.org/conda-forge/noarch/repodata.json)
Caused by: client error (Connect)
Caused by: dns error"""


@pytest.mark.parametrize(
    ("text", "summary", "hint_has"),
    [
        (
            UV_DNS,
            "uv cannot reach download.pytorch.org: its name does not resolve (DNS) "
            "(https://download.pytorch.org/whl/cu126/torch/)",
            ROUTE,
        ),
        (UV_CERT, "uv cannot reach pypi.org: its TLS certificate is not trusted", "SSL_CERT_FILE"),
        (UV_401, "uv: pypi.acme.example refused the request (HTTP 401)", "credentials"),
        (UV_NO_SOLUTION, "uv found no package six in the indexes and wheelhouses", "spelling of six"),
        (UV_CONFLICT, "uv found no set of versions that satisfies the profile's pins", "envbuild compat"),
        (UV_NO_TORCHVISION, "uv found no package torchvision in the indexes", "wheelhouse (--find-links"),
        (RATTLER_DNS, "uv cannot reach conda.anaconda.org: its name does not resolve (DNS)", ROUTE),
    ],
)
def test_explain_names_host_cause_and_fix(text: str, summary: str, hint_has: str) -> None:
    why = fetchfail.explain("uv", text, ROUTE)
    assert why is not None
    assert why.summary.startswith(summary)
    assert hint_has in why.hint


def test_unrecognised_failure_keeps_the_tools_first_line_and_the_callers_fix() -> None:
    why = fetchfail.describe("uv", "error: something new\n  cause: details", ROUTE, "read uv's message")
    assert why.summary == "uv failed: error: something new"
    assert why.hint == "read uv's message"
    # The detail follows the summary without saying the first line twice.
    assert why.with_detail("error: something new\n  cause: details") == (
        "uv failed: error: something new\n  cause: details"
    )


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_lock_against_an_unreachable_index_says_so_once(
    cli: Callable[..., Result], project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Real uv against a closed port: the first line names the host and cause, the fix names the settings."""
    monkeypatch.setenv("UV_HTTP_RETRIES", "0")
    index = f"http://127.0.0.1:{_closed_port()}/simple"
    res = cli("lock", "cu121-py311", "--index-url", index, "--project", str(project))
    assert res.code == 4
    first_error = next(line for line in res.err.splitlines() if line.startswith("error: "))
    assert first_error.startswith("error: uv cannot reach 127.0.0.1: the connection was refused")
    assert "fix: check the network path to 127.0.0.1 (HTTPS_PROXY), or point `torch_index:`" in res.err
    assert res.err.count("error: uv cannot reach") == 1
    assert not (project / "lockfiles" / "cu121-py311").exists()

    res = cli("lock", "cu121-py311", "--index-url", index, "--json", "--project", str(project))
    assert res.code == 4
    [report] = json.loads(res.out)
    assert report["state"] == "failed"
    assert report["message"].startswith("uv cannot reach 127.0.0.1: the connection was refused")


def test_conda_lock_against_an_unreachable_channel_names_the_channel_setting(tmp_path: Path) -> None:
    """Real rattler against a closed port."""
    root = tmp_path / "proj"
    (root / "profiles").mkdir(parents=True)
    (root / "profiles" / "cpu-py311-conda.yaml").write_text(
        'name: cpu-py311-conda\naccelerator: cpu\nflavor: conda\npython: "3.11"\ntorch: "2.5.1"\n'
        f'numpy: "2.1.3"\nchannels: ["http://127.0.0.1:{_closed_port()}/conda-forge"]\n'
    )
    outcome = lock.lock_one(open_project(str(root)), "cpu-py311-conda", lock.LockOptions(solver="rattler"))
    assert isinstance(outcome.error, LockError)
    assert outcome.error.message.startswith("rattler cannot reach 127.0.0.1: the connection was refused")
    assert "set `channels:` to channel URLs this machine reaches" in outcome.error.hint
    assert not (root / "lockfiles" / "cpu-py311-conda").exists()


def test_a_full_disk_under_uv_is_said_so_not_taken_for_the_network() -> None:
    text = "error: failed to write to file `/tmp/e-0/lock-x/.tmpA`: No space left on device (os error 28)"
    why = fetchfail.explain("uv", text, ROUTE)
    assert why is not None
    assert why.summary == "uv ran out of disk space writing /tmp/e-0/lock-x/.tmpA"
    assert "TMPDIR" in why.hint and "UV_CACHE_DIR" in why.hint
