"""Check: every locked distribution imports (and, in an image checked with --lock-match pins, one
built FROM an envbuild image, every distribution it added). The other checks import torch and numpy only, so an
image could pass while `import cv2` needs an OS library the image lacks (libGL.so.1), or a package
compiled against NumPy 1.x or another torch release fails on its first import in the user's code.

Each top-level module of each locked distribution is imported in one child process, one after the
other: an import that crashes the interpreter (a binary built for another ABI can) or hangs is then
named, and nothing it leaves behind (threads, patched modules) reaches the other checks."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import sysconfig
import tempfile
import time
from importlib import metadata

from .core import BOOTSTRAP, SHOWN, CheckFailed, Context, Result, Skip, _canon, extension_module
from .integrity import _top_level

LIMIT_S = 300.0
MARK = "@envbuild-import@ "  # the child's lines for us, told apart from what imports print
# Stray top-level folders some wheels ship, never what users import; pip, setuptools and wheel are
# left out too (importing pip makes setuptools' distutils shim stand down for the process).
NOT_MODULES = {"test", "tests", "testing", "doc", "docs", "example", "examples", "benchmark", "benchmarks"}
NOT_MODULES |= {"scripts", "tools"}
# The driver's libraries come from the host with the GPUs: without them (a build on a machine with
# none) a CUDA package may fail its import and be fine where it runs.
NEEDS_GPU = re.compile(r"libcuda\.so|libnvidia-ml\.so|NVIDIA driver|no CUDA GPUs are available|CUDA driver", re.I)
# torch's own libraries, or an operator a companion registers, missing: a wheel built for another
# build of torch (PyPI's torchvision links libc10_cuda.so; beside a +cpu torch it registers no nms).
OTHER_TORCH_BUILD = re.compile(
    r"lib(c10|torch)\w*\.so\S*: cannot open shared object|operator torch\w+::\w+ does not exist"
)
# An OS library the image lacks, and the Debian package that has it, for the usual ones.
MISSING_LIB = re.compile(r"(?P<lib>lib[\w.+-]+\.so[\w.]*): cannot open shared object file")
DEBIAN_PACKAGE = {
    "libGL.so.1": "libgl1",
    "libEGL.so.1": "libegl1",
    "libgthread-2.0.so.0": "libglib2.0-0",
    "libglib-2.0.so.0": "libglib2.0-0",
    "libSM.so.6": "libsm6",
    "libICE.so.6": "libice6",
    "libXext.so.6": "libxext6",
    "libXrender.so.1": "libxrender1",
    "libX11.so.6": "libx11-6",
    "libsndfile.so.1": "libsndfile1",
    "libgomp.so.1": "libgomp1",
    "libopenblas.so.0": "libopenblas0",
}

# Ends with os._exit: a module that starts a thread that is not a daemon on import would otherwise
# keep the child alive after the last import, and the check would wait out its time limit.
CHILD = """
import json, os, sys, warnings
warnings.simplefilter("ignore")
for name in sys.argv[1:]:
    print(MARK + json.dumps({"start": name}), flush=True)
    try:
        __import__(name)
        said = {"ok": name}
    except BaseException as exc:  # SystemExit too: a module that exits on import fails to import
        said = {"failed": name, "error": (type(exc).__name__ + ": " + str(exc))[:600]}
    print(MARK + json.dumps(said), flush=True)
sys.stdout.flush()
os._exit(0)
"""


def _modules(ctx: Context) -> dict[str, str]:
    """{module: its distribution} for the locked distributions installed here, in name order. An
    image checked with --lock-match pins is one built FROM an envbuild image: what it added is what
    its user runs, and imports too (PyPI's CUDA torchvision beside a +cpu torch fails right there)."""
    locked = {_canon(k) for k in (ctx.expect.get("packages") or {})} - BOOTSTRAP
    added_too = _added_too(ctx)
    found: dict[str, str] = {}
    for dist in metadata.distributions(path=_homes()):
        name = _canon(dist.metadata["Name"] or "?")
        if name in locked or (added_too and name not in BOOTSTRAP):
            for module in _top_level(dist):
                if not module.startswith("_") and module.lower() not in NOT_MODULES:
                    found.setdefault(module, name)
    return dict(sorted(found.items()))


def _added_too(ctx: Context) -> bool:
    """The distributions the lockfile lacks import too: an image under --lock-match pins (a host's
    interpreter holds what it likes, and a failure there is not the environment's)."""
    return ctx.lock_match == "pins" and not ctx.local


def _homes() -> list[str]:
    paths = sysconfig.get_paths()
    return sorted({paths["purelib"], paths["platlib"]})


def _unresolved(distribution: str) -> list[str]:
    """Every library the distribution's shared objects need and the loader does not find (ldd's
    "not found"): the import names only the first, and the user would rebuild once per library."""
    missing: set[str] = set()
    for dist in metadata.distributions(path=_homes()):
        if _canon(dist.metadata["Name"] or "?") != distribution:
            continue
        files = list(dist.files or [])
        # the extension modules (what an import loads; ldd follows what they need), not the plugins
        # a wheel also ships (Qt's libqxcb.so loads only with a window)
        modules = [f for f in files if extension_module(f.name)]
        # the libraries it vendors (auditwheel's NAME.libs/) load by their soname, which ldd of one
        # of them alone may not find
        vendored = {f.name for f in files}
        for path in [str(dist.locate_file(f)) for f in modules][:200]:
            try:
                listed = subprocess.run(["ldd", path], capture_output=True, text=True, timeout=10, check=False).stdout
            except (OSError, subprocess.TimeoutExpired):
                return []  # no ldd here: the import's own message stands
            missing.update(m.group(1) for m in re.finditer(r"^\s*(\S+) => not found", listed, re.M))
        missing -= vendored
    return sorted(m for m in missing if not NEEDS_GPU.search(m))  # the driver's come from the host


def _remedy(error: str, profile: str, distribution: str = "") -> str:
    missing = MISSING_LIB.search(error)
    if OTHER_TORCH_BUILD.search(error):
        index = os.environ.get("ENVBUILD_TORCH_INDEX")
        where = f"pip install --extra-index-url {index} {distribution or 'NAME'}" if index else "its index or channel"
        return (
            f"{distribution or 'a package'} was built for another build of torch than this environment's (PyPI's "
            f"CUDA build beside a CPU or ROCm torch): install the one that pairs with it from where torch came "
            f"from ({where}), or name it in {profile} (`torchvision: auto`, `torchaudio: auto`)"
        )
    if missing:
        libs = _unresolved(distribution) or [missing.group("lib")]
        known = sorted({DEBIAN_PACKAGE[lib] for lib in libs if lib in DEBIAN_PACKAGE})
        unknown = [lib for lib in libs if lib not in DEBIAN_PACKAGE]
        which = [f"`{p}`" for p in known] + [
            f"the Debian package that has {lib} (apt-file search {lib})" for lib in unknown
        ]
        return (
            f"the image lacks the OS librar{'y' if len(libs) == 1 else 'ies'} {', '.join(libs)}: add "
            f"{' and '.join(which)} to the profile's `apt:` list and rebuild"
        )
    if "NumPy 1.x" in error or "numpy.core.multiarray failed to import" in error:
        return f"a package compiled against NumPy 1.x: pin numpy<2 in {profile}, or a release of it built for NumPy 2"
    if "undefined symbol" in error:
        return (
            "a binary built against another release of torch (or of a library it links): pin the release "
            "that pairs with the profile's torch"
        )
    return "see facts.failed; import it in the image (python -c 'import NAME') to see the whole error"


def _run_child(modules: list[str], limit: float) -> dict[str, str]:
    """Import `modules` in order in a child: {module: "" or its error}. The module that was importing
    when the child died or ran out of time says so; the ones after it are not in the answer."""
    results: dict[str, str] = {}
    started: list[str] = []
    with tempfile.TemporaryDirectory(prefix="envbuild-imports-") as folder:  # no WORKDIR module first
        try:
            done = subprocess.run(
                [sys.executable, "-c", CHILD.replace("MARK", repr(MARK)), *modules],
                capture_output=True,
                text=True,
                timeout=max(limit, 1.0),
                check=False,
                cwd=folder,
                env={**os.environ, "PYTHONWARNINGS": "ignore"},
            )
            out, code = done.stdout, done.returncode
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
            code = None
    for line in out.split("\n"):  # not splitlines(): it also splits on characters an import may print
        if line.startswith(MARK):
            said = json.loads(line[len(MARK) :])
            if "start" in said:
                started.append(said["start"])
            elif "ok" in said:
                results[said["ok"]] = ""
            else:
                results[said["failed"]] = said["error"]
    running = next((m for m in started if m not in results), None)
    if running is None and len(results) < len(modules):
        running = next(m for m in modules if m not in results)  # died before it said which
    if running is not None:
        what = f"did not finish within {LIMIT_S:g} s" if code is None else f"crashed the interpreter (exit {code})"
        results[running] = f"the import {what}"
    return results


def check_imports(ctx: Context, r: Result) -> None:
    modules = _modules(ctx)
    if not modules:
        raise Skip("no locked distribution with modules of its own is installed here")
    results: dict[str, str] = {}
    deadline = time.monotonic() + LIMIT_S
    # a crash or a hang names its module; the modules after it are imported in a new child
    while len(results) < len(modules) and time.monotonic() < deadline:
        results.update(_run_child([m for m in modules if m not in results], deadline - time.monotonic()))
    for module in modules:
        results.setdefault(module, f"not imported: the {LIMIT_S:g} s for all imports ran out")
    gpu_only = {m: e for m, e in results.items() if e and NEEDS_GPU.search(e)}
    failed = {m: e for m, e in results.items() if e and m not in gpu_only}
    r.facts["imported"] = sum(1 for e in results.values() if not e)
    if gpu_only:
        r.facts["needs_gpu"] = {f"{m} ({modules[m]})": e for m, e in gpu_only.items()}
    if failed:
        r.facts["failed"] = {f"{m} ({modules[m]})": e for m, e in failed.items()}
        shown = "; ".join(f"{m} ({modules[m]}): {e.splitlines()[0][:200]}" for m, e in list(failed.items())[:SHOWN])
        more = f"; and {len(failed) - SHOWN} more" if len(failed) > SHOWN else ""
        first = next(iter(failed.items()))
        which = "" if _added_too(ctx) else "locked "
        raise CheckFailed(
            f"{len(failed)} of {len(modules)} {which}module(s) fail to import: {shown}{more}",
            _remedy(first[1], str(ctx.expect.get("profile") or "the profile"), modules[first[0]]),
        )
