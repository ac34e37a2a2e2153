"""The stages a classic build runs side by side (buildahead): each is the whole Dockerfile's own
lines, so the whole build finds its steps cached; and they start only where a layer is missing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from envbuild import buildahead, layering, lockfile
from envbuild import plan as plan_mod
from envbuild.layering import SideStage
from envbuild.project import open_project
from envbuild.validate import load_named


def _stages(dockerfile: str) -> tuple[list[str], dict[str, list[str]]]:
    """The instructions before the first FROM, and each stage's by its name: continuation lines
    joined, comments left out (they are not steps)."""
    joined = dockerfile.replace("\\\n", " ")
    head: list[str] = []
    stages: dict[str, list[str]] = {}
    current = head
    for line in joined.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if line.startswith("FROM "):
            current = stages.setdefault(line.split(" AS ")[1].strip(), [])
        current.append(" ".join(line.split()))
    return head, stages


def _render(project_dir: Path, name: str, labels: dict[str, str] | None) -> tuple[str, tuple[SideStage, ...]]:
    project = open_project(str(project_dir))
    plan = plan_mod.make(project, load_named(project, name))
    text = (project_dir / "lockfiles" / name / "requirements.lock").read_text()
    outputs, _, sides = layering.render_for(plan, lockfile.parse_requirements(text), None, labels, "uv", text)
    return outputs["Dockerfile"], sides


LABELS = {
    "io.envbuild.profile": "cpu-py311",
    "io.envbuild.lock-sha256": "0" * 64,
    "org.opencontainers.image.source": "file:///work/proj",
}


def test_each_side_stage_is_the_whole_dockerfiles_own_steps(engineless_project: Path) -> None:
    whole, sides = _render(engineless_project, "cpu-py311", LABELS)
    head, stages = _stages(whole)
    names = [s.name for s in sides]
    assert names == ["venv-base", "runtime-os", "layer-torch", "layer-torch-deps", "layer-numpy", "builder"]
    for side in sides:
        side_head, side_stages = _stages(side.dockerfile)
        assert side_head == head
        if side.name == "runtime-os":
            # the runtime up to its command: what follows joins the other stages' results
            assert list(side_stages) == ["runtime"]
            steps = side_stages["runtime"]
            assert steps[-1] == 'CMD ["python"]' and stages["runtime"][: len(steps)] == steps
            assert stages["runtime"][len(steps)].startswith("COPY --from=layer-")
        else:
            assert list(side_stages) == list(dict.fromkeys(["venv-base", side.name]))
            for stage, steps in side_stages.items():
                assert steps == stages[stage], f"{side.name}: stage {stage} differs from the whole Dockerfile's"
    by_name = {s.name: s for s in sides}
    assert by_name["layer-torch"].wheels == "wheels/torch" and by_name["builder"].wheels == "wheels/rest"
    assert by_name["venv-base"].wheels == by_name["runtime-os"].wheels == ""
    assert {s.after for s in sides if s.name not in ("venv-base", "runtime-os")} == {"venv-base"}
    # the labels a layer stage's cache image is found by are the ones its LABEL step sets
    # (of any profile of the project: a second profile with the same torch layer finds the first one's)
    torch_labels = dict(by_name["layer-torch"].cached_by)
    assert torch_labels.keys() == {
        "io.envbuild.stage",
        "io.envbuild.layer-sha256",
        "io.envbuild.stage-sha256",
        "org.opencontainers.image.source",
    }
    label_step = next(s for s in stages["layer-torch"] if s.startswith("LABEL io.envbuild.layer-sha256"))
    assert all(f'{k}="{v}"' in label_step for k, v in torch_labels.items())
    assert by_name["venv-base"].cached_by == by_name["runtime-os"].cached_by == ()


def test_render_alone_makes_no_side_stages_and_the_dockerfile_is_unchanged(engineless_project: Path) -> None:
    # `envbuild render` (no labels) renders one Dockerfile; a build's whole Dockerfile carries no
    # trace of the side stages either
    whole, sides = _render(engineless_project, "cpu-py311", None)
    assert sides == () and "stage_only" not in whole
    built, _ = _render(engineless_project, "cpu-py311", LABELS)
    assert _stages(built)[1].keys() == _stages(whole)[1].keys()


class _Api:
    def __init__(self, present: set[str]) -> None:
        self.present = present
        self.asked: list[list[str]] = []

    def images(self, filters: dict[str, list[str]], quiet: bool) -> list[str]:
        self.asked.append(filters["label"])
        sha = next(f for f in filters["label"] if f.startswith("io.envbuild.layer-sha256="))
        return ["image"] if sha.split("=", 1)[1] in self.present else []


class _Engine:
    def __init__(self, present: set[str]) -> None:
        self.api = _Api(present)


def _sha(side: SideStage) -> str:
    return dict(side.cached_by)["io.envbuild.layer-sha256"]


@pytest.mark.parametrize(
    ("missing", "started"),
    [
        ((), []),  # a rebuild that finds every layer: side builds would only send contexts
        (("builder",), []),  # a re-lock of small packages: only the rest installs, nothing to overlap
        (("layer-torch",), ["venv-base", "runtime-os", "layer-torch"]),
        (
            ("layer-torch", "layer-torch-deps", "layer-numpy", "builder"),  # cold
            ["venv-base", "runtime-os", "layer-torch", "layer-torch-deps", "layer-numpy", "builder"],
        ),
    ],
)
def test_side_builds_start_only_where_a_layer_is_missing(
    engineless_project: Path, missing: tuple[str, ...], started: list[str]
) -> None:
    _, sides = _render(engineless_project, "cpu-py311", LABELS)
    engine: Any = _Engine({_sha(s) for s in sides if s.cached_by and s.name not in missing})
    assert [s.name for s in buildahead.wanted(engine, sides)] == started
    # each layer is looked up by its part of the lockfile and the project, not by its part alone
    assert all(any(f.startswith("org.opencontainers.image.source=") for f in asked) for asked in engine.api.asked)


class _Engine2:
    """Images with labels and histories, as the engine lists them."""

    def __init__(self, images: list[dict[str, Any]], base_id: str) -> None:
        self.images_ = images
        self.base_id = base_id
        self.api = self

    def inspect_image(self, ref: str) -> dict[str, str]:
        return {"Id": self.base_id}

    def images(self, filters: dict[str, list[str]]) -> list[dict[str, Any]]:
        wanted = dict(f.split("=", 1) for f in filters["label"])
        return [i for i in self.images_ if wanted.items() <= i["Labels"].items()]

    def history(self, image: str) -> list[dict[str, str]]:
        return [{"Id": a} for a in next(i for i in self.images_ if i["Id"] == image)["ancestors"]]


def test_a_stage_image_is_taken_only_from_these_inputs_on_this_base(engineless_project: Path) -> None:
    _, sides = _render(engineless_project, "cpu-py311", LABELS)
    torch = dict(next(s for s in sides if s.name == "layer-torch").cached_by)

    def image(name: str, created: int, ancestors: list[str], **changed: str) -> dict[str, Any]:
        return {"Id": name, "Created": created, "Labels": {**torch, **changed}, "ancestors": [name, *ancestors]}

    on_base = [image("old", 1, ["venv", "base"]), image("new", 2, ["venv", "base"])]
    assert buildahead.substitutes(_Engine2(on_base, "base"), sides, "debian") == {"torch": "new"}  # the newest
    # the same labels over another base (rebuilt or pulled anew under the same name): not taken
    assert buildahead.substitutes(_Engine2(on_base, "another-base"), sides, "debian") == {}
    # made of other inputs (another template, CA bundle, uv or lockfile part): not taken
    other = [image("x", 3, ["base"], **{"io.envbuild.stage-sha256": "0" * 64})]
    assert buildahead.substitutes(_Engine2(other, "base"), sides, "debian") == {}
    # a render without them (no labels: `envbuild render`) takes nothing and asks nothing
    assert (
        buildahead.substitutes(_Engine2(on_base, "base"), _render(engineless_project, "cpu-py311", None)[1], "x") == {}
    )


def test_the_dockerfile_taking_an_image_for_a_stage_keeps_every_other_step(engineless_project: Path) -> None:
    project = open_project(str(engineless_project))
    plan = plan_mod.make(project, load_named(project, "cpu-py311"))
    text = (engineless_project / "lockfiles" / "cpu-py311" / "requirements.lock").read_text()
    pins = lockfile.parse_requirements(text)
    whole = layering.render_for(plan, pins, None, LABELS, "uv", text)[0]["Dockerfile"]
    taking = layering.render_for(plan, pins, None, LABELS, "uv", text, stage_images={"torch": "sha256:" + "a" * 64})
    head, stages = _stages(whole)
    taken_head, taken = _stages(taking[0]["Dockerfile"])
    assert taken_head == head and taken.keys() == stages.keys()
    assert taken["layer-torch"] == [f"FROM sha256:{'a' * 64} AS layer-torch"]
    assert all(taken[s] == stages[s] for s in stages if s != "layer-torch")


def test_the_context_is_packed_into_a_file_with_no_name_that_a_killed_build_cannot_leave(tmp_path: Path) -> None:
    """docker-py packs a context into a NamedTemporaryFile in TMPDIR: a build killed while it ran
    (the e2e suite kills some) left the tar behind, 40-56 MB each here, gigabytes for a CUDA
    context. The archive envbuild sends has no name: nothing is left however the process ends."""
    import os
    import tarfile

    ctx = tmp_path / "context"
    (ctx / "wheels" / "torch").mkdir(parents=True)
    (ctx / "wheels" / "torch" / "torch.whl").write_bytes(b"wheel")
    (ctx / "Dockerfile").write_text("FROM scratch\n")
    (ctx / "requirements.lock").write_text("x==1\n")
    archive = buildahead.context_archive(
        str(ctx), exclude=["wheels/torch"], dockerfile="Dockerfile.taking", replaced="FROM base\n"
    )
    with archive:
        assert os.fstat(archive.fileno()).st_nlink == 0  # no directory entry anywhere
        with tarfile.open(fileobj=archive) as tar:
            names = set(tar.getnames())
            assert {"Dockerfile", "requirements.lock", "Dockerfile.taking"} <= names
            assert not any(n.startswith("wheels/torch/") for n in names)
            member = tar.extractfile("Dockerfile.taking")
            assert member is not None and member.read() == b"FROM base\n"
            # as the docker CLI sends it: no file's owner reaches the builder's cache keys
            assert {(m.uid, m.gid, m.uname, m.gname) for m in tar.getmembers()} == {(0, 0, "", "")}
    whole = buildahead.whole_folder(ctx)
    with whole["fileobj"] as packed, tarfile.open(fileobj=packed) as tar:
        assert "wheels/torch/torch.whl" in tar.getnames()
    assert whole["custom_context"] is True and whole["dockerfile"] == "Dockerfile"
