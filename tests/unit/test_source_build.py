"""A locked package with no wheel for the platform, only an sdist (hydra-core's antlr4-python3-runtime
4.9.3): the builder makes its wheel from the hash-checked sdist. The image build used to fail 73 s in
with uv's "has no usable wheels", after `lock` had taken it without a word."""

from __future__ import annotations

import shutil
from pathlib import Path

from envbuild import layering, lockfile, validate
from envbuild import plan as plan_mod
from envbuild.project import open_project

REPO = Path(__file__).resolve().parents[2]
SHA = "f224469b4168294902bb1efa80a8bf7855f24c99aef99cbefc1bcd3cce77881b"
BLOCK = f"antlr4-python3-runtime==4.9.3 \\\n    --hash=sha256:{SHA}\n    # via hydra-core\n"
PYLOCK = (
    '\n[[packages]]\nname = "antlr4-python3-runtime"\nversion = "4.9.3"\n'
    'sdist = { url = "https://files.pythonhosted.org/antlr4-python3-runtime-4.9.3.tar.gz", '
    f'hashes = {{ sha256 = "{SHA}" }} }}\n'
)


def _with_antlr(folder: Path) -> tuple[str, str]:
    """The shipped cpu-py311 lock with antlr4 added, as `lock` writes it: a requirements block, and
    a pylock.toml package with an sdist and no wheel."""
    text = (REPO / "lockfiles" / "cpu-py311" / "requirements.lock").read_text()
    head, _, rest = text.partition("einops==")
    text = head + BLOCK + "einops==" + rest
    pylock = (REPO / "lockfiles" / "cpu-py311" / "pylock.toml").read_text() + PYLOCK
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "requirements.lock").write_text(text)
    (folder / "pylock.toml").write_text(pylock)
    return text, pylock


def test_the_sdist_only_package_is_built_in_the_builder_with_the_locked_backend(
    engineless_project: Path, tmp_path: Path
) -> None:
    text, pylock = _with_antlr(tmp_path / "lock")
    assert lockfile.sdist_only(pylock) == {"antlr4-python3-runtime"}
    assert lockfile.sdist_only((REPO / "lockfiles" / "cpu-py311" / "pylock.toml").read_text()) == set()
    proj = open_project(str(engineless_project))
    plan = plan_mod.make(proj, validate.load_named(proj, "cpu-py311"), strict=False)
    pins = lockfile.parse_requirements(text)
    built = lockfile.sdist_only(pylock)
    groups = layering.layer_groups(plan, pins, text, built)
    assert "antlr4-python3-runtime" in groups["rest"]  # built where the builder stage installs
    files = layering.group_files(text, groups, built)
    assert "antlr4-python3-runtime==4.9.3" in files[layering.SOURCE_FILE]
    assert "antlr4" not in files["requirements.rest.lock"] and "einops==0.8.1" in files["requirements.rest.lock"]
    # the layer digests (cache labels, `images`) are of the unsplit parts: the same from either side
    assert layering.layer_digests(plan, text, pylock) == layering.layer_digests(plan, text, "")

    dockerfile = layering.dockerfile_from(plan, tmp_path / "lock")
    assert dockerfile is not None
    lines = dockerfile.splitlines()
    source = next(line for line in lines if "requirements.source.lock" in line and "install" in line)
    assert "--only-binary" not in source and "--require-hashes" in source and "--no-deps" in source
    assert "--build-constraint /tmp/envbuild/build-constraints.lock" in source
    assert "COPY requirements.lock /tmp/envbuild/build-constraints.lock" in lines
    wheels_only = next(line for line in lines if "requirements.rest.lock;" in line and "install" in line)
    assert "--only-binary :all:" in wheels_only  # everything else stays wheels only


def test_a_lock_with_wheels_for_everything_renders_as_before(engineless_project: Path, tmp_path: Path) -> None:
    proj = open_project(str(engineless_project))
    plan = plan_mod.make(proj, validate.load_named(proj, "cpu-py311"), strict=False)
    shutil.copytree(REPO / "lockfiles" / "cpu-py311", tmp_path / "lock")
    dockerfile = layering.dockerfile_from(plan, tmp_path / "lock")
    assert (
        dockerfile is not None and "requirements.source.lock" not in dockerfile and "build-constraint" not in dockerfile
    )
