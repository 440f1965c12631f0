"""Run one command and write its wall time and resource usage as JSON: the harness's launcher.

Why a separate small process: when a process execs, Linux folds the RSS high-water mark of
the memory it had before the exec into the new program's ru_maxrss. Spawned straight from
the benchmark (tens of MiB), every contender would report at least that. Spawned from this
launcher (run as `python -I -S`), the floor is the launcher's own ~10 MiB.

Usage: python -I -S bench/spawn.py RESULT.json ARGV...
"""

import json
import os
import sys
import time


def main() -> int:
    result, argv = sys.argv[1], sys.argv[2:]
    spawned_at = time.time()  # wall clock, to compare with a server's request log
    start = time.perf_counter()
    pid = os.posix_spawnp(argv[0], argv, os.environ)
    _, status, usage = os.wait4(pid, 0)
    wall = time.perf_counter() - start
    with open(result, "w") as f:
        json.dump({
            "wall_s": wall,
            "spawned_at": spawned_at,
            "returncode": os.waitstatus_to_exitcode(status),
            "user_s": usage.ru_utime,
            "sys_s": usage.ru_stime,
            "maxrss_kib": usage.ru_maxrss,
        }, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
