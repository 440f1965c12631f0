"""The heads of a ranged GET, as tables: no socket, no server.

tests/test_ranged_http.py drives the same parser over real sockets (1xx, a
repeated Content-Length); here every case a broken or hostile server can send
is one row.
"""

from __future__ import annotations

import pytest

from modelsync.adapters.http.answer import error_for_answer, retry_after_s, url_expired
from modelsync.adapters.http.head import (
    MAX_HEAD_BYTES,
    ResponseHead,
    check_range_head,
    parse_head,
    parse_response,
    render_request,
    size_mismatch,
)
from modelsync.errors import (
    AccessDeniedError,
    NotFoundError,
    ObjectChangedError,
    PresignedUrlExpiredError,
    SizeMismatchError,
    TransientFetchError,
    UnexpectedResponseError,
    WrongEndpointError,
)

OK_206 = b"HTTP/1.1 206 Partial Content\r\nContent-Length: 10\r\nContent-Range: bytes 0-9/100\r\n\r\n"


def _parse(data: bytes) -> ResponseHead | None:
    return parse_response(data, len(data))


# ---- the response head: what is accepted ----------------------------------------------


@pytest.mark.parametrize(
    ("data", "status", "headers", "keep_alive", "body_start"),
    [
        (OK_206, 206, {"content-length": "10", "content-range": "bytes 0-9/100"}, True, len(OK_206)),
        (OK_206 + b"0123", 206, {"content-length": "10", "content-range": "bytes 0-9/100"}, True, 82),
        (b"HTTP/1.1 200 OK\r\n\r\n", 200, {}, True, 19),
        (b"HTTP/1.1 200\r\n\r\n", 200, {}, True, 16),  # no reason phrase
        (b"HTTP/1.1 200 \r\n\r\n", 200, {}, True, 17),  # an empty one
        (b"HTTP/1.1 404 Not \xe9 Found\r\n\r\n", 404, {}, True, 28),  # obs-text in the reason
        (b"HTTP/1.0 200 OK\r\n\r\n", 200, {}, False, 19),  # 1.0 closes
        (b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n", 200, {"connection": "close"}, False, 38),
        (
            b"HTTP/1.1 200 OK\r\nConnection: Keep-Alive, CLOSE\r\n\r\n",
            200,
            {"connection": "Keep-Alive, CLOSE"},
            False,
            50,
        ),
        (b"HTTP/1.1 200 OK\r\nConnection: keep-alive\r\n\r\n", 200, {"connection": "keep-alive"}, True, 43),
        (b'HTTP/1.1 200 OK\r\nETag:   "x"  \r\n\r\n', 200, {"etag": '"x"'}, True, 34),  # OWS trimmed
        (b"HTTP/1.1 200 OK\r\nX-A:\r\n\r\n", 200, {"x-a": ""}, True, 25),  # an empty value
        (b"HTTP/1.1 200 OK\r\nX-A: 1\r\nx-a: 2\r\n\r\n", 200, {"x-a": "1, 2"}, True, 35),  # combined
        (b"HTTP/1.1 200 OK\r\nX-A: a\tb\r\n\r\n", 200, {"x-a": "a\tb"}, True, 29),  # HTAB is allowed
        (b"HTTP/1.1 200 OK\r\nContent-Length: 0010\r\n\r\n", 200, {"content-length": "0010"}, True, 41),
    ],
)
def test_a_well_formed_head_is_read(
    data: bytes, status: int, headers: dict[str, str], keep_alive: bool, body_start: int
) -> None:
    assert _parse(data) == ResponseHead(status, headers, keep_alive, body_start)


@pytest.mark.parametrize(
    "interim",
    [
        b"HTTP/1.1 100 Continue\r\n\r\n",
        b"HTTP/1.1 102 Processing\r\n\r\n",
        b"HTTP/1.1 103 Early Hints\r\nLink: </a>; rel=preload\r\n\r\n",
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\n\r\n",
    ],
)
def test_interim_1xx_answers_are_skipped_for_the_final_one(interim: bytes) -> None:
    head = _parse(interim + OK_206 + b"body")
    assert head is not None
    assert (head.status, head.headers["content-range"], head.body_start) == (
        206,
        "bytes 0-9/100",
        len(interim) + len(OK_206),
    )


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"HTTP/1.1 206 Partial",
        OK_206[:-1],
        OK_206[:-2],
        b"HTTP/1.1 100 Continue\r\n\r\n",  # only the interim answer so far
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 206",
    ],
)
def test_an_incomplete_head_asks_for_more_bytes(data: bytes) -> None:
    assert _parse(data) is None


def test_every_split_of_the_bytes_gives_the_same_head() -> None:
    """The socket loop parses whatever has arrived: any prefix is incomplete or the same answer."""
    data = b"HTTP/1.1 100 Continue\r\n\r\n" + OK_206 + b"01234"
    whole = _parse(data)
    for cut in range(len(data)):
        assert parse_response(data, cut) in (None, whole)
        assert (parse_response(data, cut) is None) == (cut < len(data) - 5)


def test_only_the_filled_part_of_the_buffer_is_read() -> None:
    buffer = bytearray(OK_206 + b"\0" * 100)
    assert parse_response(buffer, len(OK_206) - 1) is None
    assert parse_response(buffer, len(OK_206)) == _parse(OK_206)


# ---- the response head: what is refused -----------------------------------------------


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (b"HTTP/1.1 206 P\r\nContent-Length: 10\r\nContent-Length: 10\r\n\r\n", "content-length sent twice"),
        (b"HTTP/1.1 206 P\r\nContent-Length: 10\r\ncontent-length: 12\r\n\r\n", "content-length sent twice"),
        (b"HTTP/1.1 206 P\r\nContent-Length: 10, 10\r\n\r\n", "not a number of bytes"),
        (b"HTTP/1.1 206 P\r\nContent-Length: -1\r\n\r\n", "not a number of bytes"),
        (b"HTTP/1.1 206 P\r\nContent-Length: 1e3\r\n\r\n", "not a number of bytes"),
        (b"HTTP/1.1 206 P\r\nContent-Length:\r\n\r\n", "not a number of bytes"),
        (
            b"HTTP/1.1 206 P\r\nContent-Range: bytes 0-9/9\r\nContent-Range: bytes 0-9/9\r\n\r\n",
            "content-range sent twice",
        ),
        (b"HTTP/2 200 OK\r\n\r\n", "not an HTTP/1.x status line"),
        (b"HTTP/1.2 200 OK\r\n\r\n", "not an HTTP/1.x status line"),
        (b"http/1.1 200 OK\r\n\r\n", "not an HTTP/1.x status line"),
        (b"HTTP/1.1 20 OK\r\n\r\n", "not an HTTP/1.x status line"),
        (b"HTTP/1.1 2000 OK\r\n\r\n", "not an HTTP/1.x status line"),
        (b"HTTP/1.1 099 OK\r\n\r\n", "not an HTTP/1.x status line"),
        (b"HTTP/1.1 600 OK\r\n\r\n", "not an HTTP/1.x status line"),
        (b"HTTP/1.1  200 OK\r\n\r\n", "not an HTTP/1.x status line"),
        (b"HTTP/1.1 200OK\r\n\r\n", "not an HTTP/1.x status line"),
        (b"HTTP/1.1 200 O\x00K\r\n\r\n", "not an HTTP/1.x status line"),
        (b"<html>hello</html>\r\n\r\n", "not an HTTP/1.x status line"),
        (b"\r\nHTTP/1.1 200 OK\r\n\r\n", "not an HTTP/1.x status line"),
        (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", "malformed header line"),
        (b'HTTP/1.1 200 OK\r\nETag : "x"\r\n\r\n', "malformed header line"),  # space before the colon
        (b"HTTP/1.1 200 OK\r\n: value\r\n\r\n", "malformed header line"),  # no name
        (b"HTTP/1.1 200 OK\r\nX(A): 1\r\n\r\n", "malformed header line"),  # not a token
        (b"HTTP/1.1 200 OK\r\nX-A: 1\r\n folded\r\n\r\n", "obsolete line folding"),
        (b"HTTP/1.1 200 OK\r\nX-A: 1\r\n\tfolded\r\n\r\n", "obsolete line folding"),
        (b"HTTP/1.1 200 OK\r\nX-A: a\x00b\r\n\r\n", "control character"),
        (b"HTTP/1.1 200 OK\r\nX-A: a\rb\r\n\r\n", "control character"),
        (b"HTTP/1.1 200 OK\r\nX-A: a\nb\r\n\r\n", "control character"),
        (b"HTTP/1.1 200 OK\r\nX-A: a\x7fb\r\n\r\n", "control character"),
        (b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\n\r\n", "switched protocols"),
        (b"HTTP/1.1 100 Continue\r\nbad\r\n\r\n" + OK_206, "malformed header line"),  # a bad interim head
    ],
)
def test_a_malformed_head_is_refused_with_a_clear_error(data: bytes, says: str) -> None:
    with pytest.raises(UnexpectedResponseError, match=says):
        _parse(data)


def test_a_head_that_never_ends_is_refused_at_the_limit() -> None:
    data = b"HTTP/1.1 200 OK\r\n" + b"X-A: " + b"a" * MAX_HEAD_BYTES
    assert parse_response(data, MAX_HEAD_BYTES - 1) is None
    with pytest.raises(UnexpectedResponseError, match="longer than"):
        parse_response(data, MAX_HEAD_BYTES)


def test_a_head_that_ends_past_the_limit_is_refused_though_its_end_arrived() -> None:
    """A small range is received with its head in one call, so the buffer may hold more than
    MAX_HEAD_BYTES: the limit is still where the head must end."""
    data = b"HTTP/1.1 200 OK\r\n" + b"X-A: " + b"a" * MAX_HEAD_BYTES + b"\r\n\r\nbody"
    with pytest.raises(UnexpectedResponseError, match="longer than"):
        parse_response(data, len(data))
    small = b"HTTP/1.1 206 Partial Content\r\nContent-Length: 4\r\n\r\n" + b"\r\n\r\n" * MAX_HEAD_BYTES
    head = parse_response(small, len(small))
    assert head is not None and head.status == 206 and head.body_start == small.index(b"\r\n\r\n") + 4


def test_endless_interim_answers_are_refused_at_the_limit() -> None:
    data = b"HTTP/1.1 100 Continue\r\n\r\n" * (MAX_HEAD_BYTES // 25 + 1)
    with pytest.raises(UnexpectedResponseError, match="longer than"):
        parse_response(data, MAX_HEAD_BYTES)


def test_parse_head_reads_one_head_without_its_blank_line() -> None:
    assert parse_head(b"HTTP/1.1 416 Range Not Satisfiable\r\nContent-Range: bytes */5") == (
        416,
        {"content-range": "bytes */5"},
        True,
    )


# ---- is it the range asked for? -----------------------------------------------------------


def _head(status: int, **headers: str) -> ResponseHead:
    return ResponseHead(status, {k.replace("_", "-"): v for k, v in headers.items()}, True, 0)


@pytest.mark.parametrize(
    ("head", "start", "end"),
    [
        (_head(206, content_length="10", content_range="bytes 0-9/100"), 0, 10),
        (_head(206, content_length="1", content_range="bytes 99-99/100"), 99, 100),
        (_head(206, content_range="bytes 5-9/*"), 5, 10),  # the total may be unknown
        (_head(200, content_length="100"), 0, 100),  # the whole object is the range
        (_head(200, content_length="0100"), 0, 100),
    ],
)
def test_the_range_asked_for_is_accepted(head: ResponseHead, start: int, end: int) -> None:
    check_range_head(head, start, end)


@pytest.mark.parametrize(
    ("head", "start", "end", "says"),
    [
        (_head(206, content_length="10", content_range="bytes 1-10/100"), 0, 10, "got Content-Range"),
        (_head(206, content_length="10", content_range="bytes 0-10/100"), 0, 10, "got Content-Range"),
        (_head(206, content_length="10"), 0, 10, "got Content-Range ''"),
        (_head(206, content_range="bytes=0-9/100"), 0, 10, "got Content-Range"),
        (_head(206, content_range=" bytes 0-9/100"), 0, 10, "got Content-Range"),
        (_head(206, content_length="11", content_range="bytes 0-9/100"), 0, 10, "content-length 11"),
        (_head(206, content_range="bytes 0-9/100", transfer_encoding="chunked"), 0, 10, "chunked"),
        (_head(200, content_length="100"), 10, 100, "whole object"),
        (_head(200, content_length="100"), 0, 50, "whole object"),
        (_head(200), 0, 100, "whole object"),
        (_head(204), 0, 100, "whole object"),
    ],
)
def test_anything_but_the_range_asked_for_is_refused(
    head: ResponseHead, start: int, end: int, says: str
) -> None:
    with pytest.raises(UnexpectedResponseError, match=says):
        check_range_head(head, start, end)


@pytest.mark.parametrize(
    ("head", "start", "end", "store_bytes"),
    [
        (_head(206, content_length="100", content_range="bytes 0-99/31791"), 0, 100, 31791),
        (_head(206, content_length="10", content_range="bytes 0-9/10"), 0, 100, 10),
        (_head(206, content_length="10", content_range="bytes 0-9/10"), 0, 10, 10),
        (_head(200, content_length="31791"), 0, 100, 31791),
    ],
)
def test_an_answer_that_states_another_object_size_than_the_caller_was_told_is_a_size_mismatch(
    head: ResponseHead, start: int, end: int, store_bytes: int
) -> None:
    told = 100
    with pytest.raises(SizeMismatchError, match=f"holds {store_bytes} bytes, not {told}") as caught:
        check_range_head(head, start, end, told)
    assert caught.value.store_bytes == store_bytes


@pytest.mark.parametrize(
    ("head", "size_bytes", "store_bytes"),
    [
        (_head(416, content_range="bytes */31791"), 3 * 1024 * 1024, 31791),
        (_head(416, content_range="bytes */31791"), 31791, None),
        (_head(416), 100, None),  # no Content-Range: nothing stated, nothing refused here
        (_head(206, content_range="bytes 5-9/*"), 100, None),  # a total the store does not know
        (_head(206, content_range="bytes 0-9/10"), None, None),  # nothing was told: nothing to compare
    ],
)
def test_a_refused_or_unsized_answer_is_a_size_mismatch_only_when_it_states_another_size(
    head: ResponseHead, size_bytes: int | None, store_bytes: int | None
) -> None:
    found = size_mismatch(head, size_bytes)
    assert (found.store_bytes if found is not None else None) == store_bytes


# ---- the request head -----------------------------------------------------------------------


def test_the_request_head_asks_for_the_range_of_that_version() -> None:
    assert render_request("s3:9000", "/b/k?X-Amz-Signature=x", (10, 19), "abc-2", {"X-Trace": "1"}) == (
        b"GET /b/k?X-Amz-Signature=x HTTP/1.1\r\nHost: s3:9000\r\nRange: bytes=10-19\r\n"
        b'Accept-Encoding: identity\r\nUser-Agent: modelsync\r\nIf-Match: "abc-2"\r\nX-Trace: 1\r\n\r\n'
    )


@pytest.mark.parametrize("etag", ['"abc"', "abc"])
def test_if_match_is_always_one_quoted_entity_tag(etag: str) -> None:
    assert b'\r\nIf-Match: "abc"\r\n' in render_request("h", "/", (0, 0), etag, {})


def test_without_an_etag_there_is_no_if_match() -> None:
    assert b"If-Match" not in render_request("h", "/", (0, 0), None, {})


@pytest.mark.parametrize(("name", "value"), [("X-A", "1\r\nX-Evil: 2"), ("X-A\n", "1"), ("X-A", "1\r")])
def test_a_line_break_in_a_header_is_refused(name: str, value: str) -> None:
    with pytest.raises(ValueError, match="line break"):
        render_request("h", "/", (0, 0), None, {name: value})


# ---- what a refusal means -------------------------------------------------------------------

FRESH_URL = "http://s3/b/k?X-Amz-Date=20260101T000000Z&X-Amz-Expires=3600&X-Amz-Signature=x"
#: 2026-01-01T00:00:00Z, when FRESH_URL was signed
SIGNED_AT = 1767225600.0


def _error(
    status: int,
    code: str = "",
    headers: dict[str, str] | None = None,
    proxy: str | None = None,
    now: float = SIGNED_AT,
) -> Exception:
    body = f"<Error><Code>{code}</Code><Message>m</Message></Error>".encode() if code else b""
    return error_for_answer(
        status, headers or {}, body, url=FRESH_URL, where="k bytes 0-9", proxy_netloc=proxy, now=now
    )


@pytest.mark.parametrize(
    ("status", "code", "kind"),
    [
        (503, "SlowDown", TransientFetchError),
        (500, "InternalError", TransientFetchError),
        (403, "AccessDenied", AccessDeniedError),
        (400, "ExpiredToken", PresignedUrlExpiredError),
        (404, "NoSuchKey", NotFoundError),
        (412, "PreconditionFailed", ObjectChangedError),
        (301, "PermanentRedirect", WrongEndpointError),
        (400, "InvalidArgument", UnexpectedResponseError),
        (505, "", UnexpectedResponseError),
    ],
)
def test_each_refusal_maps_to_its_error(status: int, code: str, kind: type[Exception]) -> None:
    error = _error(status, code)
    assert type(error) is kind
    assert str(error).startswith("k bytes 0-9: ")
    assert f"{status}" in str(error)


def test_a_throttled_answer_carries_its_code_and_retry_after() -> None:
    error = _error(503, "SlowDown", {"retry-after": "7"})
    assert isinstance(error, TransientFetchError)
    assert (error.reason, error.status, error.retry_after_s, error.throttled) == ("SlowDown", 503, 7.0, True)


def test_a_403_after_the_url_expired_is_an_expiry_judged_by_the_stores_clock() -> None:
    late = {"date": "Thu, 01 Jan 2026 02:00:00 GMT"}
    expired = _error(403, "AccessDenied", late)
    assert isinstance(expired, PresignedUrlExpiredError) and not expired.token_expired
    assert isinstance(_error(403, "AccessDenied", now=SIGNED_AT + 7200), PresignedUrlExpiredError)
    assert type(_error(403, "AccessDenied")) is AccessDeniedError


def test_a_proxy_that_asks_for_credentials_is_named() -> None:
    assert "proxy p:3128 refused" in str(_error(407, proxy="p:3128"))


@pytest.mark.parametrize(
    ("expires_in_s", "now", "expired"),
    [(3600, SIGNED_AT, False), (3600, SIGNED_AT + 3594, False), (3600, SIGNED_AT + 3595, True)],
)
def test_url_expiry_allows_a_little_clock_difference(expires_in_s: int, now: float, expired: bool) -> None:
    assert url_expired(FRESH_URL.replace("3600", str(expires_in_s)), None, now) is expired
    assert url_expired("http://s3/b/k", None, now) is False  # not a presigned URL


def test_a_redirect_says_where_the_bucket_lives() -> None:
    error = error_for_answer(
        301,
        {"x-amz-bucket-region": "eu-west-1"},
        b"<Error><Code>PermanentRedirect</Code><Endpoint>b.s3.eu-west-1.amazonaws.com</Endpoint></Error>",
        url="http://s3/b/k",
        where="http://s3/b/k bytes 0-9",
        proxy_netloc=None,
        now=0.0,
    )
    assert isinstance(error, WrongEndpointError)
    assert str(error) == (
        "http://s3/b/k bytes 0-9: the store redirects (301 PermanentRedirect) to "
        "b.s3.eu-west-1.amazonaws.com (the bucket is in region eu-west-1); the endpoint or region is wrong: "
        "set AWS_ENDPOINT_URL "
        "(--endpoint-url) and AWS_REGION (--region) to where the bucket lives"
    )


@pytest.mark.parametrize(
    ("value", "seconds"), [(None, None), ("3", 3.0), ("0.5", 0.5), ("-4", 0.0), ("Wed, 21 Oct 2015", None)]
)
def test_retry_after_is_read_in_seconds(value: str | None, seconds: float | None) -> None:
    assert retry_after_s(value) == seconds
