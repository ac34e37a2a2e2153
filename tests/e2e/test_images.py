"""`envbuild images --prune` against the real engine: what goes, what stays, and the disk it frees."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from envbuild import build, lockfile, validate
from envbuild import plan as plan_mod
from envbuild.project import open_project

from ..conftest import REPO
from .conftest import BASE, envbuild

pytestmark = pytest.mark.e2e


class Made:
    """Images and containers this test creates, removed at the end whatever happened."""

    def __init__(self, cli: Any) -> None:
        self.cli = cli
        self.images: list[str] = []
        self.containers: list[Any] = []

    def image(self, labels: dict[str, str], tags: list[str], *, blob_mb: int = 0, smoke: bool = False) -> str:
        """`smoke`: marked as build marks an image that passed (a record that holds, not a bare label)."""
        # A layer of its own (random bytes) where the test measures what pruning frees.
        run = f"RUN head -c {blob_mb * 1_000_000} /dev/urandom > /blob\n" if blob_mb else ""
        dockerfile = f"FROM {BASE}\n{run}"
        image, _ = self.cli.images.build(fileobj=io.BytesIO(dockerfile.encode()), labels=labels, rm=True, forcerm=True)
        self.images.append(image.id)
        if smoke:
            marked = build.mark_smoke_passed(self.cli, image.id, {"report_version": 1, "checks": []})
            image = self.cli.images.get(marked)
            self.images.append(image.id)
        for ref in tags:
            repo, tag = ref.rsplit(":", 1)
            image.tag(repo, tag=tag)
        return str(image.id)

    def cleanup(self) -> None:
        for container in self.containers:
            with contextlib.suppress(Exception):
                container.remove(force=True)
        for image_id in reversed(self.images):
            with contextlib.suppress(Exception):
                self.cli.api.remove_image(image_id, force=True)


@pytest.fixture
def made(docker_client: Any) -> Iterator[Made]:
    m = Made(docker_client)
    yield m
    m.cleanup()


def _exists(cli: Any, image_id: str) -> bool:
    try:
        cli.images.get(image_id)
    except Exception:
        return False
    return True


def test_prune_removes_stale_and_leftover_images_and_keeps_what_is_current_tagged_or_used(
    docker_client: Any, made: Made, tmp_path: Path, repo_name: str
) -> None:
    proj = tmp_path / "proj"
    for part in ("profiles", "lockfiles", "checks"):
        shutil.copytree(REPO / part, proj / part)
    repo = f"{repo_name}-images"
    # the project's own repository: REPO:NAME is the tag `run` and `status` go by (without this, a
    # developer's own project named "proj" on the same engine owns envbuild/proj:cpu-py311)
    (proj / "envbuild.toml").write_text(f'[envbuild]\nrepository = "{repo}"\n')
    prof = validate.load_valid(proj / "profiles" / "cpu-py311.yaml")
    lock_sha = lockfile.lock_sha256((proj / "lockfiles" / "cpu-py311" / "requirements.lock").read_text())
    image_digest = plan_mod.make(open_project(str(proj)), prof, strict=False).image_digest
    apt_sha = lockfile.lock_sha256((proj / "lockfiles" / "cpu-py311" / "apt.lock").read_text())
    source = f"file://{proj}"

    def labels(name: str, sha: str, *, src: str = source) -> dict[str, str]:
        out = {
            "io.envbuild.profile": name,
            "io.envbuild.lock-sha256": sha,
            "io.envbuild.image-digest": image_digest,
            "org.opencontainers.image.source": src,
        }
        if name == "cpu-py311":
            out["io.envbuild.apt-lock-sha256"] = apt_sha  # the OS packages it was built with
        return out

    old = "0" * 64
    current = made.image(
        labels("cpu-py311", lock_sha), [f"{repo}:cpu-py311", f"{repo}:cpu-py311-{lock_sha[:12]}"], smoke=True
    )
    stale = made.image(labels("cpu-py311", old), [f"{repo}:cpu-py311-{old[:12]}"], blob_mb=8)
    stale_moving = made.image(labels("cu121-py311", old), [f"{repo}:cu121-py311"], smoke=True)
    leftover = made.image(labels("cpu-py311", "1" * 64), [])
    orphan = made.image(labels("cpu-py399", lock_sha), [f"{repo}:cpu-py399-{lock_sha[:12]}"], smoke=True)
    in_use = made.image(labels("cpu-py311", "2" * 64), [f"{repo}:cpu-py311-{'2' * 12}"], smoke=True)
    made.containers.append(docker_client.containers.create(in_use, command=["true"], name=f"{repo}-user"))
    elsewhere = made.image(
        labels("cpu-py311", old, src="file:///another/project"), [f"{repo}-other:cpu-py311-old"], smoke=True
    )
    # a team's image built FROM an old build of the profile: every label inherited, its own tag
    team_app = made.image(labels("cpu-py311", old), [f"{repo}-team/app:latest"])

    listed = envbuild("images", "--json", cwd=proj)
    assert listed.returncode == 0, listed.stderr
    rows = {r["image_id"]: r for r in json.loads(listed.stdout)["images"]}
    assert elsewhere not in rows, "another project's image is not this project's to list or prune"
    states = {
        i: (rows[i]["state"], rows[i]["keep"])
        for i in (current, stale, stale_moving, leftover, orphan, in_use, team_app)
    }
    assert states == {
        current: ("current", True),
        stale: ("stale", False),
        stale_moving: ("stale", True),
        leftover: ("untagged", False),
        orphan: ("orphan", False),
        in_use: ("stale", True),
        team_app: ("stale", True),
    }
    assert rows[team_app]["reason"] == f"not envbuild's: tagged {repo}-team/app:latest"
    assert rows[stale_moving]["reason"] == f"tagged {repo}:cu121-py311"
    assert rows[in_use]["reason"] == f"in use by container {repo}-user"
    assert "lockfile sha256: image has 0000" in rows[stale]["why"]

    # status reads the same engine: cpu-py311 has its current, tested image; cu121-py311's is stale.
    st = envbuild("status", "cpu-py311", "cu121-py311", "--json", cwd=proj)
    assert st.returncode == 0, st.stderr
    got = {p["profile"]: (p["image"], p["image_ref"], p["next"]) for p in json.loads(st.stdout)["profiles"]}
    assert got == {
        "cpu-py311": ("tested", f"{repo}:cpu-py311", ""),
        "cu121-py311": ("stale", f"{repo}:cu121-py311", "envbuild build cu121-py311"),
    }
    problems = {p["profile"]: p["image_problem"] for p in json.loads(st.stdout)["profiles"]}
    assert problems["cpu-py311"] == ""  # and a stale one says why (it said "stale" and nothing more)
    assert problems["cu121-py311"].startswith(f"{repo}:cu121-py311 is stale: lockfile sha256: image has {old}")

    dry = envbuild("images", "--prune", "--dry-run", cwd=proj)
    assert dry.returncode == 0, dry.stderr
    assert "3 image(s) would go" in dry.stdout
    assert all(_exists(docker_client, i) for i in (stale, leftover, orphan))

    # While a build of cpu-py311 runs (it holds the profile's build lock), its untagged image may be
    # the one that build is about to tag: prune leaves it and removes the rest.
    with build.exclusive(open_project(str(proj)), "cpu-py311", lambda *_: None):
        during = envbuild("images", "--prune", "--json", cwd=proj)
    assert during.returncode == 0, during.stderr
    report = json.loads(during.stdout)
    assert sorted(r["image_id"] for r in report["images"] if r["removed"]) == sorted([stale, orphan])
    assert report["freed_bytes"] >= 8_000_000, "the stale image's own 8 MB layer is gone from the engine's disk"
    kept = {r["image_id"]: r for r in report["images"]}[leftover]
    assert kept["reason"] == "a build of cpu-py311 is running (its image is tagged last)"

    pruned = envbuild("images", "--prune", "--json", cwd=proj)
    assert pruned.returncode == 0, pruned.stderr
    assert [r["image_id"] for r in json.loads(pruned.stdout)["images"] if r["removed"]] == [leftover]
    for image_id in (stale, leftover, orphan):
        assert not _exists(docker_client, image_id)
    for image_id in (current, stale_moving, in_use, elsewhere, team_app):
        assert _exists(docker_client, image_id)
    assert docker_client.images.get(f"{repo}:cpu-py311").id == current

    again = envbuild("images", "--prune", cwd=proj)
    assert again.returncode == 0, again.stderr
    assert "removed 0 image(s)" in again.stdout


def test_prune_keeps_the_newest_build_cache_of_todays_lockfile_and_takes_older_ones(
    docker_client: Any, made: Made, tmp_path: Path
) -> None:
    """The classic builder leaves each build's builder stage untagged (1.5-6 GB): the newest one of the
    current lockfile is what the next build starts from; the others are dead weight."""
    proj = tmp_path / "proj"
    for part in ("profiles", "lockfiles", "checks"):
        shutil.copytree(REPO / part, proj / part)
    lock_sha = lockfile.lock_sha256((proj / "lockfiles" / "cpu-py311" / "requirements.lock").read_text())

    def builder(sha: str, nonce: str) -> str:
        labels = {
            "io.envbuild.stage": "builder",
            "io.envbuild.profile": "cpu-py311",
            "io.envbuild.lock-sha256": sha,
            "org.opencontainers.image.source": f"file://{proj}",
            "e2e.nonce": nonce,  # otherwise the engine's cache hands back the same image
        }
        return made.image(labels, [])

    replaced = builder(lock_sha, "1")
    time.sleep(1.1)  # the engine's creation times are whole seconds
    newest = builder(lock_sha, "2")
    older_lock = builder("0" * 64, "3")

    pruned = envbuild("images", "--prune", "--json", cwd=proj)
    assert pruned.returncode == 0, pruned.stderr
    rows = {r["image_id"]: r for r in json.loads(pruned.stdout)["images"]}
    assert {i: (rows[i]["stage"], rows[i]["state"], rows[i]["removed"]) for i in (replaced, newest, older_lock)} == {
        replaced: ("builder", "stale", True),
        newest: ("builder", "current", False),
        older_lock: ("builder", "stale", True),
    }
    assert rows[replaced]["why"] == "build cache of today's lockfile that a newer build replaced"
    assert not _exists(docker_client, replaced) and not _exists(docker_client, older_lock)
    assert _exists(docker_client, newest)
