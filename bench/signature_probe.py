"""Where a signed pull's CPU goes, process by process: modelsync trees A/B'd on one destination.

`scripts/bench signature` times the unsigned and the signed pull; this diagnostic runs the same
whole `modelsync pull` processes of the model set from the local nginx endpoint, for each
variant (a modelsync source tree put first on the contender's PYTHONPATH), rounds interleaved,
and records what the kernel saw during each run:

* CPU by thread group: the transfer threads (`modelsync-get_*`), the default executor
  (`modelsync-io_*`: the hashers, and the flushes and checks run with `to_thread`) and the
  event loop, from `/proc/PID/task/*/stat` sampled every 20 ms (the contender names its threads
  through a `sitecustomize` this probe writes: Python 3.11 leaves them all named after the
  program);
* bytes read back from the destination's disk (`ru_inblock`), minor and major page faults;
* reclaim during the run, machine-wide (`/proc/vmstat`: pages scanned by kswapd and in direct
  reclaim, direct-reclaim stalls, refaulted file pages) and the least free memory seen;
* the page cache's peak growth over the run (`Cached` in `/proc/meminfo`).

It needs the data of `scripts/bench signature` (`--cache-dir`, default `.bench-cache`).

    scripts/bench signature-probe --variant main=/work/main --variant fix=. [--dest xfs]
        [--pulls unsigned,signed] [--rounds 3]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench import data, fsinfo, options
from bench.contenders import contender_env, modelsync_binary
from bench.data import GiB, MiB, Prepared
from bench.harness import clear, ensure_tools, machine_busy_cpu_s, run_main, run_timeout
from bench.nginx import NginxEndpoint
from bench.report import render_table, write_record

PULLS = ("unsigned", "signed")
SAMPLE_S = 0.02
TICK_S = 1 / os.sysconf("SC_CLK_TCK")
#: /proc/vmstat counters summed per run (a name ending in _ sums every counter it starts)
VMSTAT = ("pgscan_kswapd", "pgscan_direct", "pgsteal_kswapd", "pgsteal_direct", "allocstall_",
          "workingset_refault_file", "pgmajfault", "compact_stall", "compact_migrate_scanned",
          "compact_free_scanned", "pgalloc_", "pgfree")
#: names the contender's threads after their Python names, so their CPU can be told apart
NAMER = """\
import ctypes, threading
_prctl = ctypes.CDLL(None).prctl
_run = threading.Thread._bootstrap_inner
def _named(self):
    _prctl(15, self.name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
    _run(self)
threading.Thread._bootstrap_inner = _named
"""


@dataclass
class Probe:
    variant: str
    pull: str
    round: int
    wall_s: float
    cpu_s: float
    user_s: float
    sys_s: float
    #: CPU seconds by thread group: transfer, executor, loop, other
    threads_s: dict[str, float]
    read_back_mib: float
    minor_faults: int
    major_faults: int
    vmstat: dict[str, int]
    cache_peak_mib: float
    free_min_mib: float
    nginx_cpu_s: float
    other_cpu_s: float
    error: str | None = None
    extra: dict[str, float] = field(default_factory=dict)


def vmstat() -> dict[str, int]:
    out = dict.fromkeys(VMSTAT, 0)
    for line in Path("/proc/vmstat").read_text().splitlines():
        name, value = line.split()
        for key in VMSTAT:
            if name == key or (key.endswith("_") and name.startswith(key)):
                out[key] += int(value)
    return out


def meminfo_kib(*names: str) -> list[int]:
    fields = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    return [int(fields[n].split()[0]) for n in names]


def thread_group(tid: int, pid: int, comm: str) -> str:
    if tid == pid:
        return "loop"
    if comm.startswith("modelsync-get"):
        return "transfer"
    return "executor" if comm.startswith(("modelsync-io", "asyncio")) else "other"


class Sampler(threading.Thread):
    """Every thread's CPU (kept per thread id, so threads that exit early still count), and memory."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.stop = threading.Event()
        self.threads: dict[int, tuple[str, float]] = {}
        self.cached0 = meminfo_kib("Cached")[0]
        self.cache_peak_kib = 0
        self.free_min_kib = meminfo_kib("MemFree")[0]

    def run(self) -> None:
        while not self.stop.is_set():
            self.sample()
            time.sleep(SAMPLE_S)

    def sample(self) -> None:
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            for entry in os.scandir(f"/proc/{self.pid}/task"):
                with contextlib.suppress(FileNotFoundError, ProcessLookupError):
                    text = Path(entry.path, "stat").read_text()
                    comm = text[text.index("(") + 1 : text.rindex(")")]
                    fields = text[text.rindex(")") + 2 :].split()
                    self.threads[int(entry.name)] = (comm, (int(fields[11]) + int(fields[12])) * TICK_S)
        cached, free = meminfo_kib("Cached", "MemFree")
        self.cache_peak_kib = max(self.cache_peak_kib, cached - self.cached0)
        self.free_min_kib = min(self.free_min_kib, free)

    def by_group(self) -> dict[str, float]:
        out = dict.fromkeys(("transfer", "executor", "loop", "other"), 0.0)
        for tid, (comm, cpu_s) in self.threads.items():
            out[thread_group(tid, self.pid, comm)] += cpu_s
        return {k: round(v, 2) for k, v in out.items()}


def probe_once(argv: list[str], env: dict[str, str], dest: Path, timeout_s: float,
               nginx_cpu_s: Callable[[], float], perf_data: Path | None) -> tuple[Probe, str]:
    """One pull process, measured; wall time includes `sync -f` of a disk destination.

    With `perf_data`, `perf record -a -g` samples the whole machine over the run.
    """
    perf = None
    if perf_data is not None:
        perf = subprocess.Popen(["perf", "record", "-a", "-g", "-F", "499", "-o", str(perf_data)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.5)
    before, busy, nginx = vmstat(), machine_busy_cpu_s(), nginx_cpu_s()
    start = time.monotonic()
    with open(dest.parent / "stderr", "wb") as err:
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=err, start_new_session=True)
    sampler = Sampler(proc.pid)
    sampler.start()
    timer = threading.Timer(timeout_s, proc.kill)
    timer.start()
    _, status, usage = os.wait4(proc.pid, 0)
    timer.cancel()
    sampler.stop.set()
    sampler.join()
    if fsinfo.fs_type(dest.parent) != "tmpfs":
        subprocess.run(["sync", "-f", str(dest.parent)], check=True)
    wall_s = time.monotonic() - start
    if perf is not None:
        perf.send_signal(2)
        perf.wait()
    after, own = vmstat(), usage.ru_utime + usage.ru_stime
    code = os.waitstatus_to_exitcode(status)
    error = None if code == 0 else f"exit {code}: {(dest.parent / 'stderr').read_text()[-300:]}"
    probe = Probe("", "", 0, wall_s, own, usage.ru_utime, usage.ru_stime, sampler.by_group(),
                  usage.ru_inblock * 512 / MiB, usage.ru_minflt, usage.ru_majflt,
                  {k: after[k] - before[k] for k in VMSTAT}, sampler.cache_peak_kib / 1024,
                  sampler.free_min_kib / 1024, nginx_cpu_s() - nginx,
                  max(0.0, machine_busy_cpu_s() - busy - own - (nginx_cpu_s() - nginx)), error)
    return probe, error or ""


def summary(probes: list[Probe], gib: float, md: bool) -> list[str]:
    head = ["variant", "pull", "wall s", "CPU s/GiB", "user", "sys", "transfer s", "executor s",
            "loop s", "read back MiB", "major faults", "minor faults k", "scanned MiB (kswapd/direct)",
            "alloc stalls", "compact stalls", "refaults", "cache peak MiB", "free min MiB", "nginx s",
            "other s", "rounds s"]
    body = []
    keys = list(dict.fromkeys((p.variant, p.pull) for p in probes))
    for variant, pull in keys:
        ok = [p for p in probes if (p.variant, p.pull) == (variant, pull) and p.error is None]
        if not ok:
            continue

        def med(get: Callable[[Probe], float], ok: list[Probe] = ok) -> float:
            return statistics.median(get(p) for p in ok)

        body.append([
            variant, pull, f"{med(lambda p: p.wall_s):.2f}", f"{med(lambda p: p.cpu_s) / gib:.2f}",
            f"{med(lambda p: p.user_s):.2f}", f"{med(lambda p: p.sys_s):.2f}",
            *(f"{med(lambda p, g=g: p.threads_s[g]):.2f}" for g in ("transfer", "executor", "loop")),
            f"{med(lambda p: p.read_back_mib):.0f}", f"{med(lambda p: p.major_faults):.0f}",
            f"{med(lambda p: p.minor_faults) / 1000:.0f}",
            f"{med(lambda p: p.vmstat['pgscan_kswapd']) * 4 / 1024:.0f} / "
            f"{med(lambda p: p.vmstat['pgscan_direct']) * 4 / 1024:.0f}",
            f"{med(lambda p: p.vmstat['allocstall_']):.0f}",
            f"{med(lambda p: p.vmstat['compact_stall']):.0f}",
            f"{med(lambda p: p.vmstat['workingset_refault_file']):.0f}",
            f"{med(lambda p: p.cache_peak_mib):.0f}", f"{med(lambda p: p.free_min_mib):.0f}",
            f"{med(lambda p: p.nginx_cpu_s):.2f}", f"{med(lambda p: p.other_cpu_s):.2f}",
            " / ".join(f"{p.wall_s:.2f}" for p in ok),
        ])
    errors = sorted({f"{p.variant} {p.pull}: {p.error}" for p in probes if p.error})
    return render_table(f"model set ({gib:.2f} GiB), medians", head, body, errors, md)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = options.parser("scripts/bench signature-probe", "dest", ("xfs", "tmpfs"), __doc__)
    ap.add_argument("--variant", action="append", required=True, metavar="NAME=TREE",
                    help="a modelsync source tree (its parent of modelsync/) to measure")
    ap.add_argument("--pulls", default=",".join(PULLS), metavar="NAME[,...]")
    ap.add_argument("--perf", type=Path, metavar="DIR",
                    help="record every run with `perf record -a -g` into DIR (adds its overhead)")
    args = ap.parse_args(argv)
    args.dest = options.choose(ap, "dest", args.dest, ("xfs", "tmpfs"))
    args.pulls = options.choose(ap, "pulls", args.pulls, PULLS)
    args.variant = [(n, Path(t).resolve()) for n, t in (v.split("=", 1) for v in args.variant)]
    options.check(ap, args)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return run_main("bench signature-probe", lambda stack: run(args, stack))


def run(args: argparse.Namespace, stack: contextlib.ExitStack) -> int:
    ensure_tools({"nginx"})
    root = options.data_root(args)
    sets = data.datasets(args.small)
    unsigned: Prepared = data.prepare(sets["model-set"], root)
    signed_set, public_key = data.signed_copy(sets["model-set"], "model-set-signed", root)
    sources = {"unsigned": unsigned.dataset, "signed": signed_set}
    dest_kind = args.dest[0]
    if dest_kind == "tmpfs":
        base = Path(tempfile.mkdtemp(prefix="modelsync-probe-", dir=args.tmpfs_dir))
        stack.callback(clear, base)
    else:
        base = stack.enter_context(fsinfo.loop_mount(dest_kind, 2 * unsigned.dataset.total_bytes + 4 * GiB,
                                                     args.cache_dir))
    namer = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="probe-namer-")))
    (namer / "sitecustomize.py").write_text(NAMER)
    endpoint = stack.enter_context(NginxEndpoint(root))
    dest = base / "cache"
    probes: list[Probe] = []
    timeout_s = run_timeout(unsigned.dataset.total_bytes)
    for rnd in range(1, args.rounds + 1):
        for name, tree in args.variant:
            for pull in args.pulls:
                env = {**contender_env(endpoint.url), "PYTHONPATH": f"{tree}:{namer}",
                       "MODELSYNC_SIGNATURE": "off" if pull == "unsigned" else "required"}
                if pull == "signed":
                    env["MODELSYNC_SIGNATURE_PUBLIC_KEYS"] = str(public_key)
                ds = sources[pull]
                argv = [str(modelsync_binary()), "pull", ds.uri, "--cache-dir", str(dest),
                        "--endpoint-url", endpoint.url, "--quiet"]
                clear(dest)
                dest.mkdir(parents=True)
                if dest_kind != "tmpfs":
                    subprocess.run(["sync", "-f", str(dest)], check=True)
                data.warm_page_cache(unsigned.dataset, root)
                perf_data = args.perf / f"{name}-{pull}-{rnd}.data" if args.perf else None
                probe, error = probe_once(argv, env, dest, timeout_s, endpoint.cpu_s, perf_data)
                probe.variant, probe.pull, probe.round = name, pull, rnd
                probes.append(probe)
                clear(dest)
                print(f"  {name:10s} {pull:8s} round {rnd}  {probe.wall_s:6.2f} s  cpu {probe.cpu_s:5.2f} s "
                      f"({probe.threads_s})  read back {probe.read_back_mib:.0f} MiB  cache peak "
                      f"{probe.cache_peak_mib:.0f} MiB  scanned {probe.vmstat['pgscan_kswapd']} / "
                      f"{probe.vmstat['pgscan_direct']} pages  {error[:200]}", flush=True)
    gib = unsigned.dataset.total_bytes / GiB
    print("\n" + "\n".join(summary(probes, gib, md=False)))
    write_record(args.results_dir, "signature-probe", {
        "dest": dest_kind, "variants": {n: str(t) for n, t in args.variant},
        "probes": [asdict(p) for p in probes],
    }, args.markdown, summary(probes, gib, md=True))
    return 1 if any(p.error for p in probes) else 0
