"""Entry point: a plain `pull` (warm or cold) without importing the full command line, else run it."""

import gc
import os
import sys

from modelsync import interrupt


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


if __name__ == "__main__":
    main()
