"""Check: the environment is the one the image was built with. Every file under the venv is hashed
and compared with the manifest the build wrote; a changed, added or removed file fails the check
and is named with the distribution it belongs to."""

from __future__ import annotations

import contextlib
import importlib.machinery
import importlib.util
import json
import os
import sys
import sysconfig
from importlib import metadata
from typing import Any, NamedTuple

from . import oslibs
from .core import WORKDIR_ENV, CheckFailed, Context, Result, Skip, _canon, extension_module, shortlist
from .manifest import DIGEST, MANIFEST, digest, interpreter, os_packages, scan
from .records import unlike_record
from .versions import locked_pins, moved_remedy


def _owners(root: str) -> dict[str, str]:
    """{file relative to root: distribution} from each distribution's RECORD (byte code too)."""
    owners: dict[str, str] = {}
    for dist in metadata.distributions(path=[sysconfig.get_paths()["purelib"]]):
        name = _canon(dist.metadata["Name"] or "?")
        for f in dist.files or []:
            full = os.path.realpath(str(dist.locate_file(f)))
            rel = os.path.relpath(full, os.path.realpath(root))
            owners[rel] = name
    return owners


def _owner(rel: str, owners: dict[str, str]) -> str:
    if rel in owners:
        return owners[rel]
    folder, name = os.path.split(rel)
    if os.path.basename(folder) == "__pycache__":  # x.cpython-311.pyc belongs to the owner of x.py
        source = os.path.join(os.path.dirname(folder), name.split(".", 1)[0] + ".py")
        if source in owners:
            return owners[source]
    return "(no distribution)"


def _by_owner(paths: list[str], owners: dict[str, str]) -> dict[str, list[str]]:
    grouped: dict[str, list[str]] = {}
    for rel in sorted(paths):
        grouped.setdefault(_owner(rel, owners), []).append(rel)
    return grouped


def _say(kind: str, grouped: dict[str, list[str]]) -> str:
    return "; ".join(
        f"{dist}: {len(files)} file(s) {kind} ({shortlist(files)})" for dist, files in sorted(grouped.items())
    )


def _top_level(dist: metadata.Distribution) -> set[str]:
    """The names a distribution is imported by: top_level.txt, else the first parts of its files."""
    listed = dist.read_text("top_level.txt")
    if listed:
        return {n.strip() for n in listed.splitlines() if n.strip().isidentifier()}
    names = set()
    for f in dist.files or []:
        first = f.parts[0]
        if len(f.parts) == 1:
            first = first[:-3] if first.endswith(".py") else first.split(".")[0] if first.endswith(".so") else ""
        if first.isidentifier() and first != "__pycache__":
            names.add(first)
    return names


class Shadowed(NamedTuple):
    modules: list[str]  # "MODULE (DIST) from PATH[ (why)]"
    libraries: list[tuple[str, str]]  # (the name the loader looked for, the path it took)
    in_cwd: bool  # some module comes from the caller's folder (--local)
    in_workdir: bool  # some module comes from the image's WORKDIR


def _shadowed(ctx: Context) -> Shadowed:
    """Locked packages that import from somewhere else than the environment: a PYTHONPATH (a
    derived image's ENV, `-e` at run time) or a sys.path hook puts another copy first, and every
    other check would then have tested that copy, whose files the manifest does not cover."""
    paths = sysconfig.get_paths()
    homes = {os.path.realpath(paths[k]) for k in ("purelib", "platlib")}
    # the standard library before site-packages is Python's own order, not a change to the image
    # (an old backport's `typing`, a wheel's stray top-level `test`); the base-Python check covers it
    ours = homes | {os.path.realpath(paths[k]) for k in ("stdlib", "platstdlib")}
    locked = set(locked_pins(ctx))
    # The image's WORKDIR: the smoke test runs elsewhere, but `python train.py` and `python -m`
    # there put it first on sys.path, so a `numpy.py` or a vendored `einops/` in it is what a
    # user's code imports (the host passes it; an image without one starts in /, left out)
    workdir = os.environ.get(WORKDIR_ENV, "")
    if workdir and _inside(os.path.realpath(workdir), ours):
        workdir = ""  # already on the path the check above follows
    # `--local` runs with -m in the caller's folder, which Python puts first as a script would
    here = os.path.realpath(os.getcwd())
    here_first = ctx.local and here in {os.path.realpath(p or ".") for p in sys.path[:1]}
    found: list[str] = []
    in_cwd = in_workdir = False
    libraries: set[str] = set()
    for dist in metadata.distributions(path=sorted(homes)):
        name = _canon(dist.metadata["Name"] or "?")
        if name not in locked:
            continue  # a derived image's own (an editable install, say) may live where it likes
        libraries.update(os.path.realpath(str(dist.locate_file(f))) for f in dist.files or [] if ".so" in f.name)
        for module in sorted(_top_level(dist)):
            where = _origin(module, None)
            if where and not _inside(where, ours):
                cwd = here_first and _inside(where, {here})
                in_cwd |= cwd
                found.append(f"{module} ({name}) from {where}" + (f" (the current folder {here})" if cwd else ""))
            elif workdir and (where := _origin(module, [workdir])):
                in_workdir = True
                found.append(f"{module} ({name}) from {where} (the image's WORKDIR {workdir})")
    return Shadowed(found, _libraries_elsewhere(libraries, homes, "torch" in locked), in_cwd, in_workdir)


def _named(libraries: list[tuple[str, str]]) -> list[str]:
    return [f"{name} from {path}" for name, path in libraries]


def _libraries_elsewhere(shipped: set[str], homes: set[str], torch: bool) -> list[tuple[str, str]]:
    """Shared libraries a locked wheel ships (`shipped`: their resolved paths) that this process
    mapped from another folder: an LD_LIBRARY_PATH (a CUDA toolkit's lib64, a derived image's ENV)
    beats torch's RUNPATH, so a libc10.so or libcudnn.so.9 there is what runs. Read after torch's
    import, which loads its own."""
    if torch:  # versions names an unimportable torch; here only what did load counts
        with contextlib.suppress(Exception):
            import torch as _  # noqa: F401
    mapped = oslibs.mapped_files()
    # by name, each file resolved: a conda env's torch/lib links into its lib/, which is no copy.
    # Not Python's extension modules, loaded by path: pyarrow's _json.cpython-311-*.so and the
    # standard library's are two modules (that pair failed every image with pyarrow in it).
    names = {os.path.basename(p) for p in shipped if not extension_module(os.path.basename(p))}
    elsewhere = {
        os.path.realpath(path): path
        for path in mapped
        if path.startswith("/") and os.path.realpath(path) not in shipped and not _inside(os.path.realpath(path), homes)
    }
    found = {(os.path.basename(path), path) for path in elsewhere.values() if os.path.basename(path) in names}
    # The maps name the file a link led to: an OS's or a CUDA toolkit's libgomp.so.1 or
    # libcudnn.so.9 is a link to libgomp.so.1.0.0 or libcudnn.so.9.1.0, so by that name alone
    # it was never seen. The loader found it by the wheel's name, in that file's folder.
    for folder in {os.path.dirname(path) for path in elsewhere.values()}:
        for name in names:
            candidate = os.path.join(folder, name)
            if os.path.islink(candidate) and os.path.realpath(candidate) in elsewhere:  # one lstat first
                found.add((name, candidate))
    return sorted(found)


def _find_spec(module: str) -> importlib.machinery.ModuleSpec | None:
    """importlib.util.find_spec of a top-level module, asking every finder on sys.meta_path (a
    derived image's editable install is one) but setuptools' distutils shim. Asked for `pip`, that
    one stops serving setuptools' distutils for the rest of the process (pypa/pip#8761; Python
    <= 3.11): where the OS Python has no distutils of its own (Debian's python3.11 has none), every
    later check that imports it failed, torch.compile's too, in an image whose lockfile pins pip."""
    if module in sys.modules or "." in module:
        return importlib.util.find_spec(module)  # the module's own spec: no finder is asked
    for finder in sys.meta_path:
        if type(finder).__module__ == "_distutils_hack":
            continue
        find = getattr(finder, "find_spec", None)
        spec: importlib.machinery.ModuleSpec | None = find(module, None) if find is not None else None
        if spec is not None:
            return spec
    return None


def _origin(module: str, path: list[str] | None) -> str:
    """Where `module` would be imported from (on sys.path, or on `path` alone), resolved; "" when
    nowhere, or only as a namespace folder, which a regular package later on the path beats."""
    try:
        spec = _find_spec(module) if path is None else importlib.machinery.PathFinder.find_spec(module, path)
    except (ImportError, ValueError):
        return ""
    if spec is None:
        return ""
    if spec.has_location and spec.origin:
        return os.path.realpath(spec.origin)
    folders = list(spec.submodule_search_locations or []) if path is None else []
    return os.path.realpath(folders[0]) if folders else ""


def _inside(where: str, homes: set[str]) -> bool:
    return any(where == h or where.startswith(h + os.sep) for h in homes)


def _outside(what: str, found: list[str], variable: str, value: str) -> str:
    return f"{what} from outside the environment: {shortlist(found, '; ')}" + (
        f" ({variable}={value} comes first)" if value else ""
    )


def _fail_if_shadowed(ctx: Context) -> None:
    shadowed = _shadowed(ctx)
    modules, libraries = shadowed.modules, shadowed.libraries
    if not (modules or libraries):
        return
    own = os.path.realpath(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the smoke test's
    path = os.pathsep.join(
        p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and os.path.realpath(p) != own
    )
    library_path = os.environ.get("LD_LIBRARY_PATH", "")
    where = "" if ctx.local else " (an ENV in a derived image's Dockerfile, or -e at run time)"
    problems, fixes = [], []
    if modules:
        problems.append(_outside("locked packages are imported", modules, "PYTHONPATH", path))
        if shadowed.in_cwd:
            fixes.append("rename those files or folders in the current folder, or run from another one")
        if shadowed.in_workdir:
            fixes.append("rename those files or folders in the image's WORKDIR (or move them to a package folder)")
        fixes.append(f"take those folders off PYTHONPATH{where} or out of sys.path")
    if libraries:
        what = "libraries the locked wheels ship are loaded"
        preloaded = oslibs.preloaded_among(libraries)
        if preloaded:  # naming only LD_LIBRARY_PATH here would send the user to the wrong place
            problems.append(f"{_outside(what, _named(libraries), '', '')} (preloaded: {preloaded})")
            fixes.append(
                f"drop them from LD_PRELOAD{where} or /etc/ld.so.preload (the wheels bring their own, the"
                " ones tested; a preload of a library no wheel ships, such as jemalloc, is only reported)"
            )
            if library_path:
                fixes.append(f"take those folders off LD_LIBRARY_PATH{where}")
        else:
            problems.append(_outside(what, _named(libraries), "LD_LIBRARY_PATH", library_path))
            fixes.append(f"take those folders off LD_LIBRARY_PATH or LD_PRELOAD{where}")
    raise CheckFailed("; ".join(problems), "; ".join(fixes) + ": the tested environment must be the one that runs")


def _base_python(manifest: dict[str, Any], root: str, ctx: Context, r: Result, packages: dict[str, str]) -> list[str]:
    """What changed in the base Python a venv runs on (manifest.interpreter says why it is
    recorded): its binary and standard library against the build's record. With --lock-match pins and
    changed OS `packages` (an apt upgrade in a derived image) it is listed in the facts, not failed."""
    then = manifest.get("interpreter")
    if not then:
        return []  # a conda env holds its own Python, under root
    now = interpreter(root) or {"stdlib": root, "files": {}, "executable": None}
    if os.path.realpath(now["stdlib"]) != os.path.realpath(then["stdlib"]):
        # not an apt upgrade (which keeps the folder): every import of the standard library now
        # reads files no manifest covers, so pins does not list this one, it fails
        home = f" (PYTHONHOME={os.environ['PYTHONHOME']})" if os.environ.get("PYTHONHOME") else ""
        raise CheckFailed(
            f"the standard library is read from {now['stdlib']}, not the build's {then['stdlib']}{home}",
            "unset PYTHONHOME (an ENV in a derived image's Dockerfile, or -e at run time): the venv "
            "runs on the OS Python the image was built and tested with",
        )
    where = f"the base Python ({then['stdlib']})"
    problems = [f"{where}: {then['executable'][0]} changed"] if now["executable"] != then["executable"] else []
    before, after = then["files"], now["files"]
    for kind, paths in (
        ("changed", [p for p, v in before.items() if p in after and after[p] != v]),
        ("removed", [p for p in before if p not in after]),
        ("added", [p for p in after if p not in before]),
    ):
        if paths:
            problems.append(_say(kind, {where: sorted(paths)}))
    if problems and ctx.lock_match == "pins" and packages != manifest.get("os_packages"):
        r.facts["base_python_changed"] = "; ".join(problems) + " (with the OS packages: an apt upgrade)"
        return []
    return problems


def check_integrity(ctx: Context, r: Result) -> None:
    # beside expect.json: the image's /opt/envbuild; a local run's folder has none
    folder = os.path.dirname(ctx.expect_path or MANIFEST)
    manifest_path, digest_path = (
        os.path.join(folder, os.path.basename(MANIFEST)),
        os.path.join(folder, os.path.basename(DIGEST)),
    )
    preload = oslibs.preloaded()
    if preload:
        r.facts["preload"] = preload
    if ctx.local or not os.path.isfile(manifest_path):
        if ctx.lock_match != "none":  # a venv or a host has no manifest, but can shadow a locked package too
            _fail_if_shadowed(ctx)
        raise Skip("no build manifest here (only images envbuild built carry one)")
    with open(manifest_path, encoding="utf-8") as fh:
        manifest: dict[str, Any] = json.load(fh)
    if not os.path.isfile(digest_path):
        raise CheckFailed(
            f"{digest_path} is gone: the build writes it beside the manifest, so a manifest without it "
            "cannot be told from one edited after the build",
            ctx.environment_remedy(),
        )
    with open(digest_path, encoding="utf-8") as fh:
        r.facts["env_digest"] = fh.read().strip()
    if digest(manifest) != r.facts["env_digest"]:
        # Edited together with the files it lists, the manifest would vouch for them: the digest the
        # build wrote beside it (and into the image's env-digest label) says it is the build's.
        raise CheckFailed(
            f"{manifest_path} was changed after the build: its digest is {digest(manifest)[:12]}, "
            f"the build's (env-digest) {r.facts['env_digest'][:12]}",
            ctx.environment_remedy(),
        )
    root = str(manifest["root"])
    if os.path.realpath(sys.prefix) != os.path.realpath(root):
        # every check ran in this interpreter: a copy of the environment (patched or not) first on
        # a derived image's PATH would pass them all while the manifest vouches for another folder
        raise CheckFailed(
            f"`python` here is {sys.executable} (prefix {sys.prefix}), not the environment's: {root} "
            f"(PATH={os.environ.get('PATH', '')})",
            f"put {root}/bin first on PATH (an ENV PATH in a derived image's Dockerfile, or -e at run time, "
            "puts another Python first): the tested environment must be the one that runs",
        )
    recorded: dict[str, list[Any]] = manifest["files"]
    current = scan(root)
    r.facts["files"] = len(current)
    changed = [p for p, v in recorded.items() if p in current and current[p] != v]
    removed = [p for p in recorded if p not in current]
    added = [p for p in current if p not in recorded]
    # files the manifest vouches for that their wheel's RECORD does not: edited with the manifest
    forged = [p for p in unlike_record(root, current) if recorded.get(p) == current[p]]
    packages = os_packages()  # a dpkg-query run: once, for the base Python and the OS libraries
    base = _base_python(manifest, root, ctx, r, packages)
    _fail_if_shadowed(ctx)
    # torch is imported (_fail_if_shadowed): what it loads from the OS is checked too
    libs = oslibs.problems(manifest, [root, sysconfig.get_paths()["stdlib"]], packages, r.facts)
    apt = oslibs.package_changes(manifest.get("os_packages"), packages)
    if apt and ctx.lock_match != "exact":  # a derived image's apt-get: listed, as its pip installs are
        r.facts["os_packages_changed"], apt = apt, []
    if not (changed or removed or added or base or forged or libs or apt):
        return
    owners = _owners(root)
    locked = set(locked_pins(ctx))
    problems = [*base, *libs] + ([f"{len(apt)} OS package(s) not as built: {shortlist(apt)}"] if apt else [])
    if changed:
        problems.append(_say("changed", _by_owner(changed, owners)))
    if removed:
        problems.append(_say("removed", _by_owner(removed, owners)))
    if forged:
        problems.append(
            _say("unlike their wheel's RECORD", _by_owner(forged, owners))
            + ", which the manifest lists as they are: it was rewritten with them"
        )
    added_by = _by_owner(added, owners)
    # whole distributions the lockfile does not have: a derived image's pip install
    foreign = {d: f for d, f in added_by.items() if d not in locked and d != "(no distribution)"}
    slipped = {d: f for d, f in added_by.items() if d not in foreign}  # into a locked one, or no one's
    if ctx.lock_match == "pins":
        # a derived image's own packages: listed, not failed; files slipped into a locked one still fail
        r.facts["added_distributions"] = sorted(foreign)
        foreign = {}
    if foreign:
        # named with their size: their file names would bury a slipped file, listed in full below
        problems.append(
            f"{len(foreign)} distribution(s) not in the lockfile added: "
            + ", ".join(f"{d} ({len(f)} file(s))" for d, f in sorted(foreign.items()))
        )
    if slipped:
        problems.append(_say("added", slipped))
    if problems:
        remedy = ctx.environment_remedy(only_added=not (changed or removed or base or slipped or forged or libs))
        if base and ctx.lock_match == "exact" and not (changed or removed or foreign or slipped):
            remedy = (
                "the OS Python changed: after an apt upgrade in an image built FROM this one, check it with "
                "--lock-match pins, which lists that; otherwise " + remedy
            )
        remedy = oslibs.remedy(ctx.expect.get("profile") or "NAME") if problems == libs else remedy
        # the dist-info of the version an install replaced is no one's
        touched = {*_by_owner(changed, owners), *_by_owner(removed, owners)} - {"(no distribution)"} | set(slipped)
        remedy = (not (base or forged or libs) and moved_remedy(ctx, touched)) or remedy
        raise CheckFailed("the environment differs from the image's build manifest: " + "; ".join(problems), remedy)
