"""The compat data against tables envbuild's authors did not write (issue 23); each test cites its source."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from envbuild import compat, torchsource, validate
from envbuild.profile import Profile
from tests.conftest import VALID, Result


def _errors(path: Path) -> list[str]:
    return [d.render() for d in validate.check(path).errors]


def _warnings(path: Path) -> list[str]:
    return [d.render() for d in validate.check(path).warnings]


def _rocm714(write_profile: Callable[..., Path], rocm: str) -> Path:
    return write_profile(
        "rocm714-py312",
        name="rocm714-py312",
        accelerator="rocm",
        cuda=None,
        rocm=rocm,
        python="3.12",
        torch="2.14.0",
        numpy="2.2.6",
        torchvision=None,
        torchaudio=None,
    )


def test_rocm_7_14_is_a_real_build_of_torch_2_14(write_profile: Callable[..., Path]) -> None:
    # pytorch/test-infra release/2.14: ROCM_ARCHES_DICT ["7.2", "7.14"] ("Move ROCm 7.1,7.2->7.2,7.14",
    # #8451 and #8498 name rocm7.14 wheels); RELEASE.md's 2.14 row lists it too.
    assert _errors(_rocm714(write_profile, "7.14")) == []
    assert "7.14" in compat.load().release("2.14.0").rocm_builds  # type: ignore[union-attr]


def test_a_rocm714_profile_with_another_rocm_is_told_the_build_its_name_means(
    write_profile: Callable[..., Path],
) -> None:
    # the name reads as 7.1.4 or 7.14; only 7.14 is a build (torch 2.14), so the fix must not send
    # the user to a ROCm release no torch was built for
    named = [e for e in _errors(_rocm714(write_profile, "7.2")) if "disagrees with the name" in e]
    assert len(named) == 1 and 'set rocm: "7.14" or rename the profile' in named[0], named
    assert compat.load().rocm_named("6.2.4") == "6.2.4" and compat.load().rocm_named("9.9") == "9.9"


def test_auto_companions_of_torch_2_0_are_releases_that_exist() -> None:
    # PyPI: torchvision 0.15.0 and torchaudio 2.0.0 were never published; pytorch.org's previous-versions
    # page pairs torch 2.0.0 with torchvision 0.15.1 / torchaudio 2.0.1, and 2.0.1 with 0.15.2 / 2.0.2.
    row = compat.load().release("2.0.0")
    assert row is not None
    assert (compat.torchvision_for(row, "2.0.0"), compat.torchaudio_for(row, "2.0.0")) == ("0.15.1", "2.0.1")
    assert (compat.torchvision_for(row, "2.0.1"), compat.torchaudio_for(row, "2.0.1")) == ("0.15.2", "2.0.2")


def test_torchaudios_frozen_line_held_in_an_image_is_its_newest_recorded_patch() -> None:
    # PyPI: torchaudio 2.11.1 was uploaded with torch 2.15.0 (2026-10-28, the 2.15 row's pairing) and
    # requires torch>=2.11; `auto` locks `2.11.*`, but an image's constraint needs one release for
    # torch's build label (`==2.11.*+cpu` is no PEP 440 specifier).
    db = compat.load()
    assert db.one_release("2.11.*") == "2.11.1"
    assert db.one_release("0.28.0") == "0.28.0" and db.one_release("9.9.*") == "9.9.0"


def test_a_companion_pin_that_cannot_resolve_is_refused(write_profile: Callable[..., Path]) -> None:
    # torchvision 0.18.0 requires torch==2.3.0 exactly (its wheel metadata on PyPI): with 2.3.1 it cannot resolve
    path = write_profile(torchvision="0.18.0")
    assert any(
        "torchvision 0.18.0 does not pair with torch 2.3.1: that is torchvision 0.18.1" in e for e in _errors(path)
    )
    assert _errors(write_profile(torchvision="0.18.1")) == []


def test_python_3_15_is_a_preview_for_torch_2_13_and_2_14_not_an_error(write_profile: Callable[..., Path]) -> None:
    # RELEASE.md marks Python 3.15 (and 3.15t) experimental for 2.13 and 2.14; test-infra builds preview wheels.
    path = write_profile(
        "cpu-py315",
        name="cpu-py315",
        accelerator="cpu",
        cuda=None,
        python="3.15",
        torch="2.14.0",
        numpy="2.2.6",
        torchvision=None,
        torchaudio=None,
        base="debian:trixie",
    )
    errors = [e for e in _errors(path) if "numpy" not in e]
    assert not any("python" in e for e in errors), errors
    assert any("Python 3.15 is a preview for torch 2.14" in w for w in _warnings(path))


def test_a_preview_python_locks_from_the_pytorch_index_as_pypi_has_no_wheel_for_it(
    write_profile: Callable[..., Path],
) -> None:
    # PyPI's torch 2.14.1 wheels are cp310-cp314 (uv: "we only found wheels for torch (v2.14.1) with
    # the following Python ABI tags: cp310 ... cp314t"); the CUDA 13.0 build is PyPI's default, so a
    # 3.15 profile was routed there and its lock could only fail.
    data = {**VALID, "name": "cu130-py315", "cuda": "13.0", "python": "3.15", "torch": "2.14.1"}
    data.update(numpy="2.2.6", torchvision=None, torchaudio=None, base="debian:trixie")
    preview = Profile.model_validate({k: v for k, v in data.items() if v is not None})
    assert torchsource.torch_route(preview) == ("index", "https://download.pytorch.org/whl/cu130")
    supported = preview.model_copy(update={"name": "cu130-py314", "python": "3.14"})
    assert torchsource.torch_route(supported) == ("pypi", "https://pypi.org/simple")
    path = write_profile("cu130-py315", **data)
    warning = next(w for w in _warnings(path) if "Python 3.15 is a preview for torch 2.14" in w)
    assert "only the PyTorch index has them" in warning
    # 2.5's Python 3.13 wheel is on PyPI (cp313), outside the range upstream supports
    assert compat.load().release("2.5.1").on_pypi("3.13")  # type: ignore[union-attr]


def test_cuda_12_9_for_torch_2_11_is_recorded_as_disputed(write_profile: Callable[..., Path]) -> None:
    # Cog's matrix lists 2.11.0+cu129 wheels; RELEASE.md and test-infra release/2.11 (2121ac63) do not.
    path = write_profile(
        "cu129-py312",
        name="cu129-py312",
        cuda="12.9",
        python="3.12",
        torch="2.11.0",
        numpy="2.2.6",
        torchvision=None,
        torchaudio=None,
    )
    assert not any("cuda" in e for e in _errors(path))
    warning = next(w for w in _warnings(path) if "CUDA 12.9" in w)
    assert "the sources disagree" in warning and "confidence low" in warning


def test_ptx_follows_the_measured_wheels() -> None:
    db = compat.load()
    # Cog's gpu_compatibility table: the 2.7 + CUDA 12.8 wheels carry compute_120 PTX
    row = db.arches_for("12.8", "2.7.1")
    assert row is not None and row.ptx == "120"
    # the real torch 2.11.0+cu130 wheel on an H200 reported no compute_120 (docs/GPU-SMOKE.md)
    measured = db.arches_for("13.0", "2.11.0")
    assert measured is not None and measured.ptx is None and db.sources[measured.source].startswith("measured")
    assert db.arches_for("13.0", "2.12.0").ptx == "120"  # type: ignore[union-attr]


def test_an_aarch64_cpu_profile_locks_from_pypi() -> None:
    # PyPI's Linux aarch64 torch wheels are CPU builds (no nvidia-* dependencies; 2.9.1's is 723 MB)
    data = {**VALID, "name": "cpu-py312-arm", "accelerator": "cpu", "cuda": None, "python": "3.12"}
    data.update(torch="2.9.1", numpy="2.2.6", torchvision=None, torchaudio=None)
    arm = Profile.model_validate({k: v for k, v in {**data, "platforms": ["aarch64"]}.items() if v is not None})
    assert torchsource.torch_route(arm) == ("pypi", "https://pypi.org/simple")
    both = Profile.model_validate({k: v for k, v in {**data, "platforms": ["x86_64", "aarch64"]}.items() if v})
    assert torchsource.torch_route(both) == ("index", "https://download.pytorch.org/whl/cpu")
    assert compat.load().pypi_platform_builds.aarch64 == "cpu"


def test_compat_sources_says_where_each_value_came_from(cli: Callable[..., Result]) -> None:
    res = cli("compat", "torch==2.11.0", "--sources", "--json")
    assert res.code == 0, res.err
    report = json.loads(res.out)
    values = {(v["field"], v["source"]) for v in report["values"]}
    assert ("arches cu130", "H200") in values and "measured" in report["sources"]["H200"]
    disputed = next(v for v in report["values"] if v["field"] == "cuda 12.9 (disputed)")
    assert disputed["confidence"] == "low"
