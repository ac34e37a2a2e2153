"""`envbuild new NAME`: a first profile chosen from the compat data, valid before it is written."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from pathlib import Path

import pytest

from envbuild import profile, validate
from envbuild.project import open_project

from ..conftest import FakeIndex, Result

Lookups = list[tuple[list[str], str]]


@pytest.fixture
def empty_project(tmp_path: Path) -> Path:
    """A folder with nothing in it: `new` is how a project starts."""
    root = tmp_path / "fresh"
    root.mkdir()
    return root


@pytest.fixture
def index(fake_index: FakeIndex) -> Lookups:
    fake_index.newest.update(
        {
            "torch==2.14.*": "2.14.1",
            "torch==2.2.*": "2.2.2",
            "numpy==2.5.*": "2.5.5",
            "numpy==2.4.*": "2.4.6",
            "numpy==1.26.*": "1.26.4",
        }
    )
    return fake_index.asked


def test_new_writes_the_newest_verified_release_with_that_build(
    cli: Callable[..., Result], empty_project: Path, index: Lookups
) -> None:
    res = cli("new", "cu126-py312", "--project", str(empty_project))
    assert res.code == 0, res.err
    # 2.15 has a CUDA 12.6 build too, but its compat data is unverified: 2.14 is taken, and the note says why.
    # numpy 2.5 is the newest series with wheels for Python 3.12 (it needs 3.12 or later)
    assert index == [(["torch==2.14.*", "numpy==2.5.*"], "3.12")]
    written = (empty_project / "profiles" / "cu126-py312.yaml").read_text()
    assert written == (
        "# Written by `envbuild new cu126-py312` from envbuild's compat data; edit freely,\n"
        "# `envbuild validate cu126-py312` checks it.\n"
        "name: cu126-py312\n"
        "description: CUDA 12.6 build of torch 2.14, Python 3.12\n"
        "accelerator: cuda\n"
        'cuda: "12.6"\n'
        'python: "3.12"\n'
        'torch: "2.14.1"\n'
        'numpy: "2.5.5"\n'
        "# torchvision: auto          # the release that pairs with torch\n"
        "# torchaudio: auto\n"
        '# packages: ["einops==0.8.1"]\n'
        '# apt: ["git"]\n'
    )
    assert res.out == written
    assert "note: torch 2.15 also has a CUDA 12.6 build for Python 3.12, but envbuild's data" in res.err
    assert "note: torch 2.14.1 comes from https://download.pytorch.org/whl/cu126" in res.err
    assert "next: envbuild lock cu126-py312 && envbuild build cu126-py312" in res.err
    assert cli("validate", "--all", "--strict", "--project", str(empty_project)).code == 0


def test_new_keeps_numpy_1_for_a_torch_built_against_it(
    cli: Callable[..., Result], empty_project: Path, index: Lookups
) -> None:
    res = cli("new", "cu121-py311", "--torch", "2.2", "--json", "--project", str(empty_project))
    assert res.code == 0, res.err
    assert index == [(["torch==2.2.*", "numpy==1.26.*"], "3.11")]
    report = json.loads(res.out)
    assert (report["torch"], report["numpy"], report["path"]) == ("2.2.2", "1.26.4", "profiles/cu121-py311.yaml")
    assert report["next"] == ["envbuild lock cu121-py311", "envbuild build cu121-py311"]
    assert report["notes"] == []  # 2.2's CUDA 12.1 build is PyPI's default wheel


def test_new_with_exact_releases_asks_no_index(cli: Callable[..., Result], empty_project: Path, index: Lookups) -> None:
    res = cli("new", "rocm63-py312-dev", "--torch", "2.8.0", "--numpy", "2.1.3", "--project", str(empty_project))
    assert res.code == 0, res.err
    assert index == []
    proj = open_project(str(empty_project))
    prof = validate.load_valid(proj.profile_path("rocm63-py312-dev"))
    assert (prof.accelerator, prof.rocm, prof.python, prof.torch, prof.numpy) == (
        "rocm",
        "6.3",
        "3.12",
        "2.8.0",
        "2.1.3",
    )


@pytest.mark.parametrize(("name", "rocm"), [("rocm714-py313", "7.14"), ("rocm624-py312", "6.2.4")])
def test_new_reads_a_rocm_token_as_the_build_the_data_has(
    cli: Callable[..., Result], empty_project: Path, index: Lookups, name: str, rocm: str
) -> None:
    """rocm714 was read as ROCm 7.1.4, which no release has ("builds it knows: ... 7.14"), while
    validate accepts a profile of that name with rocm "7.14"."""
    res = cli(
        "new",
        name,
        "--torch",
        "2.14.1" if rocm == "7.14" else "2.6.0",
        "--numpy",
        "2.1.3",
        "--project",
        str(empty_project),
    )
    assert res.code == 0, res.err
    prof = validate.load_valid(open_project(str(empty_project)).profile_path(name))
    assert prof.rocm == rocm


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["foo"], "error: 'foo' does not say what to build\n  fix: name it <accelerator>-py<XY>[-suffix]"),
        (
            ["cu128-py313t-dev"],
            "error: 'cu128-py313t-dev' asks for free-threaded Python 3.13t (PEP 703), which envbuild does not build\n"
            "  fix: name the standard interpreter: envbuild new cu128-py313-dev",
        ),
        (["cu125-py312"], "no torch release in envbuild's data has a CUDA 12.5 build\n  fix: builds it knows: 11.6,"),
        (
            ["cu116-py312"],
            "no torch release with a CUDA 11.6 build (1.13) supports Python 3.12\n"
            "  fix: those releases support Python 3.7-3.10: name the profile cu116-py310",
        ),
        (["cu126-py312", "--torch", "2.9; rm"], "--torch '2.9; rm': expected a release (2.9.1) or a series (2.9)"),
        (
            ["cu126-py312", "--torch", "2.3.1", "--numpy", "1.26.4"],
            # the file was never written: the error names the command, not a file:line to open
            "error: envbuild new cu126-py312: cuda: torch 2.3.1 has no CUDA 12.6 build (it has 11.8, 12.1)",
        ),
        (
            ["cu130-py314", "--torch", "2.14.1", "--numpy", "2.4.6"],
            "envbuild has no default base image with Python 3.14",
        ),
    ],
)
def test_new_refuses_what_cannot_work_and_writes_nothing(
    cli: Callable[..., Result], empty_project: Path, index: Lookups, args: list[str], said: str
) -> None:
    res = cli("new", *args, "--project", str(empty_project))
    assert res.code == 2
    assert said in res.err
    assert not (empty_project / "profiles").exists() or not any((empty_project / "profiles").iterdir())


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (
            ["cu121-py312", "--torch", "2.1"],
            "python: torch 2.1.0 has no wheel for Python 3.12 (it supports 3.8-3.11); "
            'use python "3.11" or torch >= 2.2',
        ),
        (["cu118-py312", "--torch", "2.8"], "cuda: torch 2.8.0 has no CUDA 11.8 build (it has 12.6, 12.8, 12.9)"),
        (["cu121-py311", "--torch", "2.1", "--numpy", "2.0"], "numpy: torch 2.1.0 was compiled against NumPy 1.x"),
    ],
)
def test_new_judges_a_series_by_the_compat_data_before_asking_an_index(
    cli: Callable[..., Result], empty_project: Path, index: Lookups, args: list[str], said: str
) -> None:
    """`--torch 2.1` for Python 3.12 went to the index for the newest 2.1.x and failed with uv's
    "no wheels with a matching Python ABI tag" (exit 4, a lock error) where `--torch 2.1.2` got the
    compat rule and its fix: every 2.1.x shares the row, so the series is judged before the lookup."""
    res = cli("new", *args, "--project", str(empty_project))
    assert res.code == 2, res.err
    assert said in res.err
    assert "nothing was written" in res.err
    assert index == []
    assert not (empty_project / "profiles").exists() or not any((empty_project / "profiles").iterdir())


def test_new_refusal_after_validation_says_nothing_was_written(
    cli: Callable[..., Result], empty_project: Path, index: Lookups
) -> None:
    res = cli("new", "cu130-py314", "--torch", "2.14.1", "--numpy", "2.4.6", "--project", str(empty_project))
    assert "fix: nothing was written; choose with --torch / --numpy / --base" in res.err
    base = "debian:trixie-slim@sha256:" + "a" * 64
    res = cli(
        "new", "cu130-py314", "--torch", "2.14.1", "--numpy", "2.4.6", "--base", base, "--project", str(empty_project)
    )
    assert res.code == 0, res.err
    assert f'base: "{base}"\n' in (empty_project / "profiles" / "cu130-py314.yaml").read_text()


def test_new_keeps_an_existing_profile_unless_forced(
    cli: Callable[..., Result], empty_project: Path, index: Lookups
) -> None:
    path = empty_project / "profiles" / "cpu-py311.yaml"
    path.parent.mkdir()
    path.write_text("# mine\n")
    res = cli("new", "cpu-py311", "--project", str(empty_project))
    assert res.code == 2 and "profiles/cpu-py311.yaml exists" in res.err and "--force" in res.err
    assert path.read_text() == "# mine\n"
    assert cli("new", "cpu-py311", "--force", "--project", str(empty_project)).code == 0
    assert path.read_text().startswith("# Written by `envbuild new cpu-py311`")


def test_new_without_an_index_says_how_to_go_on(
    cli: Callable[..., Result], empty_project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Real uv against a closed port: exit 4, the host and cause, and the offline way round."""
    monkeypatch.setenv("UV_HTTP_RETRIES", "0")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    res = cli("new", "cpu-py311", "--index-url", f"http://127.0.0.1:{port}/simple", "--project", str(empty_project))
    assert res.code == 4
    assert "error: uv cannot reach 127.0.0.1: the connection was refused" in res.err
    assert "fix: check the network path to 127.0.0.1 (HTTPS_PROXY), or pass exact releases (--torch X.Y.Z" in res.err
    assert not (empty_project / "profiles").exists()


def test_new_with_a_series_the_index_has_not_released_says_so_and_writes_nothing(
    cli: Callable[..., Result], empty_project: Path, tmp_path: Path
) -> None:
    """Real uv against a local index that has torch 2.14.1 and numpy 2.5.5: `--torch 2.16` was
    "uv found no set of versions that satisfies the profile's pins" before any profile existed."""
    for name, wheel in (
        ("torch", "torch-2.14.1-cp312-cp312-manylinux_2_28_x86_64.whl"),
        ("numpy", "numpy-2.5.5-cp312-cp312-manylinux_2_28_x86_64.whl"),
    ):
        folder = tmp_path / "simple" / name
        folder.mkdir(parents=True)
        (folder / wheel).write_bytes(b"never read: --no-deps picks by the file's name")
        (folder / "index.html").write_text(f'<a href="{wheel}">{wheel}</a>\n')
    index_url = (tmp_path / "simple").as_uri()
    res = cli("new", "cpu-py312", "--torch", "2.16", "--index-url", index_url, "--project", str(empty_project))
    assert res.code == 4, res.err
    assert f"error: {index_url} has no release for Python 3.12 that satisfies torch==2.16.* and numpy==" in res.err
    assert "only torch==2.14.1 is available" in res.err  # uv's words, kept
    assert "fix: name a release the index has" in res.err
    assert "profile's pins" not in res.err
    assert not (empty_project / "profiles").exists()
    # the same index answers a released series
    res = cli("new", "cpu-py312", "--torch", "2.14", "--index-url", index_url, "--project", str(empty_project))
    assert res.code == 0, res.err
    assert 'torch: "2.14.1"' in (empty_project / "profiles" / "cpu-py312.yaml").read_text()


@pytest.mark.parametrize(
    ("name", "parts"),
    [
        ("cpu-py310", ("cpu", None, "3.10")),
        ("cu126-py312-dev", ("cuda", "12.6", "3.12")),
        ("rocm63-py312", ("rocm", "6.3", "3.12")),
        ("rocm612-py311", ("rocm", "6.1.2", "3.11")),
    ],
)
def test_name_parts(name: str, parts: tuple[str, str | None, str]) -> None:
    got = profile.name_parts(name)
    assert got is not None and (got.accelerator, got.version, got.python) == parts
    assert profile.name_parts("gpu-py312") is None


def test_an_empty_project_points_at_new(cli: Callable[..., Result], empty_project: Path) -> None:
    res = cli("validate", "cu121-py311", "--project", str(empty_project))
    assert res.code == 2
    assert "no profile 'cu121-py311': profiles/ does not exist" in res.err
    assert "`envbuild new cu121-py311` writes one" in res.err
    for command in ("list", "outdated"):
        listed = cli(command, "--project", str(empty_project))
        assert listed.code == 0 and listed.out == ""
        assert "no profiles: profiles/ does not exist\n  fix: `envbuild new cu126-py312` starts one" in listed.err


def test_new_extends_derives_a_variant_of_a_profile_without_asking_an_index(
    cli: Callable[..., Result], project: Path, index: Lookups
) -> None:
    """A team's variant (cpu-py311 plus its own packages) was written from the compat data: the
    newest torch and numpy, not cpu-py311's, and nothing shared with it."""
    res = cli("new", "cpu-py311-hf", "--extends", "cpu-py311", "--project", str(project))
    assert res.code == 0, res.err
    assert index == []  # torch and numpy are cpu-py311's: nothing to look up
    text = (project / "profiles" / "cpu-py311-hf.yaml").read_text()
    assert "name: cpu-py311-hf\nextends: cpu-py311\n" in text
    assert '# packages: ["einops==0.8.1", "tqdm==4.67.1"]' in text  # the list replaces the parent's: say so
    proj = open_project(str(project))
    mine, theirs = (validate.load_named(proj, n) for n in ("cpu-py311-hf", "cpu-py311"))
    assert (mine.torch, mine.numpy, mine.checks) == (theirs.torch, theirs.numpy, theirs.checks)
    assert "keeps cpu-py311's versions where they fit" in res.err


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["cpu-py311-x", "--extends", "cpu-py31"], "--extends cpu-py31: no such profile\n  fix: did you mean"),
        (["cpu-py311", "--extends", "cpu-py311", "--force"], "a profile cannot extend itself"),
        (["cpu-py311-x", "--extends", "cpu-py311", "--torch", "2.13"], "takes torch and numpy from cpu-py311"),
        (["cpu-py312-x", "--extends", "cpu-py311"], "python: '3.11' disagrees with the name 'cpu-py312-x'"),
    ],
)
def test_new_extends_refuses_what_cannot_be_derived_and_writes_nothing(
    cli: Callable[..., Result], project: Path, index: Lookups, args: list[str], said: str
) -> None:
    before = sorted(p.name for p in (project / "profiles").iterdir())
    res = cli("new", *args, "--project", str(project))
    assert res.code == 2 and said in res.err, res.err
    assert sorted(p.name for p in (project / "profiles").iterdir()) == before
    assert index == []


def test_new_names_the_profile_a_suffixed_name_could_extend(
    cli: Callable[..., Result], project: Path, index: Lookups
) -> None:
    res = cli("new", "cpu-py311-hf", "--torch", "2.13.0", "--numpy", "2.1.3", "--project", str(project))
    assert res.code == 0, res.err
    assert "cpu-py311 is a profile here: `envbuild new cpu-py311-hf --extends cpu-py311 --force`" in res.err


def test_checks_are_found_from_the_project_folder_wherever_its_profiles_are(
    cli: Callable[..., Result], project: Path
) -> None:
    """`checks` are relative to the project folder (build reads them there); validate looked beside
    the profile folder's parent, so with `profiles_dir = "envs/profiles"` it refused a check the
    build would have run."""
    (project / "envs").mkdir()
    (project / "profiles").rename(project / "envs" / "profiles")
    (project / "envbuild.toml").write_text('[envbuild]\nprofiles_dir = "envs/profiles"\n')
    res = cli("validate", "cpu-py311", "--project", str(project))
    assert res.code == 0, res.err
    assert validate.load_named(open_project(str(project)), "cpu-py311").checks == ["checks/train_tiny.py"]


def test_new_extends_refuses_a_profile_that_does_not_validate(
    cli: Callable[..., Result], project: Path, index: Lookups
) -> None:
    broken = project / "profiles" / "cpu-py311.yaml"
    broken.write_text(broken.read_text() + "python_x: 1\n")
    res = cli("new", "cpu-py311-hf", "--extends", "cpu-py311", "--project", str(project))
    assert res.code == 2 and "profiles/cpu-py311.yaml:11: python_x: unknown key" in res.err, res.err
    assert not (project / "profiles" / "cpu-py311-hf.yaml").exists()
