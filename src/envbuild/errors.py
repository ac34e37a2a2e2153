"""One error hierarchy for every pipeline stage.

Library code raises these and never prints or exits; the CLI turns them into a
message and an exit code through ``exit_code_for`` (the only place that knows
the numbers).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace


@dataclass(frozen=True)
class Diagnostic:
    """One problem found in a profile, located as precisely as the input allows."""

    severity: str  # "error" | "warning"
    file: str
    line: int | None
    field: str
    message: str
    fix: str = ""
    value: str | None = None

    def render(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        text = f"{where}: {self.field}: {self.message}" if self.field else f"{where}: {self.message}"
        if self.fix:
            text += f"; {self.fix}"
        return text

    def as_dict(self) -> dict[str, object]:
        return {
            "severity": self.severity,
            "file": self.file,
            "line": self.line,
            "field": self.field,
            "value": self.value,
            "message": self.message,
            "fix": self.fix,
        }


class EnvbuildError(Exception):
    """Root of everything envbuild raises on purpose."""

    def __init__(self, message: str, *, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message}\n  fix: {self.hint}" if self.hint else self.message

    def as_dict(self) -> dict[str, object]:
        """The error for a --json reader (the exit code is added by the CLI, which owns them)."""
        diagnostics = [d.as_dict() for d in getattr(self, "diagnostics", [])]
        return {"type": type(self).__name__, "message": self.message, "hint": self.hint, "diagnostics": diagnostics}


class UsageError(EnvbuildError):
    """The command line or project layout is wrong (unknown profile, bad option)."""


class ProfileError(EnvbuildError):
    """A profile could not be loaded or is invalid; carries every diagnostic at once."""

    def __init__(self, message: str, diagnostics: list[Diagnostic] | None = None, *, hint: str = "") -> None:
        super().__init__(message, hint=hint)
        self.diagnostics: list[Diagnostic] = diagnostics or []

    def __str__(self) -> str:
        if not self.diagnostics:
            return super().__str__()
        text = "\n".join(d.render() for d in self.diagnostics if d.severity == "error")
        return f"{text}\n  fix: {self.hint}" if self.hint else text

    def first_problem(self) -> str:
        """The first error as `file:line: field: problem`, without its fix: a one-line summary for
        a report that goes on past this profile (doctor, outdated)."""
        first = next((d for d in self.diagnostics if d.severity == "error"), None)
        return replace(first, fix="").render() if first else super().__str__()


class ImageMissing(UsageError):
    """An image that a command needs is not in the engine."""


class CompatDataError(EnvbuildError):
    """The packaged compatibility data is unreadable (a packaging bug, not user input)."""


class RenderError(EnvbuildError):
    """A template failed to render (missing variable, syntax error, unsafe value)."""


class LockError(EnvbuildError):
    """The resolver failed, or its result does not match the profile."""


@dataclass
class StaleLock:
    profile: str
    reason: str
    command: str


class LockCheckFailed(EnvbuildError):
    """`envbuild lock --check` found stale or missing lockfiles."""

    def __init__(self, stale: list[StaleLock]) -> None:
        lines = [f"{s.profile}: {s.reason}; run `{s.command}`" for s in stale]
        super().__init__("stale or missing lockfiles:\n  " + "\n  ".join(lines))
        self.stale = stale


class GeneratedDrift(EnvbuildError):
    """A `--check` found a generated file (the CI workflow, the schema) missing or out of date."""


class ProfilesBehind(EnvbuildError):
    """`envbuild outdated --check` found newer releases than the profiles pin."""


class LockMissing(EnvbuildError):
    """An image build or venv needs a fresh lockfile that is not there."""


class VenvError(EnvbuildError):
    """A virtual environment could not be made from a lockfile."""


class EngineUnavailable(EnvbuildError):
    """The Docker engine cannot be reached."""


class EngineNoAnswer(EngineUnavailable):
    """The engine answered at first, then a call timed out (`timed_out`) or lost its connection."""

    def __init__(self, message: str, *, hint: str = "", timed_out: bool = False) -> None:
        super().__init__(message, hint=hint)
        self.timed_out = timed_out


class BaseImageError(EnvbuildError):
    """The base image is neither present nor pullable."""


@dataclass
class BuildFailure:
    step: str
    tail: list[str] = field(default_factory=list)
    log_path: str = ""


class BuildError(EnvbuildError):
    """A build step failed; names the step, the last lines and the full log."""

    def __init__(self, message: str, failure: BuildFailure | None = None, *, hint: str = "") -> None:
        super().__init__(message, hint=hint)
        self.failure = failure

    def __str__(self) -> str:
        text = self.message
        if self.failure:
            text += f"\n  step: {self.failure.step}"
            if self.failure.tail:
                text += "\n  last lines:\n    " + "\n    ".join(self.failure.tail)
            if self.failure.log_path:
                text += f"\n  full log: {self.failure.log_path}"
        if self.hint:
            text += f"\n  fix: {self.hint}"
        return text


class SmokeFailed(EnvbuildError):
    """The smoke test ran and a required check failed."""


class SmokeError(EnvbuildError):
    """The smoke test could not be run at all (container did not start, timeout)."""


class PublishError(EnvbuildError):
    """Push or pull failed, or an image was refused for publishing."""


class VerifyError(PublishError):
    """A pulled image does not match the local profile or lockfile."""


class WriteFailed(EnvbuildError):
    """A file envbuild writes could not be written (a read-only or missing folder, a full disk)."""


class Interrupted(EnvbuildError):
    """Ctrl-C or SIGTERM stopped the work; what was in progress was stopped, not finished."""


# The single mapping from error type to exit code. Order matters: subclasses first.
_EXIT_CODES: tuple[tuple[type[EnvbuildError], int], ...] = (
    (LockCheckFailed, 1),
    (ProfilesBehind, 1),
    (GeneratedDrift, 1),
    (SmokeFailed, 1),
    (UsageError, 2),
    (ProfileError, 2),
    (LockMissing, 2),
    (RenderError, 3),
    (LockError, 4),
    (VenvError, 4),
    (EngineUnavailable, 5),
    (BaseImageError, 6),
    (BuildError, 7),
    (SmokeError, 8),
    (VerifyError, 9),
    (PublishError, 10),
    (WriteFailed, 11),
    (Interrupted, 130),
    (CompatDataError, 70),
)


def exit_code_for(error: EnvbuildError) -> int:
    for kind, code in _EXIT_CODES:
        if isinstance(error, kind):
            return code
    return 1
