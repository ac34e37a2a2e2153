"""The CLI as a user meets it: exit codes, messages, --json, no tracebacks."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from envbuild.smoke.inside.report import only_names

from ..conftest import REPO, Result

Cli = Callable[..., Result]


def test_validate_all_passes_on_shipped_matrix(cli: Cli, project: Path) -> None:
    res = cli("validate", "--all", "--project", str(project))
    assert res.code == 0, res.out + res.err
    assert "10 of 10 profile(s) valid" in res.out


def test_validate_broken_exits_2_with_located_message(
    cli: Cli, project: Path, write_profile: Callable[..., Path]
) -> None:
    write_profile("cu121-py311", torch="2.0.1", torchvision="0.15.2")
    res = cli("validate", "cu121-py311", "--project", str(project))
    assert res.code == 2
    assert (
        'profiles/cu121-py311.yaml:3: cuda: torch 2.0.1 has no CUDA 12.1 build (it has 11.7, 11.8); use cuda "11.8"'
        in res.out
    )
    assert "Traceback" not in res.err


def test_validate_json(cli: Cli, project: Path, write_profile: Callable[..., Path]) -> None:
    write_profile("cu121-py311", numpy="2.0.0", torch="2.2.2", torchvision="0.17.2")
    res = cli("validate", "cu121-py311", "--json", "--project", str(project))
    payload = json.loads(res.out)
    assert res.code == 2 and payload["valid"] is False
    [err] = payload["profiles"][0]["errors"]
    assert err["field"] == "numpy" and err["line"] == 7 and err["value"] == "2.0.0"
    assert err["fix"].startswith('use numpy "1.26.4"')


def test_validate_single_file_anywhere(cli: Cli, tmp_path: Path) -> None:
    path = tmp_path / "cpu-py311.yaml"
    path.write_text('name: cpu-py311\naccelerator: cpu\npython: "3.11"\ntorch: "2.13.0"\nnumpy: "2.1.3"\n')
    assert cli("validate", str(path), "--project", str(tmp_path)).code == 0


def test_unknown_profile_lists_closest(cli: Cli, project: Path) -> None:
    res = cli("show", "cu121-py31", "--project", str(project))
    assert res.code == 2
    assert "no profile 'cu121-py31'" in res.err and "did you mean cu121-py311" in res.err


def test_list_json(cli: Cli, project: Path) -> None:
    res = cli("list", "--json", "--project", str(project))
    rows = {r["name"]: r for r in json.loads(res.out)}
    assert rows["cu121-py311"]["accelerator_version"] == "12.1" and rows["cu121-py311"]["readable"]
    assert rows["rocm63-py312"]["accelerator"] == "rocm"
    assert "_base" not in rows


def test_show_resolves_extends(cli: Cli, project: Path) -> None:
    res = cli("show", "cu121-py311", "--json", "--project", str(project))
    data = json.loads(res.out)
    assert data["env"] == {"OMP_NUM_THREADS": "8", "PYTHONDONTWRITEBYTECODE": "1"}
    assert len(data["digest"]) == 64


def test_render_writes_files(cli: Cli, project: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    res = cli("render", "cu121-py311", "-o", str(out), "--project", str(project))
    assert res.code == 0
    assert sorted(p.name for p in out.iterdir()) == [
        "Dockerfile",
        "lock-input.toml",
        "requirements.in",
    ]


def test_render_invalid_profile_writes_nothing(
    cli: Cli, project: Path, tmp_path: Path, write_profile: Callable[..., Path]
) -> None:
    write_profile("cu121-py311", numpy="2.0.0", torch="2.2.2", torchvision="0.17.2")
    out = tmp_path / "out"
    res = cli("render", "cu121-py311", "-o", str(out), "--project", str(project))
    assert res.code == 2 and not out.exists()


def test_compat_one_release(cli: Cli) -> None:
    res = cli("compat", "torch==2.3.1", "--json")
    data = json.loads(res.out)
    assert data["torch"][0]["cuda_builds"] == ["11.8", "12.1"]
    assert {d["cuda"]: d["min_driver"] for d in data["drivers"]} == {
        "11.8": "520.61.05",
        "12.1": "530.30.02",
    }
    unknown = cli("compat", "torch==9.9.9")
    assert unknown.code == 2 and "torch 9.9.9 is not in the compat data (1.13-" in unknown.err
    assert "fix: `envbuild compat` lists the releases envbuild knows" in unknown.err


def test_compat_table(cli: Cli) -> None:
    res = cli("compat")
    assert res.code == 0 and "2.15 ?" in res.out and "unverified compat data: 2.15" in res.out
    assert "11.8, 12.1*" in res.out  # torch 2.3: PyPI's wheel is the cu121 build


def test_compat_table_reads_on_an_80_column_terminal(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    from envbuild import output

    monkeypatch.setenv("COLUMNS", "80")
    output.out.cache_clear()
    try:
        res = cli("compat")
    finally:
        output.out.cache_clear()
    lines = res.out.splitlines()
    assert res.code == 0 and max(map(len, lines)) <= 80
    # nothing cut to an ellipsis: every Python range and header is whole
    assert "…" not in res.out
    assert any("3.10-3.14" in line and "0.26" in line for line in lines)


def test_bad_config_file(cli: Cli, project: Path) -> None:
    (project / "envbuild.toml").write_text("[envbuild]\nprofile_dir = 'x'\n")
    res = cli("list", "--project", str(project))
    assert res.code == 2 and "envbuild.toml: profile_dir" in res.err


def test_console_script_and_module_entry(project: Path) -> None:
    env = {**os.environ, "ENVBUILD_PROJECT": str(project)}
    proc = subprocess.run(
        [sys.executable, "-m", "envbuild", "validate", "no-such"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and "no profile 'no-such'" in proc.stderr


def test_the_entry_points_quick_exit_loses_no_output_and_keeps_the_exit_code(project: Path, tmp_path: Path) -> None:
    """The entry point skips the interpreter's teardown (~30 ms) once the work is done: every
    byte written to a pipe still arrives, atexit handlers still run, and the exit code is the one
    the command returned (0, a usage error's 2, a broken pipe's 120)."""
    env = {**os.environ, "ENVBUILD_PROJECT": str(project)}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "envbuild", *args], capture_output=True, text=True, env=env, check=False
        )

    done = run("schema")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["title"]  # the whole document: it parses
    assert run("validate", "no-such").returncode == 2
    big = run("compat", "--json")
    assert big.returncode == 0 and len(big.stdout) > io.DEFAULT_BUFFER_SIZE  # the last part is flushed at exit
    json.loads(big.stdout)
    # A reader that leaves early: the flush fails, as with Python's own exit, and nothing hangs.
    with subprocess.Popen(
        [sys.executable, "-m", "envbuild", "compat", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    ) as reader:
        assert reader.stdout is not None and reader.stderr is not None
        reader.stdout.read(10)
        reader.stdout.close()
        err = reader.stderr.read().decode()
        assert reader.wait(timeout=60) in {0, 120} and "Traceback" not in err, err


def test_cli_needs_no_click_installed(project: Path) -> None:
    # typer vendors click; envbuild must run where `click` itself is absent (plain `pip install envbuild`).
    code = (
        "import sys; sys.modules['click'] = None; from envbuild.cli import run; "
        f"sys.exit(run(['list', '--project', {str(project)!r}]) + 10 * run(['lock', '--nonsense']))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert proc.returncode == 20, proc.stderr  # list: 0; an unknown option: 2 (a usage error), no traceback
    assert "cu121-py311" in proc.stdout and "No such option" in proc.stderr and "Traceback" not in proc.stderr


def _modules_after(argv: list[str], project: Path) -> tuple[int, set[str], str]:
    """Run the real entry point in a fresh interpreter; return its exit code and heavy imports."""
    code = (
        "import atexit, sys, json\n"
        f"sys.argv = ['envbuild', *{argv!r}]\n"
        "def heavy():\n"
        "    found = ('pydantic', 'jinja2', 'docker', 'packaging', 'typer._adapters')\n"
        "    print(json.dumps([m for m in found if m in sys.modules]), file=sys.stderr)\n"
        "atexit.register(heavy)  # the entry point runs atexit handlers, then leaves without teardown\n"
        "from envbuild.__main__ import main\n"
        "main()\n"
    )
    env = {**os.environ, "ENVBUILD_PROJECT": str(project), "COLUMNS": "200"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False)
    rc, heavy = proc.returncode, json.loads(proc.stderr.strip().splitlines()[-1])
    return rc, set(heavy), proc.stdout


def test_list_and_help_stay_light(project: Path) -> None:
    # `envbuild list` / `--help` must answer fast: neither may pull in the later stages' libraries
    # (Jinja, the Docker SDK). typer itself parses options with pydantic since 0.29; envbuild no
    # longer patches typer's private internals to avoid that (~0.1 s; docs/BENCHMARKS.md).
    rc, heavy, out = _modules_after(["list"], project)
    assert rc == 0 and "cu121-py311" in out and not heavy & {"jinja2", "docker"}
    rc, heavy, out = _modules_after(["--help"], project)
    assert rc == 0 and "validate" in out and not heavy & {"jinja2", "docker"}


def test_project_config_validated_strictly(project: Path, cli: Cli) -> None:
    # envbuild.toml is checked strictly: wrong types (no "4" for 4, no true for 1), unknown keys with a guess
    (project / "envbuild.toml").write_text(
        '[envbuild]\nlock_jobs = "4"\nregistri = "x"\nfind_links = ["/a", 3]\nrepository = true\n'
    )
    res = cli("list", "--project", str(project))
    assert res.code == 2 and "envbuild.toml: " in res.err
    assert "lock_jobs: expected an integer, got str '4'" in res.err
    assert "registri: not a setting (did you mean registry?)" in res.err
    assert "find_links: expected a list of str values, got list ['/a', 3]" in res.err
    assert "repository: expected a string, got bool True" in res.err
    (project / "envbuild.toml").write_text("[envbuild]\nlock_jobs = true\n")
    assert "lock_jobs: expected an integer, got bool True" in cli("list", "--project", str(project)).err
    # each table says what its keys are: the runners' table was described as the bases' one
    (project / "envbuild.toml").write_text('[envbuild]\nci = {cuda = 3}\nbase = {"3.11" = 3}\n')
    err = cli("list", "--project", str(project)).err
    assert 'ci: expected a table of strings (accelerator = runner label, e.g. cuda = "gpu-nvidia")' in err
    assert "base: expected a string or a table of strings (Python version = image)" in err
    (project / "envbuild.toml").write_text('[envbuild]\nregistry = "localhost:5000/envs"\nfind_links = ["/w"]\n')
    from envbuild.project import open_project

    config = open_project(str(project)).config
    assert config.registry == "localhost:5000/envs" and config.find_links == ["/w"] and config.lock_jobs == 4


def test_settings_outside_the_envbuild_table_are_named_not_ignored(project: Path, cli: Cli) -> None:
    # A key above the [envbuild] header and a [base] meant as [envbuild.base] were read by nothing:
    # pushes went to the default registry, builds used the default base, without a word.
    (project / "envbuild.toml").write_text(
        'registry = "localhost:5000/envs"\n[envbuild]\nlock_jobs = 2\n[base]\n"3.11" = "debian@sha256:'
        + "0" * 64
        + '"\n'
    )
    res = cli("list", "--project", str(project))
    assert res.code == 2, res.out
    assert "registry: outside the [envbuild] table, so nothing reads it (move it below [envbuild])" in res.err
    assert "base: outside the [envbuild] table, so nothing reads it (write it as [envbuild.base])" in res.err
    # a file of settings without the header is still one table
    (project / "envbuild.toml").write_text('registry = "localhost:5000/envs"\n')
    assert cli("list", "--project", str(project)).code == 0


def test_an_envbuild_toml_left_in_conflict_by_a_merge_is_named_so(project: Path, cli: Cli) -> None:
    (project / "envbuild.toml").write_text(
        "[envbuild]\n<<<<<<< HEAD\nlock_jobs = 2\n=======\nlock_jobs = 4\n>>>>>>> b\n"
    )
    res = cli("list", "--project", str(project))
    assert res.code == 2 and "envbuild.toml:2: a merge's conflict markers" in res.err, res.err


def test_files_saved_in_latin_1_are_named_by_line_and_column_with_the_fix(project: Path, cli: Cli) -> None:
    """envbuild.toml said "not valid TOML: 'utf-8' codec can't decode byte 0xe9 in position 17", a
    `checks:` script "cannot be read (...)" with a fix about where scripts live."""
    (project / "envbuild.toml").write_bytes("[envbuild]\n# équipe\nlock_jobs = 2\n".encode("latin-1"))
    res = cli("list", "--project", str(project))
    assert res.code == 2
    assert "envbuild.toml:2: not UTF-8 text (byte 0xe9) (column 3)" in res.err
    assert "save the file as UTF-8" in res.err
    (project / "envbuild.toml").write_bytes(b"\xef\xbb\xbf[envbuild]\nlock_jobs = 2\n")  # UTF-8 with a BOM
    assert cli("list", "--project", str(project)).code == 0
    (project / "envbuild.toml").unlink()
    (project / "checks" / "train_tiny.py").write_bytes("print(1)\n# café\n".encode("latin-1"))
    for command in ("validate", "render"):  # validate said nothing of it, and render then stopped
        res = cli(command, "cpu-py311", "--project", str(project))
        said = res.out + res.err  # validate's report goes to stdout, render's error to stderr
        assert res.code == 2
        assert "cpu-py311.yaml:10: checks[0]: checks/train_tiny.py:2: not UTF-8 text (byte 0xe9) (column 6)" in said
        assert "save the file as UTF-8" in said


def test_option_parsing_keeps_typer_conversions_and_errors(cli: Cli, project: Path) -> None:
    # values that need converting still go through typer: an int given "abc" is a usage error
    res = cli("lock", "--all", "--jobs", "abc", "--project", str(project))
    assert res.code == 2 and "Invalid value for '--jobs'" in res.err and "valid integer" in res.err
    # a str option, a bool flag and a list argument pass through as given
    res = cli("validate", "cu121-py311", "cpu-py311", "--json", "--project", str(project))
    assert res.code == 0
    files = [r["file"] for r in json.loads(res.out)["profiles"]]
    assert [Path(f).stem for f in files] == ["cu121-py311", "cpu-py311"]


def test_smoke_local_lock_match_is_checked(cli: Cli, project: Path) -> None:
    res = cli("smoke", "--local", "cpu-py311", "--lock-match", "loose", "--project", str(project))
    assert res.code == 2 and "--lock-match 'loose': use exact, pins or none" in res.err


def test_a_failing_json_command_still_writes_one_json_document(cli: Cli, project: Path) -> None:
    # a machine reader asked for --json: the error arrives as JSON on stdout, the text on stderr
    res = cli("build", "nosuch", "--json", "--project", str(project))
    assert res.code == 2
    error = json.loads(res.out)["error"]
    assert error["exit_code"] == 2 and error["type"] == "UsageError"
    assert error["message"] == "no profile 'nosuch' in profiles/" and "envbuild list" in error["hint"]
    assert "error: no profile 'nosuch'" in res.err


def test_a_command_that_wrote_its_json_report_adds_no_second_document(cli: Cli, project: Path) -> None:
    res = cli("lock", "nosuch", "--json", "--project", str(project))
    assert res.code == 2
    report = json.loads(res.out)  # exactly one document: lock's own report, which names the failure
    assert report[0]["state"] == "failed" and report[0]["profile"] == "nosuch"


def test_profile_errors_carry_their_diagnostics_in_json(
    cli: Cli, project: Path, write_profile: Callable[..., Path]
) -> None:
    write_profile("cu121-py311", torch="2.0.1", torchvision="0.15.2")
    res = cli("build", "cu121-py311", "--json", "--project", str(project))
    assert res.code == 2
    error = json.loads(res.out)["error"]
    assert error["type"] == "ProfileError"
    assert any(d["field"] == "cuda" and d["line"] == 3 and d["severity"] == "error" for d in error["diagnostics"])


@pytest.mark.parametrize("command", [["render", "cpu-py311", "-o"], ["schema", "-o"], ["ci", "github", "-o"]])
def test_an_output_path_that_cannot_be_written_is_named_with_a_fix(
    cli: Cli, project: Path, tmp_path: Path, command: list[str]
) -> None:
    """These were exit 70, "a bug in envbuild", with a FileNotFoundError for a temp file envbuild had made up."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder\n")
    target = blocker / "out"  # below a file: no user, root included, can create it
    args = [*command, str(target)]
    if command[0] != "schema":
        args += ["--project", str(project)]
    res = cli(*args)
    assert res.code == 11, res.err
    assert f"cannot write {target}" in res.err and f"{blocker} is a file, not a folder" in res.err
    assert f"fix: move {blocker} out of the way, or choose another path" in res.err
    assert "Traceback" not in res.err and "bug in envbuild" not in res.err
    assert blocker.read_text() == "not a folder\n"


def test_a_missing_folder_that_cannot_be_made_says_so(cli: Cli) -> None:
    res = cli("schema", "-o", "/proc/no-such-folder/schema.json")  # /proc takes no new folders
    assert res.code == 11, res.err
    assert "cannot write /proc/no-such-folder/schema.json: No such file or directory" in res.err
    assert "fix: choose a path in a folder that exists and can be written (/proc/no-such-folder)" in res.err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["push", "cpu-py311", "--registry", "bad ref!"], "--registry 'bad ref!' is not a registry path"),
        (["push", "cpu-py311", "--registry", "localhost:5000"], "--registry 'localhost:5000' is not a registry path"),
        (["pull", "cpu-py311", "--registry", "ghcr.io/Acme"], "--registry 'ghcr.io/Acme' is not a registry path"),
        (
            ["push", "cpu-py311", "--registry", "http://localhost:5000/Team/"],
            "--registry 'http://localhost:5000/Team/'",
        ),
        (["pull", "cpu-py311", "--registry", "ghcr.io/a", "--digest", "latest"], "--digest 'latest' is not a manifest"),
        (["build", "cpu-py311", "--tag", "Team/Envs"], "--tag 'Team/Envs' is not an image repository"),
        (["build", "cpu-py311", "--tag", "envs:v1"], "--tag 'envs:v1' is not an image repository"),
        (["smoke", "cpu-py311", "--tag", "a b"], "--tag 'a b' is not an image repository"),
        (["run", "cpu-py311", "--tag", "a b"], "--tag 'a b' is not an image repository"),
        (["push", "cpu-py311", "--tag", "A"], "--tag 'A' is not an image repository"),
        (["matrix", "--format", "bake", "--tag", "A"], "--tag 'A' is not an image repository"),
    ],
)
def test_a_malformed_image_name_is_refused_before_the_engine_is_asked(
    cli: Cli, project: Path, args: list[str], message: str
) -> None:
    """`push --registry "bad ref!"` and `run --tag "bad tag!"` were exit 70 with the engine's HTTP 400/500
    text; `build --tag Team/Envs` failed only when the finished image was tagged."""
    res = cli(*args, "--project", str(project))
    assert res.code == 2, res.err
    assert message in res.err
    value = args[args.index(message.split(maxsplit=1)[0]) + 1]
    if value in {"ghcr.io/Acme", "Team/Envs", "A"}:  # only the case is wrong: the fix is the name, lower-cased
        assert f"fix: image paths are lower case: write {value.lower()}" in res.err
    elif value == "localhost:5000":  # a host alone: the fix adds a path
        assert "fix: a registry path needs a path after the host (images go to localhost:5000/envs:NAME)" in res.err
    elif value == "http://localhost:5000/Team/":  # a URL, as a browser shows it
        assert (
            "fix: no http://: the engine picks the protocol; image paths are lower case: write localhost:5000/team"
            in res.err
        )
    else:
        assert "fix: write e.g." in res.err


@pytest.mark.parametrize("args", [["lock", "--all", "--check", "-j", "0"], ["outdated", "-j", "-2"]])
def test_a_job_count_below_one_is_refused(cli: Cli, project: Path, args: list[str]) -> None:
    res = cli(*args, "--project", str(project))
    assert res.code == 2 and f"--jobs {args[-1]}: must be 1 or more" in res.err
    (project / "envbuild.toml").write_text("[envbuild]\nlock_jobs = 0\n")
    res = cli("list", "--project", str(project))
    assert res.code == 2 and "lock_jobs: must be 1 or more, got 0" in res.err


def test_envbuild_toml_image_names_are_checked_when_the_project_opens(cli: Cli, project: Path) -> None:
    (project / "envbuild.toml").write_text('[envbuild]\nrepository = "Team Envs"\n')
    res = cli("list", "--project", str(project))
    assert res.code == 2
    assert "envbuild.toml: repository 'Team Envs' is not an image repository (lower case, no tag)" in res.err
    (project / "envbuild.toml").write_text('[envbuild]\nregistry = "localhost:5000"\n')
    res = cli("list", "--project", str(project))
    assert res.code == 2 and "envbuild.toml: registry 'localhost:5000' is not a registry path" in res.err


def test_brackets_in_data_are_printed_as_they_are(cli: Cli, project: Path, write_profile: Callable[..., Path]) -> None:
    # rich reads "[gpu]" as a style (and drops it) and "[/x]" as a closing tag (and raised: exit 70
    # with a traceback); what envbuild prints is data, never markup
    write_profile(description="CPU [gpu] [/x] build")
    res = cli("show", "cu121-py311", "--project", str(project))
    assert res.code == 0, res.err
    assert "description: CPU [gpu] [/x] build" in res.out
    # unset fields are left out of the text (not "rocm: null", "apt: []"); --json keeps them
    assert "null" not in res.out and "[]" not in res.out and "{}" not in res.out
    assert "cuda: '12.1'" in res.out and "digest: " in res.out
    assert "channels" not in res.out  # a venv profile's: conda's field, never read
    data = json.loads(cli("show", "cu121-py311", "--json", "--project", str(project)).out)
    assert data["rocm"] is None and data["apt"] == []
    write_profile(numpy="[/x]")
    res = cli("validate", "cu121-py311", "--project", str(project))
    assert res.code == 2 and "Traceback" not in res.err
    assert "numpy: '[/x]' is not an exact numpy release" in res.out
    # and ":x:" as an emoji: an image named lab:x came out as "lab❌"
    res = cli("show", "lab:x:", "--project", str(project))
    assert res.code == 2 and "error: no profile 'lab:x:'" in res.err, res.err


def test_smoke_table_keeps_the_engines_words(capsys: pytest.CaptureFixture[str]) -> None:
    from envbuild import output
    from envbuild.cli.building import _print_smoke

    reason = (
        'the container engine gave this container no GPU: could not select device driver "" with capabilities: [[gpu]]'
    )
    check = {"name": "gpu", "status": "fail", "seconds": 0.0, "reason": reason, "remedy": "[/x] fix", "facts": {}}
    _print_smoke({"checks": [check], "passed": False, "failed": ["gpu"], "seconds": 1.0}, output.out())
    out = " ".join(capsys.readouterr().out.split())
    assert "capabilities: [[gpu]]" in out and "fix: [/x] fix" in out and "smoke FAILED: gpu in 1.0s" in out


def test_a_profile_that_is_not_a_file_is_named_as_such(cli: Cli, project: Path) -> None:
    (project / "profiles" / "cpu-py399.yaml").mkdir()
    res = cli("validate", "cpu-py399", "--project", str(project))
    assert res.code == 2 and "profiles/cpu-py399.yaml: a folder, not a profile" in res.err
    assert "cpu-py399" not in cli("list", "--project", str(project)).out  # a folder is no profile
    (project / "profiles" / "gone.yaml").symlink_to(project / "profiles" / "elsewhere.yaml")
    res = cli("validate", "--all", "--project", str(project))
    # listed with the other profiles' problems (the rest are still checked: issue 25)
    assert res.code == 2 and "profiles/gone.yaml: a link that leads nowhere" in res.out + res.err


def test_all_on_a_project_without_profiles_says_so(cli: Cli, tmp_path: Path) -> None:
    (tmp_path / "profiles").mkdir()
    res = cli("validate", "--all", "--project", str(tmp_path))
    assert res.code == 2 and "nothing to validate: profiles/ has no profiles" in res.err
    assert "envbuild new" in res.err


def test_a_profiles_dir_in_envbuild_toml_that_names_no_folder_is_named_as_the_cause(cli: Cli, tmp_path: Path) -> None:
    """A typo in envbuild.toml's profiles_dir read as an empty project: `list` said to start one with
    `new`, and `matrix` printed an empty CI matrix with exit 0 (the CI job reading it then failed
    with GitHub's message). Now each names the setting and its fix; `matrix` fails."""
    (tmp_path / "profiles").mkdir()
    (tmp_path / "envbuild.toml").write_text('profiles_dir = "profile"\n')
    said = "profile/ does not exist (envbuild.toml: profiles_dir = 'profile')"
    fix = "fix: set profiles_dir in envbuild.toml to the folder that holds the profiles"
    for args, code in ((["validate", "--all"], 2), (["matrix"], 2), (["lock", "cpu-py311"], 2), (["list"], 0)):
        res = cli(*args, "--project", str(tmp_path))
        assert res.code == code, args
        assert said in res.err and fix in res.err, args
        assert "envbuild new" not in res.err, args  # a new profile would go where no one looks
    res = cli("matrix", "--project", str(tmp_path), "--format", "json")
    assert res.code == 2 and res.out == ""


def test_ci_github_in_a_project_without_profiles_writes_no_workflow(cli: Cli, tmp_path: Path) -> None:
    """It wrote a workflow whose matrix was `include:` with nothing under it (exit 0): GitHub
    refuses that file. Now it fails as `matrix` does, and writes nothing."""
    target = tmp_path / "wf.yml"
    res = cli("ci", "github", "-o", str(target), "--project", str(tmp_path))
    assert res.code == 2
    assert "nothing to put in a CI matrix: profiles/ does not exist" in res.err
    assert "envbuild new cu126-py312" in res.err
    assert not target.exists()


def test_smoke_json_that_cannot_be_written_fails_before_the_run(cli: Cli, project: Path, tmp_path: Path) -> None:
    # before: the run took its minute, then the write failed and the table was never shown
    tmp_path = tmp_path / "out"
    tmp_path.mkdir()
    res = cli("smoke", "cpu-py311", "--json", str(tmp_path), "--project", str(project))
    assert res.code == 11 and f"cannot write {tmp_path}: it is a folder" in res.err
    (tmp_path / "file").write_text("")
    res = cli("smoke", "cpu-py311", "--json", str(tmp_path / "file" / "r.json"), "--project", str(project))
    assert res.code == 11 and f"{tmp_path / 'file'} is a file, not a folder" in res.err
    assert list(tmp_path.iterdir()) == [tmp_path / "file"]  # the probe left nothing behind


def test_smoke_json_dash_puts_the_report_on_stdout_and_the_table_on_stderr(
    cli: Cli, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every other command's --json is a flag for stdout: `smoke IMAGE --json | jq` was "Option
    '--json' requires an argument", and `--json -` wrote a file called "-"."""
    from envbuild.smoke import host

    check = {"name": "ddp", "status": "fail", "seconds": 1.5, "reason": "all_reduce hung", "remedy": "", "facts": {}}
    report = {"passed": False, "failed": ["ddp"], "checks": [check], "seconds": 2.0, "image": "sha256:" + "a" * 64}
    monkeypatch.setattr(host, "smoke_image", lambda *_, **__: report)
    monkeypatch.chdir(project)
    res = cli("smoke", "envbuild/x:cpu-py311", "--json", "-", "--project", str(project))
    assert res.code == 1, res.err  # a failed smoke test's exit code
    assert json.loads(res.out) == report  # stdout is the report and nothing else
    assert "all_reduce hung" in res.err and "smoke FAILED: ddp" in res.err
    assert not (project / "-").exists()
    assert "is not an image that passed before" not in res.err
    # a bare --json, last or before another option, is stdout as everywhere else
    for args in (("--json",), ("--json", "--timeout", "60")):
        res = cli("smoke", "envbuild/x:cpu-py311", "--project", str(project), *args)
        assert res.code == 1 and json.loads(res.out) == report, res.err
    assert not (project / "--timeout").exists()
    # before the image it takes the image for the file: said, not "name an image" alone
    res = cli("smoke", "--json", "envbuild/x:cpu-py311", "--project", str(project))
    assert res.code == 2 and "--json took envbuild/x:cpu-py311 for the report's file" in res.err
    assert not (project / "envbuild").exists()  # nothing made for that file
    monkeypatch.setattr(host, "smoke_image", lambda *_, **__: {**report, "smoke_record": "altered"})
    res = cli("smoke", "envbuild/x:cpu-py311", "--project", str(project))
    assert "note: sha256:aaaaaaaaaaaa is not an image that passed before: its smoke-test record" in res.err
    # an error before any report still gives a machine reader its one JSON document
    res = cli("smoke", "--json", "-", "--project", str(project))
    assert res.code == 2 and json.loads(res.out)["error"]["message"] == "name a profile or an image"


def test_venv_into_a_file_is_refused_before_any_work(cli: Cli, project: Path, tmp_path: Path) -> None:
    target = tmp_path / "a-file"
    target.write_text("data")
    res = cli("venv", "cpu-py311", str(target), "--project", str(project))
    assert res.code == 2 and f"{target} is a file, not a folder" in res.err  # was exit 70, NotADirectoryError
    assert target.read_text() == "data"


def test_venv_passes_over_an_interpreter_on_path_that_does_not_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pyenv shim for a version installed but not selected is on PATH and exits 127: `venv` said
    "cannot run the interpreter" with pyenv's whole text and no fix, and never tried the others."""
    import sys

    from envbuild import venv
    from envbuild.errors import VenvError
    from envbuild.profile import Profile

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    mine = f"{sys.version_info.major}.{sys.version_info.minor}"
    for name in (f"python{mine}", "python3.99"):
        shim = bin_dir / name
        shim.write_text(f"#!/bin/sh\necho 'pyenv: {name}: command not found' >&2\nexit 127\n")
        shim.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    prof = Profile.model_validate(
        {
            "name": "cpu-py" + mine.replace(".", ""),
            "accelerator": "cpu",
            "python": mine,
            "torch": "2.3.1",
            "numpy": "1.26.4",
        }
    )
    assert venv.find_python(prof) == sys.executable  # the shim failed; this interpreter is the version
    other = prof.model_copy(update={"python": "3.99"})
    with pytest.raises(VenvError) as caught:
        venv.find_python(other)
    assert f"{bin_dir}/python3.99 does not run (pyenv: python3.99: command not found)" in str(caught.value)
    assert f"{sys.executable} is Python {mine}" in str(caught.value)
    assert "pass --python /path/to/python3.99" in caught.value.hint


def test_venv_of_a_conda_profile_names_the_tool_that_makes_it(cli: Cli, project: Path, tmp_path: Path) -> None:
    """uv was handed conda-lock.yml as a requirements file: "Couldn't parse requirement ...
    content_hash:", fix "uv's message above says why"."""
    target = tmp_path / "env"
    res = cli("venv", "cpu-py311-conda", str(target), "--project", str(project))
    assert res.code == 2 and "cpu-py311-conda is a conda profile" in res.err, res.err
    assert f"micromamba create -p {target} -f lockfiles/cpu-py311-conda/conda-lock.yml" in res.err
    assert not target.exists()


@pytest.mark.parametrize(
    ("value", "why"),
    [("/nonexistent/python3", "does not exist"), ("python9.9", "is not on PATH"), ("/", "is a folder")],
)
@pytest.mark.parametrize("command", [["venv", "cpu-py311", "DIR"], ["smoke", "--local", "cpu-py311"]])
def test_a_python_that_cannot_run_is_a_usage_error(
    cli: Cli, project: Path, tmp_path: Path, command: list[str], value: str, why: str
) -> None:
    # venv said exit 4 "cannot run the interpreter ... [Errno 2]", smoke --local exit 8: a mistyped option
    args = [str(tmp_path / "v") if a == "DIR" else a for a in command]
    res = cli(*args, "--python", value, "--project", str(project))
    assert res.code == 2 and f"--python {value}: {why}" in res.err
    assert not (tmp_path / "v").exists()


@pytest.mark.parametrize(
    ("args", "message", "hint"),
    [
        (["--python", "python3"], "--python goes with --local", "envbuild smoke --local cpu-py311 --python python3"),
        (["--lock-match", "loose"], "--lock-match 'loose': use exact, pins or none", "envbuild smoke"),
        (["--local", "--shm-size", "8g"], "--shm-size is for a run in a container", "smoke cpu-py311 --shm-size 8g"),
        (["--local", "--ipc-host"], "--ipc-host is for a run in a container", "envbuild smoke cpu-py311 --ipc-host"),
        (["--local", "--tag", "reg/x"], "--tag is for a run in a container", "envbuild smoke cpu-py311 --tag reg/x"),
        (["--shm-size", "8g", "--ipc-host"], "--shm-size and --ipc-host", "envbuild smoke cpu-py311 --ipc-host"),
    ],
)
def test_smoke_options_of_the_other_mode_are_refused(
    cli: Cli, project: Path, args: list[str], message: str, hint: str
) -> None:
    # they were ignored: e.g. the image's interpreter ran while the user believed theirs was checked
    res = cli("smoke", "cpu-py311", *args, "--project", str(project))
    assert res.code == 2 and message in res.err and hint in res.err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--no-smoke", "--gpus", "all"], "--gpus is for the smoke test, and --no-smoke runs none"),
        (["--no-smoke", "--smoke-timeout", "60"], "--smoke-timeout is for the smoke test, and --no-smoke runs none"),
        (["--context-only", "--gpus", "none"], "--gpus is for the smoke test, and --context-only runs none"),
    ],
)
def test_build_smoke_options_without_a_smoke_test_are_refused(
    cli: Cli, project: Path, args: list[str], message: str
) -> None:
    # they were ignored: `--no-smoke --gpus all` built an untested image while asking for a GPU test
    res = cli("build", "cpu-py311", *args, "--project", str(project))
    assert res.code == 2 and message in res.err


def test_smoke_local_of_a_name_that_is_no_profile_names_the_closest(cli: Cli, project: Path) -> None:
    # it said "--local needs a profile name" although one was given
    res = cli("smoke", "--local", "cpu-py31", "--project", str(project))
    assert res.code == 2 and "no profile 'cpu-py31'" in res.err and "did you mean cpu-py312, cpu-py311" in res.err


@pytest.mark.parametrize("option", [["--upgrade"], ["-P", "numpy"]])
def test_lock_check_with_an_upgrade_is_refused(cli: Cli, project: Path, option: list[str]) -> None:
    # it said "1 lockfile(s) fresh" and upgraded nothing
    res = cli("lock", "cpu-py311", "--check", *option, "--project", str(project))
    assert res.code == 2 and f"--check and {option[0]} do not go together" in res.err


def test_run_with_both_shm_size_and_ipc_host_is_refused(cli: Cli, project: Path) -> None:
    # the size was dropped without a word (docker's --ipc=host shares the host's /dev/shm)
    res = cli("run", "cpu-py311", "--ipc-host", "--shm-size", "1g", "--project", str(project))
    assert res.code == 2 and "--shm-size and --ipc-host" in res.err and "envbuild run cpu-py311 --ipc-host" in res.err


def test_render_refuses_a_base_that_is_not_an_image(cli: Cli, project: Path) -> None:
    # it rendered ARG BASE_IMAGE="bad image" and exited 0; build refused the same value
    res = cli("render", "cpu-py311", "--base", "bad image", "--project", str(project))
    assert res.code == 2 and "--base 'bad image' is not an image reference" in res.err and res.out == ""


def test_a_find_links_folder_that_does_not_exist_is_named_before_any_work(
    cli: Cli, project: Path, tmp_path: Path
) -> None:
    # build went on to the base image and lock resolved without the wheels; now it is a usage error
    shutil.copytree(REPO / "lockfiles" / "cpu-py311", project / "lockfiles" / "cpu-py311")
    missing = tmp_path / "no-wheels"
    res = cli("venv", "cpu-py311", str(tmp_path / "v"), "--find-links", str(missing), "--project", str(project))
    assert res.code == 2 and f"--find-links: {missing} does not exist" in res.err
    (project / "envbuild.toml").write_text('[envbuild]\nfind_links = ["wheels"]\n')
    res = cli("venv", "cpu-py311", str(tmp_path / "v"), "--project", str(project))
    assert res.code == 2 and f"envbuild.toml: wheels does not exist ({project / 'wheels'})" in res.err
    assert not (tmp_path / "v").exists()


def test_ci_github_checks_its_registry_and_names_a_missing_workflow(cli: Cli, project: Path, tmp_path: Path) -> None:
    # 'bad reg' went into the workflow's push step as it stood
    res = cli("ci", "github", "--registry", "bad reg", "--project", str(project))
    assert res.code == 2 and "--registry 'bad reg' is not a registry path" in res.err and res.out == ""
    ok = cli("ci", "github", "--registry", "${{ vars.REGISTRY }}/envs", "--project", str(project))
    assert ok.code == 0 and "REGISTRY: ${{ vars.REGISTRY }}/envs/envbuild" in ok.out
    missing = tmp_path / "wf.yml"
    res = cli("ci", "github", "--check", "-o", str(missing), "--project", str(project))
    assert res.code == 1 and f"{missing} is missing" in res.err and "lockfile" not in res.err


@pytest.mark.parametrize("command", [["lock", "cpu-py311"], ["venv", "cpu-py311", "v"], ["build", "cpu-py311"]])
def test_index_options_must_be_urls(cli: Cli, project: Path, command: list[str]) -> None:
    # 'notaurl' went to the resolver (a DNS error about another host); 'ftp://x' became a folder
    res = cli(*command, "--index-url", "notaurl", "--project", str(project))
    assert res.code == 2 and "--index-url 'notaurl' is not an http(s):// or file:// URL" in res.err
    res = cli(*command, "--torch-index", "ftp://x", "--project", str(project))
    assert res.code == 2 and "--torch-index 'ftp://x' is not an http(s):// or file:// URL" in res.err


def test_envbuild_toml_index_url_must_be_a_url(cli: Cli, project: Path) -> None:
    (project / "envbuild.toml").write_text('[envbuild]\nindex_url = "pypi.org/simple"\n')
    res = cli("list", "--project", str(project))
    assert res.code == 2 and "envbuild.toml: index_url 'pypi.org/simple' is not an http(s):// or file:// URL" in res.err


def test_upgrade_package_that_the_lock_does_not_have_is_refused(cli: Cli, project: Path) -> None:
    # a typo re-locked, changed nothing and said "no package would change"
    shutil.copytree(REPO / "lockfiles" / "cpu-py311", project / "lockfiles" / "cpu-py311")
    res = cli("lock", "cpu-py311", "-P", "nmupy", "--dry-run", "--project", str(project))
    assert res.code == 2 and "-P nmupy: not in cpu-py311's lockfile" in res.err
    assert "did you mean -P numpy?" in res.err


def test_a_lock_still_resolving_says_so_in_a_log(cli: Cli, project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a live table (CI), a stalled index made `lock` silent for the minutes uv retries."""
    import time

    from envbuild import lock as lk
    from envbuild.cli import locking
    from envbuild.lockopts import LockOutcome

    def slow(proj: object, names: list[str], opts: object, jobs: int, events: Callable[..., None]) -> list[object]:
        events("cpu-py311", "resolving", "venv: x86_64")
        time.sleep(0.5)
        events("cpu-py311", "locked", "done")
        time.sleep(0.3)  # no beat for a profile that is done
        return [LockOutcome("cpu-py311", "locked", "done", 0.8)]

    monkeypatch.setattr(locking, "HEARTBEAT_S", 0.2)
    monkeypatch.setattr(lk, "lock_many", slow)
    res = cli("lock", "cpu-py311", "--project", str(project))
    assert res.code == 0, res.err
    beats = [line for line in res.err.splitlines() if line.startswith("cpu-py311: still resolving (")]
    assert 1 <= len(beats) <= 2, res.err


def test_a_command_typed_in_a_folder_inside_the_project_finds_it(
    cli: Cli, project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From profiles/ itself, or from the project's code, `envbuild status` said "profiles/ does not
    exist". The search goes up to the top of the git checkout and no further; paths typed on the
    command line stay relative to the folder they were typed in."""
    monkeypatch.delenv("ENVBUILD_PROJECT", raising=False)
    (project / ".git").mkdir()
    (project / "src" / "pkg").mkdir(parents=True)
    for inside in (project / "profiles", project / "src" / "pkg"):
        monkeypatch.chdir(inside)
        res = cli("list", "--json")
        assert res.code == 0, res.err
        assert "cpu-py311" in {row["name"] for row in json.loads(res.out)}
    res = cli("render", "cpu-py311", "-o", "rendered")
    assert res.code == 0, res.err
    assert (project / "src" / "pkg" / "rendered" / "Dockerfile").is_file()
    # a folder in another checkout below a project's folder, or in none, is its own (new) project
    for own in (project / "vendored", tmp_path / "elsewhere"):
        (own / "sub").mkdir(parents=True)
        if own.parent == project:
            (own / ".git").write_text("gitdir: /somewhere/else\n")  # a worktree's .git is a file
        monkeypatch.chdir(own / "sub")
        res = cli("list")
        assert res.code == 0 and "profiles/ does not exist" in res.err, (own, res.err)


def test_messages_name_files_from_the_folder_the_command_was_typed_in(
    cli: Cli, project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From a folder of the project's code, `profiles/x.yaml:3` named a file the terminal could not
    open from there, and validate's own fix (`envbuild validate profiles/x.yaml`) failed as typed."""
    monkeypatch.delenv("ENVBUILD_PROJECT", raising=False)
    (project / ".git").mkdir()
    (project / "src" / "pkg").mkdir(parents=True)
    bad = project / "profiles" / "cpu-py311-bad.yaml"
    bad.write_text('name: cpu-py311-bad\nextends: cpu-py311\npython: "3.9"\n')
    for folder, shown in (
        (project / "src" / "pkg", "../../profiles/cpu-py311-bad.yaml"),
        (project, "profiles/cpu-py311-bad.yaml"),
        (tmp_path, "profiles/cpu-py311-bad.yaml"),  # outside, with --project: as the project names it
    ):
        monkeypatch.chdir(folder)
        res = cli("validate", "cpu-py311-bad", "--project", str(project))
        assert res.code == 2, res.err
        assert f"error {shown}:3: python" in res.out, (folder, res.out)
        if folder != tmp_path:
            assert cli("validate", shown, "--project", str(project)).code == 2  # the path opens from there
    monkeypatch.chdir(project / "src" / "pkg")
    assert "error ../../profiles/cpu-py311-bad.yaml:3: python" in cli("validate", "--all").out


def test_a_current_folder_deleted_under_the_shell_is_a_usage_error(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shell still in a folder that was removed (a checkout that dropped it, `rm -rf` from
    another terminal): every command said "internal error: FileNotFoundError", exit 70."""
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    monkeypatch.delenv("ENVBUILD_PROJECT", raising=False)
    gone.rmdir()
    for args in (["list"], ["lock", "cpu-py311", "--upgrade"], ["validate", "--all"]):
        res = cli(*args)
        assert res.code == 2, (args, res.err)
        assert "the current folder no longer exists" in res.err and "--project DIR" in res.err
    res = cli("list", "--project", str(tmp_path))  # the fix it gives: an absolute --project works
    assert res.code == 0 and "no longer exists" not in res.err, res.err


@pytest.mark.parametrize(
    ("args", "fix"),
    [
        (["cpu-py311", "--only", "dpp"], "fix: envbuild smoke cpu-py311 --only ddp"),
        (["--local", "cpu-py311", "--only", "labels"], "fix: envbuild smoke --local cpu-py311 --only"),
        (["cpu-py311", "--only", "check:"], "fix: envbuild smoke cpu-py311 --only"),
    ],
)
def test_smoke_only_with_a_name_that_is_no_check_is_refused_before_anything_runs(
    cli: Cli, project: Path, args: list[str], fix: str
) -> None:
    res = cli("smoke", *args, "--project", str(project))
    assert res.code == 2, res.err
    assert "no such check; the checks are versions, integrity" in res.err and fix in res.err


def test_smoke_only_takes_a_comma_separated_list_and_names_the_one_wrong_entry(cli: Cli, project: Path) -> None:
    """`--only versions,dpp` as most CLIs take a list: each entry is checked on its own, so the error
    names the misspelt one, not the whole string."""
    res = cli("smoke", "cpu-py311", "--only", "versions, dpp", "--project", str(project))
    assert res.code == 2, res.err
    assert "--only 'dpp': no such check" in res.err and "fix: envbuild smoke cpu-py311 --only ddp" in res.err
    assert only_names(["versions,integrity", " ddp ,versions", ","]) == ["versions", "integrity", "ddp"]
    # an --only that names nothing is refused, not taken for no --only (the whole test)
    res = cli("smoke", "cpu-py311", "--only", "", "--project", str(project))
    assert res.code == 2 and "--only '': no such check" in res.err, res.err
