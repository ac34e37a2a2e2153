#!/usr/bin/env python3
"""Run envbuild's smoke checks in local mode against this machine's own torch; write a report.

Meant for a GPU host that has torch installed but not envbuild: one command checks the
install against a profile generated from it (`envbuild validate`: does envbuild's compatibility
data agree with a real install?) and runs every smoke check there (`envbuild smoke --local`:
kernels on every GPU, cuDNN, DDP over NCCL, AMP, DataLoader, determinism, torch.compile, export,
perf), plus any script given with `--check` as one of the profile's own checks.

    python3 scripts/host_smoke.py run --out DIR [--wheels DIR] [--torch-python PY] [--gpus all]

writes DIR/report.md (date, GPU, driver, torch, every check with its time), DIR/smoke.json,
DIR/validate.json and DIR/profile.yaml, prints the report and exits like `envbuild smoke`.

A host without network cannot pip install envbuild's dependencies; fetch them as wheels where
PyPI is reachable and carry the folder along (stdlib only is needed to unpack them):

    python scripts/host_smoke.py wheels --python-version 3.12 --dest .envbuild/host-wheels
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent

# What the torch interpreter reports about itself; runs there, so stdlib + torch (+ numpy) only.
PROBE = r"""
import json, platform, sys
facts = {"python": platform.python_version(), "executable": sys.executable}
try:
    import torch
except Exception as exc:
    facts["torch_error"] = f"{type(exc).__name__}: {exc}"
else:
    facts.update(torch=torch.__version__, cuda=torch.version.cuda, hip=getattr(torch.version, "hip", None))
    try:
        facts["gpus"] = [
            {"name": torch.cuda.get_device_name(i), "capability": list(torch.cuda.get_device_capability(i)),
             "memory_gib": round(torch.cuda.get_device_properties(i).total_memory / 2**30, 1)}
            for i in range(torch.cuda.device_count())
        ] if torch.cuda.is_available() else []
    except Exception as exc:
        facts["gpus"] = []
        facts["gpu_error"] = f"{type(exc).__name__}: {exc}"
try:
    import numpy
    facts["numpy"] = numpy.__version__
except Exception as exc:
    facts["numpy_error"] = f"{type(exc).__name__}: {exc}"
print(json.dumps(facts))
"""


def probe(torch_python: str) -> dict[str, Any]:
    proc = subprocess.run([torch_python, "-c", PROBE], capture_output=True, text=True, timeout=300, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"host_smoke: {torch_python} could not describe its torch:\n{proc.stderr[-2000:]}")
    facts: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    facts["nvidia_smi"] = nvidia_smi()
    return facts


def nvidia_smi() -> list[dict[str, str]]:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return []
    query = "name,driver_version,memory.total,compute_cap"
    proc = subprocess.run(
        [exe, f"--query-gpu={query}", "--format=csv,noheader"], capture_output=True, text=True, check=False
    )
    rows = []
    for line in proc.stdout.strip().splitlines():
        values = [v.strip() for v in line.split(",")]
        rows.append(dict(zip(query.split(","), values, strict=False)))
    return rows


def profile_for(facts: dict[str, Any]) -> dict[str, Any]:
    """A profile that describes the interpreter's own install, in envbuild's profile format."""
    if "torch" not in facts:
        raise SystemExit(f"host_smoke: no torch in {facts['executable']}: {facts.get('torch_error')}")
    xy = ".".join(facts["python"].split(".")[:2])
    data: dict[str, Any] = {"python": xy, "torch": facts["torch"].split("+")[0]}
    if facts.get("cuda"):
        data.update(accelerator="cuda", cuda=facts["cuda"])
        prefix = "cu" + facts["cuda"].replace(".", "")
    elif facts.get("hip"):
        rocm = ".".join(str(facts["hip"]).split(".")[:2])
        data.update(accelerator="rocm", rocm=rocm)
        prefix = "rocm" + rocm.replace(".", "")
    else:
        data["accelerator"] = "cpu"
        prefix = "cpu"
    data["numpy"] = facts.get("numpy", "0")  # without numpy the smoke test's versions check says so
    name = f"{prefix}-py{xy.replace('.', '')}-host"
    return {"name": name, "description": f"this host's own torch ({facts['executable']})", **data}


def unpack_wheels(wheels: Path, dest: Path) -> None:
    """Install wheels by unpacking them: what pip does for these packages, without needing pip."""
    found = sorted(wheels.glob("*.whl"))
    if not found:
        raise SystemExit(f"host_smoke: no wheels in {wheels}")
    for whl in found:
        with zipfile.ZipFile(whl) as zf:
            zf.extractall(dest)


def envbuild(env: dict[str, str], *args: str, timeout: float = 1200) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "envbuild", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=timeout,
        check=False,
    )


def cmd_run(args: argparse.Namespace) -> int:
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    torch_python = args.torch_python or sys.executable
    started = datetime.datetime.now(datetime.timezone.utc)
    facts = probe(torch_python)
    prof = profile_for(facts)

    work = Path(tempfile.mkdtemp(prefix="envbuild-host-smoke-"))
    try:
        paths = [str(REPO / "src")]
        if args.wheels:
            unpack_wheels(Path(args.wheels), work / "deps")
            paths.append(str(work / "deps"))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "COLUMNS": "120", "NO_COLOR": "1"}
        project = work / "project"
        (project / "profiles").mkdir(parents=True)
        if args.check:  # the project's own checks (`checks:`), e.g. checks/train_gpt.py: a user's workload
            (project / "checks").mkdir()
            for script in args.check:
                shutil.copy2(script, project / "checks" / Path(script).name)
            prof["checks"] = [f"checks/{Path(script).name}" for script in args.check]
        profile_text = "".join(f"{k}: {json.dumps(v)}\n" for k, v in prof.items())
        (project / "profiles" / f"{prof['name']}.yaml").write_text(profile_text)
        (out / "profile.yaml").write_text(profile_text)

        validated = envbuild(env, "validate", prof["name"], "--project", str(project), "--json")
        (out / "validate.json").write_text(validated.stdout or json.dumps({"stderr": validated.stderr}))
        # doctor's verdicts on the repository's own profiles, judged against this real GPU and driver.
        doctor = envbuild(env, "doctor", "--project", str(REPO), "--json", timeout=120)
        (out / "doctor.json").write_text(doctor.stdout or json.dumps({"stderr": doctor.stderr}))
        t0 = time.perf_counter()
        smoke_json = out / "smoke.json"
        smoke = envbuild(
            env,
            "smoke",
            "--local",
            prof["name"],
            "--project",
            str(project),
            "--python",
            torch_python,
            "--gpus",
            args.gpus,
            "--lock-match",
            "none",
            "--timeout",
            str(args.timeout),
            "--json",
            str(smoke_json),
            timeout=args.timeout + 60,
        )
        wall = time.perf_counter() - t0
    finally:
        shutil.rmtree(work, ignore_errors=True)
    (out / "smoke.txt").write_text(smoke.stdout + smoke.stderr)
    report = json.loads(smoke_json.read_text()) if smoke_json.is_file() else None
    text = render_report(
        started=started,
        facts=facts,
        prof=prof,
        validated=validated,
        doctor=doctor,
        smoke=smoke,
        report=report,
        wall=wall,
    )
    (out / "report.md").write_text(text)
    print(text)
    return smoke.returncode


def render_report(
    *,
    started: datetime.datetime,
    facts: dict[str, Any],
    prof: dict[str, Any],
    validated: subprocess.CompletedProcess[str],
    doctor: subprocess.CompletedProcess[str],
    smoke: subprocess.CompletedProcess[str],
    report: dict[str, Any] | None,
    wall: float,
) -> str:
    smi = facts.get("nvidia_smi") or []
    gpus = facts.get("gpus") or []
    lines = [
        f"# envbuild smoke test on {gpus[0]['name'] if gpus else platform.node() or 'this host'}",
        "",
        f"- date: {started.strftime('%Y-%m-%d %H:%M UTC')}",
        f"- GPUs: {', '.join(g['name'] for g in gpus) or 'none visible to torch'}"
        + (
            f" (compute capability {'.'.join(map(str, gpus[0]['capability']))}, {gpus[0]['memory_gib']} GiB)"
            if gpus
            else ""
        ),
        f"- NVIDIA driver: {smi[0].get('driver_version', '?') if smi else 'no nvidia-smi'}",
        f"- torch {facts.get('torch')} (CUDA {facts.get('cuda')}, HIP {facts.get('hip')}), numpy {facts.get('numpy')}, "
        f"Python {facts['python']} ({facts['executable']})",
        f"- host: {platform.platform()}, {os.cpu_count()} CPUs",
        f"- command: `envbuild smoke --local {prof['name']} --lock-match none --gpus ...` via scripts/host_smoke.py",
        "",
        "## Profile generated from the install, and envbuild's verdict on it",
        "",
        "```yaml",
        *(f"{k}: {json.dumps(v)}" for k, v in prof.items()),
        "```",
        "",
        f"`envbuild validate`: exit {validated.returncode}"
        + (" (valid)" if validated.returncode == 0 else " (compatibility data disagrees with this real install)"),
        "",
        *doctor_lines(doctor),
        "## Smoke checks",
        "",
        f"Wall time of `envbuild smoke --local` (start to report): **{wall:.1f} s**; exit {smoke.returncode}.",
        "",
    ]
    if report is None:
        lines += ["No JSON report was written. Output:", "", "```", (smoke.stdout + smoke.stderr)[-4000:], "```"]
        return "\n".join(lines) + "\n"
    lines += ["| check | status | seconds | reason |", "|---|---|---|---|"]
    for check in report["checks"]:
        reason = (check.get("reason") or "").replace("|", "/").replace("\n", " ")
        lines.append(f"| {check['name']} | {check['status']} | {check.get('seconds', 0):.2f} | {reason} |")
    lines += ["", "## Facts each check found", ""]
    for check in report["checks"]:
        if check.get("facts"):
            lines.append(f"- **{check['name']}**: `{json.dumps(check['facts'], sort_keys=True)}`")
        if check.get("remedy") and check["status"] == "fail":
            lines.append(f"  - remedy: {check['remedy']}")
    return "\n".join(lines) + "\n"


def doctor_lines(doctor: subprocess.CompletedProcess[str]) -> list[str]:
    lines = ["", "## `envbuild doctor` on this host: which of the repository's profiles would run here", ""]
    try:
        data = json.loads(doctor.stdout)
    except ValueError:
        return [*lines, f"doctor exit {doctor.returncode}, no JSON:", "", "```", doctor.stderr[-2000:], "```", ""]
    lines.append(
        f"driver {data.get('nvidia_driver')} (CUDA {data.get('driver_cuda')}), "
        f"shared memory {(data.get('shm_bytes') or 0) / 2**30:.1f} GiB; exit {doctor.returncode}"
    )
    lines += ["", "| profile | runs here | why |", "|---|---|---|"]
    for v in data.get("profiles", []):
        lines.append(f"| {v['profile']} | {'yes' if v['runs_here'] else 'no'} | {v['why'].replace('|', '/')} |")
    return [*lines, ""]


def cmd_wheels(args: argparse.Namespace) -> int:
    from packaging.requirements import Requirement

    from envbuild._compat import tomllib  # run from the repository's venv: envbuild is importable

    version = args.python_version
    target = {"python_version": version, "python_full_version": f"{version}.0"}
    deps = [Requirement(d) for d in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]]
    # uv is only for `envbuild lock`, which a host without network cannot run anyway (~20 MB).
    # Markers are decided here for the target Python: pip would judge them by its own interpreter.
    wanted = [
        f"{r.name}{r.specifier}" for r in deps if r.name != "uv" and (r.marker is None or r.marker.evaluate(target))
    ]
    dest = Path(args.dest)
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--quiet",
        "--dest",
        str(dest),
        "--only-binary=:all:",
        "--python-version",
        version,
        "--implementation",
        "cp",
        "--abi",
        f"cp{version.replace('.', '')}",
        "--platform",
        "manylinux_2_28_x86_64",
        "--platform",
        "manylinux_2_17_x86_64",
        "--platform",
        "manylinux2014_x86_64",
        *wanted,
    ]
    proc = subprocess.run(cmd, check=False)
    if proc.returncode == 0:
        size = sum(p.stat().st_size for p in dest.glob("*.whl"))
        print(f"{len(list(dest.glob('*.whl')))} wheels, {size / 2**20:.1f} MiB in {dest}")
    return proc.returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="validate and smoke-test this host's torch; write DIR/report.md")
    run.add_argument("--out", required=True, help="folder for report.md, smoke.json, validate.json")
    run.add_argument("--wheels", help="envbuild's dependencies as wheels (from `wheels`), for hosts without them")
    run.add_argument("--torch-python", help="the interpreter whose torch is checked (default: this one)")
    run.add_argument("--gpus", default="all", help="all, none or a count (default: all)")
    run.add_argument("--timeout", type=float, default=300.0, help="seconds for the smoke run")
    run.add_argument(
        "--check", action="append", default=[], help="a script to run as one of the profile's checks (repeatable)"
    )
    wheels = sub.add_parser("wheels", help="download envbuild's dependencies as wheels for another host")
    wheels.add_argument("--python-version", required=True, help="that host's Python, e.g. 3.12")
    wheels.add_argument("--dest", required=True)
    args = parser.parse_args()
    return cmd_run(args) if args.command == "run" else cmd_wheels(args)


if __name__ == "__main__":
    sys.exit(main())
