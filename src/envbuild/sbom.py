"""`envbuild sbom NAME|IMAGE`: a CycloneDX document of an environment, made with cyclonedx-python-lib.

For a profile: every locked Python distribution with its version, its sha256 hashes and the index it
comes from (the lockfile's canonical source), and with an apt.lock every OS package of the image
(those apt.lock installs with the archive's sha256 and URL); for a conda profile its conda packages
(pkg:conda, with md5 and sha256) and its pip packages. For an image: the distributions and OS packages its
environment holds now (scanned as `diff` scans it), with the lockfiles' hashes where the image's
profile is one of this project's and the versions agree.
"""

from __future__ import annotations

from typing import Any

from envbuild import diff, freshness, sbomdoc, validate
from envbuild import plan as plan_mod
from envbuild.aptfile import Deb
from envbuild.lockfile import Pin, conda_hashes
from envbuild.names import CONDA_SUBDIRS, canonical
from envbuild.project import Project


def _locked(project: Project, name: str) -> tuple[dict[str, Pin], dict[str, Deb], list[dict[str, Any]]]:
    """The profile's Python pins, every OS package it installs when it has an apt.lock, and a conda
    lock's conda packages (its pip packages are among the pins, with their wheel's hash and URL)."""
    prof = validate.load_named(project, name)
    snap = freshness.require_fresh(project, plan_mod.make(project, prof, strict=False))
    debs = snap.apt.installed if snap.apt else {}
    if prof.flavor != "conda":
        return snap.pins, debs, []
    mine = [e for e in snap.conda_packages if e.get("platform") == CONDA_SUBDIRS[prof.platforms[0]]]
    pins = {
        canonical(str(e["name"])): Pin(str(e["name"]), str(e["version"]), conda_hashes(e), str(e.get("url", "")))
        for e in mine
        if e.get("manager") == "pip"
    }
    return pins, debs, [e for e in mine if e.get("manager") == "conda"]


def sbom(project: Project, target: str) -> str:
    """The CycloneDX JSON of a profile's lockfiles or an image's environment, validated before it is returned."""
    side = diff.side(project, target)
    pins: dict[str, Pin] = {}
    debs: dict[str, Deb] = {}
    conda: list[dict[str, Any]] = []
    if side.profile and (project.profiles_dir / f"{side.profile}.yaml").is_file():
        pins, debs, conda = _locked(project, side.profile)
    distributions = side.distributions
    if side.kind == "lockfile" and conda:  # conda's own Python packages are conda components, not PyPI's
        distributions = {n: p.version for n, p in pins.items()}
    return sbomdoc.document(
        target, distributions, side.os_packages, pins, debs, conda=conda if side.kind == "lockfile" else []
    )
