"""How the C++ compiler links libstdc++ into the shared objects it builds.

torch loads the system's shared libstdc++. A shared object that carries its own static copy (a
compiler that has libstdc++.a only, or one whose specs add -static-libstdc++) then runs two copies
of the C++ runtime in one process, and the first std::locale or std::regex it touches reads the
other copy's facet table: AOTInductor packages died with SIGSEGV in `parse_device_str` on load
that way on a GPU host (docs/GPU-SMOKE.md, 2026-12-04), and C++ extensions can too. torch.compile's
own kernels touch neither, so they run, and nothing else shows the fault before a user serves a
model. The compiler's output is read, not its configuration: one tiny shared object is built.

Runs inside images whose Python may be 3.8: stdlib only.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import tempfile

# Uses out-of-line libstdc++ code (to_string, the exception's string), so the linker must bring
# libstdc++ in: as a DT_NEEDED entry when shared, as copied code when static.
PROBE_SOURCE = """#include <stdexcept>
#include <string>
extern "C" int envbuild_probe(int n) {
  if (n < 0) throw std::runtime_error(std::to_string(n));
  return n;
}
"""
SHARED_RUNTIMES = ("libstdc++.so", "libc++.so")
DT_NEEDED, SHT_DYNAMIC = 1, 6


def find_cxx() -> str | None:
    """The C++ compiler the compile check hands inductor: CXX, else g++, else c++."""
    return shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++")


def static_problem(cxx: str) -> tuple[str, str]:
    """What a compiler that links libstdc++ statically breaks, and the fix: (reason, remedy)."""
    return (
        f"the C++ compiler {cxx} links libstdc++ statically into the shared objects it builds: "
        "next to torch's shared libstdc++, an AOTInductor package it builds crashes on load (SIGSEGV in "
        "std::regex), and a C++ extension that uses locales or regexes can crash too",
        "point CXX and CC at a compiler that links libstdc++ shared (Debian's or Ubuntu's g++ package: "
        "/usr/bin/g++), or install its shared libstdc++ (libstdc++-N-dev)",
    )


def needed_libraries(path: str) -> list[str]:
    """The DT_NEEDED entries of a 64-bit little-endian ELF shared object (what x86_64 and aarch64
    Linux build); ValueError for anything else."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError(f"{path} is not a 64-bit little-endian ELF file")
    shoff, shentsize, shnum = struct.unpack_from("<Q", data, 0x28)[0], *struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    needed = []
    for _name, kind, _flags, _addr, offset, size, link, _info, _align, _entsize in sections:
        if kind != SHT_DYNAMIC:
            continue
        strtab = sections[link][4]
        for pos in range(offset, offset + size, 16):
            tag, value = struct.unpack_from("<qQ", data, pos)
            if tag == 0:
                break
            if tag == DT_NEEDED:
                end = data.index(b"\0", strtab + value)
                needed.append(data[strtab + value : end].decode())
    return needed


def libstdcxx_linkage(cxx: str) -> dict[str, object]:
    """{"linkage": "shared" | "static" | "unknown", "needed": [...], "why": ...} for what `cxx`
    builds with `-shared -fPIC`, the way inductor and cpp_extension call it."""
    with tempfile.TemporaryDirectory(prefix="envbuild-cxx-") as tmp:
        source, target = os.path.join(tmp, "probe.cpp"), os.path.join(tmp, "probe.so")
        with open(source, "w", encoding="utf-8") as f:
            f.write(PROBE_SOURCE)
        try:
            done = subprocess.run(
                [cxx, "-shared", "-fPIC", "-O1", "-o", target, source],
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            return {"linkage": "unknown", "why": f"{cxx} did not run: {exc}"}
        if done.returncode != 0:
            return {"linkage": "unknown", "why": f"{cxx} could not build a shared object: {done.stderr.strip()[-300:]}"}
        try:
            needed = needed_libraries(target)
        except (OSError, ValueError, struct.error) as exc:
            return {"linkage": "unknown", "why": f"could not read {cxx}'s output: {exc}"}
    shared = any(lib.startswith(SHARED_RUNTIMES) for lib in needed)
    return {"linkage": "shared" if shared else "static", "needed": needed}
