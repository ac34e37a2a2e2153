"""The smoke container runs this envbuild's copy of the smoke test, whatever the image carries."""

from __future__ import annotations

import io
import itertools
import os
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
    tmp_path: Path, uid: int, args: list[str], code: int, *, writable: bool = False, explains: str = "", **env: str
) -> subprocess.CompletedProcess[str]:
    """The image's pip wrapper run as `uid`, with a fake `python -m pip` that exits with `code`;
    the environment's site folder one this user can write (`writable`: it is the user's) or not, and
    pip's output `explains` after its command line (its ERROR lines on stderr, as pip's). Not on a
    terminal, as in a Dockerfile's RUN."""
    site = tmp_path if writable else tmp_path / "no-such-site"
    said = tmp_path / "pip-says.txt"  # what pip explains on stdout
    said.write_text(explains)
    tools = tmp_path / "bin"
    tools.mkdir(exist_ok=True)
    fake = {
        "id": f'#!/bin/sh\n[ "$1" = -g ] && echo {uid} && exit 0\necho {uid}\n',
        # pip's own run, with the exit code under test; then the site folder
        "python": f'#!/bin/sh\n[ "$1" = -m ] && echo "pip ran: $*" && grep -v ^ERROR {said}; '
        f'[ "$1" = -m ] && {{ grep ^ERROR {said} >&2; exit {code}; }}\necho {site}\n',
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


# pip's explanations, on stdout, as pip 24 words them
TORCH_CONFLICT = (
    "The conflict is caused by:\n    The user requested torch==2.14.0\n"
    "    The user requested (constraint) torch==2.13.0+cpu\n"
)
VISION_CONFLICT = (
    "The conflict is caused by:\n    The user requested torchvision\n"
    "    The user requested (constraint) torchvision==0.28.0+cpu\n"
)
TIMM_CONFLICT = (
    "The conflict is caused by:\n    timm 1.0.9 depends on torchvision\n"
    "    The user requested (constraint) torchvision<0\n"
)
NOT_FOUND = "ERROR: No matching distribution found for x\n"  # a misspelt name: no constraint's doing
# `pip install -q`: no explanation on stdout, only pip's error on stderr
QUIET_VISION = "ERROR: Cannot install torchvision because these package versions have conflicting dependencies.\n"


CONSTRAINTS = "/opt/envbuild/constraints.txt"


@pytest.mark.parametrize(
    ("uid", "args", "constraint", "pip", "hinted"),
    [
        (0, ["install", "torch==2.14.0"], CONSTRAINTS, (1, TORCH_CONFLICT), True),
        (0, ["install", "--no-index", "torch==2.14.0"], CONSTRAINTS, (1, TORCH_CONFLICT), True),
        (0, ["install", "-q", "torchvision"], CONSTRAINTS, (1, QUIET_VISION), True),
        (0, ["install", "x"], CONSTRAINTS, (1, NOT_FOUND), False),  # not the constraint's doing
        (0, ["install", "x"], CONSTRAINTS, (0, ""), False),  # it worked
        (0, ["install", "torch==2.14.0"], "", (1, TORCH_CONFLICT), False),  # cleared: pip's conflict is its own
        (0, ["download", "x"], CONSTRAINTS, (1, TORCH_CONFLICT), False),
        (1000, ["install", "torch==2.14.0"], CONSTRAINTS, (1, TORCH_CONFLICT), True),  # the image's user
        (4242, ["install", "x"], CONSTRAINTS, (1, TORCH_CONFLICT), False),  # refused: the USER fix instead
    ],
)
def test_a_failed_install_is_told_where_a_constraint_comes_from(
    tmp_path: Path, uid: int, args: list[str], constraint: str, pip: tuple[int, str], hinted: bool
) -> None:
    """pip's "The user requested (constraint) torch==2.13.0+cpu" names no file: the image's
    PIP_CONSTRAINT holds the tested torch build and numpy, and the wrapper says so and how to change
    it, where pip named a constraint (a misspelt package's failure gets no such line)."""
    code, explains = pip
    # the environment is uid 1000's (the image's user), and root writes anywhere
    out = _image_pip(tmp_path, uid, args, code, writable=uid in {0, 1000}, explains=explains, PIP_CONSTRAINT=constraint)
    assert out.returncode == code
    # pip's own output, all of it, each line on its own stream and in order, before the wrapper's
    lines = explains.splitlines(keepends=True)
    assert out.stdout == f"pip ran: -m pip {' '.join(args)}\n" + "".join(x for x in lines if not x.startswith("ERROR"))
    assert out.stderr.startswith("".join(x for x in lines if x.startswith("ERROR")))
    said = "this image's tested torch build or numpy (/opt/envbuild/constraints.txt)"
    assert (said in out.stderr) is hinted, out.stderr
    if hinted:
        assert "PIP_CONSTRAINT= pip install ..." in out.stderr
    assert "envbuild: torchvision" not in out.stderr  # no index set: nothing about where its companions are


def test_on_a_terminal_the_wrapper_leaves_pips_output_alone_and_says_the_hint_after_any_failure(
    tmp_path: Path,
) -> None:
    """On a terminal pip's output is not piped through a copy (pip would drop its progress bars), so
    the wrapper cannot read pip's explanation and says the constraint line after any failed install."""
    import pty

    leader, follower = pty.openpty()
    try:
        tools = tmp_path / "bin"
        tools.mkdir()
        python = tools / "python"
        # pip's stdout is the terminal itself: it says so
        python.write_text('#!/bin/sh\n[ -t 1 ] && echo "pip on a terminal"\nexit 1\n')
        python.chmod(0o755)
        wrapper = tmp_path / "pip"
        wrapper.write_text(buildctx.pip_wrapper())
        out = subprocess.run(
            ["sh", str(wrapper), "install", "x"],
            env={"PATH": f"{tools}:/usr/bin:/bin", "PIP_CONSTRAINT": "/opt/envbuild/constraints.txt"},
            stdout=follower,
            stderr=subprocess.PIPE,
            text=True,
            check=False,
        )
        os.close(follower)
        follower = -1
        shown = os.read(leader, 4096).decode()
    finally:
        if follower != -1:
            os.close(follower)
        os.close(leader)
    assert out.returncode == 1 and "pip on a terminal" in shown
    assert "this image's tested torch build or numpy" in out.stderr


CPU_INDEX = "https://download.pytorch.org/whl/cpu"


@pytest.mark.parametrize(
    ("index", "args", "code", "explains", "hinted"),
    [
        (CPU_INDEX, ["install", "torchvision"], 1, VISION_CONFLICT, True),
        (
            CPU_INDEX,
            ["install", "timm==1.0.9"],
            1,
            VISION_CONFLICT.replace("The user requested torchvision", "timm 1.0.9 depends on torchvision"),
            True,
        ),
        (CPU_INDEX, ["install", "numpy<2"], 1, TORCH_CONFLICT.replace("torch", "numpy"), False),  # not its companions
        (CPU_INDEX, ["install", "-q", "torchvision"], 1, QUIET_VISION, True),
        ("", ["install", "torchvision"], 1, VISION_CONFLICT, False),  # torch from PyPI: so are its companions
        (CPU_INDEX, ["install", "torchvision"], 0, "", False),
        (CPU_INDEX, ["install", "--extra-index-url", CPU_INDEX, "torchvision"], 1, VISION_CONFLICT, False),  # given
        (CPU_INDEX, ["install", f"--extra-index-url={CPU_INDEX}/", "torchvision"], 1, VISION_CONFLICT, False),
    ],
)
def test_a_failed_install_in_an_index_builds_image_names_the_index(
    tmp_path: Path, index: str, args: list[str], code: int, explains: str, hinted: bool
) -> None:
    """torchvision for a +cpu torch is on the PyTorch index, not PyPI: the constraint refuses PyPI's
    (a CUDA build that fails on import), and the wrapper names the index that has the right one, where
    pip's conflict names torchvision or torchaudio. An image whose torch is PyPI's own (no
    ENVBUILD_TORCH_INDEX) gets no such line."""
    out = _image_pip(
        tmp_path,
        0,
        args,
        code,
        explains=explains,
        PIP_CONSTRAINT="/opt/envbuild/constraints.txt",
        ENVBUILD_TORCH_INDEX=index,
    )
    assert out.returncode == code
    fix = f"are on {index}, not on PyPI: pip install --extra-index-url {index} ..."
    assert (fix in out.stderr) is hinted, out.stderr


@pytest.mark.parametrize(
    ("env", "explains", "hinted"),
    [
        ({"CONDA_PREFIX": "/opt/env"}, TIMM_CONFLICT, True),
        ({"CONDA_PREFIX": "/opt/env"}, NOT_FOUND, False),  # not the constraint's doing
        ({"CONDA_PREFIX": "/opt/env", "PIP_CONSTRAINT": ""}, TIMM_CONFLICT, False),  # cleared: pip's own conflict
        ({}, TIMM_CONFLICT, False),  # a venv image of PyPI's torch: its torchvision is PyPI's too
    ],
)
def test_a_failed_install_in_a_conda_image_says_its_torchvision_comes_from_the_profile(
    tmp_path: Path, env: dict[str, str], explains: str, hinted: bool
) -> None:
    """A conda image holds a torchvision it lacks at <0 (PyPI's fails beside conda-forge's torch): the
    wrapper says the fix is in the profile, not an index (there is none for conda-forge's build)."""
    env = {"PIP_CONSTRAINT": "/opt/envbuild/constraints.txt", **env}
    out = _image_pip(tmp_path, 0, ["install", "timm"], 1, writable=False, explains=explains, **env)
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


def test_a_rocm_container_gets_the_host_groups_of_the_gpu_device_nodes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On Ubuntu 22.04 and later /dev/kfd and /dev/dri/renderD* are root:render 0660, and `video`
    alone left the image's uid 1000 (and `run`'s host user) unable to open them: no GPU in a ROCm
    image. Their groups go in by number: the image's /etc/group has no `render`."""
    from envbuild import hostgpu

    if os.geteuid() != 0:
        pytest.skip("needs root to give the stand-in device nodes other groups")
    kfd, dri = tmp_path / "kfd", tmp_path / "dri"
    kfd.touch()
    dri.mkdir()
    (dri / "renderD128").touch()
    (dri / "card0").touch()  # group video: already in; only render nodes are read
    os.chown(kfd, 0, 4242)
    os.chown(dri / "renderD128", 0, 4243)
    os.chown(dri / "card0", 0, 4244)
    assert hostgpu.rocm_groups((str(kfd), str(dri))) == ["video", "4242", "4243"]
    os.chown(kfd, 0, 0)  # root's group (0666 nodes) grants nothing worth adding
    assert hostgpu.rocm_groups((str(kfd), str(tmp_path / "absent"))) == ["video"]
    # the smoke container and `run` ask for the same nodes and groups
    monkeypatch.setattr(hostgpu, "ROCM_DEVICES", (str(kfd), str(dri)))
    os.chown(kfd, 0, 4242)
    kwargs = container.gpu_kwargs("rocm", "all")
    assert kwargs["devices"] == [f"{kfd}:{kfd}:rwm", f"{dri}:{dri}:rwm"]
    assert kwargs["group_add"] == ["video", "4242", "4243"]
    from envbuild import profile, runner
    from tests.conftest import VALID

    rocm = profile.Profile.model_validate(
        {**{k: v for k, v in VALID.items() if k not in {"cuda", "torchvision", "torchaudio"}},
         "accelerator": "rocm", "rocm": "6.3", "name": "rocm63-py312", "torch": "2.7.1", "numpy": "2.1.3"}
    )  # fmt: skip
    argv = runner.docker_argv(rocm, "r:rocm63-py312", ["python"], workdir=tmp_path)
    flags = [(a, b) for a, b in itertools.pairwise(argv) if a in {"--device", "--group-add"}]
    assert flags == [("--device", str(kfd)), ("--device", str(dri))] + [
        ("--group-add", g) for g in ("video", "4242", "4243")
    ]
