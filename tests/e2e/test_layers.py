"""Layered images: the torch layer is shared byte for byte by profiles that share a torch build."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from .conftest import envbuild, layer_table, local_build, variant

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

    # the environment's small layer (/opt/venv) differs: it holds tqdm
    venv_ours = next(d for d, step, _ in ours if step == "COPY to /opt/venv")
    venv_theirs = next(d for d, step, _ in theirs if step == "COPY to /opt/venv")
    assert venv_ours != venv_theirs
    for tag in docker_client.images.get(derived).tags:  # by tag: the image has cache children
        docker_client.images.remove(tag)
