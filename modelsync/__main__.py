"""Entry point: a plain `pull` (warm or cold) without importing the full command line, else run it."""

import atexit
import gc
import os
import sys
from typing import NoReturn

from modelsync import interrupt

#: Python's own exit status when flushing stdout or stderr at exit fails
_FLUSH_FAILED = 120


def main() -> None:
    # The cache is shared by processes of several uids in one group (daemon, init containers):
    # whatever the inherited umask, files and directories modelsync creates stay group-writable.
    os.umask(os.umask(0) & ~0o070)
    interrupt.install()
    # Start-up allocates hundreds of thousands of objects (modules, classes, functions) that live
    # as long as the process: the collector's passes over them while they load are wasted work.
    # It runs again once the command's code is in: a pull's in foreground_pull, the full command
    # line's below; a warm pull ends first.
    gc.disable()
    try:
        from modelsync.plain_pull import try_cold_pull, try_warm_pull

        path = try_warm_pull(sys.argv[1:], os.environ)
        if path is not None:
            print(path)
            return
        cold = try_cold_pull(sys.argv[1:], os.environ)
        if cold is not None:
            sys.exit(cold)
        from modelsync.cli import run

        gc.enable()
        code = run(sys.argv[1:])
    except KeyboardInterrupt:  # outside a command (while parsing, or on the warm path)
        code = interrupt.report()
    sys.exit(code)


def run_and_exit() -> NoReturn:
    """The `modelsync` command (console script, `python -m modelsync`): `main()`, then the process ends
    without the interpreter's teardown.

    Tearing down the modules a pull imports (the S3 SDK, aiohttp) costs ~0.1 s of CPU after
    the ready path is printed: an init container's pod waits for it, and 16 node processes
    ending together on two cores took 6 s to exit after their last byte (docs/schedule.md,
    "The pool plan against a measured pool"). What the teardown does that matters is done
    here: exit handlers (logging's flush among them), then stdout and stderr. Where a
    non-daemon thread still runs, Python's own exit waits for it, as always.
    """
    try:
        main()
        code: str | int | None = 0
    except SystemExit as exc:
        code = 0 if exc.code is None else exc.code
    if not isinstance(code, int) or _other_threads_running():
        sys.exit(code)  # a message to print, or a thread to wait for: Python's own exit
    atexit._run_exitfuncs()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        code = _FLUSH_FAILED
    os._exit(code)


def _other_threads_running() -> bool:
    """A non-daemon thread besides this one is alive (threading is only looked at if imported)."""
    threading = sys.modules.get("threading")
    if threading is None:
        return False
    me = threading.current_thread()
    return any(t is not me and not t.daemon and t.is_alive() for t in threading.enumerate())


if __name__ == "__main__":
    run_and_exit()
