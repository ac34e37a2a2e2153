"""An image's environment as it is now, file by file: what `diff IMAGE` and `sbom IMAGE` read.

The scan runs in a container as the smoke test's checks do (smoke.container.with_host_smoke): this
envbuild's copy of the code that wrote the image's build manifest, not the image's own (a file a
tampered image can replace to report anything), and not the image's ENTRYPOINT (a derived image's
may print a banner, or never run the command given). `python -S`: no sitecustomize or `.pth` file
of the image runs, so nothing it prints lands in the scan's output (one that printed a line made
`diff` and `sbom` end with an internal error) and nothing it does changes what is read; the scan
needs only the standard library and its own package.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

from envbuild.errors import SmokeError
from envbuild.smoke import container as smoke_container

_WHAT = "the scan of its environment"
SCAN_TIMEOUT_S = 600.0  # hashing a CUDA image's ~6 GB takes about a minute on 2 cores


def environment(
    cli: Any,
    image: str,
    root: str,
    *,
    shown: str,
    inspected: dict[str, Any] | None = None,
    timeout: float = SCAN_TIMEOUT_S,
) -> dict[str, Any]:
    """The manifest of `image`'s environment under `root` as it is now ({"files": ..., "os_packages": ...}).

    `inspected`: the engine's inspect of `image`, where the caller holds it already."""
    import docker

    if inspected is None:
        inspected = smoke_container.inspect(cli, image, shown)
    command = [*smoke_container.SCAN_HEAD, "--root", root, "--stdout"]
    container = smoke_container.create(cli, image, command, smoke_container.with_host_smoke(inspected))
    try:
        try:
            smoke_container.start(container, shown, _WHAT)
        except docker.errors.APIError as exc:
            why = str(exc.explanation or exc)
            raise SmokeError(f"{shown}: the container that scans its environment did not start: {why}") from exc
        timed_out = SmokeError(
            f"the scan of {shown}'s environment did not finish within {timeout:.0f}s and was stopped"
        )
        code, out, err = smoke_container.finish(container, timeout, timed_out)
    finally:
        with contextlib.suppress(docker.errors.APIError):
            container.remove(force=True)
    try:
        found = json.loads(out)
        if not isinstance(found, dict) or not isinstance(found.get("files"), dict):
            raise ValueError("not a manifest")
    except ValueError as exc:
        if code in (126, 127):  # the shell ran; `python` did not (not found, not executable)
            raise smoke_container.cannot_run(shown, err or f"exit {code}", _WHAT) from exc
        raise SmokeError(f"{shown}: the scan of its environment failed (exit {code}):\n{err.strip()[-2000:]}") from exc
    return found
