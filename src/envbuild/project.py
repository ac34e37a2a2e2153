"""The project folder: profiles/, templates/, lockfiles/ and an optional envbuild.toml."""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_type_hints

from envbuild._compat import tomllib
from envbuild.errors import UsageError

CONFIG_NAME = "envbuild.toml"


@dataclass(frozen=True)
class ProjectConfig:
    """Settings in envbuild.toml; options on the command line win over these.

    A plain dataclass rather than a pydantic model: `envbuild list` in a project without
    envbuild.toml must not pay pydantic's import (~0.2 s here). The file itself is still
    validated strictly by pydantic, see `_validate_config`.
    """

    profiles_dir: str = "profiles"
    templates_dir: str = "templates"
    lockfiles_dir: str = "lockfiles"
    build_dir: str = ".envbuild"
    index_url: str | None = None
    torch_index: str | None = None
    find_links: list[str] = field(default_factory=list)
    registry: str | None = None
    repository: str = "envbuild"
    lock_jobs: int = 4


@dataclass(frozen=True)
class Project:
    root: Path
    config: ProjectConfig = field(default_factory=ProjectConfig)

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

    def rel(self, path: Path) -> str:
        """A path as the user should see it: relative to the project when inside it."""
        try:
            return str(path.resolve().relative_to(self.root.resolve()))
        except ValueError:
            return str(path)

    def profile_names(self) -> list[str]:
        if not self.profiles_dir.is_dir():
            return []
        return sorted(p.stem for p in self.profiles_dir.glob("*.yaml") if not p.name.startswith(("_", ".")))

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
        names = self.profile_names()
        close = difflib.get_close_matches(name_or_path, names, n=3, cutoff=0.5)
        hint = f"did you mean {', '.join(close)}?" if close else "run `envbuild list` to see them"
        where = self.rel(self.profiles_dir)
        if not names:
            raise UsageError(
                f"no profile {name_or_path!r}: {where}/ has no profiles",
                hint="run envbuild in a project folder or pass --project DIR",
            )
        raise UsageError(f"no profile {name_or_path!r} in {where}/", hint=hint)


def open_project(explicit: str | None = None) -> Project:
    """The project named by --project, ENVBUILD_PROJECT, or the current folder."""
    root = Path(explicit or os.environ.get("ENVBUILD_PROJECT") or ".").resolve()
    if not root.is_dir():
        raise UsageError(f"project folder {root} does not exist")
    config_path = root / CONFIG_NAME
    config = ProjectConfig()
    if config_path.is_file():
        try:
            raw: dict[str, Any] = tomllib.loads(config_path.read_text("utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise UsageError(f"{config_path}: not valid TOML: {exc}") from exc
        config = _validate_config(raw.get("envbuild", raw), config_path)
    return Project(root=root, config=config)


def _validate_config(raw: Any, config_path: Path) -> ProjectConfig:
    """Strict validation (unknown keys and wrong types are errors) of envbuild.toml's table."""
    from pydantic import TypeAdapter, ValidationError
    from typing_extensions import TypedDict

    # The accepted keys and types are ProjectConfig's own, so the two cannot drift apart.
    keys = TypedDict("ProjectConfigKeys", get_type_hints(ProjectConfig), total=False)  # type: ignore[misc]
    keys.__pydantic_config__ = {"extra": "forbid", "strict": True}  # type: ignore[attr-defined]
    try:
        valid = TypeAdapter(keys).validate_python(raw)
    except ValidationError as exc:
        problems = []
        for e in exc.errors():
            where = ".".join(str(p) for p in e["loc"]) or "(top level)"
            close = difflib.get_close_matches(where, keys.__annotations__, n=1)
            guess = f" (did you mean {close[0]}?)" if e["type"] == "extra_forbidden" and close else ""
            problems.append(f"{where}: {e['msg']}{guess}")
        raise UsageError(
            f"{config_path}: " + "; ".join(problems),
            hint="see README 'Project configuration' for the keys",
        ) from exc
    return ProjectConfig(**valid)
