"""`envbuild diff`: which distributions, OS packages and files differ between two environments."""

from __future__ import annotations

from envbuild import diff
from envbuild.names import ENV_DIGEST_PATH, EXPECT_PATH, MANIFEST_PATH
from envbuild.smoke.inside import manifest
from envbuild.smoke.inside.core import DEFAULT_EXPECT


def _files(**dists: str) -> dict[str, list[str]]:
    out = {}
    for name, version in dists.items():
        out[f"lib/python3.11/site-packages/{name}-{version}.dist-info/METADATA"] = ["0o644", name + version]
        out[f"lib/python3.11/site-packages/{name}/__init__.py"] = ["0o644", "x"]
    return out


def test_distributions_are_read_from_the_dist_info_folders() -> None:
    assert diff.distributions_of(_files(numpy="2.1.3", hello_envbuild="1.0")) == {
        "numpy": "2.1.3",
        "hello-envbuild": "1.0",
    }


def test_a_derived_image_differs_by_its_added_distribution_and_files() -> None:
    base = diff.Side(
        "a", "image", diff.distributions_of(_files(numpy="2.1.3")), {"libc6": "2.36"}, _files(numpy="2.1.3")
    )
    files = {**_files(numpy="2.1.3"), **_files(hello_envbuild="1.0")}
    derived = diff.Side("b", "image", diff.distributions_of(files), {"libc6": "2.36", "git": "1:2.39"}, files)
    found = diff.compare(base, derived)
    assert not found.same
    assert found.distributions == [{"name": "hello-envbuild", "a": None, "b": "1.0"}]
    assert found.os_packages == [{"name": "git", "a": None, "b": "1:2.39"}]
    assert found.file_counts == {"changed": 0, "only_a": 0, "only_b": 2}


def test_an_image_and_its_lockfile_agree_despite_the_venvs_own_pip() -> None:
    image = diff.Side("img", "image", {"numpy": "2.1.3", "pip": "24.0"}, {}, {})
    lock = diff.Side("cpu-py311 (lockfile)", "lockfile", {"numpy": "2.1.3"})
    assert diff.compare(image, lock).same
    lock.distributions["numpy"] = "2.1.2"
    assert diff.compare(image, lock).distributions == [{"name": "numpy", "a": "2.1.3", "b": "2.1.2"}]


def test_the_image_paths_are_one_fact_in_two_packages() -> None:
    # the in-image package cannot import envbuild: its copies of the paths must stay equal
    assert (manifest.MANIFEST, manifest.DIGEST) == (MANIFEST_PATH, ENV_DIGEST_PATH)
    assert DEFAULT_EXPECT == EXPECT_PATH


def test_vendored_dist_info_folders_are_not_distributions() -> None:
    files = {
        **_files(setuptools="75.0"),
        "lib/python3.11/site-packages/setuptools/_vendor/jaraco.text-4.0.0.dist-info/METADATA": ["0o644", "x"],
    }
    assert diff.distributions_of(files) == {"setuptools": "75.0"}
