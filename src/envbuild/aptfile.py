"""The OS package lock (`apt.lock`): what the image installs on top of its base, exactly.

A base pinned by digest pins only the base's own packages; `apt-get install` fetches whatever the
archive serves on the day of the build. apt.lock records, per Dockerfile stage, every package the
install brings in (dependencies included) with its version, architecture, size, URL and the
archive's sha256, plus the package list of the base it was resolved against, under the same lock
record header as the Python lockfiles. The build installs exactly these versions, checks each .deb
against its sha256 and the finished package list against the lock, and fails on a base whose own
packages differ.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

from envbuild._compat import tomllib
from envbuild.lockfile import LockRecord, RecordError, read_record

APT_FORMAT = 1
# A Debian or Ubuntu snapshot timestamp, as snapshot.debian.org and snapshot.ubuntu.com spell it.
SNAPSHOT_RE = re.compile(r"^\d{8}T\d{6}Z$")


# dpkg's installed packages, one `NAME VERSION ARCH` line each: the same command at lock time
# and in the build's check, so the two lists compare line for line.
DPKG_LIST = (
    "dpkg-query -W -f '${db:Status-Status} ${Package} ${Version} ${Architecture}\\n'"
    " | awk '$1==\"installed\" {print $2, $3, $4}' | LC_ALL=C sort"
)


APT_CACHE = "/var/cache/apt/archives"  # where apt-get puts what it downloads


def apt_lock_name(platform: str) -> str:
    return "apt.lock" if platform == "x86_64" else f"apt.{platform}.lock"


@dataclass(frozen=True, order=True)
class Deb:
    """One package as dpkg names it."""

    name: str
    version: str
    arch: str
    sha256: str = ""
    size: int = 0
    url: str = ""

    @property
    def filename(self) -> str:
        """The file name apt gives the downloaded .deb in /var/cache/apt/archives (':' quoted)."""
        return f"{self.name}_{self.version.replace(':', '%3a')}_{self.arch}.deb"

    @property
    def pin(self) -> str:
        return f"{self.name}={self.version}"

    @property
    def line(self) -> str:
        """One dpkg-query line (`${Package} ${Version} ${Architecture}`), as the build compares them."""
        return f"{self.name} {self.version} {self.arch}"


@dataclass(frozen=True)
class AptLock:
    """An apt.lock as read or about to be written."""

    record: LockRecord
    base_image: str
    snapshot: str  # the snapshot archive's timestamp the build points apt at; "" for the live archive
    base: tuple[Deb, ...]  # the base image's own packages
    stages: dict[str, tuple[Deb, ...]] = field(default_factory=dict)  # Dockerfile stage -> packages it installs

    def expected(self, stage: str) -> list[str]:
        """dpkg's package list after the stage's install: the base's, with what the stage adds or upgrades."""
        have = {d.name: d for d in self.base}
        have.update({d.name: d for d in self.stages.get(stage, ())})
        return sorted(d.line for d in have.values())

    def packages(self, stage: str) -> dict[str, str]:
        """{package: version} of the finished stage (the runtime stage is the image)."""
        have = {d.name: d.version for d in self.base}
        have.update({d.name: d.version for d in self.stages.get(stage, ())})
        return have

    @property
    def installed(self) -> dict[str, Deb]:
        """Every package apt.lock installs in some stage, by name (a stage's pick wins over the builder's)."""
        return {d.name: d for stage in sorted(self.stages) for d in self.stages[stage]}

    def sha256_list(self, stage: str) -> str:
        """sha256sum's check format for the stage's downloads in /var/cache/apt/archives."""
        return "".join(f"{d.sha256}  {APT_CACHE}/{d.filename}\n" for d in sorted(self.stages.get(stage, ())))

    @property
    def base_digest(self) -> str:
        return hashlib.sha256("\n".join(sorted(d.line for d in self.base)).encode()).hexdigest()


def from_line(line: str) -> Deb:
    """A `NAME VERSION ARCH` line (dpkg's list); ValueError for anything else."""
    parts = line.split()
    if len(parts) != 3:
        raise ValueError(f"{line!r} is not 'NAME VERSION ARCH'")
    return Deb(parts[0], parts[1], parts[2])


def resolution_of(base: tuple[Deb, ...], stages: dict[str, tuple[Deb, ...]], snapshot: str) -> str:
    """sha256 of what an apt.lock resolved to: every package of every stage with its hash, the
    base's package list and the snapshot. A hand edit to the body no longer matches it."""
    payload = {
        "base": sorted(d.line for d in base),
        "snapshot": snapshot,
        # a stage with nothing to install has no table in the file: it reads back as empty or absent
        "stages": {
            s: sorted(f"{d.line} {d.sha256} {d.size} {d.url}" for d in debs) for s, debs in stages.items() if debs
        },
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def _q(value: str) -> str:
    return json.dumps(value)  # a TOML basic string: JSON's escaping is TOML's for these characters


def text(lock: AptLock, regenerate: str) -> str:
    """The file, deterministic: header, the base, then each stage's packages by name."""
    out = [
        lock.record.header(regenerate).rstrip("\n"),
        "# OS packages installed on top of the base, with the archive's sha256 for each .deb. The build",
        "# installs exactly these and fails when the base's own package list differs from [base].",
        "",
        "[base]",
        f"image = {_q(lock.base_image)}",
        f"snapshot = {_q(lock.snapshot)}",
        f"packages-sha256 = {_q(lock.base_digest)}",
        "packages = [",
        *(f"  {_q(d.line)}," for d in sorted(lock.base)),
        "]",
    ]
    for stage in sorted(lock.stages):
        for deb in sorted(lock.stages[stage]):
            out += [
                "",
                f"[[{stage}]]",
                f"name = {_q(deb.name)}",
                f"version = {_q(deb.version)}",
                f"arch = {_q(deb.arch)}",
                f"size = {deb.size}",
                f"sha256 = {_q(deb.sha256)}",
                f"url = {_q(deb.url)}",
            ]
    return "\n".join(out) + "\n"


STAGES = ("builder", "runtime")


def parse(content: str) -> AptLock:
    """An apt.lock's text; RecordError (no header) or ValueError (a body that is not one)."""
    record = read_record(content)
    try:
        doc = tomllib.loads(content)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"not TOML: {exc}") from exc
    base = doc.get("base")
    if not isinstance(base, dict):
        raise ValueError("no [base] table")
    debs = [from_line(str(line)) for line in base.get("packages", [])]
    stages: dict[str, tuple[Deb, ...]] = {}
    for stage in STAGES:
        entries = doc.get(stage, [])
        if not isinstance(entries, list):
            raise ValueError(f"[[{stage}]] is not a list of packages")
        stages[stage] = tuple(
            Deb(str(e["name"]), str(e["version"]), str(e["arch"]), str(e["sha256"]), int(e["size"]), str(e["url"]))
            for e in entries
        )
    unknown = set(doc) - {"base", *STAGES}
    if unknown:
        raise ValueError(f"unknown table(s): {', '.join(sorted(unknown))}")
    return AptLock(record, str(base.get("image", "")), str(base.get("snapshot", "")), tuple(debs), stages)


def check(content: str, input_digest: str) -> tuple[str, str, AptLock | None]:
    """(state, why, lock): fresh, stale (other inputs, no header) or edited (a body that no longer
    matches its recorded resolution)."""
    try:
        lock = parse(content)
    except RecordError as exc:
        return "stale", str(exc), None
    except (ValueError, KeyError, TypeError) as exc:
        return "edited", f"its body is not what envbuild wrote ({exc})", None
    if lock.record.input_digest != input_digest:
        return "stale", "it was locked from other inputs (the OS packages asked for, or apt_snapshot, changed)", None
    if resolution_of(lock.base, lock.stages, lock.snapshot) != lock.record.resolution:
        return "edited", "it was edited by hand: its packages no longer match the resolution it records", None
    return "fresh", "", lock


# ---- what apt prints, read back into Debs --------------------------------------------------------

# `apt-get install -s`: "Inst NAME [OLD] (VERSION ARCHIVE [ARCH])" (the [OLD] only for an upgrade)
_INST = re.compile(r"^Inst (\S+)(?: \[[^\]]*\])? \((\S+) .*\[([^\]]+)\]\)")
# `apt-get install --print-uris`: "'URL' FILENAME SIZE SHA256:HEX" (older apt: "MD5Sum:HEX")
_URI = re.compile(r"^'([^']+)' (\S+) (\d+) (\S+)$")


def _stanzas(show: str) -> dict[tuple[str, str, str], dict[str, str]]:
    """`apt-cache show` stanzas (the archive's signed Packages index) by (package, version, arch)."""
    out: dict[tuple[str, str, str], dict[str, str]] = {}
    for block in show.split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.splitlines():
            key, sep, value = line.partition(":")
            if sep and not line.startswith(" "):
                fields[key.strip()] = value.strip()
        if {"Package", "Version", "Architecture"} <= fields.keys():
            out[(fields["Package"], fields["Version"], fields["Architecture"])] = fields
    return out


def read_simulation(output: str, uris: str, show: str) -> tuple[Deb, ...]:
    """The packages an install would unpack: names and versions from its simulation, sha256 and
    size from the archive's index (`apt-cache show`), URLs from --print-uris (whose own checksum
    column is MD5 on older apt, so it is not used)."""
    files = {}
    for line in uris.splitlines():
        m = _URI.match(line.strip())
        if m:
            files[m.group(2)] = m.group(1)
    index = _stanzas(show)
    debs = []
    for line in output.splitlines():
        m = _INST.match(line)
        if not m:
            continue
        deb = Deb(m.group(1), m.group(2), m.group(3))
        # an Architecture: all package is listed under the machine's arch by the simulation
        entry = index.get((deb.name, deb.version, deb.arch)) or index.get((deb.name, deb.version, "all"))
        if entry is None or not entry.get("SHA256"):
            raise ValueError(f"the archive's index has no sha256 for {deb.pin} ({deb.arch})")
        arch = entry["Architecture"]
        filename = Deb(deb.name, deb.version, arch).filename
        url = files.get(filename, "")
        if not url:
            raise ValueError(f"apt listed no download for {deb.pin} ({filename})")
        debs.append(Deb(deb.name, deb.version, arch, entry["SHA256"].lower(), int(entry.get("Size", "0")), url))
    return tuple(sorted(debs))


_SOURCES_SAVED = "/opt/envbuild/apt/sources.tar"  # removed in the same step: in no layer


def snapshot_undo_script(timestamp: str) -> str:
    """Shell that puts apt's sources back as the base had them once the pinned packages are in: an
    image built FROM this one otherwise installed from the dated archive, without the security
    updates published since and with apt's Valid-Until check off. "" without a snapshot."""
    if not timestamp:
        return ""
    return f"tar -xPpf {_SOURCES_SAVED} && rm -f {_SOURCES_SAVED} /etc/apt/apt.conf.d/99envbuild-snapshot"


def snapshot_script(timestamp: str) -> str:
    """Shell that points apt at the dated snapshot archive (Debian's or Ubuntu's) instead of the live
    one, in both sources formats; the snapshot's Release files are past their Valid-Until by design."""
    if not timestamp:
        return "true"
    deb = f"http://snapshot.debian.org/archive/debian/{timestamp}"
    sec = f"http://snapshot.debian.org/archive/debian-security/{timestamp}"
    ubu = f"http://snapshot.ubuntu.com/ubuntu/{timestamp}"
    return (
        # saved for snapshot_undo_script; the folder made here too, as `lock` runs this in a bare base
        f"mkdir -p {_SOURCES_SAVED.rsplit('/', 1)[0]} && "
        f"tar -cPf {_SOURCES_SAVED} /etc/apt/sources.list.d $(ls -d /etc/apt/sources.list 2>/dev/null); "
        'for f in /etc/apt/sources.list /etc/apt/sources.list.d/*; do [ -f "$f" ] && sed -i -E'
        f" -e 's#https?://(deb|security)\\.debian\\.org/debian-security/?#{sec}/#g'"
        f" -e 's#https?://deb\\.debian\\.org/debian/?#{deb}/#g'"
        f" -e 's#https?://(archive|security|[a-z]+\\.archive)\\.ubuntu\\.com/ubuntu/?#{ubu}/#g' \"$f\"; done; "
        "echo 'Acquire::Check-Valid-Until \"false\";' > /etc/apt/apt.conf.d/99envbuild-snapshot"
    )


def template_context(apt: AptLock | None) -> dict[str, Any] | None:
    """What the Dockerfile needs of apt.lock: the pins of each stage, and how to list and fetch."""
    if apt is None:
        return None
    return {
        "apt_pins": {stage: [d.pin for d in sorted(debs)] for stage, debs in apt.stages.items()},
        "apt_snapshot_sh": snapshot_script(apt.snapshot),
        "apt_snapshot_undo_sh": snapshot_undo_script(apt.snapshot),
        "apt_dpkg_list": DPKG_LIST,
    }
