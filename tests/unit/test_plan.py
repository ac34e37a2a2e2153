"""The build plan and the lock record: facts worked out once, and what each digest covers."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from envbuild import freshness, localimage, lockfile, validate
from envbuild import plan as plan_mod
from envbuild.names import LABEL_LOCK_SHA
from envbuild.project import open_project
from tests.conftest import Result


def _facts(project: Path, name: str) -> dict[str, str]:
    proj = open_project(str(project))
    prof = validate.load_named(proj, name)
    return {label: value for _, label, value in localimage.local_facts(proj, prof)}


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text(encoding="utf-8")
    assert old in text, old
    path.write_text(text.replace(old, new), encoding="utf-8")


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("description: CPU-only torch 2.13 for tests and CPU inference", "description: something else"),
        ('packages: ["einops==0.8.1"]', 'packages: ["einops==0.8.1"]\nregistry: "ghcr.io/acme/envs"'),
        ('packages: ["einops==0.8.1"]', 'packages: ["einops==0.8.1"]\nindex_url: "https://mirror.example/simple"'),
        ('packages: ["einops==0.8.1"]', 'packages: ["einops==0.8.1"]\ntorch_index: "https://mirror.example/whl/cpu"'),
    ],
    ids=["description", "registry", "index_url", "torch_index"],
)
def test_fields_that_do_not_reach_the_image_leave_it_current(engineless_project: Path, old: str, new: str) -> None:
    """Adding `registry:` to a tested profile made `status` call its image stale (a rebuild of GBs)."""
    before = _facts(engineless_project, "cpu-py311")
    _edit(engineless_project / "profiles" / "cpu-py311.yaml", old, new)
    assert _facts(engineless_project, "cpu-py311") == before


def test_a_lockfile_that_is_there_but_unreadable_is_not_called_missing(engineless_project: Path) -> None:
    """`run` and `smoke` compare these with the image's labels and print them; a lockfile saved in
    Latin-1 by hand was "(no local lockfile)" beside a lockfile the user could see."""
    lockf = engineless_project / "lockfiles" / "cpu-py311" / "requirements.lock"
    lockf.write_bytes(lockf.read_bytes() + "# café\n".encode("latin-1"))
    assert _facts(engineless_project, "cpu-py311")[LABEL_LOCK_SHA] == "(unreadable lockfile)"
    lockf.unlink()
    assert _facts(engineless_project, "cpu-py311")[LABEL_LOCK_SHA] == "(no local lockfile)"


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ('packages: ["einops==0.8.1"]', 'packages: ["einops==0.8.1"]\napt: ["git"]'),
        ('packages: ["einops==0.8.1"]', 'packages: ["einops==0.8.1"]\nenv: {OMP_NUM_THREADS: "4"}'),
        ('packages: ["einops==0.8.1"]', 'packages: ["einops==0.8.1"]\nbase: "debian:bookworm"'),
    ],
    ids=["apt", "env", "base"],
)
def test_fields_that_reach_the_image_make_it_stale(engineless_project: Path, old: str, new: str) -> None:
    before = _facts(engineless_project, "cpu-py311")
    _edit(engineless_project / "profiles" / "cpu-py311.yaml", old, new)
    after = _facts(engineless_project, "cpu-py311")
    assert after["io.envbuild.image-digest"] != before["io.envbuild.image-digest"]
    assert after["io.envbuild.lock-sha256"] == before["io.envbuild.lock-sha256"]


def test_a_template_override_makes_the_image_stale(engineless_project: Path) -> None:
    before = _facts(engineless_project, "cpu-py311")
    templates = engineless_project / "templates"
    templates.mkdir()
    shipped = plan_mod.default_templates_dir() / "Dockerfile.venv.j2"
    (templates / "Dockerfile.venv.j2").write_text(shipped.read_text() + "# a local change\n")
    assert _facts(engineless_project, "cpu-py311")["io.envbuild.image-digest"] != before["io.envbuild.image-digest"]


def test_status_keeps_a_fresh_lock_fresh_when_only_the_registry_changes(
    cli: Callable[..., Result], engineless_project: Path
) -> None:
    _edit(
        engineless_project / "profiles" / "cpu-py311.yaml", 'einops==0.8.1"]', 'einops==0.8.1"]\nregistry: "r.io/a/b"'
    )
    report = json.loads(cli("status", "cpu-py311", "--json").out)
    assert report["profiles"][0]["lockfile"] == "fresh"


def test_the_plan_is_the_one_place_the_torch_route_is_decided(engineless_project: Path) -> None:
    proj = open_project(str(engineless_project))
    cpu = plan_mod.make(proj, validate.load_named(proj, "cpu-py311"))
    assert (cpu.source.route, cpu.source.canonical_index) == ("index", "https://download.pytorch.org/whl/cpu")
    cu121 = plan_mod.make(proj, validate.load_named(proj, "cu121-py311"))
    assert (cu121.source.route, cu121.source.canonical_index) == ("pypi", "https://pypi.org/simple")
    # a wheelhouse is how the build is reached today, never what the lock records
    wheels = engineless_project / "wheels"
    wheels.mkdir()
    via = plan_mod.make(proj, validate.load_named(proj, "cpu-py311"), plan_mod.PlanOptions(find_links=(str(wheels),)))
    assert via.source.torch_index == wheels.as_uri() and via.source.canonical_index == cpu.source.canonical_index
    assert via.input_digest == cpu.input_digest


def test_a_derived_images_constraints_hold_the_companions_in_torchs_build(engineless_project: Path) -> None:
    """cpu-py311 locks no torchvision. `FROM image` + `pip install torchvision` took PyPI's, a CUDA
    build that imports with "operator torchvision::nms does not exist" beside torch 2.13.0+cpu: the
    constraints hold the one that pairs with torch, in torch's build, and say which index has it."""
    from envbuild import layering

    proj = open_project(str(engineless_project))
    plan = plan_mod.make(proj, validate.load_named(proj, "cpu-py311"))
    text = (engineless_project / "lockfiles" / "cpu-py311" / "requirements.lock").read_text()
    pins = lockfile.parse_requirements(text)
    held = layering.constraints(plan, pins, layering.layer_groups(plan, pins, text))
    body = [line for line in held.splitlines() if not line.startswith("#")]
    # torchaudio froze at 2.11 (`auto` locks `2.11.*`); PyPI's 2.11.1 beside a +cpu torch fails on
    # import (libc10_cuda.so), and only an exact version takes a label: the newest patch the data knows
    assert body == ["numpy==2.1.3", "torch==2.13.0+cpu", "torchaudio==2.11.1+cpu", "torchvision==0.28.0+cpu"]
    assert "pip install --extra-index-url https://download.pytorch.org/whl/cpu ..." in held
    # one the lock holds, if only as a dependency of the profile's packages, is held as locked
    pins["torchvision"] = dataclasses.replace(pins["torch"], name="torchvision", version="0.28.0+cpu")
    held = layering.constraints(plan, pins, layering.layer_groups(plan, pins, text))
    assert [line for line in held.splitlines() if line.startswith("torchvision")] == ["torchvision==0.28.0+cpu"]
    pins["torchvision"] = dataclasses.replace(pins["torch"], name="torchvision", version="0.27.9")
    held = layering.constraints(plan, pins, layering.layer_groups(plan, pins, text))
    assert [line for line in held.splitlines() if line.startswith("torchvision")] == ["torchvision==0.27.9"]


def test_the_build_takes_the_route_the_lockfile_recorded(engineless_project: Path) -> None:
    """An envbuild upgrade whose compat data moves a release's default build must not make the build's
    index arguments disagree with a lockfile that still counts as fresh."""
    proj = open_project(str(engineless_project))
    plan = plan_mod.make(proj, validate.load_named(proj, "cu121-py311"))
    snap = freshness.require_fresh(proj, plan)
    assert snap.record.route == "pypi"
    as_locked = plan.source_as_locked("index", "https://download.pytorch.org/whl/cu121")
    assert as_locked.extra_index == "https://download.pytorch.org/whl/cu121"
    assert plan.source_as_locked(snap.record.route, snap.record.index).extra_index == ""


def test_lock_record_round_trips_and_old_headers_are_read() -> None:
    record = lockfile.new_record(
        profile="cpu-py311",
        python="3.11",
        platform="x86_64",
        build="cpu",
        route="index",
        index="https://download.pytorch.org/whl/cpu",
        input_digest="a" * 64,
        resolution="b" * 64,
    )
    text = record.header("envbuild lock cpu-py311 --upgrade") + "six==1.17.0\n"
    assert text.startswith("# DO NOT EDIT: generated by envbuild")
    assert lockfile.read_record(text) == record
    old = (Path(__file__).resolve().parents[2] / "lockfiles" / "cu121-py311" / "requirements.lock").read_text()
    if lockfile.RECORD_PREFIX not in old:  # a format 1 lockfile, as committed before the record existed
        v1 = lockfile.read_record(old)
        assert (v1.format, v1.route, v1.build) == (1, "pypi", "cu121")
    with pytest.raises(lockfile.RecordError, match="no envbuild header"):
        lockfile.read_record("six==1.17.0\n")


def test_a_hand_edited_lockfile_is_reported_as_edited(cli: Callable[..., Result], engineless_project: Path) -> None:
    path = engineless_project / "lockfiles" / "cpu-py311" / "requirements.lock"
    path.write_text(path.read_text() + "six==1.17.0 \\\n    --hash=sha256:" + "1" * 64 + "\n")
    res = cli("lock", "--check", "cpu-py311", "--json")
    assert res.code == 1
    reason = json.loads(res.out)["stale"][0]["reason"]
    assert "was edited by hand" in reason
    res = cli("build", "cpu-py311", "--context-only")
    assert res.code != 0 and "edited by hand" in res.err and "envbuild lock cpu-py311" in res.err


@pytest.mark.parametrize("edit", ["hash", "version", "dropped", "added"])
def test_a_hand_edited_pylock_toml_is_reported_as_edited(
    cli: Callable[..., Result], engineless_project: Path, edit: str
) -> None:
    """CI installs from pylock.toml directly (`uv pip sync pylock.toml`): a wheel's hash swapped
    there alone, with requirements.lock intact, was reported fresh."""
    import re

    path = engineless_project / "lockfiles" / "cpu-py311" / "pylock.toml"
    text = path.read_text()
    assert cli("lock", "--check", "cpu-py311").code == 0  # as shipped: fresh
    if edit == "hash":
        wheel = re.search(r'wheels = \[\{ url = "[^"]+", [^}]*hashes = \{ sha256 = "([0-9a-f]{64})"', text)
        assert wheel is not None
        text = text.replace(wheel.group(1), "1" * 64)
    elif edit == "version":
        text = text.replace('version = "0.8.1"', 'version = "0.8.0"', 1)
    elif edit == "dropped":
        text = re.sub(r'\[\[packages\]\]\nname = "einops".*?\n\n', "", text, count=1, flags=re.S)
    else:
        six = f'url = "https://x/six.whl", hashes = {{ sha256 = "{"2" * 64}" }}'
        text += f'\n[[packages]]\nname = "six"\nversion = "1.17.0"\nwheels = [{{ {six} }}]\n'
    path.write_text(text)
    res = cli("lock", "--check", "cpu-py311", "--json")
    assert res.code == 1, res.out
    assert "pylock.toml was edited by hand" in json.loads(res.out)["stale"][0]["reason"]


def test_line_endings_change_no_digest(engineless_project: Path) -> None:
    path = engineless_project / "lockfiles" / "cpu-py311" / "requirements.lock"
    text = path.read_text()
    proj = open_project(str(engineless_project))
    plan = plan_mod.make(proj, validate.load_named(proj, "cpu-py311"), strict=False)
    lf = freshness.require_fresh(proj, plan)
    path.write_bytes(text.replace("\n", "\r\n").encode())
    crlf = freshness.require_fresh(proj, plan)
    assert crlf.sha256 == lf.sha256 and crlf.record == lf.record


def test_an_aarch64_only_profile_is_refused_before_any_work(
    cli: Callable[..., Result], engineless_project: Path
) -> None:
    path = engineless_project / "profiles" / "cpu-py311.yaml"
    _edit(path, "extends: _base\n", "extends: _base\nplatforms: [aarch64]\n")
    res = cli("build", "cpu-py311", "--context-only")
    assert res.code == 2, res.err
    assert "cpu-py311 is locked for aarch64" in res.err and "add x86_64 to the profile's platforms" in res.err


def test_a_stalled_uv_is_an_error_with_its_fix(
    cli: Callable[..., Result], engineless_project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A uv subprocess time-out reached users as 'internal error ... a bug' (exit 70)."""
    monkeypatch.setenv("ENVBUILD_UV_TIMEOUT", "0.001")
    res = cli("lock", "cpu-py312")
    assert res.code == 4, res.err
    assert "uv did not finish within" in res.err and "ENVBUILD_UV_TIMEOUT" in res.err


def test_conda_lock_without_its_binaries_is_an_error_with_its_fix(
    cli: Callable[..., Result], engineless_project: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    bare = tmp_path / "bin"
    bare.mkdir()
    monkeypatch.setenv("PATH", str(bare))
    res = cli("lock", "cpu-py311-conda", "--solver", "conda-lock")
    assert res.code == 4, res.err
    assert "needs micromamba, mamba or conda on PATH" in res.err and "--solver rattler" in res.err
    # a micromamba but no conda-lock: named, with the install command, not a traceback
    fake = bare / "micromamba"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    res = cli("lock", "cpu-py311-conda", "--solver", "conda-lock")
    assert res.code == 4, res.err
    assert "conda-lock is not installed" in res.err and "envbuild[conda]" in res.err
    assert os.environ["PATH"] == str(bare)


def test_changing_apt_changes_the_immutable_tag(cli: Callable[..., Result], engineless_project: Path) -> None:
    """`NAME-<sha>` was the lockfile's hash alone: three images with different `apt:` shared one tag."""

    def tagged() -> str:
        res = cli("build", "cpu-py311", "--context-only", "--json")
        assert res.code == 0, res.err
        return str(json.loads(res.out)["labels"]["io.envbuild.content-digest"])

    (engineless_project / "lockfiles" / "cpu-py311" / "apt.lock").unlink()  # OS packages not locked: they float
    before = tagged()
    _edit(engineless_project / "profiles" / "cpu-py311.yaml", 'einops==0.8.1"]', 'einops==0.8.1"]\napt: ["g++"]')
    after = tagged()
    assert before != after
    _edit(engineless_project / "profiles" / "cpu-py311.yaml", 'apt: ["g++"]', 'apt: ["python3.11-dev"]')
    assert tagged() not in {before, after}


def test_a_changed_apt_list_makes_apt_lock_stale_everywhere(
    cli: Callable[..., Result], engineless_project: Path
) -> None:
    """The committed apt.lock pins what `apt:` asks for: a changed list is caught offline by
    `lock --check`, `status` and `build`, which never builds from an apt.lock of other inputs."""
    assert cli("lock", "--check", "cpu-py311").code == 0
    _edit(engineless_project / "profiles" / "cpu-py311.yaml", 'einops==0.8.1"]', 'einops==0.8.1"]\napt: ["git"]')
    check = cli("lock", "--check", "cpu-py311")
    assert check.code == 1
    assert "lockfiles/cpu-py311/apt.lock: it was locked from other inputs" in check.err
    status = json.loads(cli("status", "cpu-py311", "--json").out)["profiles"][0]
    assert status["lockfile"] == "stale" and "apt.lock" in status["lock_reason"]
    built = cli("build", "cpu-py311", "--context-only")
    assert built.code == 2 and "apt.lock" in built.err and "envbuild lock cpu-py311" in built.err


def test_a_hand_edited_apt_lock_is_edited_not_fresh(cli: Callable[..., Result], engineless_project: Path) -> None:
    path = engineless_project / "lockfiles" / "cpu-py311" / "apt.lock"
    text = path.read_text()
    pin = re.search(r'name = "python3.11"\nversion = "([^"]+)"', text)
    assert pin is not None
    path.write_text(text.replace(f'version = "{pin.group(1)}"', 'version = "3.11.99-1"', 1))
    check = cli("lock", "--check", "cpu-py311")
    assert check.code == 1 and "apt.lock: it was edited by hand" in check.err
    built = cli("build", "cpu-py311", "--context-only")
    assert built.code == 2 and "edited by hand" in built.err


def test_the_build_context_carries_apt_lock_and_pins_every_package(
    cli: Callable[..., Result], engineless_project: Path
) -> None:
    from envbuild import aptfile

    res = cli("build", "cpu-py311", "--context-only", "--json")
    assert res.code == 0, res.err
    report = json.loads(res.out)
    ctx = Path(report["context"])
    lock_text = (engineless_project / "lockfiles" / "cpu-py311" / "apt.lock").read_text()
    apt = aptfile.parse(lock_text)
    assert (ctx / "apt" / "apt.lock").read_text() == lock_text
    dockerfile = (ctx / "Dockerfile").read_text()
    for deb in apt.stages["runtime"]:
        assert f" {deb.pin}" in dockerfile
    sums = (ctx / "apt" / "runtime.sha256").read_text().splitlines()
    assert len(sums) == len(apt.stages["runtime"]) and all(len(line.split()[0]) == 64 for line in sums)
    expect = (ctx / "apt" / "runtime.expect").read_text().splitlines()
    assert (
        expect == sorted(expect)
        and "python3.11 " + next(d.version for d in apt.stages["runtime"] if d.name == "python3.11") + " amd64"
        in expect
    )
    assert report["labels"]["io.envbuild.apt-lock-sha256"] == hashlib.sha256(lock_text.encode()).hexdigest()


def test_a_venv_image_gets_the_public_cas_even_where_its_base_has_none(write_profile: Callable[..., Path]) -> None:
    """debian and ubuntu bases leave ca-certificates out: without it urllib (torch.hub, torchvision's
    downloads) verifies no HTTPS server in the image, although the build itself reached PyPI."""
    from envbuild import render

    plan = plan_mod.for_profile(validate.load_valid(write_profile(compile=False)))
    assert plan.apt_stages["runtime"] == ("python3.11", "ca-certificates", "tini")
    runtime = render.render(plan)["Dockerfile"].split("AS runtime", 1)[1]
    assert "apt-get install -y --no-install-recommends python3.11 ca-certificates tini \\\n" in runtime


@pytest.mark.parametrize(
    ("extra", "stages"),
    [
        ({}, {"runtime": ("tini", "g++", "ninja-build")}),
        ({"apt": ["less", "curl"]}, {"runtime": ("tini", "g++", "ninja-build", "curl", "less")}),
        ({"compile": False}, {"runtime": ("tini",)}),
    ],
)
def test_a_conda_profile_locks_only_its_runtime_os_packages(extra: dict[str, object], stages: object) -> None:
    """conda's Python is conda-lock.yml's: apt.lock pins the runtime's PID 1 (tini), compiler and
    `apt:` list only."""
    from envbuild.profile import Profile

    fields = {
        "name": "cpu-py311-conda",
        "accelerator": "cpu",
        "flavor": "conda",
        "python": "3.11",
        "torch": "2.5.1",
        "numpy": "2.1.3",
        "channels": ["conda-forge"],
        **extra,
    }
    plan = plan_mod.for_profile(Profile.model_validate(fields))
    assert plan.apt_stages == stages
    assert "_apt.j2" in plan.templates  # the shared part is in the build digest like the templates


def test_every_template_part_a_dockerfile_imports_is_in_the_image_digest() -> None:
    """A part left out of TEMPLATE_PARTS changes every image without making one stale (the login
    shell's part, added without it, would have)."""
    import re

    imported = {
        name
        for template in plan_mod.default_templates_dir().glob("*.j2")
        for name in re.findall(r"""{%-?\s*(?:from|import|include)\s+["']([^"']+)["']""", template.read_text())
    }
    assert imported and imported == set(plan_mod.TEMPLATE_PARTS)
