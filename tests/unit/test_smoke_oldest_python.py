"""The smoke package runs on the image's Python, which a profile may make as old as 3.8 (torch
2.0-2.4, with a `base:` that has it; 3.7, which torch 1.13 has wheels for, is refused by validate:
importlib.metadata came with 3.8): a `str.removesuffix` (3.9) in the manifest step that every layer's
build runs broke each such build, and compileall's `-s`/`-p` (3.9) left its layers without byte
code. Run here on that Python where this host has one (pyenv's, or on PATH)."""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from packaging.version import Version

from envbuild import compat, plan
from envbuild.buildctx import SMOKE_PACKAGE
from envbuild.names import SMOKE_MIN_PYTHON


def _oldest() -> str:
    """The oldest Python a valid profile can name: the compat data's floor, or the smoke package's
    where that is higher (validate refuses below it)."""
    floor = min((r.python[0] for r in compat.load().torch), key=Version)
    return max(floor, SMOKE_MIN_PYTHON, key=Version)


def _interpreter(version: str) -> str | None:
    found = shutil.which(f"python{version}")
    pyenv = sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/{version}.*/bin/python{version}")))
    return (
        found
        if found and subprocess.run([found, "-V"], capture_output=True, check=False).returncode == 0
        else next(iter(pyenv), None)
    )


@pytest.fixture(scope="module")
def old_python() -> tuple[str, str]:
    """(the oldest Python a valid profile can name, its interpreter here)."""
    version = _oldest()
    found = _interpreter(version)
    if found is None:
        pytest.skip(f"no Python {version} on this host (pyenv install {version}, or one on PATH)")
    return version, found


def _run(*cmd: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env={**os.environ, **(env or {})}, check=False)


def test_the_smoke_package_builds_its_manifest_and_imports_on_the_oldest_python(
    old_python: tuple[str, str], tmp_path: Path
) -> None:
    version, interpreter = old_python
    package = tmp_path / "opt" / SMOKE_PACKAGE
    package.mkdir(parents=True)
    for name, text in plan.smoke_sources().items():
        (package / name).write_text(text, "utf-8")
    venv = tmp_path / "venv"
    assert _run(interpreter, "-m", "venv", "--without-pip", str(venv), cwd=tmp_path).returncode == 0
    (venv / "lib" / f"python{version}" / "site-packages" / "m.py").write_text("x = 1\n", "utf-8")
    py = str(venv / "bin" / "python")
    # a layer's step: the file alone, outside its package, on the venv's Python
    part = _run(py, "-S", "-B", str(package / "manifest.py"), "--root", str(venv), "--part", "rest",
                "--write", str(tmp_path / "rest.json"), cwd=tmp_path)  # fmt: skip
    assert part.returncode == 0, part.stderr
    # the merge step, as the package; then every module imported, as envbuild-smoke does
    pythonpath = {"PYTHONPATH": str(package.parent)}
    merged = _run(py, "-m", f"{SMOKE_PACKAGE}.manifest", "--root", str(venv), "--write", str(tmp_path / "m.json"),
                  "--merge", str(tmp_path / "rest.json"), cwd=tmp_path, env=pythonpath)  # fmt: skip
    assert merged.returncode == 0, merged.stderr
    written = json.loads((tmp_path / "m.json").read_text("utf-8"))
    assert f"lib/python{version}/site-packages/m.py" in written["files"]
    if os.path.isdir("/var/lib/dpkg/info"):
        assert written["dpkg_records"], "the dpkg records of this Debian host"
    modules = sorted(n[:-3] for n in plan.smoke_sources() if n.endswith(".py") and n != "__main__.py")
    probe = "; ".join(f"import {SMOKE_PACKAGE}.{m}" for m in modules)
    probe += (
        f"; import json, sys; from {SMOKE_PACKAGE} import manifest, oslibs"
        "; built = json.load(open(sys.argv[1]))"
        "; print(oslibs.problems(built, [sys.argv[2]], manifest.os_packages(), {}))"
        "; print(oslibs.package_changes(built['os_packages'], manifest.os_packages()))"
        "; print(manifest.file_digest(manifest.__file__, 'md5'))"
    )
    imported = _run(py, "-c", probe, str(tmp_path / "m.json"), str(venv), cwd=tmp_path, env=pythonpath)
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout.splitlines()[:2] == ["[]", "[]"]  # nothing changed since the manifest
    assert len(imported.stdout.splitlines()[2]) == 32


def test_the_layers_byte_code_step_runs_on_the_oldest_python(old_python: tuple[str, str], tmp_path: Path) -> None:
    """The command a layer's step runs (the golden Dockerfile's, which the render test holds to the
    template) compiles the layer's tree as if it were /opt/venv."""
    golden = (Path(__file__).parents[1] / "golden" / "cpu-py311" / "Dockerfile.build").read_text("utf-8")
    command = next(ln for ln in golden.splitlines() if "compileall" in ln and "/split/torch/" in ln)
    options = command.split(" -m compileall ", 1)[1].split(" > /dev/null", 1)[0].split()
    tree = tmp_path / "split" / "torch" / "opt" / "venv"
    (tree / "pkg").mkdir(parents=True)
    (tree / "pkg" / "m.py").write_text("def f():\n    return 1\n", "utf-8")
    options = [str(tree) if o == "/split/torch/opt/venv" else o for o in options]
    version, interpreter = old_python
    done = _run(interpreter, "-m", "compileall", *options, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    code = _run(
        interpreter,
        "-c",
        "import marshal, sys; print(marshal.loads(open(sys.argv[1], 'rb').read()[16:]).co_filename)",
        str(tree / "pkg" / "__pycache__" / f"m.cpython-{version.replace('.', '')}.pyc"),
        cwd=tmp_path,
    )
    assert code.stdout.strip() == "/opt/venv/pkg/m.py", code.stderr
