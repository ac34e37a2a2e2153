"""`envbuild images`: which images are current, which can go, and what pruning must never touch."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from envbuild import images, localimage, profile, project, smokerecord
from envbuild.errors import ProfileError, UsageError
from envbuild.names import LABEL_PROFILE, LABEL_SOURCE
from tests.conftest import VALID, Result

PROF = profile.Profile.model_validate({**VALID})
CURRENT = {"io.envbuild.lock-sha256": "a" * 64, "io.envbuild.image-digest": "d" * 64}


def _compare(prof: profile.Profile, labels: dict[str, str]) -> list[str]:
    return [f"{k}: image has {labels.get(k)}" for k, v in CURRENT.items() if labels.get(k) != v]


def _attrs(
    tags: list[str], *, lock: str = "a" * 64, smoke: bool = True, name: str = "cu121-py311", **more: str
) -> dict[str, Any]:
    """An image's inspect attributes; `smoke`: with a passed-smoke record that holds for it."""
    labels = {"io.envbuild.profile": name, "io.envbuild.lock-sha256": lock, "io.envbuild.image-digest": "d" * 64}
    labels |= {f"io.envbuild.{k.replace('_', '.')}": v for k, v in more.items()}
    attrs = {"RepoTags": tags, "Created": "2026-11-30T01:02:03.456Z", "Size": 123, "Config": {"Labels": labels}}
    attrs["RootFS"] = {"Layers": ["sha256:" + "e" * 64]}
    if smoke:
        labels["io.envbuild.smoke"] = "passed"
        labels["io.envbuild.smoke.record"] = smokerecord.digest(attrs)
    return attrs


def _row(
    attrs: dict[str, Any],
    users: dict[str, list[str]] | None = None,
    expected: dict[str, profile.Profile | ProfileError] | None = None,
) -> images.ImageRow:
    known: dict[str, profile.Profile | ProfileError] = {"cu121-py311": PROF, **(expected or {})}
    return images.classify("sha256:" + "1" * 64, attrs, known, _compare, users or {})


def test_the_image_built_from_todays_lockfile_is_current_and_kept() -> None:
    row = _row(_attrs(["envbuild:cu121-py311", f"envbuild:cu121-py311-{'a' * 12}"]))
    assert (row.state, row.keep, row.reason, row.smoke) == ("current", True, "current", "passed")
    assert row.created == "2026-11-30T01:02:03"


def test_an_older_lockfiles_image_under_its_immutable_tag_can_go() -> None:
    row = _row(_attrs([f"envbuild:cu121-py311-{'b' * 12}"], lock="b" * 64))
    assert (row.state, row.keep) == ("stale", False)
    assert row.why.startswith("io.envbuild.lock-sha256: image has bbbb")


@pytest.mark.parametrize(
    "moving", ["envbuild:cu121-py311", "localhost:5000/envs:cu121-py311", "e:cu121-py311-untested"]
)
def test_a_stale_image_a_moving_tag_points_to_stays_until_a_rebuild_replaces_it(moving: str) -> None:
    row = _row(_attrs([moving, f"envbuild:cu121-py311-{'b' * 12}"], lock="b" * 64, smoke=False))
    assert (row.state, row.keep, row.smoke) == ("stale", True, "untested")
    assert row.reason == f"tagged {moving.rsplit('/', 1)[-1]}"


def test_an_image_a_container_uses_is_kept_whatever_its_state() -> None:
    row = _row(_attrs([], lock="b" * 64), users={"sha256:" + "1" * 64: ["train-run"]})
    assert (row.state, row.keep, row.reason) == ("untagged", True, "in use by container train-run")


def test_an_untagged_image_is_left_alone_while_a_build_of_its_profile_runs() -> None:
    # The build's image is untagged from the end of `docker build` until the smoke test passed.
    busy = images.classify(
        "sha256:" + "1" * 64,
        _attrs([], smoke=False),
        {"cu121-py311": PROF},
        _compare,
        {},
        building=frozenset({"cu121-py311"}),
    )
    assert (busy.state, busy.keep, busy.reason) == (
        "untagged",
        True,
        "a build of cu121-py311 is running (its image is tagged last)",
    )


def _builder(lock: str, superseded: frozenset[str] = frozenset()) -> images.ImageRow:
    """A builder-stage image as the classic builder leaves it: untagged, with the stage's own labels."""
    labels = {"io.envbuild.stage": "builder", "io.envbuild.profile": "cu121-py311", "io.envbuild.lock-sha256": lock}
    attrs = {"RepoTags": [], "Created": "2026-11-30T01:02:03Z", "Size": 6 * 10**9, "Config": {"Labels": labels}}

    def lock_only(prof: profile.Profile, found: dict[str, str]) -> list[str]:
        key = "io.envbuild.lock-sha256"
        return [] if found.get(key) == CURRENT[key] else [f"{key}: image has {found.get(key)}"]

    return images.classify("sha256:" + "2" * 64, attrs, {"cu121-py311": PROF}, lock_only, {}, superseded=superseded)


def test_the_build_cache_of_todays_lockfile_is_kept_though_untagged() -> None:
    row = _builder("a" * 64)
    assert (row.stage, row.state, row.keep, row.smoke, row.tags) == ("builder", "current", True, "-", [])
    assert row.why == "build cache of today's lockfile: the next build starts from it"


def test_a_build_cache_of_an_older_lockfile_or_replaced_by_a_newer_build_can_go() -> None:
    older = _builder("b" * 64)
    assert (older.state, older.keep) == ("stale", False)
    assert older.why.startswith("build cache of another lockfile (io.envbuild.lock-sha256: image has bbbb")
    replaced = _builder("a" * 64, superseded=frozenset({"sha256:" + "2" * 64}))
    assert (replaced.state, replaced.keep) == ("stale", False)
    assert replaced.why == "build cache of today's lockfile that a newer build replaced"


def test_only_the_newest_build_cache_of_the_current_lockfile_is_the_one_a_build_starts_from() -> None:
    current_lock: dict[str, tuple[str, dict[str, str]]] = {"cu121-py311": ("a" * 64, {})}

    def summary(image_id: str, created: int, lock: str, stage: str = "builder") -> dict[str, Any]:
        labels = {"io.envbuild.profile": "cu121-py311", "io.envbuild.lock-sha256": lock}
        if stage:
            labels["io.envbuild.stage"] = stage
        return {"Id": image_id, "Created": created, "Labels": labels}

    found = images._superseded(
        [
            summary("old-current", 100, "a" * 64),
            summary("new-current", 300, "a" * 64),
            summary("older-lock", 400, "b" * 64),  # newest of all, but another lockfile: not the cache in use
            summary("final-image", 500, "a" * 64, stage=""),  # a runtime image is never "superseded"
        ],
        current_lock,
    )
    assert found == frozenset({"old-current"})


def test_each_layer_stage_keeps_its_newest_build_cache() -> None:
    """A layered build leaves one cache image per layer's stage (torch, ..., rest): the torch
    stage's is not superseded by the rest stage's, only by a newer torch stage's."""

    def summary(image_id: str, created: int, layer: str) -> dict[str, Any]:
        labels = {
            "io.envbuild.profile": "cpu-py311",
            "io.envbuild.layer-sha256": layer[0] * 64,
            "io.envbuild.stage": "builder",
            "io.envbuild.layer": layer,
        }
        return {"Id": image_id, "Created": created, "Labels": labels}

    found = images._superseded(
        [summary("torch-old", 100, "torch"), summary("torch-new", 200, "torch"), summary("rest", 300, "rest")],
        {"cpu-py311": ("a" * 64, {"torch": "t" * 64, "rest": "r" * 64})},
    )
    assert found == frozenset({"torch-old"})


def test_a_layer_stages_cache_is_current_while_its_part_of_the_lockfile_is() -> None:
    """A re-lock of small packages changes the lockfile, not the torch layer's part of it: the torch
    stage's cache image (the layer's 1-6 GB) stays the one the next build starts from; the rest
    stage's is another lockfile's once its part changed. Older images, labelled with the whole
    lockfile's sha256, are still told by it."""
    layers = {"torch": "t" * 64, "rest": "r" * 64}

    def labels(layer: str, sha: str) -> dict[str, str]:
        return {"io.envbuild.stage": "builder", "io.envbuild.layer": layer, "io.envbuild.layer-sha256": sha}

    assert images._cache_mismatches(labels("torch", "t" * 64), "b" * 64, layers) == []
    (why,) = images._cache_mismatches(labels("rest", "o" * 64), "b" * 64, layers)
    assert why.startswith("io.envbuild.layer-sha256 of layer rest: image has oooo")
    (gone,) = images._cache_mismatches(labels("torch-extras", "x" * 64), "b" * 64, layers)
    assert gone.endswith("local has (no such layer)")  # the lock no longer has torchvision
    older = {"io.envbuild.stage": "builder", "io.envbuild.lock-sha256": "a" * 64}
    assert images._cache_mismatches(older, "a" * 64, layers) == []
    assert images._cache_mismatches(older, "b" * 64, layers)


def test_untagged_leftovers_and_images_of_deleted_profiles_can_go() -> None:
    leftover = _row(_attrs(["<none>:<none>"], smoke=False))
    assert (leftover.state, leftover.keep, leftover.tags) == ("untagged", False, [])
    orphan = _row(_attrs([f"envbuild:cu122-py311-{'c' * 12}"], name="cu122-py311"))
    assert (orphan.state, orphan.keep) == ("orphan", False)
    assert orphan.why == "no profile cu122-py311 in profiles/"


def test_an_image_current_in_another_checkout_stays_and_says_where() -> None:
    """Another clone (another branch, other lockfiles, a profile only it has) built these: stale or
    unknown here, its tested build there."""

    def elsewhere(profile: str, labels: dict[str, str]) -> str:
        theirs = labels["io.envbuild.lock-sha256"] == "b" * 64
        return "current in the checkout at /home/bob/envs" if theirs else ""

    def row(attrs: dict[str, Any]) -> images.ImageRow:
        return images.classify("sha256:" + "1" * 64, attrs, {"cu121-py311": PROF}, _compare, {}, elsewhere=elsewhere)

    for theirs in (
        _attrs([f"envbuild:cu121-py311-{'b' * 12}"], lock="b" * 64),
        _attrs([f"envbuild:cu122-py311-{'b' * 12}"], lock="b" * 64, name="cu122-py311"),
    ):
        got = row(theirs)
        assert (got.state in {"stale", "orphan"}, got.keep) == (True, True)
        assert got.reason == "current in the checkout at /home/bob/envs"
    mine_before = row(_attrs([f"envbuild:cu121-py311-{'c' * 12}"], lock="c" * 64))
    assert (mine_before.keep, mine_before.reason) == (False, "removable")
    leftover = row(_attrs(["<none>:<none>"], lock="b" * 64, smoke=False))
    assert (leftover.state, leftover.keep) == ("untagged", False)


def test_another_checkout_needs_what_it_would_build_and_the_images_of_a_profile_it_cannot_validate() -> None:
    """The rules a checkout keeps its own images by, applied to another's: current there, or of a
    profile that does not validate there (bob mid-edit); a profile it does not have needs nothing."""
    lock = "io.envbuild.lock-sha256"
    bob = images._Checkout(
        Path("/home/bob/envs"),
        facts={"cu121-py311": [("lockfile sha256", lock, "b" * 64)]},
        current={"cu121-py311": ("b" * 64, {"torch": "f" * 64})},
        invalid=frozenset({"cu124-py312"}),
    )
    assert bob.needs("cu121-py311", {lock: "b" * 64}) == "current in the checkout at /home/bob/envs"
    assert bob.needs("cu121-py311", {lock: "c" * 64}) == ""
    builder = {"io.envbuild.stage": "builder", "io.envbuild.layer": "torch", "io.envbuild.layer-sha256": "f" * 64}
    assert bob.needs("cu121-py311", builder) == "current in the checkout at /home/bob/envs"
    assert bob.needs("cu124-py312", {lock: "c" * 64}).startswith("unknown in the checkout at /home/bob/envs: cu124")
    assert bob.needs("cpu-py311", {lock: "b" * 64}) == ""


def test_a_profile_that_does_not_validate_keeps_its_images() -> None:
    broken = ProfileError("profiles/cu121-py311.yaml is not valid")
    row = _row(_attrs([f"envbuild:cu121-py311-{'b' * 12}"], lock="b" * 64), expected={"cu121-py311": broken})
    assert (row.state, row.keep) == ("unknown", True)


def test_dry_run_without_prune_is_a_usage_error(cli: Callable[..., Result]) -> None:
    res = cli("images", "--dry-run")
    assert res.code == 2
    assert "--dry-run goes with --prune" in res.err


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        ("https://github.com/acme/envs.git", "git@github.com:acme/envs.git", True),
        ("https://ci-token:x@github.com/Acme/envs", "ssh://git@github.com/acme/envs.git", True),
        ("https://gitlab.example:8443/acme/envs.git", "https://gitlab.example:8443/acme/envs", True),
        ("https://github.com/acme/envs", "https://github.com/acme/other", False),
        ("file:///home/a/proj", "file:///home/b/proj", False),
        # `git clone /home/a/proj` (or its .git) beside a checkout without a remote, labelled by its folder
        ("file:///home/a/proj", "/home/a/proj", True),
        ("file:///home/a/proj", "/home/a/proj/.git", True),
        ("/srv/git/envs.git", "file:///srv/git/envs", True),
        ("/home/a/proj", "/home/a/other", False),
        ("", "", False),
    ],
)
def test_one_repository_cloned_over_https_or_ssh_is_one_project(a: str, b: str, same: bool) -> None:
    # CI builds from an https clone, a developer pulls into an ssh clone: `images` and `status` must agree.
    assert project.same_source(a, b) is same


@pytest.mark.parametrize(
    ("remote", "label"),
    [
        ("git@github.com:Acme/envs.git", "https://github.com/Acme/envs"),
        ("https://github.com/Acme/envs", "https://github.com/Acme/envs"),
        ("ssh://git@github.com:2222/Acme/envs.git/", "https://github.com/Acme/envs"),
        ("https://gitlab-ci-token:s3cret@gitlab.example/acme/envs.git", "https://gitlab.example/acme/envs"),
        ("http://gitea.local:3000/acme/envs.git", "http://gitea.local:3000/acme/envs"),
        ("/srv/git/envs.git", "file:///srv/git/envs.git"),  # a bare repository's folder is its name
        ("/home/a/proj/.git", "file:///home/a/proj"),
    ],
)
def test_the_source_label_is_the_repository_s_web_address_whatever_the_clone_s_remote(
    remote: str, label: str, tmp_path: Path
) -> None:
    """An ssh and an https clone of one repository labelled their images `git@github.com:Acme/envs.git`
    and `https://github.com/Acme/envs`: two image IDs for one build, and GitHub's registry links an
    image to its repository only from the https form. A CI job's token never reaches the label."""
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    subprocess.run(["git", "-C", str(tmp_path), "remote", "add", "origin", remote], check=True)
    assert project.source_label(project.open_project(str(tmp_path))) == label


def test_two_folders_of_one_name_are_told_a_repository_that_keeps_them_apart(tmp_path: Path) -> None:
    # /srv/a/app and /srv/b/app both default to envbuild/app: the refusal names a value to set, and
    # that value is this project's own from then on
    folders = (tmp_path / "a" / "app", tmp_path / "b" / "app")
    for folder in folders:
        folder.mkdir(parents=True)
    first, second = (project.open_project(str(folder)) for folder in folders)
    assert first.repository == second.repository == "envbuild/app"
    labels = {LABEL_PROFILE: PROF.name, LABEL_SOURCE: project.source_label(first)}
    localimage.check_belongs(first, PROF, "envbuild/app:cu121-py311", labels)  # its own image
    with pytest.raises(UsageError) as err:
        localimage.check_belongs(second, PROF, "envbuild/app:cu121-py311", labels)
    assert 'repository = "envbuild/b-app" under [envbuild]' in (err.value.hint or "")
    (second.root / "envbuild.toml").write_text('[envbuild]\nrepository = "envbuild/b-app"\n')
    fixed = project.open_project(str(second.root))
    assert fixed.repository == "envbuild/b-app" != first.repository
    # a repository set by hand that another project uses too: the fix names the setting, not a default
    with pytest.raises(UsageError) as err:
        localimage.check_belongs(fixed, PROF, "envbuild/b-app:cu121-py311", labels)
    assert "envbuild.toml's repository (envbuild/b-app) is another project's too" in (err.value.hint or "")


def test_an_image_pulled_by_digest_is_judged_by_its_labels_not_as_a_leftover() -> None:
    pulled = {**_attrs([]), "RepoDigests": ["localhost:5000/envs@sha256:" + "d" * 64]}
    assert (_row(pulled).state, _row(pulled).keep) == ("current", True)
    old = {**_attrs([], lock="b" * 64), "RepoDigests": ["localhost:5000/envs@sha256:" + "d" * 64]}
    assert (_row(old).state, _row(old).keep) == ("stale", False)


@pytest.mark.parametrize(
    ("accelerator", "gpu_label", "expected"),
    [("cuda", "skip", "skip"), ("cuda", "pass", "pass"), ("rocm", "skip", "skip"), ("cpu", "skip", "-")],
)
def test_a_gpu_image_tested_without_a_gpu_says_so(accelerator: str, gpu_label: str, expected: str) -> None:
    """A CUDA image built on a CPU runner passes its smoke test with the GPU checks skipped; `images`
    and `status` must not let that read as a GPU-tested image."""
    attrs = _attrs(["envbuild:cu121-py311"], accelerator=accelerator, smoke_gpu=gpu_label)
    assert _row(attrs).smoke_gpu == expected
    assert _row(_attrs(["envbuild:cu121-py311"], smoke=False)).smoke_gpu == "-"  # never tested: nothing to say


def test_status_carries_the_gpu_check_of_the_current_tested_image() -> None:
    from envbuild import status

    attrs = _attrs(["envbuild:cu121-py311"], accelerator="cuda", smoke_gpu="skip")
    assert status.image_state([_row(attrs)], "cu121-py311") == ("tested", "envbuild:cu121-py311", "skip")
    # pushed: the registry's tag sorts first, and the project's own is the one to show
    pushed = _attrs(["127.0.0.1:5000/team/envs:cu121-py311", "envbuild:cu121-py311"])
    assert status.image_state([_row(pushed)], "cu121-py311", "envbuild")[1] == "envbuild:cu121-py311"


def _derived(attrs: dict[str, Any], **change: Any) -> dict[str, Any]:
    """An image built FROM `attrs`: its labels inherited, as Docker does."""
    import copy

    child = copy.deepcopy(attrs)
    for key, value in change.items():
        if key == "layer":
            child["RootFS"]["Layers"].append(value)
        elif key == "labels":
            child["Config"]["Labels"] |= value
        else:
            child["Config"][key] = value
    return child


@pytest.mark.parametrize(
    ("change", "smoke"),
    [
        ({"layer": "sha256:" + "f" * 64}, "altered"),  # FROM tested + RUN pip install x
        ({"labels": {"io.envbuild.torch": "2.5.1"}}, "altered"),  # relabelled: the labels would lie
        ({"Env": ["PATH=/usr/bin", "LD_PRELOAD=/x.so"]}, "altered"),  # what runs is not what was tested
        ({"Entrypoint": ["/bin/sh"]}, "altered"),
        ({"labels": {"maintainer": "me", "com.example.team": "ml"}}, "passed"),  # a team's own labels only
        ({}, "passed"),
    ],
)
def test_a_smoke_record_holds_only_for_the_image_that_passed(change: dict[str, Any], smoke: str) -> None:
    """Labels are inherited: an image derived from a tested one, or relabelled, carried
    io.envbuild.smoke=passed, and push, pull and images took it for the tested image."""
    tested = _attrs(["envbuild:cu121-py311"])
    row = _row(_derived(tested, **change))
    assert row.smoke == smoke
    assert status_of(row) == ("tested" if smoke == "passed" else "untested")


def status_of(row: images.ImageRow) -> str:
    from envbuild import status

    return status.image_state([row], "cu121-py311")[0]


def test_the_record_the_build_writes_holds_for_the_labels_only_child() -> None:
    """build.mark_smoke_passed computes the record from the tested image and the labels its child
    adds; the child, which adds labels and nothing else, must then read as passed."""
    tested = _attrs(["x"], smoke=False)
    added = {"io.envbuild.env-digest": "c" * 64, "io.envbuild.smoke": "passed", "io.envbuild.smoke.gpu": "skip"}
    record = smokerecord.digest(tested, {**tested["Config"]["Labels"], **added})
    child = _derived(tested, labels={**added, "io.envbuild.smoke.record": record})
    assert smokerecord.state(child) == "passed" and smokerecord.state(tested) == "untested"
    forged = _derived(child, labels={"io.envbuild.smoke.record": "0" * 64})
    assert smokerecord.state(forged) == "altered"


def test_an_image_built_from_an_envbuild_image_is_not_pruned_nor_taken_for_the_profiles() -> None:
    """`FROM envbuild/proj:cu121-py311` + `RUN pip install ...`, tagged myteam/app:latest, inherits
    every envbuild label: once the lockfile moved on, `images --prune` removed the team's own image
    as a stale build, and `status` named it as the profile's stale image."""
    built = _attrs([f"envbuild:cu121-py311-{'b' * 12}"], lock="b" * 64)
    app = _derived(built, layer="sha256:" + "f" * 64)
    app["RepoTags"] = ["myteam/app:latest"]
    app["Created"] = "2026-12-01T00:00:00Z"  # newer than the build it came from
    row = _row(app)
    assert (row.state, row.smoke, row.derived, row.keep) == ("stale", "altered", True, True)
    assert row.reason == "not envbuild's: tagged myteam/app:latest"
    dangling = _derived(built, layer="sha256:" + "f" * 64)
    dangling["RepoTags"] = []  # the team's rebuild moved its tag on
    assert (_row(dangling).keep, _row(dangling).reason) == (True, "not envbuild's: derived from its image")
    by_hand = _attrs([f"envbuild:cu121-py311-{'b' * 12}", "me/keep:this"], lock="b" * 64)
    assert (_row(by_hand).keep, _row(by_hand).reason) == (True, "not envbuild's: tagged me/keep:this")
    assert (_row(built).keep, _row(built).reason) == (False, "removable")  # envbuild's own stale build goes
    from envbuild import status

    assert status.image_state([_row(app), _row(built)], "cu121-py311")[:2] == (
        "stale",
        f"envbuild:cu121-py311-{'b' * 12}",
    )
    assert status.image_state([_row(app)], "cu121-py311") == ("none", "", "-")


def test_status_names_an_image_built_from_the_tested_one_under_the_profiles_tag() -> None:
    """`docker build -t envbuild/proj:NAME` FROM the tested image: status said "tested ... ready"
    (from the pushed registry tag on the real one), while run started the other and push refused it."""
    from pathlib import Path

    from envbuild import status

    tested = _attrs(["127.0.0.1:5000/team/envs:cu121-py311", "envbuild:cu121-py311-" + "a" * 12])
    over = _derived(tested, layer="sha256:" + "f" * 64)
    over["RepoTags"] = ["envbuild:cu121-py311"]
    rows = [_row(tested), _row(over)]
    proj = project.Project(Path("/nowhere"), project.ProjectConfig(repository="envbuild"))
    ref, why = status.foreign_problem(None, rows, proj, PROF)
    assert ref == "envbuild:cu121-py311" and why.startswith("its smoke-test record does not hold")
    assert why.endswith("push refuses it")


def test_a_smoke_report_stands_for_an_unchanged_rebuild_only_on_the_very_image_and_its_record(tmp_path: Path) -> None:
    """What `build` checks before it skips the smoke test of a rebuild that changed nothing."""
    import json
    from types import SimpleNamespace

    built = "sha256:" + "b" * 64
    tested: dict[str, Any] = {"RootFS": {"Layers": ["sha256:1"]}, "Config": {"Labels": {"io.envbuild.profile": "x"}}}
    labels = {**tested["Config"]["Labels"], "io.envbuild.smoke": "passed", "io.envbuild.smoke.tested-image": built}
    child = {**tested, "Config": {"Labels": {**labels, "io.envbuild.smoke.record": smokerecord.digest(tested, labels)}}}
    engine_images: dict[str, dict[str, Any]] = {"sha256:child": child}
    api = SimpleNamespace(
        images=lambda filters: [{"Id": i} for i in engine_images],
        inspect_image=lambda image_id: engine_images[image_id],
    )
    cli = SimpleNamespace(api=api)
    saved = tmp_path / "smoke.json"
    whole = {"passed": True, "image": built, "checks": []}
    saved.write_text(json.dumps(whole))
    assert smokerecord.passed_before(cli, built, saved, "cpu") == whole
    # what the test certifies on a GPU host is the host's driver and devices too
    assert smokerecord.passed_before(cli, built, saved, "cuda") is None
    assert smokerecord.passed_before(cli, "sha256:" + "c" * 64, saved, "cpu") is None  # another image
    # `envbuild smoke NAME` since the build: its report is of the marked image, which holds
    by_smoke = {**whole, "image": "sha256:child"}
    saved.write_text(json.dumps(by_smoke))
    assert smokerecord.passed_before(cli, built, saved, "cpu") == by_smoke
    for report in ({**whole, "only": ["gpu"]}, {**whole, "passed": False}, "[]"):
        saved.write_text(report if isinstance(report, str) else json.dumps(report))
        assert smokerecord.passed_before(cli, built, saved, "cpu") is None, report
    saved.write_text(json.dumps(whole))
    # a report written by hand without the record envbuild labels a tested image with
    engine_images["sha256:child"] = {**child, "Config": {"Labels": {**labels, "io.envbuild.smoke.record": "forged"}}}
    assert smokerecord.passed_before(cli, built, saved, "cpu") is None
    saved.unlink()
    assert smokerecord.passed_before(cli, built, saved, "cpu") is None


def test_a_stale_image_says_which_of_its_inputs_differ(engineless_project: Path) -> None:
    """An image stale for its inputs said only "image inputs digest: image has 6c35..., local has
    94e8...": not whether the profile, a template override or a newer envbuild's smoke test moved."""
    from envbuild import plan as plan_mod
    from envbuild import publish, validate
    from envbuild.names import LABEL_IMAGE_DIGEST, LABEL_IMAGE_INPUTS, part_digests

    proj = project.open_project(str(engineless_project))
    prof = validate.load_named(proj, "cpu-py311")
    built = plan_mod.make(proj, prof, strict=False)
    labels = {LABEL_IMAGE_DIGEST: built.image_digest, LABEL_IMAGE_INPUTS: part_digests(built.image_inputs)}
    assert not [m for m in publish.compare(proj, prof, labels) if "image inputs" in m]
    (engineless_project / "templates").mkdir()
    shipped = plan_mod.default_templates_dir() / "Dockerfile.venv.j2"
    (engineless_project / "templates" / "Dockerfile.venv.j2").write_text(shipped.read_text() + "# ours\n")
    said = [m for m in publish.compare(proj, prof, labels) if "image inputs" in m]
    assert len(said) == 1 and said[0].endswith("(it differs in the templates)"), said
    # an image from before the label: the digests, as before, and no line for the missing label
    said = [m for m in publish.compare(proj, prof, {LABEL_IMAGE_DIGEST: built.image_digest}) if "image inputs" in m]
    assert len(said) == 1 and said[0].startswith("image inputs digest: image has ") and "differs in" not in said[0]


def test_another_checkout_with_its_lockfiles_deep_in_its_tree_is_found_by_the_root_its_note_names(
    engineless_project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bob's clone keeps its lockfiles in ci/locks/by-team/gpu: from that folder alone (the cache's
    note before roots were noted) no parent within reach is his project, so his tested build went on
    Alice's prune. Each checkout reads only the profile it is asked about."""
    import shutil

    from envbuild import validate, wheelcache

    monkeypatch.setenv(wheelcache.CACHE_ENV, str(tmp_path / "cache"))
    bob = tmp_path / "bob"
    shutil.copytree(engineless_project, bob)
    deep = bob / "ci" / "locks" / "by-team" / "gpu"
    shutil.move(bob / "lockfiles", deep)
    (bob / "envbuild.toml").write_text('[envbuild]\nlockfiles_dir = "ci/locks/by-team/gpu"\n')
    for root in (engineless_project, bob):
        subprocess.run(["git", "init", "-q", str(root)], check=True)
        origin = ["remote", "add", "origin", "https://example.org/acme/envs.git"]
        subprocess.run(["git", "-C", str(root), *origin], check=True)
    alice = project.open_project(str(engineless_project))
    theirs = project.open_project(str(bob))
    built = images._checkout(theirs, validate.load_all(theirs)).facts["cpu-py311"]
    labels = {label: value for _, label, value in built}

    wheelcache.register(deep)  # the folder alone
    assert images._other_checkouts(alice, project.source_label(alice)) == []
    wheelcache.register(deep, bob)
    [needs] = images._other_checkouts(alice, project.source_label(alice))
    assert needs("cpu-py311", labels) == f"current in the checkout at {bob.resolve()}"
    assert needs("cpu-py311", {**labels, "io.envbuild.lock-sha256": "0" * 64}) == ""
    (bob / "profiles" / "cu121-py311.yaml").write_text("name: [")  # mid-edit there: its images stay
    assert needs("cu121-py311", {}).startswith(f"unknown in the checkout at {bob.resolve()}: cu121-py311")
