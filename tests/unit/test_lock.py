"""Lock stage without a network: lockfile parsing, verification rules, --check, atomic writes."""

from __future__ import annotations

import errno
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from envbuild import freshness, fsutil, lock, lockfile, lockverify, profile, torchsource, uvtool, validate
from envbuild import plan as plan_mod
from envbuild.errors import LockError, WriteFailed
from envbuild.lockfile import Pin
from envbuild.project import open_project

from ..conftest import REPO, Result

SAMPLE = """\
# DO NOT EDIT
einops==0.8.1 \\
    --hash=sha256:aaa \\
    --hash=sha256:bbb
    # via -r requirements.in
    # from https://pypi.org/simple
torch==2.13.0+cpu \\
    --hash=sha256:ccc
    # from file:///opt/wheels
"""


def test_parse_requirements_keeps_hashes_and_sources() -> None:
    pins = lockfile.parse_requirements(SAMPLE)
    assert pins["einops"].hashes == ["sha256:aaa", "sha256:bbb"]
    assert pins["torch"].local == "cpu" and pins["torch"].source == "file:///opt/wheels"


def _prof(name: str) -> profile.Profile:
    return validate.load_valid(REPO / "profiles" / f"{name}.yaml")


def _pins(*specs: tuple[str, str, str]) -> dict[str, Pin]:
    return {n: Pin(n, v, ["sha256:x"], s) for n, v, s in specs}


PYPI = "https://pypi.org/simple"


def test_verify_accepts_the_right_cuda_build() -> None:
    prof = _prof("cu121-py311")
    pins = _pins(
        ("torch", "2.3.1", PYPI),
        ("nvidia-cuda-runtime-cu12", "12.1.105", PYPI),
        ("numpy", "1.26.4", PYPI),
        ("torchvision", "0.18.1", PYPI),
    )
    lockverify.verify(prof, pins, torchsource.torch_source(prof), "x86_64")


def test_verify_rejects_wrong_cuda_runtime_naming_both() -> None:
    prof = _prof("cu124-py312")
    pins = _pins(
        ("torch", "2.6.0", PYPI),
        ("nvidia-cuda-runtime-cu12", "12.1.105", PYPI),
        ("numpy", "2.2.6", PYPI),
        ("torchvision", "0.21.0", PYPI),
    )
    with pytest.raises(LockError) as err:
        lockverify.verify(prof, pins, torchsource.torch_source(prof), "x86_64")
    assert "expected a CUDA 12.4 build (+cu124)" in str(err.value)
    assert "nvidia-cuda-runtime-cu12 12.1.105 (CUDA 12.1)" in str(err.value)


def test_verify_rejects_numpy_and_torchvision_drift() -> None:
    prof = _prof("cu121-py311")
    pins = _pins(
        ("torch", "2.3.1", PYPI),
        ("nvidia-cuda-runtime-cu12", "12.1.105", PYPI),
        ("numpy", "2.0.0", PYPI),
        ("torchvision", "0.18.0", PYPI),
    )
    with pytest.raises(LockError) as err:
        lockverify.verify(prof, pins, torchsource.torch_source(prof), "x86_64")
    assert "numpy: expected 1.26.4, the resolver chose 2.0.0" in str(err.value)
    assert "torchvision: expected 0.18.1, the resolver chose 0.18.0" in str(err.value)


def test_verify_rejects_cuda_torch_for_cpu_profile() -> None:
    prof = _prof("cpu-py311")
    src = torchsource.torch_source(prof, find_links=("/opt/wheels",))
    pins = _pins(("torch", "2.13.0", PYPI), ("nvidia-cuda-runtime", "13.0.96", PYPI), ("numpy", "2.1.3", PYPI))
    with pytest.raises(LockError, match="expected the CPU build"):
        lockverify.verify(prof, pins, src, "x86_64")


def test_verify_rejects_dependency_confusion() -> None:
    prof = _prof("cu118-py310")
    src = torchsource.torch_source(prof)
    idx = "https://download.pytorch.org/whl/cu118"
    pins = _pins(
        ("torch", "2.7.1+cu118", idx),
        ("torchvision", "0.22.1+cu118", idx),
        ("numpy", "2.2.6", idx),
        ("nvidia-cuda-runtime-cu11", "11.8.89", idx),
    )
    with pytest.raises(LockError, match="numpy: came from the PyTorch index"):
        lockverify.verify(prof, pins, src, "x86_64")
    pins["numpy"] = Pin("numpy", "2.2.6", [], PYPI)
    pins["torch"] = Pin("torch", "2.7.1+cu118", [], PYPI)
    with pytest.raises(LockError, match=r"torch: came from https://pypi\.org/simple, not from the PyTorch index"):
        lockverify.verify(prof, pins, src, "x86_64")


def test_a_torchvision_a_package_pulls_in_from_pypi_is_refused_with_the_profile_fix() -> None:
    """timm on cpu-py311: uv takes a dependency's torchvision from PyPI (a CUDA build, which fails on
    import beside torch +cpu) whatever index torch came from. The fix is the profile's own field."""
    prof = _prof("cpu-py311")
    idx = "https://download.pytorch.org/whl/cpu"
    pins = _pins(("torch", "2.13.0+cpu", idx), ("numpy", "2.1.3", PYPI), ("timm", "1.0.15", PYPI))
    pins["torchvision"] = Pin("torchvision", "0.28.0", [], PYPI)
    with pytest.raises(LockError) as err:
        lockverify.verify(prof, pins, torchsource.torch_source(prof), "x86_64")
    assert "torchvision: came from https://pypi.org/simple, not from the PyTorch index" in str(err.value)
    assert err.value.hint is not None and "add `torchvision: auto` to the profile" in err.value.hint
    # asked for by the profile, and from the index, it is the build that pairs with torch
    pins["torchvision"] = Pin("torchvision", "0.28.0+cpu", [], idx)
    lockverify.verify(prof.model_copy(update={"torchvision": "auto"}), pins, torchsource.torch_source(prof), "x86_64")


@pytest.fixture
def locked_project(project: Path) -> Path:
    shutil.copytree(REPO / "lockfiles", project / "lockfiles")
    return project


def test_check_fresh_stale_missing(cli: Callable[..., Result], locked_project: Path) -> None:
    res = cli("lock", "--check", "cu121-py311", "cpu-py311", "--project", str(locked_project))
    assert res.code == 0, res.err
    prof_path = locked_project / "profiles" / "cu121-py311.yaml"
    prof_path.write_text(prof_path.read_text().replace('"1.26.4"', '"1.26.3"'))
    shutil.rmtree(locked_project / "lockfiles" / "cpu-py311")
    res = cli("lock", "--check", "cu121-py311", "cpu-py311", "--project", str(locked_project))
    assert res.code == 1
    assert (
        "cu121-py311: lockfiles/cu121-py311/requirements.lock was locked from other inputs (the profile changed); "
        "run `envbuild lock cu121-py311`"
    ) in (res.err)
    assert "cpu-py311: lockfiles/cpu-py311/requirements.lock is missing; run `envbuild lock cpu-py311`" in res.err


def _variant_of_cpu_py311(root: Path, follows: str) -> None:
    """cpu-py311-extra (`extends: cpu-py311`, nothing added) locked to cpu-py311's very lockfiles,
    its records recording `follows`, as a lock of the variant would write them."""
    (root / "profiles" / "cpu-py311-extra.yaml").write_text("name: cpu-py311-extra\nextends: cpu-py311\n")
    proj = open_project(str(root))
    plan = plan_mod.make(proj, validate.load_valid(proj.profile_path("cpu-py311-extra"), root=root), strict=False)
    (root / "lockfiles" / "cpu-py311-extra").mkdir()
    for name in ("requirements.lock", "pylock.toml"):
        text = (root / "lockfiles" / "cpu-py311" / name).read_text()
        old = lockfile.read_record(text)
        new = old.model_copy(update={"profile": plan.name, "input_digest": plan.input_digest, "follows": follows})
        (root / "lockfiles" / "cpu-py311-extra" / name).write_text(
            new.header(f"envbuild lock {plan.name} --upgrade") + lockfile.body(text)
        )


def test_a_variant_is_stale_once_the_profile_it_extends_is_re_locked(
    cli: Callable[..., Result], locked_project: Path
) -> None:
    """A re-lock of cpu-py311 (a torch patch release, a security bump) left a variant of it on the
    old versions with `lock --check` and `status` saying "fresh": its image no longer shared the
    parent's layers, and it ran other versions than the profile it says it extends."""
    parent = lockfile.read_record((locked_project / "lockfiles" / "cpu-py311" / "requirements.lock").read_text())
    _variant_of_cpu_py311(locked_project, f"cpu-py311@{parent.resolution}")
    res = cli("lock", "--check", "cpu-py311-extra", "--project", str(locked_project))
    assert res.code == 0, res.err
    header = (locked_project / "lockfiles" / "cpu-py311-extra" / "requirements.lock").read_text()
    assert f'"follows": "cpu-py311@{parent.resolution}"' in header
    assert '"follows"' not in (locked_project / "lockfiles" / "cpu-py311" / "requirements.lock").read_text()

    shutil.rmtree(locked_project / "lockfiles" / "cpu-py311-extra")
    _variant_of_cpu_py311(locked_project, "cpu-py311@" + "f" * 64)  # kept the pins of an older lock of it
    res = cli("lock", "--check", "cpu-py311-extra", "--project", str(locked_project))
    assert res.code == 1
    assert (
        "cpu-py311-extra: lockfiles/cpu-py311-extra/requirements.lock kept the versions of an older lock of "
        "cpu-py311, which it extends (cpu-py311 was re-locked since); run `envbuild lock cpu-py311-extra`"
    ) in res.err
    res = cli("status", "cpu-py311-extra", "--json", "--project", str(locked_project))
    [row] = json.loads(res.out)["profiles"]
    assert (row["lockfile"], row["next"]) == ("stale", "envbuild lock cpu-py311-extra")
    res = cli("status", "cpu-py311-extra", "--project", str(locked_project))
    assert "cpu-py311-extra: lockfiles/cpu-py311-extra/requirements.lock kept the versions of an older lock" in res.err

    shutil.rmtree(locked_project / "lockfiles" / "cpu-py311-extra")
    _variant_of_cpu_py311(locked_project, "")  # locked before its parent was
    res = cli("lock", "--check", "cpu-py311-extra", "--project", str(locked_project))
    assert res.code == 1
    assert "was locked before cpu-py311, which it extends, was: it does not share cpu-py311's versions" in res.err
    shutil.rmtree(locked_project / "lockfiles" / "cpu-py311")  # nothing to follow: its lockfile stands alone
    res = cli("lock", "--check", "cpu-py311-extra", "--project", str(locked_project))
    assert res.code == 0, res.err


def test_a_merged_pair_of_re_locks_is_read_by_its_first_side_and_named_as_a_merge(
    cli: Callable[..., Result], locked_project: Path
) -> None:
    """Two branches re-locked, and git left its markers (here with diff3's base). uv, seeded with the
    old lockfile, failed on them ("Unexpected '<'") in a file name the user never saw; `status`
    blamed a changed profile."""
    lockf = locked_project / "lockfiles" / "cpu-py311" / "requirements.lock"
    ours = lockf.read_text()
    theirs = ours.replace("einops==0.8.1", "einops==0.8.0")
    at = ours.index("einops==0.8.1")
    merged = (
        ours[:at] + "<<<<<<< HEAD\n" + ours[at:].split("\n", 1)[0] + "\n||||||| base\nold line\n=======\n"
        + theirs[at:].split("\n", 1)[0] + "\n>>>>>>> other\n" + ours[at:].split("\n", 1)[1]
    )  # fmt: skip
    assert lockfile.conflicted(merged) and not lockfile.conflicted(ours)
    assert lockfile.first_side(merged) == ours
    lockf.write_text(merged)
    res = cli("lock", "--check", "cpu-py311", "--project", str(locked_project))
    assert res.code == 1
    assert "lockfiles/cpu-py311/requirements.lock has a merge's conflict markers (two re-locks merged)" in res.err


def test_a_lockfile_an_editor_saved_in_latin_1_or_with_a_bom_is_named_so_and_its_re_lock_keeps_its_pins(
    cli: Callable[..., Result], locked_project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An editor saved a hand-added comment in Latin-1. `lock --check` said "cannot be read ('utf-8'
    codec can't decode byte 0xe9 in position 21808: ...)", and the re-lock it gave as the fix
    stopped with "internal error: UnicodeDecodeError", exit 70."""
    lockf = locked_project / "lockfiles" / "cpu-py311" / "requirements.lock"
    text = lockf.read_text()
    lockf.write_bytes(text.encode() + "# café: checked by hand\n".encode("latin-1"))
    res = cli("lock", "--check", "cpu-py311", "--project", str(locked_project))
    assert res.code == 1
    line = text.count("\n") + 1
    assert f"lockfiles/cpu-py311/requirements.lock:{line}: not UTF-8 text (byte 0xe9) (column 6)" in res.err
    pylock = (lockf.parent / "pylock.toml").read_text()
    seeds: list[str] = []

    def resolve(args: list[str], **_: object) -> str:
        out = Path(args[args.index("-o") + 1])
        if out.suffix == ".toml":
            out.write_text(lockfile.body(pylock), encoding="utf-8")
            return ""
        seeds.append(out.read_text("utf-8"))  # the pins uv is asked to keep
        out.write_text(lockfile.body(text), encoding="utf-8")  # and uv keeps them
        return ""

    monkeypatch.setattr(uvtool, "run", resolve)
    res = cli("lock", "cpu-py311", "--no-apt", "--project", str(locked_project))
    assert res.code == 0, res.err
    assert seeds and lockfile.parse_requirements(seeds[0]) == lockfile.parse_requirements(text)
    assert lockfile.body(lockf.read_text()) == lockfile.body(text)  # the pins before the edit, in UTF-8
    # saved as UTF-8 with a byte-order mark: named as such, not as an unpinned "line 1"
    lockf.write_bytes(b"\xef\xbb\xbf" + lockf.read_bytes())
    res = cli("lock", "--check", "cpu-py311", "--project", str(locked_project))
    assert res.code == 1 and "requirements.lock starts with a byte-order mark (U+FEFF)" in res.err
    lockf.write_bytes(lockf.read_bytes()[3:])
    assert lockfile.body((lockf.parent / "pylock.toml").read_text()) == lockfile.body(pylock)
    res = cli("lock", "--check", "cpu-py311", "--project", str(locked_project))
    assert res.code == 0, res.err


@pytest.mark.parametrize(
    "stray",
    [
        "evil @ https://files.example/evil-1.0-py3-none-any.whl \\\n    --hash=sha256:" + "a" * 64,
        "-r /tmp/more.txt",
        "--extra-index-url https://mirror.example/simple",
        "requests>=2",
    ],
)
def test_a_line_pip_would_install_but_the_pins_pass_over_is_an_edit(
    cli: Callable[..., Result], locked_project: Path, stray: str
) -> None:
    """Put just below the header, before any pin, such a line changed no pin's hashes, so the
    lockfile stayed fresh, and a CI job that installs it with pip would install it."""
    lockf = locked_project / "lockfiles" / "cpu-py311" / "requirements.lock"
    lines = lockf.read_text().split("\n")
    at = next(i for i, line in enumerate(lines) if line.startswith(lockfile.RECORD_PREFIX)) + 1
    lockf.write_text("\n".join([*lines[:at], stray, *lines[at:]]))
    res = cli("lock", "--check", "cpu-py311", "--project", str(locked_project))
    assert res.code == 1
    assert f"(line {at + 1} is not a pinned requirement: {stray.splitlines()[0][:40]}" in res.err
    # what the re-lock gives uv back as the pins to keep: the pins alone (uv read `-r FILE`, and failed)
    kept = lockfile.preferences(lockf.read_text())
    assert lockfile.stray_line(kept) is None and "einops==0.8.1\n" in kept and "evil" not in kept


def test_check_ignores_env_only_changes(cli: Callable[..., Result], locked_project: Path) -> None:
    prof_path = locked_project / "profiles" / "cu121-py311.yaml"
    prof_path.write_text(prof_path.read_text().replace('OMP_NUM_THREADS: "8"', 'OMP_NUM_THREADS: "16"'))
    assert cli("lock", "--check", "cu121-py311", "--project", str(locked_project)).code == 0


def test_check_detects_half_written_pair(cli: Callable[..., Result], locked_project: Path) -> None:
    pylock = locked_project / "lockfiles" / "cu121-py311" / "pylock.toml"
    text = pylock.read_text()
    record = lockfile.read_record(text)
    pylock.write_text(text.replace(record.resolution, "0" * 64))
    res = cli("lock", "--check", "cu121-py311", "--json", "--project", str(locked_project))
    assert res.code == 1
    assert "disagree" in json.loads(res.out)["stale"][0]["reason"]


def test_fresh_lock_is_skipped_without_resolving(
    cli: Callable[..., Result], locked_project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def boom(*_: object, **__: object) -> str:
        raise AssertionError("resolver must not run for a fresh lock")

    monkeypatch.setattr(uvtool, "run", boom)
    res = cli("lock", "cu121-py311", "--json", "--project", str(locked_project))
    assert res.code == 0 and json.loads(res.out)[0]["state"] == "fresh"


def test_a_changed_apt_list_relocks_the_os_packages_without_asking_the_index(
    cli: Callable[..., Result], engineless_project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """apt.lock out of date and the Python lockfiles fresh: only the OS packages are locked again.
    `lock` used to resolve the Python packages too, and failed when the PyTorch index was down (it
    was, here, when a new runtime package made every apt.lock stale)."""

    def boom(*_: object, **__: object) -> str:
        raise AssertionError("the Python resolver must not run for an apt-only change")

    monkeypatch.setattr(uvtool, "run", boom)
    path = engineless_project / "profiles" / "cpu-py311.yaml"
    path.write_text(path.read_text() + 'apt: ["less"]\n')
    res = cli("lock", "cpu-py311", "--json")
    assert res.code == 0, res.err
    [outcome] = json.loads(res.out)
    assert outcome["state"] == "fresh" and "Python lockfiles up to date" in outcome["message"]
    # no engine here: apt.lock stays as it was, and lock says why and how to fix it
    assert "apt.lock not written" in res.err and "start" in res.err
    assert "cpu-py311: resolving OS packages on" in res.err  # progress on stderr, --json or not


def test_resolver_failure_keeps_previous_lockfiles(
    cli: Callable[..., Result], locked_project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = (locked_project / "lockfiles" / "cu121-py311" / "requirements.lock").read_bytes()

    def fail(*_: object, **__: object) -> str:
        raise LockError("uv failed:\n  x No solution found when resolving dependencies")

    monkeypatch.setattr(uvtool, "run", fail)
    res = cli("lock", "cu121-py311", "--upgrade", "--project", str(locked_project))
    assert res.code == 4 and "No solution found" in res.err
    assert (locked_project / "lockfiles" / "cu121-py311" / "requirements.lock").read_bytes() == before


def test_atomic_write_many_leaves_old_file_on_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "requirements.lock"
    target.write_text("old\n")
    calls = []

    def fail_replace(src: str, dst: str, **_: object) -> None:
        calls.append(dst)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", fail_replace)
    with pytest.raises(WriteFailed) as failed:
        fsutil.atomic_write_many({target: "new\n"})
    assert str(failed.value) == (
        f"cannot write {target}: No space left on device\n"
        f"  fix: free some space on the filesystem that holds {tmp_path} (nothing was half-written)"
    )
    assert target.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["requirements.lock"]


def test_require_fresh_names_the_command(locked_project: Path) -> None:
    from envbuild.errors import LockMissing

    proj = open_project(str(locked_project))
    shutil.rmtree(locked_project / "lockfiles" / "cu121-py311")
    with pytest.raises(LockMissing) as err:
        freshness.require_fresh(proj, plan_mod.make(proj, _prof("cu121-py311")))
    assert "run `envbuild lock cu121-py311`" in str(err.value)


def test_committed_lockfiles_are_fresh() -> None:
    stale = lock.check(
        open_project(str(REPO)),
        ["cpu-py311", "cu121-py311", "cu124-py312", "cu126-py312", "cu128-py313", "cu130-py313"],
    )
    assert stale == []


def test_committed_lockfiles_hash_every_artifact() -> None:
    for path in (REPO / "lockfiles").glob("*/requirements.lock"):
        pins = lockfile.parse_requirements(path.read_text())
        assert pins, path
        assert all(p.hashes for p in pins.values()), path
        assert all(p.source for p in pins.values()), path


def _resolution(**versions: str) -> dict[str, Pin]:
    return {n: Pin(n, v.split("#")[0], [f"sha256:{v}"]) for n, v in versions.items()}


def test_relock_changes_name_moves_additions_removals_and_rehashes() -> None:
    before = {"x86_64": _resolution(numpy="2.1.3", einops="0.8.1", torch="2.5.0", filelock="3.12.0")}
    after = {"x86_64": _resolution(numpy="2.1.2", tqdm="4.67.1", torch="2.5.1", filelock="3.12.0#rebuilt")}
    got = [c.render() for c in lockfile.changes(before, after)]
    assert got == [
        "- einops 0.8.1",
        "! filelock 3.12.0: same version, different hashes",
        "  numpy 2.1.3 -> 2.1.2 (downgrade)",
        "  torch 2.5.0 -> 2.5.1",
        "+ tqdm 4.67.1",
    ]
    assert lockfile.changes(before, before) == []


def test_a_change_on_every_platform_is_said_once_and_one_on_some_names_them() -> None:
    before = {"x86_64": _resolution(numpy="2.1.2", triton="3.1.0"), "aarch64": _resolution(numpy="2.1.2")}
    after = {"x86_64": _resolution(numpy="2.1.3", triton="3.2.0"), "aarch64": _resolution(numpy="2.1.3")}
    assert [(c.name, c.platforms, c.kind) for c in lockfile.changes(before, after)] == [
        ("numpy", (), "upgraded"),
        ("triton", ("x86_64",), "upgraded"),
    ]


def test_conda_versions_that_are_not_pep440_still_report_a_change() -> None:
    change = lockfile.Change("openssl", "1.1.1v", "1.1.1w")
    assert change.kind == "changed"
    assert change.render() == "  openssl 1.1.1v -> 1.1.1w"


def test_check_and_dry_run_together_is_a_usage_error(cli: Callable[..., Result], locked_project: Path) -> None:
    res = cli("lock", "--check", "--dry-run", "--all", "--project", str(locked_project))
    assert res.code == 2
    assert "--check and --dry-run do not go together" in res.err


def test_the_pylock_pass_reads_local_wheels_hashes_from_a_page_not_the_files(tmp_path: Path) -> None:
    """A local wheelhouse is listed on a page with the sha256 the resolve recorded, so uv does not
    hash the files again; a pin that matches two files of the folder keeps the folder itself."""
    from envbuild import venvlock

    house = tmp_path / "wheels"
    house.mkdir()
    wheel = house / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
    wheel.write_bytes(b"not read")
    import dataclasses

    prof = _prof("cpu-py311")
    plan = dataclasses.replace(
        plan_mod.for_profile(prof), source=torchsource.torch_source(prof, find_links=(str(house),))
    )
    assert plan.source.torch_index == house.resolve().as_uri()  # the wheelhouse is the torch index too
    pins = {"torch": Pin("torch", "2.13.0+cpu", ["sha256:" + "a" * 64], house.resolve().as_uri())}
    src = venvlock._pylock_source(plan, pins, tmp_path)
    page = Path(src.find_links[-1].removeprefix("file://"))
    assert src.find_links == (page.as_uri(),) and src.torch_index == page.as_uri()
    assert f'href="{wheel.as_uri()}#sha256={"a" * 64}"' in page.read_text(encoding="utf-8")
    (house / "torch-2.13.0+cpu-cp312-cp312-manylinux_2_28_x86_64.whl").write_bytes(b"")
    assert venvlock._pylock_source(plan, pins, tmp_path) == plan.source


def test_the_wheelhouse_that_holds_torch_stands_in_for_the_index_wherever_it_is_listed(tmp_path: Path) -> None:
    """A folder of the team's own sdists listed before the torch wheelhouse made the lock look for
    torch in it ("no package torch"): the wheelhouse with a torch wheel is the one now, else the first."""
    own, house = tmp_path / "own", tmp_path / "house"
    own.mkdir()
    house.mkdir()
    (own / "mypkg-1.0.tar.gz").write_bytes(b"")
    (house / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"")
    prof = _prof("cpu-py311")
    src = torchsource.torch_source(prof, find_links=(str(own), str(house)))
    assert (src.torch_index, src.torch_index_flat) == (house.resolve().as_uri(), True)
    assert src.find_links == (str(own), str(house))  # both still read
    src = torchsource.torch_source(prof, find_links=(str(own), "https://example.test/wheels/"))
    assert src.torch_index == own.resolve().as_uri()  # none holds torch (a URL is not looked into)


def _family(root: Path) -> None:
    (root / "profiles").mkdir(parents=True)
    for name, parent in [("cpu-py311", "_base"), ("cpu-py311-a", "cpu-py311"), ("cpu-py311-b", "cpu-py311-a")]:
        (root / "profiles" / f"{name}.yaml").write_text(f"name: {name}\nextends: {parent}\n")
    (root / "profiles" / "_base.yaml").write_text("accelerator: cpu\n")
    (root / "profiles" / "cu121-py311.yaml").write_text("name: cu121-py311\n")


def test_a_profile_is_locked_after_the_profiles_it_extends_that_the_same_run_locks(tmp_path: Path) -> None:
    _family(tmp_path)
    proj = open_project(str(tmp_path))
    assert lock._waves(proj, ["cpu-py311-b", "cu121-py311", "cpu-py311-a", "cpu-py311"]) == [
        ["cu121-py311", "cpu-py311"],
        ["cpu-py311-a"],
        ["cpu-py311-b"],
    ]
    assert lock._waves(proj, ["cpu-py311-b", "cpu-py311"]) == [["cpu-py311"], ["cpu-py311-b"]]  # a grandparent too
    assert lock._waves(proj, ["cpu-py311-b", "nothing-here"]) == [["cpu-py311-b", "nothing-here"]]


def _locked(profile_name: str, body: str) -> str:
    """A lockfile as envbuild writes it: the header with its lock record, then `body`."""
    record = lockfile.new_record(
        profile=profile_name,
        python="3.11",
        platform="x86_64",
        build="cpu",
        route="index",
        index="https://download.pytorch.org/whl/cpu",
        input_digest="0" * 64,
        resolution=lockfile.resolution_id(lockfile.parse_requirements(body)),
    )
    return record.header(f"envbuild lock {profile_name} --upgrade") + body


def test_a_variant_keeps_the_pins_of_the_nearest_locked_profile_it_extends(tmp_path: Path) -> None:
    from envbuild import venvlock

    _family(tmp_path)
    proj = open_project(str(tmp_path))
    prof = profile.Profile.model_validate(
        {"name": "cpu-py311-b", "accelerator": "cpu", "python": "3.11", "torch": "2.13.0", "numpy": "2.1.3"}
    )
    plan = plan_mod.for_profile(prof)
    lockdir = tmp_path / "lockfiles"
    own = lockdir / "cpu-py311-b" / "requirements.lock"
    assert venvlock._pins_to_keep(proj, plan, own) == (None, "")  # nothing locked: its own pins, if any
    for name in ("cpu-py311", "cpu-py311-a"):
        (lockdir / name).mkdir(parents=True)
        (lockdir / name / "requirements.lock").write_text(_locked(name, SAMPLE))
    res = lockfile.resolution_id(lockfile.parse_requirements(SAMPLE))
    nearest = (lockdir / "cpu-py311-a" / "requirements.lock", f"cpu-py311-a@{res}")
    assert venvlock._pins_to_keep(proj, plan, own) == nearest
    (lockdir / "cpu-py311-b").mkdir()
    own.write_text(_locked("cpu-py311-b", SAMPLE))
    assert venvlock._pins_to_keep(proj, plan, own) == nearest  # its own lockfile too: the parent's pins still win
    (lockdir / "cpu-py311-a" / "requirements.lock").write_text(SAMPLE)  # no record: not envbuild's lock
    assert venvlock._pins_to_keep(proj, plan, own) == (None, "")


def test_a_variants_relock_prefers_its_parents_pins_and_keeps_its_own_for_the_rest() -> None:
    own = _locked("cpu-py311-b", SAMPLE + "tqdm==4.67.1 \\\n    --hash=sha256:ddd\n")
    parent = _locked("cpu-py311", SAMPLE.replace("einops==0.8.1", "einops==0.8.0"))
    kept = lockfile.preferences(own, parent)
    assert {p.name: p.version for p in lockfile.parse_requirements(kept).values()} == {
        "einops": "0.8.0",  # the parent's, re-locked since
        "torch": "2.13.0+cpu",
        "tqdm": "4.67.1",  # the variant's own package
    }
    assert "DO NOT EDIT" not in kept and "--hash=sha256:ddd" in kept
    assert lockfile.preferences(own) == own  # no parent: the lockfile as it is, for uv to read back


def test_a_copy_that_runs_out_of_room_names_the_file_it_was_writing(tmp_path: Path) -> None:
    # shutil's copy names the file it read first and the one it wrote second: a venv on a full
    # data disk was told to free space where the wheel cache lies, another disk
    source, written = tmp_path / "cache" / "torch.whl", tmp_path / "data" / "torch.whl"
    exc = OSError(errno.ENOSPC, "No space left on device", str(source), None, str(written))
    assert str(fsutil.file_error(exc)) == (
        f"cannot write {written}: No space left on device\n"
        f"  fix: free some space on the filesystem that holds {written.parent} (nothing was half-written)"
    )


def test_a_read_only_filesystem_is_named_as_such_not_as_permissions(tmp_path: Path) -> None:
    # a read-only checkout (a CI volume, a bind mount) was told to fix permissions or ownership,
    # which cannot help; by hand: `build` and `new` in a `mount -o remount,bind,ro` copy
    where = tmp_path / "proj" / ".envbuild"
    for err in (
        fsutil.file_error(OSError(errno.EROFS, "Read-only file system", str(where))),
        fsutil._failed(OSError(errno.EROFS, "Read-only file system", str(where)), where),
    ):
        assert str(err).startswith(f"cannot write {where}: Read-only file system")
        assert f"{where.parent} is on a read-only filesystem" in (err.hint or "") and "permissions" not in (
            err.hint or ""
        )


def test_uv_is_told_envbuilds_interpreter_only_where_no_build_for_another_python_can_follow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Naming an interpreter spares uv its discovery (a pyenv shim, run again by every call). The
    pylock.toml pass from uv's cache builds nothing, so it always names envbuild's; a resolve may
    build an sdist's metadata, so it names envbuild's only for a profile of envbuild's own Python,
    and the pass that goes back to the network (uv's cache lacked something) is a resolve again."""
    import sys

    from envbuild import venvlock
    from envbuild.lockopts import LockOptions

    ours = f"{sys.version_info[0]}.{sys.version_info[1]}"
    other = "3.12" if ours != "3.12" else "3.13"
    for python, named_in_resolve in ((ours, True), (other, False)):
        prof = _prof("cpu-py311").model_copy(update={"python": python})
        plan = plan_mod.for_profile(prof)
        given, out = tmp_path / "in.toml", tmp_path / "pylock.toml"
        resolve = venvlock._compile_args(given, tmp_path / "out.txt", plan, "x86_64", LockOptions())
        cached = venvlock._pylock_args(given, out, plan, "x86_64", from_cache=True)
        fetched = venvlock._pylock_args(given, out, plan, "x86_64", from_cache=False)
        named = ["--python", sys.executable]
        assert resolve[resolve.index("--python-version") + 1] == python
        assert (" ".join(named) in " ".join(resolve)) is named_in_resolve
        assert " ".join(named) in " ".join(cached) and "--offline" in cached
        assert (" ".join(named) in " ".join(fetched)) is named_in_resolve and "--offline" not in fetched
    monkeypatch.setattr(sys, "executable", "")  # embedded: no interpreter to name; uv finds one
    assert uvtool.interpreter(ours, builds=False) == []
