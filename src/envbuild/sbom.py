"""`envbuild sbom NAME|IMAGE`: a CycloneDX document of an environment, made with cyclonedx-python-lib.

For a profile: every locked Python distribution with its version, its sha256 hashes and the index it
comes from (the lockfile's canonical source). For an image: the distributions and OS packages its
environment holds now (scanned as `diff` scans it), with the lockfile's hashes where the image's
profile is one of this project's and the versions agree.
"""

from __future__ import annotations

from typing import Any

from envbuild import __version__, diff, freshness, validate
from envbuild import plan as plan_mod
from envbuild.lockfile import Pin
from envbuild.project import Project

SCHEMA = "1.6"


def _pins(project: Project, name: str) -> dict[str, Pin]:
    prof = validate.load_named(project, name)
    return freshness.require_fresh(project, plan_mod.make(project, prof, strict=False)).pins


def _component(name: str, version: str, *, kind: str, pin: Pin | None = None) -> Any:
    from cyclonedx.model import ExternalReference, ExternalReferenceType, HashAlgorithm, HashType, XsUri
    from cyclonedx.model.component import Component, ComponentType
    from packageurl import PackageURL

    purl = PackageURL(type=kind, name=name, version=version)
    hashes = [
        HashType(alg=HashAlgorithm.SHA_256, content=h.split(":", 1)[1])
        for h in sorted(pin.hashes if pin else [])
        if h.startswith("sha256:")
    ]
    component = Component(
        name=name, version=version, type=ComponentType.LIBRARY, purl=purl, bom_ref=str(purl), hashes=hashes
    )
    if pin is not None and pin.source.startswith(("http://", "https://")):
        component.external_references.add(
            ExternalReference(type=ExternalReferenceType.DISTRIBUTION, url=XsUri(pin.source))
        )
    return component


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
    if side.profile and (project.profiles_dir / f"{side.profile}.yaml").is_file():
        pins = _pins(project, side.profile)
    parts = []
    for name, version in sorted(side.distributions.items()):
        pin = pins.get(name)
        parts.append(_component(name, version, kind="pypi", pin=pin if pin and pin.version == version else None))
    parts += [_component(n, v, kind="deb") for n, v in sorted((side.os_packages or {}).items())]
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
