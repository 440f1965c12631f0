"""TLS for both planes: whether an endpoint speaks it, and the trust a client checks it with.

One test of "is this https", for a setting's endpoint and a request's URL alike,
so the data plane, the SDK's `verify` and the CA bundle check never disagree on
which endpoints need a certificate.
"""

from __future__ import annotations

import ssl


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
