"""Hardening against the real engine: concurrent builds, a killed build, secrets, figures recorded."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

import pytest

from ..unit.test_hardening import record
from .conftest import at_once, host_only_certs, local_build

pytestmark = pytest.mark.e2e
TOKEN = "S3CRET-envbuild-token-7f3a"  # noqa: S105 - a fake credential the test hunts for


def _variant(project: Path, name: str, env_value: str) -> None:
    src = (project / "profiles" / "cpu-py311.yaml").read_text()
    text = src.replace("name: cpu-py311", f"name: {name}") + f'env:\n  VARIANT: "{env_value}"\n'
    (project / "profiles" / f"{name}.yaml").write_text(text)
    if not (project / "lockfiles" / name).exists():
        # The lock inputs do not include the name, so the CPU lock serves the variant as it is.
        shutil.copytree(project / "lockfiles" / "cpu-py311", project / "lockfiles" / name)


def _build_cmd(name: str, repo: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "envbuild", *local_build(name, repo), *extra]


def test_two_profiles_built_at_once(
    docker_client: Any, built_cpu: dict[str, Any], e2e_project: Path, repo_name: str
) -> None:
    _variant(e2e_project, "cpu-py311-a", "a")
    _variant(e2e_project, "cpu-py311-b", "b")
    runs = at_once([_build_cmd(n, repo_name, "--json") for n in ("cpu-py311-a", "cpu-py311-b")], e2e_project)
    assert [rc for rc, _, _ in runs] == [0, 0], [err[-2000:] for _, _, err in runs]
    for name, (_, out, _) in zip(("cpu-py311-a", "cpu-py311-b"), runs, strict=True):
        result = json.loads(out)
        assert docker_client.images.get(f"{repo_name}:{name}").id == result["image_id"]
        env = docker_client.images.get(result["image_id"]).attrs["Config"]["Env"]
        assert f"VARIANT={name[-1]}" in env
    record("concurrent_builds", builds=2, failures=0)


def test_two_builds_of_one_profile_take_turns(
    docker_client: Any, built_cpu: dict[str, Any], e2e_project: Path, repo_name: str
) -> None:
    """Side by side they would rewrite each other's context mid-send; the second waits, says so, succeeds."""
    _variant(e2e_project, "cpu-py311-t", "turns")
    runs = at_once([_build_cmd("cpu-py311-t", repo_name, "--no-smoke")] * 2, e2e_project)
    assert [rc for rc, _, _ in runs] == [0, 0], [err[-2000:] for _, _, err in runs]
    waited = [err for _, _, err in runs if "wait: another build of cpu-py311-t is running in this project" in err]
    assert len(waited) == 1, [err[-1500:] for _, _, err in runs]
    assert docker_client.images.get(f"{repo_name}:cpu-py311-t-untested")


def test_killed_build_moves_no_tag_and_the_next_build_succeeds(
    docker_client: Any, built_cpu: dict[str, Any], e2e_project: Path, repo_name: str
) -> None:
    _variant(e2e_project, "cpu-py311-k", "before")
    assert (
        subprocess.run(
            _build_cmd("cpu-py311-k", repo_name), cwd=e2e_project, capture_output=True, check=False
        ).returncode
        == 0
    )
    before = docker_client.images.get(f"{repo_name}:cpu-py311-k").id
    kills = 0
    for delay in (1.0, 3.0, 6.0):
        _variant(e2e_project, "cpu-py311-k", f"killed-{delay}")
        prof = e2e_project / "profiles" / "cpu-py311-k.yaml"
        prof.write_text(re.sub(r'VARIANT: ".*"', f'VARIANT: "killed-{delay}"', prof.read_text()))
        proc = subprocess.Popen(
            _build_cmd("cpu-py311-k", repo_name), cwd=e2e_project, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        time.sleep(delay)
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            kills += 1
        proc.wait()
        if proc.returncode == 0:
            continue  # it finished before the kill: a complete build may move the tag
        assert docker_client.images.get(f"{repo_name}:cpu-py311-k").id == before
    res = subprocess.run(
        _build_cmd("cpu-py311-k", repo_name), cwd=e2e_project, capture_output=True, text=True, check=False
    )
    assert res.returncode == 0, res.stderr[-2000:]
    # The first image lost its moving tag to this one and keeps only its own NAME-<content digest> (the
    # env changed, so the contents did): the build says it can go, and `images` agrees.
    assert "older image(s) of cpu-py311-k can go: envbuild images --prune cpu-py311-k" in res.stderr
    listed = subprocess.run(
        [sys.executable, "-m", "envbuild", "images", "cpu-py311-k", "--json"],
        cwd=e2e_project,
        capture_output=True,
        text=True,
        check=False,
    )
    rows = {r["image_id"]: r for r in json.loads(listed.stdout)["images"]}
    now = docker_client.images.get(f"{repo_name}:cpu-py311-k").id
    assert now != before
    assert (rows[now]["state"], rows[now]["keep"]) == ("current", True)
    assert (rows[before]["state"], rows[before]["keep"]) == ("stale", False)
    record("interrupt_build", attempts=3, killed_mid_build=kills, moved_tags=0, next_build="succeeded")


def _all_file_bytes(cli: Any, image_id: str) -> list[tuple[str, bytes]]:
    blob = b"".join(cli.images.get(image_id).save(named=False))
    files = []
    with tarfile.open(fileobj=io.BytesIO(blob)) as outer:
        for member in outer.getmembers():
            if member.isfile():
                data = outer.extractfile(member).read()  # type: ignore[union-attr]
                if member.name.endswith("layer.tar"):
                    with tarfile.open(fileobj=io.BytesIO(data)) as layer:
                        for inner in layer.getmembers():
                            if inner.isfile():
                                files.append((f"{member.name}:{inner.name}", layer.extractfile(inner).read()))  # type: ignore[union-attr]
                else:
                    files.append((member.name, data))  # image config and manifest: history, env, labels
    return files


def test_no_secret_in_any_layer_label_history_or_env(
    docker_client: Any, built_cpu: dict[str, Any], e2e_project: Path, repo_name: str
) -> None:
    _variant(e2e_project, "cpu-py311-s", "secret-test")
    index = f"https://envbuild:{TOKEN}@pypi.org/simple"
    res = subprocess.run(
        _build_cmd("cpu-py311-s", repo_name, "--index-url", index, "--json"),
        cwd=e2e_project,
        capture_output=True,
        text=True,
        check=False,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert TOKEN not in res.stdout + res.stderr
    image_id = json.loads(res.stdout)["image_id"]
    image = docker_client.images.get(image_id)
    meta = json.dumps([image.attrs, image.history()])
    assert TOKEN not in meta
    secret_certs = host_only_certs(docker_client, image_id)
    files = _all_file_bytes(docker_client, image_id)
    token = TOKEN.encode()
    leaks = [name for name, data in files if token in data or any(c in data for c in secret_certs)]
    assert leaks == []
    record(
        "secrets",
        files_scanned=len(files),
        host_only_certificates=len(secret_certs),
        leaks=0,
        checked=["every file of every layer", "image config (labels, env, history)", "build output"],
    )
