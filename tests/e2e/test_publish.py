"""Push, pull and verify against a real registry; matrix, workflow, doctor and run for real."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from envbuild import build, smokerecord

from ..conftest import REPO
from .conftest import REGISTRY_PASSWORD, REGISTRY_USER, derived, envbuild

pytestmark = pytest.mark.e2e


def test_round_trip_push_delete_pull(
    docker_client: Any, built_cpu: dict[str, Any], e2e_project: Path, repo_name: str, registry: str
) -> None:
    target = f"{registry}/envbuild/roundtrip"
    res = envbuild("push", "cpu-py311", "--tag", repo_name, "--registry", target, "--json", cwd=e2e_project)
    assert res.returncode == 0, res.stderr[-3000:]
    pushed = json.loads(res.stdout)
    lock_tag = next(r for r in pushed["refs"] if r != f"{target}:cpu-py311")
    assert pushed["digest"].startswith("sha256:") and lock_tag.startswith(f"{target}:cpu-py311-")
    # The registry itself has both tags.
    import urllib.request

    with urllib.request.urlopen(f"http://{registry}/v2/envbuild/roundtrip/tags/list") as resp:
        assert sorted(json.load(resp)["tags"]) == sorted(r.rsplit(":", 1)[1] for r in pushed["refs"])
    image_id = pushed["image_id"]
    for ref in pushed["refs"]:
        docker_client.images.remove(ref, noprune=True)
    kept = [t for t in docker_client.images.get(image_id).tags]
    for tag in kept:
        docker_client.images.remove(tag, noprune=True)
    import docker

    with pytest.raises(docker.errors.ImageNotFound):  # really gone from the engine
        docker_client.images.get(image_id)
    try:
        res = envbuild(
            "pull", "cpu-py311", "--registry", target, "--tag", repo_name, "--verify", "--json", cwd=e2e_project
        )
        assert res.returncode == 0, res.stderr[-3000:]
        pulled = json.loads(res.stdout)
        assert pulled["digest"] == pushed["digest"]
        assert pulled["image_id"] == image_id
        assert pulled["torch"] == "2.13.0" and pulled["python"] == "3.11" and pulled["smoke"] == "passed"
        assert pulled["mismatches"] == []
        # Tagged where build would have put it, so `run`, `smoke` and `status` find what was pulled.
        content = built_cpu["labels"]["io.envbuild.content-digest"]
        assert pulled["tags"] == [f"{repo_name}:cpu-py311", f"{repo_name}:cpu-py311-{content[:12]}"]
        assert docker_client.images.get(f"{repo_name}:cpu-py311").id == image_id
    finally:
        img = docker_client.images.get(f"{target}:cpu-py311")
        for tag in kept:
            repo, t = tag.rsplit(":", 1)
            img.tag(repo, tag=t)


def test_pull_verify_rejects_a_tampered_lock_label(
    docker_client: Any, built_cpu: dict[str, Any], e2e_project: Path, registry: str, repo_name: str
) -> None:
    fake = "f" * 64
    relock = (
        "RUN python -c \"import json; p='/opt/envbuild/expect.json'; e=json.load(open(p)); "
        "e['packages']['numpy']='2.1.2'; json.dump(e, open(p, 'w'))\""
    )  # an image locked with another numpy
    image = derived(
        docker_client, built_cpu["image_id"], f'LABEL io.envbuild.lock-sha256="{fake}"', "USER root", relock,
        "USER 1000:1000",
    )  # fmt: skip
    repo = f"{repo_name}-tampered"
    image.tag(repo, tag="cpu-py311")
    target = f"{registry}/envbuild/tampered"
    try:
        # It inherited io.envbuild.smoke=passed from the tested image; envbuild no longer takes that
        # for a tested image (it pushed it before) ...
        res = envbuild("push", "cpu-py311", "--tag", repo, "--registry", target, cwd=e2e_project)
        assert res.returncode == 10, res.stderr[-2000:]
        assert "its smoke-test record does not hold" in res.stderr and "refusing to push it" in res.stderr
        # ... so it reaches the registry around envbuild, as a tampered image would
        image.tag(target, tag="cpu-py311")
        docker_client.images.push(target, tag="cpu-py311")
        docker_client.images.remove(f"{target}:cpu-py311", force=True, noprune=True)
        res = envbuild("pull", "cpu-py311", "--registry", target, "--tag", repo, "--verify", cwd=e2e_project)
        assert res.returncode == 9
        local = built_cpu["labels"]["io.envbuild.lock-sha256"]
        assert f"lockfile sha256: image has {fake}, local has {local}" in res.stderr
        # and which packages differ, not only the two hashes (issue 24)
        assert "numpy: image has 2.1.2, local lockfile has 2.1.3" in res.stderr
        assert "its smoke-test record does not hold" in res.stderr
        res = envbuild("pull", "cpu-py311", "--registry", target, "--tag", repo, cwd=e2e_project)
        assert res.returncode == 0 and "warning: lockfile sha256" in res.stderr
        assert f"its smoke test does not hold: not tagged as {repo}:cpu-py311" in res.stderr
        assert "smoke altered" in res.stdout  # not the label's "passed"
    finally:
        for ref in (f"{repo}:cpu-py311", f"{target}:cpu-py311"):
            with contextlib.suppress(Exception):
                docker_client.images.remove(ref, force=True, noprune=True)


def test_push_refuses_an_untested_image(
    docker_client: Any, built_cpu: dict[str, Any], e2e_project: Path, registry: str, repo_name: str
) -> None:
    image = derived(docker_client, built_cpu["built_image_id"], 'LABEL io.envbuild.note="built with --no-smoke"')
    repo = f"{repo_name}-untested"
    image.tag(repo, tag="cpu-py311")
    try:
        res = envbuild("push", "cpu-py311", "--tag", repo, "--registry", f"{registry}/x/y", cwd=e2e_project)
        assert res.returncode == 10
        assert "has not passed the smoke test; refusing to push it" in res.stderr
    finally:
        docker_client.images.remove(f"{repo}:cpu-py311", force=True, noprune=True)


def test_registry_down_is_a_clear_error(
    docker_client: Any, built_cpu: dict[str, Any], e2e_project: Path, repo_name: str
) -> None:
    from .conftest import _free_port

    host = f"127.0.0.1:{_free_port()}"
    dead = f"{host}/envbuild/down"
    before = {t for i in docker_client.images.list() for t in i.tags}
    res = envbuild(
        "push",
        "cpu-py311",
        "--tag",
        repo_name,
        "--registry",
        dead,
        cwd=e2e_project,
        env={"ENVBUILD_RETRY_BACKOFF": "0.2"},
    )
    assert res.returncode == 10
    assert f"push {dead}:cpu-py311-" in res.stderr and f"nothing answered at {host}:" in res.stderr
    assert "connection refused" in res.stderr.lower()
    assert "attempt 3 failed" in res.stderr and "retrying in" in res.stderr  # a retry is not a silent pause
    assert "Traceback" not in res.stderr
    # the push tagged the image for the registry first; nothing landed, so that tag must not stay
    assert {t for i in docker_client.images.list() for t in i.tags} == before


def test_matrix_github_is_a_fromjson_matrix() -> None:
    res = envbuild("matrix", "--format", "github", cwd=REPO)
    data = json.loads(res.stdout)
    assert set(data) == {"include"}
    names = {row["profile"] for row in data["include"]}
    shipped = {p.stem for p in (REPO / "profiles").glob("*.yaml") if not p.name.startswith("_")}
    assert names == shipped
    for row in data["include"]:  # a GitHub matrix accepts scalar values only
        assert all(isinstance(v, (str, bool, int)) for v in row.values())
        assert row["runner"] == (
            "ubuntu-24.04"
            if row["accelerator"] == "cpu"
            else f"gpu-{'nvidia' if row['accelerator'] == 'cuda' else 'amd'}"
        )
    bake = json.loads(envbuild("matrix", "--format", "bake", cwd=REPO).stdout)
    assert set(bake["target"]) == shipped and bake["target"]["cpu-py311"]["target"] == "runtime"


def test_committed_workflow_is_generated_and_names_every_profile() -> None:
    path = REPO / ".github" / "workflows" / "envbuild.yml"
    res = envbuild("ci", "github", "--check", "-o", str(path), cwd=REPO)
    assert res.returncode == 0, res.stderr
    doc = yaml.safe_load(path.read_text())
    include = doc["jobs"]["build"]["strategy"]["matrix"]["include"]
    shipped = {p.stem for p in (REPO / "profiles").glob("*.yaml") if not p.name.startswith("_")}
    assert {row["profile"] for row in include} == shipped
    for job in doc["jobs"].values():
        for step in job["steps"]:
            if "uses" in step:
                assert len(step["uses"].split("@", 1)[1]) == 40  # pinned to a commit SHA
    assert doc["permissions"] == {"contents": "read"}


def docker_root() -> str:
    return subprocess.run(
        ["docker", "info", "--format", "{{.DockerRootDir}}"], capture_output=True, text=True, check=True
    ).stdout.strip()


def test_doctor_reports_no_gpu_without_failing() -> None:
    res = envbuild("doctor", "--json", cwd=REPO)
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    assert report["engine"]["reachable"] is True
    # The local engine's data root and its free space, as statvfs sees it on this machine.
    assert report["engine"]["data_root"] == docker_root()
    assert 0 < report["engine"]["free_bytes"] <= shutil.disk_usage(docker_root()).total
    assert report["gpus"] == [] and "no GPU on this host" in " ".join(report["notes"])
    verdicts = {p["profile"]: p for p in report["profiles"]}
    assert verdicts["cpu-py311"]["runs_here"] is True
    assert (
        verdicts["cu121-py311"]["runs_here"] is False and verdicts["cu121-py311"]["why"] == "no NVIDIA GPU on this host"
    )
    # what a first build fetches, probed for real: PyPI answers (directly, or through an intercepting
    # proxy, which says to pass --ca-bundle)
    network = {n["url"]: n for n in report["network"]}
    pypi = network["https://pypi.org/simple/"]
    assert pypi["state"] in {"reachable", "intercepted"}, pypi
    assert pypi["state"] == "reachable" or "--ca-bundle" in pypi["fix"]
    assert "https://download.pytorch.org/whl/cpu/" in network  # cpu-py312 locks from the PyTorch CPU index


def test_run_passes_the_exit_code_and_mounts_the_folder(
    built_cpu: dict[str, Any], e2e_project: Path, repo_name: str, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "hello.txt").write_text("hi\n")
    work.chmod(0o777)
    cmd = [sys.executable, "-m", "envbuild", "--help"]
    assert subprocess.run(cmd, capture_output=True, check=False).returncode == 0
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "envbuild",
            "run",
            "cpu-py311",
            "--project",
            str(e2e_project),
            "--tag",
            repo_name,
            "--",
            "python",
            "-c",
            "import os, sys, torch; "
            "print(open('hello.txt').read().strip(), os.getuid(), torch.__version__); sys.exit(3)",
        ],
        cwd=work,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert res.returncode == 3, res.stderr
    # as the host user (issue 24): what the job writes in /workspace belongs to whoever ran it
    assert res.stdout.split() == ["hi", str(os.getuid()), "2.13.0+cpu"]
    shutil.rmtree(work, ignore_errors=True)


def _docker_config(folder: Path, registry: str, password: str) -> Path:
    """A Docker CLI config as `docker login` writes it (no credential helper)."""
    import base64

    folder.mkdir(parents=True)
    token = base64.b64encode(f"{REGISTRY_USER}:{password}".encode()).decode()
    (folder / "config.json").write_text(json.dumps({"auths": {registry: {"auth": token}}}))
    return folder


def test_a_registry_that_needs_login(
    docker_client: Any,
    built_cpu: dict[str, Any],
    e2e_project: Path,
    login_registry: str,
    tmp_path: Path,
    repo_name: str,
) -> None:
    """Wrong credentials: exit 10 and `docker login HOST`; the CLI's stored ones: push and pull go through."""
    # One small layer under the built image's labels: push judges the labels, and re-uploading
    # 1.2 GB to a second registry would prove nothing the round-trip test does not.
    labels = docker_client.images.get(built_cpu["image_id"]).labels
    labels = {k: v for k, v in labels.items() if k not in smokerecord.RECORD_LABELS}  # marked below, as build does
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as tar:
        for name, data in (("Dockerfile", b"FROM scratch\nCOPY marker /marker\n"), ("marker", b"login\n")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    context.seek(0)
    image, _ = docker_client.images.build(fileobj=context, custom_context=True, labels=labels, rm=True)
    image = docker_client.images.get(
        build.mark_smoke_passed(docker_client, image.id, {"report_version": 1, "checks": []})
    )
    repo, target = f"{repo_name}-login", f"{login_registry}/envbuild/login"
    image.tag(repo, tag="cpu-py311")
    wrong = _docker_config(tmp_path / "wrong", login_registry, "not-the-password")
    right = _docker_config(tmp_path / "right", login_registry, REGISTRY_PASSWORD)
    try:
        res = envbuild(
            "push", "cpu-py311", "--tag", repo, "--registry", target, cwd=e2e_project, env={"DOCKER_CONFIG": str(wrong)}
        )
        assert res.returncode == 10, res.stderr[-2000:]
        assert "the registry answered: unauthorized: authentication required" in res.stderr
        assert f"fix: log in to {login_registry}: `docker login {login_registry}`" in res.stderr

        def as_logged_in(verb: str) -> subprocess.CompletedProcess[str]:
            args = (verb, "cpu-py311", "--registry", target, "--tag", repo, "--json")
            return envbuild(*args, cwd=e2e_project, env={"DOCKER_CONFIG": str(right)})

        res = as_logged_in("push")
        assert res.returncode == 0, res.stderr[-2000:]
        pushed = json.loads(res.stdout)
        docker_client.images.remove(f"{target}:cpu-py311", noprune=True)
        res = as_logged_in("pull")
        assert res.returncode == 0, res.stderr[-2000:]
        assert json.loads(res.stdout)["digest"] == pushed["digest"]
    finally:
        for ref in (
            f"{repo}:cpu-py311",
            *[f"{target}:{t}" for t in ("cpu-py311", f"cpu-py311-{labels['io.envbuild.content-digest'][:12]}")],
        ):  # pruning: the small image's build steps (FROM scratch, not the test base) go with it
            with contextlib.suppress(Exception):
                docker_client.images.remove(ref, force=True)


def test_a_push_through_a_link_that_stops_forwarding_is_called_stalled_and_retried(
    docker_client: Any, built_cpu: dict[str, Any], e2e_project: Path, repo_name: str, tmp_path: Path
) -> None:
    """A relay in front of a real registry forwards 4 MB, then holds every connection open and moves
    nothing: the push must say "stalled", retry, and fail within the stall limits, not sit silent."""
    import time

    from ..unit.test_hardening import record
    from .conftest import StallingLink, _serve_registry

    with _serve_registry(tmp_path, login=False) as real:
        link = StallingLink(real, budget=4 * 2**20)
        try:
            target = f"{link.address}/envbuild/stalled"

            def ours() -> set[str]:  # this test's tags: others may build on the engine meanwhile
                return {
                    t for i in docker_client.images.list() for t in i.tags if t.startswith((repo_name, link.address))
                }

            before = ours()
            started = time.monotonic()
            res = envbuild(
                "push",
                "cpu-py311",
                "--tag",
                repo_name,
                "--registry",
                target,
                cwd=e2e_project,
                env={"ENVBUILD_STALL_TIMEOUT": "6", "ENVBUILD_RETRY_BACKOFF": "0.2"},
            )
            took = time.monotonic() - started
        finally:
            link.close()
    assert res.returncode == 10, res.stderr[-3000:]
    assert "stalled: the push moved nothing for 6 s" in res.stderr
    assert "attempt 1 failed (stalled" in res.stderr and "retrying in" in res.stderr
    assert "ENVBUILD_STALL_TIMEOUT" in res.stderr  # the fix names the knob
    assert "Traceback" not in res.stderr
    # four attempts of at most ~6 s of silence each, plus set-up: minutes, not the client's 10 minutes
    assert took < 120, took
    assert link.sent >= 4 * 2**20  # it really got going before the link hung
    assert ours() == before  # no tag left or moved
    record("push_stall", stall_timeout_s=6, attempts=4, seconds_to_fail=round(took, 1), moved_tags=0)


def test_a_pull_through_a_link_that_stops_forwarding_is_called_stalled_and_retried(
    docker_client: Any, e2e_project: Path, tmp_path: Path
) -> None:
    """The same relay in front of a registry that holds an image the engine lacks: docker-py reads a
    pull's stream with no time limit of its own, so a pull that stopped moving waited forever."""
    import time
    import uuid

    from .conftest import StallingLink, _serve_registry

    with _serve_registry(tmp_path, login=False) as real:
        # an image of its own (8 MB that no other image has): the pull must fetch a blob of size
        noise = os.urandom(8 * 2**20)
        fileobj = io.BytesIO()
        with tarfile.open(fileobj=fileobj, mode="w") as tar:
            for name, data in (("Dockerfile", b"FROM scratch\nCOPY noise /noise\n"), ("noise", noise)):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        fileobj.seek(0)
        image, _ = docker_client.images.build(fileobj=fileobj, custom_context=True, rm=True, forcerm=True)
        name = f"envbuild/stalled-pull-{uuid.uuid4().hex[:8]}"
        image.tag(f"{real}/{name}", tag="cpu-py311")
        try:
            docker_client.images.push(f"{real}/{name}", tag="cpu-py311")
        finally:
            docker_client.images.remove(image.id, force=True)
        link = StallingLink(real, budget=2 * 2**20, downstream=True)
        try:
            started = time.monotonic()
            res = envbuild(
                "pull",
                "cpu-py311",
                "--registry",
                f"{link.address}/{name}",
                cwd=e2e_project,
                env={"ENVBUILD_STALL_TIMEOUT": "5", "ENVBUILD_RETRY_BACKOFF": "0.2"},
                timeout=300,
            )
            took = time.monotonic() - started
        finally:
            link.close()
            for ref in (f"{real}/{name}:cpu-py311", f"{link.address}/{name}:cpu-py311"):  # had it been pulled
                with contextlib.suppress(Exception):
                    docker_client.images.remove(ref, force=True)
    assert res.returncode == 10, res.stderr[-3000:]
    assert "stalled: the pull moved nothing for 5 s" in res.stderr
    assert "attempt 1 failed (stalled" in res.stderr and "retrying in" in res.stderr
    assert "ENVBUILD_STALL_TIMEOUT" in res.stderr and "Traceback" not in res.stderr
    assert took < 120, took  # four attempts of ~5 s of silence each, not forever
    assert link.sent >= 2 * 2**20  # it really got going before the link hung


def test_push_refuses_the_image_of_an_older_profile_or_lockfile(
    built_cpu: dict[str, Any], e2e_project: Path, registry: str, repo_name: str
) -> None:
    """A profile edited (or re-locked) and not built yet: `push` published REPO:NAME, the build of
    the old inputs, as the profile's image, while the lockfiles CI installs say otherwise."""
    path = e2e_project / "profiles" / "cpu-py311.yaml"
    before = path.read_text()
    path.write_text(before + 'env: {OMP_NUM_THREADS: "4"}\n')
    try:
        res = envbuild(
            "push", "cpu-py311", "--tag", repo_name, "--registry", f"{registry}/envbuild/old", cwd=e2e_project
        )
    finally:
        path.write_text(before)
    assert res.returncode == 10, res.stderr[-2000:]
    assert f"{repo_name}:cpu-py311 was not built from this checkout's profile and lockfiles" in res.stderr
    assert "(it differs in the profile's fields)" in res.stderr
    assert "fix: build them first (envbuild build cpu-py311), then push" in res.stderr
