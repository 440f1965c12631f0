"""One rule for which URLs are signed here rather than by botocore, the same for both stores.

A URL is signed here with known credentials, for a bucket that is not S3 Express,
whose layout is known: the static route's (the data-plane store) or one learned
from botocore's own URL (the SDK's store). Both then sign through the same path.
"""

from __future__ import annotations

import datetime as dt

import pytest
from test_sigv4 import botocore_url

from modelsync.adapters.store.presign import Presigner, StaticRoute
from modelsync.core.sigv4 import Credentials

CREDS = Credentials("AKIDEXAMPLE", "secret/+=", "token")
ENDPOINT = "http://127.0.0.1:9000"
WHEN = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)


def static() -> Presigner:
    return Presigner(StaticRoute(ENDPOINT, "eu-west-1", CREDS))


def learned(bucket: str) -> Presigner:
    presigner = Presigner()
    presigner.learn(bucket, "first.bin", CREDS, botocore_url(ENDPOINT, "eu-west-1", "path", CREDS, bucket,
                                                               "first.bin", 600))  # fmt: skip
    return presigner


@pytest.mark.parametrize("make", [static, learned])
@pytest.mark.parametrize("bucket", ["models", "my-bucket--x-s3", "b--xa-s3"])
def test_one_rule_decides_for_both_stores(make: object, bucket: str) -> None:
    presigner = static() if make is static else learned(bucket)
    express = bucket.endswith(("--x-s3", "--xa-s3"))
    url = presigner.sign(bucket, "w.bin", CREDS, WHEN, 600)
    assert (url is None) is express, "an S3 Express bucket is botocore's to sign, however its layout is known"
    assert presigner.sign(bucket, "w.bin", None, WHEN, 600) is None, "without known credentials: botocore's"


def test_a_bucket_not_learned_yet_is_botocores_to_sign() -> None:
    presigner = learned("models")
    assert presigner.sign("other", "w.bin", CREDS, WHEN, 600) is None
    assert presigner.sign_listing("other", CREDS, WHEN, 60, {"list-type": "2"}) is None


def test_the_static_route_and_a_learned_layout_sign_the_same_url() -> None:
    """One signer path: for the same path-style layout both stores' URLs are byte for byte the same."""
    key = "dir/a b+c.safetensors"
    ours = static().sign("models", key, CREDS, WHEN, 600, {"x-amz-checksum-mode": "ENABLED"})
    assert ours == learned("models").sign("models", key, CREDS, WHEN, 600, {"x-amz-checksum-mode": "ENABLED"})
    params = {"list-type": "2", "prefix": "org/"}
    listing = static().sign_listing("models", CREDS, WHEN, 60, params)
    assert listing is not None and listing.startswith(f"{ENDPOINT}/models?")
    assert listing == learned("models").sign_listing("models", CREDS, WHEN, 60, params)


def test_a_static_route_learns_nothing() -> None:
    presigner = static()
    presigner.learn("models", "k", CREDS, "https://elsewhere.example/models/k?X-Amz-Signature=0")
    url = presigner.sign("models", "k", CREDS, WHEN, 600)
    assert url is not None and url.startswith(f"{ENDPOINT}/models/k?")
