"""`envbuild images`: this project's images in the engine, which ones are current, and pruning the rest.

Every lock change leaves the previous image behind under its `NAME-<lock sha>` tag, every
failed smoke test leaves an untagged one, and the classic builder keeps each build's builder
stage untagged as its cache (the environment before it is copied out: 1.5 GB for cpu-py311, for
CUDA about as much as its image); over months that is tens of GB per machine. An image belongs
to the project when its source label is the project's. Pruning never touches an image a moving
tag (`NAME`, `NAME-untested`) points to, the current one, the newest build cache of the current
lockfile, one a container uses, or an untagged one while a build of its profile runs (the build
tags its image last).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from envbuild import build as build_mod
from envbuild import engine, enginelost, freshness, layering, localimage, publish, smokerecord, validate, wheelcache
from envbuild import plan as plan_mod
from envbuild.errors import EnvbuildError, ProfileError
from envbuild.names import (
    LABEL_ACCELERATOR,
    LABEL_LAYER,
    LABEL_LAYER_SHA,
    LABEL_LOCK_SHA,
    LABEL_PROFILE,
    LABEL_SMOKE_GPU,
    LABEL_SOURCE,
    LABEL_STAGE,
    Events,
    is_envbuild_tag,
    is_moving,
    lock_names,
    quiet,
)
from envbuild.profile import Profile
from envbuild.project import Project, open_project, same_source, source_label

LOCK_LABEL = LABEL_LOCK_SHA


@dataclass
class ImageRow:
    image_id: str
    profile: str
    stage: str  # runtime (the image) | builder (its build cache)
    tags: list[str]
    created: str
    size: int
    smoke: str  # passed | untested | - (a build cache is not smoke-tested)
    smoke_gpu: str  # a GPU image's passed smoke test's gpu check: pass | skip (no GPU was given) | -
    state: str  # current | stale | orphan | untagged | unknown
    why: str  # what makes it that state, for people
    keep: bool
    reason: str  # why it stays or goes
    removed: bool = False
    # Built FROM an envbuild image, or tagged by hand: it inherits the labels, but it is not one of
    # envbuild's builds, so pruning leaves it and `status` does not report it as the profile's image.
    derived: bool = False

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Survey:
    rows: list[ImageRow]
    freed_bytes: int | None = None  # measured from the engine's disk use, when something was removed
    errors: list[str] = field(default_factory=list)


def classify(
    image_id: str,
    attrs: dict[str, Any],
    expected: dict[str, Profile | ProfileError],
    compare: Callable[[Profile, dict[str, str]], list[str]],
    users: dict[str, list[str]],
    *,
    building: frozenset[str] = frozenset(),
    superseded: frozenset[str] = frozenset(),
    elsewhere: Callable[[str, dict[str, str]], str] = lambda _p, _l: "",
) -> ImageRow:
    """One image's state and whether pruning keeps it. Pure: everything it knows comes in.

    `superseded`: builder-stage images of the current lockfile that a newer build replaced.
    `elsewhere(profile, labels)`: why another checkout needs the image ("" if none does)."""
    labels: dict[str, str] = dict((attrs.get("Config") or {}).get("Labels") or {})
    profile = labels.get(LABEL_PROFILE, "?")
    stage = labels.get(LABEL_STAGE, "runtime")
    tags = [t for t in attrs.get("RepoTags") or [] if t != "<none>:<none>"]
    smoke = smokerecord.state(attrs)  # altered: a record inherited by a derived image, or edited
    row = ImageRow(
        image_id=image_id,
        profile=profile,
        stage=stage,
        tags=sorted(tags),
        # The engine's build time: the created label is SOURCE_DATE_EPOCH, the lockfile's commit time.
        created=str(attrs.get("Created", ""))[:19],
        size=int(attrs.get("Size") or 0),
        smoke="-" if stage == "builder" else smoke,
        smoke_gpu=labels.get(LABEL_SMOKE_GPU, "-")
        if smoke == "passed" and labels.get(LABEL_ACCELERATOR, "cpu") != "cpu"
        else "-",
        state="",
        why="",
        keep=False,
        reason="",
    )
    target = expected.get(profile)
    if target is None:
        row.state, row.why = "orphan", f"no profile {profile} in profiles/"
    elif isinstance(target, ProfileError):
        row.state, row.why = "unknown", f"{profile} does not validate, so currency cannot be told"
    elif stage == "builder":
        # Untagged by nature: what decides is whether the next build would start from it.
        mismatches = compare(target, labels)
        if mismatches:
            row.state, row.why = "stale", f"build cache of another lockfile ({mismatches[0]})"
        elif image_id in superseded:
            row.state, row.why = "stale", "build cache of today's lockfile that a newer build replaced"
        else:
            row.state, row.why = "current", "build cache of today's lockfile: the next build starts from it"
    elif not tags and not attrs.get("RepoDigests"):
        # A pulled or pushed image keeps its registry digest without a tag: that is not a leftover.
        row.state, row.why = "untagged", "a leftover: its smoke test failed, or a rebuild replaced it"
    else:
        mismatches = compare(target, labels)
        row.state, row.why = ("stale", mismatches[0]) if mismatches else ("current", "built from today's lockfile")
    moving = [t for t in row.tags if is_moving(t, profile)]
    foreign = [t for t in row.tags if not is_envbuild_tag(t, profile)]
    row.derived = stage != "builder" and (smoke == "altered" or bool(foreign))
    if image_id in users:
        row.keep, row.reason = True, f"in use by container {', '.join(users[image_id])}"
    elif row.state == "untagged" and profile in building:
        row.keep, row.reason = True, f"a build of {profile} is running (its image is tagged last)"
    elif row.derived:
        row.keep = True
        row.reason = f"not envbuild's: tagged {foreign[0]}" if foreign else "not envbuild's: derived from its image"
    elif row.state in {"current", "unknown"}:
        row.keep, row.reason = True, row.state
    elif row.state in {"stale", "orphan"} and (needed := elsewhere(profile, labels)):
        row.keep, row.reason = True, needed
    elif moving:
        row.keep, row.reason = True, f"tagged {moving[0].rsplit('/', 1)[-1]}"
    else:
        row.reason = "removable"
    return row


def survey(
    project: Project, names: list[str] | None = None, expected: dict[str, Profile | ProfileError] | None = None
) -> tuple[Any, Survey]:
    """The project's envbuild images, newest first, each classified."""
    # Listing and inspecting must answer as soon as the first ping must: an engine that answers the
    # ping and then hangs makes `status` say "unknown" after ENVBUILD_ENGINE_TIMEOUT, not a minute.
    cli = engine.client(timeout=enginelost.ping_timeout())
    source = source_label(project)
    expected = validate.load_all(project, names) if expected is None else expected
    here = _checkout(project, expected)
    users: dict[str, list[str]] = {}
    for c in cli.api.containers(all=True):
        users.setdefault(str(c.get("ImageID", "")), []).append(str((c.get("Names") or ["?"])[0]).lstrip("/"))
    busy = frozenset(n for n in expected if build_mod.building(project, n))
    ours = [
        s
        for s in cli.api.images(filters={"label": LABEL_PROFILE})
        if same_source((s.get("Labels") or {}).get(LABEL_SOURCE, ""), source)
        and (not names or (s.get("Labels") or {}).get(LABEL_PROFILE) in names)
    ]

    def compare(prof: Profile, labels: dict[str, str]) -> list[str]:
        return here.mismatches(prof.name, labels) or []

    @functools.cache
    def others() -> list[Callable[[str, dict[str, str]], str]]:  # asked only of an image that would go
        return _other_checkouts(project, source)

    def elsewhere(profile: str, labels: dict[str, str]) -> str:
        return next((why for needs in others() if (why := needs(profile, labels))), "")

    replaced = _superseded(ours, here.current)
    rows = [
        classify(
            str(s["Id"]),
            cli.api.inspect_image(s["Id"]),
            expected,
            compare,
            users,
            building=busy,
            superseded=replaced,
            elsewhere=elsewhere,
        )
        for s in ours
    ]
    rows.sort(key=lambda r: r.created, reverse=True)
    rows.sort(key=lambda r: r.profile)  # stable: by profile, newest first within one
    cli.api.timeout = 60  # the caller's next calls (removing a 5 GB image) may take longer
    return cli, Survey(rows)


@dataclass(frozen=True)
class _Checkout:
    """What one checkout would build now: each profile's local facts (the final image's labels), and
    its lockfile's sha256 with its layers' digests (the build caches')."""

    root: Path
    facts: dict[str, list[tuple[str, str, str]]]
    current: dict[str, tuple[str, dict[str, str]]]
    invalid: frozenset[str] = frozenset()  # profiles that do not validate there: currency cannot be told

    def mismatches(self, profile: str, labels: dict[str, str]) -> list[str] | None:
        """Why an image of `profile` is not what this checkout would build; None: no such profile here."""
        if profile not in self.facts:
            return None
        if labels.get(LABEL_STAGE) == "builder":
            return _cache_mismatches(labels, *self.current[profile])
        return publish.mismatches(self.facts[profile], labels)

    def needs(self, profile: str, labels: dict[str, str]) -> str:
        """Why this checkout needs an image that is stale or an orphan from another ("" if it does not),
        by the rules `classify` keeps one by: it is current there, or its profile does not validate."""
        if profile in self.invalid:
            return f"unknown in the checkout at {self.root}: {profile} does not validate there"
        return f"current in the checkout at {self.root}" if self.mismatches(profile, labels) == [] else ""


def _checkout(project: Project, expected: dict[str, Profile | ProfileError]) -> _Checkout:
    # The local lockfile's hash, once per profile rather than once per image.
    facts = {n: localimage.local_facts(project, p) for n, p in expected.items() if isinstance(p, Profile)}
    current = {
        n: (next(v for _, label, v in f if label == LOCK_LABEL), _layer_digests(project, expected[n]))
        for n, f in facts.items()
    }
    invalid = frozenset(n for n, p in expected.items() if not isinstance(p, Profile))
    return _Checkout(project.root, facts, current, invalid)


def _other_checkouts(project: Project, source: str) -> list[Callable[[str, dict[str, str]], str]]:
    """`needs` of each other checkout of this repository (same source label) that still exists and
    built with this host's wheel cache, which notes every project that built with it. One that cannot
    be read now (a config broken mid-edit, another user's folder) is left out: its builds look stale
    here."""
    found = []
    for user in wheelcache.other_users(project.lockfiles_dir):
        # the project whose lockfiles folder this is: the root its note names (older notes: a parent)
        for folder in dict.fromkeys([*([user.root] if user.root else []), *list(user.lockfiles.parents)[:3]]):
            try:
                other = open_project(str(folder))
                if other.lockfiles_dir.resolve() != user.lockfiles or not other.profiles_dir.is_dir():
                    continue
                if same_source(source_label(other), source):
                    found.append(_needs_of(other))
            except (EnvbuildError, OSError):
                pass
            break
    return found


def _needs_of(other: Project) -> Callable[[str, dict[str, str]], str]:
    """`_Checkout.needs` of another checkout, which reads only the profiles it is asked about: a prune
    that keeps one of its images does not hash every lockfile it has."""

    @functools.cache
    def read(profile: str) -> _Checkout:
        try:
            return _checkout(other, validate.load_all(other, [profile]))
        except (EnvbuildError, OSError):  # unreadable now: its builds look stale here
            return _Checkout(other.root, {}, {})

    return lambda profile, labels: read(profile).needs(profile, labels)


def _layer_digests(project: Project, prof: Profile | ProfileError) -> dict[str, str]:
    """{layer: sha256 of its part of the local lockfile}, what a current layer stage's cache image
    carries; empty when there is no readable lockfile (no layer cache is then current)."""
    if not isinstance(prof, Profile):
        return {}
    plan = plan_mod.make(project, prof, strict=False)
    primary = freshness.primary_lock(project, plan)
    pylock = primary.with_name(lock_names(plan.platforms[0])[1])
    try:
        built = pylock.read_text("utf-8") if pylock.is_file() else ""  # which packages build from sdists
        return layering.layer_digests(plan, primary.read_text("utf-8"), built)
    except (OSError, UnicodeDecodeError, ValueError, KeyError):
        return {}


def _cache_mismatches(labels: dict[str, str], lock_sha: str, layers: dict[str, str]) -> list[str]:
    """Why a builder-stage image is not a cache of today's lockfile: a layer stage's image is told by
    its layer's part of the lockfile (the same torch layer serves many lockfiles), any other by the
    lockfile's sha256."""
    if LABEL_LAYER_SHA in labels:
        layer = labels.get(LABEL_LAYER, "")
        wanted = layers.get(layer, "(no such layer)")
        return publish.mismatches([(f"{LABEL_LAYER_SHA} of layer {layer}", LABEL_LAYER_SHA, wanted)], labels)
    return publish.mismatches([(LOCK_LABEL, LOCK_LABEL, lock_sha)], labels)


def _superseded(summaries: list[dict[str, Any]], current: dict[str, tuple[str, dict[str, str]]]) -> frozenset[str]:
    """Builder-stage images of a profile's current lockfile (`current`: profile -> its sha256 and
    its layers' digests) but the newest: a `--no-cache` build or a new base leaves the one before
    unused, and only the newest is what the next build starts from."""
    newest: set[tuple[str, str]] = set()
    out = set()
    for s in sorted(summaries, key=lambda s: int(s.get("Created") or 0), reverse=True):
        labels = s.get("Labels") or {}
        profile = labels.get(LABEL_PROFILE, "")
        if labels.get(LABEL_STAGE) != "builder" or profile not in current:
            continue
        if _cache_mismatches(labels, *current[profile]):
            continue
        stage = (profile, labels.get(LABEL_LAYER, ""))  # one cache image per layer's stage is current
        if stage in newest:
            out.add(str(s["Id"]))
        newest.add(stage)
    return frozenset(out)


def _layers_size(cli: Any) -> int:
    return int(cli.df().get("LayersSize") or 0)


def prune(project: Project, names: list[str] | None, *, dry_run: bool, events: Events | None = None) -> Survey:
    """Remove what `classify` marked removable. A refusal from the engine keeps the image and says why."""
    import docker

    say = events or quiet
    cli, result = survey(project, names)
    doomed = [r for r in result.rows if not r.keep]
    if dry_run or not doomed:
        return result
    before = _layers_size(cli)
    for row in doomed:
        say("remove", row.image_id[7:19], ", ".join(row.tags) or "untagged")
        try:
            # By ID with every tag at once: either the image goes or nothing about it changes.
            cli.api.remove_image(row.image_id, force=len(row.tags) > 1, noprune=False)
            row.removed = True
        except docker.errors.ImageNotFound:
            row.removed = True  # went with a child removed just before
        except docker.errors.APIError as exc:
            row.keep, row.reason = True, f"the engine refused: {str(exc.explanation or exc)[:200]}"
            result.errors.append(f"{row.image_id[7:19]}: {row.reason}")
    result.freed_bytes = max(0, before - _layers_size(cli))
    return result
