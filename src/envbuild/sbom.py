"""`envbuild sbom NAME|IMAGE`: a CycloneDX document of an environment, made with cyclonedx-python-lib.

For a profile: every locked Python distribution with its version, its sha256 hashes and the index it
comes from (the lockfile's canonical source), and with an apt.lock every OS package of the image
(those apt.lock installs with the archive's sha256 and URL). For an image: the distributions and OS packages its
environment holds now (scanned as `diff` scans it), with the lockfiles' hashes where the image's
profile is one of this project's and the versions agree.
"""

from __future__ import annotations

from envbuild import diff, freshness, sbomdoc, validate
from envbuild import plan as plan_mod
from envbuild.aptfile import Deb
from envbuild.lockfile import Pin
from envbuild.project import Project


def _locked(project: Project, name: str) -> tuple[dict[str, Pin], dict[str, Deb]]:
    """The profile's Python pins and, when it has an apt.lock, every OS package it installs."""
    prof = validate.load_named(project, name)
    snap = freshness.require_fresh(project, plan_mod.make(project, prof, strict=False))
    return snap.pins, snap.apt.installed if snap.apt else {}


def sbom(project: Project, target: str) -> str:
    """The CycloneDX JSON of a profile's lockfiles or an image's environment, validated before it is returned."""
    side = diff.side(project, target)
    pins: dict[str, Pin] = {}
    debs: dict[str, Deb] = {}
    if side.profile and (project.profiles_dir / f"{side.profile}.yaml").is_file():
        pins, debs = _locked(project, side.profile)
    return sbomdoc.document(target, side.distributions, side.os_packages, pins, debs)
