"""The PyPI refresher's parsing, on recorded inputs (the network run is `make compat-refresh`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from envbuild.compat_refresh import (
    build_matrix,
    companion_gaps,
    cuda_of,
    disagreements,
    index_listing,
    linux_libs,
    numpy_pythons,
    python_tags,
    refresh,
    refresh_numpy,
)

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


NUMPY_INDEX = {  # numpy's PyPI index as it stood on 2026-12-04, trimmed to what decides a range
    "releases": {
        "2.4.0": [
            {"filename": "numpy-2.4.0-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl"},
            {"filename": "numpy-2.4.0-cp314-cp314t-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl"},
            {"filename": "numpy-2.4.0-cp314-cp314-win_amd64.whl"},
        ],
        "2.5.0": [
            {"filename": "numpy-2.5.0-cp312-cp312-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl"},
            {"filename": "numpy-2.5.0-cp314-cp314-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl"},
            {"filename": "numpy-2.5.0.tar.gz", "requires_python": ">=3.12"},
        ],
        "2.5.2": [
            {"filename": "numpy-2.5.2-cp315-cp315-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl"},
            {"filename": "numpy-2.5.2-cp312-cp312-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl"},
        ],
        "2.6.0rc1": [{"filename": "numpy-2.6.0rc1-cp313-cp313-manylinux_2_28_x86_64.whl"}],
        # older than the oldest the data needs (NUMPY_OLDEST): left out though its wheel and Requires-Python fit
        "1.20.3": [
            {
                "filename": "numpy-1.20.3-cp38-cp38-manylinux_2_12_x86_64.manylinux2010_x86_64.whl",
                "requires_python": ">=3.7",
            }
        ],
    }
}
for _files in NUMPY_INDEX["releases"].values():
    for _f in _files:
        _f.setdefault("requires_python", ">=3.12" if "2.5" in _f["filename"] else ">=3.11")


def test_numpy_python_ranges_come_from_its_wheels_and_requires_python() -> None:
    # a later patch's wheels widen the range (3.15 came with 2.5.2); pre-releases, other
    # platforms and numpy older than every torch in the data are left out
    assert numpy_pythons(NUMPY_INDEX["releases"]) == {"2.4": ("3.11", "3.14"), "2.5": ("3.12", "3.15")}


def test_a_row_for_an_older_numpy_goes_in_its_place_and_validate_then_refuses_a_newer_python(
    tmp_path: Path,
) -> None:
    """numpy 1.21-1.23 had no rows (the data started at 1.24), so a profile pinning numpy 1.21 on
    Python 3.12 passed validate with a warning and failed in the lock (an sdist that cannot build)."""
    index = {
        "releases": {
            **NUMPY_INDEX["releases"],
            "1.21.6": [
                {"filename": "numpy-1.21.6-cp310-cp310-manylinux_2_17_x86_64.whl", "requires_python": ">=3.7,<3.11"},
                {"filename": "numpy-1.21.6-cp37-cp37m-manylinux_2_12_x86_64.whl", "requires_python": ">=3.7,<3.11"},
            ],
        }
    }
    rules: dict[str, Any] = {"python_ranges": [{"numpy": "2.4", "python": ["3.11", "3.14"]}]}
    rules["python_ranges_source"] = ""
    assert refresh_numpy(rules, index) == [
        "numpy 1.21: python (new) -> 3.7-3.10",
        "numpy 2.5: python (new) -> 3.12-3.15",
    ]
    assert [r["numpy"] for r in rules["python_ranges"]] == ["1.21", "2.4", "2.5"]
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "cpu-py312.yaml").write_text(
        'name: cpu-py312\npython: "3.12"\ntorch: "2.9.1"\naccelerator: cpu\nnumpy: "1.21.6"\n'
    )
    from envbuild import validate

    loaded = validate.check(tmp_path / "profiles" / "cpu-py312.yaml")
    assert [(d.field, d.message) for d in loaded.diagnostics if d.severity == "error"] == [
        ("numpy", "numpy 1.21 supports Python 3.7-3.10, not 3.12")
    ]


def test_a_new_numpy_minor_gets_its_row_and_validate_then_refuses_an_older_python(tmp_path: Path) -> None:
    rules: dict[str, Any] = {
        "python_ranges": [{"numpy": "2.4", "python": ["3.11", "3.14"]}],
        "python_ranges_source": "numpy release notes",
    }
    assert refresh_numpy(rules, NUMPY_INDEX) == ["numpy 2.5: python (new) -> 3.12-3.15"]
    assert rules["python_ranges"][-1] == {"numpy": "2.5", "python": ["3.12", "3.15"]}
    assert "PyPI" in rules["python_ranges_source"]
    assert refresh_numpy(rules, NUMPY_INDEX) == []  # nothing churns on a second run
    # the shipped data has the row: numpy 2.5 on Python 3.11 is refused before anything is downloaded
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "cpu-py311-np25.yaml").write_text(
        'name: cpu-py311-np25\npython: "3.11"\ntorch: "2.13.0"\naccelerator: cpu\nnumpy: "2.5.2"\n'
    )
    from envbuild import validate

    loaded = validate.check(tmp_path / "profiles" / "cpu-py311-np25.yaml")
    assert [(d.field, d.message, d.fix) for d in loaded.diagnostics if d.severity == "error"] == [
        (
            "numpy",
            "numpy 2.5 supports Python 3.12-3.15, not 3.11",
            "use a numpy 2.4.x release (numpy 1.23-2.4 fit Python 3.11 and torch 2.13.0)",
        )
    ]


def test_the_weekly_drift_workflow_runs_the_refresher_check() -> None:
    workflow = yaml.safe_load((REPO / ".github" / "workflows" / "compat-drift.yml").read_text())
    assert workflow[True]["schedule"]  # PyYAML reads the key `on` as True
    runs = [step["run"] for step in workflow["jobs"]["drift"]["steps"] if "run" in step]
    assert "python scripts/refresh_compat.py --check" in runs
    assert "--check" in (REPO / "scripts" / "refresh_compat.py").read_text()


DATA = Path(__file__).parent / "data" / "compat"


def _compat() -> dict[str, Any]:
    return dict(json.loads((REPO / "src" / "envbuild" / "data" / "compat.json").read_text()))


def test_a_pytorch_index_page_is_read_into_releases_builds_and_pythons() -> None:
    listing = index_listing((DATA / "whl-cu121-torch.html").read_text())
    assert listing["2.1"] == {"cu121": {"3.10", "3.11"}}  # the Windows wheel does not count
    assert listing["2.3"] == {"cu121": {"3.11", "3.12"}}
    assert set(listing) == {"2.1", "2.3", "2.5", "2.6"}


def test_the_index_reports_a_build_the_data_lacks_and_one_it_claims_wrongly() -> None:
    listing = index_listing((DATA / "whl-cu121-torch.html").read_text())
    table = disagreements(_compat(), index={"cu121": listing})
    # the page has 2.6.0+cu121, which the data does not list for 2.6
    assert ("2.6 builds: cu121", "no", "yes", "index cu121") in table
    # the data says 2.2 has cu121, and this (abridged) page has none: reported, for a person to judge
    assert ("2.2 builds: cu121", "yes", "no", "index cu121") in table
    assert not any(row[0] == "2.3 builds: cu121" for row in table)


def test_test_infra_constants_are_read_under_their_old_and_new_names() -> None:
    old = build_matrix((DATA / "test-infra-release-1.13.txt").read_text())
    assert old == {"cuda": ["11.6", "11.7"], "rocm": ["5.1.1", "5.2"], "python": ["3.7", "3.8", "3.9", "3.10"]}
    new = build_matrix((DATA / "test-infra-release-2.14.txt").read_text())
    assert new["rocm"] == ["7.2", "7.14"] and new["cuda"] == ["12.6", "13.0", "13.2"]


def test_the_data_agrees_with_test_infra_for_2_14_and_a_change_is_reported() -> None:
    matrix = build_matrix((DATA / "test-infra-release-2.14.txt").read_text())
    data = _compat()
    assert disagreements(data, matrices={"2.14": matrix}) == []
    row = next(r for r in data["torch"] if r["release"] == "2.14")
    row["rocm_builds"] = ["7.2"]  # what the data said before issue 23
    assert disagreements(data, matrices={"2.14": matrix}) == [
        ("2.14 rocm_builds", "7.2", "7.2, 7.14", "test-infra release/2.14")
    ]


def test_a_torch_release_whose_auto_companions_pypi_lacks_or_predate_its_minor_is_reported() -> None:
    # The shipped rows, against PyPI as it stood on 2026-12-04, plus two releases that would break
    # them: torch 2.15.1 (the patch-number rule picks torchvision 0.29.1, older than 2.15.0's
    # 0.29.2) and a torch 2.14.1 whose torchvision 0.29.1 was never published.
    data = json.loads((REPO / "src" / "envbuild" / "data" / "compat.json").read_text())
    data["torch"] = [r for r in data["torch"] if r["release"] in ("2.14", "2.15")]

    def index(*versions: str) -> dict[str, Any]:
        return {"releases": {v: [{"filename": f"x-{v}.whl"}] for v in versions}}

    indexes = {
        "torch": index("2.14.0", "2.14.1", "2.15.0", "2.15.1rc1"),
        "torchvision": index("0.29.0", "0.29.1", "0.29.2"),
        "torchaudio": index("2.11.0", "2.11.1"),
    }
    assert companion_gaps(data, indexes) == []  # what PyPI holds today
    indexes["torch"] = index("2.14.0", "2.14.1", "2.15.0", "2.15.1")
    indexes["torchvision"] = index("0.29.0", "0.29.2")
    assert companion_gaps(data, indexes) == [
        ("2.14.1 torchvision", "0.29.1", "not on PyPI", "PYPI"),
        ("2.15.1 torchvision", "0.29.1", "not on PyPI", "PYPI"),
    ]
    indexes["torchvision"] = index("0.29.0", "0.29.1", "0.29.2")
    assert companion_gaps(data, indexes) == [
        ("2.15.1 torchvision", "0.29.1", "older than 0.29.2, torch 2.15.0's", "PYPI")
    ]
