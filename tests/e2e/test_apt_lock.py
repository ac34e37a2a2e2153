"""apt.lock for real: apt resolves it in a container of the base; the build installs exactly it and
refuses a tampered hash or another base."""

from __future__ import annotations

import hashlib
import io
import shutil
from pathlib import Path
from typing import Any

import pytest

from envbuild import aptfile

from .conftest import BASE, WHEELS, envbuild, local_build

pytestmark = pytest.mark.e2e


def _copy(source: Path, dest: Path) -> Path:
    for part in ("profiles", "lockfiles", "checks"):
        shutil.copytree(source / part, dest / part)
    return dest


def _dpkg(docker_client: Any, image: str) -> list[str]:
    out = docker_client.containers.run(image, ["sh", "-c", aptfile.DPKG_LIST], user="0", remove=True)
    return [line for line in out.decode().splitlines() if line]


def test_the_image_has_exactly_the_os_packages_apt_lock_pins(
    docker_client: Any, built_cpu: dict[str, Any], e2e_project: Path, repo_name: str
) -> None:
    text = (e2e_project / "lockfiles" / "cpu-py311" / "apt.lock").read_text()
    apt = aptfile.parse(text)
    image = f"{repo_name}:cpu-py311"
    assert _dpkg(docker_client, image) == apt.expected("runtime")
    labels = docker_client.images.get(image).labels
    import hashlib

    assert labels["io.envbuild.apt-lock-sha256"] == hashlib.sha256(text.encode()).hexdigest()
    # the image carries the lock it was installed from, beside the manifest
    carried = docker_client.containers.run(image, ["cat", "/opt/envbuild/apt/apt.lock"], remove=True).decode()
    assert carried == text


def test_lock_resolves_apt_lock_against_the_base_and_check_sees_it_fresh(e2e_project: Path, tmp_path: Path) -> None:
    proj = _copy(e2e_project, tmp_path / "relock")
    committed = aptfile.parse((proj / "lockfiles" / "cpu-py311" / "apt.lock").read_text())
    (proj / "lockfiles" / "cpu-py311" / "apt.lock").unlink()
    res = envbuild("lock", "cpu-py311", "--base", BASE, "--find-links", WHEELS, cwd=proj)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "apt.lock:" in res.stderr and "OS packages on" in res.stderr
    fresh = aptfile.parse((proj / "lockfiles" / "cpu-py311" / "apt.lock").read_text())
    # the same packages as the committed lock (a point release of the archive may move versions)
    for stage in aptfile.STAGES:
        assert {d.name for d in fresh.stages[stage]} == {d.name for d in committed.stages[stage]}
    assert fresh.base == committed.base  # the same base image (the session's), the same list
    assert envbuild("lock", "--check", "cpu-py311", cwd=proj).returncode == 0


def test_an_apt_package_that_does_not_exist_fails_the_lock_naming_the_field(e2e_project: Path, tmp_path: Path) -> None:
    proj = _copy(e2e_project, tmp_path / "nosuch")
    with (proj / "profiles" / "cpu-py311.yaml").open("a") as fh:
        fh.write('apt: ["envbuild-no-such-package"]\n')
    before = (proj / "lockfiles" / "cpu-py311" / "apt.lock").read_text()
    res = envbuild("lock", "cpu-py311", "--base", BASE, "--find-links", WHEELS, cwd=proj)
    assert res.returncode == 4, res.stderr[-3000:]
    assert "apt could not resolve cpu-py311's OS packages" in res.stderr
    assert "Unable to locate package envbuild-no-such-package" in res.stderr
    assert "`apt:` list" in res.stderr
    assert (proj / "lockfiles" / "cpu-py311" / "apt.lock").read_text() == before  # nothing half-written
    # and `lock --check` still says apt.lock is stale: the list changed
    assert envbuild("lock", "--check", "cpu-py311", cwd=proj).returncode == 1


def test_a_tampered_deb_hash_fails_the_build_and_moves_no_tag(
    docker_client: Any, built_cpu: dict[str, Any], e2e_project: Path, repo_name: str, tmp_path: Path
) -> None:
    """An apt.lock whose record was rewritten to match a swapped sha256 is consistent, and wrong: the
    build's own sha256 check against the downloaded .deb stops it."""
    proj = _copy(e2e_project, tmp_path / "tampered")
    path = proj / "lockfiles" / "cpu-py311" / "apt.lock"
    apt = aptfile.parse(path.read_text())
    victim = next(d for d in apt.stages["runtime"] if d.name == "python3.11")
    import dataclasses

    runtime = tuple(dataclasses.replace(d, sha256="0" * 64) if d == victim else d for d in apt.stages["runtime"])
    stages = {**apt.stages, "runtime": runtime}
    record = apt.record.model_copy(update={"resolution": aptfile.resolution_of(apt.base, stages, apt.snapshot)})
    path.write_text(aptfile.text(dataclasses.replace(apt, record=record, stages=stages), "envbuild lock cpu-py311"))
    assert envbuild("lock", "--check", "cpu-py311", cwd=proj).returncode == 0  # consistent on its face
    before = docker_client.images.get(f"{repo_name}:cpu-py311").id
    res = envbuild(*local_build("cpu-py311", repo_name), cwd=proj)
    assert res.returncode == 7, res.stderr[-3000:]
    assert "a downloaded .deb is not the file apt.lock records" in res.stderr
    log = (proj / ".envbuild" / "cpu-py311" / "build.log").read_text()
    assert f"{victim.filename}: FAILED" in log
    assert docker_client.images.get(f"{repo_name}:cpu-py311").id == before


def test_a_base_with_other_packages_is_noticed_before_anything_is_installed(
    docker_client: Any, built_cpu: dict[str, Any], e2e_project: Path, repo_name: str, tmp_path: Path
) -> None:
    proj = _copy(e2e_project, tmp_path / "otherbase")
    dockerfile = (
        f"FROM {BASE}\nRUN apt-get update && apt-get install -y --no-install-recommends less && apt-get clean\n"
    )
    other = f"{repo_name}-base:less"
    docker_client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=other, rm=True)
    try:
        args = local_build("cpu-py311", repo_name)
        args[args.index("--base") + 1] = other
        res = envbuild(*args, cwd=proj)
        assert res.returncode == 7, res.stderr[-3000:]
        assert "the base image's own packages are not the ones apt.lock was resolved against" in res.stderr
        assert "envbuild lock cpu-py311 --base IMAGE" in res.stderr
        log = (proj / ".envbuild" / "cpu-py311" / "build.log").read_text()
        assert "+less " in log  # the difference itself, in the log
        # the fix the error names does what it says: apt.lock is resolved again, on that base (the
        # Python lockfiles are fresh: it used to answer "up to date" and change nothing)
        relock = envbuild("lock", "cpu-py311", "--base", other, "--find-links", WHEELS, cwd=proj)
        assert relock.returncode == 0 and f"OS packages on {other}" in relock.stderr, relock.stderr[-3000:]
        relocked = aptfile.parse((proj / "lockfiles" / "cpu-py311" / "apt.lock").read_text())
        assert relocked.base_image == other and any(d.name == "less" for d in relocked.base)
    finally:
        docker_client.images.remove(other, force=True)


def test_a_conda_profile_locks_its_runtime_os_packages_and_the_build_pins_them(tmp_path: Path) -> None:
    """A conda image's Python comes from conda-lock.yml; its compiler and `apt:` list come from the
    archive, so they are locked too: apt.lock with a runtime stage only, checked like the venv's."""
    import json

    from ..condachannel import conda_project, make_channel

    proj = conda_project(tmp_path / "proj", make_channel(tmp_path / "channel"), extra='apt: ["less"]\n')
    res = envbuild("lock", "cpu-py311-conda", "--solver", "rattler", "--base", BASE, cwd=proj)
    assert res.returncode == 0, res.stderr[-3000:]
    text = (proj / "lockfiles" / "cpu-py311-conda" / "apt.lock").read_text()
    apt = aptfile.parse(text)
    names = {d.name for d in apt.stages["runtime"]}
    assert {"g++", "less"} <= names and not apt.stages["builder"]  # nothing on the builder: micromamba's
    assert "[[builder]]" not in text and all(len(d.sha256) == 64 for d in apt.stages["runtime"])
    assert envbuild("lock", "--check", "cpu-py311-conda", cwd=proj).returncode == 0

    built = envbuild("build", "cpu-py311-conda", "--base", BASE, "--context-only", "--json", cwd=proj)
    assert built.returncode == 0, built.stderr[-3000:]
    report = json.loads(built.stdout)
    ctx = Path(report["context"])
    dockerfile = (ctx / "Dockerfile").read_text()
    runtime = dockerfile[dockerfile.index("AS runtime") :]
    for deb in apt.stages["runtime"]:
        assert f" {deb.pin}" in runtime
    assert "sha256sum --check --quiet /opt/envbuild/apt/runtime.sha256" in runtime
    assert (ctx / "apt" / "apt.lock").read_text() == text
    assert (ctx / "apt" / "runtime.expect").read_text().splitlines() == apt.expected("runtime")
    assert report["labels"]["io.envbuild.apt-lock-sha256"]
    # a derived image's pip keeps torch and numpy here too: the pins are the environment's own,
    # appended at build time to the comment lines the context carries
    held = (ctx / "smoke" / "constraints.txt").read_text()
    assert held.startswith("# The tested torch build and numpy of envbuild profile cpu-py311-conda")
    assert "==" not in held
    held_by_build = "--append /opt/envbuild/constraints.txt numpy torch triton --channel-only torchaudio torchvision\n"
    assert f"envbuild_smoke.constraints {held_by_build}" in runtime
    assert "held at <0: add `torchvision: auto` (or torchaudio) to the profile" in held
    assert "PIP_CONSTRAINT=/opt/envbuild/constraints.txt" in runtime
    # its SBOM, as a venv image's: the conda packages, the OS packages apt.lock installs, labelled
    sbom = (ctx / "smoke" / "sbom.cdx.json").read_text()
    purls = {c["purl"] for c in json.loads(sbom)["components"]}
    assert {"pkg:conda/pytorch@2.5.1", "pkg:conda/python@3.11.9"} <= purls
    assert any(p.startswith("pkg:deb/less@") for p in purls)
    assert report["labels"]["io.envbuild.sbom-sha256"] == hashlib.sha256(sbom.encode()).hexdigest()

    # a changed `apt:` list makes apt.lock stale, and the build refuses it
    with (proj / "profiles" / "cpu-py311-conda.yaml").open("a") as fh:
        fh.write("compile: false\n")
    check = envbuild("lock", "--check", "cpu-py311-conda", cwd=proj)
    assert check.returncode == 1 and "apt.lock" in check.stdout + check.stderr
