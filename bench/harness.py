"""Spawn a contender and measure it; run points in interleaved rounds; clean up on every exit.

What one measured run is:

* wall seconds: from spawning the contender to its exit; for a disk destination it also
  includes `sync -f` on the destination (the flush), so it is the durable end-to-end time;
* CPU seconds: user + system time of the contender's process and of every descendant it
  waited for, from `os.wait4` (the server's own CPU is not included);
* peak RSS: `ru_maxrss` from `os.wait4`, i.e. the largest single process of the contender's
  tree. Contenders start from a small launcher (`spawn.py`) because exec carries the
  spawning process's RSS high-water mark into ru_maxrss; the launcher's floor is ~10 MiB;
* the machine around it: load average at the end, and the CPU the rest of the machine
  (server, other jobs) spent meanwhile, so a run disturbed on a shared machine shows.

Every run is verified: all files present with their sizes, and in the first round their
xxh3-128 too. A contender that exits without the data is an error, never a fast result.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench import REPO
from bench.data import GiB, MiB, Prepared, check_files


class BenchError(Exception):
    """A problem the user must fix (tool missing, no space); printed as one line."""


# --------------------------------------------------------------------------- one process


@dataclass(frozen=True, slots=True)
class Measured:
    wall_s: float
    flush_s: float
    user_s: float
    sys_s: float
    maxrss_mib: float
    returncode: int
    stdout: str
    stderr_tail: str
    #: epoch seconds at the spawn, to compare with a server's request log
    spawned_at: float = 0.0
    #: CPU seconds the rest of the machine spent during the run (server, other jobs)
    other_cpu_s: float = 0.0


def kill_tree(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def machine_busy_cpu_s() -> float:
    """CPU seconds the whole machine has spent so far (all cores, neither idle nor iowait)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:8]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def measure(argv: list[str], env: dict[str, str], *, timeout: float, flush: Path | None,
            work: Path) -> Measured:
    """Run one contender through spawn.py, in its own session.

    Wall time is the launcher's spawn-to-exit (its own start-up is not counted), plus
    `sync -f flush` when given.
    """
    out_path, err_path, result = work / "stdout", work / "stderr", work / "usage.json"
    result.unlink(missing_ok=True)
    launcher = [sys.executable, "-I", "-S", str(Path(__file__).with_name("spawn.py")),
                str(result), *argv]
    busy_before = machine_busy_cpu_s()
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        start = time.monotonic()
        proc = subprocess.Popen(launcher, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=err, start_new_session=True)
        timer = threading.Timer(timeout, kill_tree, (proc.pid,))
        timer.start()
        try:
            proc.wait()
        except BaseException:  # Ctrl-C: take the contender and its workers down with us
            kill_tree(proc.pid)
            proc.wait()
            raise
        finally:
            timer.cancel()
            kill_tree(proc.pid)  # nothing of a contender may linger into the next run
    err_text = err_path.read_bytes()[-2000:].decode(errors="replace").strip()
    if not result.exists():
        why = f"killed after the {timeout:.0f} s timeout" if time.monotonic() - start >= timeout \
            else f"launcher exit {proc.returncode}"
        return Measured(time.monotonic() - start, 0.0, 0.0, 0.0, 0.0, -1, "",
                        f"{err_text}\n({why})".strip())
    usage = json.loads(result.read_text())
    flush_s = 0.0
    if flush is not None and usage["returncode"] == 0:
        synced = time.perf_counter()
        subprocess.run(["sync", "-f", str(flush)], check=True)
        flush_s = time.perf_counter() - synced
    own_cpu_s = usage["user_s"] + usage["sys_s"]
    return Measured(
        wall_s=usage["wall_s"] + flush_s, flush_s=flush_s, user_s=usage["user_s"],
        sys_s=usage["sys_s"], maxrss_mib=usage["maxrss_kib"] / 1024,
        returncode=usage["returncode"], stdout=out_path.read_text(errors="replace"),
        stderr_tail=err_text, spawned_at=usage["spawned_at"],
        other_cpu_s=max(0.0, machine_busy_cpu_s() - busy_before - own_cpu_s),
    )


def run_timeout(total_bytes: int) -> float:
    """Generous: a contender slower than 20 MiB/s plus a minute has hung."""
    return 60 + total_bytes / (20 * MiB)


def clear(path: Path) -> None:
    """Remove a destination, even one whose ready directories modelsync made read-only."""

    def retry_writable(func: Callable[[str], object], p: str, _exc: object) -> None:
        os.chmod(os.path.dirname(p), 0o700)
        func(p)

    if path.exists():
        shutil.rmtree(path, onerror=retry_writable)


def cpu_busy_share(sample_s: float = 0.5) -> float:
    """Share of all CPUs busy over `sample_s` (from /proc/stat)."""
    total = os.cpu_count() or 1
    before = machine_busy_cpu_s()
    time.sleep(sample_s)
    return (machine_busy_cpu_s() - before) / (sample_s * total)


def wait_quiet(max_wait_s: float) -> None:
    """Wait (at most `max_wait_s`) until the machine is mostly idle before a run.

    On a shared machine another job's burst would otherwise decide a round.
    """
    deadline = time.monotonic() + max_wait_s
    while max_wait_s > 0 and cpu_busy_share() >= 0.25 and time.monotonic() < deadline:
        time.sleep(0.5)


# --------------------------------------------------------------------------- points and rounds


@dataclass(frozen=True, slots=True)
class Point:
    """One contender process on one case: how to run it, where it writes, what must be there.

    `checks` pairs a files root with the data set that must be under it; a root of None
    means the contender writes nowhere (curl to /dev/null) and prints the byte count of
    every transfer on stdout instead.
    """

    case: str  # what is measured: "model-set-6g nginx xfs", "concurrency"
    label: str  # the x value within the case ("8", "1 GiB"); "" when there is one
    contender: str
    argv: list[str]
    env: dict[str, str]
    checks: tuple[tuple[Path | None, Prepared], ...]
    dest: Path  # emptied before and after each run
    flush: bool = False  # `sync -f` the destination after the run, and count it

    @property
    def total_bytes(self) -> int:
        return sum(p.dataset.total_bytes for _, p in self.checks)

    @property
    def files(self) -> int:
        return sum(p.dataset.count for _, p in self.checks)


@dataclass
class Run:
    case: str
    label: str
    contender: str
    round: int
    wall_s: float
    flush_s: float
    cpu_s: float
    maxrss_mib: float
    hashed: bool
    load_1m: float
    other_cpu_s: float
    error: str | None


def verify(pt: Point, m: Measured, full: bool) -> str | None:
    if m.returncode != 0:
        last = m.stderr_tail.splitlines()[-1] if m.stderr_tail else "no stderr"
        return f"exit {m.returncode}: {last}"
    for root, prep in pt.checks:
        if root is None:
            got, want = sum(int(x) for x in m.stdout.split()), prep.dataset.total_bytes
            if got != want:
                return f"transferred {got} bytes, expected {want}"
        elif error := check_files(root, prep.entries, full=full):
            return error
    return None


def rate_text(files: int, total_bytes: int, wall_s: float) -> str:
    """Files per second for sets of many files, GiB/s otherwise."""
    return f"{files / wall_s:.0f} files/s" if files >= 100 else f"{total_bytes / GiB / wall_s:.2f} GiB/s"


def run_points(points: Sequence[Point], rounds: int, work: Path, quiet_wait_s: float = 0.0
               ) -> Iterator[Run]:
    """Every point once per round, interleaved, so drift hits all alike, and each round starting one
    further along (A B C, B C A, C A B, ...): whatever slows the first runs on a fresh destination
    (a host's first writes to a loop image) does not fall on one contender every time."""
    timeout = run_timeout(max(pt.total_bytes for pt in points))
    for rnd in range(1, rounds + 1):
        turn = (rnd - 1) % len(points)
        for pt in [*points[turn:], *points[:turn]]:
            clear(pt.dest)
            pt.dest.mkdir(parents=True)
            if pt.flush:
                subprocess.run(["sync", "-f", str(pt.dest)], check=True)  # start clean
            wait_quiet(quiet_wait_s)
            m = measure(pt.argv, pt.env, timeout=timeout, flush=pt.dest if pt.flush else None,
                        work=work)
            hashed = rnd == 1 and all(root is not None for root, _ in pt.checks)
            error = verify(pt, m, full=rnd == 1)
            clear(pt.dest)
            run = Run(pt.case, pt.label, pt.contender, rnd, m.wall_s, m.flush_s, m.user_s + m.sys_s,
                      m.maxrss_mib, hashed, os.getloadavg()[0], m.other_cpu_s, error)
            speed = "" if error else rate_text(pt.files, pt.total_bytes, m.wall_s)
            print(f"  {pt.case} {pt.label} round {rnd}/{rounds} {pt.contender:9s} {m.wall_s:7.2f} s "
                  f"{speed:>13}  cpu {run.cpu_s:6.2f} s  rss {m.maxrss_mib:5.0f} MiB  load "
                  f"{run.load_1m:4.1f}  {error or ('ok, hashed' if hashed else 'ok')}", flush=True)
            yield run


# --------------------------------------------------------------------------- the process


def compile_modelsync(trees: Sequence[Path] = (REPO,)) -> None:
    """Byte-compile modelsync's modules in each source tree measured, as pip does when it
    installs the image's wheel.

    An editable checkout run with PYTHONDONTWRITEBYTECODE=1 (this machine exports it)
    compiles every modelsync module again in every measured process: about 20 ms of CPU
    in a warm pull and more in a cold one, which no node pays. An A/B's other tree (a
    worktree with no `__pycache__` yet) would pay it and this one not.
    """
    import compileall

    for tree in trees:
        compileall.compile_dir(tree / "modelsync", quiet=1)


def run_main(prog: str, run: Callable[[contextlib.ExitStack], int]) -> int:
    """Run a benchmark with every cleanup registered on one stack, also on Ctrl-C and SIGTERM."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the cleanups, as for Ctrl-C
    try:
        with contextlib.ExitStack() as stack:
            return run(stack)
    except BenchError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted; endpoint stopped and destinations removed", file=sys.stderr)
        return 130


def machine_info() -> dict[str, object]:
    """What a result was measured on, and how busy the (shared) machine was at the end.

    Runs on different days may be on different VMs: the CPU, the kernel's mitigations (a return
    thunk slows interpreted code more than Go's) and the time of a fixed interpreted loop say
    whether two records can be compared at all.
    """
    return {"cpus": os.cpu_count(), "kernel": platform.release(),
            "python": platform.python_version(), "machine": platform.machine(),
            "cpu_model": _cpu_model(), "mitigations": _mitigations(),
            "interpreter_loop_ms": interpreter_loop_ms(),
            "loadavg_at_end": Path("/proc/loadavg").read_text().split()[:3]}


def _cpu_model() -> str | None:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return None


def _mitigations() -> dict[str, str]:
    """The kernel's CPU vulnerability entries that are not "Not affected"."""
    found = {}
    with contextlib.suppress(OSError):
        for entry in sorted(Path("/sys/devices/system/cpu/vulnerabilities").iterdir()):
            state = entry.read_text().strip()
            if state != "Not affected":
                found[entry.name] = state
    return found


def interpreter_loop_ms(rounds: int = 5) -> float:
    """The fastest of `rounds` runs of a fixed pure-Python loop (calls, a dict, arithmetic)."""
    def step(i: int, seen: dict[int, int]) -> int:
        seen[i & 1023] = i
        return i * 3 % 7

    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        seen: dict[int, int] = {}
        total = 0
        for i in range(200_000):
            total += step(i, seen)
        best = min(best, time.perf_counter() - start)
    return round(best * 1000, 1)


def ensure_tools(need: set[str]) -> None:
    """Install what is missing from Debian (nginx-light, rclone, curl); we are root or we stop."""
    from bench.nginx import find_nginx

    packages = {"nginx": "nginx-light", "rclone": "rclone", "curl": "curl"}
    present = {"nginx": find_nginx() is not None,
               "rclone": shutil.which("rclone") is not None,
               "curl": shutil.which("curl") is not None}
    missing = sorted(packages[t] for t in need if not present[t])
    if not missing:
        return
    if os.geteuid() != 0:
        raise BenchError(f"missing {', '.join(missing)}: apt-get install -y {' '.join(missing)}")
    print(f"installing {' '.join(missing)} with apt-get ...", flush=True)
    if _apt("install", "-y", *missing).returncode != 0:
        _apt("update")
        done = _apt("install", "-y", *missing)
        if done.returncode != 0:
            last = done.stderr.strip().splitlines()[-1:] or ["no output"]
            raise BenchError(f"apt-get install -y {' '.join(missing)} failed: {last[0]}")


def _apt(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["apt-get", *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True, check=False,
                          env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
