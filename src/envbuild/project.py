"""The project folder: profiles/, templates/, lockfiles/ and an optional envbuild.toml."""

from __future__ import annotations

import difflib
import functools
import os
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_type_hints

from envbuild._compat import tomllib
from envbuild.errors import UsageError
from envbuild.names import CONFLICT_FIX, CONFLICT_SAID, NAME_RE, NOT_UTF8_FIX, conflict_line, not_utf8
from envbuild.proc import run_ok

CONFIG_NAME = "envbuild.toml"


@dataclass(frozen=True)
class ProjectConfig:
    """Settings in envbuild.toml; options on the command line win over these.

    A plain dataclass rather than a pydantic model: see `_matches` for why.
    """

    profiles_dir: str = "profiles"
    templates_dir: str = "templates"
    lockfiles_dir: str = "lockfiles"
    build_dir: str = ".envbuild"
    index_url: str | None = None
    torch_index: str | None = None
    find_links: list[str] = field(default_factory=list)
    registry: str | None = None
    repository: str | None = None  # None: envbuild/<the project's name> (see Project.repository)
    lock_jobs: int = 4
    # The base image for every profile (a string), or per Python version ({"3.11" = "IMAGE"}); a
    # profile's own `base:` and `--base` still win.
    base: str | dict[str, str] | None = None
    ca_bundle: str | None = None  # a PEM bundle for builds behind a TLS-intercepting proxy (--ca-bundle)
    # apt.lock's archive: a snapshot timestamp (20250101T000000Z) or "auto" (the lock's date); a
    # profile's own apt_snapshot wins
    apt_snapshot: str | None = None
    ci: dict[str, str] | None = None  # `ci github` runner labels per accelerator: cpu, cuda, rocm

    def base_for(self, python: str) -> str | None:
        return self.base.get(python) if isinstance(self.base, dict) else self.base


@dataclass(frozen=True)
class Project:
    root: Path
    config: ProjectConfig = field(default_factory=ProjectConfig)
    # The folder the command was typed in, where it lies below the root: paths in messages are
    # shown from there, so a terminal's link to `../profiles/x.yaml:9` opens the file.
    here: Path | None = None

    @property
    def profiles_dir(self) -> Path:
        return self.root / self.config.profiles_dir

    @property
    def lockfiles_dir(self) -> Path:
        return self.root / self.config.lockfiles_dir

    @property
    def build_dir(self) -> Path:
        return self.root / self.config.build_dir

    @property
    def templates_dir(self) -> Path | None:
        path = self.root / self.config.templates_dir
        return path if path.is_dir() else None

    @functools.cached_property
    def repository(self) -> str:
        """The local image repository: envbuild.toml's `repository`, else `envbuild/<name>` with the
        project's name (its git remote's repository name, else its folder's). Two projects on one
        engine so never share `envbuild:cpu-py311`, and a second checkout of one repository does."""
        if self.config.repository:
            return self.config.repository
        return f"envbuild/{self.name}"

    @functools.cached_property
    def name(self) -> str:
        """The project's name for image repositories: the git remote's last path part, else the folder."""
        remote = (run_ok(["git", "config", "--get", "remote.origin.url"], cwd=self.root, timeout=10) or "").strip()
        raw = remote.rstrip("/").removesuffix(".git").replace(":", "/").rsplit("/", 1)[-1] if remote else ""
        return repository_part(raw) or repository_part(self.root.name) or "project"

    def work_dir(self, profile: str) -> Path:
        """A profile's folder under the build folder: its build context, log, smoke report, result."""
        return self.build_dir / profile

    def smoke_report(self, profile: str) -> Path:
        """Where a profile's last whole smoke report is kept: `status`, a no-op rebuild and the user
        read it there."""
        return self.work_dir(profile) / "smoke.json"

    def rel(self, path: Path) -> str:
        """A path as the user should see it: relative to the project when inside it, and to the
        folder the command was typed in when that lies inside the project too."""
        root = self.root.resolve()
        try:
            inside = path.resolve().relative_to(root)
        except ValueError:
            return str(path)
        return os.path.relpath(root / inside, self.here) if self.here else str(inside)

    def no_profiles(
        self, start: str = "`envbuild new cu126-py312` starts one, or pass --project DIR"
    ) -> tuple[str, str]:
        """(why the project lists no profiles, the fix) for the message that says so; `start`: the fix
        for a project that has none yet. A `profiles_dir` set in envbuild.toml that names no folder is
        most likely a typo there, not an empty project."""
        where = self.rel(self.profiles_dir)
        if self.profiles_dir.is_dir():
            return f"{where}/ has no profiles", start
        if self.config.profiles_dir == ProjectConfig.profiles_dir:
            return f"{where}/ does not exist", start
        config = self.root / CONFIG_NAME
        return (
            f"{where}/ does not exist ({self.rel(config)}: profiles_dir = {self.config.profiles_dir!r})",
            f"set profiles_dir in {self.rel(config)} to the folder that holds the profiles (relative to "
            f"{self.root}), or remove it for profiles/",
        )

    def profile_names(self) -> list[str]:
        if not self.profiles_dir.is_dir():
            return []
        # a folder that happens to end in .yaml is not a profile; a broken link is one gone wrong
        found = self.profiles_dir.glob("*.yaml")
        return sorted(p.stem for p in found if not p.name.startswith(("_", ".")) and not p.is_dir())

    def profile_path(self, name_or_path: str) -> Path:
        """Resolve a profile name, or a path to a YAML file anywhere."""
        candidate = Path(name_or_path)
        if candidate.suffix in {".yaml", ".yml"} or os.sep in name_or_path:
            if not candidate.is_file():
                raise UsageError(f"{name_or_path}: no such profile file")
            return candidate
        path = self.profiles_dir / f"{name_or_path}.yaml"
        if path.is_file():
            return path
        if path.is_symlink() or path.exists():
            what = "a folder" if path.is_dir() else "a link that leads nowhere" if path.is_symlink() else "not a file"
            shown = f"{self.rel(self.profiles_dir)}/{path.name}"  # rel() would follow the link
            raise UsageError(f"{shown}: {what}, not a profile", hint=f"make {shown} a YAML file or remove it")
        names = self.profile_names()
        close = difflib.get_close_matches(name_or_path, names, n=3, cutoff=0.5)
        start = f"`envbuild new {name_or_path}` writes one" if NAME_RE.fullmatch(name_or_path) else ""
        if close:
            hint = f"did you mean {', '.join(close)}?" + (f" Or {start}" if start else "")
        else:
            hint = start or "run `envbuild list` to see them"
        where = self.rel(self.profiles_dir)
        if not names:
            why, fix = self.no_profiles(
                "run envbuild in a project folder or pass --project DIR; " + (start or "`envbuild new NAME` starts one")
            )
            raise UsageError(f"no profile {name_or_path!r}: {why}", hint=fix)
        raise UsageError(f"no profile {name_or_path!r} in {where}/", hint=hint)


def source_label(project: Project) -> str:
    """The image source label: the git remote, else the folder. `envbuild images` tells projects apart by it.

    Without credentials: CI clones over URLs with a job token in them (GitLab's
    https://gitlab-ci-token:TOKEN@host/...), and a label travels with every pushed image."""
    remote = (run_ok(["git", "config", "--get", "remote.origin.url"], cwd=project.root, timeout=10) or "").strip()
    return source_url(remote) if remote else f"file://{project.root}"


@dataclass(frozen=True)
class Provenance:
    """The `created` time and `revision` an image is labelled with."""

    epoch: int
    revision: str


def provenance(project: Project, lock_path: Path) -> Provenance:
    """The last commit that changed what the image is made from (the profiles, envbuild.toml, this
    profile's lockfiles): its hash and time. Not HEAD: a commit of the project's own code or README
    then gave every image a new ID, so a build with nothing to do made a new image, moved its tags
    and ran the whole smoke test again. SOURCE_DATE_EPOCH wins for the time; with no such commit
    (a lockfile not committed yet) the time is the lockfile's mtime and the revision HEAD's."""
    paths = [str(project.profiles_dir), str(lock_path.parent), str(project.root / CONFIG_NAME)]
    out = run_ok(["git", "log", "-1", "--format=%H %ct", "--", *paths], cwd=project.root, timeout=10) or ""
    commit, _, when = out.strip().partition(" ")
    if not when.isdigit():
        head = run_ok(["git", "rev-parse", "HEAD"], cwd=project.root, timeout=10) or ""
        commit, when = head.strip() or "unknown", str(int(lock_path.stat().st_mtime))
    if os.environ.get("SOURCE_DATE_EPOCH", "").isdigit():
        when = os.environ["SOURCE_DATE_EPOCH"]
    return Provenance(int(when), commit)


def same_source(a: str, b: str) -> bool:
    """Whether two source labels name one repository: CI often clones over https while a developer's
    remote is ssh (git@host:org/repo.git); both, with or without .git or credentials, are one project,
    as are labels written before `source_url` gave them one form."""
    return bool(a) and _canonical_source(a) == _canonical_source(b)


def _canonical_source(url: str) -> str:
    # http and https of one host, a bare repository and its name without .git: one repository
    return source_url(url).split("://", 1)[-1].removesuffix(".git").lower()


def source_url(remote: str) -> str:
    """A git remote as its repository's web address, the form of the image's source label: one for
    an ssh and an https clone (two labels made two image IDs of one build; and a registry such as
    GitHub's links an image to its repository only from https://HOST/OWNER/REPO), without
    credentials (a CI job's token), `.git` or ssh's port. A local path is a file:// URL."""
    text = remote.strip().rstrip("/").removesuffix("/.git")  # a clone of a working tree: that tree
    scheme, found, rest = text.partition("://")
    if not found:
        if ":" not in text.split("/", 1)[0]:  # git's rule: a colon before the first slash is scp-like
            return "file://" + os.path.normpath(text)
        scheme, rest = "ssh", text.replace(":", "/", 1)  # [user@]host:org/repo
    if scheme == "file":
        return "file://" + os.path.normpath(rest)  # a bare repository's folder keeps its .git
    netloc, _, path = rest.removesuffix(".git").partition("/")
    host = netloc.rsplit("@", 1)[-1]  # user@ or user:token@
    if scheme not in ("http", "https"):  # ssh://, git://: the web address of the same repository
        scheme, host = "https", host.split(":", 1)[0]
    return f"{scheme}://{host}/{path}"


def repository_part(text: str) -> str:
    """`text` as one path component of an image repository: lower case, [a-z0-9] runs joined by '-'."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:64]


def _enclosing(start: Path) -> Path:
    """The project a command typed in `start` is for: the nearest of it and the folders above it, up
    to the top of its git checkout, with an envbuild.toml or a profiles/ folder; else `start` (a new
    project). From profiles/ itself `envbuild status` said "profiles/ does not exist", as it did from
    any folder of the project's code. Only inside a checkout, and not past its top: a profiles/
    folder above it (or above a folder in no checkout: a home folder's) is no project of this one."""
    inside: list[Path] = []
    for folder in (start, *start.parents):
        inside.append(folder)
        if (folder / ".git").exists():  # the checkout's top: a folder (a clone) or a file (a worktree)
            return next((f for f in inside if _is_project(f)), start)
    return start


def _is_project(folder: Path) -> bool:
    return (folder / CONFIG_NAME).is_file() or (folder / "profiles").is_dir()


def open_project(explicit: str | None = None) -> Project:
    """The project named by --project, ENVBUILD_PROJECT, or the one the current folder is in."""
    named = explicit or os.environ.get("ENVBUILD_PROJECT")
    try:
        here: Path | None = Path.cwd().resolve()
    except FileNotFoundError:  # the shell's folder was deleted (or replaced) under it
        here = None
    if named and (here or Path(named).is_absolute()):
        root = Path(named).resolve()
    elif here:
        root = _enclosing(here)
    else:
        raise UsageError(
            "the current folder no longer exists (removed or replaced after this shell entered it)",
            hint='cd into the project again (`cd "$PWD"` if it was recreated), or pass --project DIR',
        )
    if not root.is_dir():
        raise UsageError(
            f"project folder {root} does not exist",
            hint="check --project / ENVBUILD_PROJECT; to start a project there, create the folder, "
            "then `envbuild new NAME`",
        )
    config_path = root / CONFIG_NAME
    config = ProjectConfig()
    if config_path.is_file():
        try:
            text = read_text(config_path)
            raw: dict[str, Any] = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            marker = conflict_line(text)
            if marker is not None:
                raise UsageError(f"{config_path}:{marker}: {CONFLICT_SAID}", hint=CONFLICT_FIX) from exc
            raise UsageError(f"{config_path}: not valid TOML: {exc}") from exc
        # with an [envbuild] table, what stands outside it is read by nothing: a `registry = ...`
        # above the header, a [base] meant as [envbuild.base]
        outside = {k: v for k, v in sorted(raw.items()) if k != "envbuild"} if "envbuild" in raw else {}
        config = _validate_config(raw.get("envbuild", raw), config_path, outside)
    return Project(root=root, config=config, here=here if here and root in here.parents else None)


def read_text(path: Path, shown: str | None = None) -> str:
    """A file of the project a person edits (envbuild.toml, a check script); one an editor saved in
    another encoding is named by line and column, with the fix. A byte-order mark (Notepad's UTF-8)
    is read past: TOML took it for "Invalid statement (at line 1, column 1)"."""
    try:
        return path.read_text("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{shown or path}:{_not_utf8_at(exc)}", hint=NOT_UTF8_FIX) from exc


def text_problem(path: Path, shown: str) -> tuple[str, str] | None:
    """Why `read_text` would refuse a file that is there, with the fix: validate says it with the
    rest of a profile's problems, where render, lock and build stop at it."""
    try:
        path.read_text("utf-8-sig")
    except UnicodeDecodeError as exc:
        return f"{shown}:{_not_utf8_at(exc)}", NOT_UTF8_FIX
    except OSError as exc:
        return f"{shown} cannot be read ({exc.strerror or exc})", "make it readable by the user who runs envbuild"
    return None


def _not_utf8_at(exc: UnicodeDecodeError) -> str:
    said, line, column = not_utf8(exc)
    return f"{line}: {said} (column {column})"


def _validate_config(raw: Any, config_path: Path, outside: dict[str, Any]) -> ProjectConfig:
    """Strict check of envbuild.toml's table: unknown keys and wrong types are errors, and so is
    anything `outside` the [envbuild] table (it would be ignored)."""
    if not isinstance(raw, dict):
        raise UsageError(f"{config_path}: expected a table of settings")
    hints = get_type_hints(ProjectConfig)
    problems = [
        f"{key}: outside the [envbuild] table, so nothing reads it{_belongs(key, v, hints)}"
        for key, v in outside.items()
    ]
    for key, value in raw.items():
        expected = hints.get(key)
        if expected is None:
            close = difflib.get_close_matches(key, hints, n=1)
            problems.append(f"{key}: not a setting" + (f" (did you mean {close[0]}?)" if close else ""))
        elif not _matches(value, expected):
            problems.append(f"{key}: expected {_describe(expected, key)}, got {type(value).__name__} {value!r}")
        elif key == "lock_jobs" and value < 1:
            problems.append(f"lock_jobs: must be 1 or more, got {value}")
        elif key == "apt_snapshot" and not re.fullmatch(r"auto|\d{8}T\d{6}Z", value):
            problems.append(f"apt_snapshot: expected a timestamp like 20250101T000000Z or auto, got {value!r}")
    if problems:
        raise UsageError(
            f"{config_path}: " + "; ".join(problems), hint="see docs/PROFILES.md, 'Project configuration', for the keys"
        )
    from envbuild import refs

    # a bad name would otherwise surface only when the engine refuses a tag, after a whole build
    refs.check(f"{config_path}: repository", raw.get("repository"), "repository")
    refs.check(f"{config_path}: registry", raw.get("registry"), "registry")
    refs.check(f"{config_path}: index_url", raw.get("index_url"), "url")
    unknown_runners = sorted(set(raw.get("ci") or {}) - {"cpu", "cuda", "rocm"})
    if unknown_runners:
        raise UsageError(
            f"{config_path}: ci: {', '.join(unknown_runners)} is not an accelerator",
            hint="the [envbuild.ci] table names runner labels for cpu, cuda and rocm",
        )
    bases = raw.get("base")
    for where, image in bases.items() if isinstance(bases, dict) else [("", bases)]:
        refs.check(f"{config_path}: base{f'.{where}' if where else ''}", image, "image")
    refs.check(f"{config_path}: torch_index", raw.get("torch_index"), "url")
    return ProjectConfig(**raw)


def _belongs(key: str, value: Any, hints: dict[str, Any]) -> str:
    """Where a setting found outside [envbuild] goes; nothing to say for a key that is no setting."""
    if key not in hints:
        return ""
    return f" (write it as [envbuild.{key}])" if isinstance(value, dict) else " (move it below [envbuild])"


# The settings are a flat table of strings, integers and string lists. Checking them here rather
# than with a pydantic model keeps pydantic's import (~0.2 s on a 2-core machine) out of
# `envbuild list` and `--help`, which must answer well under half a second.
def _matches(value: Any, expected: Any) -> bool:
    if isinstance(expected, types.UnionType):
        return any(_matches(value, arm) for arm in typing.get_args(expected))
    if typing.get_origin(expected) is list:
        (item,) = typing.get_args(expected)
        return isinstance(value, list) and all(_matches(v, item) for v in value)
    if typing.get_origin(expected) is dict:
        key, item = typing.get_args(expected)
        return isinstance(value, dict) and all(_matches(k, key) and _matches(v, item) for k, v in value.items())
    if expected is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, expected)


def _describe(expected: Any, key: str) -> str:
    if isinstance(expected, types.UnionType):
        return " or ".join(_describe(arm, key) for arm in typing.get_args(expected) if arm is not type(None))
    if typing.get_origin(expected) is list:
        return f"a list of {typing.get_args(expected)[0].__name__} values"
    if typing.get_origin(expected) is dict:
        tables = {"base": "Python version = image", "ci": 'accelerator = runner label, e.g. cuda = "gpu-nvidia"'}
        return f"a table of strings ({tables.get(key, 'name = value')})"
    return {str: "a string", int: "an integer"}.get(expected, str(expected.__name__))
