"""The Docker engine, through the Docker SDK for Python (docker-py).

Everything that talks to the engine goes through here, so errors come out as
envbuild errors that say where envbuild looked and what to do about it.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from envbuild import enginelost
from envbuild.errors import BaseImageError, EngineNoAnswer, EngineUnavailable, ImageMissing, UsageError
from envbuild.names import ACCELERATOR_SHOWN

DEFAULT_SOCKET = "unix:///var/run/docker.sock"


def engine_url() -> tuple[str, str]:
    """(URL, where it came from): DOCKER_HOST, else the current docker context, else the socket."""
    if os.environ.get("DOCKER_HOST"):
        return os.environ["DOCKER_HOST"], "DOCKER_HOST"
    try:
        from docker.context import ContextAPI

        ctx = ContextAPI.get_current_context()
        if ctx is not None and ctx.Host and ctx.name != "default":
            return str(ctx.Host), f"docker context {ctx.name!r}"
    except Exception:  # noqa: S110 - a broken context config falls back to the default socket
        pass
    return DEFAULT_SOCKET, "the default socket"


def engine_elsewhere() -> str | None:
    """The engine's machine where not this one (ssh://gpu-box): what it mounts and its disk are its own."""
    parts = urllib.parse.urlsplit(engine_url()[0])
    host = "" if parts.scheme in ("unix", "npipe", "fd") else (parts.hostname or "").lower()
    here = {"", "localhost", "0.0.0.0", "::1", socket.gethostname().lower()}  # noqa: S104 - compared, not bound
    return None if host in here or host.startswith("127.") else host


def client(timeout: float = 600) -> Any:
    """A connected docker-py client, or EngineUnavailable saying where it looked. `timeout` is for
    the calls that follow (a build step, a push); the first answer must come within enginelost.ping_timeout()."""
    import docker
    import requests

    url, origin = engine_url()
    try:
        # the constructor already asks the engine (its API version): the short limit applies from there
        first = min(float(timeout), enginelost.ping_timeout())
        cli = docker.DockerClient(base_url=url, timeout=first, use_ssh_client=url.startswith("ssh://"))
        cli.ping()
        cli.api.timeout = timeout
        enginelost.guard(cli.api, url)
    except (docker.errors.DockerException, requests.exceptions.RequestException, OSError) as exc:
        cause, fix = enginelost.unreachable_cause(origin, str(exc), url)
        raise EngineUnavailable(f"cannot reach the Docker engine at {url} (from {origin}): {cause}", hint=fix) from exc
    return cli


def read_file(cli: Any, image: str, path: str) -> str:
    """A small text file of an image, read through a container that is created, never started, and
    removed; "" when the image has no such file."""
    import io
    import tarfile

    import docker

    try:
        container = cli.containers.create(image, ["true"])
    except docker.errors.APIError:
        return ""
    try:
        stream, _ = container.get_archive(path)
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
            member = tar.extractfile(tar.getmembers()[0])
            return member.read().decode("utf-8", "replace") if member else ""
    except (docker.errors.APIError, tarfile.TarError, IndexError):
        return ""
    finally:
        with contextlib.suppress(docker.errors.APIError):
            container.remove(force=True)


def ensure_image(cli: Any, ref: str, *, pull: bool = False, events: Any = None) -> str:
    """The image ID of `ref`, pulling it when missing (or when asked); BaseImageError otherwise."""
    import docker

    if not pull:
        try:
            return str(cli.images.get(ref).id)
        except docker.errors.ImageNotFound:
            pass
        except docker.errors.APIError as exc:
            raise BaseImageError(f"cannot inspect base image {ref}: {exc.explanation or exc}") from exc
    repo, tag = _split(ref)
    try:
        transfer(cli, "pull", lambda: cli.api.pull(repo, tag=tag, stream=True, decode=True), events)
        return str(cli.images.get(ref).id)
    except (docker.errors.APIError, docker.errors.ImageNotFound) as exc:
        answer = getattr(exc, "explanation", None) or str(exc)
        raise BaseImageError(
            f"base image {ref} is not present and could not be pulled: {str(answer).splitlines()[0][:300]}",
            hint=f"pull it where the registry is reachable (docker pull {ref}) or pass --base IMAGE",
        ) from exc


# The engine's per-layer statuses that mean a layer has nothing left to move.
_LAYER_DONE = frozenset({"Pull complete", "Already exists", "Pushed", "Layer already exists", "Mounted from"})
# Statuses whose byte counts are the transfer itself (extracting re-reads what was downloaded).
_LAYER_MOVING = frozenset({"Downloading", "Pushing"})
_LAYER_QUEUED = frozenset({"Pulling fs layer", "Waiting", "Preparing"})
# Statuses after which a layer's bytes have all arrived (pull) or been accepted (push).
_LAYER_TRANSFERRED = _LAYER_DONE | {"Download complete", "Verifying Checksum", "Extracting"}


class Transfer:
    """One line of progress for a whole push or pull, from the engine's per-layer status stream.

    The engine reports each layer apart ("Downloading 12MB/300MB" for three layers at once, then
    "Extracting"), which is unreadable when relayed as it comes; people want to know how much is
    done and whether it still moves.
    """

    def __init__(self) -> None:
        self._status: dict[str, str] = {}
        self._moved: dict[str, int] = {}
        self._size: dict[str, int] = {}
        self._extracted: dict[str, tuple[int, int]] = {}

    def feed(self, chunk: dict[str, Any]) -> str | None:
        """The summary after this chunk, or None for a chunk that is not about a layer."""
        layer, status = str(chunk.get("id") or ""), str(chunk.get("status") or "")
        if not layer or not status or status.startswith(("Pulling from", "The push refers to")):
            return None
        status = "Mounted from" if status.startswith("Mounted from") else status
        self._status[layer] = status
        detail = chunk.get("progressDetail") or {}
        if status in _LAYER_MOVING and detail.get("total"):
            self._size[layer] = int(detail["total"])
            # the engine's count can run past the total on a resent chunk: never over 100%
            self._moved[layer] = min(int(detail.get("current") or 0), self._size[layer])
        elif status.startswith("Retrying"):
            self._moved[layer] = 0  # a retried layer is sent again from the start: not "moved" yet
        elif layer in self._size and status in _LAYER_TRANSFERRED:
            self._moved[layer] = self._size[layer]  # downloaded or pushed in full
        if status == "Extracting" and detail.get("total"):
            self._extracted[layer] = (int(detail.get("current") or 0), int(detail["total"]))
        return self.summary()

    def mark(self) -> tuple[int, int, int, int]:
        """What changes whenever the transfer moves: bytes sent, layers finished, layers known,
        bytes unpacked. A stream whose mark stays put is not moving, whatever it says."""
        done = sum(s in _LAYER_DONE for s in self._status.values())
        unpacked = sum(current for current, _ in self._extracted.values())
        return sum(self._moved.values()), done, len(self._status), unpacked

    def summary(self) -> str:
        done = sum(s in _LAYER_DONE for s in self._status.values())
        text = f"{done} of {len(self._status)} layers done"
        if self._size:
            text += f", {_mb(sum(self._moved.values()))}"
            # a layer's size is known only once it starts moving: a total before then would grow
            if not any(s in _LAYER_QUEUED for s in self._status.values()):
                text += f" of {_mb(sum(self._size.values()))}"
            text += " moved"
        # the engine unpacks one layer at a time, in order; a big one takes many seconds
        busy = next((layer for layer, s in self._status.items() if s == "Extracting"), None)
        if busy:
            text += f", extracting {busy[:12]}"
            if busy in self._extracted:
                current, total = self._extracted[busy]
                text += f" ({_mb(current)} of {_mb(total)})"
        return text


@contextlib.contextmanager
def patience(cli: Any, seconds: float) -> Iterator[None]:
    """Calls made inside wait at most `seconds` for each answer from the engine (a socket read),
    instead of the client's default. Also those docker-py makes with no limit at all: its pull
    passes `timeout=None` itself, so a pull whose link stopped moving was read forever, and the
    stall limit never came into play (e2e test_a_pull_through_a_link_that_stops_forwarding...)."""
    api = cli.api
    before = api.timeout
    unbounded = type(api)._post

    def bounded(url: str, **kwargs: Any) -> Any:
        if "timeout" in kwargs and kwargs["timeout"] is None:
            kwargs["timeout"] = seconds
        return unbounded(api, url, **kwargs)

    api.timeout = seconds
    api._post = bounded
    try:
        yield
    finally:
        api.timeout = before
        del api._post  # the class's own again


STALLED = "stalled"


def transfer(cli: Any, verb: str, start: Callable[[], Iterable[dict[str, Any]]], events: Any = None) -> str:
    """Run one push or pull (`start` makes the SDK's request) with stall detection; its digest."""
    import docker

    stall = enginelost.stall_timeout()
    with patience(cli, stall):
        try:
            chunks = start()
        except EngineNoAnswer as exc:  # it answers once the registry does: a silent link, not a hung engine
            if not exc.timed_out:
                raise
            raise docker.errors.APIError(_stalled(verb, stall, Transfer())) from exc
        return follow(verb, chunks, events, stall)


def follow(verb: str, chunks: Iterable[dict[str, Any]], events: Any = None, stall: float | None = None) -> str:
    """Relay a push or pull stream as `transfer` progress events; the manifest digest it reports.

    An error in the stream comes out as the SDK's APIError, as a refused request would. With `stall`,
    a stream that moves nothing for that many seconds (silent, or only repeating itself) is an
    APIError that starts with "stalled", and the stream is dropped, which makes the engine stop."""
    import docker

    progress = Transfer()
    digest = ""
    moved_at, seen = time.monotonic(), progress.mark()
    stream = iter(chunks)
    try:
        while True:
            try:
                chunk = next(stream)
            except StopIteration:
                break
            except Exception as exc:  # the SDK lets urllib3's and the socket's own timeouts through
                if stall is not None and enginelost.is_timeout(exc):
                    raise docker.errors.APIError(_stalled(verb, stall, progress)) from exc
                enginelost.reraise(exc, engine_url()[0], f"the {verb}")
            if "error" in chunk:
                raise docker.errors.APIError(str((chunk.get("errorDetail") or {}).get("message") or chunk["error"]))
            summary = progress.feed(chunk)
            if events and summary:
                events("transfer", verb, summary)
            digest = str((chunk.get("aux") or {}).get("Digest") or digest)
            now, mark = time.monotonic(), progress.mark()
            if mark != seen:
                moved_at, seen = now, mark
            elif stall is not None and now - moved_at > stall:
                raise docker.errors.APIError(_stalled(verb, stall, progress))
    finally:
        close = getattr(stream, "close", None)
        if close is not None:
            close()
    return digest


def _stalled(verb: str, stall: float, progress: Transfer) -> str:
    return f"{STALLED}: the {verb} moved nothing for {stall:g} s (at {progress.summary()})"


def _mb(n: int) -> str:
    return f"{n / 1e6:,.0f} MB"


def _split(ref: str) -> tuple[str, str | None]:
    """docker-py's pull wants repository and tag/digest apart."""
    if "@" in ref:
        repo, digest = ref.split("@", 1)
        return repo.rsplit(":", 1)[0] if ":" in repo.rsplit("/", 1)[-1] else repo, digest
    last = ref.rsplit("/", 1)[-1]
    if ":" in last:
        repo, tag = ref.rsplit(":", 1)
        return repo, tag
    return ref, "latest"


def local_image(cli: Any, ref: str, profile: str = "NAME") -> Any:
    """The engine's image `ref`, or ImageMissing that says how to get it."""
    import docker

    try:
        return cli.images.get(ref)
    except docker.errors.ImageNotFound as exc:
        raise ImageMissing(
            f"no image {ref} in the engine",
            hint=f"build it (envbuild build {profile}) or pull it (envbuild pull {profile})",
        ) from exc
    except docker.errors.APIError as exc:
        if "invalid reference format" in str(exc):
            raise UsageError(
                f"{ref!r} is not an image reference", hint="an image ID (sha256:...) or NAME:TAG, in lower case"
            ) from exc
        raise EngineUnavailable(f"the engine could not look up {ref}: {exc.explanation or exc}") from exc


# Room a cold build needs on the engine's disk: the builder stage and the image each hold the
# environment (cu121-py311's image is 5.65 GB, cpu-py311's 1.1 GB), plus pip's downloads. ROCm's
# wheels unpack to several times CUDA's.
BUILD_ROOM = {"cpu": 4 * 10**9, "cuda": 15 * 10**9, "rocm": 40 * 10**9}


def disk(info: dict[str, Any]) -> tuple[str | None, int | None]:
    """(data root, free bytes) of the engine from its `info()`; free is None for an engine on another
    machine (its disk is not this one's to read) or an unreadable root."""
    root = info.get("DockerRootDir")
    if not root or engine_elsewhere():
        return root, None
    try:
        st = os.statvfs(root)
    except OSError:
        return root, None
    return root, st.f_frsize * st.f_bavail


def disk_note(root: str | None, free: int | None, accelerator: str) -> str | None:
    """A warning when the engine's disk has less room than a cold build of `accelerator` needs."""
    need = BUILD_ROOM[accelerator]
    if free is None or free >= need:
        return None
    return (
        f"the engine's disk has {free / 1e9:.1f} GB free ({root}): a {ACCELERATOR_SHOWN[accelerator]} build needs "
        f"about {need // 10**9} GB when little is cached "
        "(envbuild images --prune, docker builder prune and docker image prune free space)"
    )
