"""The benchmark's nginx endpoint behaves like the S3 data plane modelsync relies on."""

from __future__ import annotations

import http.client
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
from nginx_endpoint import NginxEndpoint, find_nginx, nginx_etag

pytestmark = pytest.mark.skipif(find_nginx() is None, reason="nginx is not installed")

BODY = bytes(range(256)) * 4096  # 1 MiB


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NginxEndpoint]:
    root = tmp_path_factory.mktemp("s3")
    (root / "bucket" / "model").mkdir(parents=True)
    (root / "bucket" / "model" / "weights.bin").write_bytes(BODY)
    with NginxEndpoint(root, access_log=True) as ep:
        yield ep


def request(
    ep: NginxEndpoint, method: str, path: str, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", ep.port, timeout=5)
    try:
        conn.request(method, path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def etag_of(ep: NginxEndpoint) -> str:
    return nginx_etag((ep.root / "bucket" / "model" / "weights.bin").stat())


def test_get_and_head_carry_size_and_etag(endpoint: NginxEndpoint) -> None:
    status, headers, body = request(endpoint, "GET", "/bucket/model/weights.bin")
    assert (status, body) == (200, BODY)
    assert headers["etag"] == f'"{etag_of(endpoint)}"'
    status, headers, body = request(endpoint, "HEAD", "/bucket/model/weights.bin")
    assert (status, body, headers["content-length"]) == (200, b"", str(len(BODY)))


def test_range_with_matching_if_match_is_206(endpoint: NginxEndpoint) -> None:
    status, headers, body = request(
        endpoint, "GET", "/bucket/model/weights.bin",
        {"Range": "bytes=1000-1999", "If-Match": f'"{etag_of(endpoint)}"'},
    )
    assert (status, body) == (206, BODY[1000:2000])
    assert headers["content-range"] == f"bytes 1000-1999/{len(BODY)}"


def test_range_with_stale_or_unquoted_if_match_is_412(endpoint: NginxEndpoint) -> None:
    """nginx compares If-Match literally: the ETag must be sent with its quotes."""
    for value in ('"0-1"', etag_of(endpoint)):
        status, _, _ = request(
            endpoint, "GET", "/bucket/model/weights.bin",
            {"Range": "bytes=0-9", "If-Match": value},
        )
        assert status == 412, value


def test_writes_are_refused_and_directories_are_not_objects(endpoint: NginxEndpoint) -> None:
    for method in ("PUT", "DELETE", "POST"):
        assert request(endpoint, method, "/bucket/model/weights.bin")[0] == 403
    assert request(endpoint, "HEAD", "/bucket/model")[0] == 404
    assert request(endpoint, "GET", "/bucket/missing.bin")[0] == 404


def test_bucket_root_serves_list_objects_v2(endpoint: NginxEndpoint) -> None:
    status, headers, body = request(endpoint, "GET", "/bucket?list-type=2&prefix=model/")
    assert status == 200
    assert headers["content-type"] == "application/xml"
    assert b"<Key>model/weights.bin</Key>" in body
    assert f"<Size>{len(BODY)}</Size>".encode() in body
    assert f"<ETag>&quot;{etag_of(endpoint)}&quot;</ETag>".encode() in body


def test_access_log_counts_requests(endpoint: NginxEndpoint) -> None:
    before = endpoint.request_count()
    request(endpoint, "HEAD", "/bucket/model/weights.bin")
    assert endpoint.request_count() == before + 1
