"""`envbuild build` against the real engine, asserted from the engine itself."""

from __future__ import annotations

import hashlib
import io
import json
import re
import shlex
import shutil
import tarfile
from pathlib import Path
from typing import Any

import pytest

from envbuild import lockfile
from envbuild.names import canonical, content_digest

from .conftest import BASE, WHEELS, envbuild, host_only_certs, local_build

pytestmark = pytest.mark.e2e


def _run(cli: Any, image: str, *cmd: str) -> str:
    return str(cli.containers.run(image, list(cmd), remove=True).decode())


def test_labels_and_both_tags(docker_client: Any, built_cpu: dict[str, Any], e2e_project: Path, repo_name: str) -> None:
    lock_path = e2e_project / "lockfiles" / "cpu-py311" / "requirements.lock"
    lock_sha = hashlib.sha256(lock_path.read_bytes()).hexdigest()
    moving = docker_client.images.get(f"{repo_name}:cpu-py311")
    labels = moving.labels
    # the immutable tag names everything that reached the image: the lockfile and the image digest
    apt_sha = hashlib.sha256((lock_path.parent / "apt.lock").read_bytes()).hexdigest()
    assert labels["io.envbuild.apt-lock-sha256"] == apt_sha
    content = content_digest(lock_sha, labels["io.envbuild.image-digest"], apt_sha)
    assert labels["io.envbuild.content-digest"] == content
    immutable = docker_client.images.get(f"{repo_name}:cpu-py311-{content[:12]}")
    assert moving.id == immutable.id == built_cpu["image_id"]
    assert labels["io.envbuild.lock-sha256"] == lock_sha
    assert labels["io.envbuild.profile"] == "cpu-py311"
    assert (labels["io.envbuild.python"], labels["io.envbuild.torch"], labels["io.envbuild.numpy"]) == (
        "3.11",
        "2.13.0",
        "2.1.3",
    )
    assert labels["io.envbuild.accelerator"] == "cpu"
    assert len(labels["io.envbuild.image-digest"]) == 64
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", labels["org.opencontainers.image.created"])
    for key in ("version", "revision", "source", "title"):
        assert labels[f"org.opencontainers.image.{key}"]
    assert labels["io.envbuild.smoke"] == "passed"
    assert labels["io.envbuild.smoke.tested-image"] == built_cpu["built_image_id"]


def test_default_user_is_not_root(docker_client: Any, built_cpu: dict[str, Any]) -> None:
    image = docker_client.images.get(built_cpu["image_id"])
    assert image.attrs["Config"]["User"] == "1000:1000"
    assert _run(docker_client, built_cpu["image_id"], "id", "-u").strip() == "1000"
    assert image.attrs["Config"]["WorkingDir"] == "/workspace"


_ZOMBIES = """
import os, subprocess, time
# sh leaves a sleep behind and exits: the orphan goes to PID 1, which must reap it once it ends
subprocess.Popen(["sh", "-c", "sleep 0.2 & exit 0"]).wait()
time.sleep(1.5)
stats = [open(f"/proc/{p}/stat").read() for p in os.listdir("/proc") if p.isdigit()]
print(sum(1 for s in stats if s.rsplit(")", 1)[1].split()[0] == "Z"))
"""


def test_docker_stop_stops_the_command_and_orphans_are_reaped(docker_client: Any, built_cpu: dict[str, Any]) -> None:
    """Python as PID 1 ignored SIGTERM: `docker stop` (or a Kubernetes eviction) waited its whole
    grace period, then SIGKILLed the job with no chance to clean up (10.2 s here, exit 137); and
    nothing reaped orphaned processes. tini is the image's PID 1 now."""
    import time

    image = docker_client.images.get(built_cpu["image_id"])
    assert image.attrs["Config"]["Entrypoint"] == ["/usr/bin/tini", "-s", "--", "/opt/envbuild/entrypoint"]
    job = docker_client.containers.run(
        built_cpu["image_id"], ["python", "-c", "import time; print('up', flush=True); time.sleep(600)"], detach=True
    )
    try:
        deadline = time.monotonic() + 60
        while b"up" not in job.logs() and time.monotonic() < deadline:
            time.sleep(0.2)
        t0 = time.monotonic()
        job.stop(timeout=30)
        took = time.monotonic() - t0
        job.reload()
        assert job.attrs["State"]["ExitCode"] == 143, job.attrs["State"]  # 128 + SIGTERM, not 137 (SIGKILL)
        assert took < 10, f"docker stop took {took:.1f} s"
    finally:
        job.remove(force=True)
    assert _run(docker_client, built_cpu["image_id"], "python", "-c", _ZOMBIES).strip() == "0"


_CACHE = (
    "import getpass, os, pathlib; d = pathlib.Path.home() / '.cache' / 'envbuild-test'; "
    "d.mkdir(parents=True, exist_ok=True); print(os.environ['HOME'], d.is_dir(), getpass.getuser())"
)


@pytest.mark.parametrize(
    ("user", "home", "name"),
    [("4242:4242", "/tmp", "uid4242"), (None, "/home/envbuild", "envbuild"), ("0", "/root", "root")],
    ids=["uid", "image-user", "root"],
)
def test_every_user_gets_a_writable_home_and_a_name(
    docker_client: Any, built_cpu: dict[str, Any], user: str | None, home: str, name: str
) -> None:
    """`docker run -u "$(id -u):$(id -g)"` (a host user's own files in a mounted folder) or
    Kubernetes' runAsUser give a uid with no passwd entry HOME=/, and `~/.cache` failed: Hugging
    Face datasets said `PermissionError: [Errno 13] Permission denied: '/.cache'`. Nor had it a
    name: getpass.getuser() raised KeyError, which torch.compile hits before torch 2.13. A home and
    a name that work stay as they are."""
    out = docker_client.containers.run(built_cpu["image_id"], ["python", "-c", _CACHE], user=user, remove=True)
    assert out.decode().split() == [home, "True", name]


def test_pip_freeze_equals_the_lockfile(docker_client: Any, built_cpu: dict[str, Any], e2e_project: Path) -> None:
    pins = lockfile.parse_requirements((e2e_project / "lockfiles" / "cpu-py311" / "requirements.lock").read_text())
    frozen = _run(docker_client, built_cpu["image_id"], "python", "-m", "pip", "freeze", "--all")
    installed = {}
    for line in frozen.splitlines():
        name, _, version = line.partition("==")
        installed[canonical(name)] = version
    installed.pop("pip")  # the venv's own installer, not part of the environment
    assert installed == {p.name: p.version for p in pins.values()}


def _layer_members(cli: Any, image_id: str) -> list[tuple[str, bytes | None]]:
    blob = b"".join(cli.images.get(image_id).save(named=False))
    found = []
    with tarfile.open(fileobj=io.BytesIO(blob)) as outer:
        for member in outer.getmembers():
            if not member.name.endswith("layer.tar"):
                continue
            with tarfile.open(fileobj=outer.extractfile(member)) as layer:
                for inner in layer.getmembers():
                    data = None
                    if inner.isfile() and inner.size < 2_000_000 and inner.name.endswith((".crt", ".pem")):
                        data = layer.extractfile(inner).read()  # type: ignore[union-attr]
                    found.append((inner.name, data))
    return found


def test_no_ca_bundle_pip_cache_or_wheels_in_any_layer(docker_client: Any, built_cpu: dict[str, Any]) -> None:
    members = _layer_members(docker_client, built_cpu["image_id"])
    names = [n for n, _ in members]
    assert len(names) > 1000  # the layers really were read
    assert not [n for n in names if n.endswith("ca-bundle.crt") or "tmp/envbuild" in n]
    assert not [n for n in names if n.endswith(".whl")]
    assert not [n for n in names if "/.cache/pip" in n or n.startswith("root/.cache")]
    secret_certs = host_only_certs(docker_client, built_cpu["image_id"])
    for name, data in members:
        if data:
            assert not any(c in data for c in secret_certs), f"the host's CA certificate is in {name}"
    history = json.dumps(docker_client.images.get(built_cpu["image_id"]).history())
    assert "ca-bundle" not in history.replace("/tmp/envbuild/certs/ca-bundle.crt", "") or "COPY certs" not in history


def test_no_downloaded_debs_beyond_what_the_base_had(docker_client: Any, built_cpu: dict[str, Any]) -> None:
    # the debootstrapped base has no docker-clean hook: without `apt-get clean` the runtime stage
    # kept every .deb it installed (~80 MB on this base)
    listing = ["bash", "-c", "ls /var/cache/apt/archives/ | grep '[.]deb$' || true"]
    in_image = set(_run(docker_client, built_cpu["image_id"], *listing).split())
    in_base = set(_run(docker_client, BASE, *listing).split())
    assert in_image <= in_base, sorted(in_image - in_base)[:5]


def test_the_venv_holds_no_file_that_says_which_uv_built_it(docker_client: Any, built_cpu: dict[str, Any]) -> None:
    """uv leaves an empty /opt/venv/.lock whose mode changed between uv releases (0777, then 0666):
    with it, one lockfile built on two hosts gave two environments. The layer steps remove it."""
    listing = _run(docker_client, built_cpu["image_id"], "ls", "-A", "/opt/venv").split()
    assert "pyvenv.cfg" in listing  # the folder really was listed
    assert ".lock" not in listing, listing


def test_torch_ships_without_its_cpp_test_executables_but_with_its_headers(
    docker_client: Any, built_cpu: dict[str, Any]
) -> None:
    """torch/test (PyTorch's gtest binaries, ~85 MB, pytorch/pytorch#23776) does not ship; what a user
    builds C++ extensions with does."""
    probe = (
        "import os, torch, torch.utils.cpp_extension as ext; "
        "root = os.path.dirname(torch.__file__); "
        "print(os.path.exists(os.path.join(root, 'test')), "
        "all(os.path.isfile(os.path.join(d, 'torch', 'extension.h')) for d in ext.include_paths()[:1]))"
    )
    assert _run(docker_client, built_cpu["image_id"], "python", "-c", probe).split() == ["False", "True"]


def test_the_step_where_the_layers_meet_fails_when_pip_check_does(
    docker_client: Any, built_cpu: dict[str, Any]
) -> None:
    """`pip check` runs in the background beside the manifest merge (`wait $!` ends the step with its
    code): the image's own step, run again on an environment whose torch wants a package that is not
    installed, must fail and say which. The same step on the intact environment passes."""
    history = docker_client.images.get(built_cpu["image_id"]).history()
    made = [str(h["CreatedBy"]) for h in history if "pip check" in str(h.get("CreatedBy") or "")]
    assert len(made) == 1, made
    step = made[0].removeprefix("/bin/bash -o pipefail -c ")
    metadata = "/opt/venv/lib/python3.11/site-packages/torch-2.13.0+cpu.dist-info/METADATA"
    again = f"rm /usr/local/bin/envbuild-smoke && /bin/bash -o pipefail -c {shlex.quote(step)}; echo rc=$?"
    broken = f"sed -i '1a Requires-Dist: envbuild-missing-dep' {metadata} && {again}"
    for script, code in ((again, "rc=0"), (broken, "rc=1")):
        out = docker_client.containers.run(
            built_cpu["image_id"], ["bash", "-c", script], user="0", entrypoint=[], remove=True, stderr=True
        ).decode()
        assert out.strip().endswith(code), out[-2000:]
    assert "requires envbuild-missing-dep, which is not installed" in out, out[-2000:]


def test_the_builder_stage_the_engine_keeps_as_cache_is_labelled_and_kept_by_prune(
    built_cpu: dict[str, Any], e2e_project: Path
) -> None:
    listed = envbuild("images", "cpu-py311", "--prune", "--dry-run", "--json", cwd=e2e_project)
    assert listed.returncode == 0, listed.stderr
    caches = [r for r in json.loads(listed.stdout)["images"] if r["stage"] == "builder"]
    assert caches, "the real build left no labelled builder-stage image"
    newest = caches[0]  # newest first
    assert (newest["state"], newest["keep"], newest["tags"]) == ("current", True, [])


def test_unchanged_rebuild_is_fully_cached(built_cpu: dict[str, Any], e2e_project: Path, repo_name: str) -> None:
    res = envbuild(*local_build("cpu-py311", repo_name), "--json", "--no-smoke", cwd=e2e_project)
    assert res.returncode == 0, res.stderr[-3000:]
    again = json.loads(res.stdout)
    assert again["steps"] > 20
    assert again["ran_steps"] == 0
    assert again["built_image_id"] == built_cpu["built_image_id"]


def test_an_unchanged_rebuild_does_not_run_the_smoke_test_again_unless_its_record_falls_short(
    built_cpu: dict[str, Any], e2e_project: Path, repo_name: str
) -> None:
    """`envbuild build cpu-py311` with nothing changed ran the whole smoke test again on the very
    image that had passed it: 24 s of its 26 s. The report it keeps for that image stands now."""
    res = envbuild(*local_build("cpu-py311", repo_name), "--json", cwd=e2e_project)
    assert res.returncode == 0, res.stderr[-3000:]
    again = json.loads(res.stdout)
    assert again["built_image_id"] == built_cpu["built_image_id"] and again["image_id"] == built_cpu["image_id"]
    assert again["smoke"]["reused"] is True and again["smoke"]["passed"] is True
    assert "smoke" not in again["timings"]
    assert again["tags"] == built_cpu["tags"]
    res = envbuild(*local_build("cpu-py311", repo_name), cwd=e2e_project, env={"COLUMNS": "200"})
    assert res.returncode == 0, res.stderr[-3000:]
    assert "smoke passed before on this very image, not run again (.envbuild/cpu-py311/smoke.json)" in res.stdout
    # A report the project keeps of some checks only (or edited to say so) is not the whole test: it runs.
    kept = e2e_project / ".envbuild" / "cpu-py311" / "smoke.json"
    report = json.loads(kept.read_text())
    kept.write_text(json.dumps({**report, "only": ["imports"]}))
    res = envbuild(*local_build("cpu-py311", repo_name), "--json", cwd=e2e_project)
    assert res.returncode == 0, res.stderr[-3000:]
    ran = json.loads(res.stdout)
    assert "reused" not in ran["smoke"] and ran["smoke"]["passed"] and "smoke" in ran["timings"]
    assert ran["image_id"] == built_cpu["image_id"]  # the same record: the same labelled image
    assert "only" not in json.loads(kept.read_text())  # the whole run's report again


def test_a_nearly_full_engine_disk_is_warned_of_before_the_base_pull(
    built_cpu: dict[str, Any], e2e_project: Path, repo_name: str, cli: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The real build, in this process; only the engine's free space is read as 1 GB (this disk
    # has more than a CPU build needs, and filling it for a test would endanger the suite).
    from envbuild import engine

    real_disk = engine.disk
    monkeypatch.setattr(engine, "disk", lambda info: (real_disk(info)[0], 10**9))
    monkeypatch.chdir(e2e_project)
    res = cli(*local_build("cpu-py311", repo_name), "--no-smoke")
    assert res.code == 0, res.err[-3000:]
    lines = res.err.splitlines()
    said = [i for i, line in enumerate(lines) if "warning: the engine's disk has 1.0 GB free" in line]
    assert said, res.err[-3000:]
    warned = said[0]
    assert "a CPU build needs about 4 GB" in lines[warned] and "envbuild images --prune" in lines[warned]
    assert warned < next(i for i, line in enumerate(lines) if "] base: " in line)
    res = cli(*local_build("cpu-py311", repo_name), "--no-smoke", "--json")
    assert res.code == 0, res.err[-3000:]
    report = json.loads(res.out)
    assert len(report["warnings"]) == 1 and report["warnings"][0].startswith("the engine's disk has 1.0 GB free")
    assert report["built_image_id"] == built_cpu["built_image_id"]  # a warning, not a refusal


def _copy_project(source: Path, dest: Path) -> Path:
    """A project of its own to break, with the session's profiles and lockfiles."""
    for part in ("profiles", "lockfiles", "checks"):
        shutil.copytree(source / part, dest / part)
    return dest


def test_tampered_hash_fails_naming_the_package_and_moves_no_tag(
    docker_client: Any, built_cpu: dict[str, Any], e2e_project: Path, repo_name: str, tmp_path: Path
) -> None:
    proj = _copy_project(e2e_project, tmp_path / "tampered")
    lock_path = proj / "lockfiles" / "cpu-py311" / "requirements.lock"
    text = lock_path.read_text()
    head, numpy_block, rest = re.split(r"(?m)^(numpy==.*?)(?=^\S)", text, maxsplit=1, flags=re.S)
    numpy_block = re.sub(r"sha256:[0-9a-f]{64}", "sha256:" + "0" * 64, numpy_block)
    tampered = head + numpy_block + rest
    lock_path.write_text(tampered)
    before = docker_client.images.get(f"{repo_name}:cpu-py311").id
    # a hand edit is caught before the build: the body no longer matches the resolution it records
    res = envbuild(*local_build("cpu-py311", repo_name), cwd=proj)
    assert res.returncode == 2 and "was edited by hand" in res.stderr, res.stderr[-3000:]
    # one that also rewrote the record is consistent, and still wrong: pip's hash check in the image stops it
    record = lockfile.read_record(tampered)
    resolution = lockfile.resolution_id(lockfile.parse_requirements(tampered), record.format)
    lock_path.write_text(tampered.replace(record.resolution, resolution))
    pylock = lock_path.with_name("pylock.toml")
    pylock_text = pylock.read_text().replace(record.resolution, resolution)
    pylock.write_text(pylock_text)
    # pylock.toml still pins numpy's real hashes, which requirements.lock no longer has: an edit too
    res = envbuild(*local_build("cpu-py311", repo_name), cwd=proj)
    assert res.returncode == 2 and "pylock.toml was edited by hand" in res.stderr, res.stderr[-3000:]
    # both files rewritten alike: pip's hash check in the image stops it
    head, numpy_pkg, rest = re.split(
        r'(?ms)^(\[\[packages\]\]\nname = "numpy"\n.*?)(?=^\[\[packages\]\]|\Z)', pylock_text
    )
    pylock.write_text(head + re.sub(r'sha256 = "[0-9a-f]{64}"', 'sha256 = "' + "0" * 64 + '"', numpy_pkg) + rest)
    res = envbuild(*local_build("cpu-py311", repo_name), cwd=proj)
    assert res.returncode == 7, res.stderr[-3000:]
    assert "hash mismatch for numpy==2.1.3" in res.stderr
    assert "step:" in res.stderr and "full log:" in res.stderr
    assert docker_client.images.get(f"{repo_name}:cpu-py311").id == before


def test_unknown_apt_package_names_the_field_and_moves_no_tag(
    docker_client: Any, built_cpu: dict[str, Any], e2e_project: Path, repo_name: str, tmp_path: Path
) -> None:
    proj = _copy_project(e2e_project, tmp_path / "apt")
    (proj / "lockfiles" / "cpu-py311" / "apt.lock").unlink()  # OS packages not locked: apt runs in the build
    with (proj / "profiles" / "cpu-py311.yaml").open("a") as fh:
        fh.write('apt: ["envbuild-no-such-package"]\n')
    before = docker_client.images.get(f"{repo_name}:cpu-py311").id
    res = envbuild(*local_build("cpu-py311", repo_name), cwd=proj)
    assert res.returncode == 7, res.stderr[-3000:]
    assert (
        "error: build of cpu-py311 failed: apt has no package 'envbuild-no-such-package' "
        "in the base image's distribution" in res.stderr
    )
    assert "fix: fix or remove it in the `apt:` list of cpu-py311's profile" in res.stderr
    # The legacy builder wraps a step's stderr in colour codes; neither the message nor the log keeps them.
    log = (proj / ".envbuild" / "cpu-py311" / "build.log").read_text()
    assert "E: Unable to locate package envbuild-no-such-package" in log
    assert "\x1b" not in res.stderr and "\x1b" not in log
    assert docker_client.images.get(f"{repo_name}:cpu-py311").id == before


def test_engine_unreachable(e2e_project: Path) -> None:
    res = envbuild(
        "build",
        "cpu-py311",
        "--find-links",
        WHEELS,
        cwd=e2e_project,
        env={"DOCKER_HOST": "unix:///nonexistent/docker.sock"},
    )
    assert res.returncode == 5
    assert "cannot reach the Docker engine at unix:///nonexistent/docker.sock (from DOCKER_HOST)" in res.stderr
    assert "DOCKER_HOST" in res.stderr and "Traceback" not in res.stderr


def test_missing_base_image(docker_client: Any, e2e_project: Path) -> None:
    res = envbuild(
        "build", "cpu-py311", "--base", "envbuild-test/no-such-base:1", "--find-links", WHEELS, cwd=e2e_project
    )
    assert res.returncode == 6
    assert "base image envbuild-test/no-such-base:1 is not present and could not be pulled" in res.stderr


def test_stale_lock_stops_the_build_with_the_lock_command(e2e_project: Path, tmp_path: Path) -> None:
    proj = _copy_project(e2e_project, tmp_path / "stale")
    prof = proj / "profiles" / "cpu-py311.yaml"
    prof.write_text(prof.read_text().replace('"2.1.3"', '"2.1.2"'))
    res = envbuild("build", "cpu-py311", cwd=proj)
    assert res.returncode == 2 and "run `envbuild lock cpu-py311`" in res.stderr


def test_buildkit_builder_builds_the_same_dockerfile(
    docker_client: Any, built_cpu: dict[str, Any], e2e_project: Path, repo_name: str
) -> None:
    had_cache = bool(docker_client.df().get("BuildCache"))
    try:
        _buildkit_builds_the_same_image(docker_client, built_cpu, e2e_project, repo_name)
    finally:
        if not had_cache:  # BuildKit's cache (~1.4 GB) is all this test's: it goes with the test
            docker_client.api.prune_builds(all=True)


def _buildkit_builds_the_same_image(
    docker_client: Any, built_cpu: dict[str, Any], e2e_project: Path, repo_name: str
) -> None:
    res = envbuild(
        *local_build("cpu-py311", f"{repo_name}-bk"), "--builder", "buildkit", "--no-smoke", "--json", cwd=e2e_project
    )
    assert res.returncode == 0, res.stderr[-3000:]
    result = json.loads(res.stdout)
    image = docker_client.images.get(f"{repo_name}-bk:cpu-py311-untested")
    assert image.id == result["image_id"]
    assert image.labels["io.envbuild.lock-sha256"] == built_cpu["labels"]["io.envbuild.lock-sha256"]
    assert image.attrs["Config"]["User"] == "1000:1000"
    assert result["steps"] >= 5  # BuildKit numbers the steps per stage ([runtime 3/7])
    frozen = docker_client.containers.run(
        image.id, ["python", "-c", "import torch; print(torch.__version__)"], remove=True
    )
    assert frozen.decode().strip() == "2.13.0+cpu"
    docker_client.images.remove(image.id, force=True, noprune=True)
