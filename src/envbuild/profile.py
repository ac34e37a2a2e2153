"""The profile format: a strict model, `extends`, and loading with located errors."""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from packaging.requirements import InvalidRequirement, Requirement
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    ValidationError,
    model_validator,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, PydanticCustomError, core_schema

from envbuild.names import NAME_MAX, NAME_RE, NAME_RULE, canonical, json_sha256
from envbuild.profilefile import Loaded, free_threaded, odd_path, read_raw, series_newest, unparsable_fix
from envbuild.refs import IMAGE_RE, REGISTRY_RE, URL_RE, near_miss_fix

PYTHON_RE = re.compile(r"^3\.\d{1,2}$")
RELEASE_RE = re.compile(r"^\d+\.\d+\.\d+$")
CUDA_RE = re.compile(r"^\d{2}\.\d$")
ROCM_RE = re.compile(r"^\d\.\d{1,2}(\.\d{1,2})?$")  # 7.14 is real (test-infra release/2.14)
APT_RE = re.compile(r"^[a-z0-9][a-z0-9+.-]{0,127}(=[A-Za-z0-9.+:~-]{1,64})?$")
APT_SNAPSHOT_RE = re.compile(r"^(auto|\d{8}T\d{6}Z)$")
ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
# Pinned by dedicated fields; a second pin in `packages` would fight them.
PINNED_ELSEWHERE = {"torch", "torchvision", "torchaudio", "numpy"}
MAX_TEXT = 512


@dataclass(frozen=True)
class NameParts:
    """What a profile name says: `cu126-py312-dev` is CUDA 12.6, Python 3.12."""

    token: str  # cpu | cu126 | rocm63
    accelerator: str  # cpu | cuda | rocm
    version: str | None  # "12.6" / "6.3"; None for cpu
    python: str  # "3.12"


def name_parts(name: str) -> NameParts | None:
    """The accelerator, its version and the Python a conventional name encodes; None if unconventional."""
    match = NAME_RE.fullmatch(name)
    if not match:
        return None
    tok = match.group(1)
    py_digits = name.split("-py", 1)[1].split("-", 1)[0]
    python = f"{py_digits[0]}.{py_digits[1:]}"
    if tok == "cpu":
        return NameParts(tok, "cpu", None, python)
    if tok.startswith("cu"):
        digits = tok[2:]
        return NameParts(tok, "cuda", f"{digits[:2]}.{digits[2:]}", python)
    return NameParts(tok, "rocm", ".".join(tok[4:]), python)


PROBLEM = "envbuild_problem"


def _fail(problem: str, fix: str) -> PydanticCustomError:
    """A validation problem with its fix as typed fields, which the diagnostics read back apart."""
    return PydanticCustomError(PROBLEM, "{problem}", {"problem": problem, "fix": fix})


def _single_line(value: str) -> str:
    if len(value) > MAX_TEXT:
        raise _fail(f"longer than {MAX_TEXT} characters", "shorten it")
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise _fail("contains a control character or line break", "keep it on one line")
    return value


@dataclass(frozen=True)
class _Pattern:
    """A regex check worded for people, published to editors as the JSON Schema `pattern` too."""

    regex: re.Pattern[str]
    what: str
    example: str
    package: str = ""  # a release field: a bare series ("2.10") gets a fix that names how to find its newest
    own: Callable[[str], tuple[str, str] | None] | None = None  # a problem of its own: "3.13t", a path's "é"

    def check(self, value: str) -> str:
        if not self.regex.fullmatch(value):
            fix = near_miss_fix(self.regex, value) or f"write it like {self.example}"
            if self.package and re.fullmatch(r"\d+\.\d+", value):
                fix = f'name a release of the {value} series ("{value}.0" is its first)'
                fix += series_newest(self.package, value)
            if self.own and (problem := self.own(value)):
                raise _fail(*problem)
            raise _fail(f"{value[:80]!r} is not {self.what}", fix)
        return value

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        return core_schema.no_info_after_validator_function(self.check, handler(source))

    def __get_pydantic_json_schema__(self, schema: CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        out = handler(schema)
        # JSON Schema patterns search; fullmatch semantics need both anchors (every regex here has them).
        out["pattern"] = self.regex.pattern
        return out


def _name_length(value: str) -> str:
    if len(value) > NAME_MAX:
        raise _fail(
            f"{len(value)} characters; at most {NAME_MAX}",
            "shorten it: the image tag NAME-<12 hex> must fit Docker's 128-character limit",
        )
    return value


def _requirement(value: str) -> str:
    _single_line(value)
    try:
        req = Requirement(value)
    except InvalidRequirement as exc:
        reason = str(exc).splitlines()[0].rstrip(".")
        raise _fail(f"{value!r} is not a PEP 508 requirement ({reason})", unparsable_fix(value)) from exc
    if canonical(req.name) in PINNED_ELSEWHERE:
        raise _fail(
            f"{req.name} is pinned by its own field",
            f"remove it from packages and set `{req.name.lower()}:` instead",
        )
    return value


def _version_or_auto(value: str) -> str:
    if value != "auto" and not RELEASE_RE.fullmatch(value):
        raise _fail(f'{value!r} is neither an exact release nor "auto"', 'write e.g. "0.18.1" or "auto"')
    return value


def _env(value: dict[str, str]) -> dict[str, str]:
    problems: list[str] = []
    for key, val in value.items():
        if not ENV_KEY_RE.fullmatch(key):
            problems.append(f"{key[:60]!r} is not a valid variable name")
        elif any(ord(c) < 32 or ord(c) == 127 for c in val) or len(val) > MAX_TEXT:
            problems.append(f"{key}'s value has a line break or control character, or is too long")
    if problems:
        raise _fail("; ".join(problems), "use names of letters, digits and _, and one-line values")
    return value


Platform = Literal["x86_64", "aarch64"]


@dataclass(frozen=True)
class _Schema:
    """Keywords for editors only: the validator next to it is what checks them, in envbuild's words."""

    keywords: tuple[tuple[str, Any], ...]

    def __get_pydantic_json_schema__(self, schema: CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        return {**handler(schema), **dict(self.keywords)}


def _schema(**keywords: Any) -> _Schema:
    return _Schema(tuple(keywords.items()))


Text = Annotated[str, AfterValidator(_single_line), _schema(maxLength=MAX_TEXT)]
VersionOrAuto = Annotated[str, AfterValidator(_version_or_auto), _schema(pattern=r"^(\d+\.\d+\.\d+|auto)$")]
EnvVars = Annotated[dict[str, str], AfterValidator(_env), _schema(propertyNames={"pattern": ENV_KEY_RE.pattern})]
Url = Annotated[str, _Pattern(URL_RE, "an http(s):// or file:// URL", '"https://pypi.example/simple"')]
CHANNEL_RE = re.compile(r"^[A-Za-z0-9_.:/-]{1,200}$")
CHECK_RE = re.compile(r"^(?!/)(?!.*(^|/)\.\.(/|$))[A-Za-z0-9_./-]{1,200}\.py$")
MATCH_SPEC_RE = re.compile(r"^[A-Za-z0-9_.-]+([<>=!~ ]{1,3}[A-Za-z0-9_.*,<>=!]+)?$")
_CHECK_PATH = _Pattern(CHECK_RE, "a Python script in the project", '"checks/train_tiny.py"', own=odd_path)
PACKAGE_NAME_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,98}[A-Za-z0-9])?$")
PackageName = Annotated[str, _Pattern(PACKAGE_NAME_RE, "a package name", '"torch-scatter"')]
_REQUIRED: Any = ...


def _doc(text: str, default: Any = None, default_factory: Any = None) -> Any:
    """A field with the description an editor shows on hover."""
    if default_factory is not None:
        return Field(default_factory=default_factory, description=text)
    return Field(default, description=text)


class Profile(BaseModel):
    """A resolved profile (after `extends`). Unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    name: Annotated[str, _Pattern(NAME_RE, "a profile name", NAME_RULE), AfterValidator(_name_length)] = _doc(
        "Equals the file's stem: <cpu|cuXYZ|rocmXY[Z]>-py<XY>[-suffix], e.g. cu121-py311.", _REQUIRED
    )
    extends: str | None = _doc("Another file in the same folder (without .yaml) that this one is deep-merged over.")
    description: Text = _doc("One line for people; shown by `envbuild list`.", default="")
    accelerator: Literal["cuda", "rocm", "cpu"] = _doc("The torch build: cuda, rocm or cpu.", _REQUIRED)
    cuda: Annotated[str, _Pattern(CUDA_RE, "a CUDA version", '"12.1"')] | None = _doc(
        'CUDA version of the torch build, quoted ("12.1"); required with accelerator: cuda, forbidden otherwise.'
    )
    rocm: Annotated[str, _Pattern(ROCM_RE, "a ROCm version", '"6.1" or "6.2.4"')] | None = _doc(
        'ROCm version of the torch build, quoted ("6.1"); required with accelerator: rocm, forbidden otherwise.'
    )
    python: Annotated[str, _Pattern(PYTHON_RE, "a Python version", '"3.11"', own=free_threaded)] = _doc(
        "Python minor version, quoted: YAML reads 3.10 as 3.1.", _REQUIRED
    )
    torch: Annotated[str, _Pattern(RELEASE_RE, "an exact torch release", '"2.3.1"', "torch")] = _doc(
        'An exact torch release, quoted ("2.3.1").', _REQUIRED
    )
    torchvision: VersionOrAuto | None = _doc('An exact release, or "auto" for the one that matches torch.')
    torchaudio: VersionOrAuto | None = _doc('An exact release, or "auto" for the one that matches torch.')
    numpy: Annotated[str, _Pattern(RELEASE_RE, "an exact numpy release", '"1.26.4"', "numpy")] = _doc(
        'An exact numpy release, quoted ("1.26.4"); numpy 2 needs torch >= 2.3.', _REQUIRED
    )
    flavor: Literal["venv", "conda"] = _doc("venv (uv lockfiles) or conda (conda-lock format).", default="venv")
    base: Annotated[str, _Pattern(IMAGE_RE, "an image reference", '"ubuntu:22.04@sha256:<64 hex>"')] | None = _doc(
        "Base image instead of the compat data's default; pin it by digest."
    )
    packages: list[Annotated[str, AfterValidator(_requirement)]] = _doc(
        'Extra PEP 508 requirements, e.g. "einops==0.8.0" (torch, torchvision, torchaudio, numpy: own fields).',
        default_factory=list,
    )
    build_requires: dict[PackageName, list[PackageName]] = _doc(
        "Sdists that import at build time what they do not declare (torch-scatter, apex: torch): {package: "
        "[names]}; their builds get each name at the version the lockfile pins, which must pin it.",
        default_factory=dict,
    )
    apt: list[Annotated[str, _Pattern(APT_RE, "a Debian package name", '"git" or "git=1:2.39.5-0+deb12u1"')]] = _doc(
        'OS packages for the image, optionally pinned: "git=1:2.39.5-0+deb12u1".', default_factory=list
    )
    apt_snapshot: (
        Annotated[str, _Pattern(APT_SNAPSHOT_RE, "a snapshot timestamp or auto", '"20250101T000000Z" or "auto"')] | None
    ) = _doc(
        "Install OS packages from Debian's or Ubuntu's dated snapshot archive: a timestamp, or auto (the date "
        "`envbuild lock` resolved apt.lock), so an old apt.lock still builds after the live archive dropped its "
        "versions."
    )
    env: EnvVars = _doc('Environment variables of the image; values are strings ("8", not 8).', default_factory=dict)
    platforms: list[Platform] = _doc("Platforms to lock for.", default_factory=lambda: list[Platform](["x86_64"]))
    index_url: Url | None = _doc("A PyPI mirror (simple API) for everything but the torch family.")
    torch_index: Url | None = _doc("A mirror of the PyTorch index for this build (e.g. .../whl/cu121).")
    find_links: list[Text] = _doc(
        "Local wheelhouses; $VARS expand, relative paths are from the project.", default_factory=list
    )
    channels: list[Annotated[str, _Pattern(CHANNEL_RE, "a conda channel", '"conda-forge"')]] = _doc(
        "Conda channels, in priority order (conda flavor).", default_factory=lambda: ["conda-forge"]
    )
    conda_packages: list[Annotated[str, _Pattern(MATCH_SPEC_RE, "a conda match spec", '"libjpeg-turbo=3.0"')]] = _doc(
        "Extra conda match specs (conda flavor).", default_factory=list
    )
    devel: bool = _doc(
        "CUDA profiles: build on NVIDIA's CUDA devel image (nvcc, headers) instead of the slim default base. "
        "A name ending in -devel means the same when this is not set.",
        default=False,
    )
    compile: bool = _doc(
        "Carry what torch.compile and C++ extensions need (a C/C++ compiler, ninja and the Python headers, "
        "~150-200 MB); false for "
        "inference-only images, and the smoke test's compile check is then skipped.",
        default=True,
    )
    checks: list[Annotated[str, _CHECK_PATH]] = _doc(
        "The project's own smoke checks: scripts (relative to the project) that run in the image with the "
        "smoke test and pass when they exit 0.",
        default_factory=list,
    )
    registry: Annotated[str, _Pattern(REGISTRY_RE, "a registry path", '"ghcr.io/acme/envs"')] | None = _doc(
        "Where push and pull go: HOST[:PORT]/PATH."
    )

    @model_validator(mode="before")
    @classmethod
    def _devel_shorthand(cls, data: Any) -> Any:
        # `cu121-py311-devel` without `devel:` keeps meaning the devel base; validate says so.
        if isinstance(data, dict) and "devel" not in data and str(data.get("name", "")).endswith("-devel"):
            return {**data, "devel": True}
        return data

    @property
    def accelerator_version(self) -> str | None:
        return self.cuda if self.accelerator == "cuda" else self.rocm if self.accelerator == "rocm" else None

    @property
    def build_tag(self) -> str:
        """The PyTorch index name of this build: cu121, rocm6.1, cpu."""
        if self.accelerator == "cuda" and self.cuda:
            return "cu" + self.cuda.replace(".", "")
        if self.accelerator == "rocm" and self.rocm:
            return "rocm" + self.rocm
        return "cpu"

    def digest(self) -> str:
        """sha256 of the whole resolved profile (what labels and pull --verify compare); build_requires,
        which came later, only when set, so every earlier profile keeps its digest."""
        return json_sha256(self.model_dump(mode="json", exclude=None if self.build_requires else {"build_requires"}))


FIELDS = list(Profile.model_fields)


def _pydantic_diagnostics(loaded: Loaded, exc: ValidationError) -> None:
    pre_flagged = set(loaded.bad_fields)
    # an `extends` not followed (a cycle, no such file) is the error, not each field it would bring
    unfollowed = any(d.severity == "error" and d.field == "extends" for d in loaded.diagnostics)
    for err in exc.errors(include_url=False):
        loc, kind, value = tuple(err["loc"]), err["type"], err.get("input")
        key = str(loc[0]) if loc else ""
        if key in pre_flagged or (kind == "missing" and unfollowed):
            continue
        field_name = key + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc[1:])
        if kind == "extra_forbidden":
            close = difflib.get_close_matches(key, FIELDS, n=1, cutoff=0.6)
            fix = f"did you mean `{close[0]}`?" if close else f"known keys: {', '.join(FIELDS)}"
            loaded.add("error", key, f"unknown key {key!r}", fix)
        elif kind == "missing":
            loaded.add("error", key, "is required", f"add `{key}:` to the profile")
        elif kind == "literal_error":
            allowed = err.get("ctx", {}).get("expected", "")
            close = difflib.get_close_matches(str(value), re.findall(r"'([^']+)'", allowed), n=1)
            loaded.add(
                "error",
                field_name,
                f"{str(value)[:80]!r} is not allowed",
                f"use {close[0]!r}" if close else f"use one of {allowed}",
                value,
                loc=loc,
            )
        elif kind == PROBLEM:
            ctx = err.get("ctx", {})
            loaded.add("error", field_name, str(ctx.get("problem", "")), str(ctx.get("fix", "")), value, loc=loc)
        elif kind in {"string_type", "list_type", "dict_type", "int_type"}:
            want = {
                "string_type": "a string",
                "list_type": "a list",
                "dict_type": "a mapping",
                "int_type": "an integer",
            }[kind]
            fix = (
                f'quote it: {key}: "{value}"'
                if kind == "string_type" and isinstance(value, (int, float))
                else f"make it {want}"
            )
            loaded.add(
                "error",
                field_name,
                f"must be {want}, not {type(value).__name__}",
                fix,
                value,
                loc=loc,
            )
        else:
            loaded.add("error", field_name, err["msg"], "", value, loc=loc)
        loaded.bad_fields.add(key)


def load(path: Path, shown: str | None = None) -> Loaded:
    """Load, merge `extends`, and check the structure. Never raises for bad input."""
    loaded = read_raw(path, shown)
    if not loaded.data and loaded.errors:
        return loaded
    merged = loaded.data
    try:
        loaded.profile = Profile.model_validate({k: v for k, v in merged.items() if k not in loaded.bad_fields})
    except ValidationError as exc:
        _pydantic_diagnostics(loaded, exc)
    if loaded.bad_fields and loaded.profile is not None:
        loaded.profile = None
    return loaded


def file_schema() -> dict[str, Any]:
    """The JSON Schema of one profile file, for editors: completion, descriptions, typos and unquoted versions.

    Nothing is required here: with `extends` any field may come from another file, and fragments
    (`_base.yaml`) are partial by design. `envbuild validate` stays the authority on the merged
    profile and on compatibility, which no schema can express.
    """
    schema = Profile.model_json_schema()
    schema.pop("required", None)
    # Draft-07: the newest draft every YAML language server reads, and all these keywords need.
    return {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "$comment": "Generated by `envbuild schema`; do not edit.",
        **schema,
        "title": "envbuild profile",
        "description": "One file in profiles/. Unknown keys are errors; quote every version. "
        "`envbuild validate` checks the merged profile against the PyTorch compatibility data.",
    }


def file_schema_text() -> str:
    return json.dumps(file_schema(), indent=2, sort_keys=True) + "\n"
