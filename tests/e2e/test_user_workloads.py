"""What users run in an image that passed: torch.compile, export, their own checks, and images
built FROM it with one more package."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import shutil
import tarfile
import zipfile
from pathlib import Path
from typing import Any

import pytest

from envbuild import smokerecord
from envbuild.smoke import host

from .conftest import CA, envbuild

pytestmark = pytest.mark.e2e


def _check(report: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in report["checks"] if c["name"] == name)


def _run(cli: Any, image: str, *cmd: str) -> str:
    return str(cli.containers.run(image, list(cmd), remove=True).decode())


def test_the_build_smoke_report_has_compile_export_perf_and_the_project_check(built_cpu: dict[str, Any]) -> None:
    report = built_cpu["smoke"]
    assert report["passed"], host.summary(report)
    compiled = _check(report, "compile")
    assert compiled["status"] == "pass" and compiled["facts"]["first_call_s"] > 0
    assert compiled["facts"]["toolchain"]["cxx"] and compiled["facts"]["toolchain"]["python_headers"]
    # Debian's g++ links libstdc++ shared, so what it builds loads next to torch (the H200 host's
    # compiler did not, and its AOTInductor packages crashed: docs/GPU-SMOKE.md)
    assert compiled["facts"]["toolchain"]["libstdcxx"]["linkage"] == "shared"
    assert "libstdc++.so.6" in compiled["facts"]["toolchain"]["libstdcxx"]["needed"]
    assert compiled["facts"]["vec_isa_probe_s"] > 0 and compiled["facts"]["runs"][0]["vec_isa"]
    # inductor's CPU probe ran beside the checks before this one (vecprobe), and was taken here
    assert compiled["facts"]["runs"][0]["vec_isa_early"] is True
    export = _check(report, "export")
    assert export["status"] == "pass" and export["facts"]["format"] == "torch.export"
    assert export["facts"]["onnx"].startswith("skip: onnx is not in the lockfile")
    perf = _check(report, "perf")
    assert perf["status"] == "pass" and perf["facts"]["cpu_fp32_gflops"] > 0
    own = _check(report, "check:train_tiny.py")
    assert own["status"] == "pass" and own["facts"]["exit_code"] == 0
    assert any("checkpoint saved and reloaded" in line for line in own["facts"]["stdout_tail"])


def test_torch_compile_runs_in_the_image(docker_client: Any, built_cpu: dict[str, Any]) -> None:
    """The issue's own reproduction: `No working C++ compiler found` in an image that passed."""
    code = (
        "import torch; m = torch.compile(torch.nn.Linear(8, 8)); "
        "y = m(torch.randn(4, 8)); y.sum().backward(); print('compiled', tuple(y.shape))"
    )
    assert "compiled (4, 8)" in _run(docker_client, built_cpu["image_id"], "python", "-c", code)


def test_a_login_shell_in_the_image_finds_the_environment_and_keeps_its_constraints(
    docker_client: Any, built_cpu: dict[str, Any]
) -> None:
    """`bash -l` (workflow engines start each task so, VS Code probes the environment so) ran
    Debian's /etc/profile, which sets PATH anew: `python: command not found`. `su -` also dropped
    PIP_CONSTRAINT, so pip there could replace the tested torch."""
    image = built_cpu["image_id"]
    script = "command -v python; command -v pip; python -c 'import torch; print(torch.__version__)'"
    out = _run(docker_client, image, "bash", "-lc", script).split()
    assert out[:2] == ["/opt/venv/bin/python", "/opt/envbuild/bin/pip"] and out[2].endswith("+cpu"), out
    held = "echo $PIP_CONSTRAINT; command -v python"
    out = docker_client.containers.run(image, ["su", "-", "envbuild", "-c", held], user="0", remove=True)
    assert out.decode().split() == ["/opt/envbuild/constraints.txt", "/opt/venv/bin/python"]
    # an override the user gave is kept, not put back
    out = docker_client.containers.run(
        image, ["bash", "-lc", "echo [$PIP_CONSTRAINT]"], environment={"PIP_CONSTRAINT": ""}, remove=True
    )
    assert out.decode().strip() == "[]"


def test_a_users_cpp_extension_builds_and_runs_in_the_image(docker_client: Any, built_cpu: dict[str, Any]) -> None:
    """torch.utils.cpp_extension.load_inline, as the image's user: g++, the Python headers, torch's
    own headers and ninja (torch refuses to build without it: `Ninja is required to load C++
    extensions`, which an image with g++ alone answered)."""
    code = (
        "import torch; from torch.utils.cpp_extension import load_inline; "
        "m = load_inline(name='add_one', cpp_sources=['torch::Tensor add_one(torch::Tensor x) { return x + 1; }'], "
        "functions=['add_one']); print('extension', m.add_one(torch.zeros(3)).tolist())"
    )
    assert "extension [1.0, 1.0, 1.0]" in _run(docker_client, built_cpu["image_id"], "python", "-c", code)
    compiled = _check(built_cpu["smoke"], "compile")
    assert compiled["facts"]["toolchain"]["ninja"] == "/usr/bin/ninja"


def test_a_small_gpt_trains_compiled_and_exports_for_serving_in_the_image(
    docker_client: Any, built_cpu: dict[str, Any]
) -> None:
    """checks/train_gpt.py, as the image's user: torch.compile of a whole training step, bf16
    autocast, SDPA, a checkpoint, torch.export and an AOTInductor package loaded back and run (on
    the lent H200 the package's load crashed in a host install whose compiler linked libstdc++
    statically: docs/GPU-SMOKE.md)."""
    script = (Path(__file__).parents[2] / "checks" / "train_gpt.py").read_text()
    out = _run(docker_client, built_cpu["image_id"], "python", "-c", script)
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["device"] == "cpu"
    assert summary["export"]["torch.export"] == "saved, loaded, same answer"
    assert summary["export"]["aoti"].endswith("same answer"), summary["export"]


def test_a_failing_project_check_fails_the_smoke_test_and_is_named(
    docker_client: Any, built_cpu: dict[str, Any]
) -> None:
    broken = docker_client.images.build(
        fileobj=io.BytesIO(
            (
                f"FROM {built_cpu['image_id']}\nUSER root\n"
                "RUN printf 'import sys\\nprint(\"diverged\", file=sys.stderr)\\nsys.exit(3)\\n' "
                "> /opt/envbuild/checks/train_tiny.py\nUSER 1000:1000\n"
            ).encode()
        ),
        rm=True,
    )[0]
    try:
        report = host.run_in_image(docker_client, broken.id, gpus="none", accelerator="cpu")
        assert not report["passed"] and report["failed"] == ["check:train_tiny.py"]
        own = _check(report, "check:train_tiny.py")
        assert own["reason"] == "train_tiny.py exited 3: diverged" and own["facts"]["stderr_tail"] == ["diverged"]
    finally:
        docker_client.images.remove(broken.id, force=True)


def _wheel(
    folder: Path,
    module: str = "hello_envbuild",
    version: str = "1.0",
    body: bytes = b"GREETING = 'hello from a derived image'\n",
) -> Path:
    """A real, minimal wheel made here (no index needed): hello-envbuild 1.0, or another module's."""
    info = f"{module}-{version}.dist-info"
    name = f"{module}-{version}-py3-none-any.whl"
    files = {
        f"{module}/__init__.py": body,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {module.replace('_', '-')}\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: envbuild-e2e\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{info}/RECORD,,")
    files[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    out = folder / name
    with zipfile.ZipFile(out, "w") as zf:
        for path, data in files.items():
            zf.writestr(path, data)
    return out


def _build_with(cli: Any, dockerfile: str, wheel: Path) -> Any:
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as tar:
        for name, data in (("Dockerfile", dockerfile.encode()), (wheel.name, wheel.read_bytes())):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    context.seek(0)
    # forcerm: the build that is meant to fail leaves no container behind
    return cli.images.build(fileobj=context, custom_context=True, rm=True, forcerm=True)[0]


def test_an_image_built_from_an_envbuild_image_adds_a_package(
    docker_client: Any, built_cpu: dict[str, Any], tmp_path: Path, e2e_project: Path
) -> None:
    """The README's derived Dockerfile: FROM the image and pip install, no USER lines (the environment
    belongs to the image's user). A USER the environment does not belong to is refused and told how
    to fix it; USER root works as well."""
    import docker

    wheel = _wheel(tmp_path)
    install = f"COPY {wheel.name} /tmp/\nRUN pip install --no-cache-dir --no-index /tmp/{wheel.name}\n"
    with pytest.raises(docker.errors.BuildError) as refused:
        _build_with(docker_client, f"FROM {built_cpu['image_id']}\nUSER 4242:4242\n{install}", wheel)
    said = "".join(str(e.get("stream", "")) + str(e.get("error", "")) for e in refused.value.build_log)
    assert "Permission denied" in said
    assert "belongs to uid 1000, not to uid 4242" in said
    assert "in a Dockerfile, put 'USER root' before this step and 'USER 4242:4242' after it" in said
    as_root = _build_with(docker_client, f"FROM {built_cpu['image_id']}\nUSER root\n{install}USER 1000:1000\n", wheel)
    docker_client.images.remove(as_root.id, force=True)
    image = _build_with(docker_client, f"FROM {built_cpu['image_id']}\n{install}", wheel)
    try:
        # the environment is the user's, in every layer; what holds it and the smoke test stay root's
        site = "/opt/venv/lib/python3.11/site-packages"
        expected = {
            "/opt": 0, "/opt/venv": 1000, "/opt/venv/bin/python": 1000, site: 1000,
            f"{site}/torch/__init__.py": 1000, f"{site}/numpy": 1000, "/opt/envbuild/manifest.json": 0,
        }  # fmt: skip
        owners = _run(docker_client, built_cpu["image_id"], "stat", "-c", "%u %n", *expected)
        assert owners.split("\n")[: len(expected)] == [f"{uid} {path}" for path, uid in expected.items()], owners
        # it inherits io.envbuild.smoke=passed, but it is not the image that passed
        assert smokerecord.state(docker_client.images.get(built_cpu["image_id"]).attrs) == "passed"
        assert smokerecord.state(image.attrs) == "altered"
        said = _run(docker_client, image.id, "python", "-c", "import hello_envbuild; print(hello_envbuild.GREETING)")
        assert "hello from a derived image" in said
        # --lock-match pins: the locked pins hold, the added distribution is listed, the check passes
        out = _run(
            docker_client, image.id, "envbuild-smoke", "--only", "versions", "--only", "integrity",
            "--lock-match", "pins", "--json", "-",
        )  # fmt: skip
        report = json.loads(out)
        versions = _check(report, "versions")
        assert report["passed"] and versions["facts"]["not_in_lockfile"] == ["hello-envbuild"]
        assert _check(report, "integrity")["facts"]["added_distributions"] == ["hello-envbuild"]
        # the same from the host, as a user checks a derived image: envbuild smoke IMAGE --lock-match pins
        res = envbuild("smoke", image.id, "--lock-match", "pins", "--json", str(tmp_path / "r.json"), cwd=e2e_project)
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
        # it passes as it is, and is told apart from the image that passed at build (push refuses it)
        derived = json.loads((tmp_path / "r.json").read_text())
        assert derived["smoke_record"] == "altered"
        # what it added imports too, as its user's code will: one module more than the image's own
        imported = _check(built_cpu["smoke"], "imports")["facts"]["imported"]
        assert _check(derived, "imports")["facts"]["imported"] == imported + 1
        # and one that fails to import fails the check, by name (PyPI's CUDA torchvision beside a +cpu
        # torch says this on import)
        broken = docker_client.containers.run(
            image.id,
            ["sh", "-c", f"echo \"raise RuntimeError('operator torchvision::nms does not exist')\" >> "
             f"{site}/hello_envbuild/__init__.py && envbuild-smoke --only imports --lock-match pins --json -"],
            detach=True,
        )  # fmt: skip
        try:
            assert broken.wait()["StatusCode"] == 1
            failed = _check(json.loads(broken.logs(stdout=True, stderr=False).decode()), "imports")
            assert (
                failed["reason"].startswith("1 of ")
                and "hello_envbuild (hello-envbuild): RuntimeError" in failed["reason"]
            )
            assert failed["remedy"].startswith("hello-envbuild was built for another build of torch")
        finally:
            broken.remove(force=True)
        assert "is not an image that passed before: its smoke-test record does not hold" in res.stderr
        # the default (exact) still fails on it: the drift check for images that should be pristine
        exact = docker_client.containers.run(
            image.id, ["envbuild-smoke", "--only", "versions", "--json", "-"], detach=True
        )
        try:
            assert exact.wait()["StatusCode"] == 1
            failed = json.loads(exact.logs(stdout=True, stderr=False).decode())
            assert "not in the lockfile: hello-envbuild" in _check(failed, "versions")["reason"]
            assert "--lock-match pins" in _check(failed, "versions")["remedy"]  # says how to check such an image
        finally:
            exact.remove(force=True)
    finally:
        docker_client.images.remove(image.id, force=True)


def test_a_derived_install_that_moves_a_locked_package_is_told_which_pin_to_keep(
    docker_client: Any, built_cpu: dict[str, Any], tmp_path: Path
) -> None:
    """`pip install lightning` in a derived image took the locked fsspec back a year (lightning 2.5.1
    caps it), and --lock-match pins said "do not pip install into an envbuild environment", which is
    what a derived image is for. Here an install of another einops moves the locked 0.8.1."""
    wheel = _wheel(tmp_path, "einops", "0.7.0", b"__version__ = '0.7.0'\n")
    install = f"COPY {wheel.name} /tmp/\nRUN pip install --no-cache-dir --no-index --no-deps /tmp/{wheel.name}\n"
    image = _build_with(docker_client, f"FROM {built_cpu['image_id']}\n{install}", wheel)
    try:
        only = ["--only", "versions", "--only", "integrity"]
        run = docker_client.containers.run(
            image.id, ["envbuild-smoke", *only, "--lock-match", "pins", "--json", "-"], detach=True
        )
        try:
            assert run.wait()["StatusCode"] == 1
            report = json.loads(run.logs(stdout=True, stderr=False).decode())
        finally:
            run.remove(force=True)
        versions, integrity = _check(report, "versions"), _check(report, "integrity")
        assert versions["reason"] == "versions differ from the lockfile: einops 0.7.0 (lock: 0.8.1)"
        assert "einops: " in integrity["reason"] and integrity["status"] == "fail"
        for check in (versions, integrity):
            assert check["remedy"].startswith(
                "the install in the image built FROM this one changed locked packages: add einops==0.8.1 to that "
                "pip install"
            ), check
    finally:
        docker_client.images.remove(image.id, force=True)


@pytest.mark.network
def test_a_package_with_no_wheel_is_built_from_its_sdist_and_a_hydra_app_runs(
    docker_client: Any, built_cpu: dict[str, Any], e2e_project: Path, repo_name: str, tmp_path: Path
) -> None:
    """hydra-core needs antlr4-python3-runtime 4.9.3, which PyPI has only as an sdist. `lock` took
    it and `build` failed 73 s in: the builder installs with --only-binary :all:. Now the builder
    makes its wheel from the hash-checked sdist, with the build backend requirements.lock pins."""
    from envbuild import lockfile

    from .conftest import local_build, variant

    proj = variant(e2e_project, tmp_path / "hydra", "cpu-py311-hydra", '["einops==0.8.1", "hydra-core==1.3.2"]')
    folder = proj / "lockfiles" / "cpu-py311-hydra"
    assert lockfile.sdist_only((folder / "pylock.toml").read_text()) == {"antlr4-python3-runtime"}
    setuptools = lockfile.parse_requirements((folder / "requirements.lock").read_text())["setuptools"].version
    res = envbuild(*local_build("cpu-py311-hydra", repo_name), "--no-smoke", "--json", cwd=proj)
    assert res.returncode == 0, res.stderr[-3000:]
    image = json.loads(res.stdout)["built_image_id"]
    try:
        app = (
            "import sys, hydra, torch\n"
            "from omegaconf import DictConfig\n"
            "@hydra.main(version_base=None, config_path=None)\n"
            "def main(cfg: DictConfig) -> None:\n"
            "    print('lr', cfg.get('lr'), torch.nn.Linear(2, 1)(torch.ones(1, 2)).shape[0])\n"
            "sys.argv = ['app', '+lr=0.05', 'hydra.run.dir=/tmp/out']\n"
            "main()\n"
        )
        assert _run(docker_client, image, "python", "-c", app).split() == ["lr", "0.05", "1"]
        wheel = _run(docker_client, image, "sh", "-c", "cat /opt/venv/lib/python3.11/site-packages/antlr4*/WHEEL")
        assert f"Generator: setuptools ({setuptools})" in wheel  # the locked backend, not today's newest
    finally:
        for tag in docker_client.images.get(image).tags:  # by tag: the image has cache children
            docker_client.images.remove(tag)


@pytest.mark.network
def test_an_image_with_pip_pyarrow_and_onnx_locked_passes_its_smoke_test_and_says_what_onnx_export_does(
    docker_client: Any, built_cpu: dict[str, Any], e2e_project: Path, repo_name: str, tmp_path: Path
) -> None:
    """Three good images the smoke test failed or overstated, each a common profile (2026-12-04):
    - pip locked (the answer to a scanner's advisories for the venv's bundled pip): finding where
      pip imports from made setuptools' distutils shim stand down, and torch.compile then found no
      distutils on Debian's python3.11;
    - pyarrow locked (datasets, pandas' Arrow strings): its _json extension module was taken for a
      copy of the standard library's, "loaded from outside the environment";
    - onnx locked without onnxscript: "onnx=exported" through the old exporter, while torch 2.13's
      plain torch.onnx.export (the dynamo exporter) fails for want of onnxscript."""
    from .conftest import local_build, variant

    packages = '["einops==0.8.1", "pip==26.3", "pyarrow==26.0.1", "onnx==1.23.2", "onnxruntime==1.32.0"]'
    proj = variant(e2e_project, tmp_path / "ml", "cpu-py311-ml", packages)
    res = envbuild(*local_build("cpu-py311-ml", repo_name), "--json", cwd=proj)
    out = json.loads(res.stdout) if res.stdout.strip() else {}
    image = out.get("built_image_id") or ""
    try:
        assert res.returncode == 0, res.stderr[-3000:]
        report = out["smoke"]
        assert report["passed"], host.summary(report)
        assert _check(report, "compile")["status"] == "pass"
        onnx = _check(report, "export")["facts"]["onnx"]
        assert onnx.startswith("exported, checked and run in onnxruntime with dynamo=False only"), onnx
        assert "needs onnxscript" in onnx
        assert _run(docker_client, image, "pip", "--version").startswith("pip 26.3 from /opt/venv/")
    finally:
        if image:
            for tag in docker_client.images.get(image).tags:  # by tag: the image has cache children
                docker_client.images.remove(tag)


def test_pip_in_an_image_built_from_it_keeps_the_tested_numpy_and_says_where_the_pin_comes_from(
    docker_client: Any, built_cpu: dict[str, Any]
) -> None:
    """A package that wants another numpy or torch made pip replace the tested one, silently (for
    torch: PyPI's default CUDA build over the CPU one; for torchvision, PyPI's CUDA build beside it).
    The image's PIP_CONSTRAINT keeps them; pip stops with its conflict, and the image's pip says where
    the constraint comes from."""
    env = {"PIP_CERT": "/ca.crt", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    ca = {CA: {"bind": "/ca.crt", "mode": "ro"}}

    def pip(*args: str, **more: str) -> tuple[int, str]:
        box = docker_client.containers.run(
            built_cpu["image_id"], ["pip", *args], user="0", environment={**env, **more}, volumes=ca, detach=True
        )
        try:
            code = int(box.wait(timeout=300)["StatusCode"])
            return code, box.logs().decode()
        finally:
            box.remove(force=True)

    code, said = pip("install", "--dry-run", "numpy==2.0.2")
    assert code == 1, said
    assert "(constraint) numpy==2.1.3" in said
    assert "in pip's conflict is this image's tested torch build or numpy (/opt/envbuild/constraints.txt)" in said
    assert "torchvision and torchaudio" not in said  # numpy's conflict: nothing about torch's companions
    # a failure that is not the constraint's doing (a misspelt name) gets pip's error alone
    code, said = pip("install", "--dry-run", "--no-index", "nonexistent-pkg-zz9")
    assert code == 1 and "No matching distribution found for nonexistent-pkg-zz9" in said, said
    assert "envbuild:" not in said
    code, said = pip("install", "--dry-run", "numpy==2.0.2", PIP_CONSTRAINT="")  # cleared: the user's choice
    assert code == 0 and "Would install numpy-2.0.2" in said, said
    # cpu-py311 locks no torchvision: PyPI's (a CUDA build) installed without a word and failed on
    # import ("operator torchvision::nms does not exist"). The one that pairs with torch, in its build,
    # is held, and pip is told which index has it.
    code, said = pip("install", "--dry-run", "torchvision")
    assert code == 1, said
    assert "(constraint) torchvision==0.28.0+cpu" in said
    assert "pip install --extra-index-url https://download.pytorch.org/whl/cpu ..." in said


@pytest.mark.network
def test_a_cpp_extension_sdist_with_build_requires_is_compiled_against_the_locked_torch_in_the_builder(
    docker_client: Any, built_cpu: dict[str, Any], e2e_project: Path, repo_name: str, tmp_path: Path
) -> None:
    """torch-scatter's case with a small sdist of our own, from a local folder the builder cannot
    read: the context carries it (matched by its locked sha256), the builder stage gets a compiler
    and builds it with the lockfile's torch in its isolated build environment, and none of the
    build's inputs (the wheels handed to it, the compiler's config file) reach the image."""
    from envbuild import lockfile

    from .conftest import BASE, WHEELS, layer_table, local_build, torch_extension_sdist

    proj = tmp_path / "ext"
    for part in ("profiles", "lockfiles", "checks"):
        shutil.copytree(e2e_project / part, proj / part)
    torch_extension_sdist(tmp_path / "sdists")
    text = (proj / "profiles" / "cpu-py311.yaml").read_text().replace("name: cpu-py311", "name: cpu-py311-ext")
    text = text.replace('packages: ["einops==0.8.1"]', 'packages: ["einops==0.8.1", "envbuild-addone==0.1"]')
    (proj / "profiles" / "cpu-py311-ext.yaml").write_text(text + "build_requires:\n  envbuild-addone: [torch]\n")
    (proj / "lockfiles" / "cpu-py311-ext").mkdir()
    shutil.copy(proj / "lockfiles" / "cpu-py311" / "requirements.lock", proj / "lockfiles" / "cpu-py311-ext")
    links = ["--find-links", WHEELS, "--find-links", str(tmp_path / "sdists")]
    res = envbuild("lock", "cpu-py311-ext", "--base", BASE, *links, cwd=proj)
    assert res.returncode == 0, res.stderr[-3000:]
    torch = lockfile.parse_requirements((proj / "lockfiles" / "cpu-py311-ext" / "requirements.lock").read_text())
    assert torch["torch"].version == "2.13.0+cpu"
    res = envbuild(
        *local_build("cpu-py311-ext", repo_name), "--find-links", str(tmp_path / "sdists"), "--json", cwd=proj
    )
    out = json.loads(res.stdout) if res.stdout.strip() else {}
    image = out.get("built_image_id") or ""
    try:
        assert res.returncode == 0, res.stderr[-3000:]
        assert out["smoke"]["passed"], host.summary(out["smoke"])
        code = "import torch, envbuild_addone as a; print(a.add_one(torch.arange(3.0)).tolist(), torch.__version__)"
        assert _run(docker_client, image, "python", "-c", code).split() == ["[1.0,", "2.0,", "3.0]", "2.13.0+cpu"]
        left = _run(docker_client, image, "sh", "-c", "ls /tmp/envbuild /opt/envbuild/build-requires.toml 2>&1; true")
        assert left.count("No such file or directory") == 2, left
        # the torch layer is the plain cpu-py311's, byte for byte: the compiler went to the builder only
        ours = layer_table(docker_client, built_cpu["built_image_id"])
        torch_layer = max((row for row in ours if row[1] == "COPY to /"), key=lambda row: row[2])
        assert torch_layer[0] in {d for d, _, _ in layer_table(docker_client, image)}
    finally:
        if image:
            for tag in docker_client.images.get(image).tags:  # by tag: the image has cache children
                docker_client.images.remove(tag)
