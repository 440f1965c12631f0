"""TLS for both planes: whether an endpoint speaks it, and the trust a client checks it with.

One test of "is this https", for a setting's endpoint and a request's URL alike,
so the data plane, the SDK's `verify` and the CA bundle check never disagree on
which endpoints need a certificate. Settings only read the bundle's path (and
look for a certificate in it); the bundle is loaded here, where a client is built.
"""

from __future__ import annotations

import functools
import os
import ssl

from modelsync.config import Settings, missing_ca_bundle, no_pem_certificate
from modelsync.errors import CaBundleError


def is_https(url: str | None) -> bool:
    """Whether requests to `url` go over TLS; no URL means AWS's own endpoints, which are https."""
    return url is None or url[:8].lower() == "https://"


def make_ssl_context(*, ca_bundle: str | None = None, insecure: bool = False) -> ssl.SSLContext:
    """The TLS context for the data plane: system trust, a CA bundle, or (explicitly) none."""
    if insecure:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        return ctx
    return ssl.create_default_context(cafile=ca_bundle)


def data_plane_context(settings: Settings) -> ssl.SSLContext | None:
    """The range client's TLS context for `settings`' endpoint; None for plain http."""
    if not is_https(settings.endpoint_url):
        return None
    return make_ssl_context(ca_bundle=checked_ca_bundle(settings), insecure=settings.insecure)


def checked_ca_bundle(settings: Settings) -> str | None:
    """The CA bundle of the settings, loaded first when an https client will trust it.

    The file may have changed since the settings were read: a bad one is one line
    (CaBundleError, exit 2), not an ssl.SSLError traceback from the client.
    """
    if settings.ca_bundle and not settings.insecure and is_https(settings.endpoint_url):
        check_ca_bundle(settings.ca_bundle)
    return settings.ca_bundle


def check_ca_bundle(path: str) -> None:
    """The file holds PEM certificates that load; else CaBundleError (exit 2, a configuration problem).

    Called where a TLS context is built (a client for an https endpoint): a bundle swapped
    in while the daemon runs would otherwise surface as an ssl.SSLError traceback. Loading
    costs ~25 ms for the system bundle, which only a connection needs to pay, and only once
    per version of the file (a pull builds two clients).
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise CaBundleError(missing_ca_bundle(path)) from None
    except OSError:
        raise CaBundleError(no_pem_certificate(path)) from None
    if not _loads(path, st.st_ino, st.st_mtime_ns, st.st_size):
        raise CaBundleError(no_pem_certificate(path))


@functools.lru_cache(maxsize=8)
def _loads(path: str, _ino: int, _mtime_ns: int, _size: int) -> bool:
    """Whether this version of the bundle (the file's identity is part of the key) loads."""
    try:
        ssl.create_default_context(cafile=path)
    except (ssl.SSLError, OSError, ValueError):
        return False
    return True
