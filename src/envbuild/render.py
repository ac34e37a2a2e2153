"""Jinja rendering of the Dockerfile and the lock inputs.

Every profile value that reaches a shell or a Dockerfile instruction goes
through a filter here that either quotes it or refuses it; the templates never
interpolate a raw profile string.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from envbuild import __version__, compat
from envbuild.errors import RenderError
from envbuild.profile import Profile

PYPI_SIMPLE = "https://pypi.org/simple"
TORCH_INDEX_ROOT = "https://download.pytorch.org/whl"
# Packages that must come from the same place as torch: its own builds and the
# GPU runtime wheels that carry CUDA or ROCm.
TORCH_FAMILY_RE = re.compile(
    r"^(torch|torchvision|torchaudio|triton|pytorch-triton(-rocm|-xpu)?|nvidia-.+|cuda-.+|rocm-.+)$"
)

TEMPLATE_NAMES = {
    "venv": ("Dockerfile.venv.j2", "requirements.in.j2", "lock-input.toml.j2"),
    "conda": ("Dockerfile.conda.j2", "environment.yml.j2"),
}
OUTPUT_NAMES = {
    "Dockerfile.venv.j2": "Dockerfile",
    "Dockerfile.conda.j2": "Dockerfile",
    "requirements.in.j2": "requirements.in",
    "lock-input.toml.j2": "lock-input.toml",
    "environment.yml.j2": "environment.yml",
}


def default_templates_dir() -> Path:
    """Templates shipped with envbuild: in the wheel, or the checkout's top-level templates/."""
    packaged = Path(str(resources.files("envbuild"))) / "_templates"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parents[2] / "templates"


@dataclass(frozen=True)
class TorchSource:
    """Where the torch family is resolved from, for one profile."""

    route: str  # "pypi" (PyPI's default wheel is this build) or "index"
    index_url: str  # the PyPI (mirror) URL
    torch_index: str | None  # explicit index for the torch family, when route == "index"
    torch_index_flat: bool
    find_links: tuple[str, ...]


def torch_source(
    profile: Profile,
    *,
    index_url: str | None = None,
    torch_index: str | None = None,
    find_links: tuple[str, ...] = (),
) -> TorchSource:
    db = compat.load()
    row = db.release(profile.torch)
    index = index_url or profile.index_url or PYPI_SIMPLE
    links = tuple(find_links) or tuple(profile.find_links)
    on_pypi = (
        profile.accelerator == "cuda"
        and row is not None
        and row.pypi_cuda == profile.cuda
        and "aarch64" not in profile.platforms
    )
    explicit = torch_index or profile.torch_index
    if on_pypi and not explicit:
        return TorchSource("pypi", index, None, False, links)
    if explicit:
        url, flat = _as_url(explicit)
    elif links:
        # An air-gapped wheelhouse stands in for the PyTorch index.
        url, flat = _as_url(links[0])
    else:
        url, flat = f"{TORCH_INDEX_ROOT}/{profile.build_tag}", False
    return TorchSource("index", index, url, flat, links)


_CREDENTIALS = re.compile(r"(?<=://)[^/@\s]+@")


def redact(text: str) -> str:
    """URLs with their user:password@ part replaced, for anything written or printed."""
    return _CREDENTIALS.sub("***@", text)


def without_credentials(url: str) -> str:
    """A URL with its user:password@ part dropped, for a value that must stay a plain URL (a label)."""
    return _CREDENTIALS.sub("", url)


def _as_url(location: str) -> tuple[str, bool]:
    """A URL for an index or wheelhouse; local folders are flat (find-links style) indexes."""
    if location.startswith(("http://", "https://")):
        return location.rstrip("/"), location.endswith((".html", "/links"))
    path = location.removeprefix("file://")
    return Path(path).resolve().as_uri(), True


# ---- filters: the only ways a profile value may reach the output ----------------------------

_SAFE_TOKEN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+:=~@/-]*$")


def _dq(value: object) -> str:
    """A Dockerfile double-quoted string (ENV/ARG/LABEL): escapes \\, " and $."""
    text = str(value)
    if any(ord(c) < 32 for c in text):
        raise RenderError(f"value {text[:40]!r} contains a control character")
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$") + '"'


def _token(value: object) -> str:
    """A bare word for a shell command line; anything else is refused, not escaped."""
    text = str(value)
    if not _SAFE_TOKEN.fullmatch(text):
        raise RenderError(f"value {text[:40]!r} is not safe as a shell word")
    return text


def _sh(value: object) -> str:
    text = str(value)
    if any(ord(c) < 32 for c in text):
        raise RenderError(f"value {text[:40]!r} contains a control character")
    return shlex.quote(text)


def _toml(value: object) -> str:
    return json.dumps(str(value))


def _yaml(value: object) -> str:
    return json.dumps(str(value))


def _env() -> Any:
    import jinja2  # heavy-ish; only commands that render pay for it

    return jinja2


_BUILDER_LABEL_KEYS = frozenset({"io.envbuild.profile", "io.envbuild.lock-sha256", "org.opencontainers.image.source"})


def context(
    profile: Profile,
    *,
    base: str | None = None,
    source: TorchSource | None = None,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    db = compat.load()
    row = db.release(profile.torch)
    if row is None:
        raise RenderError(f"torch {profile.torch} is not in the compat data; cannot pick matching packages")
    base_info = db.bases.python.get(profile.python)
    if base or profile.base:
        image, python_from = (base or profile.base or ""), "apt"
    elif profile.is_devel and profile.accelerator == "cuda":
        image, python_from = db.bases.devel.image_pattern.format(cuda=profile.cuda), "apt"
    elif base_info is not None:
        image, python_from = base_info.image, base_info.python_from
    else:
        raise RenderError(f"no default base image for Python {profile.python}", hint="set `base:` in the profile")
    src = source or torch_source(profile)
    local = "" if src.route == "pypi" else f"+{profile.build_tag}"
    requirements = [f"torch=={profile.torch}"]
    extras = []
    if profile.torchvision:
        tv = compat.torchvision_for(row, profile.torch) if profile.torchvision == "auto" else profile.torchvision
        extras.append(("torchvision", tv))
    if profile.torchaudio:
        ta = compat.torchaudio_for(row, profile.torch) if profile.torchaudio == "auto" else profile.torchaudio
        extras.append(("torchaudio", ta))
    requirements += [f"{name}=={ver}" for name, ver in extras]
    requirements.append(f"numpy=={profile.numpy}")
    requirements += sorted(profile.packages, key=str.lower)
    return {
        "envbuild_version": __version__,
        "profile": profile,
        "name": profile.name,
        "base_image": image,
        "python_from": python_from,
        "python": profile.python,
        "python_bin": f"python{profile.python}",
        "apt": sorted(set(profile.apt)),
        "env": sorted(profile.env.items()),
        "requirements": requirements,
        "torch_family_names": sorted({"torch", *(n for n, _ in extras)}),
        "source": src,
        "local_tag": local,
        "build_tag": profile.build_tag,
        "channels": profile.channels,
        "conda_packages": sorted(profile.conda_packages),
        "uid": 1000,
        "labels": sorted((labels or {}).items()),
        # Only what stays put between commits (no created/revision): this LABEL step must stay cached.
        "builder_labels": sorted(
            [("io.envbuild.stage", "builder"), *((k, v) for k, v in labels.items() if k in _BUILDER_LABEL_KEYS)]
        )
        if labels
        else [],
    }


def make_environment(templates_dir: Path | None) -> Any:
    jinja2 = _env()
    search = [str(templates_dir)] if templates_dir else []
    search.append(str(default_templates_dir()))
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(search),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(dq=_dq, token=_token, sh=_sh, toml=_toml, yamlstr=_yaml)
    return env


def render_one(
    profile: Profile,
    template_name: str,
    *,
    templates_dir: Path | None = None,
    source: TorchSource | None = None,
    overrides: dict[str, Any] | None = None,
) -> str:
    """One template with context values replaced (the lock stage re-renders its input)."""
    env = make_environment(templates_dir)
    ctx = {**context(profile, source=source), **(overrides or {})}
    return str(env.get_template(template_name).render(ctx))


def render(
    profile: Profile,
    *,
    templates_dir: Path | None = None,
    base: str | None = None,
    source: TorchSource | None = None,
    labels: dict[str, str] | None = None,
) -> dict[str, str]:
    """Render every output of a profile: {file name: text}. Same inputs, same bytes."""
    jinja2 = _env()
    env = make_environment(templates_dir)
    ctx = context(profile, base=base, source=source, labels=labels)
    out: dict[str, str] = {}
    for template_name in TEMPLATE_NAMES[profile.flavor]:
        try:
            text = env.get_template(template_name).render(ctx)
        except jinja2.TemplateNotFound as exc:
            raise RenderError(
                f"template {exc.name} not found",
                hint="restore it in templates/ or remove the override",
            ) from exc
        except jinja2.TemplateSyntaxError as exc:
            raise RenderError(f"{exc.filename or template_name}:{exc.lineno}: {exc.message}") from exc
        except jinja2.UndefinedError as exc:
            raise RenderError(
                f"{template_name}: {exc.message}",
                hint="the template uses a variable envbuild does not provide",
            ) from exc
        out[OUTPUT_NAMES[template_name]] = text
    return out


def write_outputs(outputs: dict[str, str], directory: Path) -> list[Path]:
    """Write rendered files atomically, all or nothing."""
    from envbuild.fsutil import atomic_write_many

    return atomic_write_many({directory / name: text for name, text in sorted(outputs.items())})
