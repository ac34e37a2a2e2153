"""Fixtures that start and use real services: the Docker engine, a built CPU image, a venv."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import certifi
import pytest

from ..conftest import REPO

BASE = os.environ.get("ENVBUILD_TEST_BASE", "envbuild-test/debian:bookworm")
WHEELS = os.environ.get("PIP_FIND_LINKS", "/opt/wheels")
CA = "/etc/ssl/certs/ca-certificates.crt"


def local_build(name: str, tag: str) -> list[str]:
    """`build NAME` as the e2e suite runs it: the debootstrapped base, the wheelhouse, the host CA."""
    return ["build", name, "--base", BASE, "--find-links", WHEELS, "--ca-bundle", CA, "--tag", tag]


_PEM = re.compile(rb"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", re.S)


def host_only_certs(cli: Any, image_id: str) -> list[bytes]:
    """Certificates in the host bundle that no public bundle has: the proxy's, the ones a leak would
    carry. A public root the host's ca-certificates has and the image's older one lacks is not
    secret: pip's vendored certifi ships it too (CI's host met exactly that)."""
    public = cli.containers.run(image_id, ["cat", "/etc/ssl/certs/ca-certificates.crt"], remove=True)
    mozilla = Path("/usr/share/ca-certificates/mozilla")
    public += b"".join(f.read_bytes() for f in sorted(mozilla.glob("*.crt")))
    public += Path(certifi.where()).read_bytes()
    return [c for c in _PEM.findall(Path(CA).read_bytes()) if c not in public]


def variant(e2e_project: Path, dest: Path, name: str, packages: str) -> Path:
    """A copy of the e2e project with one more profile, NAME: cpu-py311 with `packages` (YAML) and
    locked for this machine (the debootstrapped base, the wheelhouse), from cpu-py311's lockfile as
    a team would derive a profile: its pins stay, and only what `packages` adds is new (a fresh
    resolve would take whatever PyPI released since the committed lockfile)."""
    for part in ("profiles", "lockfiles", "checks"):
        shutil.copytree(e2e_project / part, dest / part)
    (dest / "lockfiles" / name).mkdir()
    shutil.copy(dest / "lockfiles" / "cpu-py311" / "requirements.lock", dest / "lockfiles" / name)
    text = (dest / "profiles" / "cpu-py311.yaml").read_text()
    mine = text.replace("name: cpu-py311", f"name: {name}").replace(
        'packages: ["einops==0.8.1"]', f"packages: {packages}"
    )
    assert mine.count(packages) == 1, "the e2e cpu-py311 profile no longer reads as this expects"
    (dest / "profiles" / f"{name}.yaml").write_text(mine)
    res = envbuild("lock", name, "--base", BASE, "--find-links", WHEELS, cwd=dest)
    assert res.returncode == 0, res.stderr[-3000:]
    return dest


def envbuild(
    *args: str, cwd: Path, env: dict[str, str] | None = None, timeout: int = 1800
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "envbuild", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, **(env or {})},
    )


def derived(cli: Any, base: str, *lines: str) -> Any:
    """An image FROM `base` plus `lines`: a variant of a real build, to relabel or break."""
    dockerfile = "\n".join([f"FROM {base}", *lines]) + "\n"
    image, _ = cli.images.build(fileobj=io.BytesIO(dockerfile.encode()), rm=True, forcerm=True)
    return image


def at_once(cmds: list[list[str]], cwd: Path, timeout: float = 1200) -> list[tuple[int, str, str]]:
    """Start every command before waiting for any: (exit code, stdout, stderr) of each, in order."""
    procs = [subprocess.Popen(c, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for c in cmds]
    outs = [p.communicate(timeout=timeout) for p in procs]
    return [(p.returncode, out, err) for p, (out, err) in zip(procs, outs, strict=True)]


@pytest.fixture(scope="session")
def docker_client() -> Any:
    from envbuild import engine
    from envbuild.errors import EngineUnavailable

    try:
        cli = engine.client()
    except EngineUnavailable as exc:
        pytest.fail(f"the e2e suite needs a Docker engine: {exc} (run `make engine`)")
    try:
        cli.images.get(BASE)
    except Exception:
        pytest.fail(f"the e2e suite needs the base image {BASE} (run `make engine`)")
    return cli


# This session's registries ("127.0.0.1:PORT"): tags under them are the session's to remove.
SESSION_REGISTRIES: list[str] = []
SESSION_REPO = f"envbuild-e2e-{uuid.uuid4().hex[:8]}"


def _owned(ref: str) -> bool:
    return ref.startswith(SESSION_REPO) or any(ref.startswith(f"{host}/") for host in SESSION_REGISTRIES)


def _tags(image: dict[str, Any]) -> list[str]:
    return [t for t in image.get("RepoTags") or [] if t != "<none>:<none>"]


def _images(cli: Any) -> dict[str, list[str]]:
    """Every image the engine holds, intermediate ones included: id -> its tags."""
    return {i["Id"]: _tags(i) for i in cli.api.images(all=True)}


def remove_images_made_since(cli: Any, before: dict[str, list[str]], basetemp: Path) -> None:
    """Remove the images that appeared since `before` and are this suite's: built on the test base
    (its layers come first), tagged under the session's names or labelled as built from a project
    under the session's `basetemp`; their new parents; and the containers that use them.

    A failed build's intermediate images and the builder stages envbuild keeps as cache carry no
    tag, so removing tags alone left ~11 GB per run, and one run filled a CI machine's disk. An image
    wearing a tag that existed before is kept: the window moved that tag, and a later test may use
    it. noprune, children first: a new image's older untagged parents (a session fixture's build
    cache) stay for the tests after this one.
    """
    known_tags = {t for tags in before.values() for t in tags}
    base = cli.api.inspect_image(BASE)["RootFS"]["Layers"]
    listed = {i["Id"]: i for i in cli.api.images(all=True)}
    ours: set[str] = set()
    for image_id, image in listed.items():
        tags = _tags(image)
        if image_id in before or any(t in known_tags for t in tags):
            continue
        source = str((image.get("Labels") or {}).get("org.opencontainers.image.source", ""))
        with contextlib.suppress(Exception):
            attrs = cli.api.inspect_image(image_id)
            if (
                attrs["RootFS"]["Layers"][: len(base)] == base
                or any(_owned(t) for t in tags)
                or source.startswith(f"file://{basetemp}/")
            ):
                ours.add(image_id)

    def ancestors(image_id: str) -> list[str]:
        chain, parent = [], listed[image_id].get("ParentId", "")
        while parent in listed:
            chain.append(parent)
            parent = listed[parent].get("ParentId", "")
        return chain

    for image_id in list(ours):  # the steps that built it, FROM scratch included
        ours.update(p for p in ancestors(image_id) if p not in before)
    for container in cli.api.containers(all=True):
        if container.get("ImageID") in ours:
            with contextlib.suppress(Exception):
                cli.api.remove_container(container["Id"], force=True)
    for image_id in sorted(ours, key=lambda i: len(ancestors(i)), reverse=True):  # children first
        with contextlib.suppress(Exception):
            cli.api.remove_image(image_id, force=True, noprune=True)


@pytest.fixture(scope="session", autouse=True)
def uv_cache_of_the_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """uv keys a wheel from a local folder by that folder, and the tests install torch from temp
    folders: every run added about 4 GB of 700 MB copies of torch to ~/.cache/uv, 52 GB on one
    developer's machine after some weeks. The session gets a cache of its own, which goes at its
    end. A UV_CACHE_DIR the caller set is theirs and is used as it is."""
    if os.environ.get("UV_CACHE_DIR"):
        yield
        return
    cache = tmp_path_factory.mktemp("uv-cache")
    os.environ["UV_CACHE_DIR"] = str(cache)
    try:
        yield
    finally:
        del os.environ["UV_CACHE_DIR"]
        shutil.rmtree(cache, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def engine_left_as_found(docker_client: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The containers, tags and images this session made go at the end, even after a failed test.

    Tests clean up after themselves; this catches what a killed build (by design) or a failed
    assertion leaves, so a developer's engine does not fill up run after run. Only what the
    session owns (its repository prefix, its registries, images built on the test base) is
    touched: another suite or a user working against the same engine at the same time keeps
    everything of theirs that is not built on envbuild's test base.
    """
    containers = {c.id for c in docker_client.containers.list(all=True, ignore_removed=True)}
    images = _images(docker_client)
    tags = {t for image_tags in images.values() for t in image_tags}
    yield
    owned_images = {image.id for image in docker_client.images.list() if any(_owned(t) for t in image.tags)}
    for container in docker_client.containers.list(all=True, ignore_removed=True):
        if container.id in containers:
            continue
        if container.attrs.get("Image") in owned_images or _owned(str(container.attrs["Config"].get("Image", ""))):
            with contextlib.suppress(Exception):
                container.remove(force=True)
    for image in docker_client.images.list():
        for tag in image.tags:
            if tag not in tags and _owned(tag):
                with contextlib.suppress(Exception):
                    docker_client.images.remove(tag, force=True)
    remove_images_made_since(docker_client, images, tmp_path_factory.getbasetemp())


@pytest.fixture(autouse=True)
def images_made_by_the_test_go(docker_client: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """What one test builds goes when it ends: the suite's peak disk is one test's images plus the
    session fixtures', not the sum over every test (which filled a CI machine's disk)."""
    before = _images(docker_client)
    yield
    remove_images_made_since(docker_client, before, tmp_path_factory.getbasetemp())


@pytest.fixture(scope="session")
def repo_name() -> str:
    return SESSION_REPO


@pytest.fixture(scope="session")
def e2e_project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("e2e") / "proj"
    shutil.copytree(REPO / "profiles", root / "profiles")
    shutil.copytree(REPO / "lockfiles", root / "lockfiles")
    shutil.copytree(REPO / "checks", root / "checks")
    # The test base is debootstrapped on each machine, so its own packages follow Debian's archive
    # (the committed apt.lock was resolved against one made earlier): resolve the OS packages
    # against this one, through `lock`'s own path for a profile whose Python lockfiles are fresh.
    (root / "lockfiles" / "cpu-py311" / "apt.lock").unlink()
    res = envbuild("lock", "cpu-py311", "--base", BASE, "--find-links", WHEELS, cwd=root)
    assert res.returncode == 0 and (root / "lockfiles" / "cpu-py311" / "apt.lock").is_file(), res.stderr[-3000:]
    return root


@pytest.fixture(scope="session")
def built_cpu(docker_client: Any, e2e_project: Path, repo_name: str) -> Iterator[dict[str, Any]]:
    """cpu-py311 built for real: debootstrapped bookworm, torch 2.13.0+cpu, the host CA bundle."""
    res = envbuild(*local_build("cpu-py311", repo_name), "--json", cwd=e2e_project)
    assert res.returncode == 0, res.stderr[-4000:]
    result = json.loads(res.stdout)
    yield result
    for image in docker_client.images.list(name=repo_name):
        for tag in image.tags:
            docker_client.images.remove(tag, force=True)


@pytest.fixture(scope="session")
def cpu_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv made by `envbuild venv` from the committed CPU lockfile (real torch)."""
    target = tmp_path_factory.mktemp("venv") / "cpu"
    res = envbuild("venv", "cpu-py311", str(target), "--find-links", WHEELS, cwd=REPO)
    assert res.returncode == 0, res.stderr
    return target


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# The password of the login-protected registry; its bcrypt hash below is what htpasswd stores.
REGISTRY_USER, REGISTRY_PASSWORD = "envbuild", "envbuild-e2e"
_REGISTRY_HTPASSWD = "envbuild:$2b$04$d7U6.KN8TvR2d4rN2iCbSO9zMtoXkwm069qolk80/eEa5oWJ72ncS\n"


@contextlib.contextmanager
def _serve_registry(root: Path, *, login: bool) -> Iterator[str]:
    """A real distribution registry (Debian's docker-registry) on a free loopback port."""
    import time
    import urllib.error
    import urllib.request

    binary = shutil.which("docker-registry") or "/usr/bin/docker-registry"
    if not Path(binary).exists():
        pytest.fail("the e2e suite needs Debian's docker-registry package (run `make engine`)")
    port = _free_port()
    auth = ""
    if login:
        (root / "htpasswd").write_text(_REGISTRY_HTPASSWD)
        auth = f"auth:\n  htpasswd:\n    realm: envbuild-e2e\n    path: {root / 'htpasswd'}\n"
    config = root / "config.yml"
    config.write_text(
        "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n"
        f"    rootdirectory: {root / 'data'}\n  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{port}\n{auth}"
    )
    log = (root / "registry.log").open("w")
    proc = subprocess.Popen([binary, "serve", str(config)], stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(100):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=1) as resp:
                    if resp.status == 200:
                        break
            except urllib.error.HTTPError as exc:
                if exc.code == 401 and login:  # up, and asking for the login it should
                    break
                time.sleep(0.1)
            except OSError:
                time.sleep(0.1)
        else:
            pytest.fail(f"the registry did not start: {(root / 'registry.log').read_text()[-2000:]}")
        SESSION_REGISTRIES.append(f"127.0.0.1:{port}")
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with _serve_registry(tmp_path_factory.mktemp("registry"), login=False) as address:
        yield address


@pytest.fixture(scope="session")
def login_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The same registry behind htpasswd: pushes and pulls need `docker login`'s stored credentials."""
    with _serve_registry(tmp_path_factory.mktemp("login-registry"), login=True) as address:
        yield address


class StallingLink:
    """A TCP relay to `upstream` that forwards the first `budget` bytes sent through it (towards
    `upstream`, a push; or from it with `downstream`, a pull), then stops forwarding (connections
    stay open, nothing moves): a proxy or link that hangs mid-transfer."""

    def __init__(self, upstream: str, budget: int, *, downstream: bool = False) -> None:
        import socket
        import threading

        self.upstream = upstream.rsplit(":", 1)[0], int(upstream.rsplit(":", 1)[1])
        self.budget = budget
        self.downstream = downstream
        self.sent = 0
        self.connections = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._open: list[Any] = []
        self._server = socket.socket()
        self._server.bind(("127.0.0.1", 0))
        self._server.listen()
        self._server.settimeout(0.2)
        self.address = f"127.0.0.1:{self._server.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import socket
        import threading

        while not self._stop.is_set():
            try:
                client, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:  # closed by close()
                return
            server = socket.create_connection(self.upstream)
            with self._lock:
                self.connections += 1
                self._open += [client, server]
            threading.Thread(target=self._pump, args=(client, server, not self.downstream), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, self.downstream), daemon=True).start()

    def _pump(self, src: Any, dst: Any, counted: bool) -> None:
        while not self._stop.is_set():
            if counted and self.sent >= self.budget:
                self._stop.wait(0.2)  # hang: read nothing more, forward nothing more
                continue
            try:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
            except OSError:
                break
            if counted:
                with self._lock:
                    self.sent += len(data)

    def close(self) -> None:
        self._stop.set()
        for sock in [self._server, *self._open]:
            with contextlib.suppress(OSError):
                sock.close()


def layer_table(cli: Any, image_id: str) -> list[tuple[str, str, int]]:
    """(diff ID, the step that made it, bytes) for each layer of an image, base first. The classic
    builder makes a layer for RUN, COPY and ADD; its other instructions make empty history entries."""
    made = []
    for entry in reversed(cli.api.history(image_id)):
        created = str(entry.get("CreatedBy") or "")
        if "#(nop) " in created and not any(k in created for k in ("COPY", "ADD")):
            continue
        text = created.split("#(nop) ", 1)[-1].replace("/bin/bash -o pipefail -c ", "RUN ").strip()
        if text.startswith(("COPY", "ADD")) and " in " in text:
            text = f"COPY to {text.rsplit(' in ', 1)[1].strip()}"  # "COPY dir:<hash> in /opt/venv"
        made.append((text[:48], int(entry.get("Size") or 0)))
    layers = cli.images.get(image_id).attrs["RootFS"]["Layers"]
    if len(made) != len(layers):
        return [(d, f"layer {i}", 0) for i, d in enumerate(layers)]
    made[0] = ("base image", made[0][1])
    return [(d, step, size) for d, (step, size) in zip(layers, made, strict=True)]


_EXTENSION_SETUP = """from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

setup(
    name="envbuild-addone",
    version="0.1",
    packages=["envbuild_addone"],
    ext_modules=[CppExtension("envbuild_addone._C", ["envbuild_addone/addone.cpp"])],
    cmdclass={"build_ext": BuildExtension},
)
"""
_EXTENSION_SOURCE = """#include <torch/extension.h>
torch::Tensor add_one(torch::Tensor x) { return x + 1; }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("add_one", &add_one); }
"""


def torch_extension_sdist(folder: Path) -> None:
    """envbuild_addone-0.1.tar.gz in `folder`: a C++ extension whose setup.py imports torch without
    declaring it, as torch-scatter's and apex's do (no pyproject.toml: setuptools' legacy backend)."""
    files = {
        "setup.py": _EXTENSION_SETUP,
        "PKG-INFO": "Metadata-Version: 2.1\nName: envbuild-addone\nVersion: 0.1\n",
        "envbuild_addone/__init__.py": "import torch\nfrom envbuild_addone._C import add_one\n",
        "envbuild_addone/addone.cpp": _EXTENSION_SOURCE,
    }
    folder.mkdir()
    with tarfile.open(folder / "envbuild_addone-0.1.tar.gz", "w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"envbuild_addone-0.1/{name}")
            info.size, info.mtime = len(data), 315532800
            tar.addfile(info, io.BytesIO(data))
