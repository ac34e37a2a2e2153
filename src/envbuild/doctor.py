"""`envbuild doctor`: what this host can run, the way an experienced engineer would check it."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from envbuild import compat, validate
from envbuild.errors import EngineUnavailable, UsageError
from envbuild.profile import Profile
from envbuild.project import Project
from envbuild.smoke.inside.cxxlink import libstdcxx_linkage, static_problem
from envbuild.smoke.inside.gpu import arch_covers, driver_verdict, driver_version

if TYPE_CHECKING:
    from envbuild.plan import Plan


@dataclass
class Gpu:
    index: int
    name: str
    capability: str  # "9.0"
    memory_mib: int | None = None


@dataclass
class HostReport:
    engine: dict[str, Any] = field(default_factory=dict)
    nvidia_driver: str | None = None
    driver_cuda: str | None = None
    gpus: list[Gpu] = field(default_factory=list)
    rocm_devices: list[str] = field(default_factory=list)
    nvidia_runtime: bool = False
    shm_bytes: int | None = None
    cxx: dict[str, Any] = field(default_factory=dict)  # the host's C++ compiler, for venv + smoke --local
    notes: list[str] = field(default_factory=list)
    profiles: list[dict[str, Any]] = field(default_factory=list)
    network: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _nvidia_smi() -> tuple[str | None, list[Gpu], str | None]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None, [], None
    try:
        out = subprocess.run(
            [exe, "--query-gpu=index,name,compute_cap,memory.total,driver_version", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        head = subprocess.run([exe], capture_output=True, text=True, timeout=30, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return None, [], None
    gpus, driver = [], None
    for line in out.stdout.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 5:
            gpus.append(Gpu(int(parts[0]), parts[1], parts[2], int(float(parts[3])) if parts[3] else None))
            driver = parts[4]
    cuda = None
    for token in head.split("CUDA Version:")[1:2]:
        cuda = token.split()[0]
    return driver, gpus, cuda


def inspect_host() -> HostReport:
    report = HostReport()
    try:
        from envbuild import engine

        cli = engine.client(timeout=10)
        info = cli.info()
        version = cli.version()
        report.engine = {
            "reachable": True,
            "url": engine.engine_url()[0],
            "version": version.get("Version"),
            "api": version.get("ApiVersion"),
            "runtimes": sorted((info.get("Runtimes") or {}).keys()),
            "insecure_registries": _insecure(info.get("RegistryConfig") or {}),
        }
        report.nvidia_runtime = "nvidia" in report.engine["runtimes"] or bool(shutil.which("nvidia-container-runtime"))
        report.engine["data_root"], report.engine["free_bytes"] = engine.disk(info)
    except EngineUnavailable as exc:
        report.engine = {"reachable": False, "error": exc.message, "hint": exc.hint}
    driver, gpus, cuda = _nvidia_smi()
    report.nvidia_driver = driver or driver_version()
    report.gpus, report.driver_cuda = gpus, cuda
    if os.path.exists("/dev/kfd"):
        report.rocm_devices = (
            sorted(p for p in os.listdir("/dev/dri") if p.startswith("renderD")) if os.path.isdir("/dev/dri") else []
        )
    try:
        st = os.statvfs("/dev/shm")  # noqa: S108 - the shared-memory mount itself, not a temp file
        report.shm_bytes = st.f_frsize * st.f_blocks
    except OSError:
        report.shm_bytes = None
    report.cxx = _cxx()
    if report.cxx.get("linkage") == "static":
        reason, fix = static_problem(report.cxx["path"])
        report.notes.append(f"{reason}; {fix}. Images are not affected: they carry Debian's g++")
    from envbuild.engine import engine_elsewhere

    if elsewhere := engine_elsewhere():
        report.notes.append(
            f"the engine runs on {elsewhere}: builds, smoke tests and `envbuild run` use its GPUs, disk and folders; "
            f"the GPUs, driver and shared memory here are this host's (`envbuild doctor` on {elsewhere} judges its own)"
        )
    elif not report.gpus and not report.rocm_devices:
        report.notes.append("no GPU on this host: only CPU profiles can run here")
    if report.gpus and not report.nvidia_runtime:
        report.notes.append(
            "GPUs present but no NVIDIA container runtime: containers will not see them "
            "(install the NVIDIA container toolkit)"
        )
    return report


def _cxx() -> dict[str, Any]:
    """The compiler inductor and cpp_extension would use in an environment on this host (CXX, else
    g++), judged by what it builds: the compile check's own test."""
    path = shutil.which(os.environ.get("CXX", "g++"))
    return {"path": path, **libstdcxx_linkage(path)} if path else {}


def verdicts(project: Project, report: HostReport) -> list[dict[str, Any]]:
    out = []
    engine_ok = bool(report.engine.get("reachable", True))
    for name, prof in validate.load_all(project).items():
        if not isinstance(prof, Profile):
            # A check of the host must not stop at one broken file: the other profiles' verdicts are
            # what the user came for, and this row says what to run for the broken one.
            why = f"not valid: {prof.first_problem()}; run `envbuild validate {name}`"
            out.append(
                {
                    "profile": name,
                    "runs_here": False,
                    "host_ok": False,
                    "why": why,
                    "accelerator": None,
                    "version": None,
                }
            )
            continue
        host_ok, why = _host_verdict(prof, report)
        if not engine_ok:
            # A GPU host without an engine still runs `envbuild venv` + `smoke --local`: keep what
            # its GPUs and driver say, and say why no image runs.
            why = "no image runs here: the Docker engine did not answer (see engine above); " + (
                f"the host itself suits it: {why}" if host_ok else f"and the host does not suit it: {why}"
            )
        out.append(
            {
                "profile": prof.name,
                "runs_here": host_ok and engine_ok,
                "host_ok": host_ok,
                "why": why,
                "accelerator": prof.accelerator,
                "version": prof.accelerator_version,
            }
        )
    return out


def gpu_problem(prof: Profile) -> str | None:
    """What keeps a CUDA profile's job off this host's GPUs (a driver older than its CUDA's floor,
    a GPU its build has no kernels for), judged as `doctor` and the smoke test judge it; None when
    nothing does, or when there is no NVIDIA GPU to judge (`run` refuses that case itself)."""
    if prof.accelerator != "cuda":
        return None
    driver, gpus, _ = _nvidia_smi()
    if not gpus:
        return None
    ok, why = _host_verdict(prof, HostReport(nvidia_driver=driver or driver_version(), gpus=gpus))
    return None if ok else why


def _host_verdict(prof: Profile, report: HostReport) -> tuple[bool, str]:
    """Whether this host's GPUs and driver suit one profile, judged as its smoke test would judge
    them; the engine is judged apart."""
    if prof.accelerator == "rocm":
        if not report.rocm_devices:
            return False, "no ROCm device (/dev/kfd) on this host"
        return True, f"{len(report.rocm_devices)} ROCm render node(s)"
    if prof.accelerator != "cuda" or not prof.cuda:
        return True, "CPU profile"
    if not report.gpus:
        return False, "no NVIDIA GPU on this host"
    db = compat.load()
    floor = db.driver_floor(prof.cuda)
    note = None
    if report.nvidia_driver and floor:
        # The same decisions the smoke test makes inside the image (smoke.inside), so the two agree.
        problem, note = driver_verdict(
            report.nvidia_driver, {"minor_floor": floor.minor_floor, "min_driver": floor.min_driver}, prof.cuda
        )
        if problem:
            return False, problem
    arches = db.arches_for(prof.cuda, prof.torch)
    if arches:
        arch_list = [f"sm_{sm}" for sm in arches.sm] + ([f"compute_{arches.ptx}"] if arches.ptx else [])
        missing = [g for g in report.gpus if not arch_covers(g.capability, arch_list)]
        if missing:
            gpu = missing[0]
            return False, (
                f"{gpu.name} (sm_{gpu.capability.replace('.', '')}) is not in the "
                f"{prof.build_tag} build ({', '.join(arch_list)})"
            )
    return True, note or f"{len(report.gpus)} GPU(s), driver {report.nvidia_driver or 'unknown'}"


def disk_note(report: HostReport) -> str | None:
    """A note when the engine's disk has less room than the project's heaviest build needs: a CPU-only
    project is not told about CUDA's 15 GB, a ROCm one is told about its 40."""
    from envbuild import engine

    kinds = {str(p["accelerator"]) for p in report.profiles if p["accelerator"]} or {"cuda"}
    heaviest = max(kinds, key=lambda kind: engine.BUILD_ROOM[kind])
    return engine.disk_note(report.engine.get("data_root"), report.engine.get("free_bytes"), heaviest)


def _insecure(config: dict[str, Any]) -> dict[str, list[str]]:
    """The registries the engine speaks plain HTTP to: those configured so by name, and the address
    ranges (127.0.0.0/8 unless configured otherwise)."""
    named = [
        name for name, index in (config.get("IndexConfigs") or {}).items() if not (index or {}).get("Secure", True)
    ]
    return {"hosts": sorted(named), "cidrs": list(config.get("InsecureRegistryCIDRs") or [])}


def _plain_http(host: str, insecure: dict[str, list[str]]) -> bool:
    import ipaddress

    if host in insecure.get("hosts", []):
        return True
    name = host[1:].split("]", 1)[0] if host.startswith("[") else host.rsplit(":", 1)[0]  # [::1]:5000, host:port
    try:
        address = ipaddress.ip_address("127.0.0.1" if name == "localhost" else name)
    except ValueError:
        return False  # a name: the engine resolves it, doctor does not guess
    return any(address in ipaddress.ip_network(cidr, strict=False) for cidr in insecure.get("cidrs", []))


def registry_url(image: str, insecure: dict[str, list[str]] | None = None) -> str:
    """The registry API root an image reference is pulled from or pushed to (Docker Hub for a bare
    name), over plain HTTP where the engine's `insecure` rules (docker info) say it uses that."""
    first = image.split("/", 1)[0]
    if "/" in image and ("." in first or ":" in first or first == "localhost"):
        scheme = "http" if _plain_http(first, insecure or {}) else "https"
        return f"{scheme}://{first}/v2/"
    return "https://registry-1.docker.io/v2/"


def network(
    project: Project, insecure: dict[str, list[str]] | None = None, present: Callable[[str], bool] | None = None
) -> list[dict[str, Any]]:
    """Reachability of what a first build fetches: the package index, each profile's PyTorch index,
    each base image's registry (unless the engine holds the image: a build takes it as it is); of
    where `push` goes (envbuild.toml's and the profiles' registry); and whether TLS to them is
    intercepted."""
    from envbuild import plan as plan_mod
    from envbuild import publish, reach
    from envbuild.names import PYPI_SIMPLE, moving_tag

    targets: dict[str, tuple[str, str]] = {
        (project.config.index_url or PYPI_SIMPLE).rstrip("/") + "/": (
            "package index",
            "point --index-url (or index_url in envbuild.toml) at a mirror you reach, or --find-links DIR",
        )
    }
    profiles = [p for p in validate.load_all(project).values() if isinstance(p, Profile)]
    for prof in profiles:
        plan = plan_mod.make(project, prof, strict=False)
        if plan.source.route == "index":
            targets.setdefault(
                plan.source.canonical_index.rstrip("/") + "/",
                (f"PyTorch index ({prof.build_tag})", "--torch-index MIRROR, or --find-links DIR with the wheels"),
            )
        for root in _archives(project, plan):
            targets.setdefault(
                root,
                (
                    "OS package archive (apt.lock)",
                    "build where the archive is reachable, or lock on a base whose apt sources name a mirror you reach",
                ),
            )
        if present is None or not present(plan.base.image):
            targets.setdefault(
                registry_url(plan.base.image, insecure),
                ("base image registry", "--base IMAGE from a registry you reach (or base in envbuild.toml)"),
            )
    pushed: dict[str, str] = {}  # {the reference push makes (REGISTRY:NAME): its registry}
    for prof in profiles:
        with contextlib.suppress(UsageError):  # no registry set: push needs --registry, nothing to probe
            registry = publish.registry_for(project, prof, None)
            pushed[moving_tag(registry, prof.name)] = registry
    for ref, registry in sorted(pushed.items()):
        targets.setdefault(
            registry_url(ref, insecure),
            (
                f"push registry ({registry})",
                "check that the registry is up and that `registry` (envbuild.toml, or a profile's) names it",
            ),
        )
    return [reach.probe(url, what, fix).as_dict() for url, (what, fix) in targets.items()]


def _archives(project: Project, plan: Plan) -> list[str]:
    """The archives apt.lock's packages come from (the live one or a snapshot): what a build's apt
    step fetches from; none where the profile has no readable apt.lock."""
    from envbuild import aptfile, freshness

    roots: set[str] = set()
    for platform in plan.platforms:
        path = freshness.lock_dir(project, plan.name) / aptfile.apt_lock_name(platform)
        try:
            debs = aptfile.parse(path.read_text("utf-8")).installed.values()
        except (OSError, ValueError, KeyError, TypeError):  # none, or damaged: `lock --check` says so
            continue
        roots |= {deb.url.split("/pool/", 1)[0] + "/" for deb in debs if "/pool/" in deb.url}
    return sorted(roots)


def _in_engine() -> Callable[[str], bool]:
    """Whether the engine holds an image (a base loaded with `docker load` on a host that reaches no
    registry was reported as unreachable, with a fix the build did not need)."""
    import docker

    from envbuild import engine

    cli = engine.client(timeout=10)

    def present(ref: str) -> bool:
        try:
            cli.images.get(ref)
        except (docker.errors.DockerException, OSError):  # not there, a name it refuses, or no answer
            return False
        return True

    return present


def doctor(project: Project, *, check_network: bool = True) -> HostReport:
    report = inspect_host()
    report.profiles = verdicts(project, report)
    if check_network:
        present = _in_engine() if report.engine.get("reachable") else None
        report.network = network(project, report.engine.get("insecure_registries"), present)
    note = disk_note(report)
    if note:
        report.notes.insert(0, note)
    return report
