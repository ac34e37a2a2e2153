"""envbuild's benchmarks: one run, side by side, medians of several runs, ratios.

    python benchmarks/run.py --all            # everything (`make bench`)
    python benchmarks/run.py lock build ...   # some sections

Each section rewrites its own part of docs/BENCHMARKS.md (between markers) with the date and the
machine. These machines are noisy: compare ratios within one run, not absolute times across runs.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import json
import os
import platform
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "BENCHMARKS.md"
PY = sys.executable
WHEELS = os.environ.get("PIP_FIND_LINKS", "/opt/wheels")
BASE = os.environ.get("ENVBUILD_TEST_BASE", "envbuild-test/debian:bookworm")
CA = "/etc/ssl/certs/ca-certificates.crt"
PIP_COMPILE_CAP = 600
LOCKABLE = ["cpu-py311", "cu121-py311", "cu124-py312", "cu126-py312", "cu128-py313", "cu130-py313"]


def sh(
    cmd: list[str], cwd: Path = REPO, env: dict[str, str] | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env={**os.environ, **(env or {})}, check=False)
    if check and proc.returncode != 0:
        raise SystemExit(f"benchmark step failed: {' '.join(cmd)}\n{proc.stderr[-3000:]}")
    return proc


def timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def median_of(n: int, fn: Callable[[], Any]) -> tuple[float, list[float]]:
    runs = [timed(fn) for _ in range(n)]
    return statistics.median(runs), runs


def envbuild(
    *args: str, cwd: Path = REPO, env: dict[str, str] | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    return sh([PY, "-m", "envbuild", *args], cwd=cwd, env=env, check=check)


def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores ({cpu}), {mem:.0f} GiB RAM, Python {platform.python_version()}"


def project_copy(names: list[str]) -> Path:
    root = Path(tempfile.mkdtemp(prefix="envbuild-bench-")) / "proj"
    (root / "profiles").mkdir(parents=True)
    shutil.copy(REPO / "profiles" / "_base.yaml", root / "profiles")
    shutil.copytree(REPO / "checks", root / "checks")
    for n in names:
        shutil.copy(REPO / "profiles" / f"{n}.yaml", root / "profiles")
        if (REPO / "lockfiles" / n).is_dir():
            shutil.copytree(REPO / "lockfiles" / n, root / "lockfiles" / n)
    return root


def relock_apt(proj: Path, name: str) -> None:
    """apt.lock against this machine's debootstrapped base (its packages follow Debian's archive)."""
    (proj / "lockfiles" / name / "apt.lock").unlink(missing_ok=True)
    envbuild("lock", name, "--base", BASE, "--find-links", WHEELS, cwd=proj)


def write_section(name: str, body: str) -> None:
    DOC.parent.mkdir(exist_ok=True)
    text = (
        DOC.read_text() if DOC.exists() else "# envbuild benchmarks\n\nWritten by `make bench` (benchmarks/run.py).\n"
    )
    start, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    stamp = f"_{datetime.date.today().isoformat()}, {machine()}_\n\n"
    block = f"{start}\n{stamp}{body.rstrip()}\n{end}"
    if start in text:
        text = re.sub(re.escape(start) + r".*?" + re.escape(end), lambda _: block, text, flags=re.S)
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    DOC.write_text(text if text.endswith("\n") else text + "\n")


# ---- lock --------------------------------------------------------------------------------------


def bench_lock(runs: int) -> str:
    rows = []
    proj = project_copy(LOCKABLE)
    piptools = shutil.which("pip-compile") or str(Path(PY).parent / "pip-compile")
    for name in LOCKABLE:
        extra = ["--find-links", WHEELS] if name == "cpu-py311" else []
        cold_cache = {"UV_CACHE_DIR": tempfile.mkdtemp(prefix="bench-uv-")}
        eb_cold = timed(functools.partial(envbuild, "lock", name, "--upgrade", *extra, cwd=proj, env=cold_cache))
        eb_warm, _ = median_of(runs, functools.partial(envbuild, "lock", name, "--upgrade", *extra, cwd=proj))
        prof = json.loads(envbuild("show", name, "--json", cwd=proj).stdout)
        pc: float | None = None
        pc_note = "n/a: pip-compile resolves only for its own interpreter's Python"
        if prof["python"] == "{}.{}".format(*sys.version_info[:2]):
            work = Path(tempfile.mkdtemp(prefix="bench-pc-"))
            envbuild("render", name, "-o", str(work), cwd=proj)
            cmd = [
                piptools,
                "--quiet",
                "--generate-hashes",
                "--no-header",
                "--output-file",
                str(work / "out.txt"),
                "--pip-args",
                f"--find-links {WHEELS}" if extra else "",
                str(work / "requirements.in"),
            ]
            # Same footing as uv: a fresh cache, and none of the host's pip config (its torch cap).
            env = {
                **os.environ,
                "PIP_CONFIG_FILE": os.devnull,
                "PIP_FIND_LINKS": "",
                "PIP_CONSTRAINT": "",
                "PIP_CACHE_DIR": tempfile.mkdtemp(prefix="bench-pip-"),
            }
            t0 = time.perf_counter()
            try:
                subprocess.run(cmd, env=env, capture_output=True, check=True, timeout=PIP_COMPILE_CAP)
                pc = time.perf_counter() - t0
            except subprocess.TimeoutExpired:
                pc_note = f"> {PIP_COMPILE_CAP} s (stopped: it downloads every wheel to hash it)"
            except subprocess.CalledProcessError as exc:
                pc_note = f"failed: {exc.stderr.decode()[-200:]!r}"
        rows.append((name, eb_cold, eb_warm, pc, pc_note))
    lines = [
        "## Lock: envbuild (uv) vs pip-compile --generate-hashes",
        "",
        "`envbuild lock NAME --upgrade` (a full resolve for the profile's Python and platform, the pylock.toml "
        "pass and the verification) against `pip-compile --generate-hashes` on the same requirements.in. "
        f"Cold: fresh caches for both. Warm: envbuild's median of {runs} with its cache.",
        "",
        "| profile | envbuild cold (s) | envbuild warm (s) | pip-compile cold (s) | cold ratio |",
        "|---|---|---|---|---|",
    ]
    ratios = []
    for name, cold, warm, pc, note in rows:
        if pc is None:
            lines.append(f"| {name} | {cold:.2f} | {warm:.2f} | {note} | |")
        else:
            ratios.append(pc / cold)
            lines.append(f"| {name} | {cold:.2f} | {warm:.2f} | {pc:.2f} | {pc / cold:.1f}x |")
    noop, noop_runs = median_of(max(5, runs), lambda: envbuild("lock", "--all", cwd=proj))
    check, _ = median_of(5, lambda: envbuild("lock", "--check", "--all", cwd=proj))
    lines += [
        "",
        f"No-op `envbuild lock --all` on {len(LOCKABLE)} fresh lockfiles: median {noop:.2f} s "
        f"(runs: {', '.join(f'{r:.2f}' for r in noop_runs)}); goal < 1 s.",
        f"`envbuild lock --check --all` (offline): median {check:.2f} s.",
    ]
    if ratios:
        lines.append(
            f"Speed-up over pip-compile where both ran: {', '.join(f'{r:.1f}x' for r in ratios)} (goal >= 10x)."
        )
    return "\n".join(lines)


# ---- build and size ----------------------------------------------------------------------------


def _image_size(image: str) -> int:
    return int(sh(["docker", "image", "inspect", image, "--format", "{{.Size}}"]).stdout.strip())


def _naive_image(proj: Path, buildkit: bool = False, careful: bool = False) -> tuple[float, int]:
    """A single-stage Dockerfile a person would write: apt Python, venv, COPY the wheel, pip install.
    `buildkit`: built by BuildKit (DOCKER_BUILDKIT=1) instead of the classic builder. `careful`: the
    same contents as envbuild's image, not the least that runs: the OS packages the profile's plan
    asks for (the toolchain torch.compile needs, tini, ca-certificates) and the lockfile installed
    with its hashes, in one stage."""
    work = Path(tempfile.mkdtemp(prefix="bench-naive-"))
    envbuild("render", "cpu-py311", "-o", str(work), cwd=proj)
    wheel = next(Path(WHEELS).glob("torch-2.13.0+cpu-*.whl"))
    shutil.copy(wheel, work / wheel.name)
    shutil.copy(CA, work / "ca.crt")
    # the minimal one as it always was (apt's recommends included), so its figures carry from run to run
    packages, inputs, install = "python3.11 python3.11-venv", "requirements.in", "-r /tmp/requirements.in"
    if careful:
        from envbuild import plan as plan_mod
        from envbuild import validate

        stages = plan_mod.for_profile(validate.load_valid(proj / "profiles" / "cpu-py311.yaml")).apt_stages
        packages = "--no-install-recommends " + " ".join(sorted({*stages["builder"], *stages["runtime"]}))
        shutil.copy(proj / "lockfiles" / "cpu-py311" / "requirements.lock", work / "requirements.lock")
        inputs, install = "requirements.lock", "--require-hashes --no-deps -r /tmp/requirements.lock"
    (work / "Dockerfile").write_text(
        f"FROM {BASE}\n"
        f"RUN apt-get update && apt-get install -y {packages} "
        "&& rm -rf /var/lib/apt/lists/*\n"
        "RUN python3.11 -m venv /opt/venv\n"
        f"COPY {inputs} ca.crt /tmp/\n"
        f"COPY {wheel.name} /tmp/\n"
        f"RUN PIP_CERT=/tmp/ca.crt /opt/venv/bin/pip install --find-links /tmp {install}\n"
    )
    from envbuild.buildkit import docker_cli  # the client envbuild's BuildKit path runs

    docker = docker_cli()
    cmd = [docker, "build", "--no-cache", "-q", "-t", "envbuild-bench/naive:cpu-py311", str(work)]
    t = timed(lambda: sh(cmd, env={"DOCKER_BUILDKIT": "1" if buildkit else "0"}))
    return t, _image_size("envbuild-bench/naive:cpu-py311")


def _dpkg_bytes(image: str) -> int:
    """What dpkg says the image's packages take installed (Installed-Size, KiB each)."""
    out = sh(["docker", "run", "--rm", image, "dpkg-query", "-W", "-f", "${Installed-Size}\\n"]).stdout
    return sum(int(n) for n in out.split() if n.isdigit()) * 1024


def bench_build(runs: int) -> str:
    proj = project_copy(["cpu-py311"])
    relock_apt(proj, "cpu-py311")
    repo = "envbuild-bench"
    common = ["--base", BASE, "--find-links", WHEELS, "--ca-bundle", CA, "--tag", repo, "--json", "--no-smoke"]
    # The last run's image belongs to a project folder that is gone: nothing else would remove it.
    sh(["docker", "rmi", f"{repo}:cpu-py311-untested"], check=False)
    cold = timed(lambda: envbuild("build", "cpu-py311", "--no-cache", *common, cwd=proj))
    rebuild, _ = median_of(runs, lambda: envbuild("build", "cpu-py311", *common, cwd=proj))
    prof = proj / "profiles" / "cpu-py311.yaml"
    ran_after_env = []

    def env_change() -> None:
        prof.write_text(
            re.sub(r"\nenv:.*", "", prof.read_text(), flags=re.S) + f'\nenv:\n  BENCH_NONCE: "{time.time_ns()}"\n'
        )
        res = json.loads(envbuild("build", "cpu-py311", *common, cwd=proj).stdout)
        ran_after_env.append(res["ran_steps"])

    env_t, _ = median_of(runs, env_change)
    image = f"{repo}:cpu-py311-untested"  # --no-smoke builds carry only this tag
    size = _image_size(image)
    base_size = _image_size(BASE)
    venv_bytes = int(sh(["docker", "run", "--rm", image, "du", "-sb", "/opt/venv"]).stdout.split()[0])
    # The OS packages the image needs beyond its base (Python's runtime, the toolchain torch.compile
    # uses): dpkg's Installed-Size of every package the base does not have
    os_bytes = _dpkg_bytes(image) - _dpkg_bytes(BASE)
    floor = base_size + os_bytes + venv_bytes
    naive_t, naive_size = _naive_image(proj)
    # Each `env` change left the image before it untagged (~1.1 GB apiece): envbuild's own prune
    # takes them, the last build stays.
    envbuild("images", "--prune", cwd=proj)
    gb = 1e9
    lines = [
        "## Build: cpu-py311 on a debootstrapped bookworm base (torch 2.13.0+cpu)",
        "",
        "| measure | value |",
        "|---|---|",
        f"| cold build (`--no-cache`) | {cold:.1f} s |",
        f"| unchanged rebuild, median of {runs} | {rebuild:.2f} s = {rebuild / cold:.1%} of cold (goal <= 5%) |",
        f"| rebuild after changing only `env`, median of {runs} | {env_t:.2f} s = {env_t / cold:.1%} of cold; steps that ran: {ran_after_env} (the environment layer stayed cached) |",
        f"| naive single-stage pip Dockerfile, cold | {naive_t:.1f} s |",
        "",
        "## Size",
        "",
        "| image | size | vs envbuild |",
        "|---|---|---|",
        f"| envbuild cpu-py311 | {size / gb:.2f} GB | 1.00x |",
        f"| naive single-stage (same packages, pip) | {naive_size / gb:.2f} GB | envbuild is {size / naive_size:.3f}x of it (goal <= 0.8x) |",
        f"| floor: base image + the OS packages it adds + /opt/venv | {floor / gb:.2f} GB ({base_size / gb:.2f} + "
        f"{os_bytes / gb:.2f} + {venv_bytes / gb:.2f}) | envbuild is {size / floor:.3f}x of it (goal <= 1.1x) |",
        "",
        "Sizes are the engine's uncompressed image sizes. The naive image carries the copied wheel "
        "(its own layer) and pip's cache; envbuild's runtime stage carries neither, nor the CA bundle, "
        "nor torch's C++ test executables (torch/test, 83 MB).",
    ]
    sh(["docker", "image", "rm", "-f", "envbuild-bench/naive:cpu-py311"], check=False)
    return "\n".join(lines)


# ---- smoke and CLI --------------------------------------------------------------------------------


def bench_smoke(runs: int) -> str:
    proj = project_copy(["cpu-py311"])
    relock_apt(proj, "cpu-py311")
    repo = "envbuild-bench-smoke"
    envbuild(
        "build",
        "cpu-py311",
        "--base",
        BASE,
        "--find-links",
        WHEELS,
        "--ca-bundle",
        CA,
        "--tag",
        repo,
        "--no-smoke",
        cwd=proj,
    )
    reports = []

    def once() -> None:
        out = Path(tempfile.mkdtemp()) / "r.json"
        envbuild("smoke", f"{repo}:cpu-py311-untested", "--json", str(out), cwd=proj)
        reports.append(json.loads(out.read_text()))

    wall, wall_runs = median_of(runs, once)
    checks: dict[str, list[float]] = {}
    for rep in reports:
        for c in rep["checks"]:
            checks.setdefault(c["name"], []).append(c["seconds"])
    lines = [
        "## Smoke: the CPU smoke test in its container",
        "",
        "Wall time of `envbuild smoke` (container start to removal) on the image just built, the run a "
        f"`build` makes: **{wall_runs[0]:.1f} s** the first time (goal < 20 s); median of {runs}: {wall:.1f} s "
        f"(runs: {', '.join(f'{r:.1f}' for r in wall_runs)}).",
        "",
        "| check | first run (s) | median (s) | status |",
        "|---|---|---|---|",
    ]
    for name, secs in checks.items():
        status = reports[-1]["checks"][[c["name"] for c in reports[-1]["checks"]].index(name)]["status"]
        lines.append(f"| {name} | {secs[0]:.2f} | {statistics.median(secs):.2f} | {status} |")
    return "\n".join(lines)


def bench_cli(runs: int) -> str:
    runs = max(runs, 15)  # a few hundred ms each, on a noisy 2-core machine: medians need more runs
    exe = str(Path(PY).parent / "envbuild")
    with_config = project_copy([p.stem for p in (REPO / "profiles").glob("[!_]*.yaml")])
    (with_config / "envbuild.toml").write_text('[envbuild]\nregistry = "localhost:5000/envs"\n')
    cases: list[tuple[str, list[str], Path]] = [
        ("envbuild --help", [exe, "--help"], REPO),
        ("envbuild list", [exe, "list"], REPO),
        ("envbuild list (project with an envbuild.toml)", [exe, "list"], with_config),
        ("envbuild validate --all", [exe, "validate", "--all"], REPO),
    ]
    names = [p.stem for p in sorted((REPO / "profiles").glob("*.yaml")) if not p.name.startswith("_")]
    cases += [(f"envbuild render {n}", [exe, "render", n], REPO) for n in names]
    lines = [
        "## CLI start-up and commands",
        "",
        f"Median of {runs} runs (goal: `--help` and `list` well under 0.5 s). The console script, as a user runs it.",
        "",
        "| command | median (s) | fastest (s) | slowest (s) |",
        "|---|---|---|---|",
    ]
    for label, cmd, cwd in cases:
        med, all_runs = median_of(runs, functools.partial(sh, cmd, cwd=cwd))
        lines.append(f"| `{label}` | {med:.3f} | {min(all_runs):.3f} | {max(all_runs):.3f} |")
    shutil.rmtree(with_config.parent, ignore_errors=True)
    return "\n".join(lines)


# ---- reuse: layers, the first rebuild, a re-lock, a registry that has the last image ------------


@contextlib.contextmanager
def _registry() -> Iterator[tuple[str, Path]]:
    """A real distribution registry (Debian's docker-registry) on a free loopback port; (address, storage)."""
    root = Path(tempfile.mkdtemp(prefix="bench-registry-"))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    (root / "config.yml").write_text(
        f"version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {root / 'data'}\n"
        f"http:\n  addr: 127.0.0.1:{port}\n"
    )
    proc = subprocess.Popen(
        ["docker-registry", "serve", str(root / "config.yml")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        for _ in range(100):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=1):
                    break
            except OSError:
                time.sleep(0.1)
        yield f"127.0.0.1:{port}", root / "data"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _stored(data: Path) -> int:
    """Bytes the registry holds (its blobs: compressed layers and configs)."""
    return sum(f.stat().st_size for f in data.rglob("data") if f.is_file())


def _push(image: str, target: str) -> None:
    sh(["docker", "tag", image, target])
    sh(["docker", "push", "-q", target])
    sh(["docker", "rmi", target])


def _forget(proj: Path, *tags: str, buildkit_cache_was_empty: bool = False) -> None:
    """Remove a bench's images and the build caches its project left: once the temporary project
    is gone, no `envbuild images --prune` can tell they are its, and each run left ~3 GB behind.
    BuildKit's cache goes too when it was empty before the bench (it is then all the bench's)."""
    source = f"label=org.opencontainers.image.source=file://{proj.resolve()}"
    ids = sh(["docker", "images", "-q", "--filter", source], check=False).stdout.split()
    sh(["docker", "rmi", "-f", *tags, *sorted(set(ids))], check=False)
    if buildkit_cache_was_empty:
        sh(["docker", "builder", "prune", "-af"], check=False)


def _buildkit_cache_empty() -> bool:
    out = sh(["docker", "system", "df", "--format", "{{.Type}} {{.TotalCount}}"], check=False).stdout
    return "Build Cache 0" in out.splitlines()


def _steps(result: dict[str, Any]) -> str:
    return f"{result.get('ran_steps')} of {result.get('steps', '?')} steps ran"


def bench_reuse(runs: int) -> str:
    """Issue 22's goals, measured side by side in one run: the cold build against a naive one, the
    first rebuild after it, a re-lock of one small package (time and bytes pushed), and the bytes a
    second profile that shares torch adds to a registry."""
    proj = project_copy(["cpu-py311"])
    relock_apt(proj, "cpu-py311")
    repo = "envbuild-bench-reuse"
    no_cache_before = _buildkit_cache_empty()
    common = ["--base", BASE, "--find-links", WHEELS, "--ca-bundle", CA, "--tag", repo, "--json", "--no-smoke"]
    sh(["docker", "rmi", f"{repo}:cpu-py311-untested", f"{repo}:cpu-py311-tqdm-untested"], check=False)

    def build(name: str, *extra: str) -> tuple[float, dict[str, Any]]:
        t0 = time.perf_counter()
        out = json.loads(envbuild("build", name, *common, *extra, cwd=proj).stdout)
        return time.perf_counter() - t0, out

    # the first build of a profile on an engine that has none of its stages: envbuild runs the
    # stages that do not wait for each other as side builds (buildahead), then the whole
    fresh, fresh_out = build("cpu-py311")
    cold, cold_out = build("cpu-py311", "--no-cache")  # the stages one after another, as the builder runs them
    first, first_out = build("cpu-py311")  # the first rebuild after a --no-cache build: what a user meets
    # a second cold build of the same lockfile: the same environment (env digest), measured
    again, again_out = build("cpu-py311", "--no-cache")
    same_env = cold_out["labels"]["io.envbuild.env-digest"] == again_out["labels"]["io.envbuild.env-digest"]
    naive, _ = _naive_image(proj)
    sh(["docker", "rmi", "envbuild-bench/naive:cpu-py311"], check=False)  # the next one takes the tag
    # what the naive Dockerfile takes to give what envbuild's image holds: the gap above that is
    # the price of envbuild's own work (layers, checks, the manifest), the rest is the contents
    careful, _ = _naive_image(proj, careful=True)
    sh(["docker", "rmi", "envbuild-bench/naive:cpu-py311"], check=False)  # the BuildKit one takes the tag
    # the same cold build and the same naive Dockerfile under BuildKit, which runs the layer stages
    # side by side (its own cache, its own tag: the classic build above stays what the rest starts from)
    sh(["docker", "builder", "prune", "-f"], check=False)
    t0 = time.perf_counter()
    bk_args = ["build", "cpu-py311", *common, "--no-cache", "--builder", "buildkit"]
    bk_args[bk_args.index("--tag") + 1] = f"{repo}-bk"
    envbuild(*bk_args, cwd=proj)
    cold_bk = time.perf_counter() - t0
    sh(["docker", "rmi", f"{repo}-bk:cpu-py311-untested"], check=False)
    naive_bk, _ = _naive_image(proj, buildkit=True)
    image = f"{repo}:cpu-py311-untested"
    size = _image_size(image)
    # one small package bumped: einops 0.8.1 -> 0.8.0, re-locked (Python only: apt.lock is unchanged)
    prof = proj / "profiles" / "cpu-py311.yaml"
    with _registry() as (registry, data):
        _push(image, f"{registry}/bench/cpu-py311:before")
        pushed_first = _stored(data)
        prof.write_text(prof.read_text().replace("einops==0.8.1", "einops==0.8.0"))
        envbuild("lock", "cpu-py311", "--no-apt", "--find-links", WHEELS, cwd=proj)
        bump, bump_out = build("cpu-py311")
        _push(image, f"{registry}/bench/cpu-py311:bumped")
        pushed_bump = _stored(data) - pushed_first
        # a second profile with one more package, on the same torch build and base, derived as a
        # team does (`extends`): its first lock keeps cpu-py311's pins and adds tqdm
        (proj / "profiles" / "cpu-py311-tqdm.yaml").write_text(
            'name: cpu-py311-tqdm\nextends: cpu-py311\npackages: ["einops==0.8.0", "tqdm==4.67.1"]\n'
        )
        (proj / "lockfiles" / "cpu-py311-tqdm").mkdir(parents=True)
        # the same OS packages: cpu-py311's apt.lock is the variant's too (its inputs are the same)
        shutil.copy(proj / "lockfiles" / "cpu-py311" / "apt.lock", proj / "lockfiles" / "cpu-py311-tqdm")
        envbuild("lock", "cpu-py311-tqdm", "--no-apt", "--find-links", WHEELS, cwd=proj)
        _, _ = build("cpu-py311-tqdm")
        before_variant = _stored(data)
        variant_image = f"{repo}:cpu-py311-tqdm-untested"
        _push(variant_image, f"{registry}/bench/cpu-py311-tqdm:1")
        pushed_variant = _stored(data) - before_variant
        variant_size = _image_size(variant_image)
    _forget(proj, image, variant_image, "envbuild-bench/naive:cpu-py311", buildkit_cache_was_empty=no_cache_before)
    mb = 1e6

    def verdict(value: float, goal: float) -> str:
        return "meets" if value <= goal else "misses"

    lines = [
        "## Reuse: layers, the first rebuild, a re-lock, a registry that has the last image",
        "",
        "cpu-py311 on a debootstrapped bookworm base, torch 2.13.0+cpu from the wheelhouse, no smoke test; "
        "each figure is the first run, the case a user meets (not a median).",
        "",
        "| measure | value | goal |",
        "|---|---|---|",
        f"| first build on an engine without its stages (side by side) | {fresh:.1f} s, {_steps(fresh_out)} | |",
        f"| cold build (`--no-cache`: the stages one after another) | {cold:.1f} s | |",
        f"| naive single-stage pip Dockerfile, cold, same inputs | {naive:.1f} s | |",
        f"| first build (side by side) vs naive | {fresh / naive:.2f}x | < 1.0x: {verdict(fresh / naive, 0.999)} |",
        f"| `--no-cache` build vs naive | {cold / naive:.2f}x | < 1.0x: {verdict(cold / naive, 0.999)} |",
        f"| the naive Dockerfile with envbuild's contents (its OS packages, the lockfile with hashes), cold "
        f"| {careful:.1f} s | |",
        f"| first build (side by side) vs that | {fresh / careful:.2f}x | for reading the goal's gap |",
        f"| cold build with `--builder buildkit` (layer stages side by side) | {cold_bk:.1f} s | |",
        f"| naive Dockerfile under BuildKit, cold | {naive_bk:.1f} s | |",
        f"| BuildKit cold build vs the naive one under BuildKit | {cold_bk / naive_bk:.2f}x | < 1.0x: "
        f"{verdict(cold_bk / naive_bk, 0.999)} |",
        f"| BuildKit cold build vs the naive one under the classic builder | {cold_bk / naive:.2f}x | < 1.0x: "
        f"{verdict(cold_bk / naive, 0.999)} |",
        f"| a second cold build of the same lockfile | {again:.1f} s; env digest "
        f"{'the same' if same_env else 'DIFFERENT'} | the same: {'meets' if same_env else 'misses'} |",
        f"| first plain rebuild after the `--no-cache` build | {first:.1f} s, {_steps(first_out)} | as cached as any: "
        f"{'meets' if first_out.get('ran_steps') == 0 else 'misses'} |",
        f"| rebuild after einops 0.8.1 -> 0.8.0 in the lockfile | {bump:.1f} s = {bump / fresh:.0%} of the first "
        f"build ({bump / cold:.0%} of the `--no-cache` one), {_steps(bump_out)} | <= 10% of cold: "
        f"{verdict(bump / fresh, 0.10)} |",
        f"| bytes pushed for it to a registry that has the previous image | {pushed_bump / mb:,.1f} MB = "
        f"{pushed_bump / pushed_first:.1%} of the image's {pushed_first / mb:,.0f} MB compressed | <= 5%: "
        f"{verdict(pushed_bump / pushed_first, 0.05)} |",
        f"| bytes a registry that has cpu-py311 stores for cpu-py311-tqdm (one more package) | "
        f"{pushed_variant / mb:,.1f} MB = {pushed_variant / pushed_first:.1%} of its compressed size "
        f"(image {variant_size / mb:,.0f} MB) | <= 10%: {verdict(pushed_variant / pushed_first, 0.10)} |",
        f"| image size | {size / mb:,.0f} MB | |",
    ]
    return "\n".join(lines)


# ---- lock at the speed of uv; the matrix at once ---------------------------------------------------

_UV_SPY = """#!{python}
import json, os, shutil, sys
log = os.environ["BENCH_UV_LOG"]
args = sys.argv[1:]
n = sum(1 for _ in open(log)) if os.path.exists(log) else 0
keep = ""
if args[:2] == ["pip", "compile"] and os.path.isfile(args[2]):
    # uv reads the file by its name (pyproject.toml): keep the name, in a folder per call
    keep = os.path.join(os.path.dirname(log), f"call-{{n}}", os.path.basename(args[2]))
    os.makedirs(os.path.dirname(keep), exist_ok=True)
    shutil.copy(args[2], keep)
with open(log, "a") as f:
    f.write(json.dumps({{"args": args, "input": keep}}) + "\\n")
os.execv({uv!r}, [{uv!r}, *args])
"""


def bench_lock_speed(runs: int) -> str:
    """`envbuild lock NAME` against the raw `uv pip compile` it runs (same inputs, same flags, same
    warm cache), side by side; then the whole shipped matrix from a cold cache."""
    from envbuild import uvtool

    proj = project_copy(LOCKABLE)
    # the wheelhouse from envbuild.toml, not the command line: the record `validate` and `new` leave
    # is for `lock NAME` as the user types it (it keeps the torch index out of the figure)
    (proj / "envbuild.toml").write_text(f"find_links = [{json.dumps(WHEELS)}]\n")
    spy_dir = Path(tempfile.mkdtemp(prefix="bench-uvspy-"))
    spy = spy_dir / "uv"
    spy.write_text(_UV_SPY.format(python=PY, uv=uvtool.binary()))
    spy.chmod(0o755)
    log = spy_dir / "calls.jsonl"
    name = "cpu-py311"
    lock = ["lock", name, "--upgrade", "--no-apt"]
    plain = [a for a in lock if a != "--upgrade"]
    envbuild(*lock, cwd=proj, env={"ENVBUILD_UV": str(spy), "BENCH_UV_LOG": str(log)})  # warms the cache too
    first = json.loads(log.read_text().splitlines()[0])
    args = list(first["args"])
    args[2] = first["input"]
    args[args.index("-o") + 1] = str(spy_dir / "raw.txt")
    # What any Python CLI on these libraries pays before it can start uv: the interpreter, then the
    # imports the lock path cannot do without (the CLI, the models, the template, the YAML, the
    # output, version parsing, the lock guard), none of envbuild's own code.
    floor_imports = "import typer, pydantic, jinja2, yaml, rich.console, packaging.requirements, filelock"
    locked = proj / "lockfiles" / name
    uv_cache = sh([uvtool.binary(), "cache", "dir"]).stdout.strip()  # uv's, kept where XDG_CACHE_HOME moves
    t: dict[str, list[float]] = {}

    def run(key: str, step: Callable[[], object]) -> None:
        t.setdefault(key, []).append(timed(step))

    def first_lock() -> None:  # no lockfile yet: both uv passes, as a new profile's first lock
        shutil.rmtree(locked, ignore_errors=True)
        # as a user types it: without --upgrade, so nothing starts early (`lock --upgrade` here, run
        # before in this folder, had its resolve started early and reported 0.65 s for a 0.87 s lock)
        envbuild(*plain, cwd=proj)

    for _ in range(max(runs, 5)):  # interleaved: the network's mood is shared
        run("raw", lambda: sh([uvtool.binary(), *args], cwd=spy_dir))
        # as a user types it: uv finds the interpreter itself
        run("raw_typed", lambda: sh([uvtool.binary(), *_without_python(args)], cwd=spy_dir))
        run("relock", lambda: envbuild(*lock, cwd=proj))
        # the first re-lock in a folder: no record, so nothing starts early
        run("unprimed", lambda: envbuild(*lock, cwd=proj, env={"ENVBUILD_LOCK_AHEAD": "0"}))
        run("first", first_lock)
        shutil.rmtree(locked, ignore_errors=True)
        envbuild("validate", name, cwd=proj)  # a hand-written profile checked before its first lock
        run("after_validate", lambda: envbuild(*plain, cwd=proj))
        run("after_first", lambda: envbuild(*lock, cwd=proj))  # the re-lock a user types next
        # a fresh clone: lockfiles fresh, and no record of this folder in a cache of its own
        clone = {"XDG_CACHE_HOME": tempfile.mkdtemp(prefix="bench-clone-"), "UV_CACHE_DIR": uv_cache}
        run("validating", functools.partial(envbuild, "validate", name, cwd=proj, env=clone))
        run("clone", functools.partial(envbuild, *lock, cwd=proj, env=clone))
        run("bare", lambda: sh([PY, "-c", "pass"]))
        run("libs", lambda: sh([PY, "-c", floor_imports]))
    med = {key: statistics.median(series) for key, series in t.items()}
    x = {key: med[key] / med["raw"] for key in med}  # each as a multiple of the raw call

    def row(label: str, key: str) -> str:
        return f"| {label} | {med[key]:.2f} | {', '.join(f'{v:.2f}' for v in t[key])} |"

    # the whole matrix from a cold uv cache, as `lock --all` runs it (concurrently)
    cold_cache = {"UV_CACHE_DIR": tempfile.mkdtemp(prefix="bench-uv-")}
    t0 = time.perf_counter()
    matrix = envbuild("lock", *LOCKABLE, "--upgrade", "--no-apt", "--json", cwd=proj, env=cold_cache)
    wall = time.perf_counter() - t0
    each = {o["profile"]: o["seconds"] for o in json.loads(matrix.stdout)}
    lines = [
        "## Lock at the speed of uv; the whole matrix at once",
        "",
        f"`envbuild lock {name} --upgrade` against the `uv pip compile` call it makes (captured through "
        f"ENVBUILD_UV: same inputs, same flags, same warm cache), interleaved, {len(t['raw'])} runs each. "
        "envbuild makes one uv call when the resolution is the one the lockfiles already hold (their "
        "pylock.toml is kept), two when it changed or there is no lockfile yet: the resolve, then pylock.toml "
        "from uv's cache (`--offline`). A re-lock typed again in the same folder starts last time's uv call "
        "before the CLI has loaded and takes its result when it is the very call needed (`lockahead`); the "
        "first re-lock in a folder has no record to start from (measured with ENVBUILD_LOCK_AHEAD=0, the same "
        "path); a plain first lock (`lock NAME`, as a new profile gets it) records the call of its "
        "`--upgrade`. `envbuild validate NAME` (as `envbuild new`) records the call of the lock that comes "
        "next: the plain lock where the lockfiles are missing or stale, the `--upgrade` where they are fresh "
        "and the folder has no record yet. The wheelhouse is envbuild.toml's `find_links`.",
        "",
        "| | median (s) | runs (s) |",
        "|---|---|---|",
        row("raw `uv pip compile`", "raw"),
        row(
            f"raw `uv pip compile`, without the `--python` envbuild passes (uv finds one: {_found_python()})",
            "raw_typed",
        ),
        row("`envbuild lock --upgrade`, nothing new", "relock"),
        row("`envbuild lock --upgrade`, nothing new, first time in this folder", "unprimed"),
        row("`envbuild lock` (no --upgrade), no lockfile yet", "first"),
        row("`envbuild lock --upgrade` right after that first lock", "after_first"),
        row(
            f"`envbuild lock` (no --upgrade), no lockfile yet, after `envbuild validate {name}` (its record; "
            "`new` leaves the same)",
            "after_validate",
        ),
        row(f"`envbuild validate {name}` in a fresh clone (it records the re-lock)", "validating"),
        row("`envbuild lock --upgrade`, nothing new, in a fresh clone after that `validate`", "clone"),
        row("`python -c pass`", "bare"),
        row(f"`python -c '{floor_imports}'`", "libs"),
        "",
        f"Ratio: **{x['relock']:.2f}x** re-locking (goal <= 1.3x: {'meets' if x['relock'] <= 1.3 else 'misses'}); "
        f"**{x['unprimed']:.2f}x** for the first re-lock in a folder with no record (a fresh clone), "
        f"**{x['clone']:.2f}x** for that re-lock after `validate` in the clone, "
        f"**{x['after_first']:.2f}x** for the re-lock right after a first lock (it left a record), "
        f"**{x['first']:.2f}x** for a first lock (two uv calls), **{x['after_validate']:.2f}x** for the first "
        "lock after `validate` or `new` (they started its resolve early); the first lock without a record is "
        f"**{med['first'] / med['raw_typed']:.2f}x** the raw call typed without `--python`. envbuild names its "
        "own interpreter to uv where no build for another Python can follow (`uvtool.interpreter`): uv then "
        "skips its discovery, which on a pyenv host runs a shim on every call, so the raw call with envbuild's "
        "flags is itself faster than the one a user types.",
        "",
        "Without the early start, the floor: a Python program that only imports the libraries the lock path "
        f"needs, then starts the same uv call, would take {1 + med['libs'] / med['raw']:.2f}x the raw call "
        f"({med['libs']:.2f} s of imports before uv starts), before it reads a profile.",
        "",
        f"The shipped matrix ({len(LOCKABLE)} profiles) from a cold uv cache, `lock` running them 4 at a time: "
        f"**{wall:.1f} s** wall; each: "
        + ", ".join(f"{n} {s:.1f} s" for n, s in each.items())
        + f" (sum {sum(each.values()):.1f} s).",
    ]
    return "\n".join(lines)


def _without_python(args: list[str]) -> list[str]:
    """The uv call less the `--python` envbuild names: uv then finds an interpreter itself (on a
    pyenv host through a shim, which it runs again on every call)."""
    if "--python" not in args:
        return list(args)
    at = args.index("--python")
    return [*args[:at], *args[at + 2 :]]


def _found_python() -> str:
    """Which `python3.11` uv's discovery meets first on PATH: a pyenv shim or the binary itself."""
    found = shutil.which("python3.11")
    if found is None:
        return "none on PATH"
    return "a pyenv shim" if "/shims/" in found else found


def bench_cuda_relock(runs: int) -> str:
    """cu121-py311 (torch 2.3.1 with its CUDA wheels, all from PyPI): a cold build, then the rebuild
    after a small lock change with the wheel cache warm. One run each: gigabytes move."""
    proj = project_copy(["cu121-py311"])
    repo = "envbuild-bench-cuda"
    common = ["--base", BASE, "--ca-bundle", CA, "--tag", repo, "--json", "--no-smoke"]
    image = f"{repo}:cu121-py311-untested"
    sh(["docker", "rmi", image], check=False)

    def build(*extra: str) -> tuple[float, dict[str, Any]]:
        t0 = time.perf_counter()
        out = json.loads(envbuild("build", "cu121-py311", *common, *extra, cwd=proj).stdout)
        return time.perf_counter() - t0, out

    cold, _ = build("--no-cache")
    prof = proj / "profiles" / "cu121-py311.yaml"
    prof.write_text(prof.read_text().replace("einops==0.8.1", "einops==0.8.0"))
    envbuild("lock", "cu121-py311", "--no-apt", cwd=proj)
    bump, bump_out = build()
    size = _image_size(image)
    _forget(proj, image)
    return "\n".join(
        [
            "## A CUDA image: cu121-py311 rebuilt after a small lock change, the wheel cache warm",
            "",
            "| measure | value | goal |",
            "|---|---|---|",
            f"| cold build (`--no-cache`; the wheels from PyPI into the wheel cache) | {cold:.1f} s | |",
            f"| rebuild after einops 0.8.1 -> 0.8.0 | {bump:.1f} s = {bump / cold:.0%} of cold, {_steps(bump_out)} | "
            f"<= 20%: {'meets' if bump / cold <= 0.2 else 'misses'} |",
            f"| image size | {size / 1e6:,.0f} MB | |",
        ]
    )


SECTIONS: dict[str, Callable[[int], str]] = {
    "cli": bench_cli,
    "lock": bench_lock,
    "smoke": bench_smoke,
    "build": bench_build,
    "reuse": bench_reuse,
    "lock-speed": bench_lock_speed,
    "cuda-relock": bench_cuda_relock,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sections", nargs="*", choices=[*SECTIONS, []][:-1] or None)
    parser.add_argument("--all", action="store_true")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    chosen = list(SECTIONS) if args.all or not args.sections else args.sections
    # Every scratch folder (projects, fresh uv and pip caches of ~0.7 GB each, build contexts)
    # goes under one root, removed after a good run: every run used to leave its caches in /tmp
    # (2 GB after a few runs here, on the disk the engine builds on). A failed run keeps it for
    # its build logs.
    scratch = tempfile.mkdtemp(prefix="envbuild-bench-")
    tempfile.tempdir = scratch
    try:
        for name in chosen:
            print(f"bench: {name} ...", flush=True)
            body = SECTIONS[name](args.runs)
            write_section(name, body)
            print(body, flush=True)
    except BaseException:
        print(f"bench: failed; its scratch folder (logs, caches) is kept: {scratch}", file=sys.stderr)
        raise
    finally:
        tempfile.tempdir = None
    shutil.rmtree(scratch, ignore_errors=True)
    print(f"bench: wrote {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
