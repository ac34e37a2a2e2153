"""A team's project on a shared engine: its own image repository, `run` as the host user, options passed through."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from envbuild import engine, profile, runner
from envbuild.errors import UsageError
from envbuild.project import open_project
from tests.conftest import VALID, Result

CPU = profile.Profile.model_validate(
    {**{k: v for k, v in VALID.items() if k not in {"cuda", "torchvision", "torchaudio"}}, "accelerator": "cpu",
     "name": "cpu-py311", "torch": "2.13.0", "numpy": "2.1.3"}
)  # fmt: skip


def test_run_is_the_host_user_with_a_writable_home(tmp_path: Path) -> None:
    argv = runner.docker_argv(CPU, "r:cpu-py311", ["python"], workdir=tmp_path)
    assert argv[argv.index("--user") + 1] == f"{os.getuid()}:{os.getgid()}"
    assert "HOME=/tmp" in argv
    argv = runner.docker_argv(CPU, "r:cpu-py311", ["python"], workdir=tmp_path, user="1000:1000")
    assert argv[argv.index("--user") + 1] == "1000:1000"


def test_env_volume_and_workdir_pass_through(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    argv = runner.docker_argv(
        CPU, "r:cpu-py311", ["python"], workdir=tmp_path, env=["WANDB_MODE=offline", "HF_TOKEN"],
        volumes=[f"{data}:/data:ro"], container_workdir="/workspace/src",
    )  # fmt: skip
    assert argv[argv.index("WANDB_MODE=offline") - 1 : argv.index("WANDB_MODE=offline") + 1] == [
        "-e",
        "WANDB_MODE=offline",
    ]
    assert f"{data.resolve()}:/data:ro" in argv and "HF_TOKEN" in argv
    assert argv[argv.index("-w") + 1] == "/workspace/src"


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("-e", "1BAD=x", "not NAME=VALUE"),
        ("-v", "/nope/nothing:/data", "does not exist"),
        ("-v", "data", "HOST:CONTAINER"),
        ("-p", "jupyter", "not PORT"),
        ("--network", "a b", "not a network name"),
    ],
)
def test_bad_run_options_are_usage_errors_before_the_engine(
    cli: Callable[..., Result], engineless_project: Path, option: str, value: str, message: str
) -> None:
    res = cli("run", "cpu-py311", option, value, "--", "true")
    assert res.code == 2 and message in res.err
    assert "Docker engine" not in res.err  # refused before anything was asked of it


@pytest.mark.parametrize(
    ("given", "docker_gets"),
    [
        ("8888", "127.0.0.1:8888:8888"),  # docker's own default would be every interface
        ("6006:6006", "127.0.0.1:6006:6006"),
        ("18888:8888/tcp", "127.0.0.1:18888:8888/tcp"),
        ("0.0.0.0:8000:8000", "0.0.0.0:8000:8000"),  # asked for: other machines reach it
        ("127.0.0.1::8888", "127.0.0.1::8888"),  # docker picks the host port
        ("[::1]:8888:8888", "[::1]:8888:8888"),
    ],
)
def test_a_published_port_is_on_localhost_unless_an_address_is_given(given: str, docker_gets: str) -> None:
    assert runner.check_publish(given) == docker_gets


@pytest.mark.parametrize("bad", ["", "x", "70000", "0", "8888:", "1:2:3:4", "lan:8888:8888", ":8888:8888", "80/sctp"])
def test_a_bad_publish_is_a_usage_error_with_examples(bad: str) -> None:
    with pytest.raises(UsageError) as caught:
        runner.check_publish(bad)
    assert "-p 6006:6006" in (caught.value.hint or "")


def test_publish_and_network_reach_docker_and_host_networking_refuses_publish(tmp_path: Path) -> None:
    argv = runner.docker_argv(CPU, "r:cpu-py311", ["jupyter"], workdir=tmp_path, publish=["8888"], network="mlflow")
    assert argv[argv.index("-p") + 1] == "127.0.0.1:8888:8888"
    assert argv[argv.index("--network") + 1] == "mlflow"
    assert argv.index("-p") < argv.index("r:cpu-py311")  # docker options, not the job's arguments
    with pytest.raises(UsageError, match="already listens on the host"):
        runner.check_network("host", ["8888"])
    # the server-side half of the fix: the job's server listens on the container's interfaces
    assert "--ip 0.0.0.0" in runner.published(runner.check_publish("8888"))


def test_a_bare_name_that_is_no_folder_here_is_a_docker_volume(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`-v hf-cache:/cache`, docker's named volume, was refused: "hf-cache does not exist"."""
    monkeypatch.chdir(tmp_path)
    assert runner.check_volume("hf-cache:/cache") == "hf-cache:/cache"
    (tmp_path / "data").mkdir()
    assert runner.check_volume("data:/data:ro") == f"{tmp_path.resolve() / 'data'}:/data:ro"  # a folder here wins
    with pytest.raises(UsageError, match="does not exist"):
        runner.check_volume("./nothing:/data")  # a path, not a name: a typo is still caught


def test_the_jobs_download_cache_is_a_folder_of_this_users(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENVBUILD_RUN_CACHE", str(tmp_path / "run"))
    cache = runner.download_cache("auto")
    assert cache == (tmp_path / "run").resolve() and cache.is_dir() and cache.stat().st_mode & 0o777 == 0o700
    argv = runner.docker_argv(CPU, "r:cpu-py311", ["python"], workdir=tmp_path, cache=cache)
    assert argv[argv.index(f"{cache}:/tmp/.cache") - 1] == "-v" and "HOME=/tmp" in argv
    assert runner.download_cache("none") is None
    assert runner.download_cache("auto", user="4242:4242") is None  # it could not write this user's folder
    assert runner.download_cache(str(tmp_path / "mine"), user="4242:4242") == (tmp_path / "mine").resolve()
    (tmp_path / "file").write_text("")
    with pytest.raises(UsageError, match="cannot make") as caught:
        runner.download_cache(str(tmp_path / "file" / "cache"))
    assert "--download-cache none" in (caught.value.hint or "")


def test_torch_compiles_cache_is_in_the_download_cache_unless_the_user_names_another(tmp_path: Path) -> None:
    def env_of(argv: list[str]) -> dict[str, str]:
        pairs = [argv[i + 1].partition("=") for i, arg in enumerate(argv) if arg == "-e"]
        return {key: value for key, _, value in pairs}

    argv = runner.docker_argv(CPU, "r:cpu-py311", ["python"], workdir=tmp_path, cache=tmp_path)
    assert env_of(argv)["TORCHINDUCTOR_CACHE_DIR"] == "/tmp/.cache/torchinductor"
    assert env_of(argv)["TRITON_HOME"] == "/tmp/.cache"  # Triton's ~/.triton/cache for kernels outside inductor
    mine = runner.docker_argv(
        CPU, "r:cpu-py311", ["python"], workdir=tmp_path, cache=tmp_path, env=["TORCHINDUCTOR_CACHE_DIR=/data/ind"]
    )
    assert mine.count("-e") == argv.count("-e") and env_of(mine)["TORCHINDUCTOR_CACHE_DIR"] == "/data/ind"
    none = runner.docker_argv(CPU, "r:cpu-py311", ["python"], workdir=tmp_path)
    assert "TORCHINDUCTOR_CACHE_DIR" not in env_of(none)  # no host folder: the container's /tmp, as torch's default


def test_a_project_has_its_own_image_repository(tmp_path: Path) -> None:
    folder = tmp_path / "Team Project_2"
    folder.mkdir()
    assert open_project(str(folder)).repository == "envbuild/team-project-2"
    subprocess.run(["git", "init", "-q", str(folder)], check=True)
    remote = "git@github.com:acme/vision-models.git"
    subprocess.run(["git", "-C", str(folder), "remote", "add", "origin", remote], check=True)
    assert open_project(str(folder)).repository == "envbuild/vision-models"
    (folder / "envbuild.toml").write_text('[envbuild]\nrepository = "registry.local/team/envs"\n')
    assert open_project(str(folder)).repository == "registry.local/team/envs"


def test_status_and_list_name_the_repository(cli: Callable[..., Result], engineless_project: Path) -> None:
    import json

    report = json.loads(cli("status", "cpu-py311", "--json").out)
    assert report["repository"] == f"envbuild/{engineless_project.name}"
    assert f"images: envbuild/{engineless_project.name}:NAME" in cli("list").err


def test_a_usage_error_is_not_raised_for_a_good_env(tmp_path: Path) -> None:
    with pytest.raises(UsageError):
        runner.check_env("=x")
    assert runner.check_env("A_B=1") == "A_B=1"


def test_base_and_ca_bundle_come_from_envbuild_toml(cli: Callable[..., Result], engineless_project: Path) -> None:
    import json

    (engineless_project / "ca.pem").write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    (engineless_project / "envbuild.toml").write_text(
        '[envbuild]\nca_bundle = "ca.pem"\n[envbuild.base]\n"3.11" = "registry.local/debian:bookworm"\n'
    )
    res = cli("build", "cpu-py311", "--context-only", "--json")
    assert res.code == 0, res.err
    ctx = Path(json.loads(res.out)["context"])
    assert 'ARG BASE_IMAGE="registry.local/debian:bookworm"' in (ctx / "Dockerfile").read_text()
    assert (ctx / "certs" / "ca-bundle.crt").read_text().startswith("-----BEGIN CERTIFICATE-----")
    # a tag every profile builds on can move under all of them: said as a profile's own `base:` is
    assert "envbuild.toml: base registry.local/debian:bookworm is not pinned by digest" in res.err
    # the option still wins over envbuild.toml
    res = cli("build", "cpu-py311", "--context-only", "--json", "--base", "other.local/img:1")
    assert 'ARG BASE_IMAGE="other.local/img:1"' in (Path(json.loads(res.out)["context"]) / "Dockerfile").read_text()
    assert "not pinned by digest" not in res.err
    pinned = "registry.local/debian:bookworm@sha256:" + "0" * 64
    (engineless_project / "envbuild.toml").write_text(f'[envbuild]\nca_bundle = "ca.pem"\nbase = "{pinned}"\n')
    res = cli("build", "cpu-py311", "--context-only", "--json")
    assert res.code == 0 and "not pinned by digest" not in res.err, res.err


def test_a_bad_base_in_envbuild_toml_names_the_key(cli: Callable[..., Result], engineless_project: Path) -> None:
    (engineless_project / "envbuild.toml").write_text('[envbuild]\nbase = {"3.11" = "Not An Image"}\n')
    res = cli("list")
    assert res.code == 2 and "base.3.11 'Not An Image' is not an image reference" in res.err


def test_new_starts_a_gitignore_for_the_build_folder(
    cli: Callable[..., Result], tmp_path: Path, fake_index: object
) -> None:
    folder = tmp_path / "fresh"
    folder.mkdir()
    res = cli("new", "cpu-py312", "--torch", "2.5.1", "--numpy", "2.1.3", "--project", str(folder))
    assert res.code == 0, res.err
    assert "/.envbuild/" in (folder / ".gitignore").read_text().splitlines()
    (folder / ".gitignore").write_text("*.pyc")  # a project's own, without a final newline
    res = cli("new", "cpu-py311", "--torch", "2.5.1", "--numpy", "2.1.3", "--project", str(folder))
    assert (folder / ".gitignore").read_text().splitlines()[0] == "*.pyc"
    assert (folder / ".gitignore").read_text().count("/.envbuild/") == 1


def test_generated_workflow_installs_envbuild_by_version_outside_its_own_repository(
    cli: Callable[..., Result], engineless_project: Path, tmp_path: Path
) -> None:
    """`pip install .` installed the team's own project (or failed: no pyproject.toml), not envbuild."""
    from envbuild import __version__

    (engineless_project / "envbuild.toml").write_text(
        '[envbuild]\n[envbuild.ci]\ncpu = "ubuntu-22.04"\ncuda = ["self-hosted", "a100"]\n'
    )
    res = cli("ci", "github")
    assert res.code == 2 and "ci: expected" in res.err  # runner labels are strings
    (engineless_project / "envbuild.toml").write_text(
        '[envbuild]\n[envbuild.ci]\ncpu = "ubuntu-22.04"\ncuda = "a100"\n'
    )
    target = tmp_path / "envbuild.yml"
    res = cli("ci", "github", "-o", str(target))
    assert res.code == 0, res.err
    text = target.read_text()
    assert f'pip install "envbuild=={__version__}"' in text and "pip install .\n" not in text
    assert '"runner": "a100"' in text and "runs-on: ubuntu-22.04" in text
    assert cli("ci", "github", "--check", "-o", str(target)).code == 0
    _validate_workflow(target)


@pytest.mark.parametrize(
    ("registry", "repository", "expected"),
    [
        # github.repository keeps the owner's case; registries refused the path (every push failed)
        (None, "Acme/Vision-Envs", ("ghcr.io", "ghcr.io/acme/vision-envs/envbuild")),
        # another registry: the login went to ghcr.io all the same, with a token that registry never takes
        (
            "registry.example.com:5000/ml",
            "Acme/x",
            ("registry.example.com:5000", "registry.example.com:5000/ml/envbuild"),
        ),
    ],
)
def test_the_workflow_pushes_to_a_lowercase_path_after_logging_in_to_that_registry(
    cli: Callable[..., Result],
    engineless_project: Path,
    tmp_path: Path,
    registry: str | None,
    repository: str,
    expected: tuple[str, str],
) -> None:
    import yaml

    login, pushed = expected
    from envbuild import refs

    target = tmp_path / "envbuild.yml"
    res = cli("ci", "github", "-o", str(target), *(["--registry", registry] if registry else []))
    assert res.code == 0, res.err
    _validate_workflow(target)
    steps = {step.get("name"): step for step in yaml.safe_load(target.read_text())["jobs"]["build"]["steps"]}
    assert steps["Log in to the registry"]["with"]["registry"] == login
    expected_password = "${{ secrets.GITHUB_TOKEN }}" if login == "ghcr.io" else "${{ secrets.REGISTRY_PASSWORD }}"
    assert steps["Log in to the registry"]["with"]["password"] == expected_password
    # the push step as the runner runs it: GitHub's expressions filled in, in bash, with an
    # envbuild that says what it was asked
    push = steps["Push"]
    assert push["shell"] == "bash"
    env = {k: v.replace("${{ github.repository }}", repository) for k, v in push["env"].items()}
    shim = tmp_path / "bin" / "envbuild"
    shim.parent.mkdir()
    shim.write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    shim.chmod(0o755)
    run = push["run"].replace("${{ matrix.profile }}", "cpu-py311")
    done = subprocess.run(
        ["bash", "-e", "-c", run],
        env={**os.environ, **env, "PATH": f"{shim.parent}:{os.environ['PATH']}"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.splitlines() == ["push", "cpu-py311", "--registry", pushed]
    refs.check("--registry", pushed, "registry")  # what push itself accepts


def test_envbuilds_own_workflow_installs_the_checkout_and_is_a_valid_workflow() -> None:
    from tests.conftest import REPO

    text = (REPO / ".github" / "workflows" / "envbuild.yml").read_text()
    assert "- run: pip install .\n" in text
    _validate_workflow(REPO / ".github" / "workflows" / "envbuild.yml")


def _validate_workflow(path: Path) -> None:
    """GitHub's workflow schema, as check-jsonschema vendors it: a real validator, not a look at the text."""
    import sys

    tool = Path(sys.executable).with_name("check-jsonschema")
    proc = subprocess.run(
        [str(tool), "--builtin-schema", "vendor.github-workflows", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_an_unset_variable_in_find_links_means_no_wheelhouse(
    engineless_project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The README's own `find_links = ["${PIP_FIND_LINKS}"]` failed wherever the variable was unset."""
    from envbuild import plan as plan_mod
    from envbuild import validate

    monkeypatch.delenv("ENVBUILD_TEST_UNSET", raising=False)
    (engineless_project / "envbuild.toml").write_text('[envbuild]\nfind_links = ["${ENVBUILD_TEST_UNSET}"]\n')
    proj = open_project(str(engineless_project))
    plan = plan_mod.make(proj, validate.load_named(proj, "cpu-py311"))
    assert plan.source.find_links == ()
    assert plan.notes == ("envbuild.toml: ${ENVBUILD_TEST_UNSET} names an unset variable: no wheelhouse from it",)


def test_a_wrong_cuda_in_a_name_that_carries_it_gets_both_fixes_at_once(write_profile: Callable[..., Path]) -> None:
    """`validate` said "use cuda 12.1" for cu124-py311 with torch 2.3.1, then complained the name says 12.4."""
    from envbuild import validate

    path = write_profile("cu124-py311", name="cu124-py311", cuda="12.4")
    errors = [d.render() for d in validate.check(path).errors]
    assert any('use cuda "12.1" and rename the profile to cu121-py311' in e for e in errors), errors


def test_a_torch_series_gets_a_fix_that_says_how_to_find_its_newest_release(
    write_profile: Callable[..., Path],
) -> None:
    """`torch: "2.10"` was "not an exact release" without a word on which 2.10.x to write."""
    from envbuild import validate

    errors = [d.render() for d in validate.check(write_profile(torch="2.10")).errors]
    wanted = 'is not an exact torch release; name a release of the 2.10 series ("2.10.0" is its first)'
    assert any(wanted in e and "envbuild new NAME --torch 2.10" in e for e in errors), errors


# Stands in for the docker CLI: it traps the signals it is sent and ends as a job would.
_CLI = (
    "import signal, sys, time\n"
    "def stop(signum, frame):\n"
    "    print('got', signum, flush=True); sys.exit(7)\n"
    "signal.signal(signal.SIGTERM, stop); signal.signal(signal.SIGINT, stop)\n"
    "print('up', flush=True); time.sleep(60)\n"
)


@pytest.mark.parametrize("signum", [15, 2])
def test_a_signal_to_run_is_passed_to_the_cli_and_its_exit_code_is_runs(signum: int) -> None:
    """subprocess.call SIGKILLed the docker CLI on SIGTERM, so it never passed the signal on to the
    container, which ran on. Here stdin is no terminal: the CLI has a session of its own and gets
    Ctrl-C through run, once."""
    import signal
    import sys

    driver = (
        "import sys, signal\n"
        "from envbuild import runner\n"
        "signal.signal(signal.SIGTERM, lambda s, f: (_ for _ in ()).throw(KeyboardInterrupt))\n"
        f"sys.exit(runner.call([sys.executable, '-c', {_CLI!r}], stdin_is_tty=False))\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", driver], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "up"
        proc.send_signal(signal.Signals(signum))
        out, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert (proc.returncode, out.strip()) == (7, f"got {signum}")


def test_run_says_a_cli_killed_by_a_signal_as_a_shell_does() -> None:
    import sys

    killed = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"]
    assert runner.call(killed, stdin_is_tty=False) == 137  # not -9, which an exit status cannot carry


@pytest.mark.parametrize(
    ("url", "elsewhere"),
    [
        ("unix:///var/run/docker.sock", None),
        ("tcp://127.0.0.1:2375", None),
        ("tcp://localhost:2375", None),
        ("ssh://me@gpu-box", "gpu-box"),
        ("ssh://me@GPU-Box:2222", "gpu-box"),
        ("tcp://10.0.0.5:2376", "10.0.0.5"),
    ],
)
def test_an_engine_on_another_machine_is_told_by_its_address(
    monkeypatch: pytest.MonkeyPatch, url: str, elsewhere: str | None
) -> None:
    monkeypatch.setenv("DOCKER_HOST", url)
    assert engine.engine_elsewhere() == elsewhere


def test_on_an_engine_elsewhere_a_volume_is_that_machines_path() -> None:
    """`-v /data/imagenet:/data` names gpu-box's folder; it was refused as missing here."""
    with pytest.raises(UsageError, match="does not exist"):
        runner.check_volume("/data/imagenet:/data:ro")
    assert runner.check_volume("/data/imagenet:/data:ro", elsewhere="gpu-box") == "/data/imagenet:/data:ro"


def test_a_builds_smoke_test_asks_for_the_gpus_of_the_engines_machine_not_this_hosts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A laptop without a GPU building on gpu-box (DOCKER_HOST=ssh://gpu-box) smoke-tested the image
    without its GPU checks, labelled "skip", though gpu-box's NVIDIA runtime serves its GPUs."""
    from envbuild import hostgpu

    monkeypatch.setattr(hostgpu, "host_has_gpu", lambda accelerator: False)
    assert hostgpu.gpus_for("auto", "cuda", absent_ok=True) == "none"  # this host, judged here
    assert hostgpu.gpus_for("auto", "cuda", absent_ok=True, present=True) == "all"  # the engine's machine
    assert hostgpu.gpus_for("auto", "cuda", absent_ok=True, present=False) == "none"
    assert hostgpu.gpus_for("auto", "cpu", absent_ok=True, present=True) == "none"
