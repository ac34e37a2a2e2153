"""Locking a venv profile with uv: both lockfiles per platform, checked, with canonical sources."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from urllib.parse import quote

from envbuild import buildreqs, freshness, lockahead, lockfile, lockverify, proc, render, tmpdirs, uvtool
from envbuild.errors import LockError
from envbuild.freshness import Freshness, LockSnapshot, lock_dir
from envbuild.fsutil import atomic_write_many
from envbuild.lockfile import Pin
from envbuild.lockopts import LockOptions, LockOutcome
from envbuild.names import PLATFORM_TAGS, PYPI_SIMPLE, TORCH_FAMILY_RE, lock_names
from envbuild.plan import Plan
from envbuild.project import Project
from envbuild.refs import redact
from envbuild.torchsource import TorchSource


def _compile_args(
    input_file: Path, output: Path, plan: Plan, platform: str, opts: LockOptions, *, builds: bool = True
) -> list[str]:
    src = plan.source
    args = [
        "pip",
        "compile",
        str(input_file),
        "-o",
        str(output),
        "--python-version",
        plan.profile.python,
        "--python-platform",
        PLATFORM_TAGS[platform],
        "--generate-hashes",
        "--emit-index-annotation",
        "--no-header",
        "--no-config",
        # The target Python is only a resolution setting: never fetch an interpreter for it.
        "--no-python-downloads",
        *uvtool.interpreter(plan.profile.python, builds=builds),
        "--index-url",
        src.index_url,
        "--quiet",
    ]
    for link in src.find_links:
        args += ["--find-links", link]
    if plan.profile.build_requires:  # beside the input: the early resolve (lockahead) copies it too
        config = input_file.parent / buildreqs.CONFIG_FILE
        config.write_text(buildreqs.config(buildreqs.for_lock(plan)), "utf-8")
        args += ["--config-file", str(config)]
        for page in buildreqs.index_pages(plan):
            args += ["--find-links", page]
    if opts.upgrade:
        args.append("--upgrade")
    for pkg in opts.upgrade_packages:
        args += ["--upgrade-package", pkg]
    if opts.offline:
        args.append("--offline")
    return args


def _pylock_args(input_file: Path, output: Path, plan: Plan, platform: str, *, from_cache: bool) -> list[str]:
    """The pylock.toml pass from exact pins: from uv's cache, where nothing can be built, or (when
    the cache lacked something) from the network, where an sdist may be."""
    opts = LockOptions(offline=from_cache)
    args = _compile_args(input_file, output, plan, platform, opts, builds=not from_cache)
    args[args.index("--generate-hashes")] = "--format=pylock.toml"
    args.remove("--emit-index-annotation")
    return args


def _lock_input(plan: Plan, requirements: list[str], family: list[str]) -> str:
    return render.render_one(
        plan, "lock-input.toml.j2", overrides={"requirements": requirements, "torch_family_names": family}
    )


def _uv(args: list[str], work: Path) -> None:
    uvtool.run(args, error=LockError, cwd=work)


def _pylock_source(plan: Plan, pins: dict[str, Pin], work: Path) -> TorchSource:
    """Where the pylock.toml pass reads the pins from: the plan's source, with every local wheelhouse
    (`--find-links DIR`, or the torch index given as a folder) replaced by one page that lists, with
    its sha256, the file of it each pin came from. uv takes the hash from the page instead of reading
    the file again: a 183 MB torch wheel costs it a third of a second per pass. The resolve just
    hashed these files, so the pin's single hash is the file's. The plan's source as it is when
    there is no local wheelhouse, or a pin cannot be matched to exactly one file."""
    from packaging.utils import InvalidWheelFilename, canonicalize_version, parse_wheel_filename

    src = plan.source
    local_index = _local_folder(src.torch_index) if src.torch_index and src.torch_index_flat else None
    folders = [f for f in (*map(_local_folder, src.find_links), local_index) if f is not None]
    rows: set[str] = set()
    for folder in folders:
        uri = folder.as_uri()
        wheels: dict[tuple[str, str], list[Path]] = {}
        for path in folder.glob("*.whl"):
            try:
                name, version, _, _ = parse_wheel_filename(path.name)
            except InvalidWheelFilename:
                continue
            wheels.setdefault((str(name), canonicalize_version(version)), []).append(path)
        for pin in pins.values():
            if pin.source.rstrip("/") != uri:
                continue
            found = wheels.get((pin.name, canonicalize_version(pin.version)), [])
            if len(found) != 1 or len(pin.hashes) != 1 or not pin.hashes[0].startswith("sha256:"):
                return src
            rows.add(f'<a href="{found[0].as_uri()}#{pin.hashes[0].replace(":", "=", 1)}">{found[0].name}</a>')
    if not rows:
        return src
    page = work / "wheelhouse.html"
    page.write_text("<html><body>\n" + "\n".join(sorted(rows)) + "\n</body></html>\n", "utf-8")
    links = (*(link for link in src.find_links if _local_folder(link) is None), page.as_uri())
    return dataclasses.replace(src, find_links=links, torch_index=page.as_uri() if local_index else src.torch_index)


def _local_folder(link: str) -> Path | None:
    """The folder a find-links entry or flat index names on this machine; None for a URL."""
    if "://" in link and not link.startswith("file://"):
        return None
    folder = Path(link.removeprefix("file://")).resolve()
    return folder if folder.is_dir() else None


def _same_pylock(plan: Plan, pins: dict[str, Pin], family: list[str], before: LockSnapshot | None) -> str | None:
    """The current pylock.toml's body when the new resolution is the one it was written for (every
    version and every hash the same, the torch family from the same route and index): the same
    files from the same places, so uv need not be asked again. A re-lock that changes nothing, the
    most common one, then costs one uv call."""
    if before is None or not before.pylock_text or family != list(plan.torch_family):
        return None
    record = before.record
    same_place = (record.route, record.index) == (plan.source.route, plan.source.canonical_index)
    if not same_place or record.resolution != lockfile.resolution_id(pins):
        return None
    return lockfile.body(before.pylock_text)


def _first_call(
    plan: Plan, platform: str, opts: LockOptions, previous: Path | None, work: Path, parent: Path | None
) -> tuple[list[str], dict[str, Path], Path, Path]:
    """The resolve's uv call, with its input (and the pins it keeps) written into `work`: (the
    arguments, the files of `work` copied from a lockfile, the input, the output)."""
    out = work / f"requirements-{platform}.txt"
    seeds = {}
    kept = [p for p in (previous, parent) if p is not None and p.is_file()] if not opts.upgrade else []
    if kept:
        # uv keeps the pins already in the output file: a re-lock changes only what must change.
        texts = [freshness.read_previous(p) for p in kept]
        seed = lockfile.preferences(*texts)
        out.write_text(seed, "utf-8")
        if seed == texts[0]:
            seeds[out.name] = kept[0]
    pyproject = work / "pyproject.toml"
    pyproject.write_text(_lock_input(plan, list(plan.requirements), list(plan.torch_family)), "utf-8")
    return _compile_args(pyproject, out, plan, platform, opts), seeds, pyproject, out


def record_next_lock(project: Project, plan: Plan, argv: list[str]) -> None:
    """Record, for `lockahead`, the resolve that `argv` (`lock NAME`, or `lock NAME --upgrade`,
    with the plan's options) will make in this folder, so that it starts before that command's CLI
    has loaded. Worked out by the same code as the lock's own call, from the same inputs."""
    platform = plan.platforms[0]
    own = lock_dir(project, plan.name) / lock_names(platform)[0]
    theirs, _ = _pins_to_keep(project, plan, own)
    opts = LockOptions(upgrade="--upgrade" in argv)
    with tmpdirs.private("lock") as tmp:
        args, seeds, _, _ = _first_call(plan, platform, opts, own, Path(tmp), theirs)
        lockahead.record_next(argv, args, Path(tmp), seeds, own)


def _resolve_platform(
    plan: Plan,
    platform: str,
    opts: LockOptions,
    previous: Path | None,
    work: Path,
    before: LockSnapshot | None = None,
    *,
    parent: Path | None = None,
) -> tuple[dict[str, Pin], str, str]:
    """Resolve one platform: (pins, requirements text, pylock text). Without --upgrade, uv keeps the
    pins of `previous` (the profile's own lockfile) and of `parent` (that of the profile it extends),
    the parent's where the two differ."""
    src = plan.source
    reqs = list(plan.requirements)
    family = list(plan.torch_family)
    args, seeds, pyproject, out = _first_call(plan, platform, opts, previous, work, parent)
    upgrading = dataclasses.replace(opts, upgrade=True)
    lockahead.remember(args, work, seeds, lambda: _compile_args(pyproject, out, plan, platform, upgrading), out)
    if not uvtool.ran_early(args, error=LockError, cwd=work):
        _uv(args, work)
    pins = lockfile.parse_requirements(out.read_text("utf-8"))
    if src.route == "index" and not src.torch_index_flat:
        # The GPU runtime wheels that torch pulls in belong to the torch family too: pin them to
        # the same index and resolve again, so nothing of the build comes from elsewhere.
        extra = sorted(n for n in pins if TORCH_FAMILY_RE.fullmatch(n) and n not in family)
        if extra:
            family = sorted({*family, *extra})
            pyproject.write_text(_lock_input(plan, reqs, family), "utf-8")
            _uv(_compile_args(pyproject, out, plan, platform, opts), work)
            pins = lockfile.parse_requirements(out.read_text("utf-8"))
    lockverify.verify(plan.profile, pins, src, platform)
    absent = buildreqs.missing(plan.profile, {n: p.version for n, p in pins.items()})
    if absent:
        raise LockError(
            f"{plan.name}: build_requires names {', '.join(absent)}, which the lock does not pin: the builds it "
            "names would get a version nothing records",
            hint=f"add {' and '.join(absent)} to `packages` with a pin (or drop them from build_requires)",
        )
    same = _same_pylock(plan, pins, family, before)
    if same is not None:
        return pins, out.read_text("utf-8"), same
    # pylock.toml from the exact pins, through the same routing, so both files say the same.
    exact = [f"{p.name}=={p.version}" for p in sorted(pins.values(), key=lambda p: p.name)]
    plan = dataclasses.replace(plan, source=_pylock_source(plan, pins, work))
    pyproject.write_text(_lock_input(plan, exact, family), "utf-8")
    pylock = work / f"pylock.{platform.replace('_', '')}.toml"
    try:
        # The resolve above just fetched every index page and built every sdist's metadata this
        # pass reads: from uv's cache it takes a few hundredths of a second, and builds nothing.
        _uv(_pylock_args(pyproject, pylock, plan, platform, from_cache=True), work)
    except LockError:
        if opts.offline:
            raise
        _uv(_pylock_args(pyproject, pylock, plan, platform, from_cache=False), work)
    return pins, out.read_text("utf-8"), pylock.read_text("utf-8")


def _places(src: TorchSource) -> list[tuple[str, str]]:
    """(where an artifact was fetched from today, the canonical index to record instead)."""
    torch_places = [src.torch_index or "", *src.find_links]
    out = [(p.rstrip("/"), src.canonical_index) for p in torch_places if p]
    for link in src.find_links:
        if "://" not in link:
            out.append((Path(link).resolve().as_uri(), src.canonical_index))
    if src.index_url.rstrip("/") != PYPI_SIMPLE:
        out.append((src.index_url.rstrip("/"), PYPI_SIMPLE))
    return sorted(set(out), key=lambda p: -len(p[0]))  # the longest (most specific) first


def canonical_sources(text: str, src: TorchSource) -> str:
    """The lockfile text with each artifact's source as its canonical index: a wheelhouse or mirror
    said where it was fetched from on the machine that locked, which no other machine shares."""
    places = _places(src)

    def annotation(m: re.Match[str]) -> str:
        where = m.group(2).rstrip("/")
        for local, canonical in places:
            if where == local:
                return f"{m.group(1)}{canonical}"
        return m.group(0)

    def wheel_url(m: re.Match[str]) -> str:
        url = m.group(1)
        for local, canonical in places:
            if url.startswith(local + "/") and canonical != PYPI_SIMPLE:
                return f'url = "{canonical}/{quote(url.rsplit("/", 1)[1].replace("%2B", "+"))}"'
        return m.group(0)

    text = re.sub(r"^(\s+# from )(\S+)$", annotation, text, flags=re.M)
    return re.sub(r'url = "(file://[^"]+\.whl)"', wheel_url, text)


def _pins_to_keep(project: Project, plan: Plan, own: Path) -> tuple[Path | None, str]:
    """(the lockfile of the nearest profile it extends that is locked, "PROFILE@RESOLUTION" of it):
    a variant's lock keeps those pins where they fit, over its own. (None, "") for a profile that
    extends no locked one. What the two share then has the same versions, and the parent's image
    layers; resolved afresh, a variant took whatever PyPI released since (its torch-deps layer,
    36 MB, differed), and a re-lock of the parent left it on the old versions."""
    follows = freshness.followed(project, plan.name, own.name)
    if not follows:
        return None, ""
    return lock_dir(project, lockfile.followed_profile(follows)) / own.name, follows


def lock(project: Project, plan: Plan, opts: LockOptions, found: Freshness | None = None) -> LockOutcome:
    """Lock a venv profile; `found`: the current lockfiles' freshness, when the caller has it."""
    src = plan.source
    files: dict[Path, str] = {}
    directory = lock_dir(project, plan.name)
    count = 0
    from_source: set[str] = set()
    before: dict[str, dict[str, Pin]] = {}
    after: dict[str, dict[str, Pin]] = {}
    merged: list[str] = []  # lockfiles with a merge's conflict markers: re-locked from their first side
    kept_from: str | None = None  # a profile this one extends, whose pins a first lock started from
    with tmpdirs.private("lock") as tmp:
        for platform in plan.platforms:
            primary, secondary = lock_names(platform)
            if (directory / primary).is_file():
                text = freshness.read_previous(directory / primary)
                if lockfile.conflicted(text):
                    merged.append(primary)
                    text = lockfile.first_side(text)
                before[platform] = lockfile.parse_requirements(text)
            current = found.snapshots.get(platform) if found is not None else None
            theirs, follows = _pins_to_keep(project, plan, directory / primary)
            if follows and not opts.upgrade:
                kept_from = lockfile.followed_profile(follows)
            pins, req_text, pylock_text = _resolve_platform(
                plan, platform, opts, directory / primary, Path(tmp), current, parent=theirs
            )
            after[platform] = pins
            record = lockfile.new_record(
                profile=plan.name,
                python=plan.profile.python,
                platform=platform,
                build=plan.profile.build_tag,
                route=src.route,
                index=src.canonical_index,
                input_digest=plan.input_digest,
                resolution=lockfile.resolution_id(pins),
                follows=follows,
            )
            head = record.header(f"envbuild lock {plan.name} --upgrade")
            # Secondary first, primary last: the primary's rename is what makes the lock current.
            files[directory / secondary] = head + redact(canonical_sources(pylock_text, src))
            files[directory / primary] = head + redact(canonical_sources(req_text, src))
            count = max(count, len(pins))
            from_source |= lockfile.sdist_only(pylock_text)
    proc.check_cancelled()  # an interrupt during the last resolve: write nothing
    written = [] if opts.dry_run else atomic_write_many(files)
    return LockOutcome(
        plan.name,
        "locked",
        f"{count} packages"
        + (f" ({', '.join(sorted(from_source))}: no wheel, built from the sdist)" if from_source else "")
        + (f"; {', '.join(merged)} had merge conflicts: re-locked from their first side (`<<<<<<<`)" if merged else "")
        + (f"; {kept_from}'s versions kept where they fit (it extends {kept_from})" if kept_from else "")
        + (" (dry run: nothing written)" if opts.dry_run else ""),
        packages=count,
        files=written,
        changes=lockfile.changes(before, after) if before or opts.dry_run else None,
    )
