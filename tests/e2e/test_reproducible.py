"""Reproducible, and measured so: two cold builds from one lockfile give the same environment, and a
file changed inside an image is caught and named."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from envbuild.smoke import host
from tests.unit.test_hardening import record

from .conftest import derived, envbuild, layer_table, local_build

pytestmark = pytest.mark.e2e


def _check(report: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in report["checks"] if c["name"] == name)


def test_two_cold_builds_of_one_lockfile_give_the_same_environment(
    docker_client: Any, built_cpu: dict[str, Any], e2e_project: Path, repo_name: str
) -> None:
    """Measured before: 5,957 of 22,413 files under /opt/venv differed between two builds (byte code)."""
    first = built_cpu["labels"]["io.envbuild.env-digest"]
    assert len(first) == 64
    t0 = time.monotonic()
    res = envbuild(
        *local_build("cpu-py311", f"{repo_name}-cold"), "--no-cache", "--no-smoke", "--json", cwd=e2e_project
    )
    assert res.returncode == 0, res.stderr[-3000:]
    again = json.loads(res.stdout)
    seconds = time.monotonic() - t0
    assert again["labels"]["io.envbuild.env-digest"] == first, "two builds of one lockfile differ"
    assert again["built_image_id"] != built_cpu["built_image_id"]  # really rebuilt, not taken from the cache
    # Layer by layer: which layers of the two images are byte for byte the same (same diff ID), and
    # which step made each; docs/REPRODUCIBILITY.md explains the rest.
    steps = [step for _, step, _ in layer_table(docker_client, built_cpu["built_image_id"])]
    layers_a = docker_client.images.get(built_cpu["built_image_id"]).attrs["RootFS"]["Layers"]
    layers_b = docker_client.images.get(again["built_image_id"]).attrs["RootFS"]["Layers"]
    assert len(layers_a) == len(layers_b)
    pairs = list(enumerate(zip(layers_a, layers_b, strict=True)))
    same = [steps[i] if i < len(steps) else f"layer {i}" for i, (x, y) in pairs if x == y]
    differ = [steps[i] if i < len(steps) else f"layer {i}" for i, (x, y) in pairs if x != y]
    assert same and same[0] == "base image"  # at least the pinned base is shared
    # the environment's layers (torch, torch-deps, numpy, the venv, the rest: each a tree copied to
    # /, every file at one fixed time) are byte for byte the same: a registry stores them once
    environment = [i for i, step in enumerate(steps) if step == "COPY to /"]
    assert len(environment) == 5, steps
    assert [steps[i] for i, (x, y) in pairs if i in environment and x != y] == []
    record(
        "reproducible_build",
        cold_build_seconds=round(seconds, 1),
        env_digest_equal=True,
        layers=len(layers_a),
        layers_identical=f"{len(same)}: " + "; ".join(same),
        layers_different=f"{len(differ)}: " + "; ".join(differ),
    )
    # the first plain build after a --no-cache one is as cached as any: each builder-side stage
    # begins with a step of its own, so no stage takes another's cache images for its first steps
    plain = envbuild(*local_build("cpu-py311", f"{repo_name}-cold"), "--no-smoke", "--json", cwd=e2e_project)
    assert plain.returncode == 0, plain.stderr[-3000:]
    assert json.loads(plain.stdout)["ran_steps"] == 0
    for image in docker_client.images.list(name=f"{repo_name}-cold"):
        for tag in image.tags:
            docker_client.images.remove(tag, force=True)


def test_a_file_changed_inside_the_image_fails_the_integrity_check_naming_its_distribution(
    docker_client: Any, built_cpu: dict[str, Any]
) -> None:
    """It passed the smoke test before: a derived image that appends a line to a numpy source file.
    And (by hand, 2026-12-07) the same with the manifest and its digest removed: integrity said "no
    build manifest here" and skipped, and the smoke test passed."""
    image = derived(
        docker_client,
        built_cpu["image_id"],
        "USER root",
        "RUN echo '# changed' >> /opt/venv/lib/python3.11/site-packages/numpy/__init__.py",
        "USER 1000:1000",
    )
    unvouched = derived(
        docker_client, image.id, "USER root", "RUN rm -rf /opt/envbuild/manifest* /opt/envbuild/env-digest"
    )
    try:
        report = host.run_in_image(docker_client, image.id, gpus="none", accelerator="cpu")
        without = host.run_in_image(docker_client, unvouched.id, gpus="none", accelerator="cpu")
    finally:
        docker_client.images.remove(unvouched.id, force=True)  # its untagged parent goes with it
    assert not report["passed"] and "integrity" in report["failed"]
    reason = _check(report, "integrity")["reason"]
    assert "numpy: 1 file(s) changed (lib/python3.11/site-packages/numpy/__init__.py)" in reason
    assert not without["passed"] and without["failed"] == ["labels"], without["failed"]
    assert _check(without, "integrity")["status"] == "skip"
    said = _check(without, "labels")["reason"]
    assert "io.envbuild.env-digest says the build wrote a manifest of the environment, but the image has none" in said
    assert _check(built_cpu["smoke"], "integrity")["status"] == "pass"


_REWRITE_ENTRY = (
    "import hashlib, json; p = '/opt/envbuild/manifest.json'; m = json.load(open(p)); "
    "rel = 'lib/python3.11/site-packages/numpy/__init__.py'; "
    "m['files'][rel] = [m['files'][rel][0], hashlib.sha256(open('/opt/venv/' + rel, 'rb').read()).hexdigest()]; "
    "json.dump(m, open(p, 'w'), sort_keys=True, separators=(',', ':'))"
)


_FORGE_DIGEST = (
    "import json, sys; sys.path.insert(0, '/opt/envbuild'); from envbuild_smoke.manifest import digest; "
    "open('/opt/envbuild/env-digest', 'w').write(digest(json.load(open('/opt/envbuild/manifest.json'))))"
)


def test_a_tampered_file_and_manifest_a_rewritten_label_or_an_os_python_edit_fail_the_smoke_test(
    docker_client: Any, built_cpu: dict[str, Any]
) -> None:
    """All three passed every check before: a file changed with its manifest entry rewritten to
    match, `LABEL io.envbuild.torch=2.5.1` on an image that holds torch 2.13.0, and a sitecustomize.py
    (run at every start) in the OS Python the venv runs on. And (by hand, 2026-12-07) the first with
    the env-digest rewritten too, file and label: only its wheel's RECORD still tells."""
    tampered = derived(
        docker_client,
        built_cpu["image_id"],
        "USER root",
        "RUN echo '# changed' >> /opt/venv/lib/python3.11/site-packages/numpy/__init__.py",
        f'RUN python -c "{_REWRITE_ENTRY}"',
        "USER 1000:1000",
    )
    digest_rewritten = derived(
        docker_client, tampered.id, "USER root", f'RUN python -c "{_FORGE_DIGEST}"', "USER 1000:1000"
    )
    forged_digest = docker_client.containers.run(
        digest_rewritten.id, ["cat", "/opt/envbuild/env-digest"], remove=True
    ).decode()
    forged = derived(docker_client, digest_rewritten.id, f"LABEL io.envbuild.env-digest={forged_digest}")
    relabelled = derived(docker_client, built_cpu["image_id"], 'LABEL io.envbuild.torch="2.5.1"')
    # Debian's stdlib sitecustomize.py is a link into /etc: the edit lands outside every scanned folder
    customised = derived(
        docker_client,
        built_cpu["image_id"],
        "USER root",
        "RUN echo 'import sys' > /usr/lib/python3.11/sitecustomize.py",
        "USER 1000:1000",
    )
    try:
        report = host.run_in_image(docker_client, tampered.id, gpus="none", accelerator="cpu")
        assert not report["passed"] and report["failed"] == ["integrity"], report["failed"]
        assert "manifest.json was changed after the build" in _check(report, "integrity")["reason"]
        report = host.run_in_image(docker_client, forged.id, gpus="none", accelerator="cpu")
        assert not report["passed"] and report["failed"] == ["integrity"], report["failed"]
        said = _check(report, "integrity")["reason"]
        assert "numpy: 1 file(s) unlike their wheel's RECORD (lib/python3.11/site-packages/numpy/__init__.py)" in said
        assert "which the manifest lists as they are: it was rewritten with them" in said
        report = host.run_in_image(docker_client, relabelled.id, gpus="none", accelerator="cpu")
        assert not report["passed"] and report["failed"] == ["labels"], report["failed"]
        assert "io.envbuild.torch='2.5.1' but the image holds torch 2.13.0" in _check(report, "labels")["reason"]
        report = host.run_in_image(docker_client, customised.id, gpus="none", accelerator="cpu")
        assert not report["passed"] and report["failed"] == ["integrity"], report["failed"]
        said = _check(report, "integrity")["reason"]
        assert "the base Python (/usr/lib/python3.11): 1 file(s) changed (sitecustomize.py)" in said
    finally:
        # forged's untagged parents (digest_rewritten, tampered) go with it
        for image in (forged, relabelled, customised):
            docker_client.images.remove(image.id, force=True)
    assert _check(built_cpu["smoke"], "labels")["status"] == "pass"


_FAKE = '{"passed": true, "failed": [], "checks": []}'


def test_an_image_whose_own_smoke_test_was_replaced_cannot_fake_a_passing_report(
    docker_client: Any, built_cpu: dict[str, Any]
) -> None:
    """It passed before: the smoke ran the image's own envbuild-smoke, which a derived image can
    replace (here with one that prints a passing report) along with its package, its entrypoint
    script and its ENTRYPOINT. The host's copy of the smoke test runs instead and finds the edit."""
    faked = derived(
        docker_client,
        built_cpu["image_id"],
        "USER root",
        "RUN echo '# changed' >> /opt/venv/lib/python3.11/site-packages/numpy/__init__.py",
        f"RUN echo '{_FAKE}' > /opt/envbuild/fake.json",
        r"RUN printf '#!/bin/sh\ncat /opt/envbuild/fake.json\n' | tee /opt/envbuild/envbuild-smoke "
        "/opt/envbuild/entrypoint",
        """RUN echo 'print(open("/opt/envbuild/fake.json").read())' > /opt/envbuild/envbuild_smoke/__main__.py""",
        'ENTRYPOINT ["/opt/envbuild/entrypoint"]',
        "USER 1000:1000",
    )
    try:
        # the image's own smoke test now lies
        said = docker_client.containers.run(faked.id, ["envbuild-smoke", "--json", "-"], remove=True)
        assert json.loads(said)["passed"] is True
        report = host.run_in_image(docker_client, faked.id, gpus="none", accelerator="cpu")
    finally:
        docker_client.images.remove(faked.id, force=True)
    assert not report["passed"] and report["failed"] == ["integrity"], report["failed"]
    assert (
        "numpy: 1 file(s) changed (lib/python3.11/site-packages/numpy/__init__.py)"
        in _check(report, "integrity")["reason"]
    )


def test_diff_names_what_a_derived_image_added_and_agrees_with_the_lockfile(
    docker_client: Any, built_cpu: dict[str, Any], e2e_project: Path
) -> None:
    """The derived image also prints as every Python starts (a sitecustomize.py) and has an
    ENTRYPOINT that prints a banner: the scan ran the image's entrypoint and site hooks, and the
    first line printed made `diff` and `sbom` end with an internal error (JSONDecodeError)."""
    extra = "RUN echo 'x = 1' > /opt/venv/lib/python3.11/site-packages/extra_module.py"
    hook = "RUN echo 'print(\"site hook\")' > /usr/lib/python3.11/sitecustomize.py"
    banner = r"""RUN printf '#!/bin/sh\necho banner\nexec "$@"\n' > /banner && chmod +x /banner"""
    image = derived(
        docker_client,
        built_cpu["image_id"],
        "USER root",
        extra,
        hook,
        banner,
        'ENTRYPOINT ["/banner"]',
        "USER 1000:1000",
    )
    try:
        assert docker_client.containers.run(image.id, ["python", "-c", "pass"], remove=True) == b"banner\nsite hook\n"
        res = envbuild("diff", built_cpu["image_id"], image.id, "--json", cwd=e2e_project)
        assert res.returncode == 1, res.stderr
        found = json.loads(res.stdout)
        assert found["file_counts"]["only_b"] == 1
        assert found["files"]["only_b"] == ["lib/python3.11/site-packages/extra_module.py"]
        # the base Python's files are compared too: every process imports the sitecustomize
        assert found["files"]["changed"] == ["/usr/lib/python3.11/sitecustomize.py"]
        res = envbuild("sbom", image.id, cwd=e2e_project)
        assert res.returncode == 0, res.stderr
        assert {c["name"] for c in json.loads(res.stdout)["components"]} >= {"torch", "numpy"}
        # the image against its own profile's lockfile: the same distributions
        res = envbuild("diff", built_cpu["image_id"], "cpu-py311", cwd=e2e_project)
        assert res.returncode == 0, res.stdout + res.stderr
        assert "the same environment" in res.stdout
    finally:
        docker_client.images.remove(image.id, force=True)


def test_the_sbom_of_an_image_lists_its_distributions_with_hashes_and_its_os_packages(
    built_cpu: dict[str, Any], e2e_project: Path
) -> None:
    res = envbuild("sbom", built_cpu["image_id"], cwd=e2e_project)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    parts = {c["purl"].split("@")[0]: c for c in doc["components"]}
    assert parts["pkg:pypi/torch"]["version"] == "2.13.0+cpu" and parts["pkg:pypi/torch"]["hashes"]
    assert parts["pkg:pypi/numpy"]["version"] == "2.1.3" and parts["pkg:pypi/numpy"]["hashes"]
    debs = {c["name"] for c in doc["components"] if c["purl"].startswith("pkg:deb/")}
    assert {"python3.11", "g++"} <= debs  # the OS packages the image holds
