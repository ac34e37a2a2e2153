"""The host side of the smoke test: run it in a container (docker-py) or in an interpreter."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from envbuild import buildctx, engine, freshness, localimage, smokerecord, tmpdirs
from envbuild import plan as plan_mod
from envbuild.errors import SmokeError, UsageError
from envbuild.fsutil import atomic_write_many
from envbuild.hostgpu import check_gpus, check_shm_size, gpus_for
from envbuild.names import LABEL_ACCELERATOR, LABEL_PROFILE, LABEL_SMOKE_CONTAINER, SMOKE_SHM_SIZE
from envbuild.profile import Profile
from envbuild.project import Project
from envbuild.smoke import container as smoke_container
from envbuild.smoke import labels as labels_check
from envbuild.smoke.inside.core import GPU_REFUSED_ENV, LOCK_MATCHES

STALE_AFTER_S = 600.0


def sweep_stale(cli: Any, older_than: float = STALE_AFTER_S) -> list[str]:
    """Remove smoke containers that finished long ago: what a killed envbuild could not remove.

    Only exited or never-started ones, and only after `older_than` seconds, so a concurrent run
    that is about to start its container or still reading its logs keeps it. Returns the removed
    containers' ids.
    """
    import docker

    removed: list[str] = []
    now = datetime.now(timezone.utc)
    filters = {"label": LABEL_SMOKE_CONTAINER, "status": ["exited", "created"]}
    try:
        # ignore_removed: another run may remove its own container between the list and the inspect
        listed = cli.containers.list(all=True, filters=filters, ignore_removed=True)
    except docker.errors.APIError:
        return removed  # housekeeping never fails a smoke run
    for container in listed:
        # judged on the inspected state, not the list filter's: a concurrent run may have started
        # its container in between (seen in the e2e suite's two simultaneous builds)
        since = stale_since(container.attrs)
        if since is None or (now - since).total_seconds() < older_than:
            continue
        if not smoke_container.is_smoke_command(container.attrs.get("Config", {}).get("Cmd") or []):
            continue  # a committed smoke container's label lives on in its image: not ours
        with contextlib.suppress(docker.errors.APIError):
            container.remove()  # no force: one that started after the inspect refuses and stays
            removed.append(container.id)
    return removed


def stale_since(attrs: dict[str, Any]) -> datetime | None:
    """Since when an inspected smoke container has been idle, or None if it may be in use.

    A never-started ("created") one counts from its creation, an exited one from when it
    finished; anything else, or a time the engine has not set (year 1), is left alone.
    """
    state = attrs.get("State") or {}
    status = state.get("Status")
    if status == "created":
        since = _parse_docker_time(str(attrs.get("Created", "")))
    elif status == "exited":
        since = _parse_docker_time(str(state.get("FinishedAt", "")))
    else:
        return None
    return since if since is not None and since.year > 1 else None


def _parse_docker_time(value: str) -> datetime | None:
    # the engine writes RFC 3339 with nanoseconds ("2026-11-30T03:33:19.783827201Z")
    head, _, frac = value.rstrip("Z").partition(".")
    try:
        stamp = datetime.strptime(head, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=timezone.utc)
    except ValueError:
        return None
    return stamp + timedelta(microseconds=int((frac + "000000")[:6])) if frac.isdigit() else stamp


def run_in_image(
    cli: Any,
    image: str,
    *,
    gpus: str = "auto",
    timeout: float = 600.0,
    accelerator: str = "cpu",
    shm_size: str | None = SMOKE_SHM_SIZE,
    ipc_host: bool = False,
    check_timeout: float = 120.0,
    min_peak: float | None = None,
    lock_match: str | None = None,
    shown: str | None = None,
    only: Sequence[str] = (),
) -> dict[str, Any]:
    """Run envbuild-smoke in a fresh container; the container is always removed.

    `shown`: how errors name the image (what the user typed); `image` is what runs (an ID)."""
    import docker

    inspected = smoke_container.inspect(cli, image, shown)
    labels = (inspected.get("Config") or {}).get("Labels") or {}
    if not labels.get(LABEL_PROFILE):
        raise smoke_container.not_envbuild(shown or image)
    command, kwargs = smoke_container.settings(
        inspected,
        gpus,
        check_timeout,
        min_peak=min_peak,
        lock_match=lock_match,
        ipc_host=ipc_host,
        shm_size=shm_size,
        only=only,
    )
    sweep_stale(cli)
    gpu_kwargs = smoke_container.gpu_kwargs(accelerator, gpus)
    refused: str | None = None
    container = smoke_container.create(cli, image, command, {**kwargs, **gpu_kwargs})
    # From here on every way out removes the container, a SIGTERM in the middle of start()
    # included (the engine may already run it while the client still waits for the answer).
    try:
        try:
            smoke_container.start(container, shown or image)
        except docker.errors.APIError as exc:
            if not gpu_kwargs:
                raise SmokeError(f"the smoke container did not start: {exc.explanation or exc}") from exc
            # The engine cannot hand out the GPUs (no NVIDIA runtime, no /dev/kfd). The image is
            # still run, without them, and told why: its gpu check then fails with the engine's
            # words and the fix, and the versions and libraries are checked as well, instead of
            # the whole run ending as a start error with no report.
            refused = str(exc.explanation or exc)
            with contextlib.suppress(docker.errors.APIError):
                container.remove(force=True)
            environment = {**kwargs["environment"], GPU_REFUSED_ENV: refused}
            container = smoke_container.create(cli, image, command, {**kwargs, "environment": environment})
            try:
                container.start()
            except docker.errors.APIError as exc2:
                raise SmokeError(f"the smoke container did not start: {exc2.explanation or exc2}") from exc2
        timed_out = SmokeError(
            f"the smoke test did not finish within {timeout:.0f}s and was stopped",
            hint="raise --timeout, or look for a hung collective (NCCL_DEBUG=INFO)",
        )
        code, out, err = smoke_container.finish(container, timeout, timed_out)
    finally:
        with contextlib.suppress(docker.errors.APIError):
            container.remove(force=True)
    try:
        report = read_report(out)
    except ValueError as exc:
        if code in (126, 127):  # the shell ran; `python` did not (not found, not executable)
            raise smoke_container.cannot_run(shown or image, err or f"exit {code}") from exc
        raise SmokeError(f"the smoke test crashed (exit {code}) before its report:\n{err[-2000:]}") from exc
    report["exit_code"] = code
    report["image"] = image
    # passed | untested | altered: whether the image is one that passed before (build's record), as
    # a derived or retagged image under a profile's tag is not; the checks above say how it is now
    report["smoke_record"] = smokerecord.state(inspected)
    if report.get("checks"):  # the labels must say what the checks found inside
        labels_check.add(labels, report)
    if refused is not None:
        report["gpu_refused"] = refused
    return report


def run_local(
    expect: dict[str, Any],
    *,
    python: str | None = None,
    gpus: str = "auto",
    timeout: float = 120.0,
    lock_match: str = "pins",
    wall_timeout: float = 1800.0,
    checks: dict[str, str] | None = None,
    min_peak: float | None = None,
    only: Sequence[str] = (),
) -> dict[str, Any]:
    """The same checks in an interpreter on this machine (GPU hosts, lockfile-only CI jobs): the
    package the images carry, copied to a temporary folder, so that interpreter needs no envbuild."""
    with tmpdirs.private("smoke") as tmp:
        expect_path = Path(tmp) / "expect.json"
        expect_path.write_text(json.dumps(expect), "utf-8")
        package = Path(tmp) / "lib" / buildctx.SMOKE_PACKAGE
        package.mkdir(parents=True)
        for name, text in plan_mod.smoke_sources().items():
            (package / name).write_text(text, "utf-8")
        (Path(tmp) / buildctx.CHECKS_DIR).mkdir()
        for name, text in (checks or {}).items():
            (Path(tmp) / buildctx.CHECKS_DIR / name).write_text(text, "utf-8")
        cmd = [
            python or sys.executable,
            "-m",
            buildctx.SMOKE_PACKAGE,
            "--expect",
            str(expect_path),
            "--json",
            "-",
            "--gpus",
            gpus,
            "--timeout",
            str(timeout),
            "--lock-match",
            lock_match,
            "--local",
            *(["--min-peak", str(min_peak)] if min_peak is not None else []),
            *smoke_container.only_args(only),
        ]
        try:
            # its own session: the DDP ranks and their forkserver are in that process group, so a
            # timeout or an interrupt stops all of them, not just the parent
            proc = subprocess.Popen(
                cmd,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                # TMPDIR: multiprocessing's forkserver keeps its socket in a pymp-* folder that only
                # a clean exit removes; inside this run's folder an interrupted run leaves none
                env={
                    **os.environ,
                    "PYTHONUNBUFFERED": "1",
                    "TMPDIR": str(tmp),
                    "PYTHONPATH": smoke_container.smoke_first(str(package.parent), os.environ.get("PYTHONPATH", "")),
                },
                start_new_session=True,
            )
        except OSError as exc:
            raise SmokeError(f"cannot run {cmd[0]}: {exc}") from exc
        try:
            stdout, stderr = proc.communicate(timeout=wall_timeout)
        except subprocess.TimeoutExpired as exc:
            raise SmokeError(f"the smoke test did not finish within {wall_timeout:.0f}s") from exc
        finally:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)  # the ranks of a finished run are gone already
            proc.wait()
    try:
        report = read_report(stdout)
    except ValueError as exc:
        if not stdout.strip() and not stderr.strip():
            raise SmokeError(
                f"{cmd[0]} printed no report (exit {proc.returncode})", hint="--python must name a Python interpreter"
            ) from exc
        raise SmokeError(
            f"the smoke test crashed (exit {proc.returncode}):\n{stderr[-2000:]}",
            hint="does that interpreter have torch and numpy?",
        ) from exc
    report["exit_code"] = proc.returncode
    return report


def smoke_profile_here(
    project: Project,
    prof: Profile,
    *,
    python: str | None = None,
    gpus: str = "auto",
    timeout: float = 600.0,
    lock_match: str = "pins",
    min_peak: float | None = None,
    only: Sequence[str] = (),
) -> dict[str, Any]:
    """`smoke --local NAME`: the profile's checks in an interpreter on this machine."""
    if lock_match not in LOCK_MATCHES:
        raise UsageError(f"--lock-match {lock_match!r}: use exact, pins or none")
    plan = plan_mod.make(project, prof, strict=False)
    # `none` checks the interpreter against the profile alone: a GPU host's own torch install
    # has no lockfile of envbuild's to compare with
    snap = None if lock_match == "none" else freshness.require_fresh(project, plan)
    return run_local(
        buildctx.expectations(plan, snap),
        checks=plan.checks,
        min_peak=min_peak,
        python=python,
        gpus=gpus_for(gpus, prof.accelerator, absent_ok=False),
        timeout=min(timeout, 300),
        lock_match=lock_match,
        wall_timeout=timeout,
        only=only,
    )


def smoke_image(
    project: Project,
    target: str,
    prof: Profile | None,
    *,
    repo: str | None = None,
    gpus: str = "auto",
    timeout: float = 600.0,
    shm_size: str | None = SMOKE_SHM_SIZE,
    ipc_host: bool = False,
    min_peak: float | None = None,
    lock_match: str | None = None,
    only: Sequence[str] = (),
) -> dict[str, Any]:
    """`smoke NAME|IMAGE`: a profile's image (as `build.profile_image` finds it) or any image.

    A profile's report of a whole run is also kept next to its build log, where `status` and a
    person look; a run of some checks (`only`) does not replace it."""
    check_gpus(gpus)
    if shm_size is not None and not ipc_host:
        check_shm_size(shm_size)
    cli = engine.client()
    if prof is not None:
        # an unknown image is a usage error here, not a failed smoke run
        ref, found = localimage.profile_image(cli, project, prof, repo)
        accelerator = prof.accelerator
    else:
        ref, found = target, engine.local_image(cli, target)
        accelerator = (found.labels or {}).get(LABEL_ACCELERATOR, "cpu")
    report = run_in_image(
        cli,
        found.id,
        gpus=gpus_for(gpus, accelerator, absent_ok=False),
        timeout=timeout,
        accelerator=accelerator,
        shm_size=shm_size,
        ipc_host=ipc_host,
        shown=ref,
        min_peak=min_peak,
        lock_match=lock_match,
        only=only,
    )
    report["ref"] = ref
    if prof is not None and not only:
        save_report(project.smoke_report(prof.name), report)
    return report


def read_report(out: str) -> dict[str, Any]:
    """The report envbuild-smoke printed, the last thing on its stdout. Whatever a sitecustomize or
    a .pth file printed as the interpreter started comes before it (once the smoke test runs, stray
    output goes to stderr). ValueError when there is none."""
    try:
        doc = json.loads(out)
    except ValueError:
        start = out.rfind("\n{\n")  # the report's first line; nested objects are indented
        if start < 0:
            raise
        doc = json.loads(out[start + 1 :])
    if not isinstance(doc, dict):
        raise ValueError("not a smoke report")
    return doc


def save_report(path: Path, report: dict[str, Any]) -> None:
    atomic_write_many({path: json.dumps(report, indent=2, sort_keys=True) + "\n"})


def summary(report: dict[str, Any]) -> str:
    lines = []
    for c in report["checks"]:
        if c["status"] == "fail":
            lines.append(f"  {c['name']}: {c['reason']}" + (f"\n    fix: {c['remedy']}" if c["remedy"] else ""))
    return "\n".join(lines)
