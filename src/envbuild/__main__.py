"""`envbuild` and `python -m envbuild` start here."""

import signal
import sys
from types import FrameType
from typing import NoReturn

_signalled: list[int] = []


def _terminated(signum: int, frame: FrameType | None) -> None:
    # SIGTERM (docker stop, a cancelled CI job, `timeout`) unwinds like Ctrl-C, so the same
    # cleanups run: the smoke container is removed, temporary files go, no tag moves.
    if _signalled:
        return  # a second SIGTERM must not cut the cleanup the first one started short
    _signalled.append(signum)
    raise KeyboardInterrupt


def main() -> None:
    import gc

    signal.signal(signal.SIGTERM, _terminated)

    # Start-up creates a few hundred thousand objects (typer, the command tree) that live until
    # exit; letting the cycle collector walk them again and again while they are being created
    # costs ~40 ms of every invocation. Freeze them instead and collect normally from then on.
    gc.disable()
    from envbuild import lockahead

    lockahead.start(sys.argv[1:])  # a re-lock's resolve runs while the CLI below loads
    from envbuild import cli

    cli.prepare()
    gc.freeze()
    gc.enable()
    code = cli.run(sys.argv[1:])
    if _signalled:
        print("envbuild: terminated; cleaned up what it had started", file=sys.stderr)
        code = 128 + _signalled[0]
    elif code == 130:  # Ctrl-C: said as SIGTERM is, so a log shows why it stopped
        print("envbuild: interrupted; cleaned up what it had started", file=sys.stderr)
    _exit(code)


def _exit(code: int) -> NoReturn:
    """Exit without the interpreter's teardown when nothing else runs. Freeing every module and
    object one by one takes ~30 ms after the work is done (a tenth of a warm re-lock); the system
    frees a process's memory at once. What must still happen does: the atexit handlers (temporary
    folders, an early resolve to stop, logging) and the flush of stdout and stderr. Python never
    promised to run __del__ at exit, so nothing may rely on it. With another thread alive (it may
    be writing), the normal exit waits for it as always."""
    import threading

    if threading.active_count() > 1:
        sys.exit(code)
    import atexit
    import os

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a reader that went away (`| head`), or a closed stream
            code = code or 120  # as Python's own exit reports a failed flush
    os._exit(code)


if __name__ == "__main__":
    main()
