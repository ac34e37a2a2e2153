"""`envbuild venv`'s environment has its own pip, which runs where the venv ends up."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from envbuild import uvtool, venv


def test_the_venv_gets_a_pip_that_runs_after_it_is_renamed_into_place(tmp_path: Path) -> None:
    # uv's venv has no pip: `pip install` in the activated venv ran the next pip on PATH, which
    # installs somewhere else. The venv is made under a staging name, so pip's scripts must not
    # name that folder.
    staging = tmp_path / ".env.envbuild-tmp"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(staging)], check=True)
    version = venv._add_pip(staging)
    assert version is not None and version[0].isdigit()
    final = tmp_path / "env"
    staging.rename(final)
    for script in ("pip", "pip3"):
        shown = subprocess.run([str(final / "bin" / script), "--version"], capture_output=True, text=True, check=True)
        assert shown.stdout.startswith(f"pip {version} from {final}/lib/"), shown.stdout


def test_an_interpreter_without_ensurepip_leaves_the_venv_whole_without_pip(tmp_path: Path) -> None:
    # Debian's system Python without python3-venv: ensurepip refuses, the venv is still made
    staging = tmp_path / ".env.envbuild-tmp"
    (staging / "bin").mkdir(parents=True)
    python = staging / "bin" / "python"
    python.write_text("#!/bin/sh\necho 'ensurepip is disabled in Debian/Ubuntu for the system python' >&2\nexit 1\n")
    python.chmod(0o755)
    assert venv._add_pip(staging) is None
    assert sorted(p.name for p in (staging / "bin").iterdir()) == ["python"]


def test_the_bundled_pip_comes_in_the_lockfiles_own_install_and_runs_after_the_rename(tmp_path: Path) -> None:
    # ensurepip after the install cost 3.6 s of a 5 s venv: the interpreter's bundled wheels now go
    # into the same hash-checked `uv pip sync`, which writes scripts that find the python beside them
    facts = venv.probe(sys.executable)
    bundled = [Path(str(w)).name for w in facts["bootstrap"]]  # type: ignore[attr-defined]
    assert any(name.startswith("pip-") for name in bundled), facts
    staging = tmp_path / ".env.envbuild-tmp"
    uv = uvtool.binary()
    subprocess.run([uv, "venv", str(staging), "--python", sys.executable, "--relocatable", "--quiet"], check=True)
    lock = tmp_path / "requirements.lock"
    lock.write_text("")  # the lockfile's own pins are beside the point here
    boot = venv._bootstrap(facts, {}, tmp_path / "bootstrap.txt")
    assert boot is not None
    sync = [uv, "pip", "sync", str(lock), str(boot), "--python", str(staging / "bin" / "python")]
    subprocess.run([*sync, "--require-hashes", "--no-index", "--no-config", "--quiet"], check=True)
    final = tmp_path / "env"
    staging.rename(final)
    version = venv._pip_version(final)
    assert version is not None and f"pip-{version}-py3-none-any.whl" in bundled
    shown = subprocess.run([str(final / "bin" / "pip"), "--version"], capture_output=True, text=True, check=True)
    assert shown.stdout.startswith(f"pip {version} from {final}/lib/"), shown.stdout


def test_a_bootstrap_wheel_the_lockfile_pins_is_left_to_the_lockfile(tmp_path: Path) -> None:
    # torch on Python 3.12 pins its own setuptools: a second, bundled one would conflict with it
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for name in ("pip-24.0-py3-none-any.whl", "setuptools-65.5.0-py3-none-any.whl"):
        (wheels / name).write_bytes(name.encode())
    facts: dict[str, object] = {"bootstrap": [str(w) for w in sorted(wheels.iterdir())]}
    boot = venv._bootstrap(facts, {"setuptools": object()}, tmp_path / "bootstrap.txt")
    assert boot is not None
    [line] = boot.read_text().splitlines()
    assert line.startswith(f"pip @ {(wheels / 'pip-24.0-py3-none-any.whl').as_uri()} --hash=sha256:")
    # an interpreter without a bundled pip: ensurepip is asked instead (`_add_pip`)
    assert venv._bootstrap({"bootstrap": []}, {}, tmp_path / "none.txt") is None


def test_a_venv_in_a_folder_with_a_space_in_its_path_keeps_its_pins_for_pip(
    engineless_project: Path, tmp_path: Path
) -> None:
    """pip splits a list setting of a config file at whitespace: the pip.conf of a venv made in
    "my venv" named a constraint file "/.../my", and every `pip install` there failed with "Could
    not open constraint file". It now names the file as a file: URL, which pip reads whole."""
    from envbuild import freshness
    from envbuild import plan as plan_mod
    from envbuild.project import open_project
    from envbuild.validate import load_named

    project = open_project(str(engineless_project))
    plan = plan_mod.make(project, load_named(project, "cpu-py311"))
    snap = freshness.require_fresh(project, plan)
    staging, final = tmp_path / "staging", tmp_path / "my venv"
    staging.mkdir()
    held = venv._hold(plan, snap, staging, final)
    assert held == final / "envbuild-constraints.txt"
    staging.rename(final)
    env = {**os.environ, "PIP_CONFIG_FILE": str(final / "pip.conf")}
    pip = [sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "--disable-pip-version-check"]
    done = subprocess.run([*pip, "numpy==1.0"], env=env, capture_output=True, text=True, check=False)
    assert "Could not open" not in done.stderr, done.stderr
    assert "The user requested (constraint) numpy==2.1.3" in done.stdout + done.stderr
