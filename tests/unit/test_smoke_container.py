"""The smoke container runs this envbuild's copy of the smoke test, whatever the image carries."""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path

import pytest

from envbuild import buildctx, plan
from envbuild.smoke import container


def test_the_host_copy_is_the_package_and_entry_script_readable_by_any_uid_and_owned_by_root() -> None:
    with tarfile.open(fileobj=io.BytesIO(container.host_smoke_tar())) as tar:
        members = {m.name: m for m in tar.getmembers()}
        root = container.HOST_SMOKE_DIR.lstrip("/")
        for name, text in plan.smoke_sources().items():
            member = members[f"{root}/{buildctx.SMOKE_PACKAGE}/{name}"]
            assert (member.mode, member.uid) == (0o644, 0)
            extracted = tar.extractfile(member)
            assert extracted is not None and extracted.read().decode() == text
        entry = tar.extractfile(members[f"{root}/entrypoint"])
        assert entry is not None and entry.read().decode() == buildctx.ENTRY_SCRIPT_TEXT
        assert members[root].isdir() and members[root].mode == 0o755


def test_the_container_starts_the_host_copy_first_on_the_path_under_the_engines_init() -> None:
    inspected = {"Config": {"Env": ["PATH=/opt/venv/bin:/usr/bin", "PYTHONPATH=/app/src"]}}
    command, kwargs = container.settings(
        inspected, "none", 120, min_peak=None, lock_match="pins", ipc_host=False, shm_size="2g"
    )
    assert command[:3] == ["python", "-m", buildctx.SMOKE_PACKAGE] and command[-2:] == ["--lock-match", "pins"]
    # the image's ENTRYPOINT and its own entry script are not run; the working folder is ours (-m
    # puts it first on sys.path); the image's PYTHONPATH still follows, for its own checks
    assert kwargs["entrypoint"] == ["/bin/sh", f"{container.HOST_SMOKE_DIR}/entrypoint"]
    assert kwargs["init"] is True and kwargs["working_dir"] == container.HOST_SMOKE_DIR
    assert kwargs["environment"]["PYTHONPATH"] == f"{container.HOST_SMOKE_DIR}:/app/src"
    assert kwargs["shm_size"] == "2g"
    assert container.is_smoke_command(command)
    only, _ = container.settings(
        inspected, "none", 120, min_peak=None, lock_match=None, ipc_host=False, shm_size=None, only=["ddp", "amp"]
    )
    assert only[-4:] == ["--only", "ddp", "--only", "amp"]  # `smoke --only`: the same checks as typed
    assert container.is_smoke_command(["envbuild-smoke", "--json", "-"])  # an earlier envbuild's
    assert not container.is_smoke_command(["true"])


def _image_pip(
    tmp_path: Path, uid: int, args: list[str], code: int, *, writable: bool = False, **env: str
) -> subprocess.CompletedProcess[str]:
    """The image's pip wrapper run as `uid`, with a fake `python -m pip` that exits with `code`;
    the environment's site folder one this user can write (`writable`: it is the user's) or not."""
    site = tmp_path if writable else tmp_path / "no-such-site"
    tools = tmp_path / "bin"
    tools.mkdir(exist_ok=True)
    fake = {
        "id": f'#!/bin/sh\n[ "$1" = -g ] && echo {uid} && exit 0\necho {uid}\n',
        # pip's own run, with the exit code under test; then the site folder
        "python": f'#!/bin/sh\n[ "$1" = -m ] && echo "pip ran: $*" && exit {code}\necho {site}\n',
    }
    for name, text in fake.items():
        (tools / name).write_text(text)
        (tools / name).chmod(0o755)
    wrapper = tmp_path / "pip"
    wrapper.write_text(buildctx.pip_wrapper())
    return subprocess.run(
        ["sh", str(wrapper), *args],
        env={"PATH": f"{tools}:/usr/bin:/bin", **env},
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.mark.parametrize(
    ("uid", "args", "code", "constraint", "hinted"),
    [
        (0, ["install", "torch==2.14.0"], 1, "/opt/envbuild/constraints.txt", True),
        (0, ["install", "--no-index", "x"], 1, "/opt/envbuild/constraints.txt", True),
        (0, ["install", "x"], 0, "/opt/envbuild/constraints.txt", False),  # it worked
        (0, ["install", "x"], 1, "", False),  # cleared for this install: pip's conflict is its own
        (0, ["download", "x"], 1, "/opt/envbuild/constraints.txt", False),
        (1000, ["install", "torch==2.14.0"], 1, "/opt/envbuild/constraints.txt", True),  # the image's user
        (4242, ["install", "x"], 1, "/opt/envbuild/constraints.txt", False),  # refused: the USER fix instead
    ],
)
def test_a_failed_install_is_told_where_a_constraint_comes_from(
    tmp_path: Path, uid: int, args: list[str], code: int, constraint: str, hinted: bool
) -> None:
    """pip's "The user requested (constraint) torch==2.13.0+cpu" names no file: the image's
    PIP_CONSTRAINT holds the tested torch build and numpy, and the wrapper says so and how to change it."""
    # the environment is uid 1000's (the image's user), and root writes anywhere
    out = _image_pip(tmp_path, uid, args, code, writable=uid in {0, 1000}, PIP_CONSTRAINT=constraint)
    assert out.returncode == code
    said = "this image's tested torch build or numpy (/opt/envbuild/constraints.txt)"
    assert (said in out.stderr) is hinted, out.stderr
    if hinted:
        assert "PIP_CONSTRAINT= pip install ..." in out.stderr


CPU_INDEX = "https://download.pytorch.org/whl/cpu"


@pytest.mark.parametrize(
    ("index", "args", "code", "hinted"),
    [
        (CPU_INDEX, ["install", "torchvision"], 1, True),
        ("", ["install", "torchvision"], 1, False),  # torch from PyPI: so are its companions
        (CPU_INDEX, ["install", "torchvision"], 0, False),
        (CPU_INDEX, ["install", "--extra-index-url", CPU_INDEX, "torchvision"], 1, False),  # given: no news
        (CPU_INDEX, ["install", f"--extra-index-url={CPU_INDEX}/", "torchvision"], 1, False),
    ],
)
def test_a_failed_install_in_an_index_builds_image_names_the_index(
    tmp_path: Path, index: str, args: list[str], code: int, hinted: bool
) -> None:
    """torchvision for a +cpu torch is on the PyTorch index, not PyPI: the constraint refuses PyPI's
    (a CUDA build that fails on import), and the wrapper names the index that has the right one. An
    image whose torch is PyPI's own (no ENVBUILD_TORCH_INDEX) gets no such line."""
    out = _image_pip(
        tmp_path, 0, args, code, PIP_CONSTRAINT="/opt/envbuild/constraints.txt", ENVBUILD_TORCH_INDEX=index
    )
    assert out.returncode == code
    fix = f"are on {index}, not on PyPI: pip install --extra-index-url {index} ..."
    assert (fix in out.stderr) is hinted, out.stderr


@pytest.mark.parametrize(
    ("env", "hinted"),
    [
        ({"CONDA_PREFIX": "/opt/env"}, True),
        ({"CONDA_PREFIX": "/opt/env", "PIP_CONSTRAINT": ""}, False),  # cleared: pip's conflict is its own
        ({}, False),  # a venv image of PyPI's torch: its torchvision is PyPI's too
    ],
)
def test_a_failed_install_in_a_conda_image_says_its_torchvision_comes_from_the_profile(
    tmp_path: Path, env: dict[str, str], hinted: bool
) -> None:
    """A conda image holds a torchvision it lacks at <0 (PyPI's fails beside conda-forge's torch): the
    wrapper says the fix is in the profile, not an index (there is none for conda-forge's build)."""
    env = {"PIP_CONSTRAINT": "/opt/envbuild/constraints.txt", **env}
    out = _image_pip(tmp_path, 0, ["install", "timm"], 1, writable=False, **env)
    assert out.returncode == 1
    fix = (
        'come from its conda channel, and PyPI\'s fail on import beside it (a "<0" constraint): add `torchvision: auto`'
    )
    assert (fix in out.stderr) is hinted, out.stderr
    assert "--extra-index-url" not in out.stderr


@pytest.mark.parametrize(
    ("uid", "args", "code", "hinted"),
    [
        (4242, ["install", "tqdm"], 1, True),
        (4242, ["--disable-pip-version-check", "install", "-r", "r.txt"], 1, True),
        (4242, ["install", "tqdm"], 0, False),  # it worked (a --target elsewhere, say)
        (4242, ["list"], 2, False),
        (4242, ["install", "--target", "/nowhere", "tqdm"], 1, False),  # not the environment: its own error
        (4242, ["install", "--prefix=/nowhere", "tqdm"], 1, False),
        (4242, ["install", "--user", "tqdm"], 1, False),
        (0, ["install", "tqdm"], 1, False),  # root's install failed for another reason
    ],
)
def test_the_images_pip_names_the_fix_when_the_user_is_refused_an_install(
    tmp_path: Path, uid: int, args: list[str], code: int, hinted: bool
) -> None:
    """An install as a uid the environment does not belong to (`docker run -u`, a derived
    Dockerfile's USER) failed with pip's "Permission denied ... Check the permissions" alone."""
    out = _image_pip(tmp_path, uid, args, code)
    assert out.returncode == code and out.stdout == f"pip ran: -m pip {' '.join(args)}\n"
    fix = f"envbuild: in a Dockerfile, put 'USER root' before this step and 'USER {uid}:{uid}' after it."
    assert (fix in out.stderr) is hinted, out.stderr
    if hinted:
        assert f"{tmp_path}/no-such-site belongs to uid ?, not to uid {uid}" in out.stderr


@pytest.mark.parametrize("raised", [KeyboardInterrupt, SystemExit])
def test_an_interrupt_while_the_smoke_test_is_put_in_removes_the_container(raised: type[BaseException]) -> None:
    """Between create() and the caller's try/finally nothing else would remove it."""
    removed: list[bool] = []

    class Made:
        def put_archive(self, path: str, data: bytes) -> bool:
            raise raised()

        def remove(self, force: bool) -> None:
            removed.append(force)

    class Containers:
        def create(self, *_: object, **__: object) -> Made:
            return Made()

    class Cli:
        containers = Containers()

    with pytest.raises(raised):
        container.create(Cli(), "sha256:abc", ["python"], {})
    assert removed == [True]
