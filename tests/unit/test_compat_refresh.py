"""The PyPI refresher's parsing, on recorded inputs (the network run is `make compat-refresh`)."""

from __future__ import annotations

from typing import Any

import yaml

from envbuild.compat_refresh import cuda_of, linux_libs, python_tags, refresh

from ..conftest import REPO


def test_linux_libs_and_cuda_from_a_resolution() -> None:
    resolved = {
        "torch": "2.14.1",
        "nvidia-cuda-runtime": "13.0.96",
        "cuda-toolkit": "13.0.3.0",
        "nvidia-cudnn-cu13": "9.24.0.43",
        "nvidia-nccl-cu13": "2.30.7",
        "numpy": "2.3.5",
    }
    libs = linux_libs(resolved)
    # cuda-toolkit pins the CUDA release; the runtime package's patch floats under it
    assert libs == {"cuda_toolkit": "13.0.3.0", "cudnn": "9.24.0.43", "nccl": "2.30.7"}
    assert cuda_of(libs) == "13.0"
    assert cuda_of(linux_libs({"nvidia-cuda-runtime-cu12": "12.1.105"})) == "12.1"
    assert cuda_of({}) is None


def test_python_tags_from_wheel_names() -> None:
    names = [
        "torch-2.5.1-cp312-cp312-manylinux1_x86_64.whl",
        "torch-2.5.1-cp313-cp313-manylinux1_x86_64.whl",
        "torch-2.5.1-cp39-cp39-win_amd64.whl",
        "torch-2.5.1-cp313-cp313t-manylinux_2_28_x86_64.whl",
    ]
    assert python_tags(names) == ["3.12", "3.13"]


def test_refresh_reports_and_applies_drift() -> None:
    data: dict[str, Any] = {
        "torch": [
            {
                "release": "2.5",
                "python": ["3.9", "3.12"],
                "python_pypi_extra": [],
                "pypi_cuda": "12.1",
                "pypi_libs": {"nccl": "2.21.5"},
            }
        ]
    }
    index = {
        "releases": {
            "2.5.0": [{"filename": "x"}],
            "2.5.1": [
                {"filename": "torch-2.5.1-cp312-cp312-manylinux1_x86_64.whl"},
                {"filename": "torch-2.5.1-cp313-cp313-manylinux1_x86_64.whl"},
            ],
        }
    }
    changes = refresh(
        data,
        fetch=lambda _url: index,
        resolve=lambda v, py: {"torch": v, "nvidia-cuda-runtime-cu12": "12.4.127", "nvidia-nccl-cu12": "2.21.5"},
    )
    assert "2.5: pypi_cuda 12.1 -> 12.4" in changes
    assert "2.5: python_pypi_extra [] -> ['3.13']" in changes
    row = data["torch"][0]
    assert row["pypi_cuda"] == "12.4" and row["pypi_libs"]["cuda_runtime"] == "12.4.127"


def test_refresh_replaces_a_guess_and_dates_the_source() -> None:
    # torch 2.15.0 as PyPI had it on 2026-11-30: cuda-toolkit 13.2.2, not the 13.0 carried over from 2.14
    data: dict[str, Any] = {
        "sources": {"PYPI": "metadata of the Linux x86_64 wheels on PyPI, read 2026-11-29"},
        "torch": [
            {
                "release": "2.15",
                "python": ["3.11", "3.15"],
                "python_pypi_extra": [],
                "pypi_cuda": "13.0",
                "pypi_libs": {"cuda_runtime": "13.0.2"},
                "sources": {"pypi": "GUESS", "cuda_builds": "GUESS (as 2.14)"},
            }
        ],
    }
    index = {"releases": {"2.15.0": [{"filename": "torch-2.15.0-cp312-cp312-manylinux_2_28_x86_64.whl"}]}}
    resolved = {
        "torch": "2.15.0",
        "cuda-toolkit": "13.2.2",
        "nvidia-cuda-runtime": "13.2.86",
        "nvidia-cudnn-cu13": "9.26.0.51",
        "nvidia-nccl-cu13": "2.30.7",
    }
    changes = refresh(data, fetch=lambda _url: index, resolve=lambda v, py: resolved, today="2026-11-30")
    row = data["torch"][0]
    assert row["pypi_cuda"] == "13.2"
    assert row["pypi_libs"] == {"cuda_toolkit": "13.2.2", "cudnn": "9.26.0.51", "nccl": "2.30.7"}
    assert row["sources"] == {"pypi": "PYPI", "cuda_builds": "GUESS (as 2.14)"}  # only what was read
    assert "2.15: pypi source GUESS -> PYPI (torch 2.15.0)" in changes
    assert data["sources"]["PYPI"].endswith("read 2026-11-30")
    # a second run finds nothing to change: no churn from the floating runtime patch
    assert refresh(data, fetch=lambda _url: index, resolve=lambda v, py: resolved, today="2026-12-01") == []


def test_the_weekly_drift_workflow_runs_the_refresher_check() -> None:
    workflow = yaml.safe_load((REPO / ".github" / "workflows" / "compat-drift.yml").read_text())
    assert workflow[True]["schedule"]  # PyYAML reads the key `on` as True
    runs = [step["run"] for step in workflow["jobs"]["drift"]["steps"] if "run" in step]
    assert "python scripts/refresh_compat.py --check" in runs
    assert "--check" in (REPO / "scripts" / "refresh_compat.py").read_text()
