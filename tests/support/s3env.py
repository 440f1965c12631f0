"""Where and as whom a test talks to S3, as a value instead of process-wide environment.

Tests never mutate `os.environ`: a leaked `AWS_ENDPOINT_URL` would silently point a
later test at a dead server. In-process code gets an `S3Env`; a child process gets
the dict from `subprocess_env`.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, replace

import boto3
from botocore.client import BaseClient
from botocore.config import Config

TEST_ACCESS_KEY_ID = "testing"
TEST_SECRET_ACCESS_KEY = "testing"
TEST_REGION = "us-east-1"

# Exported on the project machines and pointing at the system CA bundle. Harmless for
# http endpoints with botocore, but TLS tests must set or drop them deliberately.
CA_BUNDLE_VARS = ("AWS_CA_BUNDLE", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE")

# Anything that could make a credential chain or endpoint differ from ours: the one list
# for child processes (`subprocess_env`) and in-process engine calls (conftest's `aws_credentials`).
FOREIGN_AWS_VARS = (
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AWS_ROLE_ARN",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_CONFIG_FILE",
)


_SESSION_LOCK = threading.Lock()


@functools.cache
def _shared_session() -> boto3.session.Session:
    """One session for all test clients: each new session re-parses the S3 service model
    (tens to hundreds of milliseconds per client). Sessions are not thread-safe, hence
    the lock around client creation."""
    return boto3.session.Session()


@dataclass(frozen=True, slots=True)
class S3Env:
    """An S3 endpoint and fixed test credentials.

    `endpoint_url` is the moto server, or a fault proxy in front of it (see `via`).
    """

    endpoint_url: str
    access_key_id: str = TEST_ACCESS_KEY_ID
    secret_access_key: str = TEST_SECRET_ACCESS_KEY
    region: str = TEST_REGION

    def via(self, endpoint_url: str) -> S3Env:
        """The same credentials against another endpoint, typically a fault proxy."""
        return replace(self, endpoint_url=endpoint_url)

    def client_kwargs(self) -> dict[str, str]:
        """Keyword arguments for `boto3.client("s3", ...)` and aiobotocore's `create_client`."""
        return {
            "endpoint_url": self.endpoint_url,
            "aws_access_key_id": self.access_key_id,
            "aws_secret_access_key": self.secret_access_key,
            "region_name": self.region,
        }

    def boto3_client(
        self,
        total_max_attempts: int = 3,
        read_timeout_s: float = 10.0,
        connect_timeout_s: float = 5.0,
        signature_version: str | None = None,
    ) -> BaseClient:
        """A sync boto3 S3 client; close it when done, or the pooled sockets leak.

        `total_max_attempts` counts the first call too (botocore's `max_attempts` does
        not), so 1 means "no retries", which fault tests usually want. Presigned URLs
        are SigV2 unless `signature_version="s3v4"` (what modelsync signs with).
        """
        config = Config(
            retries={"mode": "standard", "total_max_attempts": total_max_attempts},
            read_timeout=read_timeout_s,
            connect_timeout=connect_timeout_s,
            s3={"addressing_style": "path"},
            signature_version=signature_version,
        )
        with _SESSION_LOCK:
            return _shared_session().client("s3", config=config, **self.client_kwargs())

    def subprocess_env(
        self,
        base: Mapping[str, str] | None = None,
        keep_ca_bundle: bool = True,
    ) -> dict[str, str]:
        """Environment for a child (the CLI) that should talk to this endpoint.

        A copy of `base` (default `os.environ`) with the endpoint, credentials and region
        set, the instance-metadata lookup off (it would stall for seconds off-cloud), and
        any profile, session token or per-service endpoint removed, and no `MODELSYNC_*`
        setting of the machine's own (a test sets the ones it means). The CA-bundle
        variables are kept by default because nodes export them too; pass
        `keep_ca_bundle=False` for a child that must start from default trust.
        """
        env = dict(os.environ if base is None else base)
        for name in FOREIGN_AWS_VARS:
            env.pop(name, None)
        for name in [n for n in env if n.startswith(("AWS_ENDPOINT_URL_", "MODELSYNC_"))]:
            del env[name]
        if not keep_ca_bundle:
            for name in CA_BUNDLE_VARS:
                env.pop(name, None)
        no_proxy = ",".join(part for part in (env.get("NO_PROXY", ""), "127.0.0.1,localhost") if part)
        env.update(
            {
                "AWS_ENDPOINT_URL": self.endpoint_url,
                "AWS_ACCESS_KEY_ID": self.access_key_id,
                "AWS_SECRET_ACCESS_KEY": self.secret_access_key,
                "AWS_DEFAULT_REGION": self.region,
                "AWS_REGION": self.region,
                "AWS_EC2_METADATA_DISABLED": "true",
                "NO_PROXY": no_proxy,
                "no_proxy": no_proxy,
            }
        )
        return env
