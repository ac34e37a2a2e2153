"""An engine that cannot be reached (what the SDK's words mean, and the fix), or that answered once,
then stopped: a call that times out or whose connection breaks.

docker-py lets requests' and urllib3's own exceptions through. Unmapped, an engine that answered the
first ping and then hung reached the user as "internal error: ReadTimeout ... this is a bug in
envbuild", after the client's whole timeout, and `status` could not fall back to "unknown".
"""

from __future__ import annotations

import os
import re
from typing import Any, NoReturn
from urllib.parse import urlsplit

from envbuild.errors import EngineNoAnswer

HINT = "check the engine (`docker info`, its log, `systemctl status docker`) and restart it if it hangs"


_START = "start it (`sudo systemctl start docker`, or `make engine` on a Debian machine)"
_ELSEWHERE = "point DOCKER_HOST at a running engine (tcp://HOST:2376, ssh://USER@HOST)"
# (what the SDK's message contains, what it means, what to do); the first match wins.
_UNREACHABLE = (
    (
        "permission denied",
        "this user may not open the socket",
        "add the user to the docker group "
        "(`sudo usermod -aG docker $USER`, then log in again), or run envbuild with sudo",
    ),
    (
        "no such file or directory",
        "no socket there: the engine is not running, or listens elsewhere",
        f"{_START} or {_ELSEWHERE}",
    ),
    ("connection refused", "nothing listens there", f"{_START}, or check the port in DOCKER_HOST"),
    ("name or service not known", "the host name does not resolve", "check the host in {where}"),
    ("failed to resolve", "the host name does not resolve", "check the host in {where}"),
    ("timed out", "no answer in time", "check that the host is up and the port is open to you"),
    (
        "install paramiko",  # docker-py's words for an ssh:// engine without it
        "docker-py reaches ssh:// engines only with paramiko installed, which envbuild leaves out (importing it "
        "adds ~0.3 s to every command)",
        "pip install 'envbuild[ssh]' (paramiko; the connection then goes through your ssh command and its config), "
        "or point {where} at tcp://HOST:2376 with TLS",
    ),
)


# What the SDK says when something answered that is not the Docker API: a web server's page, a
# JSON that does not parse, or bytes that are not HTTP at all (another service on that port).
_NOT_DOCKER = (
    ("<html", "an HTML page"),
    ("<!doctype", "an HTML page"),
    ("client error for", "an HTTP error page"),
    ("server error for", "an HTTP error page"),
    ("badstatusline", "bytes that are not HTTP"),
    ("remotedisconnected", "a closed connection without an HTTP answer"),
    ("expecting value", "a body that is not JSON"),
    ("expecting property name", "a body that is not JSON"),
    ("unterminated string", "a body that is not JSON"),
    ("extra data", "a body that is not JSON"),
)


def printable(text: str, limit: int = 120) -> str:
    """The first line of a foreign answer, without control bytes, short enough to quote."""
    line = next((x for x in text.splitlines() if x.strip()), "")
    clean = "".join(ch if ch.isprintable() else "?" for ch in line).strip()
    return clean[:limit] + ("..." if len(clean) > limit else "")


def unreachable_cause(origin: str, message: str, url: str = "") -> tuple[str, str]:
    """(cause, fix) for a failed connection, instead of the SDK's nested exception text."""
    low = message.lower()
    if "timed out" in low and url.startswith("unix://"):
        # a socket that takes the connection and then stays silent: the engine is there but stuck
        return (
            "no answer in time: something holds the socket but does not answer",
            "the engine may be stuck or overloaded: see its log (`journalctl -u docker`) or restart it "
            f"(`sudo systemctl restart docker`); or {_ELSEWHERE}",
        )
    for needle, what in _NOT_DOCKER:
        if needle in low:
            return (
                f"something answers there, but not the Docker API ({what})",
                f"{origin} points at another service: set it to the Docker engine's socket or port "
                "(unix:///var/run/docker.sock, tcp://HOST:2376)",
            )
    for needle, cause, fix in _UNREACHABLE:
        if needle in low:
            return cause, fix.replace("{where}", origin)
    return printable(message, 300) if message else "no answer", f"{_START} or {_ELSEWHERE}"


def is_timeout(exc: BaseException) -> bool:
    """Whether `exc` or what caused it is a timeout (requests', urllib3's and the socket's differ)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, EngineNoAnswer):
            return seen.timed_out
        named = "timeout" in type(seen).__name__.lower() or "timed out" in str(seen).lower()
        if isinstance(seen, TimeoutError) or named:
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _is_transport(exc: BaseException) -> bool:
    """A failure of the link itself, not an answer: the engine's HTTP errors (docker-py's APIError is
    a requests HTTPError) are answers and stay what they are."""
    seen: BaseException | None = exc
    while seen is not None:
        kind = type(seen)
        names = {k.__name__ for k in kind.__mro__}
        from_http = kind.__module__.split(".")[0] in {"requests", "urllib3"}
        if isinstance(seen, (TimeoutError, ConnectionError)):
            return True
        if from_http and names & {"Timeout", "ConnectionError", "ProtocolError", "ReadTimeoutError"}:
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def lost(exc: BaseException, url: str, doing: str, waited: Any = None) -> EngineNoAnswer | None:
    """The envbuild error for `exc` when the link to the engine at `url` failed during `doing`, else None.
    `waited`: the read timeout the call had (seconds, or requests' (connect, read) pair)."""
    if not _is_transport(exc):
        return None
    if is_timeout(exc):
        limit = waited[-1] if isinstance(waited, tuple) else waited
        within = f" in {float(limit):g} s" if isinstance(limit, (int, float)) else ""
        return EngineNoAnswer(
            f"the Docker engine at {url} stopped answering: {doing} got no reply{within}", hint=HINT, timed_out=True
        )
    reason = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else type(exc).__name__
    return EngineNoAnswer(f"the Docker engine at {url} dropped the connection during {doing} ({reason})", hint=HINT)


def reraise(exc: BaseException, url: str, doing: str, waited: Any = None) -> NoReturn:
    """Raise what `lost` makes of `exc`, else `exc` itself (called in the handler that caught it)."""
    found = lost(exc, url, doing, waited)
    if found is None:
        raise exc
    raise found from exc


def _call(request: Any) -> str:
    path = re.sub(r"^/v[0-9.]+(?=/)", "", urlsplit(str(getattr(request, "path_url", "") or "")).path)
    return f"{getattr(request, 'method', '') or 'a call'} {path}".strip()


def guard(api: Any, url: str) -> None:
    """Every later request on docker-py's APIClient (a requests Session, whose `request` goes through
    `send`) that times out or loses its connection raises EngineNoAnswer, which names the call."""
    send = api.send

    def guarded(request: Any, **kwargs: Any) -> Any:
        try:
            return send(request, **kwargs)
        except Exception as exc:
            reraise(exc, url, _call(request), kwargs.get("timeout"))

    api.send = guarded


PING_TIMEOUT_ENV = "ENVBUILD_ENGINE_TIMEOUT"


def _seconds(name: str, default: float) -> float:
    try:
        value = float(os.environ.get(name, "") or default)
    except ValueError:
        return default
    return value if value > 0 else default


def ping_timeout() -> float:
    """How long the first question to the engine may take: an engine that accepts connections and
    never answers is reported after this many seconds (ENVBUILD_ENGINE_TIMEOUT, default 15), not
    after the client's 10-minute timeout for builds and pushes."""
    return _seconds(PING_TIMEOUT_ENV, 15)


STEP_TIMEOUT_ENV = "ENVBUILD_STEP_TIMEOUT"


def step_timeout() -> float:
    """How long a build step may print nothing before the engine counts as not answering
    (ENVBUILD_STEP_TIMEOUT, default 600 s): the classic builder streams nothing while a step runs
    quietly, so a hung engine and a long silent step look the same from here."""
    return _seconds(STEP_TIMEOUT_ENV, 600)


STALL_ENV = "ENVBUILD_STALL_TIMEOUT"


def stall_timeout() -> float:
    """How long a push or pull may go without moving a byte before it counts as stalled
    (ENVBUILD_STALL_TIMEOUT, default 120 s): a link that stops forwarding otherwise looks like a
    slow one until the client's 10-minute timeout."""
    return _seconds(STALL_ENV, 120)
