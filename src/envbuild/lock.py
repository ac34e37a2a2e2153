"""`envbuild lock`: resolve profiles with uv (venv) or a conda solver, verify, write atomically."""

from __future__ import annotations

import contextlib
import difflib
import time
from collections.abc import Callable, Sequence

from packaging.requirements import InvalidRequirement, Requirement

from envbuild import freshness, lockfile, proc, profilefile, validate, venvlock
from envbuild import plan as plan_mod
from envbuild.errors import BaseImageError, EngineUnavailable, EnvbuildError, StaleLock, UsageError
from envbuild.lockopts import LockOptions, LockOutcome
from envbuild.names import LockEvents, canonical, lock_names, mutex_path, quiet
from envbuild.plan import Plan
from envbuild.profile import Profile
from envbuild.project import Project

__all__ = ["LockOptions", "LockOutcome", "check", "lock_many", "lock_one", "prepare_next", "prepare_validated"]


def check(project: Project, names: Sequence[str]) -> list[StaleLock]:
    """Offline freshness check for CI: no resolver, no network."""
    stale = []
    for name in names:
        prof = validate.load_named(project, name)
        found = freshness.query(project, plan_mod.make(project, prof))
        if not found.fresh:
            stale.append(StaleLock(prof.name, found.reason, f"envbuild lock {prof.name}"))
    return stale


def prepare_next(project: Project, prof: Profile) -> None:
    """After `new` wrote, or `validate` checked, profile `prof` (valid): record the resolve of the
    lock a user types next in this folder, so that it starts while that command loads (lockahead).
    Where the lockfiles are missing or stale (a new or edited profile), that is the plain
    `envbuild lock NAME`; where they are fresh, `lock NAME --upgrade`, unless a record for it is
    there already (a lock here keeps its own: this is for a fresh clone). Best effort: a profile
    that cannot be planned here only starts nothing early."""
    from envbuild import lockahead

    if not lockahead.enabled() or prof.flavor != "venv":
        return
    with contextlib.suppress(EnvbuildError, OSError):
        plan = plan_mod.make(project, prof, LockOptions().plan_options())
        argv = ["lock", prof.name]
        if freshness.query(project, plan, with_apt=False).fresh:  # apt.lock's own staleness resolves no Python
            argv.append("--upgrade")
            if lockahead.recorded(argv):
                return
        venvlock.record_next_lock(project, plan, argv)


def prepare_validated(project: Project, checked: Sequence[profilefile.Loaded]) -> None:
    """`prepare_next` for each valid profile `validate` checked, of the project's own files (`lock
    NAME` reads that one): a profile just validated is usually locked next (hand-written or edited),
    or re-locked (a fresh clone)."""
    for loaded in checked:
        if loaded.errors or loaded.profile is None:
            continue
        own = project.profiles_dir / f"{loaded.profile.name}.yaml"
        if own.is_file() and own.resolve() == loaded.path.resolve():
            prepare_next(project, loaded.profile)


def lock_one(project: Project, name: str, opts: LockOptions, events: LockEvents | None = None) -> LockOutcome:
    from filelock import FileLock

    say = events or quiet
    start = time.monotonic()
    try:
        prof = validate.load_named(project, name)
        plan = plan_mod.make(project, prof, opts.plan_options())
        _check_upgrade_packages(project, plan, opts.upgrade_packages)
        guard = mutex_path(project.build_dir, "lock", prof.name)
        guard.parent.mkdir(parents=True, exist_ok=True)
        # One writer per profile at a time, across processes; the second re-checks freshness.
        with FileLock(str(guard), timeout=3600):
            found = freshness.query(project, plan)
            apt_stale = False
            if not found.fresh and opts.apt and plan.apt_stages:
                # Only apt.lock out of date (the `apt:` list, or what envbuild installs, changed):
                # the OS packages are locked again, the Python lockfiles stay as they are and no
                # package index is asked (it may be down, and nothing there needs it).
                python_only = freshness.query(project, plan, with_apt=False)
                if python_only.fresh:
                    found, apt_stale = python_only, True
            if found.fresh and not opts.upgrade and not opts.upgrade_packages:
                if not apt_stale and not _wants_apt(plan, opts, found):
                    say(name, "fresh", "lockfile is up to date")
                    return LockOutcome(name, "fresh", "up to date", time.monotonic() - start)
                outcome = LockOutcome(name, "fresh", "Python lockfiles up to date")
            else:
                for note in plan.notes:
                    say(name, "note", note)
                say(name, "resolving", f"{prof.flavor}: {', '.join(plan.platforms)}")
                if prof.flavor == "conda":
                    from envbuild import conda  # asyncio and the solvers: only a conda lock pays for them

                    outcome = conda.lock(project, plan, opts)
                else:
                    outcome = venvlock.lock(project, plan, opts, found)
            if opts.apt and plan.apt_stages:
                _lock_apt(project, plan, opts, outcome, lambda kind, text: say(name, kind, text))
    except EnvbuildError as exc:
        say(name, "failed", str(exc).splitlines()[0])
        return LockOutcome(name, "failed", str(exc), time.monotonic() - start, error=exc)
    outcome.seconds = time.monotonic() - start
    say(name, outcome.state, f"{outcome.message} in {outcome.seconds:.1f}s")
    return outcome


def _wants_apt(plan: Plan, opts: LockOptions, found: freshness.Freshness) -> bool:
    """Python lockfiles fresh, but no apt.lock yet, or one resolved on another base than this lock's
    (`--base IMAGE`, or the profile's base changed): lock only the OS packages. Saying "up to date"
    there left an apt.lock that every build on that base then refuses (its packages differ)."""
    if not opts.apt or not plan.apt_stages:
        return False
    return any(s.apt is None or s.apt.base_image != plan.base.image for s in found.snapshots.values())


def _lock_apt(
    project: Project, plan: Plan, opts: LockOptions, outcome: LockOutcome, say: Callable[[str, str], None]
) -> None:
    """apt.lock after the Python lockfiles. An engine or base that cannot be had here leaves it
    unwritten with a note (the Python lockfiles stand on their own; `build` says the OS packages
    float); apt refusing the packages is a failed lock."""
    from envbuild import aptresolve  # the engine's client: `--no-apt` and venv re-locks go without it

    say("resolving", f"OS packages on {plan.base.image}")
    try:
        message, count = aptresolve.lock(project, plan, dry_run=opts.dry_run)
    except (EngineUnavailable, BaseImageError) as exc:
        say("note", f"apt.lock not written: {str(exc).splitlines()[0]} (fix: {exc.hint or 'start the engine'})")
        return
    if count and outcome.state == "fresh":
        outcome.state = "locked"  # only apt.lock was written
        outcome.message = f"{message}; the Python lockfiles were up to date"
    else:
        outcome.message = f"{outcome.message}; {message}"


def _check_upgrade_packages(project: Project, plan: Plan, packages: tuple[str, ...]) -> None:
    """-P names packages of the current lockfile: a typo there would re-lock, change nothing and
    say so, as if the package had no newer release."""
    path = freshness.lock_dir(project, plan.name) / lock_names(plan.platforms[0], plan.profile.flavor)[0]
    if not packages or plan.profile.flavor != "venv" or not path.is_file():
        return  # a first lock, or a conda lock (always solved from scratch): nothing to compare with
    locked = set(lockfile.parse_requirements(freshness.read_previous(path)))
    for line in plan.requirements:  # one just added to the profile is not in the lockfile yet
        with contextlib.suppress(InvalidRequirement):
            locked.add(canonical(Requirement(line).name))
    for pkg in packages:
        if canonical(pkg) not in locked:
            close = difflib.get_close_matches(canonical(pkg), sorted(locked), n=1)
            raise UsageError(
                f"-P {pkg}: not in {plan.name}'s lockfile",
                hint=f"did you mean -P {close[0]}?" if close else f"it locks: {', '.join(sorted(locked))}",
            )


def lock_many(
    project: Project,
    names: Sequence[str],
    opts: LockOptions,
    jobs: int = 4,
    events: LockEvents | None = None,
) -> list[LockOutcome]:
    """Lock several profiles, a bounded number at a time; results in the order asked.

    An interrupt (Ctrl-C, SIGTERM) stops the resolvers the workers run and every lock not started;
    none of them writes anything (`proc.check_cancelled` before each write)."""
    done: dict[str, LockOutcome] = {}
    for wave in _waves(project, names):
        done |= zip(wave, proc.gather(lambda n: lock_one(project, n, opts, events), wave, jobs), strict=True)
    return [done[n] for n in names]


def _waves(project: Project, names: Sequence[str]) -> list[list[str]]:
    """The profiles in the order their locks need: one after the profiles it extends that this run
    locks too. A first lock keeps the pins of the profile it extends (venvlock), so a variant locked
    beside its parent would otherwise start from the parent's lockfile or from nothing, as the
    timing fell."""
    asked = set(names)
    after: dict[str, set[str]] = {}
    for name in names:
        try:
            after[name] = set(profilefile.read_raw(project.profile_path(name)).extends) & asked
        except EnvbuildError:  # lock_one says what is wrong with it
            after[name] = set()
    waves: list[list[str]] = []
    left = list(dict.fromkeys(names))
    while left:
        wave = [n for n in left if not after[n] & set(left)] or left  # `extends` has no cycles in a valid profile
        waves.append(wave)
        left = [n for n in left if n not in wave]
    return waves
