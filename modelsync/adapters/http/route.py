"""The route of the data plane to an endpoint: its address and the proxy on the way.

The proxy is the one botocore's control plane takes (``HTTPS_PROXY`` /
``HTTP_PROXY`` / ``NO_PROXY``, resolved by botocore's own functions), so both
planes always agree: a CONNECT tunnel for https, absolute-form requests for http.
"""

from __future__ import annotations

import base64
import os
import socket
import sys
from typing import NamedTuple
from urllib.parse import unquote, urlsplit

from modelsync.adapters.http.head import MAX_HEAD_BYTES
from modelsync.adapters.http.tls import is_https
from modelsync.errors import (
    AccessDeniedError,
    RemoteUnavailableError,
    TransientFetchError,
    UnexpectedResponseError,
    UsageError,
)


class Endpoint(NamedTuple):
    """Where a URL's requests go: one keep-alive connection per thread and endpoint."""

    #: https: through a proxy, a CONNECT tunnel, then TLS end to end
    tls: bool
    host: str
    port: int
    netloc: str


class Proxy(NamedTuple):
    """An http:// forward proxy, and the Proxy-Authorization value its URL carries."""

    host: str
    port: int
    netloc: str
    authorization: str | None


def environ_proxy(url: str) -> str | None:
    """The proxy botocore's control plane uses for ``url``, or None for a direct route.

    Resolved by botocore's own functions from ``HTTPS_PROXY`` / ``HTTP_PROXY`` /
    ``NO_PROXY`` (and their lower-case forms), so both planes always agree. On
    Linux those functions read nothing but ``<scheme>_proxy`` in any case for
    ``url``'s scheme (urllib's ``getproxies``), so without such a variable the
    answer is "direct" and botocore is not imported: a pull that never needs the
    S3 SDK does not load it for this.
    """
    scheme = f"{url.partition(':')[0].lower()}_proxy"
    if sys.platform == "linux" and not any(v and k.lower() == scheme for k, v in os.environ.items()):
        return None
    from botocore.httpsession import ProxyConfiguration
    from botocore.utils import get_environ_proxies

    proxy: str | None = ProxyConfiguration(proxies=get_environ_proxies(url)).proxy_url_for(url)
    return proxy


def parse_url(url: str) -> tuple[Endpoint, str]:
    """The endpoint of an http(s) URL and the request target (path and query) at it."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {url.split('?', 1)[0]}")
    tls = is_https(url)
    port = parts.port or (443 if tls else 80)
    netloc = parts.netloc.rsplit("@", 1)[-1]
    target = parts.path or "/"
    if parts.query:
        target += "?" + parts.query
    return Endpoint(tls, parts.hostname, port, netloc), target


def parse_proxy(url: str | None) -> Proxy | None:
    """The proxy a URL names (None: a direct route); only http:// proxies are spoken to."""
    if not url:
        return None
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise UsageError(
            f"proxy {parts.scheme}://{parts.hostname}: the data plane speaks to http:// proxies only "
            "(https through one still goes in an end-to-end TLS tunnel); set HTTPS_PROXY=http://..."
        )
    authorization = None
    if parts.username is not None:
        user_pass = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
        authorization = "Basic " + base64.b64encode(user_pass.encode()).decode("ascii")
    port = parts.port or 80
    return Proxy(parts.hostname, port, f"{parts.hostname}:{port}", authorization)


def tunnel(sock: socket.socket, endpoint: Endpoint, proxy: Proxy) -> None:
    """Ask the proxy for a CONNECT tunnel to ``endpoint``; TLS then runs end to end inside it."""
    authority = f"{endpoint.host}:{endpoint.port}"
    lines = [f"CONNECT {authority} HTTP/1.1", f"Host: {authority}", "User-Agent: modelsync"]
    if proxy.authorization:
        lines.append(f"Proxy-Authorization: {proxy.authorization}")
    head = b""
    try:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        while b"\r\n\r\n" not in head:
            # One byte at a time: nothing after the proxy's head may be consumed here.
            chunk = sock.recv(1)
            if not chunk:
                raise ConnectionResetError("the proxy closed the connection")
            head += chunk
            if len(head) > MAX_HEAD_BYTES:
                raise UnexpectedResponseError(f"proxy {proxy.netloc}: response head too long")
    except OSError as exc:
        raise TransientFetchError(
            f"CONNECT {authority} via proxy {proxy.netloc} failed: {exc}", bytes_written=0, reason="connect"
        ) from exc
    status_line = head.split(b"\r\n", 1)[0].decode("latin-1", "replace")
    fields = status_line.split(" ", 2)
    status = int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else 0
    if 200 <= status < 300:
        return
    what = f"proxy {proxy.netloc} refused CONNECT {authority}: {status_line}"
    if status in (401, 407):
        raise AccessDeniedError(f"{what}; put the proxy's user and password in the proxy URL")
    if status in (502, 503, 504):
        raise TransientFetchError(what, bytes_written=0, reason="connect", status=status)
    raise RemoteUnavailableError(f"{what}; check HTTPS_PROXY and NO_PROXY")
