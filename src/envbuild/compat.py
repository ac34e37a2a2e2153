"""PyTorch compatibility knowledge: the packaged data file and the questions asked of it."""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Literal

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from envbuild.errors import CompatDataError

SCHEMA_VERSION = 1


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TorchRelease(_Strict):
    release: str
    python: tuple[str, str]
    python_pypi_extra: list[str] = Field(default_factory=list)
    cuda_builds: list[str]
    pypi_cuda: str
    pypi_libs: dict[str, str] = Field(default_factory=dict)
    rocm_builds: list[str]
    torchvision: str
    torchaudio: str
    sources: dict[str, str]
    confidence: Literal["verified", "unverified"]
    notes: str = ""
    # Exact pairings that break the "same patch number" rule, keyed by torch release.
    pairs: dict[str, dict[str, str]] = Field(default_factory=dict)
    # Pythons upstream builds wheels for but calls experimental: a warning, not an error.
    python_preview: list[str] = Field(default_factory=list)
    # CUDA builds the sources disagree about: {cuda: what each source says}. A warning, not an error.
    cuda_disputed: dict[str, str] = Field(default_factory=dict)

    def python_ok(self, python: str) -> bool:
        lo, hi = (_v(x) for x in self.python)
        return lo <= _v(python) <= hi

    def on_pypi(self, python: str) -> bool:
        """Whether PyPI has this release's wheels for `python`: the supported range and the extras
        found there. A preview Python's wheels (3.15 for torch 2.13 and 2.14) are on the PyTorch
        index alone."""
        return self.python_ok(python) or python in self.python_pypi_extra

    def python_versions(self) -> list[str]:
        lo, hi = (_v(x) for x in self.python)
        return [f"3.{m}" for m in range(lo.minor, hi.minor + 1)]


class NumpyRange(_Strict):
    numpy: str
    python: tuple[str, str]


class NumpyRules(_Strict):
    numpy2_min_torch: str
    source: str
    python_ranges: list[NumpyRange]
    python_ranges_source: str


class DriverFloor(_Strict):
    cuda: str
    min_driver: str
    minor_floor: str
    source: str
    confidence: Literal["verified", "unverified"]


class ArchRow(_Strict):
    cuda: str
    torch: str
    sm: list[str]
    ptx: str | None = None
    source: str
    confidence: Literal["verified", "unverified"]


class BaseImage(_Strict):
    image: str
    python_from: Literal["apt"]  # the OS package python3.X of the base image
    confidence: Literal["verified", "unverified"]


class DevelBase(_Strict):
    image_pattern: str
    confidence: Literal["verified", "unverified"]


class Bases(_Strict):
    comment: str
    python: dict[str, BaseImage]
    devel: DevelBase


class PlatformBuilds(_Strict):
    """The torch build of PyPI's default wheel per platform, where it is not the x86_64 one."""

    aarch64: Literal["cpu", "cuda"]
    source: str
    confidence: Literal["verified", "unverified"]


class CompatData(_Strict):
    schema_version: int
    collected: str
    refresh: str
    sources: dict[str, str]
    torch: list[TorchRelease]
    numpy: NumpyRules
    drivers: list[DriverFloor]
    arches: list[ArchRow]
    bases: Bases
    pypi_platform_builds: PlatformBuilds

    # ---- questions -------------------------------------------------------------------------

    def release(self, torch: str) -> TorchRelease | None:
        """The row for a torch version ("2.3.1" -> the 2.3 row)."""
        try:
            v = _v(torch)
        except CompatDataError:
            return None
        key = f"{v.major}.{v.minor}"
        return next((r for r in self.torch if r.release == key), None)

    def releases_with_cuda(self, cuda: str) -> list[str]:
        return [r.release for r in self.torch if cuda in r.cuda_builds]

    def releases_with_rocm(self, rocm: str) -> list[str]:
        return [r.release for r in self.torch if rocm in r.rocm_builds]

    def rocm_named(self, version: str) -> str:
        """The ROCm build a name's token means. rocm714 reads as 7.1.4 or as 7.14 (test-infra's name
        for a build of torch 2.14): the one this data has wins, else the name's own reading."""
        major, _, rest = version.partition(".")
        known = {build for row in self.torch for build in row.rocm_builds}
        other = f"{major}.{rest.replace('.', '')}"
        return other if version not in known and other in known else version

    def releases_for_python(self, python: str) -> list[str]:
        return [r.release for r in self.torch if r.python_ok(python)]

    def one_release(self, spec: str) -> str:
        """A companion spec as one release: itself, or for a wildcard (torchaudio's frozen `2.11.*`)
        the newest patch of it the data records as some torch release's exact pairing, else `.0`.
        A build label needs an exact version (`==2.11.*+cpu` is no specifier)."""
        if not spec.endswith(".*"):
            return spec
        line = spec[:-2]
        known = [v for r in self.torch for pair in r.pairs.values() for v in pair.values() if v.startswith(f"{line}.")]
        return str(max((_v(v) for v in known), default=_v(f"{line}.0")))

    def driver_floor(self, cuda: str) -> DriverFloor | None:
        return next((d for d in self.drivers if d.cuda == cuda), None)

    def arches_for(self, cuda: str, torch: str) -> ArchRow | None:
        tv = _v(torch)
        for row in self.arches:
            if row.cuda == cuda and SpecifierSet(row.torch).contains(tv, prereleases=True):
                return row
        return None

    def numpy_python(self, numpy: str) -> NumpyRange | None:
        nv = _v(numpy)
        key = f"{nv.major}.{nv.minor}"
        return next((r for r in self.numpy.python_ranges if r.numpy == key), None)

    def numpy2_allowed(self, torch: str) -> bool:
        return _v(torch) >= _v(self.numpy.numpy2_min_torch)

    def numpy_series(self, python: str, torch: str) -> list[str]:
        """The numpy series ("2.4") with wheels for this Python that this torch allows, oldest first."""
        fits = [
            r.numpy
            for r in self.numpy.python_ranges
            if _v(r.python[0]) <= _v(python) <= _v(r.python[1])
            and (_v(r.numpy).major < 2 or self.numpy2_allowed(torch))
        ]
        return sorted(fits, key=_v)

    def newest(self) -> TorchRelease:
        return max(self.torch, key=lambda r: _v(r.release))


def provenance(db: CompatData, rows: list[TorchRelease]) -> list[dict[str, str]]:
    """Each value of these releases with the source it was read from and its confidence
    (`envbuild compat --sources`), the GPU architecture rows of their CUDA builds included."""
    out: list[dict[str, str]] = []
    for row in rows:
        for field_name, source in sorted(row.sources.items()):
            out.append({"torch": row.release, "field": field_name, "source": source, "confidence": row.confidence})
        for cuda in row.cuda_builds:
            arch = db.arches_for(cuda, row.release + ".0")
            if arch is not None:
                out.append(
                    {
                        "torch": row.release,
                        "field": f"arches cu{cuda.replace('.', '')}",
                        "source": arch.source,
                        "confidence": arch.confidence,
                    }
                )
        for cuda, why in sorted(row.cuda_disputed.items()):
            out.append({"torch": row.release, "field": f"cuda {cuda} (disputed)", "source": why, "confidence": "low"})
    return out


def _v(text: str) -> Version:
    try:
        return Version(text)
    except InvalidVersion as exc:
        raise CompatDataError(f"not a version: {text!r}") from exc


def torchvision_for(row: TorchRelease, torch: str) -> str:
    """The torchvision release that pairs with an exact torch release.

    torchvision's patch number follows torch's, except where the data records an
    exact pairing (2.0.1 shipped with 0.15.2).
    """
    exact = row.pairs.get(torch, {}).get("torchvision")
    return exact or f"{row.torchvision}.{_v(torch).micro}"


def torchaudio_for(row: TorchRelease, torch: str) -> str:
    """The torchaudio release that pairs with an exact torch release."""
    exact = row.pairs.get(torch, {}).get("torchaudio")
    if exact:
        return exact
    if row.torchaudio != row.release:
        # torchaudio froze at 2.11.x with a stable ABI; the newest 2.11 patch serves all.
        return f"{row.torchaudio}.*"
    return f"{row.torchaudio}.{_v(torch).micro}"


@cache
def load() -> CompatData:
    """The packaged compatibility data, validated once per process."""
    try:
        text = resources.files("envbuild").joinpath("data/compat.json").read_text("utf-8")
        data = CompatData.model_validate(json.loads(text))
    except (OSError, ValueError, ValidationError) as exc:
        raise CompatDataError(f"packaged compat data is unreadable: {exc}") from exc
    if data.schema_version != SCHEMA_VERSION:
        raise CompatDataError(
            f"compat data schema {data.schema_version}, this envbuild reads {SCHEMA_VERSION}",
            hint="reinstall envbuild",
        )
    return data


def companions(row: TorchRelease, torch: str) -> dict[str, str]:
    """{torchvision, torchaudio: the release that pairs with an exact torch release}, as `auto`
    locks it (a wildcard for torchaudio's frozen line: the index's newest patch)."""
    return {"torchvision": torchvision_for(row, torch), "torchaudio": torchaudio_for(row, torch)}
