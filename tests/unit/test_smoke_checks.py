"""The compile, export, perf and project checks' logic, without torch (CI has none): what they
find missing, how they word it, which datasheet row a GPU gets, how a project script is judged."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from envbuild import buildctx, validate
from envbuild import plan as plan_mod
from envbuild.project import open_project
from envbuild.smoke.inside import compiled, cxxlink, perf, report, usercheck
from envbuild.smoke.inside.core import CheckFailed, Context, Result, Skip
from tests.conftest import Result as CliResult


def _ctx(expect: dict[str, Any] | None = None, **kw: Any) -> Context:
    return Context(**{"expect": expect or {}, "gpus": "none", "timeout": 60, "lock_match": "exact", **kw})


def test_a_profile_that_opts_out_skips_the_compile_check_with_its_reason() -> None:
    with pytest.raises(Skip, match=r"opts out of the compile toolchain \(compile: false\)"):
        compiled.check_compile(_ctx({"compile": False}), Result("compile"))


TOOLS = {
    "cxx": "/usr/bin/g++",
    "libstdcxx": {"linkage": "shared", "needed": ["libstdc++.so.6", "libc.so.6"]},
    "cc": "/usr/bin/gcc",
    "python_headers": True,
    "ninja": "/usr/bin/ninja",
    "tmp_writable": True,
    "inductor_cache": "/tmp/torchinductor_x",
    "inductor_cache_writable": True,
    "triton_cache": "/home/x/.triton/cache",
    "triton_cache_writable": True,
}


@pytest.mark.parametrize(
    ("missing", "gpu", "problem", "fix"),
    [
        ({"cxx": None}, False, "no C++ compiler (g++)", "compile: true installs g++"),
        ({"ninja": None}, False, "no ninja: torch.utils.cpp_extension", "compile: true installs ninja-build"),
        ({"python_headers": False}, False, "no Python headers (Python.h)", "-dev in the image"),
        ({"tmp_writable": False}, False, "is not writable", "--tmpfs /tmp"),
        ({"inductor_cache_writable": False}, False, "inductor cache", "TORCHINDUCTOR_CACHE_DIR"),
        ({"triton_cache_writable": False}, True, "Triton cache", "TRITON_CACHE_DIR"),
    ],
)
def test_each_missing_piece_of_the_toolchain_is_named_with_its_fix(
    missing: dict[str, Any], gpu: bool, problem: str, fix: str
) -> None:
    found = compiled._toolchain_problem({**TOOLS, **missing}, gpu)
    assert found is not None and problem in found[0] and fix in found[1]


def test_a_complete_toolchain_is_no_problem_and_the_triton_cache_only_matters_on_gpus() -> None:
    assert compiled._toolchain_problem(TOOLS, gpu=True) is None
    assert compiled._toolchain_problem({**TOOLS, "triton_cache_writable": False}, gpu=False) is None
    # an interpreter on the host is checked for torch.compile, which does not use ninja
    assert compiled._toolchain_problem({**TOOLS, "ninja": None}, gpu=False, image=False) is None


def test_a_compiler_that_links_libstdcxx_statically_is_refused_with_the_compiler_to_use() -> None:
    # The H200 host's /opt/gcc g++ had libstdc++.a only: every AOTInductor package it built died
    # with SIGSEGV on load next to torch's shared libstdc++, while torch.compile itself ran.
    static = {**TOOLS, "cxx": "/opt/gcc/bin/g++", "libstdcxx": {"linkage": "static", "needed": ["libc.so.6"]}}
    found = compiled._toolchain_problem(static, gpu=False, image=False)
    assert found is not None
    assert "/opt/gcc/bin/g++ links libstdc++ statically" in found[0] and "AOTInductor" in found[0]
    assert "/usr/bin/g++" in found[1] and "CXX" in found[1]
    unknown = {**TOOLS, "libstdcxx": {"linkage": "unknown", "why": "no space left"}}
    assert compiled._toolchain_problem(unknown, gpu=False) is None  # not proven broken: the compile run decides


GXX = shutil.which("g++")
needs_gxx = pytest.mark.skipif(GXX is None, reason="needs g++ (CI installs it with the e2e toolchain)")


@needs_gxx
def test_the_system_gxx_builds_shared_objects_that_need_the_shared_libstdcxx() -> None:
    found = cxxlink.libstdcxx_linkage(str(GXX))
    assert found["linkage"] == "shared", found
    assert any(str(lib).startswith("libstdc++.so") for lib in found["needed"])  # type: ignore[attr-defined]


@needs_gxx
def test_a_compiler_whose_output_carries_libstdcxx_is_found_static(tmp_path: Path) -> None:
    # A real compiler that links the way a libstdc++.a-only toolchain does.
    wrapper = tmp_path / "g++-static"
    wrapper.write_text(
        f'#!/bin/sh\ncase " $* " in *" -shared "*) exec {GXX} -static-libstdc++ "$@";; esac\nexec {GXX} "$@"\n'
    )
    wrapper.chmod(0o755)
    found = cxxlink.libstdcxx_linkage(str(wrapper))
    assert found["linkage"] == "static", found
    assert not any(str(lib).startswith("libstdc++") for lib in found["needed"])  # type: ignore[attr-defined]
    assert compiled._toolchain_problem({**TOOLS, "cxx": str(wrapper), "libstdcxx": found}, gpu=False) is not None


def test_a_compiler_that_fails_or_output_that_is_not_elf_is_unknown_not_static(tmp_path: Path) -> None:
    broken = tmp_path / "cxx"
    broken.write_text("#!/bin/sh\necho 'cc1plus: out of memory' >&2\nexit 1\n")
    broken.chmod(0o755)
    found = cxxlink.libstdcxx_linkage(str(broken))
    assert found["linkage"] == "unknown" and "out of memory" in str(found["why"])
    assert cxxlink.libstdcxx_linkage(str(tmp_path / "absent"))["linkage"] == "unknown"
    text = tmp_path / "x.so"
    text.write_text("not an ELF file")
    with pytest.raises(ValueError, match="not a 64-bit little-endian ELF"):
        cxxlink.needed_libraries(str(text))


@pytest.mark.skipif(shutil.which("readelf") is None, reason="compares with binutils' readelf")
def test_needed_libraries_agrees_with_readelf_on_a_real_shared_object() -> None:
    import _ctypes
    import re
    import subprocess

    path = str(_ctypes.__file__)
    dynamic = subprocess.run(["readelf", "-d", path], capture_output=True, text=True, check=True).stdout
    expected = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dynamic)
    assert expected and cxxlink.needed_libraries(path) == expected


@pytest.mark.parametrize(
    ("error", "remedy"),
    [
        (RuntimeError("InvalidCxxCompiler: No working C++ compiler found"), "install g++"),
        (RuntimeError("fatal error: Python.h: No such file or directory"), "Python headers are missing"),
        (ModuleNotFoundError("No module named 'triton'"), "Triton is missing or does not match"),
        (PermissionError("[Errno 13] Permission denied: '/tmp/torchinductor_1000'"), "not writable"),
    ],
)
def test_compile_failures_are_diagnosed(error: BaseException, remedy: str) -> None:
    assert remedy in compiled._diagnose(error, "/opt/venv")


def test_a_compile_failure_in_an_environment_whose_path_has_a_space_names_the_space() -> None:
    """torch passes -I/-L folders to g++ unquoted: in a venv at "/tmp/my venv" every inductor build
    failed with "cannot find -ltorch", and the remedy said to install g++, which was there."""
    error = RuntimeError(
        "CppCompileError: C++ compile error ... -I/tmp/my venv/lib/python3.11/site-packages/torch/include ... "
        "/usr/bin/ld: cannot find -ltorch: No such file or directory"
    )
    said = compiled._diagnose(error, "/tmp/my venv")
    assert "this environment's path has a space (/tmp/my venv)" in said and "install g++" not in said


@pytest.mark.parametrize(
    ("name", "row"),
    [
        ("NVIDIA H200", "H200"),
        ("NVIDIA H100 80GB HBM3", "H100"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA A100-PCIE-40GB", "A100-PCIE"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA B200", "B200"),
        ("AMD Instinct MI300X", "MI300X"),
    ],
)
def test_each_gpu_gets_its_own_datasheet_row(name: str, row: str) -> None:
    found = perf.peak_for(name)
    assert found is not None and found["match"] == row and found["source"]


def test_an_unknown_gpu_has_no_datasheet_row() -> None:
    assert perf.peak_for("NVIDIA GeForce GTX 1080") is None


def test_every_datasheet_value_names_its_source() -> None:
    assert all(row["source"] and row["bf16"] > 0 and row["memory"] > 0 for row in perf.PEAKS)


def _script(tmp_path: Path, text: str) -> dict[str, Any]:
    (tmp_path / "checks").mkdir(exist_ok=True)
    (tmp_path / "checks" / "mine.py").write_text(text)
    (tmp_path / "expect.json").write_text("{}")
    return {"file": "mine.py", "path": "checks/mine.py", "timeout": 30}


def test_a_project_script_that_exits_0_passes_and_its_output_is_kept(tmp_path: Path) -> None:
    script = _script(tmp_path, "print('loss 0.7 -> 0.1')\n")
    r = Result("check:mine.py")
    usercheck.run_script(_ctx(expect_path=str(tmp_path / "expect.json")), r, script)
    assert r.facts["exit_code"] == 0 and r.facts["stdout_tail"] == ["loss 0.7 -> 0.1"]


def test_a_failing_project_script_fails_with_its_name_and_last_words(tmp_path: Path) -> None:
    script = _script(tmp_path, "import sys\nprint('step 1')\nsys.exit('loss is nan')\n")
    r = Result("check:mine.py")
    with pytest.raises(CheckFailed) as failed:
        usercheck.run_script(_ctx(expect_path=str(tmp_path / "expect.json")), r, script)
    assert failed.value.reason == "mine.py exited 1: loss is nan"
    assert r.facts["stderr_tail"] == ["loss is nan"] and r.facts["stdout_tail"] == ["step 1"]


def test_a_project_script_that_crashes_in_native_code_names_the_signal_and_where(tmp_path: Path) -> None:
    """Seen on the lent H200: AOTInductor's package loader died with SIGSEGV, and the check said
    "exited -11:   warnings.warn(", the last line a warning had printed."""
    text = (
        "import ctypes, warnings\n"
        "warnings.warn('something harmless')\n"
        "def load_package():\n"
        "    ctypes.string_at(0)\n"
        "load_package()\n"
    )
    r = Result("check:mine.py")
    with pytest.raises(CheckFailed) as failed:
        usercheck.run_script(_ctx(expect_path=str(tmp_path / "expect.json")), r, _script(tmp_path, text))
    assert failed.value.reason.startswith("mine.py crashed with SIGSEGV (signal 11) in ")
    assert failed.value.reason.endswith(" in string_at (from mine.py, line 4 in load_package)")
    assert "python -X faulthandler mine.py" in failed.value.remedy
    assert failed.value.remedy.startswith("a crash in native code") and "libstdc++" not in failed.value.remedy
    assert r.facts["signal"] == "SIGSEGV"
    assert [f.split(", ")[-1] for f in r.facts["crash_stack"][-2:]] == ["line 4 in load_package", "line 5 in <module>"]


def test_a_crash_while_loading_an_aoti_package_points_at_the_compiler_that_built_it(tmp_path: Path) -> None:
    # The frame torch 2.11's aoti_load_package died in on the H200 (docs/GPU-SMOKE.md).
    text = "import ctypes\ndef _load_aoti():\n    ctypes.string_at(0)\n_load_aoti()\n"
    r = Result("check:serve.py")
    script = {**_script(tmp_path, text), "file": "serve.py"}
    with pytest.raises(CheckFailed) as failed:
        usercheck.run_script(_ctx(expect_path=str(tmp_path / "expect.json")), r, script)
    assert failed.value.reason.startswith("serve.py crashed with SIGSEGV")
    remedy = failed.value.remedy
    assert remedy.startswith("it died loading code compiled on this machine (an AOTInductor package")
    assert "links libstdc++ statically" in remedy and "/usr/bin/g++" in remedy and "-X faulthandler" in remedy


def test_a_project_script_killed_outright_is_named_as_the_likely_out_of_memory_kill(tmp_path: Path) -> None:
    text = "import os, signal\nprint('epoch 1', flush=True)\nos.kill(os.getpid(), signal.SIGKILL)\n"
    r = Result("check:mine.py")
    with pytest.raises(CheckFailed) as failed:
        usercheck.run_script(_ctx(expect_path=str(tmp_path / "expect.json")), r, _script(tmp_path, text))
    assert failed.value.reason == "mine.py was killed (SIGKILL): most often the kernel's out-of-memory killer"
    assert "more memory" in failed.value.remedy
    assert r.facts["stdout_tail"] == ["epoch 1"] and r.facts["crash_stack"] == []


def test_a_project_script_that_hangs_is_stopped_at_its_limit(tmp_path: Path) -> None:
    script = {**_script(tmp_path, "import time\nprint('starting', flush=True)\ntime.sleep(60)\n"), "timeout": 1}
    with pytest.raises(CheckFailed, match="did not finish within 1 s"):
        usercheck.run_script(_ctx(expect_path=str(tmp_path / "expect.json")), Result("x"), script)


def test_the_table_names_what_a_derived_image_added_beyond_its_lockfile() -> None:
    check = {"reason": "", "facts": {"torch": "2.3.1", "numpy": "1.26.4", "not_in_lockfile": ["einops", "tqdm"]}}
    assert report.detail(check) == "torch=2.3.1, numpy=1.26.4, not_in_lockfile=einops tqdm"


def test_project_checks_run_after_the_built_in_ones(tmp_path: Path) -> None:
    ctx = _ctx({"checks": [{"file": "a.py", "path": "checks/a.py"}, {"file": "b.py", "path": "checks/b.py"}]})
    names = [name for name, _ in report._checks(ctx)]
    assert names[-2:] == ["check:a.py", "check:b.py"] and names.index("compile") < names.index("check:a.py")


def test_the_image_expectations_carry_the_compile_choice_and_the_checks(engineless_project: Path) -> None:
    proj = open_project(str(engineless_project))
    plan = plan_mod.make(proj, validate.load_named(proj, "cpu-py311"), strict=False)
    expect = buildctx.expectations(plan, None)
    assert expect["compile"] is True
    assert expect["checks"] == [{"file": "train_tiny.py", "path": "checks/train_tiny.py", "timeout": 600}]
    files = buildctx.smoke_files(plan)
    assert files["checks/train_tiny.py"] == (engineless_project / "checks" / "train_tiny.py").read_text()
    assert plan.compile_packages == ("g++", "ninja-build", "python3.11-dev")


@pytest.mark.parametrize(("home", "writable"), [("/nonexistent/home", False), ("", True)], ids=["none", "own"])
def test_the_image_entrypoint_gives_a_user_without_a_home_a_writable_one(
    engineless_project: Path, tmp_path: Path, home: str, writable: bool
) -> None:
    """The script the image runs after tini, run here with sh: HOME=/ for a uid with no passwd
    entry made `~/.cache` fail (Hugging Face datasets, torch.hub); a home that works stays."""
    import subprocess

    from envbuild.names import ENTRY_SCRIPT, IMAGE_ENTRYPOINT

    proj = open_project(str(engineless_project))
    plan = plan_mod.make(proj, validate.load_named(proj, "cpu-py311"), strict=False)
    script = tmp_path / ENTRY_SCRIPT
    script.write_text(buildctx.smoke_files(plan)[ENTRY_SCRIPT])
    assert IMAGE_ENTRYPOINT[-1] == f"/opt/envbuild/{ENTRY_SCRIPT}"
    given = home or str(tmp_path)
    out = subprocess.run(
        ["sh", str(script), "sh", "-c", 'echo "$HOME" "$0" "$1"', "zero", "a b"],
        env={"HOME": given, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout == f"{given if writable else '/tmp'} zero a b\n"  # the command and its arguments, as given


@pytest.mark.parametrize(("named", "given", "user"), [(False, "", "uid4242"), (True, "", ""), (False, "me", "me")])
def test_the_image_entrypoint_names_a_uid_that_has_no_name(
    engineless_project: Path, tmp_path: Path, named: bool, given: str, user: str
) -> None:
    """A uid with no passwd entry has no name: getpass.getuser() raised KeyError, and torch before
    2.13 builds torch.compile's cache path from it (pytorch/pytorch#140765). A name that exists, or
    one the caller set, stays."""
    import subprocess

    from envbuild.names import ENTRY_SCRIPT

    proj = open_project(str(engineless_project))
    plan = plan_mod.make(proj, validate.load_named(proj, "cpu-py311"), strict=False)
    script = tmp_path / ENTRY_SCRIPT
    script.write_text(buildctx.smoke_files(plan)[ENTRY_SCRIPT])
    tools = tmp_path / "bin"
    tools.mkdir()
    # `id` as a uid without a passwd entry answers it: -u gives the number, -un fails
    fake_id = tools / "id"
    fake_id.write_text(f'#!/bin/sh\n[ "$1" = -u ] && echo 4242 && exit 0\n{"echo someone" if named else "exit 1"}\n')
    fake_id.chmod(0o755)
    env = {"HOME": str(tmp_path), "PATH": f"{tools}:/usr/bin:/bin"} | ({"USER": given} if given else {})
    out = subprocess.run(
        ["sh", str(script), "sh", "-c", 'echo "${USER:-}"'], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout == f"{user}\n"


def test_compile_false_leaves_the_toolchain_out_of_the_dockerfile(write_profile: Callable[..., Path]) -> None:
    from envbuild import render

    with_tools = render.render(plan_mod.for_profile(validate.load_valid(write_profile())))["Dockerfile"]
    without = render.render(plan_mod.for_profile(validate.load_valid(write_profile(compile=False))))["Dockerfile"]
    assert "g++ ninja-build python3.11-dev" in with_tools and "g++" not in without and "ninja" not in without


def test_a_check_that_is_not_there_is_a_validation_error(write_profile: Callable[..., Path]) -> None:
    loaded = validate.check(write_profile(checks=["checks/nope.py"]))
    assert [d.field for d in loaded.errors] == ["checks[0]"]
    assert "'checks/nope.py' is not a file of the project" in loaded.errors[0].message


def test_a_check_that_cannot_be_read_is_a_validation_error(
    write_profile: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """validate now reads each check (to name one that is not UTF-8); one it may not read is said
    with the rest, not an internal error. Root reads any mode, so the refusal is simulated."""
    path = write_profile(checks=["checks/train_tiny.py"])
    script = path.parent.parent / "checks" / "train_tiny.py"
    script.parent.mkdir(exist_ok=True)
    script.write_text("print(1)\n")
    real = Path.read_text

    def refuse(self: Path, *args: Any, **kwargs: Any) -> str:
        if self.name == "train_tiny.py":
            raise PermissionError(13, "Permission denied")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", refuse)
    loaded = validate.check(path)
    assert [(d.field, d.message) for d in loaded.errors] == [
        ("checks[0]", "checks/train_tiny.py cannot be read (Permission denied)")
    ]


def test_min_peak_must_be_a_percentage(cli: Callable[..., CliResult], engineless_project: Path) -> None:
    res = cli("smoke", "cpu-py311", "--min-peak", "0")
    assert res.code == 2 and "--min-peak 0: a percentage of the datasheet peak" in res.err


def test_the_smoke_package_runs_without_envbuild(tmp_path: Path) -> None:
    """It is copied into images alone: `python -m envbuild_smoke --help` works from a bare copy."""
    import shutil
    import subprocess

    target = tmp_path / buildctx.SMOKE_PACKAGE
    shutil.copytree(Path(report.__file__).parent, target, ignore=shutil.ignore_patterns("__pycache__"))
    proc = subprocess.run(
        [sys.executable, "-S", "-m", buildctx.SMOKE_PACKAGE, "--help"],  # -S: no site-packages, no envbuild
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "--min-peak" in proc.stdout


@pytest.fixture(autouse=True)
def _small_stdlib(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The manifest records the base Python's standard library; this host's (pyenv's, with its test
    suite) takes seconds to hash, so each test gets one of two files."""
    from envbuild.smoke.inside import manifest

    stdlib = tmp_path / "stdlib"
    (stdlib / "__pycache__").mkdir(parents=True)
    (stdlib / "os.py").write_text("sep = '/'\n")
    (stdlib / "__pycache__" / "os.cpython-311.pyc").write_bytes(b"\x00pyc")
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "sitecustomize.py").write_text("# Debian's, empty\n")
    (stdlib / "sitecustomize.py").symlink_to(tmp_path / "etc" / "sitecustomize.py")  # as Debian has it
    monkeypatch.setattr(manifest, "_stdlib", lambda: str(stdlib))
    return stdlib


def _image_like(tmp_path: Path, monkeypatch: pytest.MonkeyPatch | None = None) -> tuple[Path, Path]:
    """An /opt/envbuild and an /opt/venv in miniature, with the manifest the build step writes;
    given monkeypatch, this Python passes for the miniature's own, as the image's runs the checks."""
    from envbuild.smoke.inside import manifest

    venv = tmp_path / "venv"
    (venv / "lib" / "site-packages" / "numpy").mkdir(parents=True)
    (venv / "lib" / "site-packages" / "numpy" / "__init__.py").write_text("x = 1\n")
    (venv / "bin").mkdir()
    (venv / "bin" / "python").symlink_to("/usr/bin/python3")
    folder = tmp_path / "envbuild"
    folder.mkdir()
    (folder / "expect.json").write_text("{}")
    assert manifest.main(["--root", str(venv), "--write", str(folder / "manifest.json")]) == 0
    if monkeypatch is not None:
        monkeypatch.setattr(sys, "prefix", str(venv))
    return venv, folder


def test_the_manifest_digest_is_the_same_for_the_same_files_and_changes_with_them(tmp_path: Path) -> None:
    from envbuild.smoke.inside import manifest

    venv, folder = _image_like(tmp_path)
    first = (folder / "env-digest").read_text().strip()
    assert len(first) == 64 and first == manifest.digest(json.loads((folder / "manifest.json").read_text()))
    assert manifest.main(["--root", str(venv), "--write", str(folder / "manifest.json")]) == 0
    assert (folder / "env-digest").read_text().strip() == first  # rebuilt from the same files: same digest
    (venv / "lib" / "site-packages" / "numpy" / "__init__.py").write_text("x = 2\n")
    manifest.main(["--root", str(venv), "--write", str(folder / "manifest.json")])
    assert (folder / "env-digest").read_text().strip() != first


def test_a_manifest_merged_from_layer_parts_equals_one_hashed_whole(tmp_path: Path) -> None:
    """What the layered build does: each layer's step writes its part, the runtime merges them in
    the layers' order (a later layer's file wins, as on disk) and reads every file's mode itself."""
    import os
    import shutil

    from envbuild.smoke.inside import manifest

    layers = {name: tmp_path / "split" / name / "opt" / "venv" for name in ("torch", "rest")}
    for root in layers.values():
        (root / "lib").mkdir(parents=True)
    (layers["torch"] / "lib" / "torch.py").write_text("big = True\n")
    (layers["torch"] / "lib" / "both.py").write_text("from torch\n")
    (layers["rest"] / "lib" / "both.py").write_text("from rest, later\n")
    (layers["rest"] / "lib" / "einops.py").write_text("small = True\n")
    parts = []
    for name, root in layers.items():
        part = tmp_path / "manifest.d" / f"{name}.json"
        assert manifest.main(["--root", str(root), "--part", name, "--write", str(part)]) == 0
        parts += ["--merge", str(part)]
    venv = tmp_path / "venv"  # the runtime's /opt/venv: the layers copied over each other, in order
    for root in layers.values():
        shutil.copytree(root, venv, dirs_exist_ok=True)
    os.chmod(venv / "lib" / "torch.py", 0o600)  # a mode the part does not know: hashed afresh
    (venv / "lib" / "new.py").write_text("")  # a file no part names: hashed afresh
    written = tmp_path / "out" / "manifest.json"
    written.parent.mkdir()
    assert manifest.main(["--root", str(venv), "--write", str(written), *parts]) == 0
    merged = json.loads(written.read_text())
    assert merged == manifest.build(str(venv))
    assert (tmp_path / "out" / "env-digest").read_text().strip() == manifest.digest(manifest.build(str(venv)))


def test_the_integrity_check_names_changed_added_and_removed_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from envbuild.smoke.inside import integrity

    venv, folder = _image_like(tmp_path, monkeypatch)
    ctx = _ctx(expect_path=str(folder / "expect.json"))
    r = Result("integrity")
    integrity.check_integrity(ctx, r)
    assert r.facts["files"] == 2 and len(r.facts["env_digest"]) == 64
    (venv / "lib" / "site-packages" / "numpy" / "__init__.py").write_text("x = 1  # patched\n")
    (venv / "lib" / "site-packages" / "extra.py").write_text("")
    with pytest.raises(CheckFailed) as failed:
        integrity.check_integrity(ctx, Result("integrity"))
    assert "1 file(s) changed (lib/site-packages/numpy/__init__.py)" in failed.value.reason
    assert "1 file(s) added (lib/site-packages/extra.py)" in failed.value.reason
    (venv / "bin" / "python").unlink()
    with pytest.raises(CheckFailed, match=r"1 file\(s\) removed \(bin/python\)"):
        integrity.check_integrity(ctx, Result("integrity"))


def test_a_change_to_the_base_python_s_standard_library_fails_the_integrity_check(
    tmp_path: Path, _small_stdlib: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A venv runs on the OS Python: a sitecustomize.py dropped into its standard library runs at
    every start, and a scan of the venv alone never saw it. An apt upgrade in a derived image
    (--lock-match pins, with the OS packages changed) is listed, not failed."""
    from envbuild.smoke.inside import integrity

    _, folder = _image_like(tmp_path, monkeypatch)
    written = json.loads((folder / "manifest.json").read_text())
    assert sorted(written["interpreter"]["files"]) == ["__pycache__/os.cpython-311.pyc", "os.py", "sitecustomize.py"]
    ctx = _ctx(expect_path=str(folder / "expect.json"))
    integrity.check_integrity(ctx, Result("integrity"))
    (_small_stdlib / "sitecustomize.py").write_text("import os\n")  # through the link, into etc/
    (_small_stdlib / "usercustomize.py").write_text("import os\n")
    with pytest.raises(CheckFailed) as failed:
        integrity.check_integrity(ctx, Result("integrity"))
    said = failed.value.reason
    assert f"the base Python ({_small_stdlib}): 1 file(s) changed (sitecustomize.py)" in said
    assert f"the base Python ({_small_stdlib}): 1 file(s) added (usercustomize.py)" in said
    assert "check it with --lock-match pins" in failed.value.remedy
    pins = _ctx(expect_path=str(folder / "expect.json"), lock_match="pins")
    with pytest.raises(CheckFailed):  # the same OS packages: a hand edit, whatever the mode
        integrity.check_integrity(pins, Result("integrity"))
    monkeypatch.setattr(integrity, "os_packages", lambda: {"libpython3.11-stdlib": "3.11.2-6+deb12u9"})
    r = Result("integrity")
    integrity.check_integrity(pins, r)
    assert "an apt upgrade" in r.facts["base_python_changed"]


def test_os_packages_moved_since_the_build_fail_exact_and_are_listed_with_pins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An `apt-get install` or upgrade in the image leaves files dpkg vouches for, so the OS libraries
    check passes it, and exact passed it too, though exact means the image as built. It fails there,
    naming each package, and sends a derived image to pins, which lists them."""
    from envbuild.smoke.inside import integrity, manifest, oslibs

    built = {"libc6": "2.36-9+deb12u7", "zlib1g": "1:1.2.13.dfsg-1"}
    monkeypatch.setattr(manifest, "os_packages", lambda: built)
    _, folder = _image_like(tmp_path, monkeypatch)
    ctx = _ctx(expect_path=str(folder / "expect.json"))
    monkeypatch.setattr(integrity, "os_packages", lambda: built)
    integrity.check_integrity(ctx, Result("integrity"))  # as built
    now = {"less": "590-2.1~deb12u2", "libc6": "2.36-9+deb12u9"}
    monkeypatch.setattr(integrity, "os_packages", lambda: now)
    with pytest.raises(CheckFailed) as failed:
        integrity.check_integrity(ctx, Result("integrity"))
    assert failed.value.reason == (
        "the environment differs from the image's build manifest: 3 OS package(s) not as built: "
        "less (added), libc6 2.36-9+deb12u7 -> 2.36-9+deb12u9, zlib1g (removed)"
    )
    assert failed.value.remedy.startswith("an image built FROM an envbuild image with packages added: check it with")
    r = Result("integrity")
    integrity.check_integrity(_ctx(expect_path=str(folder / "expect.json"), lock_match="pins"), r)
    assert r.facts["os_packages_changed"] == [
        "less (added)",
        "libc6 2.36-9+deb12u7 -> 2.36-9+deb12u9",
        "zlib1g (removed)",
    ]
    shown = report.detail({"reason": "", "facts": r.facts})  # the table's line: the items have spaces
    assert "os_packages_changed=less (added); libc6 2.36-9+deb12u7 -> 2.36-9+deb12u9; zlib1g (removed)" in shown
    assert oslibs.package_changes({}, now) == []  # built without dpkg: nothing to hold them to


def test_a_manifest_edited_with_the_files_it_lists_fails_the_integrity_check(tmp_path: Path) -> None:
    """A file changed and its manifest entry rewritten to match: the files agree with the manifest,
    but the manifest is no longer the one the build wrote (its digest is the env-digest)."""
    import hashlib

    from envbuild.smoke.inside import integrity

    venv, folder = _image_like(tmp_path)
    target = venv / "lib" / "site-packages" / "numpy" / "__init__.py"
    target.write_text("x = 1  # patched\n")
    written = json.loads((folder / "manifest.json").read_text())
    rel = str(target.relative_to(venv))
    written["files"][rel] = [written["files"][rel][0], hashlib.sha256(target.read_bytes()).hexdigest()]
    (folder / "manifest.json").write_text(json.dumps(written))
    with pytest.raises(CheckFailed, match=r"manifest.json was changed after the build: its digest is [0-9a-f]{12}"):
        integrity.check_integrity(_ctx(expect_path=str(folder / "expect.json")), Result("integrity"))


def test_a_manifest_whose_env_digest_was_removed_fails_naming_it(tmp_path: Path) -> None:
    """`rm /opt/envbuild/env-digest` in a derived image: integrity failed with a bare
    FileNotFoundError and "fix: see facts.traceback"."""
    from envbuild.smoke.inside import integrity

    _, folder = _image_like(tmp_path)
    (folder / "env-digest").unlink()
    with pytest.raises(CheckFailed, match=r"env-digest is gone: the build writes it beside the manifest"):
        integrity.check_integrity(_ctx(expect_path=str(folder / "expect.json")), Result("integrity"))


def _record_line(path: Path, rel: str) -> str:
    import base64
    import hashlib

    b64 = base64.urlsafe_b64encode(hashlib.sha256(path.read_bytes()).digest()).rstrip(b"=").decode()
    return f"{rel},sha256={b64},{path.stat().st_size}\n"


def test_a_file_edited_with_the_manifest_and_its_digest_fails_against_its_wheel_s_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """By hand on 2026-12-07: an image built FROM a tested one that appended a line to
    numpy/__init__.py, rewrote its manifest entry, /opt/envbuild/env-digest and the env-digest label
    passed every check (`smoke passed`; only the host's record said the image was not the one that
    passed). The wheel's RECORD is a second witness: the edit must forge it too. A path two
    distributions ship holds if it is either's; conda's packages (their prefixes rewritten at
    install) and byte code (compiled again by the build: numpy's wheel carries some) are not held
    to their RECORDs."""
    from envbuild.smoke.inside import integrity, manifest

    venv, folder = _image_like(tmp_path, monkeypatch)
    site = venv / "lib" / "site-packages"
    target = site / "numpy" / "__init__.py"
    (site / "numpy" / "x.cpython-311.pyc").write_bytes(b"recompiled")
    (site / "numpy" / "_vendor").mkdir()
    (site / "numpy" / "_vendor" / "pkg.py").write_text("patched after vendoring\n")
    (site / "nvidia").mkdir()
    (site / "nvidia" / "__init__.py").write_text("")
    for dist, installer, lines in [
        # the build compiles every module again: a .pyc the wheel carried is not its RECORD's
        ("numpy-2.1.3", "uv", [_record_line(target, "numpy/__init__.py"), "numpy/x.cpython-311.pyc,sha256=eA,1\n"]),
        ("nvidia_a-1", "pip", [_record_line(site / "nvidia" / "__init__.py", "nvidia/__init__.py")]),
        ("nvidia_b-1", "pip", ["nvidia/__init__.py,sha256=c29tZXRoaW5nIGVsc2U,14\n"]),  # another build's
        ("condapkg-1", "conda", ["numpy/__init__.py,sha256=bm90IHRoaXM,3\n"]),
        # one a package vendors, whose RECORD is its vendoring's business
        ("numpy/_vendor/pkg-1", "pip", ["pkg.py,sha256=bm90IHRoaXM,3\n"]),
    ]:
        info = site / f"{dist}.dist-info"
        info.mkdir()
        (info / "INSTALLER").write_text(installer + "\n")
        (info / "RECORD").write_text("".join(lines) + f"{dist}.dist-info/RECORD,,\n")
    manifest.main(["--root", str(venv), "--write", str(folder / "manifest.json")])
    ctx = _ctx(expect_path=str(folder / "expect.json"))
    integrity.check_integrity(ctx, Result("integrity"))
    target.write_text("x = 1\nimport os as _o  # tampered\n")
    manifest.main(["--root", str(venv), "--write", str(folder / "manifest.json")])  # manifest and digest
    with pytest.raises(CheckFailed) as failed:
        integrity.check_integrity(ctx, Result("integrity"))
    said = failed.value.reason
    assert "1 file(s) unlike their wheel's RECORD (lib/site-packages/numpy/__init__.py)" in said, said
    assert said.endswith("which the manifest lists as they are: it was rewritten with them"), said
    assert "nvidia" not in said and "changed" not in said


def _labels_report(**found: Any) -> dict[str, Any]:
    expect = {"profile": "cpu-py311", "accelerator": "cpu", "python": "3.11", "torch": "2.13.0", "numpy": "2.1.3"}
    checks = [{"name": "integrity", "status": "pass", "facts": {"env_digest": "e" * 64}}]
    return {"expect": expect | found, "checks": checks, "passed": True, "failed": []}


@pytest.mark.parametrize(
    ("labels", "wrong"),
    [
        ({"io.envbuild.torch": "2.13.0", "io.envbuild.env-digest": "e" * 64}, None),
        ({}, None),  # an image without envbuild's labels: nothing to compare
        ({"io.envbuild.torch": "2.5.1"}, "io.envbuild.torch='2.5.1' but the image holds torch 2.13.0"),
        ({"io.envbuild.profile": "cu121-py311"}, "io.envbuild.profile='cu121-py311' but the image holds profile"),
        ({"io.envbuild.env-digest": "f" * 64}, "io.envbuild.env-digest is ffffffffffff but the environment's is eeee"),
    ],
)
def test_the_labels_check_fails_an_image_whose_labels_say_something_else(
    labels: dict[str, str], wrong: str | None
) -> None:
    """`LABEL io.envbuild.torch=2.5.1` in a derived Dockerfile passed every check inside the image,
    which reads expect.json, not labels; `docker inspect`, `images` and `pull --verify` read labels."""
    from envbuild.smoke import labels as labels_check

    report = _labels_report()
    labels_check.add(labels, report)
    entry = report["checks"][-1]
    assert entry["name"] == "labels"
    if wrong is None:
        assert entry["status"] == "pass" and report["passed"] and report["failed"] == []
    else:
        assert entry["status"] == "fail" and wrong in entry["reason"] and entry["remedy"]
        assert not report["passed"] and report["failed"] == ["labels"]


@pytest.mark.parametrize(
    ("labels", "fails"),
    [
        ({"io.envbuild.env-digest": "e" * 64}, True),
        ({"io.envbuild.env-digest": ""}, True),  # blanked by `LABEL io.envbuild.env-digest=""`
        ({"io.envbuild.torch": "2.13.0"}, False),  # the build's own smoke run (the label comes after), or
        # an image from templates that wrote no manifest: nothing says there was one
    ],
)
def test_an_image_whose_manifest_was_removed_fails_where_its_label_says_the_build_wrote_one(
    labels: dict[str, str], fails: bool
) -> None:
    """`FROM image` + `USER root` + `RUN rm -rf /opt/envbuild/manifest*`: integrity said "skip: no
    build manifest here" and the smoke test passed, so any file could then be changed unseen."""
    from envbuild.smoke import labels as labels_check

    report = _labels_report()
    report["checks"] = [{"name": "integrity", "status": "skip", "reason": "no build manifest here"}]
    labels_check.add(labels, report)
    entry = report["checks"][-1]
    assert (entry["status"] == "fail") is fails and report["passed"] is not fails
    if fails:
        assert "says the build wrote a manifest of the environment, but the image has none" in entry["reason"]


def test_a_derived_image_s_added_distribution_fails_exact_with_the_pins_hint_and_passes_pins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FROM an envbuild image + pip install: `exact` fails and says how to check such an image;
    `pins` lists the distribution instead. A file slipped into a locked distribution fails both,
    without that hint: it is not what a derived image looks like."""
    from envbuild.smoke.inside import integrity

    venv, folder = _image_like(tmp_path, monkeypatch)
    added = venv / "lib" / "site-packages" / "requests.py"
    added.write_text("")
    owners = {"lib/site-packages/requests.py": "requests", "lib/site-packages/numpy/__init__.py": "numpy"}
    monkeypatch.setattr(integrity, "_owners", lambda root: owners)
    expect = {"profile": "cpu-py311", "packages": {"numpy": "2.1.3"}}
    with pytest.raises(CheckFailed) as failed:
        integrity.check_integrity(_ctx(expect, expect_path=str(folder / "expect.json")), Result("integrity"))
    assert "1 distribution(s) not in the lockfile added: requests (1 file(s))" in failed.value.reason
    assert "--lock-match pins" in failed.value.remedy and "envbuild lock cpu-py311" in failed.value.remedy
    r = Result("integrity")
    pins = Context(expect=expect, gpus="none", timeout=60, lock_match="pins", expect_path=str(folder / "expect.json"))
    integrity.check_integrity(pins, r)
    assert r.facts["added_distributions"] == ["requests"]

    (venv / "lib" / "site-packages" / "numpy" / "extra.py").write_text("")
    owners["lib/site-packages/numpy/extra.py"] = "numpy"
    for ctx in (_ctx(expect, expect_path=str(folder / "expect.json")), pins):
        with pytest.raises(CheckFailed) as failed:
            integrity.check_integrity(ctx, Result("integrity"))
        assert "numpy: 1 file(s) added" in failed.value.reason
        assert "--lock-match" not in failed.value.remedy and "do not pip install" in failed.value.remedy


def test_the_pins_hint_is_for_an_image_checked_exactly_and_never_for_a_local_run() -> None:
    expect = {"profile": "cpu-py311"}
    assert "--lock-match pins" in _ctx(expect).environment_remedy(only_added=True)
    assert "--lock-match" not in _ctx(expect).environment_remedy()
    assert "--lock-match" not in _ctx(expect, local=True).environment_remedy(only_added=True)
    pins = Context(expect=expect, gpus="none", timeout=60, lock_match="pins")
    assert "--lock-match" not in pins.environment_remedy(only_added=True)


def test_the_integrity_check_skips_where_no_build_manifest_is(tmp_path: Path) -> None:
    from envbuild.smoke.inside import integrity

    (tmp_path / "expect.json").write_text("{}")
    with pytest.raises(Skip, match="no build manifest"):
        integrity.check_integrity(_ctx(expect_path=str(tmp_path / "expect.json")), Result("integrity"))


def test_a_locked_package_imported_from_outside_the_environment_fails_the_integrity_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`FROM image` + `ENV PYTHONPATH=/evil` with a patched copy of torch in /evil passed every
    check: the manifest covers the environment's files, and what ran was another copy."""
    from envbuild.smoke.inside import integrity

    # filelock: installed in the interpreter running the tests, so its distribution is found
    ctx = _ctx(expect={"packages": {"filelock": "1", "numpy": "2"}})
    found = integrity._shadowed(ctx)
    assert (found.modules, found.libraries) == ([], [])
    shadow = tmp_path / "evil" / "filelock"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path / "evil"))
    monkeypatch.delitem(sys.modules, "filelock", raising=False)  # an import still to come
    found = integrity._shadowed(ctx)
    assert (found.modules, found.libraries) == ([f"filelock (filelock) from {shadow / '__init__.py'}"], [])
    # a distribution the lock does not pin (a derived image's editable install) may live anywhere
    found = integrity._shadowed(_ctx(expect={"packages": {"numpy": "2"}}))
    assert (found.modules, found.libraries) == ([], [])


def test_checking_where_a_locked_pip_imports_from_leaves_setuptools_distutils_in_place() -> None:
    """A profile that pins pip (Python 3.11) failed torch.compile in the smoke test of a good image:
    importlib's find_spec("pip") makes setuptools' distutils shim stand down for the process, and
    Debian's python3.11 has no distutils of its own, so inductor's import of it failed after the
    integrity check. Here the interpreter has its own distutils, so the shim standing down shows as
    distutils coming from the standard library instead of setuptools."""
    import subprocess

    script = (
        "import sys\n"
        "if not any(type(f).__module__ == '_distutils_hack' for f in sys.meta_path): sys.exit(3)\n"
        "from envbuild.smoke.inside import integrity\n"
        "from envbuild.smoke.inside.core import Context\n"
        "pins = {'pip': '1', 'setuptools': '1'}\n"
        "ctx = Context(expect={'packages': pins}, gpus='none', timeout=60, lock_match='exact')\n"
        "assert integrity._shadowed(ctx).modules == []\n"
        "import distutils.core\n"
        "print(distutils.core.__file__)\n"
    )
    env = {**os.environ, "SETUPTOOLS_USE_DISTUTILS": "local"}
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", script], capture_output=True, text=True, env=env, check=False
    )
    if done.returncode == 3:
        pytest.skip("this interpreter has no setuptools distutils shim (distutils-precedence.pth)")
    assert done.returncode == 0, done.stderr
    assert f"setuptools{os.sep}_distutils" in done.stdout, done.stdout


def test_the_report_on_stdout_survives_what_else_prints_there(tmp_path: Path) -> None:
    """A patched package printing at import made `envbuild smoke` say "the smoke test crashed
    (exit 0) before its report" and show no checks. Once the smoke test runs, stray output goes to
    stderr (Python's print and a C library's write alike); a banner printed as the interpreter
    starts (a sitecustomize) comes before the report, which is read from its first line."""
    import subprocess

    from envbuild.smoke import host

    script = (
        "import os, sys\n"
        "print('banner from a sitecustomize', flush=True)\n"
        "from envbuild.smoke.inside import report\n"
        "def noisy(ctx, r):\n"
        "    print('imported a patched torch')\n"
        "    os.write(1, b'a C library says hello\\n')\n"
        "    r.facts['ran'] = True\n"
        "report.CHECKS[:] = [('noisy', noisy)]\n"
        "sys.exit(report.main(['--json', '-', '--local']))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "imported a patched torch" in done.stderr and "a C library says hello" in done.stderr
    assert done.stdout.startswith("banner from a sitecustomize\n{\n")
    got = host.read_report(done.stdout)
    assert got["passed"] and got["checks"][0]["facts"] == {"ran": True}
    with pytest.raises(ValueError):
        host.read_report("banner only\n")


def test_a_local_run_has_no_manifest_but_still_fails_a_shadowed_locked_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`smoke --local` skips the manifest comparison (a venv has none); a locked package imported
    from elsewhere (an editable checkout, a .pth) still means the lockfile's environment was not tested."""
    from envbuild.smoke.inside import integrity

    local = _ctx(expect={"packages": {"filelock": "1"}}, local=True, lock_match="pins")
    with pytest.raises(Skip, match="no build manifest"):
        integrity.check_integrity(local, Result("integrity"))
    (tmp_path / "src" / "filelock").mkdir(parents=True)
    (tmp_path / "src" / "filelock" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    monkeypatch.delitem(sys.modules, "filelock", raising=False)
    with pytest.raises(CheckFailed, match=r"filelock \(filelock\) from .*/src/filelock/__init__.py") as failed:
        integrity.check_integrity(local, Result("integrity"))
    assert "derived image" not in failed.value.remedy  # a host has no Dockerfile to point at
    with pytest.raises(Skip):  # --lock-match none: no lockfile to hold it to
        integrity.check_integrity(_ctx(expect=local.expect, local=True, lock_match="none"), Result("integrity"))


def test_a_locked_module_in_the_images_workdir_fails_and_a_namespace_folder_there_does_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`python train.py` in a derived image's WORKDIR imports a `filelock.py` there before the
    environment's; the smoke test runs elsewhere, so the host names the WORKDIR. A data folder that
    shares a package's name (no __init__.py) is a namespace portion, which the real package beats."""
    from envbuild.smoke.inside import integrity
    from envbuild.smoke.inside.core import WORKDIR_ENV

    ctx = _ctx(expect={"packages": {"filelock": "1", "pytest": "1"}}, local=True, lock_match="pins")
    app = tmp_path / "app"
    (app / "pytest").mkdir(parents=True)  # a folder of data named like a locked package
    (app / "train.py").write_text("import filelock\n")
    monkeypatch.setenv(WORKDIR_ENV, str(app))
    with pytest.raises(Skip, match="no build manifest"):
        integrity.check_integrity(ctx, Result("integrity"))
    (app / "filelock.py").write_text("")
    with pytest.raises(CheckFailed) as failed:
        integrity.check_integrity(ctx, Result("integrity"))
    assert f"filelock (filelock) from {app}/filelock.py (the image's WORKDIR {app})" in failed.value.reason
    assert "pytest (pytest)" not in failed.value.reason
    assert "rename those files or folders in the image's WORKDIR" in failed.value.remedy


def test_a_local_run_names_the_current_folder_when_a_file_there_shadows_a_locked_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `smoke --local` runs with -m, so the caller's folder is first on sys.path, as for their scripts
    from envbuild.smoke.inside import integrity

    (tmp_path / "filelock.py").write_text("")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "filelock", raising=False)
    local = _ctx(expect={"packages": {"filelock": "1"}}, local=True, lock_match="pins")
    with pytest.raises(CheckFailed) as failed:
        integrity.check_integrity(local, Result("integrity"))
    assert f"filelock (filelock) from {tmp_path}/filelock.py (the current folder {tmp_path})" in failed.value.reason
    assert failed.value.remedy.startswith("rename those files or folders in the current folder, or run from another")


def test_a_preloaded_library_is_shown_not_failed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from envbuild.smoke.inside import integrity, report

    monkeypatch.setenv("LD_PRELOAD", "/usr/lib/libjemalloc.so.2")
    r = Result("integrity")
    with pytest.raises(Skip):  # no manifest here; the preload is still in the report
        integrity.check_integrity(_ctx(expect={}, local=True, lock_match="none"), r)
    assert r.facts["preload"] == "LD_PRELOAD=/usr/lib/libjemalloc.so.2"
    shown = report.detail({"reason": "", "facts": {"preload": r.facts["preload"], "files": 3}})
    assert shown == "preload=LD_PRELOAD=/usr/lib/libjemalloc.so.2"


def test_a_standard_library_moved_by_pythonhome_fails_even_with_pins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`ENV PYTHONHOME=/evil` over a copied, patched stdlib read as "an apt upgrade changed
    random.py in /usr/lib/python3.11", which pins lists instead of failing."""
    from envbuild.smoke.inside import integrity, manifest

    here = manifest._stdlib()
    recorded = str(tmp_path / "usr" / "lib" / "python3.11")  # where the build's OS Python had it
    built: dict[str, Any] = {
        "interpreter": {"stdlib": recorded, "files": {}, "executable": ["/usr/bin/python3.11", "x"]}
    }
    monkeypatch.setenv("PYTHONHOME", "/evil")
    upgraded = {"libpython3.11-stdlib": "3.11.2-6+deb12u9"}  # OS packages that moved too: still no apt upgrade
    with pytest.raises(CheckFailed) as failed:
        integrity._base_python(
            built, str(tmp_path / "venv"), _ctx(expect={}, lock_match="pins"), Result("integrity"), upgraded
        )
    assert (
        failed.value.reason
        == f"the standard library is read from {here}, not the build's {recorded} (PYTHONHOME=/evil)"
    )
    assert failed.value.remedy.startswith("unset PYTHONHOME")
    built["interpreter"] = manifest.interpreter(str(tmp_path / "venv"))  # the folder and files recorded
    venv = str(tmp_path / "venv")
    assert integrity._base_python(built, venv, _ctx(expect={}, lock_match="exact"), Result("x"), upgraded) == []


def test_a_library_a_locked_wheel_ships_loaded_from_another_folder_is_named() -> None:
    """LD_LIBRARY_PATH beats torch's RUNPATH: a copy of libc10.so (or a CUDA toolkit's libcudnn)
    there is what runs. Read from this process's real /proc/self/maps, with libc standing in for a
    library a wheel ships."""
    from envbuild.smoke.inside import integrity

    with open("/proc/self/maps", encoding="utf-8") as fh:
        libc = next(line.split()[-1] for line in fh if line.rstrip().endswith("/libc.so.6"))
    folder = os.path.dirname(os.path.realpath(libc))
    shipped = {"/opt/venv/lib/libc.so.6"}
    assert integrity._named(integrity._libraries_elsewhere(shipped, {"/opt/venv/lib"}, torch=False)) == [
        f"libc.so.6 from {libc}"
    ]
    assert (
        integrity._named(integrity._libraries_elsewhere(shipped, {folder}, torch=False)) == []
    )  # where the wheel has it
    # a wheel's file that links to it (a conda env's torch/lib into its lib/): the same file, no copy
    assert (
        integrity._named(integrity._libraries_elsewhere({os.path.realpath(libc)}, {"/opt/venv/lib"}, torch=False)) == []
    )
    assert (
        integrity._named(integrity._libraries_elsewhere({"/opt/venv/lib/libother.so"}, {"/opt/venv/lib"}, torch=False))
        == []
    )


def test_a_wheels_extension_module_named_like_a_standard_library_one_is_not_a_copy_of_it() -> None:
    """pyarrow ships pyarrow/_json.cpython-311-x86_64-linux-gnu.so, and `import json` maps the
    standard library's _json.cpython-311-x86_64-linux-gnu.so: the check called that a library
    loaded from outside the environment and failed every image with pyarrow (datasets, pandas'
    Arrow strings). Python imports extension modules by path; only shared libraries are found by
    name. _ctypes, mapped in this process, stands in for _json."""
    import _ctypes

    from envbuild.smoke.inside import integrity

    mapped = os.path.realpath(_ctypes.__file__)
    assert mapped.endswith(".so")
    shipped = {f"/opt/venv/lib/python3.11/site-packages/pyarrow/{os.path.basename(mapped)}"}
    assert integrity._libraries_elsewhere(shipped, {"/opt/venv/lib"}, torch=False) == []


def test_a_library_reached_through_a_link_by_a_wheels_name_is_named(tmp_path: Path) -> None:
    """The maps name the file a link led to: an OS's libgomp.so.1 (a link to libgomp.so.1.0.0) or a
    CUDA toolkit's libcudnn.so.9 went unseen by the wheel's name. A real library (a copy of a
    standard-library extension) loaded by a real dlopen through such a link."""
    import _ctypes
    import ctypes

    from envbuild.smoke.inside import integrity

    source = Path(_ctypes.__file__)  # a shared library on any CPython that has ctypes
    real = tmp_path / "libstandin.so.1.0.0"
    real.write_bytes(source.read_bytes())
    (tmp_path / "libstandin.so.1").symlink_to(real.name)
    ctypes.CDLL(str(tmp_path / "libstandin.so.1"))
    shipped = {"/opt/venv/lib/libstandin.so.1"}
    assert integrity._named(integrity._libraries_elsewhere(shipped, {"/opt/venv/lib"}, torch=False)) == [
        f"libstandin.so.1 from {tmp_path}/libstandin.so.1"
    ]
    # the wheel's own file, reached through a link (a conda env's torch/lib into its lib/): no copy
    assert integrity._named(integrity._libraries_elsewhere({str(real)}, {"/opt/venv/lib"}, torch=False)) == []


def test_a_preload_that_replaces_a_library_a_wheel_ships_fails_and_names_the_preload(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libgomp.so.1` (an OpenMP clash workaround) puts the
    OS's libgomp in place of the one torch's CPU wheel ships, and the report blamed LD_LIBRARY_PATH,
    which was not set. A preload of a library no wheel ships is still only reported."""
    from envbuild.smoke.inside import integrity, oslibs

    system = "/usr/lib/x86_64-linux-gnu/libgomp.so.1"
    found = [("libgomp.so.1", system)]
    monkeypatch.setattr(integrity, "_shadowed", lambda ctx: integrity.Shadowed([], found, False, False))
    monkeypatch.delenv("LD_LIBRARY_PATH", raising=False)
    monkeypatch.setenv("LD_PRELOAD", f"/usr/lib/libjemalloc.so.2:{system}")
    with pytest.raises(CheckFailed) as failed:
        integrity._fail_if_shadowed(_ctx(expect={}))
    assert failed.value.reason == (
        f"libraries the locked wheels ship are loaded from outside the environment: libgomp.so.1 from {system}"
        f" (preloaded: LD_PRELOAD={system})"
    )
    assert failed.value.remedy.startswith(
        "drop them from LD_PRELOAD (an ENV in a derived image's Dockerfile, or -e at run time) or /etc/ld.so.preload"
    )
    assert "LD_LIBRARY_PATH" not in failed.value.remedy
    monkeypatch.setenv("LD_PRELOAD", "libgomp.so.1")  # a bare name, which the loader searches for
    assert oslibs.preloaded_among(found) == "LD_PRELOAD=libgomp.so.1"
    monkeypatch.setenv("LD_PRELOAD", "/usr/lib/libjemalloc.so.2")
    assert oslibs.preloaded_among(found) == ""
    monkeypatch.setenv("LD_LIBRARY_PATH", str(tmp_path))  # then it is what put the copy first
    with pytest.raises(CheckFailed) as failed:
        integrity._fail_if_shadowed(_ctx(expect={}))
    assert f"(LD_LIBRARY_PATH={tmp_path} comes first)" in failed.value.reason
    assert failed.value.remedy.startswith("take those folders off LD_LIBRARY_PATH or LD_PRELOAD")


def test_a_copy_of_the_environment_first_on_path_fails_integrity(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`cp -a /opt/venv /alt`, a patched file in /alt, `ENV PATH=/alt/bin:$PATH`: every check ran in
    /alt's Python and passed, the manifest still vouching for the untouched /opt/venv."""
    from envbuild.smoke.inside import integrity

    venv, folder = _image_like(tmp_path, monkeypatch)
    ctx = _ctx(expect_path=str(folder / "expect.json"))
    integrity.check_integrity(ctx, Result("integrity"))
    monkeypatch.setattr(sys, "prefix", "/alt")
    monkeypatch.setenv("PATH", "/alt/bin:/usr/bin")
    with pytest.raises(CheckFailed) as failed:
        integrity.check_integrity(ctx, Result("integrity"))
    assert f"(prefix /alt), not the environment's: {venv} (PATH=/alt/bin:/usr/bin)" in failed.value.reason
    assert failed.value.remedy.startswith(f"put {venv}/bin first on PATH")


def test_a_conda_images_constraints_are_the_environments_own_versions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pip holds a constraint against the installed metadata, which for conda-forge's torch can read
    otherwise than the conda package's version: the pins come from the environment, not the lock."""
    from envbuild.smoke.inside import constraints

    site = tmp_path / "site"
    for name, version in (("torch", "2.5.1.post108"), ("numpy", "2.1.3")):
        info = site / f"{name}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    monkeypatch.syspath_prepend(str(site))
    held = tmp_path / "constraints.txt"
    held.write_text("# what it holds\n")
    assert constraints.main(["--append", str(held), "numpy", "torch", "envbuild-no-such-dist"]) == 0
    assert held.read_text() == "# what it holds\nnumpy==2.1.3\ntorch==2.5.1.post108\n"
    # an environment without torch is not an image to hold anything for: the build step fails
    assert constraints.main(["--append", str(held), "envbuild-no-such-dist"]) == 1
    assert held.read_text().count("==") == 2
    # torchvision and torchaudio: as installed (the channel's), else at <0: PyPI's builds fail on
    # import beside a conda torch, and pip took them without a word
    held.write_text("")
    argv = ["--append", str(held), "torch", "--channel-only", "envbuild-no-such-dist", "numpy"]
    assert constraints.main(argv) == 0
    assert held.read_text() == "torch==2.5.1.post108\nenvbuild-no-such-dist<0\nnumpy==2.1.3\n"


def _importable(folder: Path, modules: dict[str, str]) -> None:
    for name, body in modules.items():
        (folder / f"{name}.py").write_text(body)


def test_the_imports_check_imports_every_locked_distribution_here() -> None:
    """The interpreter running the tests has filelock, jinja2 and PyYAML: each locked one's modules
    are imported in a child process (PyYAML's `_yaml` is private: left out)."""
    from envbuild.smoke.inside import imports

    ctx = _ctx(expect={"packages": {"filelock": "3", "Jinja2": "3", "PyYAML": "6", "pip": "26"}})
    assert {"filelock", "jinja2", "yaml"} <= set(imports._modules(ctx)) and "pip" not in imports._modules(ctx)
    r = Result("imports")
    imports.check_imports(ctx, r)
    assert r.facts["imported"] == len(imports._modules(ctx)) >= 3


def test_a_locked_module_that_fails_to_import_fails_the_check_with_the_os_package_to_add(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """opencv-python (not -headless) in an image without libGL passed every check, then failed
    the user's `import cv2`. The message names the module, its distribution and the apt fix; a
    CUDA package that wants the driver's libcuda (a build host with no GPU) only counts as a fact,
    and what an import prints does not confuse the run."""
    from envbuild.smoke.inside import imports

    _importable(
        tmp_path,
        {
            "cv2": "raise ImportError('libGL.so.1: cannot open shared object file: No such file or directory')",
            "noisy": "print('hello from an import'); print('@envbuild-import@')",
            "cudaext": "raise ImportError('libcuda.so.1: cannot open shared object file: No such file or directory')",
        },
    )
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    found = {"cv2": "opencv-python", "cudaext": "flash-attn", "noisy": "noisy"}
    monkeypatch.setattr(imports, "_modules", lambda ctx: found)
    r = Result("imports")
    with pytest.raises(CheckFailed) as failed:
        imports.check_imports(_ctx(expect={"profile": "cpu-py311"}), r)
    assert failed.value.reason.startswith(
        "1 of 3 locked module(s) fail to import: cv2 (opencv-python): ImportError: libGL.so.1: cannot open"
    )
    assert failed.value.remedy.startswith("the image lacks the OS library libGL.so.1: add `libgl1` to the profile's")
    assert r.facts["imported"] == 1 and list(r.facts["needs_gpu"]) == ["cudaext (flash-attn)"]


def test_an_import_that_crashes_the_interpreter_is_named_and_the_rest_still_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A binary built for another ABI can kill the interpreter on import: the run names the
    module that was importing, not a bare crash, and still imports the ones after it."""
    from envbuild.smoke.inside import imports

    _importable(
        tmp_path,
        {
            "aaa_fine": "",
            "bbb_crash": "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)",
            # a thread that is not a daemon, started on import: the child still ends after the last import
            "ccc_after": "import threading, time; threading.Thread(target=time.sleep, args=(3600,)).start()",
        },
    )
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setattr(imports, "_modules", lambda ctx: {"aaa_fine": "a", "bbb_crash": "b", "ccc_after": "c"})
    monkeypatch.setattr(imports, "LIMIT_S", 30.0)
    r = Result("imports")
    t0 = time.monotonic()
    with pytest.raises(CheckFailed) as failed:
        imports.check_imports(_ctx(expect={}), r)
    assert time.monotonic() - t0 < 25  # not the 30 s limit waited out for the thread
    assert failed.value.reason == (
        "1 of 3 locked module(s) fail to import: bbb_crash (b): the import crashed the interpreter (exit -11)"
    )
    assert r.facts["imported"] == 2  # the modules after it, in a child of their own


def test_an_import_remedy_names_numpy_abi_and_torch_abi_breaks() -> None:
    from envbuild.smoke.inside import imports

    numpy_1 = "ImportError: A module that was compiled using NumPy 1.x cannot be run in NumPy 2.1.3"
    assert imports._remedy(numpy_1, "cpu-py311").startswith("a package compiled against NumPy 1.x: pin numpy<2 in")
    torch_abi = "OSError: /opt/venv/.../torch_scatter/_scatter_cpu.so: undefined symbol: _ZN3c10..."
    assert "another release of torch" in imports._remedy(torch_abi, "cpu-py311")


def test_an_image_built_from_an_envbuild_image_imports_what_it_added_too() -> None:
    """`FROM image` + `pip install torchvision` took PyPI's CUDA build beside torch +cpu: the image
    passed `envbuild smoke IMAGE --lock-match pins`, and the user's `import torchvision` failed.
    Under pins an image's added distributions import too; exact refuses them anyway, and a host's
    interpreter (--local) holds what it likes."""
    from envbuild.smoke.inside import imports

    expect = {"packages": {"filelock": "3"}}
    derived = set(imports._modules(_ctx(expect=expect, lock_match="pins")))
    assert {"filelock", "jinja2", "yaml", "pytest"} <= derived and "pip" not in derived
    assert set(imports._modules(_ctx(expect=expect))) == {"filelock"}
    assert set(imports._modules(_ctx(expect=expect, lock_match="pins", local=True))) == {"filelock"}


def test_a_companion_built_for_another_torch_build_is_named_with_the_index_that_has_the_right_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """PyPI's torchvision beside torch 2.13.0+cpu: "operator torchvision::nms does not exist"; its
    torchaudio: "libc10_cuda.so: cannot open shared object file" (seen in a cpu-py311 image), which
    is no OS package to add."""
    from envbuild.smoke.inside import imports

    monkeypatch.setenv("ENVBUILD_TORCH_INDEX", "https://download.pytorch.org/whl/cpu")
    vision = "RuntimeError: operator torchvision::nms does not exist"
    audio = "OSError: libc10_cuda.so: cannot open shared object file: No such file or directory"
    for error, dist in ((vision, "torchvision"), (audio, "torchaudio")):
        remedy = imports._remedy(error, "cpu-py311", dist)
        assert remedy.startswith(f"{dist} was built for another build of torch than this environment's"), remedy
        assert f"pip install --extra-index-url https://download.pytorch.org/whl/cpu {dist}" in remedy
    assert imports._remedy("OSError: libGL.so.1: cannot open shared object file", "cpu-py311").startswith(
        "the image lacks the OS library"
    )


def test_every_library_an_extension_module_lacks_is_named_at_once_but_not_what_the_wheel_vendors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The import names only the first missing library: opencv-python wants libGL.so.1, then
    libgthread-2.0.so.0, a rebuild each. ldd of the distribution's extension modules names them
    all; a library the wheel vendors (auditwheel's NAME.libs/, loaded by its soname) is no gap.
    Real ELF files, linked here against libraries that then go away."""
    import shutil
    import subprocess
    import sysconfig

    from envbuild.smoke.inside import imports

    if not shutil.which("gcc") or not shutil.which("ldd"):
        pytest.skip("needs gcc and ldd to make real shared objects")
    build, site = tmp_path / "build", tmp_path / "site"
    build.mkdir()
    (site / "fakepkg.libs").mkdir(parents=True)
    (build / "x.c").write_text("int x(void) { return 1; }\n")
    for lib in ("libGLstandin.so.1", "libvendored-1a2b3c.so"):
        compile_lib = ["gcc", "-shared", "-fPIC", "-o", str(build / lib), f"-Wl,-soname,{lib}", str(build / "x.c")]
        subprocess.run(compile_lib, check=True)
    module = "fakemod" + sysconfig.get_config_var("EXT_SUFFIX")
    subprocess.run(
        [
            "gcc",
            "-shared",
            "-fPIC",
            "-o",
            str(site / module),
            str(build / "x.c"),
            "-Wl,--no-as-needed",
            str(build / "libGLstandin.so.1"),
            str(build / "libvendored-1a2b3c.so"),
        ],
        check=True,
    )
    shutil.move(str(build / "libvendored-1a2b3c.so"), site / "fakepkg.libs")
    shutil.rmtree(build)  # libGLstandin.so.1 is gone: what an image without libgl1 looks like
    info = site / "fakepkg-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fakepkg\nVersion: 1.0\n")
    (info / "RECORD").write_text(
        f"{module},,\nfakepkg.libs/libvendored-1a2b3c.so,,\nfakepkg-1.0.dist-info/METADATA,,\n"
    )
    monkeypatch.setattr(imports, "_homes", lambda: [str(site)])
    assert imports._unresolved("fakepkg") == ["libGLstandin.so.1"]
    remedy = imports._remedy("ImportError: libGLstandin.so.1: cannot open shared object file", "x", "fakepkg")
    assert remedy.startswith("the image lacks the OS library libGLstandin.so.1: add the Debian package that has")


def test_only_runs_the_named_checks_and_a_name_it_has_not_fails_the_run(tmp_path: Path) -> None:
    """`smoke --only`: a project check named as the profile lists it runs alone; a name the
    environment has no check for is a failed check that lists the real ones, never a run that
    checked nothing and passed."""
    script = tmp_path / "ok.py"
    script.write_text("print('trained')\n")
    ctx = _ctx({"checks": [{"file": "ok.py", "path": str(script)}]})
    ran = report.run(ctx, ["check:checks/ok.py"])
    assert [c["name"] for c in ran["checks"]] == ["check:ok.py"]
    assert ran["passed"] and ran["only"] == ["check:checks/ok.py"]
    assert "(only check:checks/ok.py: not the whole smoke test)" in report.table(ran)
    ran = report.run(ctx, ["check:other.py"])
    assert not ran["passed"] and ran["failed"] == ["check:other.py"]
    assert ran["checks"][0]["remedy"].endswith("perf, check:ok.py")


def test_a_derived_images_install_that_moved_locked_packages_is_told_how_to_keep_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`pip install lightning` in an image built FROM the envbuild image took fsspec back a year; the
    remedy was "do not pip install into an envbuild environment", which is what that image is for.
    With --lock-match pins it now names the pins to keep in that install. Here the test's own venv
    plays the image: its pytest stands for the moved package."""
    from types import ModuleType, SimpleNamespace

    from envbuild.smoke.inside import versions

    torch = ModuleType("torch")
    torch.__version__ = "2.13.0+cpu"  # type: ignore[attr-defined]
    torch.version = SimpleNamespace(cuda=None, hip=None)  # type: ignore[attr-defined]
    numpy = ModuleType("numpy")
    numpy.__version__ = "2.1.3"  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "numpy", numpy)
    expect = {"profile": "cpu-py311", "accelerator": "cpu", "packages": {"pytest": "0.0.1"}}
    with pytest.raises(CheckFailed) as failed:
        versions.check_versions(_ctx(expect, lock_match="pins"), Result("versions"))
    assert failed.value.reason.startswith("versions differ from the lockfile: pytest ")
    assert failed.value.remedy.startswith(
        "the install in the image built FROM this one changed locked packages: add pytest==0.0.1 to that pip install"
    )
    assert "envbuild lock cpu-py311 && envbuild build cpu-py311" in failed.value.remedy
    # integrity's files of the moved package get the same remedy; one of a package not moved, not
    assert versions.moved_remedy(_ctx(expect, lock_match="pins"), {"pytest"}) == failed.value.remedy
    assert versions.moved_remedy(_ctx(expect, lock_match="pins"), {"pytest", "(no distribution)"}) == ""
    for ctx in (  # the image itself, a host's interpreter, a package gone as well: not a derived install's move
        _ctx(expect, lock_match="exact"),
        _ctx(expect, lock_match="pins", local=True),
        _ctx({**expect, "packages": {"pytest": "0.0.1", "no-such-dist": "1"}}, lock_match="pins"),
    ):
        with pytest.raises(CheckFailed) as failed:
            versions.check_versions(ctx, Result("versions"))
        assert "changed locked packages" not in failed.value.remedy
