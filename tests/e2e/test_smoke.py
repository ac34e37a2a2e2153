"""The smoke test in real containers and in a real venv, passing and failing for real reasons."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from envbuild.names import LABEL_SMOKE_CONTAINER
from envbuild.smoke import host

from ..conftest import REPO
from ..unit.test_hardening import record
from .conftest import BASE, derived, envbuild

pytestmark = pytest.mark.e2e


def _check(report: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in report["checks"] if c["name"] == name)


def test_cpu_image_passes_every_required_check(docker_client: Any, built_cpu: dict[str, Any]) -> None:
    report = host.run_in_image(docker_client, built_cpu["image_id"], gpus="none", accelerator="cpu")
    assert report["passed"] and report["exit_code"] == 0, host.summary(report)
    assert report["report_version"] == 1
    ddp = _check(report, "ddp")
    assert ddp["status"] == "pass" and ddp["facts"]["backend"] == "gloo" and ddp["facts"]["world_size"] == 2
    assert ddp["facts"]["all_reduce"] == 3.0
    assert _check(report, "amp")["facts"]["steps"] == ["cpu/bfloat16"]
    assert _check(report, "dataloader")["facts"]["batches"] == 8
    assert _check(report, "gpu")["status"] == "skip" and "CPU profile" in _check(report, "gpu")["reason"]
    assert _check(report, "versions")["facts"]["torch"] == "2.13.0+cpu"


def _smoke_as_root_changed(cli: Any, base: str, *lines: str) -> dict[str, Any]:
    """The smoke report of an image built FROM `base` with `lines` run as root, removed after."""
    image = derived(cli, base, "USER root", *lines, "USER 1000:1000")
    try:
        return host.run_in_image(cli, image.id, gpus="none", accelerator="cpu")
    finally:
        cli.images.remove(image.id, force=True, noprune=True)


def _only_integrity_fails(cli: Any, base: str, *lines: str) -> dict[str, Any]:
    """The integrity check of such an image, which must be the one check that failed."""
    report = _smoke_as_root_changed(cli, base, *lines)
    integrity = _check(report, "integrity")
    assert integrity["status"] == "fail" and report["failed"] == ["integrity"], host.summary(report)
    return integrity


def test_numpy_that_differs_from_the_lockfile_fails_versions(docker_client: Any, built_cpu: dict[str, Any]) -> None:
    report = _smoke_as_root_changed(
        docker_client,
        built_cpu["image_id"],
        "RUN sed -i 's/^Version: 2.1.3$/Version: 2.1.2/' "
        "/opt/venv/lib/python3.11/site-packages/numpy-2.1.3.dist-info/METADATA",
    )
    versions = _check(report, "versions")
    assert not report["passed"] and report["exit_code"] == 1
    assert versions["status"] == "fail"
    assert "numpy 2.1.2 (lock: 2.1.3)" in versions["reason"]
    assert "envbuild lock cpu-py311 && envbuild build cpu-py311" in versions["remedy"]


def test_a_locked_package_shadowed_on_pythonpath_fails_integrity_and_a_banner_spoils_no_report(
    docker_client: Any, built_cpu: dict[str, Any]
) -> None:
    """`FROM image` + `ENV PYTHONPATH=/evil` with a copy of a locked package there: the copy is what
    runs, and the manifest only covers /opt/venv, so every check passed. A sitecustomize on that
    path printing a banner also made the run "crash (exit 0) before its report"."""
    site = "/opt/venv/lib/python3.11/site-packages"
    integrity = _only_integrity_fails(
        docker_client,
        built_cpu["image_id"],
        f"RUN mkdir /evil && cp -r {site}/einops /evil/ && echo 'print(\"welcome\")' > /evil/sitecustomize.py",
        "ENV PYTHONPATH=/evil",
    )
    assert "einops (einops) from /evil/einops/__init__.py" in integrity["reason"]
    assert "PYTHONPATH=/evil comes first" in integrity["reason"] and "PYTHONPATH" in integrity["remedy"]


def test_a_module_in_a_derived_images_workdir_or_a_library_on_ld_library_path_fails_integrity(
    docker_client: Any, built_cpu: dict[str, Any]
) -> None:
    """`WORKDIR /app` + `COPY . .` of a repo with an `einops.py`: the smoke test runs in its own
    folder and passed, while `python train.py` in /app imports that file. A `numpy/` data folder
    (no __init__.py) is no package and must not count."""
    integrity = _only_integrity_fails(  # a preload alone fails nothing
        docker_client,
        built_cpu["image_id"],
        "RUN mkdir -p /app/numpy && echo 'x = 1' > /app/einops.py && echo 'import einops' > /app/train.py",
        "WORKDIR /app",
        "ENV LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libm.so.6",  # as a jemalloc preload would be
        # a copy of a library torch ships, where the dynamic loader looks before torch's RUNPATH
        "RUN mkdir /evil && cp /opt/venv/lib/python3.11/site-packages/torch/lib/libc10.so /evil/",
        "ENV LD_LIBRARY_PATH=/evil",
    )
    assert integrity["facts"]["preload"] == "LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libm.so.6"
    assert "einops (einops) from /app/einops.py (the image's WORKDIR /app)" in integrity["reason"]
    assert "numpy" not in integrity["reason"] and "WORKDIR" in integrity["remedy"]
    assert "libc10.so from /evil/libc10.so (LD_LIBRARY_PATH=/evil comes first)" in integrity["reason"]
    assert "take those folders off LD_LIBRARY_PATH" in integrity["remedy"]


def test_a_preload_of_the_os_libgomp_over_torchs_own_fails_integrity_naming_the_preload(
    docker_client: Any, built_cpu: dict[str, Any]
) -> None:
    """`ENV LD_PRELOAD=.../libgomp.so.1`, a common OpenMP-clash workaround: torch's CPU wheel ships
    its own libgomp.so.1, and the loader then takes the OS's (the toolchain brings one) in its
    place. Every other check passes on it; the report named LD_LIBRARY_PATH, which was not set."""
    system = "/usr/lib/x86_64-linux-gnu/libgomp.so.1"
    integrity = _only_integrity_fails(docker_client, built_cpu["image_id"], f"ENV LD_PRELOAD={system}")
    assert f"libgomp.so.1 from {system} (preloaded: LD_PRELOAD={system})" in integrity["reason"]
    assert integrity["remedy"].startswith("drop them from LD_PRELOAD")
    assert "LD_LIBRARY_PATH" not in integrity["reason"]


def test_a_patched_os_library_fails_integrity_naming_it_and_its_package(
    docker_client: Any, built_cpu: dict[str, Any]
) -> None:
    """torch links against the OS's libstdc++, which no scan of the venv sees: with a byte appended
    to it (a `docker commit` of a patched container) every check passed."""
    integrity = _only_integrity_fails(
        docker_client,
        built_cpu["image_id"],
        "RUN printf 'x' >> \"$(readlink -f /usr/lib/x86_64-linux-gnu/libstdc++.so.6)\"",
    )
    said = "OS libraries loaded here differ from their package's files: /usr/lib/x86_64-linux-gnu/libstdc++.so.6."
    assert said in integrity["reason"] and integrity["reason"].endswith(" (libstdc++6)")
    assert integrity["remedy"].startswith("an OS package's files were changed after the build without apt")
    assert "envbuild build cpu-py311" in integrity["remedy"]


def test_an_os_package_installed_in_a_derived_image_fails_exact_and_is_listed_with_pins(
    docker_client: Any, built_cpu: dict[str, Any]
) -> None:
    """An apt-get or dpkg install leaves files dpkg vouches for: the OS libraries check passes it, and
    so did exact, which means the image as built. A package made and installed here, offline."""
    control = "Package: envbuild-probe\\nVersion: 1.0\\nArchitecture: all\\nMaintainer: e2e\\nDescription: probe\\n"
    image = derived(
        docker_client,
        built_cpu["image_id"],
        "USER root",
        f"RUN mkdir -p /tmp/probe/DEBIAN && printf '{control}' > /tmp/probe/DEBIAN/control "
        "&& dpkg-deb --build /tmp/probe /tmp/probe.deb && dpkg -i /tmp/probe.deb && rm -rf /tmp/probe /tmp/probe.deb",
        "USER 1000:1000",
    )
    try:
        exact = host.run_in_image(docker_client, image.id, gpus="none", only=["integrity"])
        integrity = _check(exact, "integrity")
        assert integrity["reason"].endswith("1 OS package(s) not as built: envbuild-probe (added)"), integrity
        assert "check it with --lock-match pins" in integrity["remedy"]
        pins = host.run_in_image(docker_client, image.id, gpus="none", only=["integrity"], lock_match="pins")
        assert pins["passed"], host.summary(pins)
        assert _check(pins, "integrity")["facts"]["os_packages_changed"] == ["envbuild-probe (added)"]
    finally:
        docker_client.images.remove(image.id, force=True, noprune=True)


def test_a_patched_copy_of_the_environment_first_on_path_fails_integrity(
    docker_client: Any, built_cpu: dict[str, Any]
) -> None:
    """Every check runs in the `python` on the image's PATH: a patched copy of /opt/venv put first
    there passed them all, the manifest vouching for the untouched original."""
    site = "lib/python3.11/site-packages"
    integrity = _only_integrity_fails(
        docker_client,
        built_cpu["image_id"],
        f"RUN cp -a /opt/venv /alt && echo 'patched = True' >> /alt/{site}/einops/__init__.py",
        "ENV PATH=/alt/bin:$PATH",
    )
    assert "`python` here is /alt/bin/python (prefix /alt), not the environment's: /opt/venv" in integrity["reason"]
    assert integrity["remedy"].startswith("put /opt/venv/bin first on PATH")


def test_smoke_name_tests_the_image_its_tag_points_at(
    docker_client: Any, built_cpu: dict[str, Any], e2e_project: Path, repo_name: str, tmp_path: Path
) -> None:
    # What `run NAME` starts and `push NAME` publishes, built here or pulled (a marker label stands in for
    # a pulled image): not the project's last local build, which this project also has.
    image = derived(docker_client, built_cpu["image_id"], 'LABEL io.envbuild.test-marker="pulled"')
    repo = f"{repo_name}-pick"
    try:
        image.tag(repo, tag="cpu-py311-untested")  # before any tested image: the --no-smoke build
        res = envbuild("smoke", "cpu-py311", "--tag", repo, "--json", str(tmp_path / "a.json"), cwd=e2e_project)
        assert res.returncode == 0, res.stdout + res.stderr
        report = json.loads((tmp_path / "a.json").read_text())
        assert (report["image"], report["ref"]) == (image.id, f"{repo}:cpu-py311-untested")
        assert "smoke passed in" in res.stdout and f"({repo}:cpu-py311-untested, {image.id[:19]})" in res.stdout
        res = envbuild("run", "cpu-py311", "--tag", repo, "--", "python", "-c", "print(7 * 6)", cwd=e2e_project)
        assert res.returncode == 0 and res.stdout.strip() == "42", res.stderr  # run takes the same image
        assert f"note: {repo}:cpu-py311-untested is a --no-smoke build" in res.stderr
        docker_client.images.get(built_cpu["image_id"]).tag(repo, tag="cpu-py311")  # a tested one wins
        res = envbuild("smoke", "cpu-py311", "--tag", repo, "--json", str(tmp_path / "b.json"), cwd=e2e_project)
        assert res.returncode == 0, res.stdout + res.stderr
        report = json.loads((tmp_path / "b.json").read_text())
        assert (report["image"], report["ref"]) == (built_cpu["image_id"], f"{repo}:cpu-py311")
        image.tag(repo, tag="cpu-py311")  # the tag moved (a pull): the smoke test follows it
        res = envbuild("smoke", "cpu-py311", "--tag", repo, "--json", str(tmp_path / "c.json"), cwd=e2e_project)
        assert res.returncode == 0, res.stdout + res.stderr
        assert json.loads((tmp_path / "c.json").read_text())["image"] == image.id != built_cpu["built_image_id"]
    finally:
        for ref in (f"{repo}:cpu-py311", f"{repo}:cpu-py311-untested", image.id):  # the last tag takes the image
            with contextlib.suppress(Exception):
                docker_client.images.remove(ref, noprune=True)


def test_only_runs_the_named_checks_and_keeps_the_whole_runs_report(
    built_cpu: dict[str, Any], e2e_project: Path, repo_name: str, tmp_path: Path
) -> None:
    kept = e2e_project / ".envbuild" / "cpu-py311" / "smoke.json"  # the build's whole run
    before = kept.read_bytes()
    out = tmp_path / "only.json"
    # a project check named as the profile lists it (checks/train_tiny.py)
    res = envbuild(
        "smoke",
        "cpu-py311",
        "--only",
        "versions",
        "--only",
        "check:checks/train_tiny.py",
        "--tag",
        repo_name,
        "--json",
        str(out),
        cwd=e2e_project,
        env={"COLUMNS": "200"},
    )
    assert res.returncode == 0, res.stdout + res.stderr
    report = json.loads(out.read_text())
    # the labels check still holds the image's labels to what ran
    assert [c["name"] for c in report["checks"]] == ["versions", "check:train_tiny.py", "labels"]
    assert report["passed"] and report["only"] == ["check:checks/train_tiny.py", "versions"]
    assert "not the whole smoke test" in res.stdout
    assert kept.read_bytes() == before, "a run of some checks replaced the report of the whole smoke test"
    # a script the image was not built with is a failed check that names the ones it has
    res = envbuild(
        "smoke", "cpu-py311", "--only", "check:nope.py", "--tag", repo_name, "--json", str(out), cwd=e2e_project
    )
    assert res.returncode == 1
    missing = _check(json.loads(out.read_text()), "check:nope.py")
    assert missing["status"] == "fail" and "check:train_tiny.py" in missing["remedy"]


def test_tiny_dev_shm_is_reported_with_the_remedy(docker_client: Any, built_cpu: dict[str, Any]) -> None:
    report = host.run_in_image(docker_client, built_cpu["image_id"], gpus="none", accelerator="cpu", shm_size="1m")
    loader = _check(report, "dataloader")
    assert loader["status"] == "fail"
    assert "--shm-size" in loader["remedy"] and "/dev/shm is too small (1 MiB)" in loader["remedy"]
    assert "--shm-size=8g or --ipc=host" in _check(report, "ddp")["facts"]["shm_warning"]


def test_the_groups_a_rocm_container_is_given_are_ones_the_engine_takes_in_the_image(
    docker_client: Any, built_cpu: dict[str, Any], tmp_path: Path
) -> None:
    """`video` by name (the image's /etc/group has it) and the device nodes' own groups by number
    (it has no `render`): the engine refuses a name it cannot find, and would not start the container."""
    import os

    from envbuild import hostgpu
    from envbuild.smoke import container

    kfd, dri = tmp_path / "kfd", tmp_path / "dri"
    kfd.touch()
    dri.mkdir()
    (dri / "renderD128").touch()
    os.chown(kfd, 0, 4242)
    os.chown(dri / "renderD128", 0, 4243)
    groups = hostgpu.rocm_groups((str(kfd), str(dri)))
    out = docker_client.containers.run(
        built_cpu["image_id"], ["id", "-G"], group_add=groups, user="1000:1000", remove=True
    )
    assert {"44", "4242", "4243"} <= set(out.decode().split())  # video is 44 in Debian
    assert container.gpu_kwargs("rocm", "none") == {}  # what --gpus none asks for: nothing


def test_gpu_request_on_a_host_without_gpus(docker_client: Any, built_cpu: dict[str, Any], e2e_project: Path) -> None:
    # The CPU image, relabelled and re-expected as a CUDA build: envbuild asks the engine for GPUs
    # (device_requests), this engine has no NVIDIA runtime and refuses. The user must still get the
    # report: the gpu check failing with the engine's words and the fix, the rest checked as well.
    image = derived(
        docker_client,
        built_cpu["image_id"],
        'LABEL io.envbuild.accelerator="cuda"',
        "USER root",
        "RUN python -c \"import json; p='/opt/envbuild/expect.json'; e=json.load(open(p)); "
        "e.update(accelerator='cuda', cuda='12.1'); json.dump(e, open(p, 'w'))\"",
        "USER 1000:1000",
    )
    out = e2e_project / "gpu-refused.json"
    try:
        res = envbuild("smoke", image.id, "--gpus", "all", "--json", str(out), cwd=e2e_project, env={"COLUMNS": "200"})
        leftovers = _smoke_containers(docker_client, image.id)
    finally:
        docker_client.images.remove(image.id, force=True, noprune=True)
    assert res.returncode == 1, res.stdout + res.stderr
    report = json.loads(out.read_text())
    gpu = _check(report, "gpu")
    assert gpu["status"] == "fail"
    assert gpu["reason"].startswith("the container engine gave this container no GPU: could not select device driver")
    assert "nvidia-ctk runtime configure" in gpu["remedy"] and "NVIDIA container toolkit" in res.stdout
    assert report["gpu_refused"] == gpu["reason"].split(": ", 1)[1]
    # still checked without the GPU: torch.version.cuda is None in this CPU build, 12.1 is expected
    assert _check(report, "versions")["status"] == "fail" and "gpu" in report["failed"]
    # the refused container and the one that ran must both be gone
    assert leftovers == []


def _smoke_containers(docker_client: Any, image: str) -> list[Any]:
    # ignore_removed: docker-py inspects each listed container, and one the run creates or removes
    # in between answers 404 (seen once in CI, failing the poll before the SIGTERM was sent)
    found = docker_client.containers.list(
        all=True, filters={"label": f"{LABEL_SMOKE_CONTAINER}={image}"}, ignore_removed=True
    )
    return list(found)


def _sigterm_when(
    cmd: list[str], ready: Callable[[int], bool], what: str, wait: float, poll: float = 0.2
) -> tuple[int, str]:
    """Start `cmd`, send it SIGTERM once `ready(its pid)` holds; its exit code and stderr."""
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + wait
        while not ready(proc.pid):
            assert proc.poll() is None, f"the run ended before {what}"
            assert time.monotonic() < deadline, f"{what}: not within {wait:.0f}s"
            time.sleep(poll)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, err


def test_sigterm_during_a_smoke_run_removes_its_container(docker_client: Any, built_cpu: dict[str, Any]) -> None:
    image = built_cpu["image_id"]
    try:
        code, err = _sigterm_when(
            [sys.executable, "-m", "envbuild", "smoke", image, "--gpus", "none"],
            lambda _: any(c.status == "running" for c in _smoke_containers(docker_client, image)),
            "the smoke container ran",
            wait=60,
        )
    finally:
        for leftover in _smoke_containers(docker_client, image):
            leftover.remove(force=True)
            pytest.fail(f"SIGTERM left the smoke container {leftover.short_id} behind")
    assert code == 143 and "terminated" in err, err
    record("interrupt_smoke_container", signal="SIGTERM", exit_code=code, containers_left=0)


def test_sweep_removes_only_smoke_containers_that_finished(docker_client: Any, built_cpu: dict[str, Any]) -> None:
    # what a SIGKILLed envbuild leaves: a finished smoke container; the next smoke run sweeps it
    image = built_cpu["image_id"]
    label = {LABEL_SMOKE_CONTAINER: image}
    smoke = ["python", "-m", "envbuild_smoke"]  # as run_in_image starts it (the image's copy, here)
    quick, env = [*smoke, "--help"], {"PYTHONPATH": "/opt/envbuild"}
    finished = docker_client.containers.create(image, quick, labels=label, environment=env)
    running = docker_client.containers.create(image, [*smoke, "--gpus", "none"], labels=label, environment=env)
    inherited = docker_client.containers.create(image, ["true"], labels=label)  # label from a committed image
    foreign = docker_client.containers.create(image, quick, environment=env)
    # killed before start, by an envbuild that ran the image's own envbuild-smoke
    never_started = docker_client.containers.create(image, ["envbuild-smoke", "--help"], labels=label)
    ours = (finished, never_started, running, inherited, foreign)
    try:
        for c in (finished, running, inherited, foreign):
            c.start()
        for c in (finished, inherited, foreign):
            assert c.wait(timeout=60)["StatusCode"] == 0
        # other runs' leftovers may go too: only these containers are asserted on
        swept = host.sweep_stale(docker_client)  # seconds old: they may belong to a live run
        assert finished.id not in swept and never_started.id not in swept
        swept = host.sweep_stale(docker_client, older_than=0)
        assert [c.id in swept for c in ours] == [True, True, False, False, False]
        left = {c.id for c in docker_client.containers.list(all=True, ignore_removed=True)}
        assert not {finished.id, never_started.id} & left and {running.id, inherited.id, foreign.id} <= left
    finally:
        for c in ours:
            with contextlib.suppress(Exception):
                c.remove(force=True)


def test_local_mode_passes_on_the_cpu_venv(cpu_venv: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    res = envbuild(
        "smoke",
        "--local",
        "cpu-py311",
        "--python",
        str(cpu_venv / "bin" / "python"),
        "--lock-match",
        "exact",
        "--json",
        str(out),
        cwd=REPO,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    report = json.loads(out.read_text())
    assert report["passed"] and _check(report, "ddp")["status"] == "pass"


def _processes() -> dict[int, tuple[str, int, str]]:
    """{pid: (state, parent pid, start time)} from /proc, zombies left out."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # it exited while we looked
        if fields[0] != "Z":
            found[int(stat.parent.name)] = (fields[0], int(fields[1]), fields[19])
    return found


def _tree(root: int, procs: dict[int, tuple[str, int, str]]) -> set[tuple[int, str]]:
    """(pid, start time) of `root` and everything below it."""
    members, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid in procs:
            members.add((pid, procs[pid][2]))
            todo += [child for child, (_, parent, _) in procs.items() if parent == pid]
    return members


def test_sigterm_during_local_mode_stops_every_rank(cpu_venv: Path) -> None:
    python = str(cpu_venv / "bin" / "python")
    running: set[tuple[int, str]] = set()
    # multiprocessing's forkserver keeps its socket in a pymp-* folder that only a clean exit removes
    tmp = Path(tempfile.gettempdir())

    def pymp() -> set[Path]:  # the run's own folder is in envbuild's (tmpdirs), so looked for there too
        return set(tmp.glob("pymp-*")) | set(tmp.glob("envbuild-*/*/pymp-*"))

    pymp_before = pymp()

    def ranks_run(cli: int) -> bool:
        nonlocal running
        # this run's processes only: another smoke run on the machine (a test suite alongside) is not ours
        tree = _tree(cli, _processes())
        running = tree - {(pid, start) for pid, start in tree if pid == cli}
        # the smoke module, its resource tracker and forkserver, and at least one rank (or DataLoader worker)
        return len(running) >= 4

    code, err = _sigterm_when(
        [sys.executable, "-m", "envbuild", "smoke", "--local", "cpu-py311", "--python", python, "--lock-match", "none"],
        ranks_run,
        "the DDP ranks started",
        wait=120,
        # with torch's bytecode compiled, the ranks (forked from a forkserver that has torch loaded
        # already) live ~0.4 s here: a 0.2 s poll misses them about half the time
        poll=0.002,
    )
    assert code == 143, err
    time.sleep(1)
    alive = {(pid, start) for pid, (_, _, start) in _processes().items()}
    assert not running & alive, f"still running after the interrupt: {sorted(running & alive)}"
    assert pymp() <= pymp_before, "the killed forkserver left its folder behind"
    record(
        "interrupt_smoke_local", signal="SIGTERM", exit_code=code, processes_at_signal=len(running), processes_left=0
    )


def test_gpu_profile_without_a_gpu_fails_the_gpu_checks(cpu_venv: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    res = envbuild(
        "smoke", "--local", "cu121-py311", "--python", str(cpu_venv / "bin" / "python"), "--json", str(out), cwd=REPO
    )
    assert res.returncode == 1
    report = json.loads(out.read_text())
    gpu = _check(report, "gpu")
    assert gpu["status"] == "fail" and gpu["reason"] == "no GPU visible: torch.cuda.is_available() is False"
    assert "--gpus all" in gpu["remedy"]
    versions = _check(report, "versions")
    assert versions["status"] == "fail"  # a CPU torch where CUDA 12.1 is expected
    # on the host there is no image to rebuild: the remedy is an environment from the lockfile
    assert "envbuild venv cu121-py311 DIR" in versions["remedy"] and "rebuild the image" not in versions["remedy"]
    res = envbuild(
        "smoke",
        "--local",
        "cu121-py311",
        "--python",
        str(cpu_venv / "bin" / "python"),
        "--gpus",
        "none",
        "--json",
        str(out),
        cwd=REPO,
    )
    report = json.loads(out.read_text())
    assert _check(report, "gpu")["status"] == "skip" and "--gpus none" in _check(report, "gpu")["reason"]


def test_host_smoke_script_on_a_torch_install_without_envbuild(cpu_venv: Path, tmp_path: Path) -> None:
    # scripts/host_smoke.py is what runs on a GPU host that has torch but not envbuild: wheels of
    # envbuild's dependencies are fetched here (PyPI), unpacked there, a profile is generated from
    # the install, validated, and every smoke check runs. The CPU venv stands in for that host.
    import subprocess
    import sys

    script = str(REPO / "scripts" / "host_smoke.py")
    wheels, out = tmp_path / "wheels", tmp_path / "out"
    fetch = subprocess.run(
        [sys.executable, script, "wheels", "--python-version", "3.11", "--dest", str(wheels)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert fetch.returncode == 0, fetch.stderr
    assert not list(wheels.glob("uv-*.whl")) and list(wheels.glob("pydantic_core-*cp311*.whl"))
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}  # nothing of this venv leaks in
    res = subprocess.run(
        [str(cpu_venv / "bin" / "python"), script, "run", "--out", str(out), "--wheels", str(wheels), "--gpus", "none"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=600,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    report = (out / "report.md").read_text()
    assert 'name: "cpu-py311-host"' in report and 'torch: "2.13.0"' in report
    assert "`envbuild validate`: exit 0 (valid)" in report
    assert "| ddp | pass |" in report and "| gpu | skip |" in report
    # doctor judges the repository's profiles against this host: here no GPU, so only CPU ones run.
    assert "| cpu-py311 | yes | CPU profile |" in report
    assert "| cu121-py311 | no | no NVIDIA GPU on this host |" in report
    assert json.loads((out / "doctor.json").read_text())["gpus"] == []
    smoke = json.loads((out / "smoke.json").read_text())
    assert smoke["passed"] and _check(smoke, "versions")["facts"]["executable"] == str(cpu_venv / "bin" / "python")


@pytest.mark.parametrize(
    "command",
    [
        ["smoke", "cu124-py312"],
        ["run", "cu124-py312", "--", "python", "-c", "1"],
        ["push", "cu124-py312", "--registry", "localhost:5999/none"],
    ],
)
def test_an_image_that_was_never_built_is_a_usage_error(
    docker_client: Any, e2e_project: Path, command: list[str]
) -> None:
    """Not a failed smoke run (8), and not `docker run` asking Docker Hub for it (125)."""
    repo = "envbuild-e2e-never-built"
    assert docker_client.images.list(name=repo) == []
    res = envbuild(*command[:2], "--tag", repo, *command[2:], cwd=e2e_project, timeout=120)
    assert res.returncode == 2, res.stderr
    assert f"error: no image {repo}:cu124-py312 in the engine" in res.stderr
    assert "fix: build it (envbuild build cu124-py312) or pull it (envbuild pull cu124-py312)" in res.stderr
    assert "registry-1.docker.io" not in res.stderr


def test_smoke_of_an_image_that_is_not_an_envbuild_image(docker_client: Any, e2e_project: Path) -> None:
    # docker refuses to start a command the image lacks; that used to read as an OCI runtime error
    base = BASE
    res = envbuild("smoke", base, cwd=e2e_project)
    assert res.returncode == 8, res.stderr
    assert f"{base} has no envbuild-smoke: it is not an envbuild image" in res.stderr
    assert "OCI runtime" not in res.stderr
    assert _smoke_containers(docker_client, docker_client.images.get(base).id) == []


def test_smoke_of_an_envbuild_labelled_image_without_python_or_a_shell_says_so(
    docker_client: Any, e2e_project: Path
) -> None:
    """Its labels say envbuild built it, so "not an envbuild image" would mislead: the smoke test
    cannot start there, and the message says what it needs."""
    label = 'LABEL io.envbuild.profile="cpu-py311"'
    no_python = derived(docker_client, BASE, label)
    no_shell = derived(docker_client, "scratch", label)
    try:
        for image, said in ((no_python, "python: not found"), (no_shell, "/bin/sh")):
            res = envbuild("smoke", image.id, cwd=e2e_project)
            assert res.returncode == 8, res.stderr
            assert f"the smoke test cannot start in {image.id}" in res.stderr and said in res.stderr, res.stderr
            assert "it runs the image's /bin/sh and `python`" in res.stderr
            assert _smoke_containers(docker_client, image.id) == []
    finally:
        for image in (no_python, no_shell):
            docker_client.images.remove(image.id, force=True)
