"""SigV4 query signing (presigned GET URLs) with the signing key cached per day.

A full botocore presign runs the whole request pipeline (parameter validation,
serialisation, event hooks, endpoint rules) for every object: about a millisecond
of CPU, which caps a pull of thousands of small files well below what the data path
can do. The signature itself is four HMACs for the day's signing key, which depends
only on (secret, date, region, service), and one HMAC of a short string per URL.
This module does that second part for URLs whose base (scheme, host, bucket layout)
botocore has already decided. Pure: the time is a parameter.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import quote, urlsplit

ALGORITHM = "AWS4-HMAC-SHA256"
_DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True, slots=True)
class Credentials:
    """The keys a request is signed with (as resolved by botocore, refreshed by it)."""

    access_key: str
    secret_key: str = field(repr=False)  # never printed
    token: str | None = field(default=None, repr=False)


def quote_key(key: str) -> str:
    """An object key as it appears in a URL path: everything but unreserved characters and '/' encoded."""
    return quote(key, safe="/~")


def _quote_param(value: str) -> str:
    return quote(value, safe="-_.~")


def _hmac(key: bytes, msg: str) -> bytes:
    return hmac.new(key, msg.encode(), hashlib.sha256).digest()


def signing_key(secret_key: str, date: str, region: str, service: str) -> bytes:
    """The day's key: HMAC chain over date (YYYYMMDD), region, service and "aws4_request"."""
    k = _hmac(("AWS4" + secret_key).encode(), date)
    k = _hmac(k, region)
    k = _hmac(k, service)
    return _hmac(k, "aws4_request")


class QuerySigner:
    """Presigns GET URLs; the signing key is derived once per (secret, day) and reused.

    The query string is kept per (credentials, second, expiry) and the Host header per
    origin, so signing one more URL is one SHA-256 and one HMAC. One instance per
    region and service; not thread-safe (the engine signs on its event loop).
    """

    def __init__(self, region: str, service: str = "s3") -> None:
        self.region = region
        self.service = service
        self._key: tuple[str, str, bytes] | None = None  # (secret, date, key)
        self._query: tuple[tuple[str, str | None, str, int, str], str] | None = None
        self._hosts: dict[str, str] = {}

    def _key_for(self, secret_key: str, date: str) -> bytes:
        if self._key is None or self._key[0] != secret_key or self._key[1] != date:
            self._key = (secret_key, date, signing_key(secret_key, date, self.region, self.service))
        return self._key[2]

    def _host(self, origin: str) -> str:
        host = self._hosts.get(origin)
        if host is None:
            parts = urlsplit(origin)
            host = parts.hostname or ""
            if ":" in host:
                host = f"[{host}]"
            if parts.port is not None and parts.port != _DEFAULT_PORTS.get(parts.scheme):
                host = f"{host}:{parts.port}"
            self._hosts[origin] = host
        return host

    def _canonical_query(self, creds: Credentials, stamp: str, expires_s: int, signed: str) -> str:
        cache_key = (creds.access_key, creds.token, stamp, expires_s, signed)
        if self._query is None or self._query[0] != cache_key:
            scope = f"{stamp[:8]}/{self.region}/{self.service}/aws4_request"
            params = {
                "X-Amz-Algorithm": ALGORITHM,
                "X-Amz-Credential": f"{creds.access_key}/{scope}",
                "X-Amz-Date": stamp,
                "X-Amz-Expires": str(expires_s),
                "X-Amz-SignedHeaders": signed,
            }
            if creds.token:
                params["X-Amz-Security-Token"] = creds.token
            query = "&".join(f"{_quote_param(k)}={_quote_param(v)}" for k, v in sorted(params.items()))
            self._query = (cache_key, query)
        return self._query[1]

    def presign_get(
        self,
        url: str,
        creds: Credentials,
        now: dt.datetime,
        expires_s: int,
        headers: Mapping[str, str] | None = None,
        params: Mapping[str, str] | None = None,
    ) -> str:
        """`url` (path already percent-encoded, no query) signed for GET until now + expires_s.

        `host` is signed, and `headers` (lower-case names) if given: the request must
        then send them as given. Others, such as `Range` and `If-Match`, may be added
        freely, as with botocore's own presigned URLs. S3 refuses an `x-amz-*` header
        that is not signed. `params` are the request's own query parameters (a listing's
        `list-type`, `prefix`, ...), signed with the rest of the query.
        """
        if "?" in url or "#" in url:
            raise ValueError("the URL to sign must carry no query or fragment")
        scheme_end = url.index("://") + 3
        path_start = url.find("/", scheme_end)
        origin, path = (url, "/") if path_start < 0 else (url[:path_start], url[path_start:])
        stamp = now.astimezone(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
        fields = sorted({"host": self._host(origin), **(headers or {})}.items())
        signed = ";".join(name for name, _ in fields)
        query = self._canonical_query(creds, stamp, expires_s, signed)
        if params:
            pairs = [pair.split("=", 1) for pair in query.split("&")]
            pairs += [[_quote_param(k), _quote_param(v)] for k, v in params.items()]
            query = "&".join(f"{k}={v}" for k, v in sorted(pairs))
        canonical_headers = "".join(f"{name}:{value.strip()}\n" for name, value in fields)
        canonical = f"GET\n{path}\n{query}\n{canonical_headers}\n{signed}\nUNSIGNED-PAYLOAD"
        scope = f"{stamp[:8]}/{self.region}/{self.service}/aws4_request"
        to_sign = f"{ALGORITHM}\n{stamp}\n{scope}\n{hashlib.sha256(canonical.encode()).hexdigest()}"
        signature = hmac.new(self._key_for(creds.secret_key, stamp[:8]), to_sign.encode(), hashlib.sha256)
        return f"{origin}{path}?{query}&X-Amz-Signature={signature.hexdigest()}"
