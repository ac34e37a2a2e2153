"""CycloneDX documents of an environment, made with cyclonedx-python-lib and checked by its validator.

One place builds them, for `envbuild sbom` and for the copy every image carries
(/opt/envbuild/sbom.cdx.json): Python distributions with the lockfile's sha256 hashes and index,
OS packages with apt.lock's sha256 and URL where apt.lock installed them. With `when` the document
is deterministic (its serial number derives from its content, its timestamp is the build's
SOURCE_DATE_EPOCH), so the build context stays the same bytes for the same inputs.
"""

from __future__ import annotations

import datetime
import hashlib
import uuid
from typing import Any

from envbuild import __version__
from envbuild.aptfile import Deb
from envbuild.freshness import LockSnapshot
from envbuild.lockfile import Pin, conda_hashes
from envbuild.names import canonical

SCHEMA = "1.6"


def _component(
    name: str, version: str, *, kind: str, sha256: list[str] | None = None, url: str = "", md5: str = ""
) -> Any:
    from cyclonedx.model import ExternalReference, ExternalReferenceType, HashAlgorithm, HashType, XsUri
    from cyclonedx.model.component import Component, ComponentType
    from packageurl import PackageURL

    purl = PackageURL(type=kind, name=name, version=version)
    hashes = [HashType(alg=HashAlgorithm.SHA_256, content=h) for h in sorted(sha256 or [])]
    hashes += [HashType(alg=HashAlgorithm.MD5, content=md5)] if md5 else []
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


def _conda(entry: dict[str, Any]) -> Any:
    """A conda-lock entry: pkg:conda, its md5 and sha256, and its package URL."""
    sums = entry.get("hash") or {}
    return _component(
        str(entry["name"]),
        str(entry["version"]),
        kind="conda",
        sha256=[sums["sha256"]] if sums.get("sha256") else [],
        url=str(entry.get("url", "")),
        md5=str(sums.get("md5", "")),
    )


def document(
    target: str,
    distributions: dict[str, str],
    os_packages: dict[str, str] | None,
    pins: dict[str, Pin],
    debs: dict[str, Deb],
    when: datetime.datetime | None = None,
    *,
    check: bool = True,
    conda: list[dict[str, Any]] | None = None,
) -> str:
    """The CycloneDX JSON of an environment, validated before it is returned unless `check` is
    False: the caller then validates it itself before the document is used (`build` does while the
    image builds: the validator's IRI checks parse every URL with an Earley grammar, 2 s)."""
    from cyclonedx.model.bom import Bom, BomMetaData
    from cyclonedx.model.component import Component, ComponentType
    from cyclonedx.output.json import JsonV1Dot6

    top = Component(name=target, version=__version__, type=ComponentType.CONTAINER, bom_ref=f"envbuild:{target}")
    parts = [_python(name, version, pins.get(name)) for name, version in sorted(distributions.items())]
    parts += [_conda(e) for e in sorted(conda or [], key=lambda e: str(e["name"]))]
    parts += [_deb(name, version, debs.get(name)) for name, version in sorted((os_packages or {}).items())]
    serial = None
    if when is not None:
        seed = "\n".join([target, *(f"{p.purl}" for p in parts), *(h.content for p in parts for h in p.hashes)])
        serial = uuid.uuid5(uuid.NAMESPACE_URL, f"envbuild:{seed}")
    bom = Bom(serial_number=serial, metadata=BomMetaData(component=top, timestamp=when))
    for part in parts:
        bom.components.add(part)
    bom.register_dependency(top, parts)  # the environment holds every one of them
    text = str(JsonV1Dot6(bom).output_as_string(indent=2)) + "\n"
    if check:
        validate_document(text)
    return text


def locked(lock: LockSnapshot, platform: str) -> tuple[dict[str, Pin], list[dict[str, Any]]]:
    """What a lockfile installs on `platform`: (Python pins, conda packages). A conda lock's pins are
    its pip packages (each with its wheel's sha256 and URL); its conda packages are their own."""
    if lock.record.route != "conda":
        return lock.pins, []
    mine = lock.conda_entries(platform)
    pins = {
        canonical(str(e["name"])): Pin(str(e["name"]), str(e["version"]), conda_hashes(e), str(e.get("url", "")))
        for e in mine
        if e.get("manager") == "pip"
    }
    return pins, [e for e in mine if e.get("manager") == "conda"]


def of_lock(
    target: str, lock: LockSnapshot, platform: str, when: datetime.datetime | None = None, *, check: bool = True
) -> str:
    """The document of what a lockfile (and its apt.lock) installs on `platform`: `envbuild sbom
    NAME`, and the copy an image of it carries."""
    pins, conda = locked(lock, platform)
    distributions = {p.name: p.version for p in pins.values()}
    os_packages = lock.apt.packages("runtime") if lock.apt else None
    debs = lock.apt.installed if lock.apt else {}
    return document(target, distributions, os_packages, pins, debs, when, check=check, conda=conda)


def validation_key(text: str) -> str:
    """What a passed validation vouches for: these bytes, under this version of the library (the
    document does not name it: metadata.tools is left out so that builds stay byte-identical)."""
    from importlib.metadata import version

    return f"cyclonedx-python-lib {version('cyclonedx-python-lib')} sha256:{hashlib.sha256(text.encode()).hexdigest()}"


def validate_document(text: str) -> None:
    """The library's own strict validator: a document that fails it is a bug, never written."""
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    errors = JsonStrictValidator(SchemaVersion.V1_6).validate_str(text)
    if errors is not None:
        raise ValueError(f"the generated CycloneDX document does not validate: {errors}")
