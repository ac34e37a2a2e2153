"""build_requires: what an sdist's isolated build gets that it imports without declaring (torch)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from envbuild import buildfail, buildreqs, fetchfail, layering, lockfile, validate
from envbuild import plan as plan_mod
from envbuild._compat import tomllib
from envbuild.project import open_project

# uv 0.13's own words for torch-scatter 2.1.2, whose setup.py imports torch (lock, then the builder)
UV_UNDECLARED = """error: Failed to build `torch-scatter==2.1.2`
  cause: The build backend returned an error
  cause: Call to `setuptools.build_meta:__legacy__.get_requires_for_build_wheel` failed (exit status: 1)

         [stderr]
         Traceback (most recent call last):
           File "<string>", line 8, in <module>
         ModuleNotFoundError: No module named 'torch'

hint: This error likely indicates that `torch-scatter@2.1.2` depends on `torch`, but doesn't declare it as a build \
dependency. If `torch-scatter` is a first-party package, consider adding `torch` to its `build-system.requires`. \
Otherwise, either add it to your `pyproject.toml` under:

[tool.uv.extra-build-dependencies]
torch-scatter = ["torch"]
"""


def _plan(project: Path, write_profile: Callable[..., Path], **fields: object) -> plan_mod.Plan:
    write_profile(**fields)
    proj = open_project(str(project))
    return plan_mod.make(proj, validate.load_named(proj, str(fields.get("name", "cu121-py311"))))


def test_a_lock_pins_build_requires_to_the_profile_and_a_build_to_the_lockfile(
    project: Path, write_profile: Callable[..., Path]
) -> None:
    plan = _plan(
        project,
        write_profile,
        torchvision="auto",
        packages=["torch-scatter==2.1.2", "ninja==1.11.1.4", "packaging>=24"],
        build_requires={"Torch_Scatter": ["torch", "torchvision", "ninja", "packaging"]},
    )
    # torchvision `auto` as the plan resolved it; a range pins nothing, so uv picks as it resolves
    assert buildreqs.for_lock(plan) == {
        "torch-scatter": ("torch==2.3.1", "torchvision==0.18.1", "ninja==1.11.1.4", "packaging")
    }
    locked = {"torch": "2.3.1+cu121", "torchvision": "0.18.1+cu121", "ninja": "1.11.1.4", "packaging": "25.0"}
    built = buildreqs.for_build(plan.profile, locked)
    assert built == {
        "torch-scatter": ("torch==2.3.1+cu121", "torchvision==0.18.1+cu121", "ninja==1.11.1.4", "packaging==25.0")
    }
    assert tomllib.loads(buildreqs.config(built)) == {
        "extra-build-dependencies": {"torch-scatter": list(built["torch-scatter"])}
    }
    assert buildreqs.missing(plan.profile, {"torch": "2.3.1"}) == ["ninja", "packaging", "torchvision"]


def test_build_requires_reaches_the_input_digest_and_gives_the_builder_a_compiler(
    project: Path, write_profile: Callable[..., Path]
) -> None:
    plain = _plan(project, write_profile, packages=["torch-scatter==2.1.2"])
    assert "g++" not in plain.apt_stages["builder"]
    plan = _plan(project, write_profile, packages=["torch-scatter==2.1.2"], build_requires={"torch-scatter": ["torch"]})
    assert plan.input_digest != plain.input_digest  # the metadata uv builds depends on it: a re-lock
    assert {"g++", "ninja-build", "python3.11-dev"} <= set(plan.apt_stages["builder"])
    assert plan.apt_digest != plain.apt_digest


def test_a_bad_build_requires_entry_names_the_field_and_the_fix(
    project: Path, write_profile: Callable[..., Path]
) -> None:
    path = write_profile(build_requires={"torch-scatter": ["torch>=2"]})
    found = validate.check(path)
    assert found.profile is None
    [problem] = [d for d in found.diagnostics if d.severity == "error"]
    assert problem.field.startswith("build_requires") and "'torch>=2' is not a package name" in problem.message
    assert 'write it like "torch-scatter"' in problem.fix


def test_the_lock_error_names_the_profiles_fix_not_uvs_settings_files() -> None:
    why = fetchfail.explain("uv", UV_UNDECLARED, "point index_url: at a mirror")
    assert why is not None
    assert (
        why.summary
        == "uv could not build torch-scatter from its sdist: its build imports torch, which it does not declare"
    )
    assert why.hint.startswith("add `build_requires: {torch-scatter: [torch]}` to the profile")


def test_a_build_that_fails_the_same_way_is_told_the_same_fix() -> None:
    found = buildfail.diagnose(UV_UNDECLARED.splitlines(), "cpu-py311-pyg")
    assert found is not None
    assert found.message == (
        "torch-scatter's build imports torch, which it does not declare, so its isolated build environment lacks it"
    )
    assert "add `build_requires: {torch-scatter: [torch]}` to cpu-py311-pyg's profile and re-lock" in found.hint


def test_the_builder_builds_with_the_config_and_every_locked_wheel(
    engineless_project: Path, write_profile: Callable[..., Path]
) -> None:
    """The Dockerfile hands the config to uv; the context puts the other layers' wheels (torch) in
    wheels/rest too, where that build's environment finds them."""
    text = (engineless_project / "lockfiles" / "cpu-py311" / "requirements.lock").read_text()
    pins = lockfile.parse_requirements(text)
    cpu = {
        k: v for k, v in validate.load_named(open_project(str(engineless_project)), "cpu-py311").model_dump().items()
    }
    plan = _plan(engineless_project, write_profile, **{**cpu, "build_requires": {"einops": ["torch"]}})
    with_config = layering.render_for(plan, pins, None, {}, "uv", text, from_source=frozenset({"einops"}))[0]
    assert "COPY build-requires.toml /tmp/envbuild/build-requires.toml" in with_config["Dockerfile"]
    assert (
        "--config-file /tmp/envbuild/build-requires.toml --find-links /tmp/envbuild/wheels/rest"
        in with_config["Dockerfile"]
    )
    without = layering.render_for(plan, pins, None, {}, "uv", text)[0]["Dockerfile"]  # nothing built from source
    assert "build-requires.toml" not in without
    groups = layering.layer_groups(plan, pins, text, frozenset({"einops"}))
    placed = {Path(f"/cache/{name}.whl"): name for name in pins}
    ctx = Path("/ctx")
    places = layering.wheel_places(ctx, placed, groups, (), to_rest=True)
    assert (Path("/cache/torch.whl"), ctx / "wheels" / "torch" / "torch.whl") in places
    assert (Path("/cache/torch.whl"), ctx / "wheels" / "rest" / "torch.whl") in places
    assert len([p for p in places if p[0].name == "einops.whl"]) == 1  # already in wheels/rest
    assert not [
        p
        for p in layering.wheel_places(ctx, placed, groups, (), to_rest=False)
        if p[1].parent.name == "rest" and p[0].name == "torch.whl"
    ]


def test_build_requires_is_refused_for_a_conda_profile(project: Path, write_profile: Callable[..., Path]) -> None:
    path = write_profile(flavor="conda", build_requires={"torch-scatter": ["torch"]})
    found = validate.check(path)
    assert found.profile is None
    assert any(d.field == "build_requires" and "is for venv profiles" in d.message for d in found.diagnostics)


def test_the_context_carries_a_locked_sdist_from_a_local_folder_matched_by_its_hash(tmp_path: Path) -> None:
    """The builder cannot read the host's folders: an sdist locked from one goes into the context,
    but only the file whose sha256 the lock pins (a rebuilt tarball of the same name stays out)."""
    import hashlib

    from envbuild import wheelcache
    from envbuild.lockfile import Pin

    good, other = tmp_path / "good", tmp_path / "other"
    good.mkdir()
    other.mkdir()
    (good / "envbuild_addone-0.1.tar.gz").write_bytes(b"the locked sdist")
    (other / "envbuild_addone-0.1.tar.gz").write_bytes(b"rebuilt since")
    (good / "einops-0.8.1.tar.gz").write_bytes(b"not built from source")
    (good / "notes.txt").write_text("not an sdist")
    sha = hashlib.sha256(b"the locked sdist").hexdigest()
    pins = {
        "envbuild-addone": Pin("envbuild-addone", "0.1", [f"sha256:{sha}"]),
        "einops": Pin("einops", "0.8.1", [f"sha256:{hashlib.sha256(b'not built from source').hexdigest()}"]),
    }
    found = wheelcache.local_sdists(pins, {"envbuild-addone"}, [other, good, tmp_path / "gone"])
    assert found == {good / "envbuild_addone-0.1.tar.gz": "envbuild-addone"}


def test_a_lock_reads_the_torch_familys_pages_of_the_pytorch_index_for_those_builds(
    project: Path, write_profile: Callable[..., Path]
) -> None:
    """uv gives a build environment no index routing: `torch==2.13.0` for a CPU profile's metadata
    build came from PyPI (its CUDA build, 3 GB). The index's own page of each torch-family name,
    as a find-links, gives it the profile's build; nothing to add where PyPI's build is the
    profile's, or a wheelhouse is already among the find-links."""
    wants = {"torch-scatter": ["torch", "numpy"], "apex": ["torchvision"]}
    mirror = "https://mirror.example/whl/cu121/"
    plan = _plan(project, write_profile, torch_index=mirror, build_requires=wants)
    assert buildreqs.index_pages(plan) == [f"{mirror}torch/", f"{mirror}torchvision/"]
    assert buildreqs.index_pages(_plan(project, write_profile, build_requires=wants)) == []  # PyPI's cu121
    flat = _plan(project, write_profile, torch_index=project.as_uri(), build_requires=wants)
    assert flat.source.torch_index_flat and buildreqs.index_pages(flat) == []
