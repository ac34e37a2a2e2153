"""Refresh the PyPI-derived compat columns from PyPI's own metadata.

For each torch minor release in the data, resolve the newest patch for Linux
x86_64 with uv (as a user's lock would), and derive: the CUDA build PyPI's
default wheel carries (from its nvidia CUDA runtime package), the bundled
cuDNN / NCCL / runtime versions; and from PyPI's JSON index, the Python
versions PyPI has wheels for.
"""

from __future__ import annotations

import json
import re
import urllib.request
from datetime import date
from typing import Any

from packaging.version import InvalidVersion, Version

PYPI_JSON = "https://pypi.org/pypi/{name}/json"
_LIBS = {
    "cuda_runtime": re.compile(r"^nvidia-cuda-runtime(-cu\d+)?$"),
    "cudnn": re.compile(r"^nvidia-cudnn(-cu\d+)?$"),
    "nccl": re.compile(r"^nvidia-nccl(-cu\d+)?$"),
    "cuda_toolkit": re.compile(r"^cuda-toolkit$"),
}


def linux_libs(resolved: dict[str, str]) -> dict[str, str]:
    """GPU library versions among a resolved set of {package: version}.

    From torch 2.11 the wheel pins cuda-toolkit, which admits any patch of the runtime package:
    the runtime's resolved version then only says what NVIDIA published last, so it is left out
    (it would make every refresh report drift).
    """
    found: dict[str, str] = {}
    for name, version in resolved.items():
        for key, pattern in _LIBS.items():
            if pattern.fullmatch(name.lower()):
                found[key] = version
    if "cuda_toolkit" in found:
        found.pop("cuda_runtime", None)
    return found


def resolve_with_uv(torch: str, python: str) -> dict[str, str]:
    """What `uv pip compile torch==X` picks on Linux x86_64 from PyPI: {name: version}."""
    from envbuild.uvtool import newest_versions

    return newest_versions([f"torch=={torch}"], python, with_deps=True)


def cuda_of(libs: dict[str, str]) -> str | None:
    version = libs.get("cuda_toolkit") or libs.get("cuda_runtime")
    if not version:
        return None
    v = Version(version)
    return f"{v.major}.{v.minor}"


def python_tags(filenames: list[str]) -> list[str]:
    tags = set()
    for name in filenames:
        m = re.search(r"-cp3(\d+)-cp3\d+t?-(manylinux[^.]*x86_64)\.whl$", name)
        if m:
            tags.add(f"3.{m.group(1)}")
    return sorted(tags, key=lambda t: int(t.split(".")[1]))


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=60) as resp:  # noqa: S310 - fixed https URL
        return json.load(resp)


def refresh(
    data: dict[str, Any], fetch: Any = _get, resolve: Any = resolve_with_uv, today: str | None = None
) -> list[str]:
    """Update `data` in place from PyPI; returns a line per changed value.

    A column this fills in is marked as read from PyPI (a GUESS it replaces stops being one), and
    the PYPI source carries the date of the read.
    """
    index = fetch(PYPI_JSON.format(name="torch"))
    releases: dict[str, Any] = index["releases"]
    changes: list[str] = []
    for row in data["torch"]:
        minor = row["release"]
        patches = []
        for v, files in releases.items():
            try:
                parsed = Version(v)
            except InvalidVersion:
                continue
            if f"{parsed.major}.{parsed.minor}" == minor and not parsed.is_prerelease and files:
                patches.append(parsed)
        if not patches:
            continue
        newest = str(max(patches))
        libs = linux_libs(resolve(newest, row["python"][1]))
        cuda = cuda_of(libs)
        if cuda and cuda != row["pypi_cuda"]:
            changes.append(f"{minor}: pypi_cuda {row['pypi_cuda']} -> {cuda}")
            row["pypi_cuda"] = cuda
        if "cuda_toolkit" in libs and "cuda_runtime" in row["pypi_libs"]:
            changes.append(f"{minor}: cuda_runtime {row['pypi_libs'].pop('cuda_runtime')} -> (pinned by cuda_toolkit)")
        for key, value in libs.items():
            if row["pypi_libs"].get(key) != value:
                changes.append(f"{minor}: {key} {row['pypi_libs'].get(key)} -> {value}")
                row["pypi_libs"][key] = value
        sources = row.setdefault("sources", {})
        if cuda and sources.get("pypi", "PYPI") != "PYPI":
            changes.append(f"{minor}: pypi source {sources['pypi']} -> PYPI (torch {newest})")
            sources["pypi"] = "PYPI"
        pythons = python_tags([f["filename"] for f in releases[newest]])
        lo, hi = Version(row["python"][0]), Version(row["python"][1])
        extra = [p for p in pythons if not lo <= Version(p) <= hi]
        if extra != row.get("python_pypi_extra", []):
            changes.append(f"{minor}: python_pypi_extra {row.get('python_pypi_extra')} -> {extra}")
            row["python_pypi_extra"] = extra
    if changes and "PYPI" in data.get("sources", {}):
        day = today or date.today().isoformat()
        data["sources"]["PYPI"] = re.sub(r"read \d{4}-\d\d-\d\d", f"read {day}", data["sources"]["PYPI"])
    return changes
