"""A conda channel on disk for tests: real package archives with just an index.json each, indexed by
py-rattler, so that a real solve runs with no network (conda-forge cannot be reached here)."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path


def _package(channel: Path, subdir: str, name: str, version: str, build: str, depends: list[str]) -> None:
    info = {
        "name": name,
        "version": version,
        "build": build,
        "build_number": 0,
        "depends": depends,
        "subdir": subdir,
        "timestamp": 1_700_000_000_000,
        "license": "MIT",
    }
    if subdir == "noarch":
        info["noarch"] = "generic"
    (channel / subdir).mkdir(parents=True, exist_ok=True)
    with tarfile.open(channel / subdir / f"{name}-{version}-{build}.tar.bz2", "w:bz2") as tar:
        blob = json.dumps(info).encode()
        member = tarfile.TarInfo("info/index.json")
        member.size = len(blob)
        tar.addfile(member, io.BytesIO(blob))


def make_channel(chan: Path) -> Path:
    """python 3.11, numpy 2.1.3 and 2.2.0, a CPU and a CUDA pytorch 2.5.1 (and torchvision for
    each), pip, pillow and matplotlib-base."""
    import asyncio

    from rattler.index import index_fs

    _package(chan, "linux-64", "python", "3.11.9", "h_0", [])
    _package(chan, "linux-64", "numpy", "2.1.3", "py311_0", ["python >=3.11,<3.12"])
    _package(chan, "linux-64", "numpy", "2.2.0", "py311_0", ["python >=3.11,<3.12"])
    _package(chan, "linux-64", "pytorch", "2.5.1", "cpu_generic_py311_0", ["python >=3.11,<3.12", "numpy >=1.21"])
    _package(chan, "linux-64", "pytorch", "2.5.1", "cuda120_py311_0", ["python >=3.11,<3.12", "__cuda"])
    # conda-forge's torchvision: one build per torch variant, bound to it
    _package(chan, "linux-64", "torchvision", "0.20.1", "cpu_py311_0", ["python >=3.11,<3.12", "pytorch 2.5.1 cpu*"])
    _package(
        chan, "linux-64", "torchvision", "0.20.1", "cuda120_py311_0", ["python >=3.11,<3.12", "pytorch 2.5.1 cuda*"]
    )
    _package(chan, "linux-64", "torchvision", "0.19.1", "cpu_py311_0", ["python >=3.11,<3.12", "pytorch 2.4.1 cpu*"])
    _package(chan, "noarch", "pip", "24.0", "pyh_0", ["python >=3.8"])
    _package(chan, "noarch", "pillow", "11.0.0", "pyh_0", [])
    # conda-forge's matplotlib: the files in matplotlib-base, which PyPI calls matplotlib
    _package(chan, "linux-64", "matplotlib-base", "3.9.2", "py311_0", ["python >=3.11,<3.12", "numpy >=1.23"])
    asyncio.run(index_fs(chan))
    return chan


def conda_project(root: Path, channel: Path, torch: str = "2.5.1", extra: str = "") -> Path:
    """A project with one conda profile, cpu-py311-conda, on `channel`; `extra`: more profile lines."""
    (root / "profiles").mkdir(parents=True)
    (root / "profiles" / "cpu-py311-conda.yaml").write_text(
        f'name: cpu-py311-conda\naccelerator: cpu\nflavor: conda\npython: "3.11"\ntorch: "{torch}"\n'
        f'numpy: "2.1.3"\nchannels: ["{channel.as_uri()}"]\nconda_packages: ["pillow"]\n{extra}'
    )
    return root
