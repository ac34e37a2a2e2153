"""A failed build says the cause a user can act on, not "returned a non-zero code: 100".

The tails are what pip 24 and apt printed in real containers here (network cut with
`--network none`, TLS through this machine's intercepting proxy without its CA).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from envbuild import buildfail

PIP_TLS = [
    "Could not fetch URL https://pypi.org/simple/numpy/: There was a problem confirming the ssl certificate: "
    "HTTPSConnectionPool(host='pypi.org', port=443): Max retries exceeded with url: /simple/numpy/ (Caused by "
    "SSLError(SSLCertVerificationError(1, '[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: "
    "self-signed certificate in certificate chain (_ssl.c:992)'))) - skipping",
    "ERROR: Could not find a version that satisfies the requirement numpy==2.1.3 (from versions: none)",
    "ERROR: No matching distribution found for numpy==2.1.3",
]
PIP_OFFLINE = [
    "WARNING: Retrying (Retry(total=0, connect=None, read=None, redirect=None, status=None)) after connection "
    "broken by 'NewConnectionError('<pip._vendor.urllib3.connection.HTTPSConnection object at 0x7f8127920350>: "
    "Failed to establish a new connection: [Errno -3] Temporary failure in name resolution')': /simple/numpy/",
    "ERROR: Could not find a version that satisfies the requirement numpy==2.1.3 (from versions: none)",
    "ERROR: No matching distribution found for numpy==2.1.3",
]
PIP_NOT_IN_WHEELHOUSE = PIP_OFFLINE[1:]
APT_OFFLINE = [
    "  Temporary failure resolving 'deb.debian.org'",
    "W: Failed to fetch http://deb.debian.org/debian/dists/bookworm/InRelease  Temporary failure resolving "
    "'deb.debian.org'",
    "W: Some index files failed to download. They have been ignored, or old ones used instead.",
    "E: Unable to locate package python3.11",
]
APT_MISSING = ["Building dependency tree...", "E: Unable to locate package envbuild-no-such-package"]
APT_VERSION = ["E: Version '9.9' for 'git' was not found"]
# pip installing torch onto a 60 MB tmpfs in a container here; it rolls back, then says this.
DISK_FULL = [
    "  Moving to /opt/venv/lib/python3.11/site-packages/torchgen/",
    "   from /opt/venv/lib/python3.11/site-packages/~orchgen",
    "ERROR: Could not install packages due to an OSError: [Errno 28] No space left on device",
]
# The lines the Dockerfile's apt.lock checks print before they fail.
APT_BASE_DIFFERS = (
    "envbuild-apt: base-differs: the base image's own packages are not the ones apt.lock was resolved against"
)
APT_SHA = "envbuild-apt: sha256-mismatch: a downloaded .deb is not the one apt.lock records"
# uv in the builder through this machine's intercepting proxy without its CA (a real build here)
UV_TLS = [
    "error: Failed to fetch: https://pypi.org/simple/torch/",
    "  cause: error sending request for url (https://pypi.org/simple/torch/)",
    "  cause: client error (Connect)",
    "  cause: invalid peer certificate: UnknownIssuer",
    "hint: Consider enabling use of system TLS certificates with the `--system-certs` command-line flag",
]
# uv in a container with --network none
UV_OFFLINE = [
    "error: Request failed after 3 retries in 8.9s",
    "  cause: error sending request for url (https://pypi.org/simple/torch/)",
    "  cause: client error (Connect)",
    "  cause: dns error",
    "  cause: failed to lookup address information: Temporary failure in name resolution",
]
# uv in the builder (its real output, shortened: it lists every expected hash)
UV_HASHES = [
    "error: Failed to download `numpy==2.1.3`",
    "  cause: Hash mismatch for `numpy==2.1.3`",
    "         Expected:",
    "           sha256:0000000000000000000000000000000000000000000000000000000000000000",
    "         Computed:",
    "           sha256:bc6f24b3d1ecc1eebfbf5d6051faa49af40b03be1aaa781ebdadcbc090b4539b",
]
HASHES = [
    "ERROR: THESE PACKAGES DO NOT MATCH THE HASHES FROM THE REQUIREMENTS FILE. If you have updated the package "
    "versions, please update the hashes. Otherwise, examine the package contents carefully; someone may have "
    "tampered with them.",
    "    numpy==2.1.3 from https://files.pythonhosted.org/packages/numpy-2.1.3-cp311.whl:",
    "        Expected sha256 0000000000000000000000000000000000000000000000000000000000000000",
]


# uv 0.13 building an sdist with C code where there is no compiler (psutil, CC unset in the builder)
UV_SDIST = [
    "   Building psutil==7.2.2",
    "error: Failed to build `psutil==7.2.2`",
    "  cause: The build backend returned an error",
    "  cause: Call to `setuptools.build_meta.build_wheel` failed (exit status: 1)",
    "         building 'psutil._psutil_linux' extension",
    "         error: command 'x86_64-linux-gnu-gcc' failed: No such file or directory",
    "hint: Build failures usually indicate a problem with the package or the build environment",
]


@pytest.mark.parametrize(
    ("tail", "message", "hint"),
    [
        (UV_SDIST, "psutil==7.2.2 has no wheel for this platform, and building it", "pin a version of it that has"),
        (PIP_TLS, "the server's TLS certificate is not trusted", "--ca-bundle"),
        (PIP_OFFLINE, "the build could not reach the network", "--find-links DIR"),
        (UV_TLS, "the server's TLS certificate is not trusted", "--ca-bundle /etc/ssl/certs/ca-certificates.crt"),
        (UV_OFFLINE, "the build could not reach the network", "--find-links DIR"),
        (APT_OFFLINE, "the build could not reach the network (deb.debian.org)", "DNS and proxy"),
        (
            PIP_NOT_IN_WHEELHOUSE,
            "pip found no file for numpy==2.1.3 where the lockfile says it comes from",
            "envbuild build cpu-py311 --find-links DIR",
        ),
        (APT_MISSING, "apt has no package 'envbuild-no-such-package'", "the `apt:` list of cpu-py311's profile"),
        (APT_VERSION, "apt has no version 9.9 of git", "version pin of git"),
        (APT_VERSION, "apt has no version 9.9 of git", "set `apt_snapshot: auto`"),
        (
            ["--- /opt/envbuild/apt/base.list", "+libfoo 2 amd64", APT_BASE_DIFFERS],
            "the base image's own packages are not the ones apt.lock was resolved against",
            "envbuild lock cpu-py311 --base IMAGE",
        ),
        (
            ["python3.11_3.11.2-6_amd64.deb: FAILED", APT_SHA],
            "a downloaded .deb is not the file apt.lock records",
            "if apt.lock was edited, restore it",
        ),
        (HASHES, "hash mismatch for numpy==2.1.3", "envbuild lock cpu-py311 --upgrade"),
        (UV_HASHES, "hash mismatch for numpy==2.1.3", "envbuild lock cpu-py311 --upgrade"),
        (DISK_FULL, "the engine ran out of disk space", "envbuild images --prune"),
        # A download cut short by a full disk also fails its hash: the disk is the cause.
        (HASHES + DISK_FULL[2:], "the engine ran out of disk space", "docker builder prune"),
    ],
)
def test_diagnose_names_the_cause_not_the_symptom(tail: list[str], message: str, hint: str) -> None:
    found = buildfail.diagnose(tail, "cpu-py311")
    assert found is not None
    assert message in found.message
    assert hint in found.hint


def test_an_unknown_failure_is_left_to_the_engines_message() -> None:
    assert buildfail.diagnose(["Step 3/9 : RUN false", "returned a non-zero code: 1"], "cpu-py311") is None


def test_plain_strips_the_legacy_builders_colour_codes() -> None:
    assert buildfail.plain("\x1b[91mE: Unable to locate package x\n\x1b[0m") == "E: Unable to locate package x\n"


def test_the_engines_chunks_are_joined_into_lines_before_they_are_read(tmp_path: Path) -> None:
    """dockerd streams a step's stderr in pieces; one CI run got "E", ": " and the rest apart."""
    from envbuild.buildfail import BuildLog as _Log

    log = _Log(tmp_path / "build.log")
    chunks = [
        "Step 16/26 : RUN apt-get install -y x\n",
        "\n",
        " ---> Running in c1aa934b5304\n",
        "Building dependency tree...",
        "\n",
        "\x1b[91mE",
        ": ",
        "Unable to locate package envbuild-no-such-package\n",
        "\x1b[0m",
    ]
    lines = [line for chunk in chunks for line in log.feed(chunk)] + log.flush()
    log.close()
    assert "E: Unable to locate package envbuild-no-such-package" in [buildfail.plain(x) for x in lines]
    found = buildfail.diagnose(log.tail, "cpu-py311")
    assert found is not None and "envbuild-no-such-package" in found.message
    text = (tmp_path / "build.log").read_text()
    assert text.splitlines() == [
        "Step 16/26 : RUN apt-get install -y x",
        "",
        " ---> Running in c1aa934b5304",
        "Building dependency tree...",
        "E: Unable to locate package envbuild-no-such-package",
    ]


def test_a_megabyte_line_is_cut_in_the_error_and_kept_whole_in_the_log(tmp_path: Path) -> None:
    from envbuild.buildfail import LINE_MAX
    from envbuild.buildfail import BuildLog as _Log

    log = _Log(tmp_path / "build.log")
    huge = "shutil.Error: [" + "('/tmp/a', '/t/a', '[Errno 28] No space left on device'), " * 50_000 + "]"
    log.line("Step 5/9 : RUN pip install x")
    log.line(huge)
    log.close()
    shown = log.failure().tail[-1]
    assert len(shown) < LINE_MAX + 100 and shown.endswith(f"({len(huge)} characters, all in the log)")
    assert huge in (tmp_path / "build.log").read_text()
