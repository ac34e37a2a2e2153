"""The smoke container runs this envbuild's copy of the smoke test, whatever the image carries."""

from __future__ import annotations

import io
import tarfile

from envbuild import buildctx, plan
from envbuild.smoke import container


def test_the_host_copy_is_the_package_and_entry_script_readable_by_any_uid_and_owned_by_root() -> None:
    with tarfile.open(fileobj=io.BytesIO(container.host_smoke_tar())) as tar:
        members = {m.name: m for m in tar.getmembers()}
        root = container.HOST_SMOKE_DIR.lstrip("/")
        for name, text in plan.smoke_sources().items():
            member = members[f"{root}/{buildctx.SMOKE_PACKAGE}/{name}"]
            assert (member.mode, member.uid) == (0o644, 0)
            extracted = tar.extractfile(member)
            assert extracted is not None and extracted.read().decode() == text
        entry = tar.extractfile(members[f"{root}/entrypoint"])
        assert entry is not None and entry.read().decode() == buildctx.ENTRY_SCRIPT_TEXT
        assert members[root].isdir() and members[root].mode == 0o755


def test_the_container_starts_the_host_copy_first_on_the_path_under_the_engines_init() -> None:
    inspected = {"Config": {"Env": ["PATH=/opt/venv/bin:/usr/bin", "PYTHONPATH=/app/src"]}}
    command, kwargs = container.settings(
        inspected, "none", 120, min_peak=None, lock_match="pins", ipc_host=False, shm_size="2g"
    )
    assert command[:3] == ["python", "-m", buildctx.SMOKE_PACKAGE] and command[-2:] == ["--lock-match", "pins"]
    # the image's ENTRYPOINT and its own entry script are not run; the working folder is ours (-m
    # puts it first on sys.path); the image's PYTHONPATH still follows, for its own checks
    assert kwargs["entrypoint"] == ["/bin/sh", f"{container.HOST_SMOKE_DIR}/entrypoint"]
    assert kwargs["init"] is True and kwargs["working_dir"] == container.HOST_SMOKE_DIR
    assert kwargs["environment"]["PYTHONPATH"] == f"{container.HOST_SMOKE_DIR}:/app/src"
    assert kwargs["shm_size"] == "2g"
    assert container.is_smoke_command(command)
    assert container.is_smoke_command(["envbuild-smoke", "--json", "-"])  # an earlier envbuild's
    assert not container.is_smoke_command(["true"])
