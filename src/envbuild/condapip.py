"""A conda profile's `packages:` (pip), resolved with uv around the conda solution.

uv knows nothing of a conda environment. Asked for `timm` alone, it locked PyPI's torch 2.15.0, its
CUDA wheels, numpy and torchvision as pip packages of a conda profile that pins torch 2.5.1 and numpy
2.1.3: the build would install them over the channel's and the smoke test fail gigabytes later.
conda-lock treats what the conda solution installs as already there; so does this: each Python
package of the solution is given to uv as a wheel of its own name and version with no
dependencies (a stand-in, never installed) and as the one version there is, so uv resolves only
what the conda environment lacks, and fails, naming both, where a pip package wants another.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from envbuild import tmpdirs, uvtool
from envbuild.errors import LockError
from envbuild.names import PLATFORM_TAGS

# A conda package that installs a Python distribution PyPI names otherwise (conda-forge's names, and
# the defaults channel's numpy-base). One missing here reads as a distribution the environment lacks:
# a pip package that needs it then gets PyPI's copy over the channel's (seaborn brought PyPI's
# matplotlib beside conda-forge's matplotlib-base). conda-lock reads the same facts from grayskull's
# mapping, a download from GitHub at lock time; these are the ones a torch environment meets.
CONDA_TO_PYPI = {
    "pytorch": "torch",
    "matplotlib-base": "matplotlib",
    "numpy-base": "numpy",
    "pyarrow-core": "pyarrow",
    "msgpack-python": "msgpack",
    "brotli-python": "brotli",
    "python-flatbuffers": "flatbuffers",
    "pytables": "tables",
    "py-xgboost": "xgboost",
    "sentencepiece-python": "sentencepiece",
    "pytorch_geometric": "torch-geometric",
    "pytorch_scatter": "torch-scatter",
    "pytorch_sparse": "torch-sparse",
    "pytorch_cluster": "torch-cluster",
}
# PyPI's builds of these link PyPI's torch (its libraries, its C++ ABI): never beside a channel's.
# torch itself is always the solution's. CUDA wheels (nvidia-*) stay a pip package's to ask for.
BUILT_AGAINST_TORCH = frozenset({"torchvision", "torchaudio"})


def provided(conda_entries: list[dict[str, Any]]) -> dict[str, str]:
    """{PyPI name: version} of the Python distributions a conda solution installs: its packages that
    depend on `python` (Python itself does not), under PyPI's name."""
    out: dict[str, str] = {}
    for entry in conda_entries:
        if "python" not in entry.get("dependencies", {}):
            continue
        try:
            version = str(Version(str(entry["version"])))
        except InvalidVersion:  # no PEP 440 version: pip cannot name it either
            continue
        out[canonicalize_name(CONDA_TO_PYPI.get(entry["name"], entry["name"]))] = version
    return out


def installed(entries: list[dict[str, Any]]) -> dict[str, str]:
    """{PyPI name: version} of every Python distribution one platform's conda-lock entries install:
    its pip packages, and its conda packages that are Python's (`provided`)."""
    out = provided([e for e in entries if e.get("manager") == "conda"])
    out.update({canonicalize_name(str(e["name"])): str(e["version"]) for e in entries if e.get("manager") == "pip"})
    return out


def _stand_in(folder: Path, name: str, version: str) -> Path:
    """A wheel with only the metadata uv reads: `name` `version`, no dependencies."""
    import zipfile  # bz2 and lzma with it: only a conda lock with pip packages pays for them

    info = f"{name.replace('-', '_')}-{version}.dist-info"
    path = folder / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as whl:
        whl.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        whl.writestr(
            f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: envbuild\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        whl.writestr(f"{info}/RECORD", "")
    return path


def _wheel_tags(python: str, platform: str) -> list[Tag]:
    major, minor = (int(x) for x in python.split("."))
    plats = [f"manylinux_2_{n}_{platform}" for n in range(28, 4, -1)] + [
        f"manylinux2014_{platform}",
        f"linux_{platform}",
    ]
    return [
        *cpython_tags((major, minor), platforms=plats),
        *compatible_tags((major, minor), platforms=plats),
    ]


def pick_wheel(wheels: list[dict[str, Any]], python: str, platform: str) -> dict[str, Any] | None:
    """The best wheel of a pylock package for this interpreter and platform."""
    priority = {tag: i for i, tag in enumerate(_wheel_tags(python, platform))}
    best: tuple[int, dict[str, Any]] | None = None
    for wheel in wheels:
        try:
            _, _, _, tags = parse_wheel_filename(wheel["url"].rsplit("/", 1)[-1])
        except (InvalidWheelFilename, KeyError):
            continue
        rank = min((priority[t] for t in tags if t in priority), default=None)
        if rank is not None and (best is None or rank < best[0]):
            best = (rank, wheel)
    return best[1] if best else None


def entries(
    pip_specs: list[str],
    python: str,
    platform: str,
    subdir: str,
    source: tuple[str, tuple[str, ...]],
    conda: dict[str, str],
) -> list[dict[str, Any]]:
    """conda-lock's pip entries for `pip_specs` beside the conda solution's Python distributions
    (`conda`, from `provided`): what the environment lacks, each with its wheel for this platform.
    `source`: (index URL, find-links)."""
    if not pip_specs:
        return []
    from envbuild._compat import tomllib

    index_url, find_links = source
    with tmpdirs.private("conda-pip") as tmp:
        work = Path(tmp)
        (work / "stand-ins").mkdir()
        (work / "requirements.in").write_text("\n".join(pip_specs) + "\n", "utf-8")
        (work / "conda.txt").write_text(
            "".join(f"{n} @ {_stand_in(work / 'stand-ins', n, v).as_uri()}\n" for n, v in sorted(conda.items())),
            "utf-8",
        )
        args = ["pip", "compile", "requirements.in", "-o", "pylock.toml", "--format", "pylock.toml"]
        # constraints (not overrides, which would drop a pip package's own bound on numpy unseen):
        # the channel's version is the only one there is, and a conflict is uv's error
        args += ["-c", "conda.txt", "--python-version", python, "--python-platform", PLATFORM_TAGS[platform]]
        args += ["--no-header", "--no-config", "--no-python-downloads", *uvtool.interpreter(python), "--quiet"]
        args += ["--index-url", index_url]
        for link in find_links:
            args += ["--find-links", link]
        uvtool.run(args, error=LockError, cwd=work)
        data = tomllib.loads((work / "pylock.toml").read_text("utf-8"))
    out = []
    for pkg in data.get("packages", []):
        if canonicalize_name(pkg["name"]) in conda:
            continue  # the channel's: installed by the conda solution
        if canonicalize_name(pkg["name"]) in BUILT_AGAINST_TORCH:
            raise LockError(
                f"packages: they pull in {pkg['name']} {pkg['version']} from PyPI, which is built for PyPI's torch "
                "and fails on import beside the conda channel's",
                hint=f"add `{pkg['name']}: auto` to the profile: the channel's build, which they then use",
            )
        wheel = pick_wheel(pkg.get("wheels", []), python, platform)
        if wheel is None:
            raise LockError(
                f"pip package {pkg['name']} {pkg['version']} has no wheel for Python {python} on {platform}"
            )
        out.append(
            {
                "name": pkg["name"],
                "version": pkg["version"],
                "manager": "pip",
                "platform": subdir,
                "dependencies": {},
                "url": wheel["url"],
                "hash": {"sha256": wheel["hashes"]["sha256"]},
                "category": "main",
                "optional": False,
            }
        )
    return out
