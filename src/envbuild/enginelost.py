"""An engine that answered once, then stopped: a call that times out or whose connection breaks.

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
