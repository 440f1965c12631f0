"""RangeClient against real servers: moto for S3 semantics, a scripted socket server for faults.

moto proves the presigned-URL shape works (Range and If-Match as unsigned headers,
412 on a stale ETag). The scripted server answers each request with a function the
test chooses, so each fault (short body, reset, stall, wrong Content-Range, 503) is
exact and the bytes-written count can be asserted to the byte.
"""

from __future__ import annotations

import datetime
import ipaddress
import itertools
import os
import re
import socket
import ssl
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from botocore.client import BaseClient
from botocore.httpsession import ProxyConfiguration
from botocore.utils import get_environ_proxies
from support.tinyproxy import TinyProxy, tinyproxy_binary

from modelsync.adapters.http.client import RangeClient, environ_proxy
from modelsync.adapters.http.tls import make_ssl_context
from modelsync.core.ranges import RangeRequest
from modelsync.errors import (
    AccessDeniedError,
    DiskFullError,
    NotFoundError,
    ObjectChangedError,
    PresignedUrlExpiredError,
    RemoteUnavailableError,
    TransientFetchError,
    UnexpectedResponseError,
    UsageError,
    WrongEndpointError,
)

pytestmark = pytest.mark.timeout(15)

DATA = bytes(range(256)) * 4096 * 3  # 3 MiB, every byte position recognisable mod 256
ETAG = '"abc-123"'
SMALL_BUFFER = 64 * 1024  # forces many buffer flushes per range


def _client(**kwargs: object) -> RangeClient:
    opts: dict[str, object] = {
        "connect_timeout_s": 2.0,
        "read_timeout_s": 2.0,
        "buffer_bytes": SMALL_BUFFER,
    }
    opts.update(kwargs)
    return RangeClient(**opts)  # type: ignore[arg-type]


@pytest.fixture
def target(tmp_path: Path) -> Iterator[int]:
    fd = os.open(tmp_path / "target", os.O_RDWR | os.O_CREAT, 0o644)
    os.ftruncate(fd, len(DATA))
    yield fd
    os.close(fd)


def _read(fd: int, start: int, length: int) -> bytes:
    return os.pread(fd, length, start)


# ---- moto: the S3 semantics we rely on ---------------------------------------------


def _presign(s3_client: BaseClient, bucket: str, key: str) -> str:
    return str(s3_client.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": key}))


def test_presigned_ranges_with_if_match_reassemble_the_object(
    s3_client: BaseClient, bucket: str, target: int
) -> None:
    etag = s3_client.put_object(Bucket=bucket, Key="m/w.bin", Body=DATA)["ETag"]
    url = _presign(s3_client, bucket, "m/w.bin")
    cuts = [0, 1, 700_001, 2 * 1024 * 1024, len(DATA)]
    progress: list[int] = []
    with _client() as client:
        for start, end in itertools.pairwise(cuts):
            req = RangeRequest(url, start, end, etag)
            assert client.fetch_into(req, target, start, progress.append) == end - start
    assert _read(target, 0, len(DATA)) == DATA
    assert sum(progress) == len(DATA)


def test_presigned_range_with_stale_etag_is_object_changed(
    s3_client: BaseClient, bucket: str, target: int
) -> None:
    s3_client.put_object(Bucket=bucket, Key="w.bin", Body=DATA)
    url = _presign(s3_client, bucket, "w.bin")
    with _client() as client, pytest.raises(ObjectChangedError, match="412"):
        client.fetch_into(RangeRequest(url, 0, 1024, '"0123456789abcdef"'), target, 0)


def test_presigned_range_of_missing_key_is_not_found(s3_client: BaseClient, bucket: str, target: int) -> None:
    url = _presign(s3_client, bucket, "absent.bin")
    with _client() as client, pytest.raises(NotFoundError, match="NoSuchKey"):
        client.fetch_into(RangeRequest(url, 0, 1024, None), target, 0)


# ---- a scripted server for exact faults --------------------------------------------

Reply = Callable[[socket.socket, bytes], bool]  # returns whether to keep the connection


class ScriptedServer:
    """Loopback HTTP server: request n on any connection gets replies[n]."""

    def __init__(self, replies: list[Reply], tls: ssl.SSLContext | None = None) -> None:
        self.replies = replies
        self.requests: list[bytes] = []
        self.connections = 0
        self.stop = threading.Event()
        self._tls = tls
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def url(self, scheme: str = "http", host: str = "127.0.0.1") -> str:
        return f"{scheme}://{host}:{self.port}/bucket/key?X-Amz-Signature=x"

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            if self._tls is not None:
                conn = self._tls.wrap_socket(conn, server_side=True)
            pending = b""
            while True:
                while b"\r\n\r\n" not in pending:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    pending += chunk
                head, _, pending = pending.partition(b"\r\n\r\n")
                self.requests.append(head)
                if not self.replies.pop(0)(conn, head):
                    return
        except (OSError, IndexError):
            return
        finally:
            conn.close()

    def close(self) -> None:
        self.stop.set()
        self._listener.close()

    def __enter__(self) -> ScriptedServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _asked(head: bytes) -> tuple[int, int]:
    match = re.search(rb"\r\nRange: bytes=(\d+)-(\d+)", head)
    assert match is not None, head
    return int(match.group(1)), int(match.group(2)) + 1


def _partial_head(start: int, end: int, extra: str = "") -> bytes:
    return (
        f"HTTP/1.1 206 Partial Content\r\nContent-Length: {end - start}\r\n"
        f"Content-Range: bytes {start}-{end - 1}/{len(DATA)}\r\nETag: {ETAG}\r\n{extra}\r\n"
    ).encode()


def serve_range(conn: socket.socket, head: bytes) -> bool:
    start, end = _asked(head)
    conn.sendall(_partial_head(start, end) + DATA[start:end])
    return True


def serve_range_then_hang_up(conn: socket.socket, head: bytes) -> bool:
    """Answer and close without saying so: the client's next request finds a dead socket."""
    serve_range(conn, head)
    return False


def cut_after(n: int, *, reset: bool = False, server: ScriptedServer | None = None) -> Reply:
    def reply(conn: socket.socket, head: bytes) -> bool:
        start, end = _asked(head)
        conn.sendall(_partial_head(start, end) + DATA[start : start + n])
        if server is not None:  # stall: hold the connection open and silent
            server.stop.wait(10)
        elif reset:
            time.sleep(0.2)  # let the bytes reach the client before the RST
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        return False

    return reply


def answer(status_line: str, headers: str = "", body: bytes = b"") -> Reply:
    def reply(conn: socket.socket, head: bytes) -> bool:
        conn.sendall(
            f"HTTP/1.1 {status_line}\r\nContent-Length: {len(body)}\r\n{headers}\r\n".encode() + body
        )
        return True

    return reply


def s3_error(code: str, message: str) -> bytes:
    return (
        f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
        f"<Message>{message}</Message><RequestId>1</RequestId></Error>"
    ).encode()


# ---- success paths -------------------------------------------------------------------


def test_ranges_reuse_one_keep_alive_connection(target: int) -> None:
    with ScriptedServer([serve_range] * 3) as server, _client() as client:
        for start, end in [(0, 1000), (1000, 1_500_000), (1_500_000, len(DATA))]:
            client.fetch_into(RangeRequest(server.url(), start, end, ETAG), target, start)
        assert server.connections == 1
        assert b"\r\nIf-Match: " + ETAG.encode() in server.requests[0]
        assert server.requests[0].startswith(b"GET /bucket/key?X-Amz-Signature=x HTTP/1.1\r\n")
    assert _read(target, 0, len(DATA)) == DATA


def test_a_keep_alive_connection_closed_by_the_server_is_replaced_silently(target: int) -> None:
    with ScriptedServer([serve_range_then_hang_up, serve_range]) as server, _client() as client:
        client.fetch_into(RangeRequest(server.url(), 0, 10, None), target, 0)
        client.fetch_into(RangeRequest(server.url(), 10, 20, None), target, 10)
        assert server.connections == 2
    assert _read(target, 0, 20) == DATA[:20]


def test_plain_200_is_accepted_only_when_the_range_is_the_whole_body(target: int) -> None:
    whole = answer("200 OK", body=DATA[:5000])
    with ScriptedServer([whole, whole]) as server, _client() as client:
        assert client.fetch_into(RangeRequest(server.url(), 0, 5000, None), target, 0) == 5000
        with pytest.raises(UnexpectedResponseError, match="whole object"):
            client.fetch_into(RangeRequest(server.url(), 100, 5000, None), target, 100)


def test_without_wait_all_the_body_still_arrives_whole(target: int) -> None:
    with ScriptedServer([serve_range]) as server, _client(wait_all=False) as client:
        client.fetch_into(RangeRequest(server.url(), 5, len(DATA), None), target, 5)
    assert _read(target, 5, len(DATA)) == DATA[5:]


# ---- a whole small object (a manifest) ---------------------------------------------------


def test_a_small_object_is_read_whole_without_a_range_on_the_same_connection() -> None:
    manifest = b'{"format": "modelsync-manifest"}'
    ok = answer("200 OK", body=manifest)
    with ScriptedServer([ok, ok]) as server, _client() as client:
        got = [client.get_small(server.url(), 1024, {"x-amz-checksum-mode": "ENABLED"}) for _ in range(2)]
        assert [answer.body for answer in got] == [manifest, manifest]
        assert server.connections == 1
        assert b"\r\nRange:" not in server.requests[0]
        assert b"x-amz-checksum-mode: ENABLED" in server.requests[0].split(b"\r\n")


def test_a_small_objects_error_answer_is_returned_with_its_body_not_raised() -> None:
    missing = answer("404 Not Found", body=s3_error("NoSuchKey", "gone"))
    with ScriptedServer([missing]) as server, _client() as client:
        got = client.get_small(server.url(), 1024)
    assert (got.status, got.body) == (404, s3_error("NoSuchKey", "gone"))


@pytest.mark.parametrize(
    "reply",
    [
        answer("200 OK", body=b"x" * 2048),  # larger than asked for
        lambda conn, head: conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
        or True,
        lambda conn, head: conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort") and False,
    ],
    ids=["too-large", "unframed", "cut-short"],
)
def test_a_small_object_that_is_not_whole_and_framed_is_refused(reply: Reply) -> None:
    with (
        ScriptedServer([reply]) as server,
        _client() as client,
        pytest.raises(UnexpectedResponseError, match="not a whole object of at most 1024"),
    ):
        client.get_small(server.url(), 1024)


# ---- faults --------------------------------------------------------------------------


def test_short_body_is_transient_and_keeps_the_bytes_received(target: int) -> None:
    progress: list[int] = []
    with (
        ScriptedServer([cut_after(300_000)]) as server,
        _client() as client,
        pytest.raises(TransientFetchError) as info,
    ):
        client.fetch_into(RangeRequest(server.url(), 1000, 2_000_000, None), target, 1000, progress.append)
    assert info.value.reason == "truncated"
    assert info.value.bytes_written == 300_000
    assert sum(progress) == 300_000, "bytes that landed before the break are reported as progress"
    assert _read(target, 1000, 300_000) == DATA[1000:301_000]


def test_progress_is_reported_in_batches_not_once_per_buffer(target: int) -> None:
    progress: list[int] = []
    with ScriptedServer([serve_range]) as server, _client() as client:
        client.fetch_into(RangeRequest(server.url(), 0, len(DATA), None), target, 0, progress.append)
    assert progress == [len(DATA)], "48 buffers of 64 KiB, one report: each report holds the interpreter lock"


def test_each_buffer_is_offered_once_written_in_order_and_never_beyond_the_bytes_written(target: int) -> None:
    """What the file's hasher takes from the receive buffer (engine/hashing.py `FrontHasher`):
    every buffer, at its file offset, once it is on disk; a body that breaks off offers no more
    than it wrote."""
    offered: list[tuple[int, bytes]] = []

    def on_written(offset: int, data: memoryview) -> None:
        assert _read(target, offset, len(data)) == bytes(data), "offered before it was written"
        offered.append((offset, bytes(data)))

    with ScriptedServer([serve_range, cut_after(300_000)]) as server, _client() as client:
        client.fetch_into(RangeRequest(server.url(), 0, len(DATA), None), target, 0, None, on_written)
        whole = list(offered)
        offered.clear()
        with pytest.raises(TransientFetchError):
            cut_req = RangeRequest(server.url(), 1000, 2_000_000, None)
            client.fetch_into(cut_req, target, 1000, None, on_written)
    assert len(whole) > 1 and b"".join(d for _, d in whole) == DATA
    assert [o for o, _ in whole] == [sum(len(d) for _, d in whole[:i]) for i in range(len(whole))]
    cut = b"".join(d for _, d in offered)
    assert offered[0][0] == 1000 and len(cut) <= 300_000 and cut == DATA[1000 : 1000 + len(cut)]


def test_reset_mid_body_is_transient_and_keeps_the_bytes_received(target: int) -> None:
    with (
        ScriptedServer([cut_after(200_000, reset=True)]) as server,
        _client() as client,
        pytest.raises(TransientFetchError) as info,
    ):
        client.fetch_into(RangeRequest(server.url(), 0, len(DATA), None), target, 0)
    assert info.value.reason == "reset"
    assert info.value.bytes_written == 200_000
    assert _read(target, 0, 200_000) == DATA[:200_000]


@pytest.mark.parametrize("wait_all", [True, False])
def test_stall_mid_body_times_out_after_the_read_timeout(target: int, wait_all: bool) -> None:
    replies: list[Reply] = []
    with ScriptedServer(replies) as server:
        replies.append(cut_after(100_000, server=server))
        with (
            _client(read_timeout_s=0.3, wait_all=wait_all) as client,
            pytest.raises(TransientFetchError) as info,
        ):
            client.fetch_into(RangeRequest(server.url(), 0, len(DATA), None), target, 0)
    assert info.value.reason == "timeout"
    assert info.value.bytes_written == 100_000


def test_wrong_content_range_is_refused_before_any_write(target: int) -> None:
    def shifted(conn: socket.socket, head: bytes) -> bool:
        start, end = _asked(head)
        conn.sendall(_partial_head(start + 1, end + 1) + DATA[start + 1 : end + 1])
        return True

    with (
        ScriptedServer([shifted]) as server,
        _client() as client,
        pytest.raises(UnexpectedResponseError, match="Content-Range"),
    ):
        client.fetch_into(RangeRequest(server.url(), 0, 4096, None), target, 0)
    assert _read(target, 0, 4096) == bytes(4096)


def test_interim_1xx_answers_are_skipped_and_the_range_lands_whole(target: int) -> None:
    """100 and 103 before the 206, sent in pieces: the body after them is the range, on one connection."""

    def interim_first(conn: socket.socket, head: bytes) -> bool:
        start, end = _asked(head)
        conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early")
        time.sleep(0.05)  # the final head arrives in a later recv than the interim ones
        rest = b" Hints\r\nLink: </x>; rel=preload\r\n\r\n" + _partial_head(start, end)
        conn.sendall(rest + DATA[start:end])
        return True

    with ScriptedServer([interim_first, serve_range]) as server, _client() as client:
        assert client.fetch_into(RangeRequest(server.url(), 0, 200_000, None), target, 0) == 200_000
        client.fetch_into(RangeRequest(server.url(), 200_000, 300_000, None), target, 200_000)
        assert server.connections == 1
    assert _read(target, 0, 300_000) == DATA[:300_000]


@pytest.mark.parametrize("second", ["4096", "5000"])
def test_a_repeated_content_length_is_refused_before_any_write(target: int, second: str) -> None:
    def twice(conn: socket.socket, head: bytes) -> bool:
        conn.sendall(_partial_head(0, 4096, f"Content-Length: {second}\r\n") + DATA[:4096])
        return True

    with (
        ScriptedServer([twice]) as server,
        _client() as client,
        pytest.raises(UnexpectedResponseError, match="content-length sent twice"),
    ):
        client.fetch_into(RangeRequest(server.url(), 0, 4096, None), target, 0)
    assert _read(target, 0, 4096) == bytes(4096)


def test_slow_down_is_transient_with_its_code_and_keeps_the_connection(target: int) -> None:
    slow = answer("503 Slow Down", "Retry-After: 2\r\n", s3_error("SlowDown", "Reduce"))
    with (
        ScriptedServer([slow, serve_range]) as server,
        _client() as client,
        pytest.raises(TransientFetchError) as info,
    ):
        client.fetch_into(RangeRequest(server.url(), 0, 100, None), target, 0)
        client.fetch_into(RangeRequest(server.url(), 0, 100, None), target, 0)
        assert server.connections == 1
    assert (info.value.status, info.value.reason, info.value.throttled) == (503, "SlowDown", True)
    assert (info.value.bytes_written, info.value.retry_after_s) == (0, 2.0)


EXPIRED_QUERY = "X-Amz-Date=20200101T000000Z&X-Amz-Expires=600&X-Amz-Signature=x"
FRESH_QUERY = (
    f"X-Amz-Date={time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}&X-Amz-Expires=3600&X-Amz-Signature=x"
)


def _query_id(value: object) -> str | None:
    """Stable test ids: FRESH_QUERY holds the import time, which differs between xdist workers."""
    if not isinstance(value, str):
        return None
    return {EXPIRED_QUERY: "expired-url", FRESH_QUERY: "fresh-url"}.get(value)


@pytest.mark.parametrize(
    ("status", "body", "query", "error"),
    [
        ("403 Forbidden", s3_error("AccessDenied", "Access Denied"), FRESH_QUERY, AccessDeniedError),
        # The message says "expired" but the URL has not: decided by the URL, never by the text.
        ("403 Forbidden", s3_error("AccessDenied", "Request has expired"), FRESH_QUERY, AccessDeniedError),
        ("403 Forbidden", s3_error("AccessDenied", "Denied"), EXPIRED_QUERY, PresignedUrlExpiredError),
        ("400 Bad Request", s3_error("ExpiredToken", "token"), FRESH_QUERY, PresignedUrlExpiredError),
        ("404 Not Found", s3_error("NoSuchKey", "gone"), FRESH_QUERY, NotFoundError),
        ("412 Precondition Failed", s3_error("PreconditionFailed", "etag"), FRESH_QUERY, ObjectChangedError),
        ("400 Bad Request", s3_error("InvalidArgument", "no"), FRESH_QUERY, UnexpectedResponseError),
        ("501 Not Implemented", s3_error("NotImplemented", "no"), FRESH_QUERY, UnexpectedResponseError),
        ("505 HTTP Version Not Supported", b"", FRESH_QUERY, UnexpectedResponseError),
    ],
    ids=_query_id,
)
def test_permanent_statuses_map_to_the_error_tree(
    target: int, status: str, body: bytes, query: str, error: type[Exception]
) -> None:
    with ScriptedServer([answer(status, body=body)]) as server, _client() as client:
        url = server.url().split("?")[0] + "?" + query
        with pytest.raises(error) as info:
            client.fetch_into(RangeRequest(url, 0, 100, None), target, 0)
    assert type(info.value) is error
    if isinstance(info.value, PresignedUrlExpiredError):
        assert info.value.token_expired == (b"ExpiredToken" in body)


def test_an_expired_url_is_judged_by_the_stores_clock_not_ours(target: int) -> None:
    """The store's Date says the URL had not expired yet: a plain denial, whatever our clock says."""
    signed = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() - 7200))
    store_date = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() - 7000))
    deny = answer("403 Forbidden", f"Date: {store_date}\r\n", s3_error("AccessDenied", "no"))
    with ScriptedServer([deny]) as server, _client() as client:
        url = server.url().split("?")[0] + f"?X-Amz-Date={signed}&X-Amz-Expires=600&X-Amz-Signature=x"
        with pytest.raises(AccessDeniedError) as info:
            client.fetch_into(RangeRequest(url, 0, 100, None), target, 0)
    assert not isinstance(info.value, PresignedUrlExpiredError)


@pytest.mark.parametrize(
    ("reply", "named"),
    [
        (
            answer("301 Moved Permanently", "Location: https://s3.eu-west-1.example/bucket/key\r\n"),
            "https://s3.eu-west-1.example/bucket/key",
        ),
        (
            answer(
                "301 Moved Permanently",
                "x-amz-bucket-region: eu-west-1\r\n",
                s3_error("PermanentRedirect", "use the endpoint").replace(
                    b"<RequestId>", b"<Endpoint>bucket.s3.eu-west-1.example</Endpoint><RequestId>"
                ),
            ),
            "bucket.s3.eu-west-1.example (the bucket is in region eu-west-1)",
        ),
        (
            answer("307 Temporary Redirect", "Location: http://elsewhere.example/\r\n"),
            "http://elsewhere.example/",
        ),
    ],
)
def test_a_redirect_is_a_clear_error_naming_where_it_points(target: int, reply: Reply, named: str) -> None:
    with (
        ScriptedServer([reply]) as server,
        _client() as client,
        pytest.raises(WrongEndpointError, match="endpoint or region is wrong") as info,
    ):
        client.fetch_into(RangeRequest(server.url(), 0, 100, None), target, 0)
    assert named in str(info.value)


def assert_close_wakes_the_fetch(
    client: RangeClient, req: RangeRequest, target: int, blocked: Callable[[], bool]
) -> None:
    """Start `req` in a thread; once `blocked()` holds, `close` must end it within a second."""
    outcome: list[BaseException] = []

    def fetch() -> None:
        try:
            client.fetch_into(req, target, 0)
        except BaseException as exc:
            outcome.append(exc)

    worker = threading.Thread(target=fetch)
    worker.start()
    deadline = time.monotonic() + 10
    while not blocked() and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)  # the worker is now blocked in a read, 30 s from its timeout
    closed_at = time.monotonic()
    client.close()
    worker.join(5)
    woke_s = time.monotonic() - closed_at
    assert not worker.is_alive()
    assert woke_s < 1.0, woke_s
    assert isinstance(outcome[0], TransientFetchError)


@pytest.mark.parametrize("tls", [False, True], ids=["http", "https"])
def test_close_wakes_a_thread_blocked_on_a_stalled_body_at_once(
    tls_files: tuple[Path, Path], target: int, tls: bool
) -> None:
    replies: list[Reply] = []
    ctx = make_ssl_context(ca_bundle=str(tls_files[0])) if tls else None
    with ScriptedServer(replies, tls=_server_tls(tls_files) if tls else None) as server:
        replies.append(cut_after(50_000, server=server))
        req = RangeRequest(server.url("https" if tls else "http"), 0, len(DATA))
        assert_close_wakes_the_fetch(
            _client(ssl_context=ctx, read_timeout_s=30.0), req, target, lambda: len(server.requests) >= 1
        )


def test_connection_refused_is_transient(target: int) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # bound but not listening: connect is refused
        with _client() as client, pytest.raises(TransientFetchError) as info:
            client.fetch_into(RangeRequest(f"http://127.0.0.1:{port}/b/k", 0, 1, None), target, 0)
    assert (info.value.reason, info.value.bytes_written) == ("connect", 0)


def test_a_full_disk_is_disk_full_not_transient() -> None:
    fd = os.open("/dev/full", os.O_WRONLY)
    try:
        with (
            ScriptedServer([serve_range]) as server,
            _client() as client,
            pytest.raises(DiskFullError),
        ):
            client.fetch_into(RangeRequest(server.url(), 0, 1000, None), fd, 0)
    finally:
        os.close(fd)


# ---- TLS -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and localhost, made with `cryptography`."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "modelsync test")])
    now = datetime.datetime.now(datetime.UTC)

    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    folder = tmp_path_factory.mktemp("tls")
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


def _server_tls(tls_files: tuple[Path, Path]) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(*tls_files)
    return ctx


def test_tls_with_the_ca_bundle_fetches_the_range(tls_files: tuple[Path, Path], target: int) -> None:
    ctx = make_ssl_context(ca_bundle=str(tls_files[0]))
    with (
        ScriptedServer([serve_range, serve_range], tls=_server_tls(tls_files)) as server,
        _client(ssl_context=ctx) as client,
    ):
        client.fetch_into(RangeRequest(server.url("https", "localhost"), 0, 700_000, None), target, 0)
        client.fetch_into(RangeRequest(server.url("https"), 700_000, len(DATA), None), target, 700_000)
    assert _read(target, 0, len(DATA)) == DATA


def test_tls_with_an_untrusted_certificate_is_a_clear_permanent_error(
    tls_files: tuple[Path, Path], target: int
) -> None:
    ctx = make_ssl_context(ca_bundle=None)
    with (
        ScriptedServer([serve_range], tls=_server_tls(tls_files)) as server,
        _client(ssl_context=ctx) as client,
        pytest.raises(RemoteUnavailableError, match="not trusted"),
    ):
        client.fetch_into(RangeRequest(server.url("https"), 0, 10, None), target, 0)


def test_tls_insecure_mode_skips_verification(tls_files: tuple[Path, Path], target: int) -> None:
    ctx = make_ssl_context(insecure=True)
    with (
        ScriptedServer([serve_range], tls=_server_tls(tls_files)) as server,
        _client(ssl_context=ctx) as client,
    ):
        client.fetch_into(RangeRequest(server.url("https"), 0, 4096, None), target, 0)
    assert _read(target, 0, 4096) == DATA[:4096]


def test_tls_stall_times_out(tls_files: tuple[Path, Path], target: int) -> None:
    replies: list[Reply] = []
    ctx = make_ssl_context(ca_bundle=str(tls_files[0]))
    with ScriptedServer(replies, tls=_server_tls(tls_files)) as server:
        replies.append(cut_after(50_000, server=server))
        with (
            _client(ssl_context=ctx, read_timeout_s=0.3) as client,
            pytest.raises(TransientFetchError) as info,
        ):
            client.fetch_into(RangeRequest(server.url("https"), 0, len(DATA), None), target, 0)
    assert info.value.reason == "timeout"
    assert info.value.bytes_written == 50_000


# ---- proxies -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "env", "proxy"),
    [
        ("https://s3.example/b/k", {"HTTPS_PROXY": "http://p:3128"}, "http://p:3128"),
        ("https://s3.example/b/k", {"https_proxy": "p:3128"}, "http://p:3128"),
        ("http://s3.example/b/k", {"HTTPS_PROXY": "http://p:3128"}, None),
        ("http://s3.example/b/k", {"HTTP_PROXY": "http://q:8080"}, "http://q:8080"),
        ("https://s3.example/b/k", {"HTTPS_PROXY": "http://p:3128", "NO_PROXY": "s3.example"}, None),
        ("https://b.s3.example/k", {"HTTPS_PROXY": "http://p:3128", "NO_PROXY": ".s3.example"}, None),
        (
            "https://s3.example/b/k",
            {"HTTPS_PROXY": "http://p:3128", "NO_PROXY": "other.example"},
            "http://p:3128",
        ),
        # without a variable for the URL's scheme the answer is known without botocore
        ("https://s3.example/b/k", {}, None),
        ("https://s3.example/b/k", {"HTTPS_PROXY": ""}, None),
        ("https://s3.example/b/k", {"ALL_PROXY": "http://p:3128"}, None),
        ("https://s3.example/b/k", {"Https_Proxy": "http://p:3128"}, "http://p:3128"),
        ("https://s3.example/b/k", {"HTTPS_PROXY": "http://p:3128", "https_proxy": ""}, None),
    ],
)
def test_the_data_plane_picks_the_proxy_botocore_picks(
    monkeypatch: pytest.MonkeyPatch, url: str, env: dict[str, str], proxy: str | None
) -> None:
    for name in [n for n in os.environ if n.lower().endswith("_proxy")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert environ_proxy(url) == proxy
    assert ProxyConfiguration(proxies=get_environ_proxies(url)).proxy_url_for(url) == proxy


needs_tinyproxy = pytest.mark.skipif(tinyproxy_binary() is None, reason="tinyproxy is not installed")


@needs_tinyproxy
def test_https_goes_through_a_connect_tunnel_of_a_real_proxy(
    tmp_path: Path, tls_files: tuple[Path, Path], target: int
) -> None:
    ctx = make_ssl_context(ca_bundle=str(tls_files[0]))
    with (
        TinyProxy(tmp_path / "tinyproxy") as proxy,
        ScriptedServer([serve_range, serve_range], tls=_server_tls(tls_files)) as server,
        _client(ssl_context=ctx, proxy_for=lambda _url: proxy.url) as client,
    ):
        url = server.url("https", "localhost")
        client.fetch_into(RangeRequest(url, 0, 700_000, ETAG), target, 0)
        client.fetch_into(RangeRequest(url, 700_000, len(DATA), ETAG), target, 700_000)
        assert proxy.requests() == [f"CONNECT localhost:{server.port} HTTP/1.1"]  # one tunnel, kept alive
        assert server.requests[0].startswith(b"GET /bucket/key?X-Amz-Signature=x HTTP/1.1\r\n")
    assert _read(target, 0, len(DATA)) == DATA


@needs_tinyproxy
def test_http_goes_through_a_real_proxy_in_absolute_form(tmp_path: Path, target: int) -> None:
    with (
        TinyProxy(tmp_path / "tinyproxy") as proxy,
        ScriptedServer([serve_range, serve_range]) as server,
        _client(proxy_for=lambda _url: proxy.url) as client,
    ):
        client.fetch_into(RangeRequest(server.url(), 0, 1000, ETAG), target, 0)
        client.fetch_into(RangeRequest(server.url(), 1000, 5000, ETAG), target, 1000)
        logged = proxy.requests()
        assert b"\r\nRange: bytes=1000-4999\r\n" in server.requests[1]
    assert logged == [f"GET {server.url()} HTTP/1.1"] * 2
    assert _read(target, 0, 5000) == DATA[:5000]


@needs_tinyproxy
@pytest.mark.parametrize("scheme", ["http", "https"])
def test_a_proxy_that_wants_other_credentials_is_access_denied(
    tmp_path: Path, tls_files: tuple[Path, Path], target: int, scheme: str
) -> None:
    with (
        TinyProxy(tmp_path / "tinyproxy", basic_auth=("user", "right")) as proxy,
        ScriptedServer([serve_range], tls=_server_tls(tls_files) if scheme == "https" else None) as server,
        _client(
            ssl_context=make_ssl_context(ca_bundle=str(tls_files[0])),
            proxy_for=lambda _url: proxy.url.replace(":right@", ":wrong@"),
        ) as client,
        pytest.raises(AccessDeniedError, match=r"proxy 127\.0\.0\.1:\d+ refused .*(401|407)"),
    ):
        client.fetch_into(RangeRequest(server.url(scheme, "localhost"), 0, 100, None), target, 0)


@needs_tinyproxy
def test_a_proxy_with_the_right_credentials_lets_the_tunnel_through(
    tmp_path: Path, tls_files: tuple[Path, Path], target: int
) -> None:
    with (
        TinyProxy(tmp_path / "tinyproxy", basic_auth=("user", "right")) as proxy,
        ScriptedServer([serve_range], tls=_server_tls(tls_files)) as server,
        _client(
            ssl_context=make_ssl_context(ca_bundle=str(tls_files[0])), proxy_for=lambda _url: proxy.url
        ) as client,
    ):
        client.fetch_into(RangeRequest(server.url("https", "localhost"), 0, 100, None), target, 0)
    assert _read(target, 0, 100) == DATA[:100]


def test_an_https_proxy_url_is_a_clear_usage_error(target: int) -> None:
    with _client(proxy_for=lambda _url: "https://proxy.example:3128") as client, pytest.raises(UsageError):
        client.fetch_into(RangeRequest("https://s3.example/b/k", 0, 100, None), target, 0)


@pytest.mark.parametrize("stuck_in", ["tls-handshake", "proxy-connect"])
def test_close_wakes_a_thread_stuck_before_the_first_request(target: int, stuck_in: str) -> None:
    """A server (or proxy) that accepts and never answers; the connect timeout is 30 s."""
    with socket.create_server(("127.0.0.1", 0)) as silent:
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        if stuck_in == "tls-handshake":
            url, proxy = f"https://{address}/bucket/key", None
        else:
            url, proxy = "https://s3.example/bucket/key", f"http://{address}"
        client = _client(
            ssl_context=make_ssl_context(insecure=True), connect_timeout_s=30.0, proxy_for=lambda _url: proxy
        )
        # connected (the kernel accepted), then waiting for an answer that never comes
        assert_close_wakes_the_fetch(client, RangeRequest(url, 0, 100), target, lambda: True)
