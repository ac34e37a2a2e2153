"""inductor's CPU probe, started as the smoke test starts (smoke/inside/vecprobe.py): its answer
taken by the compile check, never cut short while it compiles, started only where the compile
check runs and another CPU can take it. A small Python program stands in for the probe (the
unit suite has no torch); the e2e smoke report shows the real one taken."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from envbuild.smoke.inside import report, vecprobe
from envbuild.smoke.inside.core import Context


@pytest.fixture(autouse=True)
def _clean() -> Iterator[None]:
    yield
    vecprobe.finish(interrupted=True)


def test_the_probes_answer_and_time_are_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vecprobe, "CODE", "print(9.5, 'avx512 avx512_vnni amx_tile')")
    vecprobe.start(True)
    assert vecprobe.result() == {"vec_isa": "avx512 avx512_vnni amx_tile", "vec_isa_probe_s": 9.5}
    assert vecprobe.result() == {}  # taken once: a second asker probes by itself


def test_a_failed_probe_gives_nothing_and_the_check_probes_by_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    for code in ("raise SystemExit('No module named torch')", "print('odd')", "print('x y')"):
        monkeypatch.setattr(vecprobe, "CODE", code)
        vecprobe.start(True)
        assert vecprobe.result() == {}


def test_nothing_starts_where_compile_does_not_run_or_one_cpu_would_take_both(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(vecprobe, "CODE", "print(1.0, 'avx2')")
    vecprobe.start(False)
    assert vecprobe.result() == {}
    monkeypatch.setattr(vecprobe, "_cpus", lambda: 1)
    vecprobe.start(True)
    assert vecprobe.result() == {}


def test_a_probe_no_check_took_is_waited_for_and_stopped_only_on_an_interrupt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A probe killed mid-compile stays in the inductor cache as a file that does not load."""
    done = tmp_path / "done"
    monkeypatch.setattr(vecprobe, "CODE", f"import time, pathlib; time.sleep(0.5); pathlib.Path({str(done)!r}).touch()")
    vecprobe.start(True)
    vecprobe.finish()
    assert done.exists()
    done.unlink()
    monkeypatch.setattr(vecprobe, "CODE", f"import time, pathlib; time.sleep(30); pathlib.Path({str(done)!r}).touch()")
    vecprobe.start(True)
    t0 = time.monotonic()
    vecprobe.finish(interrupted=True)
    assert time.monotonic() - t0 < 10 and not done.exists()


def test_the_smoke_run_starts_it_only_when_its_compile_check_will_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[bool] = []
    monkeypatch.setattr(vecprobe, "start", asked.append)
    monkeypatch.setattr(report, "CHECKS", [("compile", lambda c, r: None), ("perf", lambda c, r: None)])

    def ctx(**expect: Any) -> Context:
        return Context(expect=expect, gpus="none", timeout=60, lock_match="none", local=True)

    report.run(ctx())
    report.run(ctx(), ["perf"])
    report.run(ctx(), ["compile"])
    report.run(ctx(compile=False))
    assert asked == [True, False, True, False]
