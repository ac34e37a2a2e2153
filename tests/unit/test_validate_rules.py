"""One test per validation rule, each asserting the located message and its fix."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from envbuild import validate


def errors_of(path: Path) -> list[str]:
    return [d.render() for d in validate.check(path, path.name).errors]


def only_error(path: Path) -> str:
    errs = errors_of(path)
    assert len(errs) == 1, errs
    return errs[0]


def test_shipped_matrix_is_valid() -> None:
    shipped = Path(__file__).resolve().parents[2] / "profiles"
    names = sorted(p for p in shipped.glob("*.yaml") if not p.name.startswith("_"))
    assert len(names) >= 9
    for path in names:
        assert errors_of(path) == [], path


def test_valid_profile_has_no_diagnostics(write_profile: Callable[..., Path]) -> None:
    loaded = validate.check(write_profile())
    assert loaded.diagnostics == []
    assert loaded.profile is not None and loaded.profile.build_tag == "cu121"


def test_a_direct_url_requirement_is_refused_with_the_release_to_pin(write_profile: Callable[..., Path]) -> None:
    """It validated and locked, but the lock's pins (and so pylock.toml, the SBOM, the smoke test's
    checks and the edit check) left it out; a git URL has no hash for --require-hashes at all."""
    url = "https://files.pythonhosted.org/packages/87/62/abc/einops-0.8.1-py3-none-any.whl"
    loaded = validate.check(write_profile(packages=[f"einops @ {url}"]))
    assert len(loaded.errors) == 1
    text = loaded.errors[0].render()
    assert "a direct URL is not a release the lockfiles can pin with its hash" in text
    assert '"einops==0.8.1"' in text
    loaded = validate.check(write_profile(packages=["einops @ git+https://github.com/arogozhnikov/einops@v0.8.1"]))
    assert "find_links folder" in loaded.errors[0].render()


def test_a_python_the_smoke_test_cannot_run_on_is_refused_though_torch_has_wheels_for_it(
    write_profile: Callable[..., Path],
) -> None:
    """torch 1.13 has Python 3.7 wheels, so this validated, and the image's smoke test could not
    even start (importlib.metadata came with 3.8)."""
    fields = {"accelerator": "cpu", "cuda": None, "torchvision": None, "torch": "1.13.1", "numpy": "1.21.6"}
    base = "python:3.7-slim-bullseye@sha256:" + "0" * 64
    msg = only_error(write_profile("cpu-py37", name="cpu-py37", python="3.7", base=base, **fields))
    assert msg == (
        "cpu-py37.yaml:3: python: Python 3.7 cannot run envbuild's smoke test, which runs in the image: it needs "
        '3.8+; use python "3.8"'
    )
    assert errors_of(write_profile("cpu-py38", name="cpu-py38", python="3.8", base=base, **fields)) == []


def test_python_outside_torch_range(write_profile: Callable[..., Path]) -> None:
    msg = only_error(
        write_profile(
            "cu118-py312",
            name="cu118-py312",
            cuda="11.8",
            python="3.12",
            torch="2.0.1",
            torchvision="0.15.2",
        )
    )
    assert "python: torch 2.0.1 has no wheel for Python 3.12 (it supports 3.8-3.11)" in msg
    assert 'use python "3.11" or torch >= 2.2' in msg
    assert msg.startswith("cu118-py312.yaml:4: ")


def test_free_threaded_python_is_named_as_such_with_the_standard_interpreter_as_the_fix(
    write_profile: Callable[..., Path],
) -> None:
    msg = only_error(write_profile(python="3.11t"))
    assert msg.endswith(
        "python: '3.11t' is free-threaded Python (PEP 703): envbuild does not build it; "
        'write "3.11", the standard interpreter of that version'
    ), msg


def test_cuda_build_that_does_not_exist(write_profile: Callable[..., Path]) -> None:
    msg = only_error(write_profile(torch="2.0.1", torchvision="0.15.2"))
    assert msg == (
        "cu121-py311.yaml:3: cuda: torch 2.0.1 has no CUDA 12.1 build (it has 11.7, 11.8); "
        # the name says cu121 too: both steps of that fix at once (issue 24), not one error after the other
        'use cuda "11.8" and rename the profile to cu118-py311 (its file and `name:`), or torch 2.1-2.5'
    )


def test_rocm_build_that_does_not_exist(write_profile: Callable[..., Path]) -> None:
    path = write_profile(
        "rocm61-py311",
        name="rocm61-py311",
        accelerator="rocm",
        cuda=None,
        rocm="6.1",
        torch="2.7.1",
        torchvision="0.22.1",
        numpy="2.2.6",
    )
    msg = only_error(path)
    assert "rocm: torch 2.7.1 has no ROCm 6.1 build (it has 6.2.4, 6.3)" in msg
    # the name says rocm61 too: one fix for both, as for CUDA (it said "use rocm 6.3", then the name was the next error)
    assert 'use rocm "6.3" and rename the profile to rocm63-py311 (its file and `name:`), or torch 2.4-2.6' in msg


def test_numpy2_with_old_torch(write_profile: Callable[..., Path]) -> None:
    msg = only_error(write_profile(torch="2.2.2", torchvision="0.17.2", numpy="2.0.2"))
    assert "numpy: torch 2.2.2 was compiled against NumPy 1.x and fails with numpy 2.0.2" in msg
    assert 'use numpy "1.26.4" or torch >= 2.3' in msg


def test_numpy_without_wheels_for_python(write_profile: Callable[..., Path]) -> None:
    fields = {"name": "cu126-py313", "cuda": "12.6", "python": "3.13", "torch": "2.7.1", "torchvision": "0.22.1"}
    msg = only_error(write_profile("cu126-py313", **fields, numpy="1.26.4"))
    assert "numpy: numpy 1.26 supports Python 3.9-3.12, not 3.13" in msg
    # the fix names the series to take, and taking it validates
    assert "use a numpy 2.5.x release (numpy 2.1-2.5 fit Python 3.13 and torch 2.7.1)" in msg
    assert errors_of(write_profile("cu126-py313", **fields, numpy="2.5.0")) == []


def test_numpy_for_python_under_a_torch_that_needs_numpy_1(write_profile: Callable[..., Path]) -> None:
    # torch 2.2 allows only numpy 1.x: on Python 3.12 that leaves 1.26, not the newest numpy
    path = write_profile(
        "cu121-py312", name="cu121-py312", python="3.12", torch="2.2.2", torchvision="0.17.2", numpy="1.24.4"
    )
    msg = only_error(path)
    assert "numpy 1.24 supports Python 3.8-3.11, not 3.12" in msg
    assert "use a numpy 1.26.x release (numpy 1.26 alone fits Python 3.12 and torch 2.2.2)" in msg


def test_torchvision_mismatch(write_profile: Callable[..., Path]) -> None:
    msg = only_error(write_profile(torchvision="0.17.0"))
    assert "torchvision 0.17.0 does not match torch 2.3.1 (it pairs with torchvision 0.18.x)" in msg
    assert 'use torchvision: "0.18.1" or "auto"' in msg


def test_torchaudio_mismatch(write_profile: Callable[..., Path]) -> None:
    msg = only_error(write_profile(torchaudio="2.2.0"))
    assert "torchaudio: torchaudio 2.2.0 does not match torch 2.3.1" in msg and 'use torchaudio: "2.3.1"' in msg


def test_torchvision_exact_pairing_from_data(write_profile: Callable[..., Path]) -> None:
    msg = only_error(
        write_profile(
            "cu118-py310",
            name="cu118-py310",
            cuda="11.8",
            python="3.10",
            torch="2.0.1",
            torchvision="0.16.0",
        )
    )
    assert 'use torchvision: "0.15.2"' in msg


def test_name_and_accelerator_disagree(write_profile: Callable[..., Path]) -> None:
    msg = only_error(write_profile("cpu-py311", name="cpu-py311"))
    assert "accelerator: 'cuda' disagrees with the name 'cpu-py311'" in msg
    assert "set accelerator: cpu or rename the profile" in msg


def test_name_and_cuda_version_disagree(write_profile: Callable[..., Path]) -> None:
    msg = only_error(write_profile("cu118-py311", name="cu118-py311"))
    assert "cuda: '12.1' disagrees with the name 'cu118-py311'" in msg and 'set cuda: "11.8"' in msg


def test_name_and_python_disagree(write_profile: Callable[..., Path]) -> None:
    msg = only_error(write_profile("cu121-py310", name="cu121-py310"))
    assert "python: '3.11' disagrees with the name 'cu121-py310' (py310)" in msg and 'set python: "3.10"' in msg


def test_rocm_token_with_three_digits(write_profile: Callable[..., Path]) -> None:
    path = write_profile(
        "rocm624-py312",
        name="rocm624-py312",
        accelerator="rocm",
        cuda=None,
        rocm="6.2.4",
        python="3.12",
        torch="2.7.1",
        torchvision="0.22.1",
        numpy="2.2.6",
    )
    assert errors_of(path) == []


def test_name_differs_from_file(write_profile: Callable[..., Path]) -> None:
    msg = only_error(write_profile("cu121-py311-x"))
    assert "name: 'cu121-py311' differs from the file name 'cu121-py311-x.yaml'" in msg


def test_missing_accelerator_version(write_profile: Callable[..., Path]) -> None:
    msg = only_error(write_profile(cuda=None))
    assert msg == 'cu121-py311.yaml: cuda: is required with accelerator: cuda; add cuda: "12.1"'


def test_accelerator_version_for_wrong_accelerator(write_profile: Callable[..., Path]) -> None:
    msg = only_error(write_profile(rocm="6.1"))
    assert "rocm: is given but accelerator is cuda; remove `rocm:` or set accelerator: rocm" in msg


def test_unknown_key_with_suggestion(write_profile: Callable[..., Path]) -> None:
    msg = only_error(write_profile(torchvison="0.18.1"))
    assert msg.endswith("torchvison: unknown key 'torchvison'; did you mean `torchvision`?")


def test_malformed_yaml_has_line_and_column(write_profile: Callable[..., Path]) -> None:
    msg = only_error(write_profile(text="name: cu121-py311\npython: [3.11\ntorch: 2\n"))
    assert msg.startswith("cu121-py311.yaml:3: malformed YAML") and "(column" in msg


def test_a_tab_in_the_indentation_is_named_with_its_fix(write_profile: Callable[..., Path]) -> None:
    # an editor that keeps tabs: YAML's own words ("cannot start any token") do not say what is wrong
    msg = only_error(write_profile(text='name: cu121-py311\nenv:\n\tA: "1"\n'))
    assert msg.startswith("cu121-py311.yaml:3: malformed YAML: found character that cannot start any token (a tab")
    assert msg.endswith("replace the tab with spaces (e.g. two per level)")
    assert "tab" not in only_error(write_profile(text="name: cu121-py311\npython: [3.11\ntorch: 2\n"))


def test_bad_pep508(write_profile: Callable[..., Path]) -> None:
    msg = only_error(write_profile(packages=["einops==0.8.0", "not a requirement!"]))
    assert "packages[1]: 'not a requirement!' is not a PEP 508 requirement" in msg
    assert 'write e.g. "einops==0.8.0"' in msg


@pytest.mark.parametrize("item", ["einops = 0.8.1", "einops 0.8.1", "einops: 0.8.1", "einops=0.8.1"])
def test_a_pin_written_another_tools_way_is_told_the_pin_to_write(
    write_profile: Callable[..., Path], item: str
) -> None:
    # YAML's, a freeze list's or a typo's pin got "write e.g. einops==0.8.0": another version than theirs
    assert only_error(write_profile(packages=[item])).endswith('write "einops==0.8.1"')


@pytest.mark.parametrize("item", ["git+https://github.com/acme/tools@v1.2", "-e .", "./tools", "/srv/tools"])
def test_a_pip_command_line_item_in_packages_is_told_how_to_pin_its_wheel(
    write_profile: Callable[..., Path], item: str
) -> None:
    """What pip takes on its command line (a git URL, a path, `-e .`) got "write e.g. einops==0.8.0"."""
    msg = only_error(write_profile(packages=[item]))
    assert f"packages[0]: {item!r} is not a PEP 508 requirement" in msg
    assert msg.endswith(
        "packages are releases (NAME==VERSION); for a build of your own (a git checkout, a private wheel), put its "
        "wheel in a find_links folder and pin its version"
    )


def test_env_may_not_replace_what_the_image_sets_for_its_environment(write_profile: Callable[..., Path]) -> None:
    """`env: {PATH: "/opt/tools/bin:$PATH"}` was written last and literally: the image had no `python`."""
    msg = only_error(write_profile(env={"PATH": "/opt/tools/bin:$PATH", "OMP_NUM_THREADS": "4"}))
    assert "env: PATH is the image's own setting" in msg and "`python` is no longer the environment's" in msg
    assert msg.endswith("add tools in an image built FROM this one (ENV PATH=/opt/tools/bin:$PATH)")
    msg = only_error(write_profile(env={"PIP_CONSTRAINT": ""}))
    assert "env: PIP_CONSTRAINT is the image's own setting: it holds the tested torch build and numpy" in msg
    from envbuild import validate

    loaded = validate.check(write_profile(env={"OMP_NUM_THREADS": "4", "HF_HOME": "$HOME/.cache/hf", "PRICE": "5$"}))
    assert not loaded.errors
    # Docker's own ENV would expand $HOME; envbuild writes the value as it is, so it says so
    assert [d.render().split(": ", 1)[1] for d in loaded.warnings if d.field == "env"] == [
        "env: HF_HOME: $HOME is not expanded: the image's HF_HOME is '$HOME/.cache/hf', as written; "
        "write the value out in full"
    ]


def test_every_setting_env_may_not_replace_is_one_the_dockerfiles_set() -> None:
    """packagerules.IMAGE_ENV against the rendered Dockerfiles: a name the templates stop setting is
    no longer the image's, and a profile may set it again."""
    import re

    from envbuild.packagerules import IMAGE_ENV
    from tests.conftest import REPO

    golden = REPO / "tests" / "golden"
    set_here = {
        name
        for dockerfile in (golden / "cpu-py311" / "Dockerfile", golden / "cpu-py311-conda" / "Dockerfile")
        for statement in re.findall(r"^ENV (.*?)(?<!\\)\n", dockerfile.read_text(), re.M | re.S)
        for name in re.findall(r"(?:^|\s)([A-Z_]+)=", statement)
    }
    # PYTHONHOME is the one the images leave unset: any value of it stops Python
    assert set(IMAGE_ENV) - set_here == {"PYTHONHOME"}


def test_a_registry_path_in_upper_case_is_given_back_in_lower_case(write_profile: Callable[..., Path]) -> None:
    """An organisation as GitHub shows it (Acme/Envs) was only "write it like ghcr.io/acme/envs"."""
    msg = only_error(write_profile(registry="ghcr.io/Acme/Vision-Envs"))
    assert msg.endswith(
        "'ghcr.io/Acme/Vision-Envs' is not a registry path; image paths are lower case: write ghcr.io/acme/vision-envs"
    )
    msg = only_error(write_profile(registry="ghcr.io/Acme Envs"))  # not only the case: the example, as before
    assert msg.endswith('write it like "ghcr.io/acme/envs"')


def test_a_check_path_with_a_space_names_the_character_and_a_path_that_works(
    write_profile: Callable[..., Path],
) -> None:
    """A script in `checks dir/my check.py` was "not a Python script in the project": it is one; the
    space is what the image's copy and run by name cannot take."""
    msg = only_error(write_profile(checks=["checks dir/my check.py"]))
    assert msg.endswith(
        "checks[0]: 'checks dir/my check.py' holds a space: a check's path may hold letters, digits and _ . / - only "
        "(it is copied into the image and run by name); rename the file, e.g. checks_dir/my_check.py"
    )
    assert "holds '+', 'é'" in only_error(write_profile(checks=["checks/é+1.py"]))
    # a path outside the project is not a question of characters: the example, as before
    assert only_error(write_profile(checks=["../train.py"])).endswith('write it like "checks/train_tiny.py"')


def test_torch_in_packages_is_refused(write_profile: Callable[..., Path]) -> None:
    msg = only_error(write_profile(packages=["torch==2.3.1"]))
    assert "set `torch:` instead" in msg


def test_bad_image_reference(write_profile: Callable[..., Path]) -> None:
    msg = only_error(write_profile(base="Ubuntu:22.04 && rm -rf /"))
    assert "base: 'Ubuntu:22.04 && rm -rf /' is not an image reference" in msg


def test_unpinned_base_is_a_warning(write_profile: Callable[..., Path]) -> None:
    loaded = validate.check(write_profile(base="ubuntu:22.04"))
    assert loaded.errors == []
    assert "append @sha256:<digest>" in loaded.warnings[0].render()


def test_unquoted_version_number(write_profile: Callable[..., Path]) -> None:
    text = "name: cu121-py311\naccelerator: cuda\ncuda: 12.1\npython: 3.10\ntorch: 2.3.1\nnumpy: 1.26.4\n"
    errs = errors_of(write_profile(text=text))
    assert 'cu121-py311.yaml:4: python: 3.10 is a number in YAML (it reads as 3.1); quote it: python: "3.10"' in errs
    assert any('quote it: cuda: "12.1"' in e for e in errs)


def test_an_unquoted_series_where_a_release_belongs_gets_the_whole_fix_at_once(
    write_profile: Callable[..., Path],
) -> None:
    """`torch: 2.3` reads as a number; quoting it alone ("2.3") would only meet the next error (not a
    release), so the fix names the series' first release and where its newest is found."""
    text = "name: cu121-py311\naccelerator: cuda\ncuda: '12.1'\npython: '3.11'\ntorch: 2.3\nnumpy: 1.26.4\n"
    errs = errors_of(write_profile(text=text))
    assert (
        "cu121-py311.yaml:5: torch: 2.3 is a number in YAML (it reads as 2.3); quote it as a whole release: "
        'torch: "2.3.0" is the 2.3 series\' first; `envbuild outdated` names the newest 2.3.x of a locked profile, '
        "`envbuild new NAME --torch 2.3` picks it for a new one"
    ) in errs, errs


def test_every_problem_at_once(write_profile: Callable[..., Path]) -> None:
    errs = errors_of(write_profile(torch="2.0.1", torchvision="0.16.0", numpy="2.0.0", flavor="venvv", bogus=1))
    fields = {e.split(": ", 2)[1] for e in errs}
    assert {"cuda", "numpy", "torchvision", "flavor", "bogus"} <= fields


def test_unknown_old_torch_is_error_new_is_warning(write_profile: Callable[..., Path]) -> None:
    assert "torch 1.12.1 is not supported" in only_error(write_profile(torch="1.12.1", torchvision=None))
    loaded = validate.check(write_profile(torch="2.99.0", torchvision=None))
    assert loaded.errors == [] and "newer than envbuild's compat data" in loaded.warnings[0].message


def test_unverified_release_warns(write_profile: Callable[..., Path]) -> None:
    path = write_profile(
        "cu130-py313",
        name="cu130-py313",
        cuda="13.0",
        python="3.13",
        torch="2.15.0",
        torchvision=None,
        numpy="2.3.5",
    )
    loaded = validate.check(path)
    assert loaded.errors == []
    assert any("unverified" in w.message for w in loaded.warnings)


def _conda(write_profile: Callable[..., Path], build: str = "cpu", **fields: object) -> Path:
    """A conda profile for Python 3.12 and torch 2.7.1 on `build` (cpu, rocm63), with `fields` over it."""
    accel = {"accelerator": "rocm", "rocm": "6.3"} if build.startswith("rocm") else {"accelerator": "cpu"}
    name = f"{build}-py312"
    base = {"name": name, "cuda": None, "python": "3.12", "torch": "2.7.1", "torchvision": None, "numpy": "2.2.6"}
    return write_profile(name, **{**base, **accel, "flavor": "conda", **fields})


def test_pytorch_conda_channel_after_2_5(write_profile: Callable[..., Path]) -> None:
    path = _conda(write_profile, channels=["pytorch"])
    assert "the pytorch conda channel stopped after 2.5" in only_error(path)


def test_a_rocm_conda_profile_is_refused_not_locked_with_a_cpu_torch(write_profile: Callable[..., Path]) -> None:
    """conda_specs asks for `pytorch=X=cuda*` or `=cpu*`: a ROCm profile got a CPU torch, and only
    the smoke test of the built image would have said so."""
    path = _conda(write_profile, "rocm63")
    flavor_line = path.read_text().splitlines().index("flavor: conda") + 1
    assert only_error(path) == (
        f"{path.name}:{flavor_line}: flavor: conda channels have no ROCm build of torch "
        "(conda-forge's pytorch is CPU or CUDA); use flavor: venv, which installs the PyTorch index's ROCm wheels"
    )


def test_a_venv_profiles_conda_fields_are_named_not_dropped(write_profile: Callable[..., Path]) -> None:
    """`conda_packages: [ffmpeg]` on a venv profile validated, and the image had no ffmpeg."""
    path = write_profile(conda_packages=["ffmpeg"])
    assert "conda_packages: is for conda profiles: a venv profile installs no conda package" in only_error(path)
    assert "an OS package goes in apt:" in only_error(path)
    loaded = validate.check(write_profile(channels=["conda-forge"]))
    assert loaded.errors == [] and [w.field for w in loaded.warnings] == ["channels"]


def test_devel_on_a_cpu_profile_is_named_as_unused(write_profile: Callable[..., Path]) -> None:
    """`devel: true` picks NVIDIA's devel image for CUDA only: a CPU profile kept its base silently."""
    path = write_profile("cpu-py311", name="cpu-py311", accelerator="cpu", cuda=None, devel=True)
    loaded = validate.check(path)
    assert loaded.errors == [] and [w.field for w in loaded.warnings] == ["devel"]
    assert "is for CUDA profiles" in loaded.warnings[0].message


def test_a_conda_profiles_torch_index_is_named_as_unused(write_profile: Callable[..., Path]) -> None:
    """A mirror of the PyTorch index on a conda profile was silently never asked."""
    path = _conda(write_profile, torch_index="https://mirror.example/whl/cpu")
    loaded = validate.check(path)
    assert loaded.errors == [] and [w.field for w in loaded.warnings] == ["torch_index"]
    assert "this index is never asked" in loaded.warnings[0].message


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("env", {"A\nB": "x"}, "is not a valid variable name"),
        ("env", {"A": "x\nRUN evil"}, "line break"),
        ("apt", ["git; rm -rf /"], "is not a Debian package name"),
        ("description", "two\nlines", "line break"),
        ("index_url", "https://x/simple; rm", "is not an http(s):// or file:// URL"),
    ],
)
def test_values_that_could_reach_a_shell(
    write_profile: Callable[..., Path], field: str, value: object, expected: str
) -> None:
    assert expected in only_error(write_profile(**{field: value}))


def test_python_without_a_default_base_image(write_profile: Callable[..., Path]) -> None:
    path = write_profile(
        "cu130-py314", name="cu130-py314", cuda="13.0", python="3.14", torch="2.14.1", torchvision=None, numpy="2.3.5"
    )
    msg = only_error(path)
    assert "python: envbuild has no default base image with Python 3.14" in msg
    assert "set base: to an image whose OS packages provide python3.14" in msg
    assert (
        errors_of(
            write_profile(
                "cu130-py314",
                name="cu130-py314",
                cuda="13.0",
                python="3.14",
                torch="2.14.1",
                torchvision=None,
                numpy="2.3.5",
                base="example.com/py314:1",
            )
        )
        == []
    )


def test_a_cuda_library_for_another_cuda_or_another_builds_triton_is_named_before_the_lock(
    write_profile: Callable[..., Path],
) -> None:
    """nvidia-cudnn-cu11 in a CUDA 12.1 profile installed without a word and was never loaded (torch
    loads the CUDA 12 libraries it brings); ROCm's Triton in a CUDA profile unpacks the module
    `triton` over torch's own. The CUDA 12 wheel, NVIDIA's other packages and `triton` itself stay quiet."""
    path = write_profile(packages=["nvidia-cudnn-cu11==8.7.0.84", "nvidia-ml-py", "triton"])
    loaded = validate.check(path, path.name)
    assert loaded.errors == []
    assert [w.render() for w in loaded.warnings] == [
        "cu121-py311.yaml:8: packages[0]: nvidia-cudnn-cu11 is a CUDA 11 library; this profile's torch is a "
        "CUDA 12.1 build, which brings the CUDA 12 libraries it loads and never loads this one; leave it out, or "
        "name its CUDA 12 wheel (nvidia-cudnn-cu12)"
    ]
    assert validate.check(write_profile(packages=["nvidia-cudnn-cu12"])).warnings == []
    msg = only_error(write_profile(packages=["pytorch-triton-rocm==2.3.1"]))
    assert msg.endswith(
        "packages[0]: pytorch-triton-rocm is another torch build's Triton: this CUDA profile's torch uses triton, "
        "and both install the module `triton`, each over the other's files; leave it out: the lock takes the "
        "triton torch needs"
    ), msg
    cpu = write_profile("cpu-py311", name="cpu-py311", accelerator="cpu", cuda=None, packages=["nvidia-nccl-cu12"])
    warned = [w.render() for w in validate.check(cpu).warnings]
    assert any("nvidia-nccl-cu12 is a CUDA library; a CPU profile's torch never loads it" in w for w in warned), warned


def test_an_os_package_listed_twice_is_named(write_profile: Callable[..., Path]) -> None:
    """`apt: [git, less, git]` was taken without a word; with two versions one pin was not what the
    image got."""
    path = write_profile(apt=["git", "less", "git=1:2.39.5-0+deb12u2"])
    assert only_error(path).endswith("apt[2]: git is listed twice (also apt[0]); keep one")
    assert errors_of(write_profile(apt=["git", "git-lfs", "less"])) == []


def test_a_package_listed_twice_is_named_before_the_resolver_sees_it(write_profile: Callable[..., Path]) -> None:
    """`lock` only said "unsatisfiable" for einops==0.8.1 next to Einops==0.8.0 (or took the stricter
    of two ranges). Markers that tell two entries apart (one per Python) stay allowed."""
    path = write_profile(packages=["einops==0.8.1", "tqdm", "Einops==0.8.0"])
    assert only_error(path).endswith("packages[2]: Einops is listed twice (also packages[0]); keep one pin")
    split = ['einops==0.8.1; python_version >= "3.10"', 'einops==0.7.0; python_version < "3.10"']
    assert errors_of(write_profile(packages=split)) == []
