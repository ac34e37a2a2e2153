"""Compatibility rules: every problem in a profile, at once, each with its fix."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from packaging.version import Version

from envbuild import compat, packagerules, profile
from envbuild.errors import ProfileError
from envbuild.names import SMOKE_MIN_PYTHON
from envbuild.profile import name_parts
from envbuild.profilefile import Loaded
from envbuild.project import Project, text_problem
from envbuild.yamlsrc import MAX_NODES


def _ver(text: str) -> Version:
    return Version(text)


def _range_hint(releases: list[str], current: str) -> str:
    """'torch >= 2.1' / 'torch <= 2.0' / 'torch 2.4-2.5' for the releases that would fit."""
    if not releases:
        return ""
    vs = sorted(releases, key=_ver)
    cur = _ver(current)
    lo, hi = vs[0], vs[-1]
    if _ver(lo) > cur:
        return f"torch >= {lo}" if hi == compat.load().newest().release else f"torch {lo}-{hi}"
    return f"torch {lo}" if lo == hi else f"torch {lo}-{hi}"


def _closest(options: list[str], wanted: str) -> str:
    def distance(opt: str) -> float:
        a, b = _ver(opt), _ver(wanted)
        return abs((a.major * 100 + a.minor) - (b.major * 100 + b.minor)) + (0.5 if a < b else 0)

    return min(options, key=distance)


def _str(data: dict[str, Any], key: str, bad: set[str]) -> str | None:
    value = data.get(key)
    return value if isinstance(value, str) and key not in bad else None


def _check_name(ld: Loaded, data: dict[str, Any], path: Path, bad: set[str]) -> None:
    name = _str(data, "name", bad)
    if name is None:
        return
    if path.stem != name and not path.stem.startswith("_"):
        fix = f"rename the file to {name}.yaml or set name: {path.stem}"
        ld.add("error", "name", f"{name!r} differs from the file name {path.name!r}", fix, name)
    parts = name_parts(name)
    if parts is None:
        return
    accel = _str(data, "accelerator", bad)
    if accel and accel != parts.accelerator:
        ld.add(
            "error",
            "accelerator",
            f"{accel!r} disagrees with the name {name!r} (token {parts.token!r} means {parts.accelerator})",
            f"set accelerator: {parts.accelerator} or rename the profile",
            accel,
        )
    elif accel in {"cuda", "rocm"}:
        version = _str(data, accel, bad)
        # dotless, so rocm714 takes 7.14 as well as 7.1.4; the fix names the one the data has
        if version and parts.version and version.replace(".", "") != parts.version.replace(".", ""):
            meant = compat.load().rocm_named(parts.version) if accel == "rocm" else parts.version
            ld.add(
                "error",
                accel,
                f"{version!r} disagrees with the name {name!r} (token {parts.token!r})",
                f'set {accel}: "{meant}" or rename the profile',
                version,
            )
    py = _str(data, "python", bad)
    if py and py != parts.python:
        msg = f"{py!r} disagrees with the name {name!r} (py{parts.python.replace('.', '')})"
        ld.add("error", "python", msg, f'set python: "{parts.python}" or rename the profile', py)


def _list(data: dict[str, Any], key: str) -> list[Any]:
    value = data.get(key)
    return value if isinstance(value, list) else []


def _check_accelerator_fields(ld: Loaded, data: dict[str, Any], bad: set[str]) -> None:
    accel = _str(data, "accelerator", bad)
    if accel not in {"cuda", "rocm", "cpu"}:
        return
    for key in ("cuda", "rocm"):
        if key == accel and data.get(key) is None:
            example = '"12.1"' if key == "cuda" else '"6.1"'
            ld.add("error", key, f"is required with accelerator: {accel}", f"add {key}: {example}")
        elif key != accel and data.get(key) is not None:
            ld.add(
                "error",
                key,
                f"is given but accelerator is {accel}",
                f"remove `{key}:` or set accelerator: {key}",
                data.get(key),
            )


def _check_torch(ld: Loaded, data: dict[str, Any], bad: set[str]) -> None:
    db = compat.load()
    torch = _str(data, "torch", bad)
    if torch is None or not profile.RELEASE_RE.fullmatch(torch):
        return
    row = db.release(torch)
    known = f"{db.torch[0].release}-{db.newest().release}"
    if row is None:
        if _ver(torch) > _ver(db.newest().release):
            msg = f"torch {torch} is newer than envbuild's compat data ({known}); it goes unchecked"
            ld.add("warning", "torch", msg, "run scripts/refresh_compat.py or upgrade envbuild", torch)
        else:
            msg = f"torch {torch} is not supported (envbuild knows {known})"
            ld.add("error", "torch", msg, f"use torch >= {db.torch[0].release}.0", torch)
        return
    if row.confidence != "verified":
        msg = f"compat data for torch {row.release} is unverified ({row.notes})"
        ld.add("warning", "torch", msg, "check upstream's build matrix before relying on it", torch)
    for rule in (_rule_python, _rule_build, _rule_numpy, _rule_companions):
        rule(ld, data, bad, torch, row)


def _rule_python(ld: Loaded, data: dict[str, Any], bad: set[str], torch: str, row: compat.TorchRelease) -> None:
    py = _str(data, "python", bad)
    if not py or not profile.PYTHON_RE.fullmatch(py):
        return
    if _ver(py) < _ver(SMOKE_MIN_PYTHON):  # torch 1.13 has 3.7 wheels; envbuild's own code cannot run there
        usable = [v for v in row.python_versions() if _ver(v) >= _ver(SMOKE_MIN_PYTHON)]
        msg = f"Python {py} cannot run envbuild's smoke test, which runs in the image: it needs {SMOKE_MIN_PYTHON}+"
        ld.add("error", "python", msg, f'use python "{_closest(usable, py)}"', py)
        return
    if row.python_ok(py):
        return
    lo, hi = row.python
    if py in row.python_preview:
        where = "" if row.on_pypi(py) else ", and only the PyTorch index has them (envbuild locks from there)"
        msg = f"Python {py} is a preview for torch {row.release}: upstream calls its wheels experimental{where}"
        ld.add("warning", "python", msg, f'use python "{hi}" for a supported build', py)
        return
    if py in row.python_pypi_extra:
        msg = f"torch {row.release} supports Python {lo}-{hi}; PyPI has a {py} wheel outside that"
        ld.add("warning", "python", msg, f'use python "{hi}"', py)
        return
    alt = _range_hint(compat.load().releases_for_python(py), torch)
    fix = f'use python "{_closest(row.python_versions(), py)}"' + (f" or {alt}" if alt else "")
    msg = f"torch {torch} has no wheel for Python {py} (it supports {lo}-{hi})"
    ld.add("error", "python", msg, fix, py)


def _rename_too(data: dict[str, Any], old: str, new: str, prefix: str = "cu") -> str:
    """When the name carries the version being changed, the fix says both steps at once (a name that
    says cu124 with cuda "12.1" would be the next error)."""
    name = data.get("name")
    parts = name_parts(name) if isinstance(name, str) else None
    if parts is None or parts.version is None or parts.version.replace(".", "") != old.replace(".", ""):
        return ""
    renamed = name.replace(parts.token, f"{prefix}{new.replace('.', '')}", 1) if isinstance(name, str) else ""
    return f" and rename the profile to {renamed} (its file and `name:`),"


def _rule_build(ld: Loaded, data: dict[str, Any], bad: set[str], torch: str, row: compat.TorchRelease) -> None:
    db = compat.load()
    accel = _str(data, "accelerator", bad)
    if accel == "cuda":
        cuda = _str(data, "cuda", bad)
        if not cuda or not profile.CUDA_RE.fullmatch(cuda):
            return
        if cuda in row.cuda_disputed and cuda not in row.cuda_builds:
            msg = f"torch {torch} with CUDA {cuda}: the sources disagree ({row.cuda_disputed[cuda]})"
            ld.add(
                "warning",
                "cuda",
                msg,
                f'lock it where the PyTorch index is reachable to settle it, or use cuda "{row.pypi_cuda}"',
                cuda,
            )
        elif cuda not in row.cuda_builds:
            alt = _range_hint(db.releases_with_cuda(cuda), torch)
            has = ", ".join(row.cuda_builds)
            closest = _closest(row.cuda_builds, cuda)
            fix = f'use cuda "{closest}"' + _rename_too(data, cuda, closest) + (f" or {alt}" if alt else "")
            ld.add("error", "cuda", f"torch {torch} has no CUDA {cuda} build (it has {has})", fix, cuda)
        elif db.driver_floor(cuda) is None:
            msg = f"no driver floor known for CUDA {cuda}"
            ld.add("warning", "cuda", msg, "the smoke test cannot check the driver", cuda)
    elif accel == "rocm":
        rocm = _str(data, "rocm", bad)
        if rocm and profile.ROCM_RE.fullmatch(rocm) and rocm not in row.rocm_builds:
            alt = _range_hint(db.releases_with_rocm(rocm), torch)
            has = ", ".join(row.rocm_builds)
            newest = row.rocm_builds[-1]
            fix = f'use rocm "{newest}"' + _rename_too(data, rocm, newest, "rocm") + (f" or {alt}" if alt else "")
            ld.add("error", "rocm", f"torch {torch} has no ROCm {rocm} build (it has {has})", fix, rocm)
        if "aarch64" in _list(data, "platforms"):
            ld.add(
                "error",
                "platforms",
                "PyTorch publishes ROCm builds for x86_64 only",
                "remove aarch64",
            )


def _rule_numpy(ld: Loaded, data: dict[str, Any], bad: set[str], torch: str, row: compat.TorchRelease) -> None:
    db = compat.load()
    numpy = _str(data, "numpy", bad)
    if not numpy or not profile.RELEASE_RE.fullmatch(numpy):
        return
    nv = _ver(numpy)
    if nv.major >= 2 and not db.numpy2_allowed(torch):
        msg = f"torch {torch} was compiled against NumPy 1.x and fails with numpy {numpy} (pytorch#107302)"
        fix = f'use numpy "1.26.4" or torch >= {db.numpy.numpy2_min_torch}'
        ld.add("error", "numpy", msg, fix, numpy)
    rng = db.numpy_python(numpy)
    py = _str(data, "python", bad)
    if rng is None:
        msg = f"numpy {nv.major}.{nv.minor} is not in envbuild's data; its Python range is unchecked"
        ld.add("warning", "numpy", msg, "", numpy)
    elif py and profile.PYTHON_RE.fullmatch(py):
        lo, hi = rng.python
        if not _ver(lo) <= _ver(py) <= _ver(hi):
            msg = f"numpy {nv.major}.{nv.minor} supports Python {lo}-{hi}, not {py}"
            fits = db.numpy_series(py, torch)
            fix = "pick a numpy release with wheels for this Python"
            if fits:
                which = f"numpy {fits[0]}-{fits[-1]} fit" if len(fits) > 1 else f"numpy {fits[0]} alone fits"
                fix = f"use a numpy {fits[-1]}.x release ({which} Python {py} and torch {torch})"
            ld.add("error", "numpy", msg, fix, numpy)


def _rule_companions(ld: Loaded, data: dict[str, Any], bad: set[str], torch: str, row: compat.TorchRelease) -> None:
    pairs = (
        ("torchvision", row.torchvision, compat.torchvision_for),
        ("torchaudio", row.torchaudio, compat.torchaudio_for),
    )
    for lib, minor, exact_for in pairs:
        value = _str(data, lib, bad)
        if value is None or value == "auto" or not profile.RELEASE_RE.fullmatch(value):
            continue
        v = _ver(value)
        exact = exact_for(row, torch)
        wanted = exact.replace(".*", ".0")
        if f"{v.major}.{v.minor}" != minor:
            msg = f"{lib} {value} does not match torch {torch} (it pairs with {lib} {minor}.x)"
            ld.add("error", lib, msg, f'use {lib}: "{wanted}" or "auto"', value)
        elif not exact.endswith(".*") and value != exact:
            # each release pins torch exactly (torchvision 0.15.2 requires torch==2.0.1): any other
            # patch cannot resolve, and some (0.15.0) were never published at all
            msg = f"{lib} {value} does not pair with torch {torch}: that is {lib} {exact}"
            ld.add("error", lib, msg, f'use {lib}: "{exact}" or "auto"', value)


def _check_misc(ld: Loaded, data: dict[str, Any], bad: set[str], root: Path) -> None:
    base = _str(data, "base", bad)
    py = _str(data, "python", bad)
    if not base and py and profile.PYTHON_RE.fullmatch(py) and py not in compat.load().bases.python:
        known = ", ".join(sorted(compat.load().bases.python, key=_ver))
        ld.add(
            "error",
            "python",
            f"envbuild has no default base image with Python {py} (it has {known})",
            f"set base: to an image whose OS packages provide python{py}, pinned by digest",
            py,
        )
    if base and "@sha256:" not in base:
        ld.add(
            "warning",
            "base",
            f"{base!r} is not pinned by digest; the tag can move or vanish",
            "append @sha256:<digest> (docker buildx imagetools inspect IMAGE)",
            base,
        )
    values = sum(len(v) for v in data.values() if isinstance(v, (list, dict)))
    if values > MAX_NODES:
        # the per-file limit is checked on read; a chain of `extends` fragments must not add up past it
        ld.add(
            "error",
            "extends",
            f"the merged profile has {values:,} list and table entries, over the {MAX_NODES:,} one file may hold",
            "keep env, packages and apt to what the image needs; the limit holds across `extends` too",
        )
    name, cuda = data.get("name"), data.get("accelerator") == "cuda"
    if data.get("devel") is True and not cuda:  # base_of takes NVIDIA's devel image for CUDA only
        ld.add(
            "warning",
            "devel",
            "is for CUDA profiles (NVIDIA's devel image, with nvcc): this image gets the default base",
            "remove it; compile: true (the default) gives g++, ninja and the Python headers for C++ extensions",
            True,
        )
    if cuda and isinstance(name, str) and name.endswith("-devel") and "devel" not in data:
        ld.add(
            "warning",
            "name",
            "the -devel suffix picks NVIDIA's CUDA devel base image (a shorthand for `devel: true`)",
            "write `devel: true` to say so, or `devel: false` to keep the slim base under this name",
            name,
        )
    if data.get("flavor") == "conda":
        torch = _str(data, "torch", bad)
        channels = _list(data, "channels") or ["conda-forge"]
        if torch and "pytorch" in channels and _ver(torch) >= _ver("2.6"):
            ld.add(
                "error",
                "channels",
                f"the pytorch conda channel stopped after 2.5; torch {torch} is not there",
                "use conda-forge or torch <= 2.5",
                ",".join(map(str, channels)),
            )
    if "checks" not in bad:
        for i, script in enumerate(_list(data, "checks")):
            if not isinstance(script, str):
                continue
            found = (
                text_problem(root / script, script[:80])
                if (root / script).is_file()
                else (
                    f"{script[:80]!r} is not a file of the project",
                    "name a Python script relative to the project folder, e.g. checks/train_tiny.py",
                )
            )
            if found:
                ld.add("error", f"checks[{i}]", found[0], found[1], script)
    if "find_links" in bad:
        return
    for i, link in enumerate(_list(data, "find_links")):
        if isinstance(link, str) and "://" not in link and not re.search(r"\$\{?\w+", link):
            target = Path(link) if Path(link).is_absolute() else root / link
            try:
                exists = target.is_dir()
            except OSError:  # a name too long or otherwise impossible for this filesystem
                exists = False
            if not exists:
                ld.add(
                    "warning",
                    f"find_links[{i}]",
                    f"{link[:80]!r} is not a folder here",
                    "create it or fix the path",
                    link,
                )


def check(path: Path, shown: str | None = None, root: Path | None = None) -> Loaded:
    """Structure (pydantic) plus every compatibility rule. Never raises for bad input. `root`: the
    project folder, which `checks` and `find_links` are relative to (by default the profile
    folder's parent, as in a project whose profiles are in `profiles/`)."""
    ld = profile.load(path, shown)
    if not ld.data and ld.errors:
        return ld
    data, bad = ld.data, ld.bad_fields
    _check_name(ld, data, path, bad)
    _check_accelerator_fields(ld, data, bad)
    _check_torch(ld, data, bad)
    _check_misc(ld, data, bad, root or path.parent.parent)
    packagerules.check(ld, data)
    if ld.errors:
        ld.profile = None
    ld.diagnostics.sort(key=lambda d: (d.severity != "error", d.file, d.line or 0, d.field))
    return ld


def load_valid(path: Path, shown: str | None = None, root: Path | None = None) -> profile.Profile:
    """A profile that must be fully valid (structure and compatibility), else ProfileError."""
    loaded = check(path, shown, root)
    if loaded.errors or loaded.profile is None:
        raise ProfileError(
            f"{loaded.shown} is not valid",
            loaded.diagnostics,
            hint=f"run `envbuild validate {loaded.shown}`",
        )
    prof: profile.Profile = loaded.profile
    return prof


def load_named(project: Project, name: str) -> profile.Profile:
    """The project's profile `name` (or a path to a profile file), fully valid."""
    path = project.profile_path(name)
    return load_valid(path, project.rel(path), project.root)


def load_all(project: Project, names: list[str] | None = None) -> dict[str, profile.Profile | ProfileError]:
    """The project's profiles (or those of `names` that exist), validated; an invalid one as its error."""
    out: dict[str, profile.Profile | ProfileError] = {}
    for name in project.profile_names():
        if names and name not in names:
            continue
        try:
            out[name] = load_named(project, name)
        except ProfileError as exc:
            out[name] = exc
    return out
