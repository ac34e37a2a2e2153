"""envbuild in a team: several projects on one engine, and `envbuild run` for real training work."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ..conftest import REPO
from .conftest import BASE, derived, envbuild, local_build

pytestmark = pytest.mark.e2e

TRAIN = (
    "import torch; torch.manual_seed(0); m = torch.nn.Linear(4, 2); opt = torch.optim.SGD(m.parameters(), lr=0.1); "
    "x = torch.randn(16, 4); [opt.zero_grad() or m(x).square().mean().backward() or opt.step() for _ in range(5)]; "
    "torch.save(m.state_dict(), '/workspace/ckpt.pt'); print('saved')"
)


def test_a_training_run_saves_a_checkpoint_the_host_user_owns(
    built_cpu: dict[str, Any], e2e_project: Path, repo_name: str, tmp_path: Path
) -> None:
    """It failed with "Permission denied": the job ran as uid 1000 in a folder of the host user's."""
    work = tmp_path / "job"
    work.mkdir()
    res = envbuild(
        "run", "cpu-py311", "--project", str(e2e_project), "--tag", repo_name, "-e", "OMP_NUM_THREADS=1",
        "--", "python", "-c", TRAIN, cwd=work, timeout=300,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "saved"
    ckpt = work / "ckpt.pt"
    assert ckpt.stat().st_uid == os.getuid() and ckpt.stat().st_gid == os.getgid()
    import zipfile

    assert zipfile.is_zipfile(ckpt)  # torch.save's format: the host reads it back


def test_what_a_job_downloads_to_its_cache_is_there_for_the_next_run(
    built_cpu: dict[str, Any], e2e_project: Path, repo_name: str, tmp_path: Path
) -> None:
    """HOME is /tmp in the container, so Hugging Face's and torch.hub's downloads went with each
    container and every run fetched its model again. The job's ~/.cache is a host folder now."""
    cache = tmp_path / "run-cache"
    env = {"ENVBUILD_RUN_CACHE": str(cache)}
    hub = "import os, torch; p = os.path.join(torch.hub.get_dir(), 'weights.bin')"
    first = ["python", "-c", f"{hub}; os.makedirs(os.path.dirname(p)); open(p, 'w').write('w'); print(p)"]
    again = ["python", "-c", f"{hub}; print(open(p).read())"]
    base = ["run", "cpu-py311", "--project", str(e2e_project), "--tag", repo_name, "--"]
    res = envbuild(*base, *first, cwd=tmp_path, env=env, timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "/tmp/.cache/torch/hub/weights.bin"
    assert (cache / "torch" / "hub" / "weights.bin").stat().st_uid == os.getuid()
    res = envbuild(*base, *again, cwd=tmp_path, env=env, timeout=300)
    assert (res.returncode, res.stdout.strip()) == (0, "w"), res.stderr
    none = ["run", "cpu-py311", "--project", str(e2e_project), "--tag", repo_name, "--download-cache", "none", "--"]
    res = envbuild(*none, *again, cwd=tmp_path, env=env, timeout=300)
    assert res.returncode == 1 and "No such file" in res.stderr


def test_what_torch_compile_built_in_one_run_is_found_by_the_next(
    built_cpu: dict[str, Any], e2e_project: Path, repo_name: str, tmp_path: Path
) -> None:
    """Inductor keeps its compiled graphs in /tmp/torchinductor_USER, which went with each
    container: every run compiled its model from nothing (17 s against 10 s here for one small
    function). They are in the download cache now, and the second run's compile is a cache hit."""
    cache = tmp_path / "run-cache"
    job = (
        "import torch; from torch._dynamo.utils import counters; "
        "f = torch.compile(lambda x: (x.sin() * 2).sum()); f(torch.ones(8)); "
        "print(sorted(k for k in counters['inductor'] if k.startswith('fxgraph_cache')))"
    )
    base = ["run", "cpu-py311", "--project", str(e2e_project), "--tag", repo_name, "--", "python", "-c", job]
    env = {"ENVBUILD_RUN_CACHE": str(cache)}
    first = envbuild(*base, cwd=tmp_path, env=env, timeout=300)
    assert (first.returncode, first.stdout.strip()) == (0, "['fxgraph_cache_miss']"), first.stderr
    assert (cache / "torchinductor" / "fxgraph").is_dir()
    again = envbuild(*base, cwd=tmp_path, env=env, timeout=300)
    assert (again.returncode, again.stdout.strip()) == (0, "['fxgraph_cache_hit']"), again.stderr


def test_run_says_when_the_image_is_not_a_build_of_todays_profile(
    built_cpu: dict[str, Any], e2e_project: Path, repo_name: str, tmp_path: Path
) -> None:
    """A profile edited (or re-locked) and not built yet: `run` started the old image without a
    word, so the job ran without the new setting or with the old packages, and `smoke NAME` tested
    it as if it were today's; `status` said stale."""
    profile = e2e_project / "profiles" / "cpu-py311.yaml"
    before = profile.read_text()
    base = ["run", "cpu-py311", "--project", str(e2e_project), "--tag", repo_name, "--"]
    job = ["python", "-c", "import os; print(os.environ.get('OMP_NUM_THREADS'))"]
    res = envbuild(*base, *job, cwd=tmp_path, timeout=300)
    assert res.returncode == 0 and "not built from today's" not in res.stderr, res.stderr
    try:
        profile.write_text(before + 'env: {OMP_NUM_THREADS: "3"}\n')
        res = envbuild(*base, *job, cwd=tmp_path, timeout=300)
        assert res.returncode == 0, res.stderr
        assert res.stdout.strip() == "None"  # the old image, as asked: it runs, and says so
        assert f"{repo_name}:cpu-py311 was not built from today's profile and lockfiles" in res.stderr
        assert "image inputs digest" in res.stderr and "envbuild build cpu-py311" in res.stderr
        assert "(it differs in the profile's fields)" in res.stderr
        smoke = ["smoke", "cpu-py311", "--only", "versions", "--project", str(e2e_project), "--tag", repo_name]
        res = envbuild(*smoke, cwd=tmp_path, timeout=300)
        assert res.returncode == 0, res.stderr  # it tests the image it was given: the old one, and says so
        assert f"{repo_name}:cpu-py311 was not built from today's profile and lockfiles" in res.stderr
    finally:
        profile.write_text(before)


def test_a_docker_volume_by_name_is_mounted(
    docker_client: Any, built_cpu: dict[str, Any], e2e_project: Path, repo_name: str, tmp_path: Path
) -> None:
    """`-v NAME:/data`, a docker volume, was refused ("NAME does not exist") as a missing folder."""
    volume = f"{repo_name.replace('/', '-')}-data"
    base = ["run", "cpu-py311", "--project", str(e2e_project), "--tag", repo_name, "--user", "0:0", "-v"]
    try:
        res = envbuild(*base, f"{volume}:/data", "--", "sh", "-c", "echo kept > /data/f", cwd=tmp_path, timeout=300)
        assert res.returncode == 0, res.stderr
        assert f"mounts the docker volume {volume}" in res.stderr
        res = envbuild(*base, f"{volume}:/data:ro", "--", "cat", "/data/f", cwd=tmp_path, timeout=300)
        assert (res.returncode, res.stdout.strip()) == (0, "kept"), res.stderr
    finally:
        import docker

        with contextlib.suppress(docker.errors.NotFound):
            docker_client.volumes.get(volume).remove(force=True)


JOB_TRAPPING_SIGTERM = (
    "import signal, sys, time\n"
    "def stop(signum, frame):\n"
    "    print('checkpointed on', signum, flush=True); sys.exit(7)\n"
    "signal.signal(signal.SIGTERM, stop)\n"
    "print('started', flush=True); time.sleep(120)\n"
)


def test_sigterm_to_run_reaches_the_job_and_no_container_is_left(
    docker_client: Any, built_cpu: dict[str, Any], e2e_project: Path, repo_name: str, tmp_path: Path
) -> None:
    """A CI timeout or a scheduler's SIGTERM to `envbuild run`: the job gets it (and may save a
    checkpoint), its exit code is run's. Before, envbuild SIGKILLed the docker CLI, said it had
    cleaned up, and the container ran on (GPUs and all) until the job ended by itself."""
    import signal
    import subprocess
    import sys
    import time

    work = tmp_path / "job"
    work.mkdir()
    (work / "job.py").write_text(JOB_TRAPPING_SIGTERM)
    argv = [sys.executable, "-m", "envbuild", "run", "cpu-py311", "--project", str(e2e_project), "--tag", repo_name]
    mine = {"ancestor": repo_name + ":cpu-py311"}
    proc = subprocess.Popen(
        [*argv, "--", "python", "job.py"], cwd=work, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "started"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
        assert (proc.returncode, out.strip()) == (7, "checkpointed on 15"), err
        deadline = time.monotonic() + 20  # --rm: the engine removes it as the job ends
        while docker_client.containers.list(all=True, filters=mine) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert docker_client.containers.list(all=True, filters=mine) == []
    finally:
        proc.kill()
        for left in docker_client.containers.list(all=True, filters=mine):  # what a failure here left
            left.remove(force=True)


def _status(cwd: Path) -> dict[str, Any]:
    res = envbuild("status", "cpu-py311", "--json", cwd=cwd)
    assert res.returncode == 0, res.stderr
    row: dict[str, Any] = json.loads(res.stdout)["profiles"][0]
    return row


def test_a_second_project_never_runs_the_first_projects_image(
    built_cpu: dict[str, Any], repo_name: str, tmp_path: Path, docker_client: Any
) -> None:
    second = tmp_path / "team-project"
    for part in ("profiles", "lockfiles", "checks"):
        shutil.copytree(REPO / part, second / part)
    # its own repository by default: the first project's image is simply not its image
    res = envbuild("run", "cpu-py311", "--", "python", "-c", "print('wrong image')", cwd=second)
    assert res.returncode == 2 and "wrong image" not in res.stdout
    assert "no image envbuild/team-project:cpu-py311" in res.stderr
    # a foreign image under its tag (retagged by hand): run refuses it, so status must not say ready
    foreign = "envbuild/team-project:cpu-py311"
    docker_client.images.get(BASE).tag(foreign)
    try:
        row = _status(second)
        assert (row["image"], row["image_ref"], row["next"]) == ("foreign", foreign, "envbuild build cpu-py311")
        assert "run refuses it" in row["image_problem"]
        res = envbuild("run", "cpu-py311", "--", "python", "-c", "print('wrong image')", cwd=second)
        assert res.returncode == 2 and "is not an envbuild image of cpu-py311" in res.stderr
    finally:
        docker_client.images.remove(foreign)
    # sharing the repository by hand: the image's labels say another project built it, so it is refused
    (second / "envbuild.toml").write_text(f'[envbuild]\nrepository = "{repo_name}"\n')
    res = envbuild("run", "cpu-py311", "--", "python", "-c", "print('wrong image')", cwd=second)
    assert res.returncode == 2 and "wrong image" not in res.stdout
    assert "was built by another project" in res.stderr
    res = envbuild("smoke", "cpu-py311", cwd=second)
    assert res.returncode == 2 and "was built by another project" in res.stderr
    row = _status(second)  # the first project's tested image is not this project's
    assert (row["image"], row["next"]) == ("foreign", "envbuild build cpu-py311")


def test_run_says_so_when_the_profiles_tag_names_an_image_built_from_the_tested_one(
    built_cpu: dict[str, Any], e2e_project: Path, repo_name: str, docker_client: Any
) -> None:
    """`docker build -t REPO:NAME` FROM the tested image (a team's tweak) keeps every label: run
    started it with no word that it is not what passed the smoke test (push refuses it)."""
    over = derived(docker_client, built_cpu["image_id"], 'ENV TEAM_TWEAK="1"')
    over.tag(repo_name, tag="cpu-py311")
    try:
        res = envbuild(
            "run", "cpu-py311", "--tag", repo_name, "--", "python", "-c", "import os; print(os.environ['TEAM_TWEAK'])",
            cwd=e2e_project,
        )  # fmt: skip
        assert res.returncode == 0 and res.stdout.strip() == "1", res.stderr
        assert f"note: {repo_name}:cpu-py311 is not the image that passed the smoke test" in res.stderr
        assert "`envbuild build cpu-py311` puts the tested one back" in res.stderr
    finally:
        docker_client.images.get(built_cpu["image_id"]).tag(repo_name, tag="cpu-py311")
        docker_client.images.remove(over.id, force=True, noprune=True)
    res = envbuild("run", "cpu-py311", "--tag", repo_name, "--", "true", cwd=e2e_project)
    assert res.returncode == 0 and "note:" not in res.stderr, res.stderr  # the tested image: nothing to say


def test_a_server_in_the_job_answers_on_localhost_through_publish(
    docker_client: Any, built_cpu: dict[str, Any], e2e_project: Path, repo_name: str, tmp_path: Path
) -> None:
    """A notebook, TensorBoard or a model server started with `run` could not be reached: run had no
    -p. Published on 127.0.0.1 unless an address is given, so it answers this user only."""
    import signal
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    work = tmp_path / "job"
    work.mkdir()
    (work / "hello.txt").write_text("from the job\n")
    argv = [sys.executable, "-m", "envbuild", "run", "cpu-py311", "--project", str(e2e_project), "--tag", repo_name]
    server = ["python", "-m", "http.server", "8000", "--bind", "0.0.0.0"]  # noqa: S104  # the container's own interfaces
    argv += ["-p", f"{port}:8000", "--", *server]
    mine = {"ancestor": repo_name + ":cpu-py311"}
    proc = subprocess.Popen(argv, cwd=work, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        body, deadline = b"", time.monotonic() + 60
        while not body and time.monotonic() < deadline:
            try:
                body = urllib.request.urlopen(f"http://127.0.0.1:{port}/hello.txt", timeout=2).read()
            except OSError:
                time.sleep(0.5)
        assert body == b"from the job\n"
        (running,) = docker_client.containers.list(filters=mine)
        bound = running.attrs["HostConfig"]["PortBindings"]["8000/tcp"]
        assert bound == [{"HostIp": "127.0.0.1", "HostPort": str(port)}]
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        assert f"container port 8000 is at 127.0.0.1:{port}" in err.decode()
    finally:
        proc.kill()
        for left in docker_client.containers.list(all=True, filters=mine):
            left.remove(force=True)


def test_a_build_that_takes_another_projects_tag_says_so(
    built_cpu: dict[str, Any], e2e_project: Path, repo_name: str, tmp_path: Path, docker_client: Any
) -> None:
    """Two projects in folders of one name share envbuild/<name> by default; each build moved the
    other's tag without a word, and that project's run then refused what its tag named."""
    from .conftest import local_build

    shared = repo_name + "-shared"
    docker_client.images.get(built_cpu["image_id"]).tag(shared, tag="cpu-py311")  # the first project's
    second = tmp_path / "team-project"
    for part in ("profiles", "lockfiles", "checks"):
        shutil.copytree(REPO / part, second / part)
    try:
        res = envbuild(*local_build("cpu-py311", shared), "--json", cwd=second, timeout=1200)
        assert res.returncode == 0, res.stderr[-3000:]
        said = f"{shared}:cpu-py311 named an image of another project (file://{e2e_project})"
        assert said in res.stderr
        assert any(said in text for text in json.loads(res.stdout)["warnings"])
        # its own build again: the tag is its own now, nothing to say
        res = envbuild(*local_build("cpu-py311", shared), cwd=second, timeout=1200)
        assert res.returncode == 0 and "another project" not in res.stderr, res.stderr[-3000:]
    finally:
        for image in docker_client.images.list(name=shared):
            for tag in image.tags:
                docker_client.images.remove(tag, force=True, noprune=image.id == built_cpu["image_id"])


def test_a_context_another_user_wrote_builds_from_the_same_cache(docker_client: Any, tmp_path: Path) -> None:
    """docker-py sent each file's owner in the context, and the classic builder keys a COPY on it:
    on one engine, a second user's build of a profile that another user had built (or a plain build
    after a `sudo` one) re-ran 26 of its 43 steps, the torch layer's install among them."""
    if os.geteuid() != 0:
        pytest.skip("files of another user need root to make (CI runs as root)")
    from envbuild.buildahead import context_archive

    ctx = tmp_path / "ctx"
    (ctx / "wheels").mkdir(parents=True)
    (ctx / "wheels" / "a.whl").write_bytes(os.urandom(64))  # new bytes each run: in no cache yet
    (ctx / "Dockerfile").write_text(f"FROM {BASE}\nCOPY wheels/ /w/\nRUN cat /w/a.whl > /copied\n")

    def build() -> str:
        with context_archive(str(ctx)) as archive:
            image, _ = docker_client.images.build(fileobj=archive, custom_context=True, rm=True, forcerm=True)
        return str(image.id)

    first = build()
    for path in [ctx, *ctx.rglob("*")]:
        os.chown(path, 4242, 4242)
    assert build() == first  # every step from the first build's cache: the RUN made no new image


@contextlib.contextmanager
def _engine_at(address: str) -> Iterator[str]:
    """The local engine, answering at tcp://ADDRESS:PORT as an engine on another machine would (a
    relay to its socket): envbuild tells a remote engine by its address alone."""
    import socket
    import threading

    server = socket.create_server((address, 0))
    stop = threading.Event()

    def pipe(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(1 << 16):
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def serve() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                client, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            engine_sock = socket.socket(socket.AF_UNIX)
            engine_sock.connect("/var/run/docker.sock")
            for a, b in ((client, engine_sock), (engine_sock, client)):
                threading.Thread(target=pipe, args=(a, b), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"tcp://{address}:{server.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(timeout=5)
        server.close()


def test_run_on_an_engine_elsewhere_says_whose_folders_the_job_sees(
    built_cpu: dict[str, Any], docker_client: Any, e2e_project: Path, repo_name: str, tmp_path: Path
) -> None:
    """DOCKER_HOST=ssh://gpu-box from a laptop: `run` mounted the laptop's folder path on gpu-box
    (empty there, or made by docker as root), so `python train.py` found no train.py, and the
    download cache was a root-owned folder the job could not write; it judged the laptop's GPU."""
    if not Path("/var/run/docker.sock").exists():
        pytest.skip("the relay needs the engine's default socket")
    # this host, by another name; an engine started where docker0 already was records no Gateway,
    # and the bridge's address is then its subnet's first
    ipam = docker_client.networks.get("bridge").attrs["IPAM"]["Config"][0]
    gateway = ipam.get("Gateway") or str(next(ipaddress.ip_network(ipam["Subnet"]).hosts()))
    work = tmp_path / "job"
    work.mkdir()
    (work / "train.py").write_text("print('trained')\n")
    with _engine_at(gateway) as url:
        res = envbuild(
            "run", "cpu-py311", "--project", str(e2e_project), "--tag", repo_name,
            "--", "sh", "-c", "python train.py; test -e /tmp/.cache && echo cache-mounted || echo no-cache",
            cwd=work, env={"DOCKER_HOST": url}, timeout=300,
        )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert f"note: the engine runs on {gateway}, not here: /workspace is {gateway}'s {work}" in res.stderr
    assert "no download cache (a folder here is not the job's)" in res.stderr
    # the "other machine" is this one, so the folder is there; no host folder was mounted as ~/.cache
    assert res.stdout.split() == ["trained", "no-cache"]


def test_another_clone_that_built_last_does_not_change_what_this_checkout_runs_or_pushes(
    built_cpu: dict[str, Any], docker_client: Any, e2e_project: Path, registry: str, repo_name: str
) -> None:
    """Two clones of one repository on a shared GPU box share REPO:NAME (one source, one repository).
    A clone on another branch (other lockfiles) that built last moved the tag, and this clone's
    `run` started that image (einops missing where the lockfile had it) and `push` published it
    as this checkout's cpu-py311, though its own tested build was still in the engine."""
    fake = "e" * 64
    other = derived(
        docker_client, built_cpu["image_id"],
        f'LABEL io.envbuild.content-digest="{fake}" io.envbuild.lock-sha256="{fake}"', "ENV OTHER_CLONE=1",
    )  # fmt: skip
    other.tag(repo_name, tag="cpu-py311")
    target = f"{registry}/envbuild/clones"
    try:
        res = envbuild(
            "run", "cpu-py311", "--tag", repo_name, "--",
            "python", "-c", "import os; print(os.environ.get('OTHER_CLONE', 'this checkout'))", cwd=e2e_project,
        )  # fmt: skip
        assert res.returncode == 0, res.stderr
        assert res.stdout.strip() == "this checkout"
        assert f"note: {repo_name}:cpu-py311 names another build" in res.stderr
        res = envbuild("push", "cpu-py311", "--tag", repo_name, "--registry", target, "--json", cwd=e2e_project)
        assert res.returncode == 0, res.stderr[-3000:]
        assert json.loads(res.stdout)["image_id"] == built_cpu["image_id"]
    finally:
        docker_client.images.get(built_cpu["image_id"]).tag(repo_name, tag="cpu-py311")
        docker_client.images.remove(other.id, force=True, noprune=True)
        for tag in ("cpu-py311", built_cpu["labels"]["org.opencontainers.image.version"]):
            with contextlib.suppress(Exception):
                docker_client.images.remove(f"{target}:{tag}", noprune=True)


def test_a_prune_keeps_the_tested_build_of_another_clone(
    built_cpu: dict[str, Any], docker_client: Any, e2e_project: Path, repo_name: str, tmp_path: Path
) -> None:
    """Bob's clone (its origin is this project: one source, one repository) builds cpu-py311 with one
    more variable. From this checkout his image is stale, and `images --prune` here removed his
    tested build, so his next `run` rebuilt it (a CUDA image: five minutes and 5.6 GB again). Once
    his clone is gone, his image is a leftover like any other."""
    bob = tmp_path / "bob"
    for part in ("profiles", "lockfiles", "checks"):
        shutil.copytree(e2e_project / part, bob / part)
    with (bob / "profiles" / "cpu-py311.yaml").open("a") as f:
        f.write('env:\n  OTHER_CLONE: "1"\n')
    for git in (["init", "-q"], ["remote", "add", "origin", str(e2e_project)]):
        subprocess.run(["git", *git], cwd=bob, check=True)
    try:
        res = envbuild(*local_build("cpu-py311", repo_name), "--json", cwd=bob)
        assert res.returncode == 0, res.stderr[-4000:]
        theirs = json.loads(res.stdout)["image_id"]
        assert theirs != built_cpu["image_id"]
        # Alice builds again (from the cache): the profile's tag is hers; his build keeps NAME-<digest>
        docker_client.images.get(built_cpu["image_id"]).tag(repo_name, tag="cpu-py311")
        res = envbuild("images", "cpu-py311", "--prune", "--dry-run", "--json", cwd=e2e_project)
        assert res.returncode == 0, res.stderr
        row = next(r for r in json.loads(res.stdout)["images"] if r["image_id"] == theirs)
        assert (row["state"], row["keep"]) == ("stale", True), row
        assert row["reason"] == f"current in the checkout at {bob}"
        shutil.rmtree(bob)
        res = envbuild("images", "cpu-py311", "--prune", "--dry-run", "--json", cwd=e2e_project)
        row = next(r for r in json.loads(res.stdout)["images"] if r["image_id"] == theirs)
        assert (row["keep"], row["reason"]) == (False, "removable"), row
    finally:
        docker_client.images.get(built_cpu["image_id"]).tag(repo_name, tag="cpu-py311")
