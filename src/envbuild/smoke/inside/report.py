"""Running the checks, the report and the command line."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import socket
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from . import vecprobe
from .compiled import check_compile, check_export
from .core import DEFAULT_EXPECT, LOCK_MATCHES, REPORT_VERSION, CheckFailed, Context, Result, Skip
from .gpu import check_cudnn, check_gpu
from .imports import check_imports
from .integrity import check_integrity
from .perf import check_perf
from .train import check_amp, check_dataloader, check_ddp, check_determinism
from .usercheck import run_script
from .versions import check_libs, check_versions

CHECKS: list[tuple[str, Callable[[Context, Result], None]]] = [
    ("versions", check_versions),
    ("integrity", check_integrity),
    ("imports", check_imports),
    ("libs", check_libs),
    ("gpu", check_gpu),
    ("cudnn", check_cudnn),
    ("ddp", check_ddp),
    ("amp", check_amp),
    ("dataloader", check_dataloader),
    ("determinism", check_determinism),
    ("compile", check_compile),
    ("export", check_export),
    ("perf", check_perf),
]


def _checks(ctx: Context) -> list[tuple[str, Callable[[Context, Result], None]]]:
    """The built-in checks, then the project's own (`checks:` in the profile), named after their files."""
    own = []
    for script in ctx.expect.get("checks") or []:

        def one(c: Context, r: Result, s: dict[str, Any] = script) -> None:
            run_script(c, r, s)

        own.append((f"check:{script['file']}", one))
    return [*CHECKS, *own]


def _own_name(name: str) -> str:
    """A project check named as the profile lists it (check:checks/train.py) is check:train.py here."""
    return "check:" + os.path.basename(name[len("check:") :]) if name.startswith("check:") else name


def _run_checks(
    ctx: Context, checks: list[tuple[str, Callable[[Context, Result], None]]], wanted: set[str] | None
) -> list[Result]:
    results = []
    for name, fn in checks:
        if wanted is not None and name not in wanted:
            continue
        r = Result(name)
        t0 = time.monotonic()
        try:
            fn(ctx, r)
        except Skip as exc:
            r.status, r.reason = "skip", str(exc)
        except CheckFailed as exc:
            r.status, r.reason, r.remedy = "fail", exc.reason, exc.remedy
        except ModuleNotFoundError as exc:  # an interpreter without the environment: say which
            r.status, r.reason = "fail", f"{exc.name} is not installed in {sys.executable}"
            r.remedy = ctx.environment_remedy()
        except Exception as exc:  # a check that crashes is a failed check, with its traceback as fact
            r.status, r.reason = "fail", f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            r.remedy = "see facts.traceback"
            r.facts["traceback"] = traceback.format_exc(limit=5)
        r.seconds = round(time.monotonic() - t0, 3)
        results.append(r)
    return results


def run(ctx: Context, only: list[str] | None = None) -> dict[str, Any]:
    started = time.time()
    checks = _checks(ctx)
    wanted = {_own_name(name) for name in only or []}
    # inductor's CPU probe runs beside the checks before `compile`, instead of in front of its first call
    runs_compile = any(n == "compile" and (not only or n in wanted) for n, _ in checks)
    vecprobe.start(runs_compile and ctx.expect.get("compile") is not False)
    try:
        results = _run_checks(ctx, checks, wanted if only else None)
    except BaseException:
        vecprobe.finish(interrupted=True)
        raise
    vecprobe.finish()
    names = [name for name, _ in checks]
    for name in only or []:
        if _own_name(name) not in names:
            # A name this environment has no check for (a typo, a project script the image was not
            # built with) must not leave a run that checked nothing and passed.
            r = Result(name)
            r.status, r.reason = "fail", f"no check named {name!r} here"
            r.remedy = "the checks are: " + ", ".join(names)
            results.append(r)
    failed = [r.name for r in results if r.status == "fail"]
    return {
        "report_version": REPORT_VERSION,
        "tool": "envbuild-smoke",
        "started": datetime.datetime.fromtimestamp(started, datetime.timezone.utc).isoformat(timespec="seconds"),
        "seconds": round(time.time() - started, 3),
        "host": {"hostname": socket.gethostname(), "machine": platform.machine(), "python": platform.python_version()},
        "expect": {k: v for k, v in ctx.expect.items() if k != "packages"},
        "gpus": ctx.gpus,
        "passed": not failed,
        "failed": failed,
        # a run of some checks (`--only`) says so: its "passed" is not the whole smoke test's
        **({"only": sorted(set(only))} if only else {}),
        "checks": [asdict(r) for r in results],
    }


SUMMARY_FACTS = (
    "preload",
    "torch",
    "numpy",
    "not_in_lockfile",  # --lock-match pins: what a derived image added, named in the table too
    "os_packages_changed",  # and what its apt-get did
    "imported",
    "device_count",
    "version",
    "world_size",
    "backend",
    "all_reduce",
    "steps",
    "batches",
    "driver",
    "device",
    "first_call_s",
    "vec_isa_probe_s",
    "format",
    "onnx",
    "cpu_fp32_gflops",
    "all_reduce_busbw_gbs",
    "script_s",
)


def detail(check: dict[str, Any]) -> str:
    """One line for a check: its reason, or the facts a person looks at first."""
    facts = check["facts"]
    return str(check["reason"]) or ", ".join(f"{k}={_shown(facts[k])}" for k in SUMMARY_FACTS if k in facts)


def only_note(report: dict[str, Any]) -> str:
    """What a verdict line adds when only some checks ran."""
    return f" (only {', '.join(report['only'])}: not the whole smoke test)" if report.get("only") else ""


def _shown(value: Any) -> str:
    if not isinstance(value, list):
        return str(value)
    items = list(map(str, value))
    return ("; " if any(" " in i for i in items) else " ").join(items)  # "libc6 A -> B; less (added)"


def table(report: dict[str, Any]) -> str:
    lines = [f"{'check':<12} {'result':<6} {'seconds':>7}  detail"]
    for c in report["checks"]:
        lines.append(f"{c['name']:<12} {c['status'].upper():<6} {c['seconds']:>7.2f}  {detail(c)}")
        if c["status"] == "fail" and c["remedy"]:
            lines.append(f"{'':<12} {'fix':<6} {'':>7}  {c['remedy']}")
    verdict = "PASSED" if report["passed"] else "FAILED: " + ", ".join(report["failed"])
    lines.append(f"smoke {verdict} in {report['seconds']:.1f}s{only_note(report)}")
    return "\n".join(lines)


def only_names(typed: list[str] | None) -> list[str]:
    """`--only` as typed, repeated or comma-separated (`--only versions,integrity`, as most CLIs take
    a list): one check name per entry, in the order given, each once."""
    names = [part.strip() for entry in typed or () for part in entry.split(",")]
    # `--only ""` names no check: kept as typed, to be refused as no such check, never a whole run
    return list(dict.fromkeys(name for name in names if name)) or list(typed or ())


def main(argv: list[str] | None = None) -> int:
    # cuBLAS needs this before its first handle for deterministic results; set here, in the smoke
    # process, never on import (envbuild imports this package and must not change its own environment)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    parser = argparse.ArgumentParser(
        prog="envbuild-smoke", description="envbuild smoke test: prove that this environment really trains."
    )
    parser.add_argument("--expect", default=None, help=f"expectations JSON (default {DEFAULT_EXPECT} if present)")
    parser.add_argument("--json", dest="json_out", default=None, help="write the JSON report here ('-' = stdout)")
    parser.add_argument("--gpus", default="auto", help="auto | all | none | N")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds for a collective or a DataLoader")
    parser.add_argument("--lock-match", choices=LOCK_MATCHES, default="exact")
    parser.add_argument("--only", action="append", help="run only these checks (repeatable or comma-separated)")
    parser.add_argument("--local", action="store_true", help="on the host, not in an image (changes the remedies)")
    parser.add_argument("--min-peak", type=float, default=None, help="fail perf under this %% of the datasheet peak")
    args = parser.parse_args(argv)
    path = args.expect or (DEFAULT_EXPECT if os.path.exists(DEFAULT_EXPECT) else None)
    expect: dict[str, Any] = {}
    if path:
        with open(path, encoding="utf-8") as fh:
            expect = json.load(fh)
    ctx = Context(
        expect=expect,
        gpus=args.gpus,
        timeout=args.timeout,
        lock_match=args.lock_match,
        local=args.local,
        min_peak=args.min_peak,
        expect_path=os.path.abspath(path) if path else None,
    )
    report_out = None
    if args.json_out == "-":
        # The report is all stdout carries, for `envbuild smoke` and jq: what the checks, a package
        # they import or a C library prints (a banner, a warning) goes to stderr instead.
        sys.stdout.flush()
        report_out = os.fdopen(os.dup(1), "w", encoding="utf-8")
        os.dup2(2, 1)
    report = run(ctx, only_names(args.only) or None)
    text = table(report)
    if report_out is not None:
        print(text, file=sys.stderr)
        with report_out:
            report_out.write(json.dumps(report, indent=2) + "\n")
    else:
        print(text)
        if args.json_out:
            with open(args.json_out, "w", encoding="utf-8") as fh:
                json.dump(report, fh, indent=2)
    return 0 if report["passed"] else 1
