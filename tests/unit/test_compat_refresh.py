"""The PyPI refresher's parsing, on recorded inputs (the network run is `make compat-refresh`)."""

from __future__ import annotations

from envbuild.compat_refresh import cuda_of, linux_libs, python_tags, refresh


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
    assert libs == {"cuda_runtime": "13.0.96", "cuda_toolkit": "13.0.3.0", "cudnn": "9.24.0.43", "nccl": "2.30.7"}
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
    data = {
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
