"""`envbuild sbom NAME|IMAGE`: a CycloneDX document of an environment, made with cyclonedx-python-lib.

For a profile: every locked Python distribution with its version, its sha256 hashes and the index it
comes from (the lockfile's canonical source), and with an apt.lock every OS package of the image
(those apt.lock installs with the archive's sha256 and URL). For an image: the distributions and OS packages its
environment holds now (scanned as `diff` scans it), with the lockfiles' hashes where the image's
profile is one of this project's and the versions agree.
"""

from __future__ import annotations

from typing import Any

from envbuild import __version__, diff, freshness, validate
from envbuild import plan as plan_mod
from envbuild.aptfile import Deb
from envbuild.lockfile import Pin
from envbuild.project import Project

SCHEMA = "1.6"


def _locked(project: Project, name: str) -> tuple[dict[str, Pin], dict[str, Deb]]:
    """The profile's Python pins and, when it has an apt.lock, every OS package it installs."""
    prof = validate.load_named(project, name)
    snap = freshness.require_fresh(project, plan_mod.make(project, prof, strict=False))
    debs = {d.name: d for stage in ("builder", "runtime") for d in (snap.apt.stages.get(stage, ()) if snap.apt else ())}
    return snap.pins, debs


def _component(name: str, version: str, *, kind: str, sha256: list[str] | None = None, url: str = "") -> Any:
    from cyclonedx.model import ExternalReference, ExternalReferenceType, HashAlgorithm, HashType, XsUri
    from cyclonedx.model.component import Component, ComponentType
    from packageurl import PackageURL

    purl = PackageURL(type=kind, name=name, version=version)
    hashes = [HashType(alg=HashAlgorithm.SHA_256, content=h) for h in sorted(sha256 or [])]
    component = Component(
        name=name, version=version, type=ComponentType.LIBRARY, purl=purl, bom_ref=str(purl), hashes=hashes
    )
    if url.startswith(("http://", "https://")):
        component.external_references.add(ExternalReference(type=ExternalReferenceType.DISTRIBUTION, url=XsUri(url)))
    return component


def _python(name: str, version: str, pin: Pin | None) -> Any:
    if pin is None or pin.version != version:
        return _component(name, version, kind="pypi")
    sums = [h.split(":", 1)[1] for h in pin.hashes if h.startswith("sha256:")]
    return _component(name, version, kind="pypi", sha256=sums, url=pin.source)


def _deb(name: str, version: str, deb: Deb | None) -> Any:
    if deb is None or deb.version != version:  # the base's own packages: apt.lock lists, never fetches them
        return _component(name, version, kind="deb")
    return _component(name, version, kind="deb", sha256=[deb.sha256], url=deb.url)


def sbom(project: Project, target: str) -> str:
    """The CycloneDX JSON of a profile's lockfile or an image's environment, validated before it is returned."""
    from cyclonedx.model.bom import Bom
    from cyclonedx.model.component import Component, ComponentType
    from cyclonedx.output.json import JsonV1Dot6

    bom = Bom()
    bom.metadata.component = Component(
        name=target, version=__version__, type=ComponentType.CONTAINER, bom_ref=f"envbuild:{target}"
    )
    side = diff.side(project, target)
    pins: dict[str, Pin] = {}
    debs: dict[str, Deb] = {}
    if side.profile and (project.profiles_dir / f"{side.profile}.yaml").is_file():
        pins, debs = _locked(project, side.profile)
    parts = [_python(name, version, pins.get(name)) for name, version in sorted(side.distributions.items())]
    parts += [_deb(name, version, debs.get(name)) for name, version in sorted((side.os_packages or {}).items())]
    for part in parts:
        bom.components.add(part)
    bom.register_dependency(bom.metadata.component, parts)  # the environment holds every one of them
    text = JsonV1Dot6(bom).output_as_string(indent=2)
    validate_document(text)
    return str(text) + "\n"


def validate_document(text: str) -> None:
    """The library's own strict validator: a document that fails it is a bug, never written."""
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    errors = JsonStrictValidator(SchemaVersion.V1_6).validate_str(text)
    if errors is not None:
        raise ValueError(f"the generated CycloneDX document does not validate: {errors}")
