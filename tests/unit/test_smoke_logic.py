"""Smoke decisions that need no GPU or engine: architecture coverage, the driver floor, and
which leftover smoke containers are stale.

CI has no GPU, so these are the parts of the gpu check that can be proven on every run; the
kernels themselves run on a GPU host (scripts/host_smoke.py).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import pytest

from envbuild.smoke.host import stale_since
from envbuild.smoke.inside.gpu import arch_covers, driver_verdict, version_tuple
from tests.conftest import Result

# torch 2.11.0+cu130's list as torch.cuda.get_arch_list() reported it on an H200 (docs/GPU-SMOKE.md),
# and an older cu118 one
CU130 = ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]
CU118 = ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"]


@pytest.mark.parametrize(
    ("capability", "arch_list", "runs"),
    [
        ("9.0", CU130, True),  # H100 / H200: own SASS
        ("12.0", CU130, True),  # Blackwell workstation: own SASS
        ("12.0", CU118, False),  # Blackwell on a cu118 build: is_available() is True, kernels fail
        ("10.0", CU118, False),  # B200 on cu118
        ("8.9", CU118, True),  # Ada (RTX 4090, L4): no sm_89, but sm_86 SASS runs on 8.x from 8.6 up
        ("8.6", ["sm_80", "sm_89"], True),  # sm_80 runs on 8.6; sm_89 would not
        ("8.0", ["sm_86", "sm_90"], False),  # SASS never runs on an older minor ...
        ("9.0", ["sm_75", "sm_86"], False),  # ... nor across majors
        ("9.0", ["sm_80", "compute_80"], True),  # PTX of an older architecture is compiled for it
        ("12.1", CU130, True),  # GB10 (sm_121) on sm_120 SASS
        ("9.0", ["sm_80", "compute_90a"], True),  # arch-specific PTX runs on exactly that GPU
        ("10.0", ["sm_80", "compute_90a"], False),  # ... and is not forward compatible
        ("9.0", ["sm_90a"], True),  # arch-specific SASS
        ("9.1", ["sm_90a"], False),  # ... exactly that one
        ("10.3", ["sm_100f"], True),  # family-specific: that major, from its minor up
        ("12.0", ["compute_100f"], False),  # ... and not beyond the family
        ("7.0", CU130, False),  # Volta left cu130's list
    ],
)
def test_arch_covers(capability: str, arch_list: list[str], runs: bool) -> None:
    assert arch_covers(capability, arch_list) is runs


def test_arch_covers_ignores_entries_it_cannot_read() -> None:
    assert arch_covers("9.0", ["gfx942", "sm_", "compute_x", "sm_90"]) is True
    assert arch_covers("9.0", []) is False


FLOOR_130 = {"min_driver": "580.65.06", "minor_floor": "580"}


def test_driver_below_the_minor_compat_floor_is_a_problem() -> None:
    problem, note = driver_verdict("575.57.08", FLOOR_130, "13.0")
    assert problem == "driver 575.57.08 is older than 580, the oldest that runs CUDA 13.0" and note is None


def test_driver_between_the_floors_runs_with_a_note() -> None:
    problem, note = driver_verdict("580.10", FLOOR_130, "13.0")
    assert problem is None
    assert note == "driver 580.10 runs CUDA 13.0 through minor-version compatibility (full support from 580.65.06)"


def test_driver_at_or_above_full_support_is_silent() -> None:
    assert driver_verdict("580.65.06", FLOOR_130, "13.0") == (None, None)
    assert driver_verdict("590.44.01", FLOOR_130, "13.0") == (None, None)


def test_version_tuple_compares_numerically() -> None:
    assert version_tuple("580.65.06") > version_tuple("580.9")
    assert version_tuple("535.104.05") < version_tuple("580")


ZERO = "0001-01-01T00:00:00Z"  # what the engine reports for a time that has not happened


def test_a_running_smoke_container_is_never_stale() -> None:
    # the race seen with two builds at once: listed as "created", inspected after its start
    running = {"Created": "2026-11-30T04:00:00.1Z", "State": {"Status": "running", "FinishedAt": ZERO}}
    assert stale_since(running) is None


def test_exited_counts_from_finish_and_created_from_creation() -> None:
    exited = {"Created": "2026-11-30T04:00:00Z", "State": {"Status": "exited", "FinishedAt": "2026-11-30T04:00:09.5Z"}}
    created = {"Created": "2026-11-30T04:00:00.25Z", "State": {"Status": "created", "FinishedAt": ZERO}}
    assert stale_since(exited) == datetime(2026, 11, 30, 4, 0, 9, 500000, tzinfo=timezone.utc)
    assert stale_since(created) == datetime(2026, 11, 30, 4, 0, 0, 250000, tzinfo=timezone.utc)


def test_unset_or_unreadable_times_are_not_stale() -> None:
    assert stale_since({"State": {"Status": "exited", "FinishedAt": ZERO}}) is None
    assert stale_since({"State": {"Status": "exited", "FinishedAt": "soon"}}) is None
    assert stale_since({"State": {"Status": "paused"}}) is None
    assert stale_since({}) is None


@pytest.mark.parametrize("command", [["smoke", "cpu-py311"], ["build", "cpu-py311"], ["run", "cpu-py311"]])
@pytest.mark.parametrize("value", ["foo", "0", "-1", "2.5", ""])
def test_a_bad_gpus_value_is_a_usage_error_before_any_work(
    cli: Callable[..., Result], command: list[str], value: str
) -> None:
    """It used to pass unnoticed: `smoke --gpus foo` reported a pass, `build --gpus foo` built for minutes first."""
    res = cli(*command, "--gpus", value)
    assert res.code == 2, res.err
    assert f"--gpus {value!r}: not auto, all, none or a number of GPUs" in res.err
    assert "e.g. --gpus all" in res.err


def test_gpus_auto_means_every_gpu_unless_a_build_runs_on_a_host_without_any(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from envbuild import hostgpu as host

    monkeypatch.setattr(host, "host_has_gpu", lambda accelerator: False)
    # asked for directly, a CUDA profile asks for its GPUs and fails its gpu check here
    assert host.gpus_for("auto", "cuda", absent_ok=False) == "all"
    # a build on a CPU runner tests the rest; the image's smoke.gpu label says "skip"
    assert host.gpus_for("auto", "cuda", absent_ok=True) == "none"
    assert host.gpus_for("auto", "rocm", absent_ok=True) == "none"
    assert host.gpus_for("2", "cuda", absent_ok=True) == "2"  # an explicit count is never second-guessed
    assert host.gpus_for("all", "cpu", absent_ok=False) == "none"  # a CPU image has no GPU to be given
    monkeypatch.setattr(host, "host_has_gpu", lambda accelerator: True)
    assert host.gpus_for("auto", "cuda", absent_ok=True) == "all"


@pytest.mark.parametrize("command", [["smoke", "cpu-py311"], ["run", "cpu-py311"]])
@pytest.mark.parametrize("value", ["lots", "0", "2x", ""])
def test_a_bad_shm_size_is_a_usage_error(cli: Callable[..., Result], command: list[str], value: str) -> None:
    """`smoke --shm-size lots` was exit 70, "a bug in envbuild", with docker-py's exception as its text."""
    res = cli(*command, "--shm-size", value)
    assert res.code == 2, res.err
    assert f"--shm-size {value!r}: not a size" in res.err and "e.g. --shm-size 2g" in res.err


@pytest.mark.parametrize("value", ["2g", "512m", "1.5G", "2GB", "1073741824"])
def test_sizes_the_engine_reads_are_accepted(value: str) -> None:
    from envbuild import hostgpu

    hostgpu.check_shm_size(value)


def test_run_refuses_to_ask_for_gpus_a_local_host_does_not_have(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """docker's own answer is 'could not select device driver "" with capabilities: [[gpu]]', exit 125."""
    from envbuild import hostgpu, profile, runner
    from envbuild.errors import UsageError
    from tests.conftest import VALID

    cuda = profile.Profile.model_validate({**VALID})  # cu121-py311
    monkeypatch.setattr(hostgpu, "host_has_gpu", lambda accelerator: False)
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    with pytest.raises(UsageError) as refused:
        runner.docker_argv(cuda, "envbuild:cu121-py311", [], workdir=tmp_path)
    assert "cu121-py311 asks for GPUs, and this host has no NVIDIA GPU" in str(refused.value)
    assert "pass --gpus none" in str(refused.value)
    # an engine on another machine has GPUs this one cannot see: docker decides there
    monkeypatch.setenv("DOCKER_HOST", "ssh://gpu-box")
    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/docker")
    from envbuild.engine import engine_elsewhere

    argv = runner.docker_argv(cuda, "envbuild:cu121-py311", [], workdir=tmp_path, elsewhere=engine_elsewhere())
    assert argv[argv.index("--gpus") + 1] == "all"
    monkeypatch.delenv("DOCKER_HOST")
    argv = runner.docker_argv(cuda, "envbuild:cu121-py311", [], workdir=tmp_path, gpus="none")
    assert "--gpus" not in argv


def test_local_mode_in_an_interpreter_without_the_environment_says_so(tmp_path: Path) -> None:
    # a real interpreter with neither torch nor numpy: each check names what is missing and where,
    # instead of "ModuleNotFoundError ... fix: see facts.traceback"
    import subprocess
    import sys

    from envbuild.smoke.host import run_local

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "bare")], check=True)
    python = str(tmp_path / "bare" / "bin" / "python")
    report = run_local({"accelerator": "cpu", "python": "3.11"}, python=python, lock_match="none", timeout=60)
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["versions"]["reason"] == f"numpy is not installed in {python}"
    assert checks["ddp"]["reason"] == f"torch is not installed in {python}"
    assert "envbuild venv NAME DIR" in checks["ddp"]["remedy"] and report["exit_code"] == 1
    assert "change the profile" not in checks["ddp"]["remedy"]  # no torch at all: no profile would match


def test_local_mode_keeps_the_callers_pythonpath(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a team that puts its packages on PYTHONPATH tests that environment, not one without them:
    # numpy found only there must be seen (it was replaced by the smoke package's own folder)
    import subprocess
    import sys

    from envbuild.smoke.host import run_local

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "bare")], check=True)
    theirs = tmp_path / "theirs"
    (theirs / "numpy").mkdir(parents=True)
    (theirs / "numpy" / "__init__.py").write_text('__version__ = "1.26.4"\n')
    monkeypatch.setenv("PYTHONPATH", str(theirs))
    python = str(tmp_path / "bare" / "bin" / "python")
    report = run_local({"accelerator": "cpu", "python": "3.11"}, python=python, lock_match="none", timeout=60)
    checks = {c["name"]: c for c in report["checks"]}
    assert "numpy is not installed" not in checks["versions"]["reason"]
    assert checks["versions"]["reason"] == f"torch is not installed in {python}"


def test_local_mode_with_something_that_is_not_python(tmp_path: Path) -> None:
    from envbuild.errors import SmokeError
    from envbuild.smoke.host import run_local

    with pytest.raises(SmokeError, match=r"/bin/true printed no report \(exit 0\)"):
        run_local({"accelerator": "cpu"}, python="/bin/true", lock_match="none")


def test_fewer_gpus_than_asked_still_reports_the_ones_seen(monkeypatch: pytest.MonkeyPatch) -> None:
    # `--gpus 2` on a one-GPU host (seen on the H200): the check named only the count. A stand-in
    # torch.cuda, since CI has no GPU; its device is outside the build's arch list so that no kernel
    # is launched, and both problems must be reported with a remedy each.
    import sys
    from types import ModuleType, SimpleNamespace

    from envbuild.smoke.inside.core import CheckFailed, Context, Result
    from envbuild.smoke.inside.gpu import check_gpu

    torch = ModuleType("torch")
    torch.cuda = SimpleNamespace(  # type: ignore[attr-defined]
        is_available=lambda: True,
        device_count=lambda: 1,
        get_arch_list=lambda: list(CU118),
        get_device_properties=lambda i: SimpleNamespace(major=12, minor=0, name="Blackwell", total_memory=2**35),
    )
    monkeypatch.setitem(sys.modules, "torch", torch)
    ctx = Context(expect={"accelerator": "cuda", "cuda": "11.8"}, gpus="2", timeout=10, lock_match="none")
    r = Result("gpu")
    with pytest.raises(CheckFailed) as failed:
        check_gpu(ctx, r)
    assert failed.value.reason.startswith("1 GPU(s) visible, 2 expected; GPU 0 (Blackwell, sm_120): no kernels")
    assert failed.value.remedy.startswith("check CUDA_VISIBLE_DEVICES and --gpus; use a profile whose build covers")
    assert r.facts["devices"] == [{"index": 0, "name": "Blackwell", "capability": "12.0", "memory_gib": 32.0}]
