"""The project's own checks (`checks:` in a profile): scripts that travel with the smoke test and
pass when they exit 0 within their time limit."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

from .core import CheckFailed, Context, Result

TAIL_LINES = 20


def _tail(text: str) -> list[str]:
    return text.strip().splitlines()[-TAIL_LINES:]


def run_script(ctx: Context, r: Result, script: dict[str, Any]) -> None:
    path = str(script["path"])
    if not os.path.isabs(path):
        path = os.path.join(os.path.dirname(ctx.expect_path or "."), path)
    limit = float(script.get("timeout") or 600)
    r.facts.update(script=script["file"], timeout_s=limit)
    t0 = time.monotonic()
    try:
        proc = subprocess.run(
            [sys.executable, path],
            capture_output=True,
            text=True,
            timeout=limit,
            check=False,
            cwd=os.path.dirname(path),
        )
    except subprocess.TimeoutExpired as exc:
        r.facts["stdout_tail"] = _tail(exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or "")
        raise CheckFailed(
            f"{script['file']} did not finish within {limit:g} s", "make it faster, or raise its timeout"
        ) from exc
    r.facts.update(
        exit_code=proc.returncode,
        script_s=round(time.monotonic() - t0, 2),
        stdout_tail=_tail(proc.stdout),
        stderr_tail=_tail(proc.stderr),
    )
    if proc.returncode != 0:
        last = (_tail(proc.stderr) or _tail(proc.stdout) or ["no output"])[-1]
        raise CheckFailed(
            f"{script['file']} exited {proc.returncode}: {last[:300]}",
            f"see facts.stderr_tail; run it alone with `python {script['file']}` in the image",
        )
