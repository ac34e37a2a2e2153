"""The `labels` check, run on the host after the in-image report: an image's labels say what is
inside (`docker inspect`, `images`, `pull --verify` read them), so they must agree with what the
smoke test found there. A derived image can rewrite any label (`LABEL io.envbuild.torch=2.5.1`) and
still pass every check inside, which reads the image's own expect.json, not its labels."""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from typing import Any

from envbuild import engine, smokerecord
from envbuild.names import (
    ENV_DIGEST_PATH,
    LABEL_ACCELERATOR,
    LABEL_CUDA,
    LABEL_ENV_DIGEST,
    LABEL_NUMPY,
    LABEL_PROFILE,
    LABEL_PYTHON,
    LABEL_ROCM,
    LABEL_SMOKE,
    LABEL_SMOKE_GPU,
    LABEL_SMOKE_RECORD,
    LABEL_SMOKE_REPORT_VERSION,
    LABEL_SMOKE_TESTED_IMAGE,
    LABEL_TORCH,
)

NAME = "labels"
# label -> the key of the report's `expect` (what the image was built to hold; the in-image
# `versions` check holds the environment to it)
_EXPECTED = {
    LABEL_PROFILE: "profile",
    LABEL_ACCELERATOR: "accelerator",
    LABEL_PYTHON: "python",
    LABEL_TORCH: "torch",
    LABEL_NUMPY: "numpy",
    LABEL_CUDA: "cuda",
    LABEL_ROCM: "rocm",
}


def check(labels: Mapping[str, str], report: dict[str, Any]) -> dict[str, Any]:
    """The check's entry for the report: each envbuild label that the image carries against what the
    smoke test found. Labels it does not carry are not compared (envbuild adds the env digest only
    after the test)."""
    expect = report.get("expect") or {}
    wrong = []
    compared = []
    for label, key in _EXPECTED.items():
        if label in labels and expect.get(key) not in (None, ""):
            compared.append(label)
            if labels[label] != str(expect[key]):
                wrong.append(f"{label}={labels[label]!r} but the image holds {key} {expect[key]}")
    integrity: dict[str, Any] = next((c for c in report.get("checks") or [] if c.get("name") == "integrity"), {})
    passed = integrity.get("status") == "pass"
    digest = str((integrity.get("facts") or {}).get("env_digest") or "") if passed else ""
    if LABEL_ENV_DIGEST in labels and integrity.get("status") == "skip":
        # the build adds the label from the manifest's digest: an image that carries it (even
        # blanked) and has no manifest had it removed, and with it the check of every file
        compared.append(LABEL_ENV_DIGEST)
        wrong.append(
            f"{LABEL_ENV_DIGEST} says the build wrote a manifest of the environment, but the image has none "
            f"(in {posixpath.dirname(ENV_DIGEST_PATH)}): it was removed after the build, so nothing vouches "
            "for the environment's files"
        )
    elif LABEL_ENV_DIGEST in labels and digest:
        compared.append(LABEL_ENV_DIGEST)
        if labels[LABEL_ENV_DIGEST] != digest:
            wrong.append(
                f"{LABEL_ENV_DIGEST} is {labels[LABEL_ENV_DIGEST][:12]} but the environment's is {digest[:12]}"
            )
    entry: dict[str, Any] = {
        "name": NAME,
        "status": "fail" if wrong else "pass",
        "reason": ("the image's labels do not say what is inside: " + "; ".join(wrong)) if wrong else "",
        "remedy": "rebuild it (envbuild build NAME), or pull the image that was published; a label "
        "rewritten after the build (LABEL in a derived Dockerfile) is what this finds"
        if wrong
        else "",
        "seconds": 0.0,
        "facts": {"compared": compared},
    }
    return entry


def add(labels: Mapping[str, str], report: dict[str, Any]) -> None:
    """Append the check to `report`, and fail the report when it fails."""
    entry = check(labels, report)
    report.setdefault("checks", []).append(entry)
    if entry["status"] == "fail":
        report["passed"] = False
        report.setdefault("failed", []).append(NAME)


def mark_smoke_passed(cli: Any, image_id: str, report: dict[str, Any] | None) -> str:
    """A child image that only adds labels: the environment's digest (from the manifest the build
    wrote) and, when `report` is given, that the smoke test passed on `image_id`. The record travels
    with the image ID (to the registry too): any checkout, machine or registry client can tell a
    tested image from an untested one."""
    import io

    labels = {}
    env_digest = engine.read_file(cli, image_id, ENV_DIGEST_PATH).strip()
    if len(env_digest) == 64:  # images built from older templates have none
        labels[LABEL_ENV_DIGEST] = env_digest
    if report is not None:
        labels[LABEL_SMOKE] = "passed"
        labels[LABEL_SMOKE_TESTED_IMAGE] = image_id
        labels[LABEL_SMOKE_REPORT_VERSION] = str(report["report_version"])
        labels[LABEL_SMOKE_GPU] = next((c["status"] for c in report["checks"] if c["name"] == "gpu"), "skip")
        # What the test saw, as the child will carry it: the tested image's layers and config, its
        # labels and the env digest added here (smokerecord.py: how a derived image is told apart).
        tested = cli.api.inspect_image(image_id)
        seen = {**((tested.get("Config") or {}).get("Labels") or {}), **labels}
        labels[LABEL_SMOKE_RECORD] = smokerecord.digest(tested, seen)
    if not labels:
        return image_id
    line = " ".join(f'{k}="{v}"' for k, v in labels.items())
    dockerfile = f"FROM {image_id}\nLABEL {line}\n"
    image, _ = cli.images.build(fileobj=io.BytesIO(dockerfile.encode()), rm=True, forcerm=True, timeout=cli.api.timeout)
    return str(image.id)
