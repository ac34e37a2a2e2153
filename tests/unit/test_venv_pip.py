"""`envbuild venv`'s environment has its own pip, which runs where the venv ends up."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from envbuild import venv


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
