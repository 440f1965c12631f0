"""The cached-key SigV4 presigner signs exactly as botocore's own presigner does."""

from __future__ import annotations

import datetime as dt
from typing import Any
from urllib.parse import parse_qs, urlsplit

import botocore.session
import pytest
from botocore.config import Config

from modelsync.core.sigv4 import Credentials, QuerySigner, quote_key, signing_key

KEYS = [
    "model/model-00001-of-00008.safetensors",
    "model/with space/and+plus=eq&amp.bin",
    "model/ünïcödé/日本語.json",
    "model/tilde~star*paren(1)!'quote'.txt",
]


def botocore_url(endpoint: str, region: str, style: str, creds: Credentials, bucket: str, key: str,
                 expires_s: int) -> str:
    client = botocore.session.get_session().create_client(
        "s3", endpoint_url=endpoint, region_name=region,
        aws_access_key_id=creds.access_key, aws_secret_access_key=creds.secret_key,
        aws_session_token=creds.token,
        config=Config(signature_version="s3v4", s3={"addressing_style": style}),
    )
    return str(client.generate_presigned_url(
        "get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=expires_s))


def base_and_time(url: str) -> tuple[str, dt.datetime]:
    parts = urlsplit(url)
    stamp = parse_qs(parts.query)["X-Amz-Date"][0]
    when = dt.datetime.strptime(stamp, "%Y%m%dT%H%M%SZ").replace(tzinfo=dt.UTC)
    return f"{parts.scheme}://{parts.netloc}{parts.path}", when


@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize(
    ("endpoint", "region", "style", "token"),
    [
        ("http://127.0.0.1:9000", "us-east-1", "path", None),
        ("https://s3.example.internal", "eu-central-1", "path", "session/token+with=chars"),
        ("https://s3.example.internal:8443", "us-west-2", "virtual", None),
    ],
)
def test_matches_botocore(endpoint: str, region: str, style: str, token: str | None, key: str) -> None:
    creds = Credentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", token)
    theirs = botocore_url(endpoint, region, style, creds, "models-bucket", key, 21600)
    base, when = base_and_time(theirs)
    assert base.endswith("/" + quote_key(key))
    ours = QuerySigner(region).presign_get(base, creds, when, 21600)
    assert urlsplit(ours).path == urlsplit(theirs).path
    assert parse_qs(urlsplit(ours).query) == parse_qs(urlsplit(theirs).query)


def test_key_is_cached_per_day_and_secret() -> None:
    signer = QuerySigner("us-east-1")
    creds = Credentials("AK", "secret-one")
    day = dt.datetime(2026, 12, 1, 3, 0, tzinfo=dt.UTC)
    signer.presign_get("http://h:1/b/k", creds, day, 60)
    cached = signer._key
    signer.presign_get("http://h:1/b/k2", creds, day + dt.timedelta(hours=1), 60)
    assert signer._key is cached  # same day, same secret: no new derivation
    signer.presign_get("http://h:1/b/k", creds, day + dt.timedelta(days=1), 60)
    assert signer._key is not None and signer._key[1] == "20261202"
    rotated = Credentials("AK", "secret-two")
    url = signer.presign_get("http://h:1/b/k", rotated, day, 60)
    assert signer._key[0] == "secret-two"
    assert signer._key[2] == signing_key("secret-two", "20261201", "us-east-1", "s3")
    assert url != QuerySigner("us-east-1").presign_get("http://h:1/b/k", creds, day, 60)


def test_refuses_a_url_with_a_query() -> None:
    with pytest.raises(ValueError, match="no query"):
        QuerySigner("us-east-1").presign_get("http://h/b/k?x=1", Credentials("a", "b"),
                                            dt.datetime(2026, 1, 1, tzinfo=dt.UTC), 60)


def test_repr_hides_secrets() -> None:
    text = repr(Credentials("AKID", "very-secret", "tok-secret"))
    assert "very-secret" not in text and "tok-secret" not in text and "AKID" in text


def test_the_s3_adapter_signs_like_botocore_after_learning_a_bucket() -> None:
    """The presigner keeps a bucket only when it reproduces botocore's URL, then signs alike."""
    from modelsync.adapters.store.presign import Presigner

    creds = Credentials("AKIDEXAMPLE", "secret/key+", "a-session-token")
    cached = Presigner()
    first = botocore_url("http://127.0.0.1:9000", "eu-west-1", "path", creds, "bkt", KEYS[0], 3600)
    assert cached.sign("bkt", KEYS[1], creds, dt.datetime.now(dt.UTC), 3600) is None
    cached.learn("bkt", KEYS[0], creds, first)
    for key in KEYS[1:]:
        theirs = botocore_url("http://127.0.0.1:9000", "eu-west-1", "path", creds, "bkt", key, 3600)
        _, when = base_and_time(theirs)
        ours = cached.sign("bkt", key, creds, when, 3600)
        assert ours is not None
        assert urlsplit(ours).path == urlsplit(theirs).path
        assert parse_qs(urlsplit(ours).query) == parse_qs(urlsplit(theirs).query)


def test_the_s3_adapter_leaves_a_url_it_cannot_reproduce_to_botocore() -> None:
    from modelsync.adapters.store.presign import Presigner

    creds = Credentials("AKIDEXAMPLE", "secret")
    cached = Presigner()
    first = botocore_url("http://127.0.0.1:9000", "us-east-1", "path", creds, "bkt", KEYS[0], 60)
    cached.learn("bkt", KEYS[0], creds, first.replace("X-Amz-Signature=", "X-Amz-Signature=0"))
    assert cached.sign("bkt", KEYS[1], creds, dt.datetime.now(dt.UTC), 60) is None


def path_style_client(creds: Credentials) -> Any:
    """botocore's S3 client for a path-style endpoint in eu-west-1, signing with `creds`."""
    return botocore.session.get_session().create_client(
        "s3", endpoint_url="http://127.0.0.1:9000", region_name="eu-west-1",
        aws_access_key_id=creds.access_key, aws_secret_access_key=creds.secret_key,
        aws_session_token=creds.token,
        config=Config(signature_version="s3v4", s3={"addressing_style": "path"}),
    )  # fmt: skip


def test_a_signed_checksum_mode_header_is_signed_as_botocore_signs_it() -> None:
    """The manifest's GET asks for the store's checksum as botocore's get_object does (ChecksumMode)."""
    creds = Credentials("AKIDEXAMPLE", "secret", "token")
    client = path_style_client(creds)
    theirs = str(client.generate_presigned_url(
        "get_object", Params={"Bucket": "bkt", "Key": KEYS[1], "ChecksumMode": "ENABLED"}, ExpiresIn=600))
    base, when = base_and_time(theirs)

    ours = QuerySigner("eu-west-1").presign_get(base, creds, when, 600, {"x-amz-checksum-mode": "ENABLED"})

    assert urlsplit(ours)._replace(query="") == urlsplit(theirs)._replace(query="")
    assert parse_qs(urlsplit(ours).query) == parse_qs(urlsplit(theirs).query)


@pytest.mark.parametrize("token", [None, "opaque/continuation+token=="])
@pytest.mark.parametrize("prefix", ["org/model/rev1/", "org/with space/ünï+=&/"])
def test_a_listing_page_is_signed_as_botocore_signs_list_objects_v2(prefix: str, token: str | None) -> None:
    from modelsync.core.listing import list_params

    creds = Credentials("AKIDEXAMPLE", "secret", "session-token")
    client = path_style_client(creds)
    params = {"Bucket": "bkt", "Prefix": prefix, "EncodingType": "url"}
    if token is not None:
        params["ContinuationToken"] = token
    theirs = str(client.generate_presigned_url("list_objects_v2", Params=params, ExpiresIn=60))
    base, when = base_and_time(theirs)

    ours = QuerySigner("eu-west-1").presign_get(base, creds, when, 60, params=list_params(prefix, token))

    assert urlsplit(ours).path == urlsplit(theirs).path
    assert parse_qs(urlsplit(ours).query) == parse_qs(urlsplit(theirs).query)
