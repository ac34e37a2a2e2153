"""`build --context-only` (for bake and other builders) and the one-build-per-profile lock, without an engine."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from envbuild import build, lockfile
from envbuild.project import open_project

from ..conftest import Result


def test_context_only_writes_the_context_bake_points_at_and_builds_nothing(
    cli: Callable[..., Result], engineless_project: Path
) -> None:
    res = cli("build", "cu121-py311", "--context-only", "--json")
    assert res.code == 0, res.err
    report = json.loads(res.out)
    ctx = Path(report["context"])
    assert sorted(p.name for p in ctx.iterdir()) == [
        "Dockerfile",
        "certs",
        "requirements.lock",
        "requirements.numpy.lock",
        "requirements.rest.lock",
        "requirements.torch-deps.lock",
        "requirements.torch-extras.lock",
        "requirements.torch.lock",
        "smoke",
        "tools",
        "wheels",
    ]
    # this machine's uv, for the builder to install with (the image is for this machine's platform),
    # and the image's manifest module, for each layer's step to write its part of the manifest
    assert (ctx / "tools" / "uv").is_file() and "tools/uv pip install" in (ctx / "Dockerfile").read_text()
    assert (ctx / "tools" / "manifest.py").read_text() == (ctx / "smoke" / "envbuild_smoke" / "manifest.py").read_text()
    locked = (engineless_project / "lockfiles" / "cu121-py311" / "requirements.lock").read_text()
    assert (ctx / "requirements.lock").read_text() == locked
    # the layers' parts of the lockfile: every locked package in exactly one, hashes as locked
    parts = {
        g: lockfile.parse_requirements((ctx / f"requirements.{g}.lock").read_text())
        for g in ("torch", "torch-extras", "torch-deps", "numpy", "rest")
    }
    whole = lockfile.parse_requirements(locked)
    assert sorted(n for p in parts.values() for n in p) == sorted(whole)
    assert all(pin.hashes == whole[name].hashes for p in parts.values() for name, pin in p.items())
    assert "torch" in parts["torch"] and any(n.startswith("nvidia-") for n in parts["torch"])
    assert "triton" in parts["torch"] and "torchvision" in parts["torch-extras"] and list(parts["numpy"]) == ["numpy"]
    # what only torch pulls in (uv's "# via") is a layer of its own; the profile's own packages are not in it
    assert {"sympy", "jinja2", "markupsafe"} <= set(parts["torch-deps"]) and "einops" in parts["rest"]
    # what `python -m venv` put there is replaced in place by the locked version, never from another layer
    # (torch 2.3.1 pins no setuptools: test_the_venvs_own_setuptools_is_installed_before_the_rest)
    assert "setuptools" not in whole and not (ctx / "requirements.seed.lock").exists()
    # what a derived image's pip may not move: the torch build, its runtime wheels, torchvision,
    # torchaudio and numpy, as locked; the profile's own packages stay the derived image's to change
    held = lockfile.parse_requirements((ctx / "smoke" / "constraints.txt").read_text())
    # and torchaudio, which the profile does not ask for: a derived image that adds it gets the one
    # that pairs with torch 2.3.1, from PyPI like this torch build (so no ENVBUILD_TORCH_INDEX)
    assert {n: p.version for n, p in held.items()} == {
        **{n: p.version for n, p in whole.items() if n in parts["torch"] or n in parts["torch-extras"] or n == "numpy"},
        "torchaudio": "2.3.1",
    }
    assert "ENVBUILD_TORCH_INDEX=" not in (ctx / "Dockerfile").read_text()
    assert "envbuild lock cu121-py311 && envbuild build cu121-py311" in (ctx / "smoke" / "constraints.txt").read_text()
    dockerfile = (ctx / "Dockerfile").read_text()
    assert "FROM ${BASE_IMAGE} AS runtime" in dockerfile
    env_line = "    PIP_CONSTRAINT=/opt/envbuild/constraints.txt \\\n    UV_CONSTRAINT=/opt/envbuild/constraints.txt\n"
    assert env_line in dockerfile
    assert f'io.envbuild.lock-sha256="{report["labels"]["io.envbuild.lock-sha256"]}"' in dockerfile
    bake = json.loads(cli("matrix", "--format", "bake").out)
    assert (engineless_project / bake["target"]["cu121-py311"]["context"]).resolve() == ctx.resolve()
    assert bake["target"]["cu121-py311"]["target"] == report["target"]
    human = cli("build", "cu121-py311", "--context-only")
    assert human.code == 0
    assert "docker build --target runtime .envbuild/cu121-py311/context" in human.out


def test_the_build_lock_is_per_profile_and_seen_from_outside(engineless_project: Path) -> None:
    project = open_project(str(engineless_project))
    said: list[str] = []
    assert not build.building(project, "cu121-py311")
    with build.exclusive(project, "cu121-py311", lambda *e: said.append(e[2])):
        assert build.building(project, "cu121-py311")
        assert not build.building(project, "cpu-py311")
    assert not build.building(project, "cu121-py311")
    assert said == []  # nobody else held it: no waiting message


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["build", "cu121-py311", "--smoke-timeout", "-5"], "--smoke-timeout -5: must be a positive number of seconds"),
        (["smoke", "--local", "cpu-py311", "--timeout", "0"], "--timeout 0: must be a positive number of seconds"),
    ],
)
def test_a_timeout_that_is_not_positive_is_refused_before_anything_runs(
    cli: Callable[..., Result], engineless_project: Path, args: list[str], message: str
) -> None:
    res = cli(*args)
    assert res.code == 2
    assert message in res.err
    assert not (engineless_project / ".envbuild").exists()


def test_a_remote_with_a_ci_token_in_it_is_labelled_without_the_token(
    cli: Callable[..., Result], engineless_project: Path
) -> None:
    """GitLab CI clones over https://gitlab-ci-token:TOKEN@host/...: the source label goes into every
    pushed image (both stages), so the token must not."""
    subprocess.run(["git", "init", "-q"], cwd=engineless_project, check=True)
    remote = "https://gitlab-ci-token:glcbt-s3cr3t@gitlab.example.com/ml/envs.git"
    subprocess.run(["git", "remote", "add", "origin", remote], cwd=engineless_project, check=True)
    res = cli("build", "cu121-py311", "--context-only", "--json")
    assert res.code == 0, res.err
    report = json.loads(res.out)
    assert (
        report["labels"]["org.opencontainers.image.source"] == "https://gitlab.example.com/ml/envs"
    )  # its web address
    dockerfile = (Path(report["context"]) / "Dockerfile").read_text()
    assert "s3cr3t" not in dockerfile
    # Both stages carry it: the image and the builder stage the engine keeps as cache.
    # on the image and on each builder-side stage's cache image (one per layer)
    stages = dockerfile.count('io.envbuild.layer="')
    assert stages >= 2
    assert dockerfile.count('org.opencontainers.image.source="https://gitlab.example.com/ml/envs"') == stages + 1


def test_the_revision_and_created_labels_are_the_last_commit_of_what_the_image_is_made_from(
    cli: Callable[..., Result], engineless_project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """They were HEAD (and the lockfile's commit time): a commit of the project's own code gave
    every image a new ID, so a build with nothing to do made a new image, moved its tags and ran the
    whole smoke test again. Now both name the last commit of the profiles, envbuild.toml or the
    profile's lockfiles; SOURCE_DATE_EPOCH still wins for the time."""
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)

    def git(*args: str, when: int | None = None) -> str:
        env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@e", "GIT_COMMITTER_NAME": "t"}
        env["GIT_COMMITTER_EMAIL"] = "t@e"
        if when is not None:
            env["GIT_COMMITTER_DATE"] = env["GIT_AUTHOR_DATE"] = f"@{when} +0000"
        done = subprocess.run(["git", *args], cwd=engineless_project, env=env, check=True, capture_output=True)
        return done.stdout.decode().strip()

    def labels() -> dict[str, str]:
        res = cli("build", "cu121-py311", "--context-only", "--json")
        assert res.code == 0, res.err
        found: dict[str, str] = json.loads(res.out)["labels"]
        return found

    git("init", "-q")
    git("add", "-A")
    git("commit", "-q", "-m", "profiles and lockfiles", when=1_700_000_000)
    defined = git("rev-parse", "HEAD")
    (engineless_project / "train.py").write_text("print('the project's own code')\n")
    git("add", "train.py")
    git("commit", "-q", "-m", "code", when=1_700_100_000)
    first = labels()
    assert first["org.opencontainers.image.revision"] == defined != git("rev-parse", "HEAD")
    assert first["org.opencontainers.image.created"] == "2023-11-14T22:13:20Z"  # 1_700_000_000
    profile = engineless_project / "profiles" / "cu121-py311.yaml"
    profile.write_text(profile.read_text().replace("description:", "description: edited", 1))
    git("commit", "-q", "-am", "a profile edited", when=1_700_200_000)
    assert labels()["org.opencontainers.image.revision"] == git("rev-parse", "HEAD")
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1600000000")
    assert labels()["org.opencontainers.image.created"] == "2020-09-13T12:26:40Z"


def test_a_relock_of_a_small_package_leaves_the_torch_stages_label_as_it_was(engineless_project: Path) -> None:
    """The label that closes a layer stage carries that layer's own part of the lockfile: when only
    einops moves, the torch stage's label (and so its image ID and the runtime's cached COPY --from
    it) stays; the rest stage's changes."""
    import re

    from envbuild import layering
    from envbuild import plan as plan_mod
    from envbuild.validate import load_named

    project = open_project(str(engineless_project))
    plan = plan_mod.make(project, load_named(project, "cpu-py311"))
    before = (engineless_project / "lockfiles" / "cpu-py311" / "requirements.lock").read_text()
    after = before.replace("einops==0.8.1", "einops==0.8.0")
    assert after != before
    old, new = layering.layer_digests(plan, before), layering.layer_digests(plan, after)
    assert old["torch"] == new["torch"] and old["numpy"] == new["numpy"] and old["rest"] != new["rest"]

    def stage_labels(text: str) -> dict[str, str]:
        labels = {"io.envbuild.profile": "cpu-py311", "io.envbuild.lock-sha256": lockfile.lock_sha256(text)}
        dockerfile = layering.render_for(plan, lockfile.parse_requirements(text), None, labels, "uv", text)[0]
        stages = re.split(r"\nFROM ", dockerfile["Dockerfile"])
        return {s.split()[2]: s[s.rindex("LABEL ") :] for s in stages if s.startswith("venv-base AS ")}

    first, second = stage_labels(before), stage_labels(after)
    assert f'io.envbuild.layer-sha256="{old["torch"]}"' in first["layer-torch"]
    assert "lock-sha256" not in first["layer-torch"]
    assert first["layer-torch"] == second["layer-torch"] and first["layer-numpy"] == second["layer-numpy"]
    assert first["builder"] != second["builder"]


def test_a_context_with_every_locked_wheel_asks_no_index(engineless_project: Path) -> None:
    """A build whose wheel cache gives every wheel the lock pins installs with --no-index: a mirror
    that is down, or a TLS-intercepting proxy without --ca-bundle, no longer fails it (uv used to ask
    the index for every package in every layer stage, wheel or not). One wheel short, the index
    stays: the builder fetches that one from where the lockfile says."""
    import dataclasses

    from envbuild import buildctx, freshness, layering
    from envbuild import plan as plan_mod
    from envbuild.torchsource import TorchSource
    from envbuild.validate import load_named

    project = open_project(str(engineless_project))
    plan = plan_mod.make(project, load_named(project, "cpu-py311"))
    lock = freshness.require_fresh(project, plan)
    placed = {Path(f"/cache/{name}.whl"): name for name in lock.pins}

    def installs(source: TorchSource, tool: str) -> tuple[list[str], str]:
        built = dataclasses.replace(plan, source=source)
        text = layering.render_for(built, lock.pins, lock.apt, {}, tool, lock.text)[0]["Dockerfile"]
        return [line for line in text.splitlines() if " pip install " in line], text

    offline = buildctx._build_source(plan, lock, placed)
    one_short = buildctx._build_source(plan, lock, {w: n for w, n in placed.items() if n != "einops"})
    assert offline.offline and not one_short.offline
    # torch itself is there: the PyTorch index (cpu-py311's torch route) is not asked, PyPI is
    assert one_short.route == "index" and one_short.torch_index is None and one_short.torch_index_flat
    no_torch = buildctx._build_source(plan, lock, {w: n for w, n in placed.items() if n != "torch"})
    assert no_torch.torch_index == "https://download.pytorch.org/whl/cpu" and not no_torch.offline
    for tool in ("uv", "pip"):  # uv where this machine's runs in the image, else the venv's pip
        lines, text = installs(offline, tool)
        assert len(lines) >= 4 and all("--no-index" in line and "--index-url" not in line for line in lines)
        assert "PIP_INDEX_URL" not in text
        lines, text = installs(one_short, tool)
        assert lines and not any("--no-index" in line for line in lines)
        assert 'ARG PIP_INDEX_URL="https://pypi.org/simple"' in text


def test_the_venvs_own_setuptools_is_installed_before_the_rest(
    engineless_project: Path, cli: Callable[..., Result]
) -> None:
    """A re-lock of the profile's own packages used to replace `python -m venv`'s setuptools with
    the locked one and compile its ~900 files again: now a step of its own, before the rest's
    install, which such a re-lock leaves cached."""
    res = cli("build", "cpu-py311", "--context-only", "--json")
    assert res.code == 0, res.err
    ctx = Path(json.loads(res.out)["context"])
    seed = lockfile.parse_requirements((ctx / "requirements.seed.lock").read_text())
    rest = lockfile.parse_requirements((ctx / "requirements.rest.lock").read_text())
    whole = lockfile.parse_requirements((ctx / "requirements.lock").read_text())
    assert list(seed) == ["setuptools"] and seed["setuptools"].hashes == whole["setuptools"].hashes
    assert "setuptools" not in rest and "einops" in rest
    dockerfile = (ctx / "Dockerfile").read_text()
    builder = dockerfile[dockerfile.index("FROM venv-base AS builder") : dockerfile.index("AS runtime")]
    ensurepip, seed_step, rest_step = (
        builder.index("ensurepip"),
        builder.index("-r /tmp/envbuild/requirements.seed.lock"),
        builder.index("-r /tmp/envbuild/requirements.rest.lock"),
    )
    assert ensurepip < seed_step < builder.index("COPY wheels/rest/") < rest_step
    assert {w.name.split("-")[0] for w in (ctx / "wheels" / "seed").iterdir()} <= {"setuptools"}
    assert not any(w.name.startswith("setuptools-") for w in (ctx / "wheels" / "rest").iterdir())


def test_an_apt_snapshot_build_leaves_apts_sources_as_the_base_had_them(engineless_project: Path) -> None:
    """With apt_snapshot, the image shipped its sources pointed at the dated archive and Valid-Until
    off: `FROM image` + `apt-get install` then got packages without the security updates since.
    Both apt steps now put the base's sources back in the same RUN; without a snapshot, the step
    (and so its cached layer) is as before."""
    import dataclasses

    from envbuild import freshness, layering
    from envbuild import plan as plan_mod
    from envbuild.validate import load_named

    project = open_project(str(engineless_project))
    plan = plan_mod.make(project, load_named(project, "cpu-py311"))
    lock = freshness.require_fresh(project, plan)
    assert lock.apt is not None and not lock.apt.snapshot
    live = layering.render_for(plan, lock.pins, lock.apt, {}, "uv", lock.text)[0]["Dockerfile"]
    dated = dataclasses.replace(lock.apt, snapshot="20250101T000000Z")
    text = layering.render_for(plan, lock.pins, dated, {}, "uv", lock.text)[0]["Dockerfile"]
    steps = [s for s in text.split("\nRUN ") if "snapshot.debian.org" in s]
    assert len(steps) == 2  # the builder's and the runtime's apt step
    for whole in steps:
        lines = whole.splitlines()
        run = "\n".join(lines[: next(i for i, line in enumerate(lines) if not line.endswith("\\")) + 1])
        assert run.index("apt-get install") < run.index("tar -xPpf /opt/envbuild/apt/sources.tar")
        assert run.endswith("rm -f /opt/envbuild/apt/sources.tar /etc/apt/apt.conf.d/99envbuild-snapshot")
    assert "sources.tar" not in live


def test_the_context_gives_the_image_the_same_modes_whatever_the_users_umask(
    cli: Callable[..., Result], engineless_project: Path
) -> None:
    """Under a umask of 077 the context's folders were 0700 and COPY kept that: in the image
    /opt/envbuild/checks and /opt/envbuild/bin were root's alone, so the project's own check failed
    ("Permission denied") as the image's user, and the layers differed from a 022 build's."""

    def modes() -> dict[str, int]:
        res = cli("build", "cpu-py311", "--context-only", "--json")
        assert res.code == 0, res.err
        ctx = Path(json.loads(res.out)["context"])
        return {
            str(p.relative_to(ctx)): p.stat().st_mode & 0o777
            for p in [ctx, *ctx.rglob("*")]
            if p.suffix != ".whl" and p.parent.name != "tools"
        }

    before = os.umask(0o077)
    try:
        private = modes()
    finally:
        os.umask(before)
    assert private["smoke/checks"] == private["smoke/bin"] == private["."] == 0o755
    assert private["smoke/expect.json"] == 0o644 and private["smoke/envbuild-smoke"] == 0o755
    assert all(mode in {0o644, 0o755} for mode in private.values()), private
    os.umask(0o022)
    try:
        assert modes() == private
    finally:
        os.umask(before)
