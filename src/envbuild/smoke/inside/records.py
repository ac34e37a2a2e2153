"""A second witness for the integrity check: each distribution's RECORD, the list of its files with
their sha256 that its wheel carried and the installer wrote beside them.

The manifest is the build's word on every file, but it lies in the image beside them: edited with a
file, and its digest with it (the env-digest file, and the label in an image built FROM this one),
it vouched for the edit, and every check passed. A file must now also match its wheel's RECORD, which
such an edit has to forge as well. Only what pip and uv installed: conda rewrites its packages'
install prefix inside their files, so their RECORDs do not hold by design. Byte code is left to the
manifest alone: the build compiles every module again (hash-checked, REPRODUCIBILITY.md), so a .pyc
a wheel carried (numpy's distutils has some) is not the one its RECORD lists."""

from __future__ import annotations

import base64
import csv
import os
from collections.abc import Mapping
from typing import Any

_INSTALLERS = ("pip", "uv")
_SITE = ("site-packages", "dist-packages")


def _installer(info: str) -> str:
    try:
        with open(os.path.join(info, "INSTALLER"), encoding="utf-8") as fh:
            return fh.read().strip()
    except (OSError, UnicodeDecodeError):
        return ""


def _b64(hex_digest: str) -> str:
    """RECORD writes a sha256 as urlsafe base64 without padding (PEP 376, the wheel spec)."""
    return base64.urlsafe_b64encode(bytes.fromhex(hex_digest)).rstrip(b"=").decode()


def unlike_record(root: str, files: Mapping[str, list[Any]]) -> list[str]:
    """Files under root (`files`: the scan, {path: [mode, sha256]}) whose bytes are not any that a
    RECORD lists for them; a RECORD that cannot be read is named itself. A path two distributions
    both ship (a namespace package's __init__.py) holds if it is either's."""
    recorded: dict[str, set[str]] = {}
    unreadable: list[str] = []
    for rel in files:
        if not rel.endswith(".dist-info/RECORD"):
            continue
        info = os.path.dirname(rel)
        site = os.path.dirname(info)  # RECORD's paths are relative to the folder that holds the dist-info
        # an installed distribution's, not one a package vendors (setuptools/_vendor/*.dist-info)
        if os.path.basename(site) not in _SITE or _installer(os.path.join(root, info)) not in _INSTALLERS:
            continue
        try:
            with open(os.path.join(root, rel), encoding="utf-8", newline="") as fh:
                rows = list(csv.reader(fh))
        except (OSError, UnicodeDecodeError, csv.Error):
            unreadable.append(rel)
            continue
        for row in rows:
            if len(row) >= 2 and row[1].startswith("sha256=") and not row[0].endswith(".pyc"):
                path = os.path.normpath(os.path.join(site, row[0]))
                recorded.setdefault(path, set()).add(row[1][len("sha256=") :])
    unlike = [
        path
        for path, hashes in recorded.items()
        if path in files and files[path][0] != "link" and _b64(files[path][1]) not in hashes
    ]
    return sorted(unlike + unreadable)
