"""validate's rules about what a profile installs: `packages`, `build_requires`, the fields that
only one flavor reads (a field the other flavor would drop without a word), and the `env` settings
the image's own environment depends on."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import InvalidWheelFilename, parse_wheel_filename

from envbuild.names import ACCELERATOR_SHOWN, canonical
from envbuild.profilefile import OWN_BUILD, Loaded


def check(ld: Loaded, data: dict[str, Any]) -> None:
    _listed_twice(ld, data)
    _apt_twice(ld, data)
    _accelerator_libraries(ld, data)
    _env_of_the_image(ld, data)
    if data.get("flavor") == "conda":
        _conda_only(ld, data)
    elif data.get("conda_packages"):
        ld.add(
            "error",
            "conda_packages",
            "is for conda profiles: a venv profile installs no conda package, so these would be left out",
            "an OS package goes in apt:, a Python one in packages:; or use flavor: conda",
            ", ".join(map(str, data["conda_packages"])) if isinstance(data["conda_packages"], list) else None,
        )
    elif "channels" in data:
        ld.add("warning", "channels", "is for conda profiles: a venv profile never asks them", "remove it")


_HELD = (
    "it holds the tested torch build and numpy in images built FROM this one",
    "remove it from env; change the profile to change what it holds, or, in an image built FROM this one, "
    "clear it for one install (PIP_CONSTRAINT= pip install ...)",
)
_NAMES_ENV = ("it names the environment for pip and uv", "remove it from env")
# (why, fix) for what the Dockerfiles set for the environment to work, which a value under `env:`
# (set last, as written: `$PATH` is not expanded) replaced: PATH="/opt/tools/bin:$PATH" left no `python`
IMAGE_ENV = {
    "PATH": (
        "the environment's bin folder comes first on it; a value here replaces it (`$PATH` is not "
        "expanded) and `python` is no longer the environment's",
        "remove it from env; add tools in an image built FROM this one (ENV PATH=/opt/tools/bin:$PATH)",
    ),
    "VIRTUAL_ENV": _NAMES_ENV,
    "CONDA_PREFIX": _NAMES_ENV,
    "PYTHONHOME": ("Python would look for its standard library there and not start", "remove it from env"),
    "PIP_CONSTRAINT": _HELD,
    "UV_CONSTRAINT": _HELD,
    "ENVBUILD_TORCH_INDEX": (
        "pip in the image names it when an install of torchvision or torchaudio fails",
        "remove it from env (torch_index: sets where the torch family comes from)",
    ),
}


_VARIABLE = re.compile(r"\$(?:\{[A-Za-z_][A-Za-z0-9_]*\}|[A-Za-z_][A-Za-z0-9_]*)")


def _env_of_the_image(ld: Loaded, data: dict[str, Any]) -> None:
    env = data.get("env")
    if not isinstance(env, dict):
        return  # the model's own check says what is wrong with it
    # YAML may give other keys and values than strings (the model refuses them)
    for key, value in sorted((str(k), str(v)) for k, v in env.items()):
        if key in IMAGE_ENV:
            why, fix = IMAGE_ENV[key]
            ld.add("error", "env", f"{key} is the image's own setting: {why}", fix, key)
            continue
        found = _VARIABLE.search(value)
        if found is not None:  # Docker's ENV would expand it; envbuild writes values as they are
            ld.add(
                "warning",
                "env",
                f"{key}: {found.group(0)} is not expanded: the image's {key} is {value!r}, as written",
                "write the value out in full",
                key,
            )


def _conda_only(ld: Loaded, data: dict[str, Any]) -> None:
    if data.get("build_requires"):
        ld.add(
            "error",
            "build_requires",
            "is for venv profiles: a conda environment's packages come built from conda-forge",
            "remove it, or use flavor: venv",
        )
    if data.get("accelerator") == "rocm":  # conda_specs would ask for a CPU torch, without a word
        ld.add(
            "error",
            "flavor",
            "conda channels have no ROCm build of torch (conda-forge's pytorch is CPU or CUDA)",
            "use flavor: venv, which installs the PyTorch index's ROCm wheels",
            "conda",
        )
    if data.get("torch_index"):
        ld.add(
            "warning",
            "torch_index",
            "a conda profile's torch comes from its channels: this index is never asked",
            "remove it; for a mirror, set channels: to the mirror's URL",
            str(data["torch_index"]),
        )


def _requirements(data: dict[str, Any]) -> Iterator[tuple[int, Requirement, str]]:
    """`packages` as requirements, with their index and text; the model says what is wrong with the rest."""
    listed = data.get("packages")
    for i, item in enumerate(listed if isinstance(listed, list) else []):
        try:
            yield i, Requirement(str(item)), str(item)
        except InvalidRequirement:
            continue


def _listed_twice(ld: Loaded, data: dict[str, Any]) -> None:
    """One package listed twice without markers to tell them apart: the resolver would only say
    "unsatisfiable" (two pins) or quietly take the stricter one."""
    first: dict[str, int] = {}
    for i, req, item in _requirements(data):
        if req.url:
            _direct_url(ld, i, req, item)
        if req.marker is not None:
            continue  # markers may tell two entries apart (one per Python or platform)
        key = canonical(req.name)
        if key in first:
            where = f"packages[{first[key]}]"
            ld.add("error", f"packages[{i}]", f"{req.name} is listed twice (also {where})", "keep one pin", item)
        else:
            first[key] = i


def _apt_twice(ld: Loaded, data: dict[str, Any]) -> None:
    """An OS package named twice: two versions cannot both be installed, so one pin is not what the
    image gets; the same entry twice is a slip, said as it is for `packages`."""
    listed = data.get("apt")
    first: dict[str, int] = {}
    for i, item in enumerate(listed if isinstance(listed, list) else []):
        if not isinstance(item, str):
            continue
        key = item.split("=", 1)[0]
        if key in first:
            ld.add("error", f"apt[{i}]", f"{key} is listed twice (also apt[{first[key]}])", "keep one", item)
        else:
            first[key] = i


# NVIDIA's CUDA library wheels name their CUDA major: nvidia-cudnn-cu12, nvidia-nccl-cu11
_NVIDIA_CUDA = re.compile(r"nvidia-[a-z0-9-]+-cu(\d+)")
# The module `triton` comes from one of these, by torch build: both in one environment unpack
# their files over each other, and which one imports depends on the install order
_TRITON = {"cuda": "triton", "rocm": "pytorch-triton-rocm"}


def _accelerator_libraries(ld: Loaded, data: dict[str, Any]) -> None:
    """A CUDA library wheel for another CUDA (or for none) installs without a word and is never
    loaded: torch brings and loads its own. Another build's Triton overwrites torch's."""
    accelerator = str(data.get("accelerator"))
    shown = ACCELERATOR_SHOWN.get(accelerator, accelerator)
    cuda_major = str(data.get("cuda") or "").split(".", 1)[0]
    for i, req, item in _requirements(data):
        name = canonical(req.name)
        nvidia = _NVIDIA_CUDA.fullmatch(name)
        if nvidia and accelerator == "cuda" and cuda_major.isdigit() and nvidia[1] != cuda_major:
            ld.add(
                "warning",
                f"packages[{i}]",
                f"{req.name} is a CUDA {nvidia[1]} library; this profile's torch is a CUDA {data.get('cuda')} build, "
                f"which brings the CUDA {cuda_major} libraries it loads and never loads this one",
                f"leave it out, or name its CUDA {cuda_major} wheel ({name[: nvidia.start(1)]}{cuda_major})",
                item,
            )
        elif nvidia and accelerator in {"cpu", "rocm"}:
            ld.add(
                "warning",
                f"packages[{i}]",
                f"{req.name} is a CUDA library; a {shown} profile's torch never loads it",
                "leave it out, or make the profile a CUDA one (accelerator: cuda)",
                item,
            )
        own = _TRITON.get(accelerator)
        if own and name in _TRITON.values() and name != own:
            ld.add(
                "error",
                f"packages[{i}]",
                f"{req.name} is another torch build's Triton: this {shown} profile's torch uses {own}, "
                "and both install the module `triton`, each over the other's files",
                f"leave it out: the lock takes the {own} torch needs",
                item,
            )


def _direct_url(ld: Loaded, i: int, req: Requirement, item: str) -> None:
    """The lockfiles record releases (name, version, hashes): a URL pin was left out of
    pylock.toml, the SBOM, the smoke test's checks and the edit check, and a git one has no hash."""
    url = req.url or ""
    try:
        version = str(parse_wheel_filename(url.rsplit("/", 1)[-1].split("#", 1)[0])[1])
    except InvalidWheelFilename:  # an sdist, a git URL: no version in the name
        version = "VERSION"
    ld.add(
        "error",
        f"packages[{i}]",
        f"{req.name} @ {url[:80]}: a direct URL is not a release the lockfiles can pin with its hash",
        f'pin the release instead ("{req.name}=={version}"); {OWN_BUILD}',
        item,
    )
