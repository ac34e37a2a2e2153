"""The environment's manifest: every file under the venv with its mode and sha256, and the OS
packages with their versions. Written once at build time (`python -m envbuild_smoke.manifest`),
read by the integrity check; its digest is the image's io.envbuild.env-digest label."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import stat
import subprocess
import sys
import sysconfig
from typing import Any

MANIFEST = "/opt/envbuild/manifest.json"
DIGEST = "/opt/envbuild/env-digest"
VENV = "/opt/venv"
MANIFEST_VERSION = 1
DPKG_INFO = "/var/lib/dpkg/info"


def file_digest(path: str, algorithm: str = "sha256") -> str:
    """hashlib.file_digest, which the image's Python may predate (3.11)."""
    h = hashlib.new(algorithm, usedforsecurity=False)  # md5: dpkg's record, itself held by sha256
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def scan(root: str, known: dict[str, list[Any]] | None = None) -> dict[str, list[Any]]:
    """{path relative to root: [mode, sha256 or link target]} for every file and link under root.
    `known`: entries already hashed (a layer's part of the manifest), taken as they are for a file of
    the same mode; every other file is hashed here, and every link read."""
    files: dict[str, list[Any]] = {}
    inside = os.path.realpath(root) + os.sep
    for folder, dirs, names in os.walk(root):
        dirs.sort()
        for name in sorted(names):
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, root)
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                files[rel] = ["link", os.readlink(path)]
                real = os.path.realpath(path)
                if not real.startswith(inside) and os.path.isfile(real):
                    # what it points to outside root counts too: Debian's stdlib sitecustomize.py is
                    # a link to /etc/python3.11/sitecustomize.py, and an edit there runs at every start
                    files[rel].append(file_digest(real))
            elif stat.S_ISREG(st.st_mode):
                mode = oct(stat.S_IMODE(st.st_mode))
                had = (known or {}).get(rel)
                files[rel] = had if had is not None and had[0] == mode else [mode, file_digest(path)]
    return files


def os_packages() -> dict[str, str]:
    try:
        out = subprocess.run(
            ["dpkg-query", "-W", "-f", "${Package}=${Version}\\n"], capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return {}
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def dpkg_records(info: str = DPKG_INFO) -> dict[str, str]:
    """{package (with its architecture where dpkg names it so): sha256 of its md5sums file}: what dpkg
    holds each installed file's content to, as the build leaves it. Empty without dpkg."""
    try:
        names = sorted(os.listdir(info))
    except OSError:
        return {}
    # no str.removesuffix: images may run Python 3.8 (torch 2.0-2.4)
    return {n[: -len(".md5sums")]: file_digest(os.path.join(info, n)) for n in names if n.endswith(".md5sums")}


def _stdlib() -> str:
    return sysconfig.get_paths()["stdlib"]


def interpreter(root: str) -> dict[str, Any] | None:
    """The Python the environment runs on, where it lies outside root: a venv's base interpreter (the
    OS Python), its binary and its standard library, which every import reaches (a sitecustomize.py
    dropped there runs at every start) and a scan of the venv never sees. None for a conda env,
    which holds its own Python."""
    stdlib = _stdlib()
    if os.path.realpath(stdlib).startswith(os.path.realpath(root) + os.sep):
        return None
    exe = os.path.realpath(getattr(sys, "_base_executable", "") or sys.executable)
    return {"stdlib": stdlib, "files": scan(stdlib), "executable": [exe, file_digest(exe)]}


def _manifest(root: str, files: dict[str, list[Any]]) -> dict[str, Any]:
    out = {"version": MANIFEST_VERSION, "root": root, "files": files, "os_packages": os_packages()}
    out["dpkg_records"] = dpkg_records()  # what the OS's libraries the environment loads are held to
    base = interpreter(root)
    if base is not None:
        out["interpreter"] = base
    return out


def build(root: str = VENV) -> dict[str, Any]:
    return _manifest(root, scan(root))


def merge(root: str, parts: list[str]) -> dict[str, Any]:
    """The manifest from the parts the build wrote per image layer (`--part`), in the order the
    layers were copied (a later layer's file wins, as it does on disk): a re-lock that leaves the
    torch layer cached then hashes only the small layers again, not the whole environment.

    Every file under root is still listed and its mode read here; a file no part names, or whose
    mode or link differs from its part's, is hashed afresh. Equal to `build(root)` for the same
    files (the integrity check, which hashes everything, holds it to that)."""
    known: dict[str, list[Any]] = {}
    for part in parts:
        with open(part, encoding="utf-8") as fh:
            known.update(json.load(fh)["files"])
    return _manifest(root, scan(root, known))


def digest(manifest: dict[str, Any]) -> str:
    """sha256 of the manifest's canonical JSON: equal for two environments with equal files, packages
    and base interpreter (Debian's byte code for its standard library is the same build to build)."""
    blob = json.dumps(manifest, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m envbuild_smoke.manifest")
    parser.add_argument("--root", default=VENV)
    parser.add_argument("--write", default=MANIFEST, help="where the manifest goes (its digest goes beside it)")
    parser.add_argument("--stdout", action="store_true", help="print the environment as it is now; write nothing")
    parser.add_argument("--part", help="write only the files under root, as the part of one image layer")
    parser.add_argument("--merge", action="append", default=[], help="a layer's part, in the layers' order")
    args = parser.parse_args(argv)
    if args.part:
        os.makedirs(os.path.dirname(args.write), exist_ok=True)
        with open(args.write, "w", encoding="utf-8") as fh:
            json.dump({"part": args.part, "files": scan(args.root)}, fh, sort_keys=True, separators=(",", ":"))
        return 0
    manifest = merge(args.root, args.merge) if args.merge else build(args.root)
    if args.stdout:
        print(json.dumps(manifest, sort_keys=True, separators=(",", ":")))
        return 0
    with open(args.write, "w", encoding="utf-8") as fh:
        json.dump(manifest, fh, sort_keys=True, separators=(",", ":"))
    with open(os.path.join(os.path.dirname(args.write), "env-digest"), "w", encoding="utf-8") as fh:
        fh.write(digest(manifest) + "\n")
    print(f"manifest: {len(manifest['files'])} files, {len(manifest['os_packages'])} OS packages", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
