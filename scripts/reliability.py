"""Write docs/RELIABILITY.md from the figures the hardening tests recorded (`make reliability`).

Run the suites first (`make check`); each hardening test leaves a JSON file in
.envbuild/reliability/. Missing files are reported as "not run".
"""

from __future__ import annotations

import datetime
import json
import platform
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIGURES = REPO / ".envbuild" / "reliability"
DOC = REPO / "docs" / "RELIABILITY.md"
# Hand-written, kept by every rewrite: edges whose tests assert them directly, with no figures to collect.
EDGES = REPO / "docs" / "RELIABILITY-EDGES.md"

SECTIONS = [
    (
        "bad_input",
        "Bad input through the loader, `validate` and `render`",
        "Random YAML, valid profiles with one field mutated, swapped and dropped fields, wrong types, huge "
        "strings, unicode, deep nesting and alias bombs, through the CLI in-process. Pass: only exit 0 or 2, "
        "no traceback, no internal error, each case under 5 s, memory bounded (sampled with tracemalloc).",
    ),
    (
        "injection",
        "Injection into every field that reaches the Dockerfile or a shell",
        "Newlines, `&&`, `;`, `$()`, backticks, quotes, Jinja syntax, `../`, 5,000-character values in each "
        "field. Pass: rejected by validation, or rendered with exactly the instructions of a benign value.",
    ),
    (
        "interrupt_render",
        "Killing `envbuild render -o` at random moments",
        "Pass: every visible file is the old or the new version, whole.",
    ),
    (
        "interrupt_lock",
        "Killing `envbuild lock` at random moments",
        "Pass: the lockfile is the old one or a complete new one.",
    ),
    ("interrupt_build", "Killing `envbuild build` at random moments", "Pass: no tag moved; the next build succeeds."),
    (
        "push_stall",
        "A push through a link that stops forwarding",
        "A relay in front of a real registry forwards 4 MB, then holds every connection and moves nothing. "
        'Pass: "stalled" after ENVBUILD_STALL_TIMEOUT, retried, exit 10, no tag moved.',
    ),
    (
        "interrupt_smoke_container",
        "SIGTERM to `envbuild smoke IMAGE` while its container runs",
        "Pass: exit 143, and no container labelled `io.envbuild.smoke-container` for that image remains.",
    ),
    (
        "interrupt_smoke_local",
        "SIGTERM to `envbuild smoke --local` during the DDP check",
        "Pass: exit 143, and none of the processes it had started (checks, forkserver, ranks) is still alive.",
    ),
    ("concurrent_locks", "Two locks of one profile at once", "Pass: one intact result (a file lock serialises them)."),
    ("concurrent_builds", "Two different profiles built at once", "Pass: both succeed with their own tags."),
    (
        "secrets",
        "Secrets after a build with a CA bundle and an index URL with credentials",
        "Pass: neither appears in any file of any layer, in labels, history, env, or envbuild's output.",
    ),
]


def main() -> int:
    lines = [
        "# envbuild reliability",
        "",
        f"Figures from the hardening suites (`tests/unit/test_hardening.py`, `tests/e2e/test_hardening_e2e.py`, "
        f"`tests/e2e/test_lock_real.py`), run {datetime.date.today().isoformat()} on {platform.machine()} "
        "with Python " + platform.python_version() + ". Regenerate: `make check && make reliability`.",
        "",
    ]
    missing = 0
    for key, title, what in SECTIONS:
        lines += [f"## {title}", "", what, ""]
        path = FIGURES / f"{key}.json"
        if not path.is_file():
            lines += ["_not run in the last test run_", ""]
            missing += 1
            continue
        data = json.loads(path.read_text())
        lines += ["| figure | value |", "|---|---|"]
        for name, value in sorted(data.items()):
            shown = (
                ", ".join(f"{k}: {v}" for k, v in value.items())
                if isinstance(value, dict)
                else (", ".join(map(str, value)) if isinstance(value, list) else value)
            )
            lines.append(f"| {name.replace('_', ' ')} | {shown} |")
        lines.append("")
    if EDGES.is_file():
        lines += [EDGES.read_text().rstrip(), ""]
    DOC.parent.mkdir(exist_ok=True)
    DOC.write_text("\n".join(lines).rstrip() + "\n")
    print(f"wrote {DOC} ({len(SECTIONS) - missing} of {len(SECTIONS)} sections with figures)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
