"""What blocks a first build before it starts: can this machine reach the package index, the PyTorch
index of each profile's build and the base image's registry, and is TLS intercepted on the way?

Interception is found by comparing trust stores: a connection that the public CAs (certifi, Mozilla's
list) refuse and this machine's own store accepts goes through a proxy with a private CA, and pip in
a build container needs that CA (`--ca-bundle`).
"""

from __future__ import annotations

import socket
import ssl
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

SYSTEM_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
TIMEOUT_S = 8.0

Opener = Callable[[str, ssl.SSLContext], None]


@dataclass
class Reach:
    url: str
    what: str  # "package index", "PyTorch index (cu121)", "base image registry"
    state: str  # reachable | intercepted | unreachable
    detail: str
    fix: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _open(url: str, context: ssl.SSLContext) -> None:
    request = urllib.request.Request(url, method="HEAD", headers={"User-Agent": "envbuild-doctor"})  # noqa: S310
    try:
        urllib.request.urlopen(request, timeout=TIMEOUT_S, context=context).close()  # noqa: S310 - fixed https URLs
    except urllib.error.HTTPError:
        return  # an answer (401 from a registry, 404, 405 for HEAD): the host is reachable


def _public() -> ssl.SSLContext:
    import certifi

    return ssl.create_default_context(cafile=certifi.where())


def probe(url: str, what: str, fix_route: str, opener: Opener | None = None) -> Reach:
    opener = opener or _open  # looked up per call, so that a test can stand in for the network
    try:
        opener(url, _public())
        if url.startswith("http://"):  # apt's archives (their indexes are signed), an insecure registry
            return Reach(url, what, "reachable", "answers over plain HTTP", "")
        return Reach(url, what, "reachable", "answers, with a certificate from a public CA", "")
    except (urllib.error.URLError, OSError) as exc:
        tls = exc if isinstance(exc, ssl.SSLError) else getattr(exc, "reason", None)
        if not isinstance(tls, ssl.SSLError):
            return Reach(url, what, "unreachable", _cause(exc), fix_route)
        public_refused = str(getattr(tls, "verify_message", "") or tls)
    try:
        opener(url, ssl.create_default_context())
    except (ssl.SSLError, urllib.error.URLError, OSError) as exc:
        return Reach(url, what, "unreachable", f"TLS refused ({public_refused}); {_cause(exc)}", fix_route)
    return Reach(
        url,
        what,
        "intercepted",
        "answers through a TLS-intercepting proxy: the certificate is from a CA this machine trusts "
        "and the public CAs do not",
        f"pass --ca-bundle {SYSTEM_BUNDLE} to build (or set ca_bundle in envbuild.toml) so pip in the "
        "build container trusts it",
    )


def _cause(exc: BaseException) -> str:
    reason = getattr(exc, "reason", exc)
    if isinstance(reason, socket.gaierror):
        return "the name does not resolve (DNS)"
    if isinstance(reason, (TimeoutError, socket.timeout)) or "timed out" in str(reason):
        return f"no answer within {TIMEOUT_S:g} s"
    if isinstance(reason, ConnectionRefusedError):
        return "the connection was refused"
    return str(reason)[:200]
