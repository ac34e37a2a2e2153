"""Loading: extends, cycles, hostile YAML, line numbers."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from envbuild import validate


def test_extends_deep_merges_and_tracks_origin(project: Path, write_profile: Callable[..., Path]) -> None:
    (project / "profiles" / "_gpu.yaml").write_text("accelerator: cuda\nenv:\n  A: '1'\n  B: '2'\n")
    path = write_profile(
        text=(
            "name: cu121-py311\nextends: _gpu\ncuda: '12.1'\npython: '3.11'\ntorch: '2.3.1'\n"
            "numpy: '1.26.4'\nenv:\n  B: '3'\n"
        )
    )
    loaded = validate.check(path, "profiles/cu121-py311.yaml")
    assert loaded.errors == []
    assert loaded.profile is not None
    assert loaded.profile.env == {"A": "1", "B": "3"}
    assert loaded.profile.accelerator == "cuda"


def test_a_variant_whose_packages_leave_out_its_parents_is_warned(
    project: Path, write_profile: Callable[..., Path]
) -> None:
    """`extends: cpu-py311` plus `packages: [tqdm]` reads as "cpu-py311 and tqdm", but lists are
    replaced: the variant lost einops without a word, and the team's code failed in its image."""
    parent = "name: cpu-py311\naccelerator: cpu\npython: '3.11'\ntorch: '2.13.0'\nnumpy: '2.1.3'\n"
    (project / "profiles" / "cpu-py311.yaml").write_text(parent + "packages: ['einops==0.8.1', 'Tqdm>=4']\n")
    path = write_profile(
        "cpu-py311-x", text="name: cpu-py311-x\nextends: cpu-py311\npackages:\n  - tqdm==4.67.1\n  - rich\n"
    )
    loaded = validate.check(path, "profiles/cpu-py311-x.yaml")
    assert loaded.errors == []
    [warning] = loaded.warnings
    assert warning.render() == (
        "profiles/cpu-py311-x.yaml:3: packages: this list replaces cpu-py311's (lists are not merged), which "
        "leaves out einops==0.8.1; repeat it here to keep it; ignore this if the profile means to drop it"
    )  # tqdm is kept (another pin, another spelling of its name): only what is gone is named
    path.write_text("name: cpu-py311-x\nextends: cpu-py311\npackages: ['einops==0.8.1', 'tqdm==4.67.1']\n")
    assert validate.check(path).warnings == []
    path.write_text("name: cpu-py311-x\nextends: cpu-py311\n")  # no list of its own: the parent's
    assert validate.check(path).warnings == []


def test_error_in_parent_names_the_parent_file(project: Path, write_profile: Callable[..., Path]) -> None:
    (project / "profiles" / "_gpu.yaml").write_text("accelerator: cuda\nflavour: venv\n")
    path = write_profile(
        text="name: cu121-py311\nextends: _gpu\ncuda: '12.1'\npython: '3.11'\ntorch: '2.3.1'\nnumpy: '1.26.4'\n"
    )
    loaded = validate.check(path, "profiles/cu121-py311.yaml")
    [err] = loaded.errors
    assert err.render() == "profiles/_gpu.yaml:2: flavour: unknown key 'flavour'; did you mean `flavor`?"


def test_extends_cycle(project: Path, write_profile: Callable[..., Path]) -> None:
    (project / "profiles" / "_a.yaml").write_text("extends: cu121-py311\n")
    path = write_profile(text="name: cu121-py311\nextends: _a\n")
    # the fields the cycle leaves unset are not each "required" besides: the cycle is the one error
    [err] = validate.check(path).errors
    assert "extends forms a cycle" in err.message


def test_extends_missing_with_suggestion(project: Path, write_profile: Callable[..., Path]) -> None:
    path = write_profile(text="name: cu121-py311\nextends: _bsae\n")
    [err] = validate.check(path).errors
    assert err.message == "_bsae.yaml does not exist next to this profile"
    assert err.fix == "did you mean _base?"


def test_alias_bomb_is_refused_quickly(write_profile: Callable[..., Path]) -> None:
    lines = ['a0: &a0 ["x","x","x","x","x","x","x","x","x","x"]']
    lines += [f"a{i}: &a{i} [{','.join(['*a' + str(i - 1)] * 10)}]" for i in range(1, 9)]
    loaded = validate.check(write_profile(text="\n".join(lines) + "\n"))
    [err] = loaded.errors
    assert "alias bomb" in err.message


def test_python_object_tag_is_refused(write_profile: Callable[..., Path]) -> None:
    loaded = validate.check(write_profile(text="name: !!python/object/apply:os.system ['true']\n"))
    assert "unsupported YAML tag" in loaded.errors[0].message


def test_duplicate_keys(write_profile: Callable[..., Path]) -> None:
    loaded = validate.check(write_profile(text="name: a\nname: b\n"))
    assert ":2: duplicate key 'name'" in loaded.errors[0].render()


def test_a_merges_conflict_markers_are_named_with_their_line(write_profile: Callable[..., Path]) -> None:
    # YAML's own word for them was "could not find expected ':'", and the fix "fix the YAML syntax"
    text = 'name: x\n<<<<<<< HEAD\nnumpy: "2.1.3"\n=======\nnumpy: "2.1.2"\n>>>>>>> other\n'
    error = validate.check(write_profile(text=text)).errors[0]
    assert ":2: a merge's conflict markers" in error.render()
    assert "keep one side's lines" in error.render()


def test_not_a_mapping(write_profile: Callable[..., Path]) -> None:
    loaded = validate.check(write_profile(text="- just\n- a list\n"))
    assert "a profile is a mapping of keys, not a list" in loaded.errors[0].message


def test_binary_file(write_profile: Callable[..., Path]) -> None:
    path = write_profile(text="")
    path.write_bytes(b"\xff\xfe\x00bad")
    assert "not UTF-8" in validate.check(path).errors[0].message


def test_a_profile_saved_in_latin_1_is_named_by_line_and_column_with_the_fix(
    write_profile: Callable[..., Path],
) -> None:
    """It said "not UTF-8 text (byte 33)": an offset into the file, and no fix."""
    path = write_profile(text="")
    path.write_bytes('name: cpu-py311\ndescription: "Modèle"\n'.encode("latin-1"))
    error = validate.check(path).errors[0]
    assert error.render().startswith(f"{error.file}:2: not UTF-8 text (byte 0xe8) (column 18)")
    assert "save the file as UTF-8" in error.render()


def test_digest_is_stable_and_sensitive(write_profile: Callable[..., Path]) -> None:
    a = validate.load_valid(write_profile())
    b = validate.load_valid(write_profile())
    c = validate.load_valid(write_profile(numpy="1.26.3"))
    assert a.digest() == b.digest() != c.digest()
