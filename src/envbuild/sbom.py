"""`envbuild sbom NAME|IMAGE`: a CycloneDX document of an environment, made with cyclonedx-python-lib.

For a profile: every locked Python distribution with its version, its sha256 hashes and the index it
comes from (the lockfile's canonical source), and with an apt.lock every OS package of the image
(those apt.lock installs with the archive's sha256 and URL); for a conda profile its conda packages
(pkg:conda, with md5 and sha256) and its pip packages. For an image: the distributions and OS packages its
environment holds now (scanned as `diff` scans it), with the lockfiles' hashes where the image's
profile is one of this project's and the versions agree.
"""

from __future__ import annotations

from envbuild import diff, freshness, sbomdoc, validate
from envbuild import plan as plan_mod
from envbuild.project import Project


def sbom(project: Project, target: str) -> str:
    """The CycloneDX JSON of a profile's lockfiles or an image's environment, validated before it is returned."""
    side = diff.side(project, target)
    if not side.profile or not (project.profiles_dir / f"{side.profile}.yaml").is_file():
        return sbomdoc.document(target, side.distributions, side.os_packages, {}, {})
    prof = validate.load_named(project, side.profile)
    snap = freshness.require_fresh(project, plan_mod.make(project, prof, strict=False))
    if side.kind == "lockfile":
        return sbomdoc.of_lock(target, snap, prof.platforms[0])
    # an image: what it holds now, with the lockfile's hashes where the versions agree
    pins, _ = sbomdoc.locked(snap, prof.platforms[0])
    debs = snap.apt.installed if snap.apt else {}
    return sbomdoc.document(target, side.distributions, side.os_packages, pins, debs)
