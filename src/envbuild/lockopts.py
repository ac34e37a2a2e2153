"""What a lock is asked to do and what it did: shared by the venv (uv) and conda lockers."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from envbuild.errors import EnvbuildError
from envbuild.lockfile import Change
from envbuild.plan import PlanOptions


@dataclass(frozen=True)
class LockOptions:
    index_url: str | None = None
    torch_index: str | None = None
    find_links: tuple[str, ...] = ()
    upgrade: bool = False
    upgrade_packages: tuple[str, ...] = ()
    platforms: tuple[str, ...] = ()
    solver: str = "auto"  # conda only: auto | conda-lock | rattler
    offline: bool = False
    dry_run: bool = False  # resolve and report the changes, write nothing
    base: str | None = None  # the base image apt.lock is resolved against (--base)
    apt: bool = True  # also lock the OS packages (apt.lock); needs the engine

    def plan_options(self) -> PlanOptions:
        return PlanOptions(
            index_url=self.index_url,
            torch_index=self.torch_index,
            find_links=self.find_links,
            platforms=self.platforms,
            base=self.base,
        )


@dataclass
class LockOutcome:
    name: str
    state: str  # fresh | locked | failed
    message: str = ""
    seconds: float = 0.0
    packages: int = 0
    files: list[Path] = field(default_factory=list)
    error: EnvbuildError | None = None
    changes: list[Change] | None = None  # None: nothing was locked before
