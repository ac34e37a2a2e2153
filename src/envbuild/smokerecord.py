"""The smoke test's record on an image, and whether it holds for the image that carries it.

A build marks a tested image with labels (`io.envbuild.smoke=passed`, ...) in a child image that adds
labels and nothing else. Labels are inherited: `FROM tested` + `RUN pip install x`, or a `LABEL` that
rewrites `io.envbuild.torch`, gave an image that `push`, `pull` and `images` took for the tested one.
So the record also carries a digest of what the test saw: the image's layers (their diff IDs), the
run-time config (Env, Entrypoint, Cmd, User, WorkingDir) and envbuild's and the OCI labels. A label-only
child keeps all three; any image derived or altered since does not, and its record no longer holds.

Not a signature: whoever recomputes the digest can forge it. It tells a derived or edited image from the
tested one; signing (cosign) is what stops a forger.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from envbuild.names import (
    LABEL_NS,
    LABEL_SMOKE,
    LABEL_SMOKE_GPU,
    LABEL_SMOKE_RECORD,
    LABEL_SMOKE_REPORT_VERSION,
    LABEL_SMOKE_TESTED_IMAGE,
    json_sha256,
)

# The record's own labels, which the tested image did not have yet.
RECORD_LABELS = frozenset(
    {LABEL_SMOKE, LABEL_SMOKE_TESTED_IMAGE, LABEL_SMOKE_REPORT_VERSION, LABEL_SMOKE_GPU, LABEL_SMOKE_RECORD}
)
CONFIG_KEYS = ("Env", "Entrypoint", "Cmd", "User", "WorkingDir")
_COVERED_PREFIXES = (f"{LABEL_NS}.", "org.opencontainers.image.")

State = Literal["passed", "untested", "altered"]


def digest(attrs: Mapping[str, Any], labels: Mapping[str, str] | None = None) -> str:
    """sha256 of what the smoke test saw, from an image's inspect attributes. `labels`: the labels to
    count instead of the image's own (the build's, which the marking child adds to the tested image)."""
    config = attrs.get("Config") or {}
    given = (config.get("Labels") or {}) if labels is None else labels
    payload = {
        "layers": list((attrs.get("RootFS") or {}).get("Layers") or []),
        "config": {key: config.get(key) for key in CONFIG_KEYS},
        "labels": {
            k: v for k, v in sorted(given.items()) if k.startswith(_COVERED_PREFIXES) and k not in RECORD_LABELS
        },
    }
    return json_sha256(payload)


def state(attrs: Mapping[str, Any]) -> State:
    """passed: the record is there and holds for this image; untested: no record; altered: a record
    inherited or edited, which does not hold (a derived image, relabelled, or one older than the
    record's digest)."""
    labels = (attrs.get("Config") or {}).get("Labels") or {}
    if labels.get(LABEL_SMOKE) != "passed":
        return "untested"
    return "passed" if labels.get(LABEL_SMOKE_RECORD) == digest(attrs) else "altered"


ALTERED = (
    "its smoke-test record does not hold: its layers, run-time config or envbuild labels differ from "
    "the image that passed (an image derived from it, relabelled, or altered), or an envbuild older "
    "than the record built it"
)


def passed_before(cli: Any, built: str, saved: Path, accelerator: str) -> dict[str, Any] | None:
    """The report of the whole smoke test that passed on this very image, when a build that changed
    nothing need not run it again: the builder gave the same image ID (every step from the cache),
    the engine holds an image envbuild marked as tested on that ID whose record holds, and the
    report the project keeps (`saved`) is a whole run that passed on the one or the other. A no-op rebuild ran
    the whole test again: 24 s of the 26 s `envbuild build cpu-py311` took with nothing changed.

    None, so the test runs, for a GPU or ROCm profile: what it certifies there is this host's
    driver, devices and collectives, which the image ID does not pin."""
    if accelerator != "cpu":
        return None
    try:
        doc = json.loads(saved.read_text("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    report: dict[str, Any] = doc if isinstance(doc, dict) else {}
    if report.get("only") or report.get("passed") is not True:
        return None
    marked = {
        str(summary["Id"])
        for summary in cli.api.images(filters={"label": f"{LABEL_SMOKE_TESTED_IMAGE}={built}"})
        if state(cli.api.inspect_image(summary["Id"])) == "passed"
    }
    # the build's own run tested `built`; `envbuild smoke NAME` since then tested the marked image
    return report if marked and report.get("image") in {built, *marked} else None
