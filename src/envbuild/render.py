"""Jinja rendering of the Dockerfile and the lock inputs.

Every profile value that reaches a shell or a Dockerfile instruction goes
through a filter here that either quotes it or refuses it; the templates never
interpolate a raw profile string.
"""

from __future__ import annotations

import difflib
import functools
import json
import re
import shlex
from pathlib import Path
from typing import Any

from envbuild import __version__
from envbuild.errors import RenderError
from envbuild.names import (
    FIXED_MTIME,
    IMAGE_ENTRYPOINT,
    IMAGE_UID,
    LABEL_LAYER,
    LABEL_LAYER_SHA,
    LABEL_LOCK_SHA,
    LABEL_PROFILE,
    LABEL_SOURCE,
    LABEL_STAGE,
    LABEL_STAGE_SHA,
)
from envbuild.packagerules import IMAGE_ENV
from envbuild.plan import TEMPLATE_NAMES, Plan, default_templates_dir

OUTPUT_NAMES = {
    "Dockerfile.venv.j2": "Dockerfile",
    "Dockerfile.conda.j2": "Dockerfile",
    "requirements.in.j2": "requirements.in",
    "lock-input.toml.j2": "lock-input.toml",
    "environment.yml.j2": "environment.yml",
}


# ---- filters: the only ways a profile value may reach the output ----------------------------

_SAFE_TOKEN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+:=~@/-]*$")


def conda_held(plan: Plan) -> tuple[str, ...]:
    """What a conda image's constraints.txt holds, by pip's names: torch, numpy and triton (torch's
    compiler). At the versions the environment's metadata gives at build time
    (envbuild_smoke.constraints): conda-forge's torch can report another than its package's."""
    return tuple(sorted({*plan.torch_family, "numpy", "triton"} - set(conda_channel_only(plan))))


def conda_channel_only(plan: Plan) -> tuple[str, ...]:
    """torchvision and torchaudio: held as installed, or, where the environment lacks one, at `<0`.
    PyPI's are built for PyPI's torch and fail on import beside a conda channel's ("operator
    torchvision::nms does not exist"), and pip took them without a word."""
    return tuple(sorted(name for name, _ in plan.companions))


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


_BUILDER_LABEL_KEYS = frozenset({LABEL_PROFILE, LABEL_LOCK_SHA, LABEL_SOURCE})


# No apt.lock: the templates install what the archive serves today.
NO_APT: dict[str, Any] = {"apt_pins": None, "apt_snapshot_sh": "true", "apt_snapshot_undo_sh": "", "apt_dpkg_list": ""}


def context(
    plan: Plan,
    *,
    labels: dict[str, str] | None = None,
    apt: dict[str, Any] | None = None,
    layers: dict[str, tuple[str, ...]] | None = None,
    layer_digests: dict[str, str] | None = None,
    extra: dict[str, Any] | None = None,
    stage_digests: dict[str, str] | None = None,
) -> dict[str, Any]:
    """What the templates see: the plan's facts under the names the templates use. `apt` is what the
    build read from apt.lock (pins per stage, the snapshot and dpkg-list commands), else NO_APT."""
    profile = plan.profile
    return {
        "installer": "pip",
        "stage_only": "",  # one stage for a side build (buildahead.py); empty: the whole Dockerfile
        "stage_images": {},  # layer -> an image in the engine that a build takes for its stage (buildahead)
        "fixed_mtime": FIXED_MTIME,
        "seed": [],  # what the builder installs before the rest, in a step of its own (layering.seeded)
        "build_config": False,  # the builder's sdist builds get build_requires (layering.render_for)
        **(extra or {}),
        **(apt or NO_APT),
        # the image's environment layers (layering.layer_groups); without a lock (render): one layer
        "layer_groups": [g for g in (layers or {}) if g != "rest"],
        "envbuild_version": __version__,
        "profile": profile,
        "name": profile.name,
        "base_image": plan.base.image,
        "python_from": plan.base.python_from,
        "python": profile.python,
        "python_bin": plan.python_bin,
        # what each Dockerfile stage asks apt for: the plan's one list, which apt.lock pins too
        "apt_stages": plan.apt_stages,
        "env": sorted(profile.env.items()),
        # the settings the image's environment depends on (a profile's env may not set them)
        "image_env_names": sorted(IMAGE_ENV),
        "requirements": list(plan.requirements),
        "torch_family_names": list(plan.torch_family),
        "conda_held": list(conda_held(plan)) if profile.flavor == "conda" else [],
        "conda_channel_only": list(conda_channel_only(plan)) if profile.flavor == "conda" else [],
        "source": plan.source,
        "build_tag": profile.build_tag,
        "channels": profile.channels,
        "conda_packages": sorted(profile.conda_packages),
        "conda_specs": list(plan.conda_specs),
        "pip_specs": list(plan.pip_specs),
        "uid": IMAGE_UID,
        "entrypoint": json.dumps(list(IMAGE_ENTRYPOINT)),
        "stage_label": LABEL_STAGE,
        "layer_label": LABEL_LAYER,
        "labels": sorted((labels or {}).items()),
        # Only what stays put between commits (no created/revision): this LABEL step must stay cached.
        "builder_labels": sorted(
            [(LABEL_STAGE, "builder"), *((k, v) for k, v in labels.items() if k in _BUILDER_LABEL_KEYS)]
        )
        if labels
        else [],
        # A layer stage's: its own part of the lockfile, not the whole (see LABEL_LAYER_SHA)
        "layer_builder_labels": layer_cache_labels(labels, layer_digests, stage_digests) if labels else {},
    }


def layer_cache_labels(
    labels: dict[str, str], layer_digests: dict[str, str] | None, stage_digests: dict[str, str] | None = None
) -> dict[str, list[tuple[str, str]]]:
    """{layer: the labels its stage's cache image carries}: its own part of the lockfile, not the
    whole (see LABEL_LAYER_SHA), and what its steps are made of (LABEL_STAGE_SHA). The Dockerfile
    sets them; a build looks for them (buildahead)."""
    keep = _BUILDER_LABEL_KEYS - {LABEL_LOCK_SHA}
    stages = stage_digests or {}
    return {
        group: sorted(
            [
                (LABEL_STAGE, "builder"),
                (LABEL_LAYER_SHA, digest),
                *([(LABEL_STAGE_SHA, stages[group])] if group in stages else []),
                *((k, v) for k, v in labels.items() if k in keep),
            ]
        )
        for group, digest in (layer_digests or {}).items()
    }


@functools.lru_cache(maxsize=8)
def make_environment(templates_dir: Path | None) -> Any:
    """One per templates folder for the whole process: a build renders three times (its Dockerfile,
    the side stages', the one taking stage images), and each new environment compiled every
    template again (~30 ms each time). Jinja still reloads a template whose file changed."""
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


def render_one(plan: Plan, template_name: str, *, overrides: dict[str, Any] | None = None) -> str:
    """One template with context values replaced (the lock stage renders its input per step)."""
    ctx = {**context(plan), **(overrides or {})}
    return _rendered(make_environment(plan.templates_dir), template_name, ctx)


def render(
    plan: Plan,
    *,
    labels: dict[str, str] | None = None,
    apt: dict[str, Any] | None = None,
    layers: dict[str, tuple[str, ...]] | None = None,
    layer_digests: dict[str, str] | None = None,
    extra: dict[str, Any] | None = None,
    stages: tuple[str, ...] = (),
    stage_digests: dict[str, str] | None = None,
) -> dict[str, str]:
    """Render every output of a plan: {file name: text}. Same inputs, same bytes. `stages`: also
    the Dockerfile of each of these stages alone (with the ones it starts from), as "Dockerfile@STAGE"."""
    env = make_environment(plan.templates_dir)
    digests = {"layer_digests": layer_digests, "stage_digests": stage_digests}
    ctx = context(plan, labels=labels, apt=apt, layers=layers, extra=extra, **digests)
    out: dict[str, str] = {}
    for template_name in TEMPLATE_NAMES[plan.profile.flavor]:
        out[OUTPUT_NAMES[template_name]] = _rendered(env, template_name, ctx)
        if OUTPUT_NAMES[template_name] == "Dockerfile":
            # the stages a side build runs on its own, from the same lines (buildahead.py)
            for stage in stages:
                out[f"Dockerfile@{stage}"] = _rendered(env, template_name, {**ctx, "stage_only": stage})
    return out


def _rendered(env: Any, template_name: str, ctx: dict[str, Any]) -> str:
    """One template rendered, a project's override's mistakes said as the file, line and fix."""
    jinja2 = _env()
    try:
        return str(env.get_template(template_name).render(ctx))
    except jinja2.TemplateNotFound as exc:
        raise RenderError(
            f"template {exc.name} not found",
            hint="restore it in templates/ or remove the override",
        ) from exc
    except jinja2.TemplateSyntaxError as exc:
        raise RenderError(f"{exc.filename or template_name}:{exc.lineno}: {exc.message}") from exc
    except jinja2.UndefinedError as exc:
        raise _undefined(exc, template_name, ctx) from exc


def _undefined(exc: Any, template_name: str, ctx: dict[str, Any]) -> RenderError:
    """A template's use of a name envbuild does not provide, at the template's file and line (the
    innermost template frame: an imported macro's own file), with the nearest names it does."""
    where, tb = template_name, exc.__traceback__
    while tb is not None:  # Jinja writes each template frame as the template's own file and line
        if tb.tb_frame.f_code.co_filename.endswith(".j2"):
            where = f"{tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}"
        tb = tb.tb_next
    named = re.match(r"'(\w+)' is undefined", exc.message or "")
    near = difflib.get_close_matches(named.group(1), sorted(ctx), n=3) if named else []
    return RenderError(
        f"{where}: {exc.message}",
        hint="the template uses a variable envbuild does not provide"
        + (f"; did you mean {' or '.join(repr(n) for n in near)}?" if near else ""),
    )


def write_outputs(outputs: dict[str, str], directory: Path) -> list[Path]:
    """Write rendered files atomically, all or nothing."""
    from envbuild.fsutil import atomic_write_many

    return atomic_write_many({directory / name: text for name, text in sorted(outputs.items())})
