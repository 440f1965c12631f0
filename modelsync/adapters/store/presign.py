"""Presigned GET URLs signed here with core/sigv4.py, for both stores: one rule, one signer.

Why: botocore runs its whole request pipeline for each URL it presigns (about
0.75 ms of CPU); the SigV4 query signature is one HMAC with a key cached per day
(about 10 µs). A pull of thousands of files signs thousands of URLs.

The rule, in `Presigner.sign`: a URL is signed here when the credentials are
known, the bucket is not an S3 Express one (botocore signs those for another host
and service), and the bucket's URL layout is known, either
- from a static route (`static_route`: the environment's static keys and a
  path-style custom endpoint, so `<endpoint>/<bucket>/<key>` is what botocore
  would sign), which the data-plane store signs everything with; or
- learned from botocore's own URL for the bucket, kept only when core.sigv4
  reproduces its signature exactly: the SDK's store lets botocore sign a
  bucket's first URL and signs the rest here.
Anything else is botocore's to sign.
"""

from __future__ import annotations

import datetime as dt
import os
import re
from collections.abc import Mapping
from typing import NamedTuple
from urllib.parse import parse_qsl, urlsplit

from modelsync.config import Settings
from modelsync.core.sigv4 import Credentials, QuerySigner, quote_key

#: variables that, when set, make botocore resolve credentials or build URLs in ways not
#: reproduced here: a named profile (a missing one is an error), keys it refreshes, FIPS or
#: dual-stack endpoints (refused with a custom endpoint)
_SDK_VARIABLES = (
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_CREDENTIAL_EXPIRATION",
    "AWS_USE_FIPS_ENDPOINT",
    "AWS_USE_DUALSTACK_ENDPOINT",
)
#: a region botocore accepts and signs as written (its own rule is a host label)
_REGION = re.compile(r"(?!\d+$)[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")
#: S3 Express buckets: botocore addresses and signs them differently even on a custom endpoint
EXPRESS_SUFFIXES = ("--x-s3", "--xa-s3")


class StaticRoute(NamedTuple):
    """A route signed here throughout: the endpoint's base URL, the region, the environment's keys."""

    #: the endpoint URL as configured, without a trailing slash; objects are at <base>/<bucket>/<key>
    base_url: str
    region: str
    credentials: Credentials


def static_route(settings: Settings, env: Mapping[str, str]) -> StaticRoute | None:
    """The route when every request can be signed here exactly as botocore would sign it, else None.

    That needs static keys (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, which
    botocore's chain takes before anything else) and a path-style custom
    endpoint. Anything else is botocore's to resolve: profiles, web identity,
    container and instance roles, credential_process; AWS's own endpoints
    (botocore's rules pick the host by region and follow region redirects); a
    shared config file, which may change either; virtual-host addressing.
    """
    access_key = env.get("AWS_ACCESS_KEY_ID", "")
    secret_key = env.get("AWS_SECRET_ACCESS_KEY", "")
    if not (access_key and secret_key) or any(env.get(name) for name in _SDK_VARIABLES):
        return None
    if os.path.exists(os.path.expanduser(env.get("AWS_CONFIG_FILE") or "~/.aws/config")):
        return None
    endpoint = settings.endpoint_url
    if endpoint is None or settings.addressing_style != "path" or not _REGION.fullmatch(settings.region):
        return None
    parts = urlsplit(endpoint)
    unusual = parts.query or parts.fragment or "@" in parts.netloc  # botocore's to judge, or refuse
    if unusual or not endpoint.startswith(("http://", "https://")):
        return None
    # botocore reads the token from the first of these that is set and not empty
    token = env.get("AWS_SECURITY_TOKEN") or env.get("AWS_SESSION_TOKEN") or None
    return StaticRoute(endpoint.rstrip("/"), settings.region, Credentials(access_key, secret_key, token))


class Presigner:
    """Signs GET URLs here where the module's rule allows it; None where botocore must sign.

    With a `route`, every bucket's layout is the route's; without one, each bucket's
    is learned (`learn`) from botocore's first URL for it.
    """

    def __init__(self, route: StaticRoute | None = None) -> None:
        self._route = (route.base_url, QuerySigner(route.region)) if route is not None else None
        #: learned layouts: the bucket's base URL (objects follow it) and its signing region's signer;
        #: None once botocore showed a layout not reproduced here
        self._learned: dict[str, tuple[str, QuerySigner] | None] = {}

    def _layout(self, bucket: str) -> tuple[str, QuerySigner] | None:
        if bucket.endswith(EXPRESS_SUFFIXES):
            return None
        if self._route is not None:
            return f"{self._route[0]}/{bucket}/", self._route[1]
        return self._learned.get(bucket)

    def sign(
        self,
        bucket: str,
        key: str,
        creds: Credentials | None,
        now: dt.datetime,
        expires_s: int,
        headers: Mapping[str, str] | None = None,
    ) -> str | None:
        """A GET URL of the object signed here (with `headers` signed too), or None: botocore's to sign."""
        if creds is None or (layout := self._layout(bucket)) is None:
            return None
        base, signer = layout
        return signer.presign_get(base + quote_key(key), creds, now, expires_s, headers)

    def sign_listing(
        self,
        bucket: str,
        creds: Credentials | None,
        now: dt.datetime,
        expires_s: int,
        params: Mapping[str, str],
    ) -> str | None:
        """A ListObjectsV2 URL of the bucket with the listing's `params` signed here, or None."""
        if creds is None or (layout := self._layout(bucket)) is None:
            return None
        base, signer = layout
        return signer.presign_get(base.rstrip("/"), creds, now, expires_s, params=params)

    def learn(self, bucket: str, key: str, creds: Credentials, url: str) -> None:
        """Keep the layout of botocore's `url` (of `key`) for the bucket, if core.sigv4 reproduces it."""
        if self._route is not None or bucket in self._learned:
            return
        self._learned[bucket] = None
        target, _, query = url.partition("?")
        params = dict(parse_qsl(query))
        scope = params.get("X-Amz-Credential", "").split("/")
        suffix = "/" + quote_key(key)
        if len(scope) != 5 or scope[3] != "s3" or not target.endswith(suffix) or "X-Amz-Date" not in params:
            return
        try:
            when = dt.datetime.strptime(params["X-Amz-Date"], "%Y%m%dT%H%M%SZ").replace(tzinfo=dt.UTC)
            expires_s = int(params["X-Amz-Expires"])
        except (KeyError, ValueError):
            return
        signer = QuerySigner(scope[2])
        ours, _, our_query = signer.presign_get(target, creds, when, expires_s).partition("?")
        if ours == target and dict(parse_qsl(our_query)) == params:
            self._learned[bucket] = (target[: -len(suffix) + 1], signer)
