"""The smoke test's shared parts: results, the run context, small helpers."""

from __future__ import annotations

import importlib.machinery
from dataclasses import dataclass, field
from typing import Any

REPORT_VERSION = 1
DEFAULT_EXPECT = "/opt/envbuild/expect.json"
# --lock-match: the installed distributions against the lockfile exactly, its pins only, or not at all
LOCK_MATCHES = ("exact", "pins", "none")
# Set by `envbuild smoke` when the engine refused the container's GPU request (host.GPU_REFUSED_ENV).
GPU_REFUSED_ENV = "ENVBUILD_SMOKE_GPU_REFUSED"
# Set by `envbuild smoke` to the image's WORKDIR (Config.WorkingDir), where users' code starts.
WORKDIR_ENV = "ENVBUILD_SMOKE_WORKDIR"
SHM_MIN_BYTES = 1 << 30
SHOWN = 5  # of a long list in a failure
BOOTSTRAP = {"pip", "setuptools", "wheel"}  # installed by venv itself, not by the lock
# cuBLAS needs this before its first handle for deterministic results.


@dataclass
class Result:
    name: str
    status: str = "pass"  # pass | fail | skip
    reason: str = ""
    remedy: str = ""
    seconds: float = 0.0
    facts: dict[str, Any] = field(default_factory=dict)


class CheckFailed(Exception):
    def __init__(self, reason: str, remedy: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.remedy = remedy


class Skip(Exception):
    pass


@dataclass
class Context:
    expect: dict[str, Any]
    gpus: str  # "auto" | "all" | "none" | a number
    timeout: float
    lock_match: str  # exact | pins | none
    local: bool = False  # `envbuild smoke --local`: an interpreter on the host, not an image
    min_peak: float | None = None  # --min-peak PCT: perf below this share of the datasheet fails
    expect_path: str | None = None  # where expect.json was read: the project's checks lie beside it
    torch: Any = None
    devices: int = 0

    def environment_remedy(self, *, or_change_profile: bool = False, only_added: bool = False) -> str:
        """How to get an environment that matches the profile, where this run is (image or host).
        `only_added`: every difference is a distribution the lockfile lacks, which is what an image
        built FROM an envbuild image with more packages looks like: say how to check that one."""
        name = self.expect.get("profile") or "NAME"
        if only_added and not self.local and self.lock_match == "exact":
            return (
                "an image built FROM an envbuild image with packages added: check it with --lock-match pins "
                "(envbuild smoke IMAGE --lock-match pins, or envbuild-smoke --lock-match pins inside it), which "
                f"lists them; otherwise rebuild from a fresh lockfile (envbuild lock {name} && envbuild build {name})"
            )
        if self.local:
            return (
                f"make the environment from the lockfile (envbuild venv {name} DIR) and pass --python DIR/bin/python"
                + (
                    "; or, if this interpreter is the one you want, change the profile to match it"
                    if or_change_profile
                    else ""
                )
            )
        return (
            f"rebuild the image from a fresh lockfile (envbuild lock {name} && envbuild build {name}); "
            "do not pip install into an envbuild environment"
        )

    def moved_pins_remedy(self, locked: list[str]) -> str:
        """An image built FROM an envbuild image whose own install moved locked packages (pip took
        fsspec back a year for lightning): how to keep them. `locked`: each as NAME==VERSION."""
        name = self.expect.get("profile") or "NAME"
        return (
            f"the install in the image built FROM this one changed locked packages: add {' '.join(locked)} "
            "to that pip install (pip then takes versions of the new packages that agree with them, or "
            f"names the conflict), or add the new packages to the profile (envbuild lock {name} && "
            f"envbuild build {name}: one resolution for all)"
        )

    @property
    def accelerator(self) -> str:
        return str(self.expect.get("accelerator") or _detect_accelerator(self.torch))

    @property
    def use_gpu(self) -> bool:
        return self.gpus != "none" and self.accelerator in {"cuda", "rocm"}


def _detect_accelerator(torch: Any) -> str:
    if torch is None:
        return "cpu"
    if getattr(torch.version, "hip", None):
        return "rocm"
    return "cuda" if torch.version.cuda else "cpu"


def _public(version: str) -> str:
    return version.split("+", 1)[0]


def extension_module(filename: str) -> bool:
    """A Python extension module (`_json.cpython-311-x86_64-linux-gnu.so`, `x.abi3.so`), which the
    import system loads by its path, not a shared library the loader finds by name (`libc10.so`):
    a bare ".so" counts only without the "lib" every library's name starts with."""
    suffixes = tuple(s for s in importlib.machinery.EXTENSION_SUFFIXES if s != ".so")
    return filename.endswith(suffixes) or (filename.endswith(".so") and not filename.startswith("lib"))


def shortlist(items: list[str], sep: str = ", ") -> str:
    """The first few of a list a failure names, and `...` where it holds more."""
    return sep.join(items[:SHOWN]) + (", ..." if len(items) > SHOWN else "")


def _canon(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")
