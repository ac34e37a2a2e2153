"""Every name that two stages must agree on, defined once: label keys, tag shapes, lockfile and
mutex file names, platform tags, shared-memory sizes and the progress-callback shapes.

Core layer: imports nothing of envbuild's, so any stage may read it.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from pathlib import Path

# ---- progress callbacks -----------------------------------------------------------------------

Events = Callable[[str, str, str], None]
"""Progress of one long job (build, push, pull, prune): (kind, key, text), e.g.
("phase", "build", "docker builder") or ("transfer", "push", "120 MB of 900 MB")."""

LockEvents = Callable[[str, str, str], None]
"""Progress of locking several profiles: (profile name, state, text), state one of
resolving | fresh | locked | failed."""


def quiet(*_: str) -> None:
    """An Events / LockEvents that drops everything."""


# ---- profile names ------------------------------------------------------------------------------

NAME_RE = re.compile(r"^(cpu|cu\d{3}|rocm\d{2,3})-py3\d{1,2}(-[a-z0-9]+)*$")
# NAME_RE for people: the rule, not just two samples ("hf-py311" was refused with "cu121-py311" to go by).
NAME_RULE = (
    "<cpu|cuXYZ|rocmXY[Z]>-py<XY>[-suffix]: the torch build and Python first (validate checks them "
    'against the fields), then any suffix of your own, e.g. "cu121-py311" or "cpu-py311-hf"; '
    "the file's name must match"
)
# NAME-<12 hex> (and NAME-untested) must fit Docker's 128-character tag.
NAME_MAX = 100

# ---- image labels -----------------------------------------------------------------------------

LABEL_NS = "io.envbuild"
LABEL_VERSION = f"{LABEL_NS}.version"
LABEL_PROFILE = f"{LABEL_NS}.profile"
LABEL_IMAGE_DIGEST = f"{LABEL_NS}.image-digest"
LABEL_IMAGE_INPUTS = f"{LABEL_NS}.image-inputs"  # the image digest's parts: see part_digests
LABEL_LOCK_SHA = f"{LABEL_NS}.lock-sha256"
# A layer stage's cache image: the sha256 of the lockfile's part it installs (requirements.G.lock).
# Not the lockfile's: a re-lock that leaves a layer alone must leave its stage's image ID alone, or
# the runtime's COPY --from hashes that layer's files again (2 s for torch's 1.1 GB, minutes for CUDA).
LABEL_LAYER_SHA = f"{LABEL_NS}.layer-sha256"
# On a layer stage's cache image too: the sha256 of everything its steps are made of but the base
# image (its lines and venv-base's, the files they copy in, its part of the lockfile). A build takes
# such an image for the stage, without its wheels, only when it also descends from the base image
# of this build (buildahead.substitutes).
LABEL_STAGE_SHA = f"{LABEL_NS}.stage-sha256"
# Every file of an image's environment gets this time (1980-01-01, the oldest a zip archive can
# hold): a layer's bytes then depend on what is in it, not on when it was built.
FIXED_MTIME = 315532800
LABEL_APT_LOCK_SHA = f"{LABEL_NS}.apt-lock-sha256"  # the apt.lock the OS packages were installed from
LABEL_SBOM_SHA = f"{LABEL_NS}.sbom-sha256"  # of /opt/envbuild/sbom.cdx.json, the CycloneDX document it carries
LABEL_CONTENT_DIGEST = f"{LABEL_NS}.content-digest"  # lockfile + image digest: what the NAME-<12 hex> tag names
LABEL_ENV_DIGEST = f"{LABEL_NS}.env-digest"  # sha256 of the build manifest: equal environments, equal digests
ENV_DIGEST_PATH = "/opt/envbuild/env-digest"  # written by the image's manifest step
EXPECT_PATH = "/opt/envbuild/expect.json"  # what the smoke test expects: versions and the lock's pins
MANIFEST_PATH = "/opt/envbuild/manifest.json"  # every environment file's mode and sha256, the OS packages
LABEL_FLAVOR = f"{LABEL_NS}.flavor"
LABEL_PYTHON = f"{LABEL_NS}.python"
LABEL_TORCH = f"{LABEL_NS}.torch"
LABEL_NUMPY = f"{LABEL_NS}.numpy"
LABEL_ACCELERATOR = f"{LABEL_NS}.accelerator"
LABEL_CUDA = f"{LABEL_NS}.cuda"
LABEL_ROCM = f"{LABEL_NS}.rocm"
LABEL_STAGE = f"{LABEL_NS}.stage"  # "builder" on the builder stage's cache image
LABEL_LAYER = f"{LABEL_NS}.layer"  # on a builder-side cache image: which layer's stage (torch, ..., rest)
LABEL_SOURCE = "org.opencontainers.image.source"
# The passed-smoke record, added by a labels-only child image after the smoke test passed.
LABEL_SMOKE = f"{LABEL_NS}.smoke"
LABEL_SMOKE_TESTED_IMAGE = f"{LABEL_SMOKE}.tested-image"
LABEL_SMOKE_REPORT_VERSION = f"{LABEL_SMOKE}.report-version"
LABEL_SMOKE_GPU = f"{LABEL_SMOKE}.gpu"
# sha256 of the layers, run-time config and labels the test saw: smokerecord.py says why.
LABEL_SMOKE_RECORD = f"{LABEL_SMOKE}.record"
# Every smoke *container* carries this one (value: the image), so leftovers can be found. Not
# LABEL_SMOKE: a container inherits its image's labels, and that one marks tested images.
LABEL_SMOKE_CONTAINER = f"{LABEL_NS}.smoke-container"

# ---- tags -------------------------------------------------------------------------------------

UNTESTED = "-untested"
"""Suffix of a `--no-smoke` build's tag: never the profile's own tag, which only a tested image gets."""
TAG_MAX = 128  # Docker's limit for the part after the colon
TAG_SHA_CHARS = 12


def moving_tag(repo: str, profile: str) -> str:
    """REPO:NAME, the tag `run` starts and `push` publishes; only a smoke-tested image gets it."""
    return f"{repo}:{profile}"


def json_sha256(payload: object) -> str:
    """sha256 of `payload` as canonical JSON (sorted keys, no spaces): one digest for equal data."""
    return hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def part_digests(inputs: dict[str, object]) -> str:
    """The image-inputs label: each part of what the image digest covers (plan.Plan.image_inputs) as
    the first 12 hex digits of its own digest, so `images` and `status` can say which part a stale
    image differs in (the smoke test of another envbuild, the templates, the profile's fields)."""
    return json.dumps({k: json_sha256(v)[:12] for k, v in sorted(inputs.items())}, separators=(",", ":"))


def content_digest(lock_sha: str, image_digest: str, apt_sha: str = "") -> str:
    """sha256 of everything that reaches an image: the lockfile (lock_sha), apt.lock when there is
    one, and the rest (plan.Plan.image_digest: profile fields, templates, smoke package). Two images
    with one content digest were built from the same inputs; the immutable tag is named after it."""
    tail = f"\n{apt_sha}" if apt_sha else ""
    return hashlib.sha256(f"{lock_sha}\n{image_digest}{tail}".encode()).hexdigest()


def immutable_tag(repo: str, profile: str, digest: str) -> str:
    """REPO:NAME-<12 hex of the content digest>: one tag never names two different images."""
    return f"{repo}:{profile}-{digest[:TAG_SHA_CHARS]}"


def _tag_of(ref: str) -> str:
    """TAG of REPO:TAG, where REPO may hold a registry port."""
    return ref.rsplit("/", 1)[-1].partition(":")[2]


def is_moving(ref: str, profile: str) -> bool:
    """Whether `ref` is one of the profile's moving tags."""
    return _tag_of(ref) in {profile, profile + UNTESTED}


def is_envbuild_tag(ref: str, profile: str) -> bool:
    """Whether `ref`'s tag is one envbuild gives the profile's images (moving or NAME-<12 hex>), in
    any repository. An image with another tag was tagged by someone else: an image built FROM an
    envbuild image keeps its labels, so the labels alone do not make it envbuild's."""
    sha = f"{re.escape(profile)}-[0-9a-f]{{{TAG_SHA_CHARS}}}"
    return is_moving(ref, profile) or re.fullmatch(sha, _tag_of(ref)) is not None


# ---- platforms and lockfile names -------------------------------------------------------------

PLATFORM_TAGS = {"x86_64": "x86_64-manylinux_2_28", "aarch64": "aarch64-manylinux_2_28"}
CONDA_SUBDIRS = {"x86_64": "linux-64", "aarch64": "linux-aarch64"}
DOCKER_PLATFORMS = {"x86_64": "linux/amd64", "aarch64": "linux/arm64"}
MACHINE_PLATFORMS = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}


def lock_names(platform: str, flavor: str = "venv") -> tuple[str, ...]:
    """File names of one platform's lock: the primary first."""
    if flavor == "conda":
        return ("conda-lock.yml",)
    if platform == "x86_64":
        return ("requirements.lock", "pylock.toml")
    return (f"requirements.{platform}.lock", f"pylock.{platform}.toml")


# ---- mutexes ------------------------------------------------------------------------------------
# Inter-process mutexes live under the build folder (git-ignored), never beside the lockfiles where
# `.cpu-py311.lock` reads like a lockfile.


def mutex_path(build_dir: Path, what: str, profile: str) -> Path:
    """The file behind one mutex: `what` is "lock" (writing a profile's lockfiles) or "build"."""
    return build_dir / "mutex" / f"{what}-{profile}"


# ---- run-time settings --------------------------------------------------------------------------

# The oldest Python the smoke package runs on (importlib.metadata came with 3.8), which is the image's:
# a profile's python below it is refused (torch 1.13 has 3.7 wheels).
SMOKE_MIN_PYTHON = "3.8"
SMOKE_SHM_SIZE = "2g"  # the smoke test's DataLoader and DDP need more than Docker's 64 MB
RUN_SHM_SIZE = "8g"  # training, not a smoke test: DataLoader workers with large batches want more
IMAGE_UID = 1000  # the image's non-root user
# The image's PID 1: tini (Debian's `tini` package), then the command. Python as PID 1 gets no
# default action for SIGTERM, so `docker stop` and a Kubernetes eviction waited out their grace
# period and SIGKILLed the job (no cleanup); and nothing reaped the zombies of orphaned workers.
# -s: also reaps as a subreaper when something else is PID 1 (`docker run --init`, `envbuild run`).
INIT_PACKAGE = "tini"
# Then a shell script of the image's own (buildctx.smoke_files writes it), which gives a user with no
# home of their own a writable HOME before it execs the command: `docker run -u "$(id -u):$(id -g)"`
# (the usual way to write files a host user owns) and Kubernetes' runAsUser leave HOME at `/`, and
# `~/.cache` then failed: Hugging Face datasets' `PermissionError: '/.cache'`, torch.hub, pip.
ENTRY_SCRIPT = "entrypoint"
IMAGE_ENTRYPOINT = ("/usr/bin/tini", "-s", "--", f"/opt/envbuild/{ENTRY_SCRIPT}")

# Packages that must come from the same place as torch: its own builds and the GPU runtime wheels
# that carry CUDA or ROCm.
TORCH_FAMILY_RE = re.compile(
    r"^(torch|torchvision|torchaudio|triton|pytorch-triton(-rocm|-xpu)?|nvidia-.+|cuda-.+|rocm-.+)$"
)
# git's conflict markers (`<<<<<<< ours`, `|||||||` with diff3, `=======`, `>>>>>>> theirs`): a merge
# of two branches that both changed a profile or re-locked
CONFLICT_MARKER_RE = re.compile(r"^(<{7}|\|{7}|={7}|>{7})(?: |$)")
CONFLICT_SAID = "a merge's conflict markers (<<<<<<<, =======, >>>>>>>)"
CONFLICT_FIX = "keep one side's lines (or write both changes together) and remove the markers"


def conflict_line(text: str) -> int | None:
    """The number of the first line of `text` that is a merge's conflict marker, if any."""
    return next((n for n, line in enumerate(text.splitlines(), 1) if CONFLICT_MARKER_RE.match(line)), None)


# An editor that saved a file as Latin-1 or Windows-1252 (a name with an accent in a comment)
NOT_UTF8_FIX = "save the file as UTF-8 (the editor's encoding setting, or `iconv -f latin1 -t utf-8`)"


def not_utf8(exc: UnicodeDecodeError) -> tuple[str, int, int]:
    """Where a file stops being UTF-8, as a person finds it in an editor: (what, line, column)."""
    raw = bytes(exc.object)
    line = raw.count(b"\n", 0, exc.start) + 1
    column = exc.start - raw.rfind(b"\n", 0, exc.start)
    return f"not UTF-8 text (byte 0x{raw[exc.start]:02x})", line, column


PYPI_SIMPLE = "https://pypi.org/simple"
TORCH_INDEX_ROOT = "https://download.pytorch.org/whl"


def canonical(name: str) -> str:
    """A distribution name as PEP 503 compares them: runs of -, _ and . are one '-', lower case."""
    return re.sub(r"[-_.]+", "-", name).lower()


# An accelerator as people write it, in messages
ACCELERATOR_SHOWN = {"cpu": "CPU", "cuda": "CUDA", "rocm": "ROCm"}
