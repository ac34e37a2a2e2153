"""`envbuild new`: a first profile from its name, chosen from the compat data.

The name already says the accelerator, its version and the Python
(`cu126-py312`). The compat data says which torch releases have that build for
that Python and which numpy they allow. Only the newest patch of each is left,
and only an index knows it: one `uv pip compile --no-deps` asks. The result goes
through the same validation as a hand-written profile before it is written, so
`new` never writes a profile that `validate` would refuse.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from packaging.version import Version

from envbuild import compat, profile, tmpdirs, torchsource, uvtool, validate
from envbuild.errors import ProfileError, UsageError
from envbuild.fsutil import atomic_write_many
from envbuild.names import PYPI_SIMPLE
from envbuild.profilefile import Loaded
from envbuild.project import Project

# When PyPI is out of reach, the lookup is the only thing `new` needs from it.
_LOOKUP_ROUTE = (
    "pass exact releases (--torch X.Y.Z --numpy X.Y.Z) to skip the lookup, or --index-url a PyPI mirror "
    "this machine reaches"
)


_RELEASE_OR_SERIES = re.compile(r"\d+\.\d+(\.\d+)?")


@dataclass(frozen=True)
class Choice:
    """What `new` settled on, and why, before anything is written."""

    parts: profile.NameParts
    torch: str  # exact
    numpy: str  # exact
    notes: list[str] = field(default_factory=list)


def _has_build(row: compat.TorchRelease, parts: profile.NameParts) -> bool:
    if parts.accelerator == "cuda":
        return parts.version in row.cuda_builds
    if parts.accelerator == "rocm":
        return parts.version in row.rocm_builds
    return True


def _build_words(parts: profile.NameParts) -> str:
    return {"cuda": f"a CUDA {parts.version} build", "rocm": f"a ROCm {parts.version} build"}.get(
        parts.accelerator, "a CPU build"
    )


def pick_torch(parts: profile.NameParts) -> tuple[compat.TorchRelease, compat.TorchRelease | None]:
    """The newest release with this build for this Python whose data is verified (else the newest),
    and a newer one whose data is unverified, if there is one."""
    db = compat.load()
    with_build = [r for r in db.torch if _has_build(r, parts)]
    if not with_build:
        known = sorted({b for r in db.torch for b in (r.cuda_builds if parts.accelerator == "cuda" else r.rocm_builds)})
        raise UsageError(
            f"no torch release in envbuild's data has {_build_words(parts)}",
            hint=f"builds it knows: {', '.join(known)}; name the profile after one of them",
        )
    fits = [r for r in with_build if r.python_ok(parts.python)]
    if not fits:
        pythons = sorted({p for r in with_build for p in r.python_versions()}, key=Version)
        first, last = with_build[0].release, with_build[-1].release
        releases = first if first == last else f"{first}-{last}"
        raise UsageError(
            f"no torch release with {_build_words(parts)} ({releases}) supports Python {parts.python}",
            hint=f"those releases support Python {pythons[0]}-{pythons[-1]}: name the profile "
            f"{parts.token}-py{pythons[-1].replace('.', '')} or pick another build",
        )
    newest = max(fits, key=lambda r: Version(r.release))
    verified = [r for r in fits if r.confidence == "verified"]
    if newest.confidence == "verified" or not verified:
        return newest, None
    return max(verified, key=lambda r: Version(r.release)), newest


def pick_numpy(parts: profile.NameParts, torch: str) -> str:
    """The newest numpy series with wheels for this Python that this torch allows."""
    fits = compat.load().numpy_series(parts.python, torch)
    if not fits:
        raise UsageError(
            f"envbuild's data has no numpy release for Python {parts.python} that torch {torch} allows",
            hint="pass --numpy X.Y.Z",
        )
    return fits[-1]


def _parts(name: str) -> profile.NameParts:
    parts = profile.name_parts(name)
    threaded = re.search(r"-py3(\d{1,2})t(?=-|$)", name)
    if parts is None and threaded:
        raise UsageError(
            f"{name!r} asks for free-threaded Python 3.{threaded[1]}t (PEP 703), which envbuild does not build",
            hint=f"name the standard interpreter: envbuild new {name.replace(threaded[0], threaded[0][:-1])}",
        )
    if parts is None:
        raise UsageError(
            f"{name!r} does not say what to build",
            hint="name it <accelerator>-py<XY>[-suffix]: cpu-py312, cu126-py312, rocm63-py312-dev",
        )
    if parts.accelerator == "rocm" and parts.version:
        return replace(parts, version=compat.load().rocm_named(parts.version))
    return parts


def choose(
    name: str,
    *,
    torch: str | None,
    numpy: str | None,
    index_url: str | None,
    before_lookup: Callable[[Choice], None] = lambda _: None,
) -> Choice:
    """Decide the torch and numpy releases for a new profile called `name`. `before_lookup` sees the
    choice with each series as its .0 release before an index is asked for the newest patches."""
    parts = _parts(name)
    for option, value in (("--torch", torch), ("--numpy", numpy)):
        if value is not None and not _RELEASE_OR_SERIES.fullmatch(value):
            raise UsageError(f"{option} {value!r}: expected a release (2.9.1) or a series (2.9)")
    notes: list[str] = []
    if torch:
        series = torch
    else:
        chosen, unverified = pick_torch(parts)
        series = chosen.release
        if unverified is not None:
            notes.append(
                f"torch {unverified.release} also has {_build_words(parts)} for Python {parts.python}, but "
                f"envbuild's data for it is unverified; pass --torch {unverified.release} to take it anyway"
            )
    numpy_series = numpy if numpy else pick_numpy(parts, series)
    wanted = {
        pkg: value
        for pkg, value in (("torch", series), ("numpy", numpy_series))
        if not profile.RELEASE_RE.fullmatch(value)
    }
    found: dict[str, str] = {}
    if wanted:
        # the compat data judges a series as well as its patches: `--torch 2.1` for Python 3.12 is
        # refused by the rule that names the fix, not by the resolver finding no cp312 wheel of 2.1.x
        before_lookup(Choice(parts, _release(series), _release(numpy_series), notes))
        found = uvtool.newest_versions(
            [f"{pkg}=={value}.*" for pkg, value in wanted.items()],
            parts.python,
            index_url=index_url or PYPI_SIMPLE,
            route=_LOOKUP_ROUTE,
        )
    exact = {pkg: found.get(pkg, value) for pkg, value in (("torch", series), ("numpy", numpy_series))}
    return Choice(parts, exact["torch"], exact["numpy"], notes)


def profile_text(name: str, choice: Choice, base: str | None = None) -> str:
    """The profile file: the fields `new` decided, and the common optional ones commented out."""
    parts = choice.parts
    row = compat.load().release(choice.torch)
    what = {"cuda": f"CUDA {parts.version}", "rocm": f"ROCm {parts.version}"}.get(parts.accelerator, "CPU")
    # Versions and what the user passed are JSON strings, which YAML reads as double-quoted
    # scalars: "3.10" stays a string, and no --base value can end the line and start a field.
    quoted = [
        *([(parts.accelerator, parts.version)] if parts.version else []),
        ("python", parts.python),
        ("torch", choice.torch),
        ("numpy", choice.numpy),
        *([("base", base)] if base else []),
    ]
    return (
        f"# Written by `envbuild new {name}` from envbuild's compat data; edit freely,\n"
        f"# `envbuild validate {name}` checks it.\n"
        f"name: {name}\n"
        f"description: {what} build of torch {row.release if row else choice.torch}, Python {parts.python}\n"
        f"accelerator: {parts.accelerator}\n"
        + "".join(f"{key}: {json.dumps(value)}\n" for key, value in quoted)
        + "# torchvision: auto          # the release that pairs with torch\n"
        "# torchaudio: auto\n"
        '# packages: ["einops==0.8.1"]\n'
        '# apt: ["git"]\n'
    )


def derived_text(name: str, parent: profile.Profile, base: str | None = None) -> str:
    """A profile that `extends` another: its torch, numpy and settings, and at the first lock its pins."""
    example = json.dumps([*parent.packages, "tqdm==4.67.1"])
    return (
        f"# Written by `envbuild new {name} --extends {parent.name}`: {parent.name}'s torch, numpy and\n"
        f"# settings; its locks keep {parent.name}'s versions, and follow its re-locks.\n"
        f"# `envbuild validate {name}` checks it.\n"
        f"name: {name}\n"
        f"extends: {parent.name}\n"
        f"description: {parent.name} with packages of its own\n"
        + (f"base: {json.dumps(base)}\n" if base else "")
        + f"# packages replaces {parent.name}'s list: keep its entries and add yours\n"
        f"# packages: {example}\n"
    )


def _parent(project: Project, name: str, parent: str) -> profile.Profile:
    """The profile `new NAME --extends PARENT` derives from: it must exist and validate."""
    path = project.profiles_dir / f"{parent}.yaml"
    if parent == name or not path.is_file():
        close = difflib.get_close_matches(parent, [n for n in project.profile_names() if n != name], n=2)
        raise UsageError(
            f"--extends {parent}: {'a profile cannot extend itself' if parent == name else 'no such profile'}",
            hint=f"did you mean --extends {' or '.join(close)}?" if close else "name a profile of `envbuild list`",
        )
    return validate.load_valid(path, project.rel(path), project.root)  # an invalid one cannot be derived from


def _derivable(project: Project, name: str) -> str | None:
    """The profile a suffixed name reads as a variant of (`cpu-py311-hf`: cpu-py311), when it exists."""
    parts = name.split("-")
    names = set(project.profile_names())
    return next((c for i in range(len(parts) - 1, 1, -1) if (c := "-".join(parts[:i])) in names), None)


@dataclass(frozen=True)
class Created:
    path: Path
    text: str
    choice: Choice
    warnings: list[str]  # what `validate` warns about the written profile
    notes: list[str]  # why this torch, and where it comes from


def _release(version: str) -> str:
    return version if profile.RELEASE_RE.fullmatch(version) else f"{version}.0"


def _checked(project: Project, name: str, text: str, *, extends: str | None) -> Loaded:
    """`text` validated as profiles/NAME.yaml would be; a ProfileError (nothing written) if invalid."""
    shown = project.rel(project.profiles_dir / f"{name}.yaml")
    with tmpdirs.private("new") as tmp:
        trial = Path(tmp) / f"{name}.yaml"
        for other in project.profiles_dir.glob("*.yaml") if extends else ():
            (Path(tmp) / other.name).write_bytes(other.read_bytes())  # what `extends` reads, beside it
        trial.write_text(text, encoding="utf-8")
        # named for what it is: a file:line the user cannot open would send them looking for it
        loaded = validate.check(trial, f"envbuild new {name}", project.root)
    if loaded.errors:
        instead = (
            "extend a profile of the build and Python its name says"
            if extends
            else "choose with --torch / --numpy / --base"
        )
        raise ProfileError(
            f"envbuild new {name}: the chosen combination is invalid; {shown} was not written",
            [replace(d, line=None) for d in loaded.diagnostics],
            hint=f"nothing was written; {instead}, or write {shown} by hand",
        )
    return loaded


def create(
    project: Project,
    name: str,
    *,
    torch: str | None = None,
    numpy: str | None = None,
    index_url: str | None = None,
    base: str | None = None,
    force: bool = False,
    extends: str | None = None,
) -> Created:
    """Choose, validate, then write profiles/NAME.yaml; nothing is written unless it validates.
    `extends`: derive it from that profile instead of choosing from the compat data."""
    target = project.profiles_dir / f"{name}.yaml"
    shown = project.rel(target)
    if target.exists() and not force:
        raise UsageError(
            f"{shown} exists", hint=f"pass --force to replace it, or edit it and run `envbuild validate {name}`"
        )
    if extends is not None:
        if torch or numpy:
            raise UsageError(
                f"--extends {extends} takes torch and numpy from {extends}",
                hint="drop --torch / --numpy, or set them in the new file after it is written",
            )
        parent = _parent(project, name, extends)
        lock_note = f"`envbuild lock {name}` keeps {extends}'s versions where they fit, and follows its re-locks"
        choice = Choice(_parts(name), parent.torch, parent.numpy, [f"{extends}'s torch and numpy; {lock_note}"])
        text = derived_text(name, parent, base)
    else:

        def check_series(trial: Choice) -> None:
            _checked(project, name, profile_text(name, trial, base), extends=None)

        choice = choose(
            name, torch=torch, numpy=numpy, index_url=index_url or project.config.index_url, before_lookup=check_series
        )
        text = profile_text(name, choice, base)
        like = _derivable(project, name)
        if like:
            choice.notes.append(
                f"{like} is a profile here: `envbuild new {name} --extends {like} --force` derives this one from it "
                f"instead (its torch, numpy and settings, and its versions at the first lock)"
            )
    loaded = _checked(project, name, text, extends=extends)
    files = {target: text}
    ignore = project.root / ".gitignore"
    entry = f"/{project.config.build_dir.strip('/')}/"
    existing = ignore.read_text("utf-8") if ignore.is_file() else ""
    if entry not in existing.splitlines() and f"{project.config.build_dir.strip('/')}/" not in existing.splitlines():
        # build contexts hold hard links of the torch wheel (~180 MB+): `git add .` must not take them
        sep = "" if not existing or existing.endswith("\n") else "\n"
        files[ignore] = f"{existing}{sep}# envbuild's build folder (contexts, logs, reports)\n{entry}\n"
    atomic_write_many(files)
    from envbuild import lock  # its resolver's modules: only once the profile is written

    if loaded.profile is not None:  # the file just written, as validated: the lock's first call starts early
        lock.prepare_next(project, loaded.profile)
    warnings = [d.render() for d in loaded.warnings]
    return Created(target, text, choice, warnings, [*choice.notes, *_source_notes(loaded.profile, project)])


def _source_notes(prof: profile.Profile, project: Project) -> list[str]:
    """Where the torch family will come from, when it is not PyPI: that index must be reachable to lock."""
    src = torchsource.torch_source(prof, index_url=project.config.index_url, torch_index=project.config.torch_index)
    if src.route == "pypi":
        return []
    row = compat.load().release(prof.torch)
    pypi = f" (PyPI's default {row.release} wheel is the CUDA {row.pypi_cuda} build)" if row else ""
    return [f"torch {prof.torch} comes from {src.torch_index}{pypi}: `envbuild lock` needs to reach it"]
