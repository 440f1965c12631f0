"""One test of "is this endpoint https", shared by the data plane, the SDK's `verify` and the
CA bundle check, so no two of them disagree on which endpoints need a certificate."""

from __future__ import annotations

from pathlib import Path

import pytest

from modelsync.adapters.http.route import parse_url
from modelsync.adapters.http.tls import is_https
from modelsync.adapters.store.sdk import sdk_verify
from modelsync.config import Settings
from modelsync.errors import CaBundleError


@pytest.mark.parametrize(
    ("url", "https"),
    [
        (None, True),  # no endpoint: AWS's own, which is https
        ("https://s3.example:9000", True),
        ("HTTPS://s3.example", True),
        ("http://127.0.0.1:9000", False),
        ("http://https.example", False),
        ("httpsx://s3.example", False),
    ],
)
def test_an_endpoint_is_https_by_its_scheme_alone(url: str | None, https: bool) -> None:
    assert is_https(url) is https
    if url is not None and url.lower().startswith(("http://", "https://")):
        assert parse_url(url + "/b/k")[0].tls is https  # the data plane's route asks the same


def test_the_sdk_checks_the_ca_bundle_for_an_https_endpoint_only(tmp_path: Path) -> None:
    bundle = tmp_path / "ca.crt"
    bundle.write_text("-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
    plain = Settings(endpoint_url="http://127.0.0.1:9000", ca_bundle=str(bundle))
    assert sdk_verify(plain) == str(bundle)
    with pytest.raises(CaBundleError):
        sdk_verify(Settings(endpoint_url="https://s3.example", ca_bundle=str(bundle)))
    insecure = Settings(endpoint_url="https://s3.example", ca_bundle=str(bundle), insecure=True)
    assert sdk_verify(insecure) is False
