"""Layered images: the torch layer is shared byte for byte by profiles that share a torch build;
the layer stages a build misses run side by side."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from .conftest import WHEELS, envbuild, layer_table, local_build, variant

pytestmark = pytest.mark.e2e


def test_two_profiles_sharing_a_torch_build_share_the_torch_layer(
    docker_client: Any, built_cpu: dict[str, Any], e2e_project: Path, repo_name: str, tmp_path: Path
) -> None:
    """Before: one 881 MB environment layer per image, shared by none. A variant of cpu-py311 with
    one more small package now reuses cpu-py311's torch layer (same diff ID: a registry stores it
    once, a host pulls it once) and differs only in the small layer."""
    proj = variant(e2e_project, tmp_path / "variant", "cpu-py311-tqdm", '["einops==0.8.1", "tqdm==4.67.1"]')
    # The wheel cache has every wheel the lock pins (tqdm since the lock above), so the build asks no
    # index: a mirror that is down (a closed port here) does not stop it. The rest layer's install
    # runs (tqdm is new); it used to ask the index for each package and failed to connect.
    (proj / "envbuild.toml").write_text('[envbuild]\nindex_url = "http://127.0.0.1:9/simple"\n')
    res = envbuild(*local_build("cpu-py311-tqdm", repo_name), "--no-smoke", "--json", cwd=proj)
    assert res.returncode == 0, res.stderr[-3000:]
    result = json.loads(res.stdout)  # the report alone; progress on stderr, with --json too
    assert "every one, so the build asks no package index" in res.stderr
    dockerfile = (Path(result["context"]) / "Dockerfile").read_text()
    assert "--no-index" in dockerfile and "127.0.0.1:9" not in dockerfile
    assert result["ran_steps"] > 0
    derived = result["built_image_id"]
    ours = layer_table(docker_client, built_cpu["built_image_id"])
    theirs = layer_table(docker_client, derived)
    torch = max((row for row in ours if row[1] == "COPY to /"), key=lambda row: row[2])
    assert torch[2] > 400e6  # the torch layer: torch 2.13.0+cpu is ~670 MB installed
    assert torch[0] in {d for d, _, _ in theirs}, "the torch layer differs between the two profiles"
    shared = sum(size for d, _, size in theirs if d in {row[0] for row in ours})
    assert shared >= torch[2]  # a host with cpu-py311 pulls at most the rest of the variant

    # The environment's layers are the same but the last: torch, torch-deps, numpy and the venv
    # itself (its pip and setuptools, copied as a tree to /, so no copy time stamps it); only the
    # rest's differs (it holds tqdm). (The OS layers before them differ: each apt.lock names its profile.)
    env_ours = [d for d, step, _ in ours if step == "COPY to /"]
    env_theirs = [d for d, step, _ in theirs if step == "COPY to /"]
    assert len(env_ours) == len(env_theirs) == 5, ours  # torch, torch-deps, numpy, the venv, the rest
    assert env_ours[:4] == env_theirs[:4]
    assert env_ours[4] != env_theirs[4]
    for tag in docker_client.images.get(derived).tags:  # by tag: the image has cache children
        docker_client.images.remove(tag)


def test_a_missing_layer_is_built_beside_the_others_and_no_step_runs_twice(
    docker_client: Any, built_cpu: dict[str, Any], e2e_project: Path, repo_name: str, tmp_path: Path
) -> None:
    """The classic builder runs a Dockerfile's stages one after another; envbuild runs the layer
    stages missing from the engine, venv-base and the runtime's OS part as builds of their own, side
    by side, and the whole build then finds each of their steps in the cache. Here numpy's layer is
    new (2.1.2 for 2.1.3), and the project is another, so no stage's cache image is this project's."""
    proj = tmp_path / "numpy"
    for part in ("profiles", "lockfiles", "checks"):
        shutil.copytree(e2e_project / part, proj / part)
    profile = proj / "profiles" / "cpu-py311.yaml"
    assert 'numpy: "2.1.3"' in profile.read_text(), "the e2e cpu-py311 profile no longer reads as this expects"
    profile.write_text(profile.read_text().replace('numpy: "2.1.3"', 'numpy: "2.1.2"'))
    res = envbuild("lock", "cpu-py311", "--no-apt", "--find-links", WHEELS, cwd=proj)
    assert res.returncode == 0, res.stderr[-3000:]

    res = envbuild(*local_build("cpu-py311", f"{repo_name}-sides"), "--no-smoke", "--json", cwd=proj)
    assert res.returncode == 0, res.stderr[-3000:]
    result = json.loads(res.stdout)
    assert "stages side by side: venv-base, runtime-os, layer-torch, layer-torch-deps, layer-numpy, builder" in (
        res.stderr
    )
    sides = Path(result["log_path"]).parent / "stages"
    numpy_side = (sides / "layer-numpy.log").read_text()
    assert "--prefix /split/numpy" in numpy_side and "Running in" in numpy_side  # installed there
    # ...and only there: the whole build took that stage's image as it was made (without sending its
    # wheels again), and the runtime's OS packages from the cache
    assert "taking layer-torch, layer-torch-deps, layer-numpy from the engine" in res.stderr
    whole = Path(result["log_path"]).read_text(encoding="utf-8").split("\nStep ")
    assert not [s for s in whole if "--prefix /split/numpy" in s.split("\n", 1)[0]]
    assert [s for s in whole if s.split("\n", 1)[0].endswith(" AS layer-numpy") and ": FROM sha256:" in s]
    steps = [s for s in whole if "apt-get install" in s.split("\n", 1)[0]]
    assert steps and all("Using cache" in s and "Running in" not in s for s in steps)
    assert result["ran_steps"] >= numpy_side.count("Running in")  # the side builds' steps count too
    out = docker_client.containers.run(
        result["built_image_id"], ["python", "-c", "import numpy, torch; print(numpy.__version__)"], remove=True
    )
    assert out.decode().strip() == "2.1.2"
    # stopped while its side builds run (numpy 2.1.1 now): it ends at once, and so do they (each
    # side build's connection closes, and the engine stops that build)
    profile.write_text(profile.read_text().replace('numpy: "2.1.2"', 'numpy: "2.1.1"'))
    res = envbuild("lock", "cpu-py311", "--no-apt", "--find-links", WHEELS, cwd=proj)
    assert res.returncode == 0, res.stderr[-3000:]
    running_before = {c.id for c in docker_client.containers.list()}
    cmd = [sys.executable, "-m", "envbuild", *local_build("cpu-py311", f"{repo_name}-sides"), "--no-smoke"]
    proc = subprocess.Popen(cmd, cwd=proj, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    assert proc.stderr is not None
    for line in proc.stderr:
        if "venv-base done" in line:  # the layer stages have just started
            break
    time.sleep(2)
    proc.send_signal(signal.SIGTERM)
    stopped = time.monotonic()
    proc.communicate(timeout=60)
    assert proc.returncode != 0 and time.monotonic() - stopped < 15
    deadline = time.monotonic() + 15
    while {c.id for c in docker_client.containers.list()} - running_before and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not {c.id for c in docker_client.containers.list()} - running_before, "a side build kept running"
    assert docker_client.images.get(f"{repo_name}-sides:cpu-py311-untested").id == result["image_id"]  # not moved
    for tag in docker_client.images.get(result["image_id"]).tags:
        docker_client.images.remove(tag)
