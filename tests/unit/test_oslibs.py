"""The integrity check's hold on the OS libraries the environment loads: a patched libstdc++ passed
every check (the manifest covers the venv and the standard library only). A dpkg database in a
folder of the test's own, and the libraries it lists."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from envbuild.smoke.inside import oslibs
from envbuild.smoke.inside.manifest import dpkg_records


@pytest.fixture
def dpkg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    info, lib, venv = tmp_path / "info", tmp_path / "lib", tmp_path / "venv"
    for folder in (info, lib, venv):
        folder.mkdir()
    files = {"cxx": lib / "libstdc++.so.6.0.30", "z": lib / "libz.so.1.2.13", "own": lib / "libcuda.so.1"}
    files["torch"] = venv / "libtorch_cpu.so"  # the environment's own: the manifest covers it
    for path in files.values():
        path.write_bytes(path.name.encode())
    for package, path in (("libstdc++6:amd64", files["cxx"]), ("zlib1g:amd64", files["z"])):
        (info / f"{package}.list").write_text(f"/.\n{path.parent}\n{path}\n")
        md5 = hashlib.md5(path.read_bytes(), usedforsecurity=False).hexdigest()
        (info / f"{package}.md5sums").write_text(f"{md5}  {str(path).lstrip('/')}\n")
    monkeypatch.setattr(oslibs, "mapped_files", lambda: {str(p) for p in files.values()} | {"/memfd:x (deleted)"})
    monkeypatch.setattr(oslibs, "_mounted", set)
    return {"info": info, "venv": venv, **files}


VERSIONS = {"libstdc++6": "12.2.0-14", "zlib1g": "1:1.2.13.dfsg-1"}


def _check(
    dpkg: dict[str, Path], manifest: dict[str, Any], now: dict[str, str] = VERSIONS
) -> tuple[list[str], dict[str, Any]]:
    facts: dict[str, Any] = {}
    return oslibs.problems(manifest, [str(dpkg["venv"])], now, facts, info=str(dpkg["info"])), facts


def _built(dpkg: dict[str, Path]) -> dict[str, Any]:
    return {"os_packages": dict(VERSIONS), "dpkg_records": dpkg_records(str(dpkg["info"]))}


def test_the_libraries_as_built_pass_and_one_no_package_owns_is_listed(dpkg: dict[str, Path]) -> None:
    found, facts = _check(dpkg, _built(dpkg))
    assert found == []
    assert facts == {"os_libraries_checked": 2, "os_libraries_no_package_owns": [str(dpkg["own"])]}


def test_a_patched_library_is_named_with_its_package(dpkg: dict[str, Path]) -> None:
    built = _built(dpkg)
    with dpkg["cxx"].open("ab") as fh:
        fh.write(b"\0")
    found, _ = _check(dpkg, built)
    assert found == [f"OS libraries loaded here differ from their package's files: {dpkg['cxx']} (libstdc++6)"]
    # an image from before the build recorded dpkg's state is held to dpkg's record alone: the same
    assert _check(dpkg, {"os_packages": built["os_packages"]})[0] == found


def _rewrite_record(dpkg: dict[str, Path]) -> None:
    md5 = hashlib.md5(dpkg["cxx"].read_bytes(), usedforsecurity=False).hexdigest()
    (dpkg["info"] / "libstdc++6:amd64.md5sums").write_text(f"{md5}  {str(dpkg['cxx']).lstrip('/')}\n")


def test_a_library_patched_with_its_dpkg_record_is_caught_by_the_builds_record(dpkg: dict[str, Path]) -> None:
    built = _built(dpkg)
    dpkg["cxx"].write_bytes(b"patched")
    _rewrite_record(dpkg)
    found, _ = _check(dpkg, built)
    assert found == ["dpkg's record of the files of 1 OS package(s) changed, their versions did not: libstdc++6:amd64"]


def test_an_apt_upgrade_in_a_derived_image_moves_the_record_with_the_version_and_passes(dpkg: dict[str, Path]) -> None:
    built = _built(dpkg)
    dpkg["cxx"].write_bytes(b"the next upload")
    _rewrite_record(dpkg)
    found, facts = _check(dpkg, built, {**VERSIONS, "libstdc++6": "12.2.0-14+deb12u1"})
    assert found == [] and facts["os_libraries_checked"] == 2


def test_a_library_mounted_at_run_time_is_the_hosts_and_not_held_to_the_image(
    dpkg: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # the NVIDIA container toolkit mounts the host's driver libraries, over a package's file or not
    built = _built(dpkg)
    dpkg["z"].write_bytes(b"the host's")
    monkeypatch.setattr(oslibs, "_mounted", lambda: {str(dpkg["z"])})
    found, facts = _check(dpkg, built)
    assert found == [] and facts["os_libraries_checked"] == 1
    monkeypatch.setattr(oslibs, "_mounted", lambda: {str(dpkg["z"].parent)})  # a folder `-v` mounted
    assert _check(dpkg, built)[0] == []


def test_without_dpkg_nothing_is_held_and_the_report_says_so(dpkg: dict[str, Path], tmp_path: Path) -> None:
    facts: dict[str, Any] = {}
    assert oslibs.problems({}, [], {}, facts, info=str(tmp_path / "no-dpkg")) == []
    assert facts == {"os_libraries": "no dpkg here: the OS's libraries are not checked"}


def test_merged_usr_paths_are_one_file() -> None:
    # dpkg lists zlib1g's library under /lib, the loader maps it from /usr/lib (bookworm)
    assert oslibs._key("/usr/lib/x86_64-linux-gnu/libz.so.1") == oslibs._key("/lib/x86_64-linux-gnu/libz.so.1")
