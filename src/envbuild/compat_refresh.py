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

from packaging.specifiers import SpecifierSet
from packaging.utils import InvalidWheelFilename, parse_wheel_filename
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
    """The CPython versions ("3.12") that Linux x86_64 (manylinux) wheels among `filenames` are for,
    oldest first; a free-threaded wheel (cp313t) counts for its version."""
    found: set[int] = set()
    for name in filenames:
        if not name.endswith(".whl"):
            continue
        try:
            tags = parse_wheel_filename(name)[3]
        except InvalidWheelFilename:
            continue
        for tag in tags:
            if tag.interpreter.startswith("cp3") and tag.platform.startswith("manylinux") and "x86_64" in tag.platform:
                found.add(int(tag.interpreter[3:]))
    return [f"3.{minor}" for minor in sorted(found)]


NUMPY_OLDEST = Version("1.21")  # the first for Python 3.7-3.10, which torch 1.13 (the oldest in the data) spans


def numpy_pythons(releases: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """{numpy minor: (oldest, newest Python)} from numpy's PyPI index: the minor's Linux x86_64
    wheels (a later patch adds wheels for a new Python, as 2.5.2 did for 3.15), less the Pythons
    the newest patch's Requires-Python excludes."""
    minors: dict[str, list[tuple[Version, list[dict[str, Any]]]]] = {}
    for v, files in releases.items():
        try:
            parsed = Version(v)
        except InvalidVersion:
            continue
        if files and not parsed.is_prerelease and parsed >= NUMPY_OLDEST:
            minors.setdefault(f"{parsed.major}.{parsed.minor}", []).append((parsed, files))
    out: dict[str, tuple[str, str]] = {}
    for minor, patches in minors.items():
        newest = max(patches, key=lambda p: p[0])[1]
        allowed = SpecifierSet(next((f.get("requires_python") or "" for f in newest), ""))
        pythons = [
            p for p in python_tags([f["filename"] for _, files in patches for f in files]) if f"{p}.0" in allowed
        ]
        if pythons:
            out[minor] = (pythons[0], pythons[-1])
    return out


def refresh_numpy(rules: dict[str, Any], index: dict[str, Any]) -> list[str]:
    """Update numpy's Python ranges in place from its PyPI index (a new minor gets a row): without
    a row, `validate` cannot tell that numpy 2.5 needs Python 3.12 and leaves it to the lock."""
    changes: list[str] = []
    rows = {r["numpy"]: r for r in rules["python_ranges"]}
    for minor, (lo, hi) in sorted(numpy_pythons(index["releases"]).items(), key=lambda kv: Version(kv[0])):
        row = rows.get(minor)
        if row is None:
            rules["python_ranges"].append({"numpy": minor, "python": [lo, hi]})
            changes.append(f"numpy {minor}: python (new) -> {lo}-{hi}")
        elif list(row["python"]) != [lo, hi]:
            changes.append(f"numpy {minor}: python {'-'.join(row['python'])} -> {lo}-{hi}")
            row["python"] = [lo, hi]
    rules["python_ranges"].sort(key=lambda r: Version(r["numpy"]))  # a new row, older or newer, in its place
    if changes and "PyPI" not in rules.get("python_ranges_source", ""):
        rules["python_ranges_source"] += "; every row checked against numpy's wheels and Requires-Python on PyPI"
    return changes


def fetch_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=60) as resp:  # noqa: S310 - fixed https URL
        return json.load(resp)


def refresh(
    data: dict[str, Any], fetch: Any = fetch_json, resolve: Any = resolve_with_uv, today: str | None = None
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
        patches = [v for v in _published(releases) if f"{v.major}.{v.minor}" == minor]
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
    if "numpy" in data:
        changes += refresh_numpy(data["numpy"], fetch(PYPI_JSON.format(name="numpy")))
    if changes and "PYPI" in data.get("sources", {}):
        day = today or date.today().isoformat()
        data["sources"]["PYPI"] = re.sub(r"read \d{4}-\d\d-\d\d", f"read {day}", data["sources"]["PYPI"])
    return changes


# ---- the PyTorch wheel index and test-infra's build matrix --------------------------------------
# Read where reachable (download.pytorch.org and GitHub are not, from envbuild's own CI machines):
# `scripts/refresh_compat.py --check --index-root URL --test-infra FILE` reports each disagreement.

_WHEEL = re.compile(
    r"torch-(?P<version>\d+\.\d+\.\d+)(?:%2B|\+)(?P<build>[a-z0-9.]+)-cp3(?P<py>\d+)t?-[^\"'<>\s]*linux_x86_64\.whl"
)


def index_listing(html: str) -> dict[str, dict[str, set[str]]]:
    """A PyTorch index page (.../whl/<build>/torch/): {minor release: {build tag: {pythons}}}.
    Only Linux x86_64 CPython wheels count; pre-releases are left out."""
    found: dict[str, dict[str, set[str]]] = {}
    for m in _WHEEL.finditer(html):
        major, minor, _ = m.group("version").split(".")
        found.setdefault(f"{major}.{minor}", {}).setdefault(m.group("build"), set()).add(f"3.{m.group('py')}")
    return found


def _literals(source: str) -> dict[str, Any]:
    import ast

    out: dict[str, Any] = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                out[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                continue  # not a literal: computed at run time, nothing to read here
    return out


def _release_list(value: Any) -> list[str]:
    if isinstance(value, dict):
        value = value.get("release", [])
    return [str(v) for v in value] if isinstance(value, list) else []


def build_matrix(source: str) -> dict[str, list[str]]:
    """pytorch/test-infra's generate_binary_build_matrix.py at a release's commit: its CUDA, ROCm and
    Python lists for the release channel (the names moved over the years; each is tried)."""
    lit = _literals(source)
    cuda: Any = next((lit[k] for k in ("CUDA_ARCHES_DICT", "CUDA_ACRHES_DICT", "CUDA_ARCHES") if k in lit), [])
    rocm: Any = next((lit[k] for k in ("ROCM_ARCHES_DICT", "ROCM_ARCHES") if k in lit), [])
    python: Any = next((lit[k] for k in ("PYTHON_ARCHES_DICT", "FULL_PYTHON_VERSIONS") if k in lit), [])
    return {"cuda": _release_list(cuda), "rocm": _release_list(rocm), "python": _release_list(python)}


def _python_span(row: dict[str, Any]) -> list[str]:
    lo, hi = (Version(x) for x in row["python"])
    return [f"3.{m}" for m in range(lo.minor, hi.minor + 1)]


def disagreements(
    data: dict[str, Any],
    *,
    index: dict[str, dict[str, dict[str, set[str]]]] | None = None,
    matrices: dict[str, dict[str, list[str]]] | None = None,
) -> list[tuple[str, str, str, str]]:
    """(field, ours, theirs, source) for each value the external tables say otherwise.

    `index`: {build tag: index_listing(page)} per PyTorch index page read; `matrices`: {minor release:
    build_matrix(file at that release's commit)}."""
    out: list[tuple[str, str, str, str]] = []
    rows = {r["release"]: r for r in data["torch"]}
    for build, listing in sorted((index or {}).items()):
        for minor, row in sorted(rows.items()):
            builds = {f"cu{c.replace('.', '')}" for c in row["cuda_builds"]} | {f"rocm{r}" for r in row["rocm_builds"]}
            ours = build in builds or build == "cpu"
            theirs = build in listing.get(minor, {})
            if build != "cpu" and ours != theirs:
                out.append(
                    (f"{minor} builds: {build}", "yes" if ours else "no", "yes" if theirs else "no", f"index {build}")
                )
            pythons = sorted(listing.get(minor, {}).get(build, set()), key=lambda p: int(p.split(".")[1]))
            extra = [p for p in pythons if p not in _python_span(row) and p not in row.get("python_preview", [])]
            if extra:
                out.append((f"{minor} python", "-".join(row["python"]), ", ".join(pythons), f"index {build}"))
    for minor, matrix in sorted((matrices or {}).items()):
        row = rows.get(minor)
        if row is None:
            continue
        for field, listed in (("cuda_builds", matrix["cuda"]), ("rocm_builds", matrix["rocm"])):
            if listed and sorted(listed) != sorted(row[field]):
                out.append(
                    (f"{minor} {field}", ", ".join(row[field]), ", ".join(listed), f"test-infra release/{minor}")
                )
        span = _python_span(row) + list(row.get("python_preview", []))
        if matrix["python"] and sorted(matrix["python"]) != sorted(set(span)):
            out.append((f"{minor} python", ", ".join(span), ", ".join(matrix["python"]), f"test-infra release/{minor}"))
    return out


def _published(releases: dict[str, Any]) -> set[Version]:
    """The final releases that have files, from a PyPI JSON index's `releases`."""
    out: set[Version] = set()
    for v, files in releases.items():
        try:
            parsed = Version(v)
        except InvalidVersion:
            continue
        if files and not parsed.is_prerelease:
            out.add(parsed)
    return out


def companion_gaps(data: dict[str, Any], indexes: dict[str, dict[str, Any]]) -> list[tuple[str, str, str, str]]:
    """(field, ours, theirs, source) for each torch release on PyPI whose `auto` torchvision or
    torchaudio is not a release there, or is older than the one an earlier patch of that minor
    pairs with: torch 2.15.1 would get 0.29.1 by the patch-number rule, older than 2.15.0's 0.29.2,
    until the data records its pair. `indexes`: PyPI's JSON index of torch, torchvision, torchaudio."""
    from envbuild.compat import TorchRelease, companions

    rows = {r["release"]: TorchRelease.model_validate(r) for r in data["torch"]}
    out: list[tuple[str, str, str, str]] = []
    torches = sorted(_published(indexes["torch"]["releases"]))
    for name in ("torchvision", "torchaudio"):
        published = _published(indexes[name]["releases"])
        floor: dict[str, tuple[Version, Version]] = {}  # minor: (its newest companion so far, that torch)
        for torch in torches:
            row = rows.get(f"{torch.major}.{torch.minor}")
            if row is None:
                continue
            want = companions(row, str(torch))[name]
            spec = SpecifierSet(f"=={want}")
            found = sorted(v for v in published if v in spec)
            if not found:
                out.append((f"{torch} {name}", want, "not on PyPI", "PYPI"))
                continue
            chosen = found[-1]
            before = floor.get(row.release)
            if before is not None and chosen < before[0]:
                out.append((f"{torch} {name}", want, f"older than {before[0]}, torch {before[1]}'s", "PYPI"))
            elif before is None or chosen > before[0]:
                floor[row.release] = (chosen, torch)
    return out
