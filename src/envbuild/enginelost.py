"""An engine that answered once, then stopped: a call that times out or whose connection breaks.

docker-py lets requests' and urllib3's own exceptions through. Unmapped, an engine that answered the
first ping and then hung reached the user as "internal error: ReadTimeout ... this is a bug in
envbuild", after the client's whole timeout, and `status` could not fall back to "unknown".
"""

from __future__ import annotations

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
