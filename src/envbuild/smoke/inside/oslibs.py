"""The OS's shared libraries the environment loads (libstdc++, libc, zlib, ...), which no scan of the
venv sees: torch links against the OS's C++ runtime, so an image whose libstdc++ was patched ran every
check and passed. Each one this process has mapped is held to dpkg's record of its package (the
package's md5sums), and that record to the one the build wrote into the manifest: a record that moved
while its package's version did not was edited with the file. Debian and Ubuntu bases only: where
there is no dpkg there is no record to hold a file to. Also here: the OS packages against the
build's list, and the libraries preloaded into every process."""

from __future__ import annotations

import os
from typing import Any

from .core import shortlist
from .manifest import DPKG_INFO, dpkg_records, file_digest


def package_changes(before: dict[str, str] | None, now: dict[str, str]) -> list[str]:
    """The OS packages added, removed or at another version than the build recorded
    (`libstdc++6 12.2.0-14 -> 12.2.0-15`, `vim (added)`): an apt-get in an image built FROM this one,
    or in a tampered one. Empty where the build recorded none (no dpkg in its image)."""
    if not before:
        return []
    return [
        f"{p} {before[p]} -> {now[p]}" if p in before and p in now else f"{p} ({'added' if p in now else 'removed'})"
        for p in sorted({*before, *now})
        if before.get(p) != now.get(p)
    ]


def _key(path: str) -> str:
    # merged /usr: dpkg may list /lib/x/libz.so.1 where the loader maps /usr/lib/x/libz.so.1
    return path[4:] if path.startswith("/usr/") else path


def _owners(info: str) -> dict[str, str]:
    """{file (as _key): package} from every package's file list."""
    owners: dict[str, str] = {}
    for name in sorted(os.listdir(info)):
        if name.endswith(".list"):
            with open(os.path.join(info, name), encoding="utf-8", errors="surrogateescape") as fh:
                owners.update((_key(line.rstrip("\n")), name[:-5]) for line in fh if line.startswith("/"))
    return owners


def _md5s(info: str, package: str) -> dict[str, str]:
    """{file (as _key): md5} of one package's md5sums; empty where it has none."""
    try:
        with open(os.path.join(info, package + ".md5sums"), encoding="utf-8", errors="surrogateescape") as fh:
            pairs = [line.rstrip("\n").split("  ", 1) for line in fh]
    except OSError:
        return {}
    return {_key("/" + p[1]): p[0] for p in pairs if len(p) == 2}


def _mounted() -> set[str]:
    """What is mounted into the container at run time but its root (the NVIDIA container toolkit's
    driver libraries, which may stand where a package's file did; a `-v` folder): the host's files,
    not the image's."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8") as fh:
            return {line.split()[4] for line in fh if len(line.split()) > 4} - {"/"}
    except OSError:
        return set()


def _under(path: str, mounts: set[str]) -> bool:
    return any(path == m or path.startswith(m.rstrip("/") + "/") for m in mounts)


def mapped_files() -> set[str]:
    """The files this process has mapped (its shared libraries among them), as the kernel names
    them: the file a link led to. Empty off Linux."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="surrogateescape") as fh:
            return {line.split(maxsplit=5)[5].strip() for line in fh if line.count(" ") >= 5 and "/" in line}
    except OSError:
        return set()


def _mapped_outside(outside: list[str]) -> list[str]:
    """The shared objects mapped here but those under the `outside` folders (the environment and
    the standard library, which the manifest covers file by file)."""
    homes = [os.path.realpath(o) + os.sep for o in outside]
    return sorted(
        p
        for p in mapped_files()
        if p.startswith("/")
        and ".so" in os.path.basename(p)
        and os.path.isfile(p)
        and not any(p.startswith(h) for h in homes)
    )


def problems(
    manifest: dict[str, Any],
    outside: list[str],
    now_packages: dict[str, str],
    facts: dict[str, Any],
    info: str = DPKG_INFO,
) -> list[str]:
    """What is wrong with the OS libraries loaded here, against dpkg's record (in `info`) and the
    build's; `now_packages`: the OS packages' versions now. A manifest from before the record holds
    them to dpkg's record alone."""
    if not os.path.isdir(info):
        facts["os_libraries"] = "no dpkg here: the OS's libraries are not checked"
        return []
    out = []
    then, now = manifest.get("dpkg_records"), dpkg_records(info)
    if then is not None:
        before = manifest.get("os_packages") or {}
        # a record that moved with its package's version is an apt upgrade or install; without, an edit
        edited = sorted(
            p
            for p in {*then, *now}
            if then.get(p) != now.get(p) and before.get(p.split(":")[0]) == now_packages.get(p.split(":")[0])
        )
        if edited:
            out.append(
                f"dpkg's record of the files of {len(edited)} OS package(s) changed, their versions did not: "
                + shortlist(edited)
            )
    owners, mounts = _owners(info), _mounted()
    differ, unowned, checked = [], [], 0
    sums: dict[str, dict[str, str]] = {}  # a package's md5sums, read once however many of its files are mapped
    for path in _mapped_outside(outside):
        package = owners.get(_key(path))
        if _under(path, mounts):
            continue
        if package is None:
            unowned.append(path)
            continue
        if package not in sums:
            sums[package] = _md5s(info, package)
        expected = sums[package].get(_key(path))
        if expected is not None:
            checked += 1
            if file_digest(path, "md5") != expected:
                differ.append(f"{path} ({package.split(':')[0]})")
    facts["os_libraries_checked"] = checked
    if unowned:  # a library of the base image's own, or the host's: listed, not failed
        facts["os_libraries_no_package_owns"] = unowned
    if differ:
        out.append("OS libraries loaded here differ from their package's files: " + ", ".join(differ))
    return out


def preload_entries() -> list[tuple[str, str]]:
    """(where it is set, the library as written) for each preloaded library; the loader takes
    spaces and colons between LD_PRELOAD's entries, whitespace in /etc/ld.so.preload."""
    entries = [("LD_PRELOAD", e) for e in os.environ.get("LD_PRELOAD", "").replace(":", " ").split()]
    try:
        with open("/etc/ld.so.preload", encoding="utf-8") as fh:
            entries += [("/etc/ld.so.preload", e) for e in fh.read().split()]
    except OSError:
        pass
    return entries


def preloaded_among(libraries: list[tuple[str, str]]) -> str:
    """The preload entries that put one of `libraries` in place of a wheel's own: written as a
    path (matched resolved) or as a bare name the loader searched for."""
    hits = [
        f"{source}={entry}" if source == "LD_PRELOAD" else f"{source}: {entry}"
        for source, entry in preload_entries()
        for name, path in libraries
        if (os.path.realpath(entry) == os.path.realpath(path) if "/" in entry else entry == name)
    ]
    return "; ".join(dict.fromkeys(hits))


def preloaded() -> str:
    """Libraries loaded into every process before torch's own: shown, not failed (jemalloc and
    tcmalloc preloads are common and legitimate), since no manifest covers them and they can
    change what every check measured."""
    found = [f"LD_PRELOAD={os.environ['LD_PRELOAD']}"] if os.environ.get("LD_PRELOAD") else []
    listed = " ".join(entry for source, entry in preload_entries() if source == "/etc/ld.so.preload")
    if listed:
        found.append(f"/etc/ld.so.preload: {listed}")
    return "; ".join(found)


def remedy(profile: str) -> str:
    """The fix where the only difference is in the OS's files: no pip install did it."""
    return (
        f"an OS package's files were changed after the build without apt (its version is the build's): rebuild the "
        f"image (envbuild build {profile}); in an image built FROM this one, undo that step or reinstall the "
        "package named (apt-get install --reinstall PACKAGE)"
    )
