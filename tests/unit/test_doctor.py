"""`envbuild doctor`'s verdict per profile: the host as nvidia-smi would describe it, the shipped profiles.

No GPU exists here, so the host is described rather than probed; the decisions are the ones the
smoke test makes inside the image (driver floors, architecture coverage), and must agree with it.
"""

from __future__ import annotations

import os
import shutil
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from envbuild import doctor, validate
from envbuild.project import open_project
from tests.conftest import Result

H200 = doctor.Gpu(0, "NVIDIA H200", "9.0", 143771)
B200 = doctor.Gpu(0, "NVIDIA B200", "10.0", 183359)
RTX5090 = doctor.Gpu(0, "NVIDIA GeForce RTX 5090", "12.0", 32607)
GB10 = doctor.Gpu(0, "NVIDIA GB10", "12.1", 122502)
L4 = doctor.Gpu(0, "NVIDIA L4", "8.9", 23034)


def _verdicts(project: Path, report: doctor.HostReport) -> dict[str, tuple[bool, str]]:
    return {v["profile"]: (v["runs_here"], v["why"]) for v in doctor.verdicts(open_project(str(project)), report)}


@pytest.mark.parametrize(
    ("gpu", "driver", "profile", "runs", "why"),
    [
        (H200, "570.86.10", "cu121-py311", True, "1 GPU(s), driver 570.86.10"),
        # Between the minor-version floor (525.60.13) and full support (560.28.03).
        (H200, "535.104.05", "cu126-py312", True, "runs CUDA 12.6 through minor-version compatibility"),
        (
            H200,
            "535.104.05",
            "cu130-py313",
            False,
            "driver 535.104.05 is older than 580, the oldest that runs CUDA 13.0",
        ),
        # Blackwell: torch 2.3's CUDA 12.1 build stops at sm_90 with no PTX, so is_available() lies there.
        (RTX5090, "580.65.06", "cu121-py311", False, "NVIDIA GeForce RTX 5090 (sm_120) is not in the cu121 build"),
        (B200, "580.65.06", "cu128-py313", True, "1 GPU(s)"),
        # No build lists sm_121 or sm_89: sm_120 and sm_86 SASS run there (same major, lower minor),
        # as on every DGX Spark and RTX 4090 / L4 running PyPI's wheels.
        (GB10, "580.65.06", "cu130-py313", True, "1 GPU(s)"),
        (GB10, "580.65.06", "cu128-py313", True, "1 GPU(s)"),
        (L4, "570.86.10", "cu121-py311", True, "1 GPU(s)"),
        # a new major needs its own SASS or PTX: cu126 stops at sm_90 (COMPAT-FACTS)
        (B200, "580.65.06", "cu126-py312", False, "NVIDIA B200 (sm_100) is not in the cu126 build"),
    ],
)
def test_cuda_verdicts(project: Path, gpu: doctor.Gpu, driver: str, profile: str, runs: bool, why: str) -> None:
    report = doctor.HostReport(nvidia_driver=driver, gpus=[gpu], nvidia_runtime=True)
    got_runs, got_why = _verdicts(project, report)[profile]
    assert got_runs is runs
    assert why in got_why


def test_a_host_without_gpus_runs_only_cpu_profiles(project: Path) -> None:
    verdicts = _verdicts(project, doctor.HostReport())
    assert {name for name, (runs, _) in verdicts.items() if runs} == {"cpu-py311", "cpu-py311-conda", "cpu-py312"}
    assert verdicts["cu121-py311"] == (False, "no NVIDIA GPU on this host")
    assert verdicts["rocm63-py312"] == (False, "no ROCm device (/dev/kfd) on this host")
    assert verdicts["cpu-py311"] == (True, "CPU profile")


def test_without_an_engine_no_image_runs_but_the_gpu_verdict_stays(project: Path) -> None:
    """A GPU host with no Docker (where `envbuild venv` and `smoke --local` still work): seen on the
    lent H200, where every profile read "unknown" and the driver's verdict was lost."""
    report = doctor.HostReport(
        nvidia_driver="535.104.05", gpus=[H200], engine={"reachable": False, "error": "no socket there"}
    )
    rows = {v["profile"]: v for v in doctor.verdicts(open_project(str(project)), report)}
    assert not any(v["runs_here"] for v in rows.values())
    assert rows["cu126-py312"]["host_ok"] is True
    assert rows["cu126-py312"]["why"] == (
        "no image runs here: the Docker engine did not answer (see engine above); the host itself suits it: "
        "driver 535.104.05 runs CUDA 12.6 through minor-version compatibility (full support from 560.28.03)"
    )
    assert rows["cu130-py313"]["host_ok"] is False
    assert "and the host does not suit it: driver 535.104.05 is older than 580" in rows["cu130-py313"]["why"]
    assert rows["rocm63-py312"]["host_ok"] is False


def test_one_invalid_profile_is_a_row_of_the_report_not_the_end_of_it(
    engineless_project: Path, write_profile: Callable[..., Path], cli: Callable[..., Result]
) -> None:
    """`doctor` stopped at the first invalid profile with validate's error, so a host check in a
    project with one broken file said nothing about the engine, the GPUs or the other profiles."""
    write_profile(name="cu121-py312", python="3.12", torch="2.2.2", torchvision=None, numpy="2.0.2")
    done = cli("doctor", "--no-network", "--json")
    assert done.code == 0, done.err
    import json

    rows = {row["profile"]: row for row in json.loads(done.out)["profiles"]}
    assert rows["cpu-py311"]["host_ok"] is True  # no engine here: the host verdict stands
    bad = rows["cu121-py312"]
    assert (bad["runs_here"], bad["accelerator"]) == (False, None)
    assert bad["why"].startswith("not valid: profiles/cu121-py312.yaml:6: numpy: torch 2.2.2 was compiled against")
    assert bad["why"].endswith("run `envbuild validate cu121-py312`")


def test_rocm_host(project: Path) -> None:
    verdicts = _verdicts(project, doctor.HostReport(rocm_devices=["renderD128", "renderD129"]))
    assert verdicts["rocm63-py312"] == (True, "2 ROCm render node(s)")


def test_the_disk_note_is_sized_by_the_projects_heaviest_build() -> None:
    engine_facts = {"reachable": True, "data_root": "/var/lib/docker", "free_bytes": 10 * 10**9}
    cpu_only = doctor.HostReport(engine=engine_facts, profiles=[{"accelerator": "cpu"}])
    assert doctor.disk_note(cpu_only) is None  # 10 GB is plenty for CPU builds
    mixed = doctor.HostReport(engine=engine_facts, profiles=[{"accelerator": "cpu"}, {"accelerator": "cuda"}])
    note = doctor.disk_note(mixed)
    assert note is not None and "10.0 GB free (/var/lib/docker): a CUDA build needs about 15 GB" in note
    rocm = doctor.HostReport(engine={**engine_facts, "free_bytes": 20 * 10**9}, profiles=[{"accelerator": "rocm"}])
    assert "a ROCm build needs about 40 GB" in (doctor.disk_note(rocm) or "")
    remote = doctor.HostReport(engine={"reachable": True, "data_root": "/x", "free_bytes": None})
    assert doctor.disk_note(remote) is None  # an engine elsewhere: its disk is not this machine's to read


def test_network_probes_tell_reachable_intercepted_and_unreachable_apart() -> None:
    """doctor checked the engine, disk and GPUs, not what blocks a first build: the indexes and TLS."""
    import socket
    import ssl
    import urllib.error

    from envbuild import reach

    def public_ok(url: str, ctx: ssl.SSLContext) -> None:
        return None

    def no_dns(url: str, ctx: ssl.SSLContext) -> None:
        raise urllib.error.URLError(socket.gaierror(-2, "Name or service not known"))

    assert reach.probe("https://x/", "package index", "f", opener=public_ok).state == "reachable"
    found = reach.probe("https://x/", "package index", "use a mirror", opener=no_dns)
    assert (found.state, found.detail, found.fix) == ("unreachable", "the name does not resolve (DNS)", "use a mirror")
    calls: list[int] = []

    def proxy(url: str, ctx: ssl.SSLContext) -> None:
        calls.append(1)
        if len(calls) == 1:  # the public CAs refuse it; this machine's store (the second try) accepts it
            raise urllib.error.URLError(ssl.SSLCertVerificationError(1, "self-signed certificate in certificate chain"))

    found = reach.probe("https://x/", "package index", "f", opener=proxy)
    assert found.state == "intercepted" and "--ca-bundle /etc/ssl/certs/ca-certificates.crt" in found.fix


def test_the_registry_of_a_base_image() -> None:
    from envbuild.doctor import registry_url

    assert registry_url("debian:bookworm-slim@sha256:" + "0" * 64) == "https://registry-1.docker.io/v2/"
    assert registry_url("nvidia/cuda:12.1.0-devel") == "https://registry-1.docker.io/v2/"
    assert registry_url("ghcr.io/acme/base:1") == "https://ghcr.io/v2/"
    assert registry_url("localhost:5000/base") == "https://localhost:5000/v2/"


def test_a_registry_the_engine_speaks_plain_http_to_is_probed_so() -> None:
    """A local registry (127.0.0.1:5000, which the engine reaches over HTTP by default) was probed
    over TLS and called unreachable; names the engine lists as insecure too."""
    from envbuild.doctor import registry_url

    engine = {"hosts": ["registry.lan:5000"], "cidrs": ["127.0.0.0/8", "10.20.0.0/16"]}
    assert registry_url("127.0.0.1:5000/envs/x", engine) == "http://127.0.0.1:5000/v2/"
    assert registry_url("localhost:5000/envs/x", engine) == "http://localhost:5000/v2/"
    assert registry_url("10.20.3.4:5000/x", engine) == "http://10.20.3.4:5000/v2/"
    assert registry_url("registry.lan:5000/x", engine) == "http://registry.lan:5000/v2/"
    assert registry_url("10.30.3.4:5000/x", engine) == "https://10.30.3.4:5000/v2/"
    assert registry_url("ghcr.io/acme/envs/x", engine) == "https://ghcr.io/v2/"
    assert registry_url("[::1]:5000/x", {"hosts": [], "cidrs": ["::1/128"]}) == "http://[::1]:5000/v2/"


def test_doctor_probes_the_registries_push_goes_to(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """doctor checked where a build fetches from, not where `push` goes: a registry that was down
    (or a typo in envbuild.toml's `registry`) showed only after a whole build, at the push."""
    import http.server
    import threading
    import urllib.error

    from envbuild import reach

    class Registry(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self) -> None:  # a registry's /v2/ without credentials
            self.send_response(401 if self.path == "/v2/" else 404)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Registry)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    real_open = reach._open

    def local_only(url: str, context: Any) -> None:  # nothing leaves this machine in a unit test
        if not url.startswith("http://127.0.0.1:"):
            raise urllib.error.URLError(ConnectionRefusedError("not probed in this test"))
        real_open(url, context)

    monkeypatch.setattr(reach, "_open", local_only)
    with server, socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))  # a port nothing listens on
        down = f"127.0.0.1:{closed.getsockname()[1]}/envs"
        (project / "envbuild.toml").write_text(f'[envbuild]\nregistry = "127.0.0.1:{server.server_port}/envs"\n')
        prof = project / "profiles" / "cpu-py311.yaml"
        prof.write_text(prof.read_text() + f'registry: "{down}"\n')
        rows = doctor.network(open_project(str(project)), {"hosts": [], "cidrs": ["127.0.0.0/8"]})
        server.shutdown()
    pushed = {r["what"]: r for r in rows if r["what"].startswith("push registry")}
    up = pushed[f"push registry (127.0.0.1:{server.server_port}/envs)"]
    assert (up["state"], up["url"]) == ("reachable", f"http://127.0.0.1:{server.server_port}/v2/")
    assert up["detail"] == "answers over plain HTTP"
    gone = pushed[f"push registry ({down})"]
    assert (gone["state"], gone["detail"]) == ("unreachable", "the connection was refused")
    assert "`registry` (envbuild.toml, or a profile's)" in gone["fix"]


def test_a_base_image_the_engine_holds_needs_no_registry(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A base loaded with `docker load` on a host that reaches no registry: the build takes it as it
    is, but doctor reported Docker Hub unreachable, with a fix (--base) the build did not need."""
    import urllib.error

    from envbuild import reach

    def nothing_answers(url: str, context: Any) -> None:
        raise urllib.error.URLError(ConnectionRefusedError("no network in this test"))

    monkeypatch.setattr(reach, "_open", nothing_answers)
    proj = open_project(str(project))

    def bases(present: Callable[[str], bool] | None) -> list[str]:
        return [r["url"] for r in doctor.network(proj, None, present) if r["what"] == "base image registry"]

    assert bases(None) == ["https://registry-1.docker.io/v2/"]  # no engine to ask: probed
    assert bases(lambda ref: False) == ["https://registry-1.docker.io/v2/"]
    assert bases(lambda ref: True) == []
    # one base missing is enough for the registry to matter
    assert bases(lambda ref: not ref.startswith("ubuntu:")) == ["https://registry-1.docker.io/v2/"]


def test_doctor_probes_the_archives_apt_lock_installs_from(
    engineless_project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A build's apt step fetches every package apt.lock pins from its archive (the live one, or a
    dated snapshot): a network that blocks it failed the build minutes in, and doctor never asked."""
    import urllib.error

    from envbuild import reach

    asked: list[str] = []

    def record(url: str, context: Any) -> None:
        asked.append(url)
        raise urllib.error.URLError(ConnectionRefusedError("no network in this test"))

    monkeypatch.setattr(reach, "_open", record)
    rows = doctor.network(open_project(str(engineless_project)))
    archives = {r["url"]: r for r in rows if r["what"] == "OS package archive (apt.lock)"}
    assert "http://deb.debian.org/debian/" in archives
    assert "lock on a base whose apt sources name a mirror" in archives["http://deb.debian.org/debian/"]["fix"]
    lock = engineless_project / "lockfiles" / "cpu-py311" / "apt.lock"
    snapshot = "http://snapshot.debian.org/archive/debian/20250101T000000Z/"
    lock.write_text(lock.read_text().replace("http://deb.debian.org/debian/", snapshot))
    urls = [r["url"] for r in doctor.network(open_project(str(engineless_project)))]
    assert snapshot in urls
    lock.write_text("not an apt.lock\n")  # damaged: `lock --check` says so; doctor just has no archive from it
    assert snapshot not in [r["url"] for r in doctor.network(open_project(str(engineless_project)))]


needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ (CI installs it)")


@needs_gxx
def test_the_hosts_compiler_is_judged_by_what_it_builds(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CXX", "g++")
    cxx = doctor._cxx()
    assert cxx["path"] == shutil.which("g++") and cxx["linkage"] == "shared"
    # A real compiler that links the way a libstdc++.a-only toolchain does (the H200 host's /opt/gcc).
    static = tmp_path / "g++"
    static.write_text(f'#!/bin/sh\nexec {shutil.which("g++")} -static-libstdc++ "$@"\n')
    static.chmod(0o755)
    monkeypatch.setenv("CXX", str(static))
    report = doctor.inspect_host()
    assert report.cxx["linkage"] == "static"
    note = next(n for n in report.notes if "links libstdc++ statically" in n)
    assert str(static) in note and "AOTInductor" in note and "/usr/bin/g++" in note


def test_a_host_without_a_compiler_has_no_compiler_verdict(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CXX", "no-such-compiler-here")
    assert doctor._cxx() == {}


def _fake_nvidia_smi(folder: Path, monkeypatch: pytest.MonkeyPatch, gpu: str, driver: str) -> None:
    """An nvidia-smi that answers as one on a host with that GPU and driver would (none exists here)."""
    folder.mkdir()
    exe = folder / "nvidia-smi"
    exe.write_text(
        "#!/bin/sh\n"
        f'case "$1" in --query-gpu=*) echo "0, {gpu}, {driver}";; '
        f'*) echo "| NVIDIA-SMI {driver}   Driver Version: {driver}   CUDA Version: 11.4 |";; esac\n'
    )
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}:{os.environ['PATH']}")


@pytest.mark.parametrize(
    "case",
    [
        ("NVIDIA A100-SXM4-80GB, 8.0, 81920", "470.82.01", "cu121-py311", "older than 525.60.13"),
        ("Tesla P100-PCIE-16GB, 6.0, 16384", "570.86.10", "cu128-py313", "(sm_60) is not in the cu128 build"),
    ],
)
def test_run_refuses_a_cuda_profile_whose_gpu_work_this_host_cannot_run(
    cli: Callable[..., Result],
    engineless_project: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    case: tuple[str, str, str, str],
) -> None:
    """torch in the job would not see the GPUs, and a script that falls back to the CPU (`"cuda" if
    torch.cuda.is_available() else "cpu"`) trained there without a word; `run` started it all the same."""
    gpu, driver, profile, said = case
    _fake_nvidia_smi(tmp_path / "bin", monkeypatch, gpu, driver)
    res = cli("run", profile, "--", "python", "train.py")
    assert res.code == 2
    assert f"{profile}'s GPU work cannot run on this host" in res.err and said in res.err
    assert "envbuild doctor" in res.err and "--gpus none" in res.err
    fine = doctor.gpu_problem(validate.load_named(open_project(str(engineless_project)), "cu121-py311"))
    assert (fine is None) is (driver != "470.82.01")  # the P100 runs cu121's sm_60 kernels


def test_run_asks_no_gpu_question_of_a_cpu_profile_or_with_gpus_none(
    cli: Callable[..., Result], engineless_project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_nvidia_smi(tmp_path / "bin", monkeypatch, "NVIDIA A100-SXM4-80GB, 8.0, 81920", "470.82.01")
    for args in (["cpu-py311"], ["cu121-py311", "--gpus", "none"]):
        res = cli("run", *args, "--", "true")
        assert "cannot run on this host" not in res.err
        assert res.code == 5  # it went on to ask the engine for the image (none listens here)
