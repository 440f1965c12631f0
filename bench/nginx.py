"""A throwaway nginx that serves a directory as a path-style, read-only S3 data endpoint.

Each top-level directory of `root` is a bucket and every file below it an object
(`http://127.0.0.1:PORT/<bucket>/<key>`). nginx gives GET, HEAD, `Range`, `ETag`
(`"<mtime hex>-<size hex>"`) and `If-Match` at sendfile speed and ignores SigV4 headers.
`GET /<bucket>` (any query string) returns a static ListObjectsV2 document of the
whole bucket: nginx does no prefix filtering, so put one data set in each bucket.

If-Match: nginx's not-modified filter compares `If-Match` with its own strong ETag before
the range filter runs, so a ranged GET with a matching ETag gives 206 and a stale ETag
gives 412 (checked by tests/test_bench_smoke.py).

The configuration, pid file, logs and temp paths live in a private temp directory;
/etc/nginx and the system service are never touched.

    with NginxEndpoint(root) as ep:
        urllib.request.urlopen(f"{ep.url}/bucket/key")
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from xml.sax.saxutils import escape

_TEMP_MODULES = ("proxy", "fastcgi", "uwsgi", "scgi")


def find_nginx() -> str | None:
    """nginx lives in /usr/sbin, which is not on every user's PATH."""
    return shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if os.access(p, os.X_OK)), None
    )


def nginx_etag(st: os.stat_result) -> str:
    """nginx's ETag for a static file, without the quotes."""
    return f"{int(st.st_mtime):x}-{st.st_size:x}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def list_objects_v2_xml(bucket: str, bucket_dir: Path) -> bytes:
    """A ListObjectsV2 result holding every file below `bucket_dir`, sorted by key."""
    entries = []
    for path in sorted(p for p in bucket_dir.rglob("*") if p.is_file()):
        st = path.stat()
        key = path.relative_to(bucket_dir).as_posix()
        modified = dt.datetime.fromtimestamp(int(st.st_mtime), dt.UTC).strftime(
            "%Y-%m-%dT%H:%M:%S.000Z"
        )
        entries.append(
            f"<Contents><Key>{escape(key)}</Key><LastModified>{modified}</LastModified>"
            f"<ETag>&quot;{nginx_etag(st)}&quot;</ETag><Size>{st.st_size}</Size>"
            "<StorageClass>STANDARD</StorageClass></Contents>"
        )
    doc = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        '<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
        f"<Name>{escape(bucket)}</Name><Prefix></Prefix><KeyCount>{len(entries)}</KeyCount>"
        f"<MaxKeys>{max(1000, len(entries))}</MaxKeys><IsTruncated>false</IsTruncated>"
        + "".join(entries)
        + "</ListBucketResult>\n"
    )
    return doc.encode()


class NginxEndpoint:
    """Start nginx on a free loopback port for the life of a `with` block.

    `access_log=True` logs every request so a caller can prove that something made none;
    leave it off for throughput runs.
    """

    def __init__(self, root: Path, *, access_log: bool = False, workers: int = 0) -> None:
        self.root = root.resolve()
        self.access_log = access_log
        self.workers = workers or os.cpu_count() or 1
        self.port = 0
        self._tmp: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def access_log_path(self) -> Path:
        assert self._tmp is not None, "endpoint not started"
        return self._tmp / "access.log"

    def request_count(self) -> int:
        """Requests logged so far (needs access_log=True)."""
        if not self.access_log:
            raise RuntimeError("request_count needs NginxEndpoint(access_log=True)")
        if not self.access_log_path.exists():
            return 0
        with self.access_log_path.open("rb") as log:
            return sum(1 for _ in log)

    def settled_request_count(self, still_s: float = 0.2, timeout_s: float = 10.0) -> int:
        """`request_count` once the log has not changed for `still_s`: nginx writes a line as it
        finalises the request, which can be after the client has its answer."""
        deadline = time.monotonic() + timeout_s
        count = self.request_count()
        while time.monotonic() < deadline:
            time.sleep(still_s)
            if (again := self.request_count()) == count:
                return count
            count = again
        raise RuntimeError(f"nginx's access log kept growing for {timeout_s:.0f} s")

    def requests(self) -> list[tuple[float, str, bool]]:
        """(epoch seconds, request line, ranged?) of each logged request (needs access_log=True)."""
        if not self.access_log or not self.access_log_path.exists():
            return []
        out = []
        for line in self.access_log_path.read_text(errors="replace").splitlines():
            msec, request, range_header = line.split("\t")[:3]
            out.append((float(msec), request, range_header not in ("", "-")))
        return out

    def __enter__(self) -> NginxEndpoint:
        self.start()
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        binary = find_nginx()
        if binary is None:
            raise RuntimeError("nginx is not installed (apt-get install -y nginx-light)")
        self._tmp = Path(tempfile.mkdtemp(prefix="bench-nginx-"))
        lists = self._tmp / "lists"
        lists.mkdir()
        for bucket_dir in sorted(p for p in self.root.iterdir() if p.is_dir()):
            (lists / f"{bucket_dir.name}.xml").write_bytes(
                list_objects_v2_xml(bucket_dir.name, bucket_dir)
            )
        modules = _compiled_out_modules(binary)
        last_error = ""
        for _ in range(3):  # the free port can be taken between probe and bind
            self.port = free_port()
            conf = self._tmp / "nginx.conf"
            conf.write_text(self._config(lists, modules))
            errlog = self._tmp / "error.log"
            self._proc = subprocess.Popen(
                [binary, "-p", str(self._tmp), "-c", str(conf), "-e", str(errlog),
                 "-g", "daemon off;"],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True,  # Ctrl-C reaches us; we stop nginx in order
            )
            if self._wait_ready():
                return
            self._terminate()
            last_error = errlog.read_text(errors="replace").strip() if errlog.exists() else ""
        self.stop()
        raise RuntimeError(f"nginx did not start: {last_error.splitlines()[-1:] or 'no log'}")

    def cpu_s(self) -> float:
        """CPU seconds nginx (master and workers) has spent so far: on loopback the server shares
        the client's cores, so a measurement that leaves it out leaves out part of the cost."""
        if self._proc is None:
            return 0.0
        ticks = 0
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
            except OSError:  # gone meanwhile
                continue
            fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "
            if int(fields[2]) == self._proc.pid:  # its process group: started in its own session
                ticks += int(fields[11]) + int(fields[12])  # utime, stime
        return ticks / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        self._terminate()
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def _terminate(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)  # fast shutdown of master and workers
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def _wait_ready(self) -> bool:
        assert self._proc is not None
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                return False
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return True
            except OSError:
                time.sleep(0.02)
        return False

    def _config(self, lists: Path, compiled_out: set[str]) -> str:
        assert self._tmp is not None
        temp_paths = "".join(
            f"    {m}_temp_path {self._tmp}/{m}_temp;\n" for m in _TEMP_MODULES
            if m not in compiled_out
        )
        log = f"{self._tmp}/access.log timed" if self.access_log else "off"
        user = "user root;\n" if os.geteuid() == 0 else ""  # workers must read the data as we do
        return f"""\
{user}worker_processes {self.workers};
pid {self._tmp}/nginx.pid;
events {{ worker_connections 4096; }}
http {{
    default_type application/octet-stream;
    sendfile on;
    sendfile_max_chunk 0;
    tcp_nopush on;
    tcp_nodelay on;
    keepalive_requests 1000000;
    keepalive_timeout 300s;
    server_tokens off;
    log_format timed "$msec\t$request\t$http_range";
    access_log {log};
    client_body_temp_path {self._tmp}/client_body_temp;
{temp_paths}    server {{
        listen 127.0.0.1:{self.port};
        root {self.root};
        location ~ ^/(?<bucket>[A-Za-z0-9._-]+)/?$ {{
            limit_except GET {{ deny all; }}
            default_type application/xml;
            alias {lists}/$bucket.xml;
        }}
        location / {{
            limit_except GET {{ deny all; }}
            try_files $uri =404;
        }}
    }}
}}
"""


def _compiled_out_modules(binary: str) -> set[str]:
    """Modules built `--without-http_<m>_module`, whose temp_path directive would not parse."""
    out = subprocess.run([binary, "-V"], capture_output=True, text=True, check=False)
    flags = out.stderr + out.stdout
    return {m for m in _TEMP_MODULES if f"--without-http_{m}_module" in flags}
