"""Test models in a bucket: deterministic bytes, and the PUTs that store them."""

from __future__ import annotations

import hashlib

from botocore.client import BaseClient

from modelsync.core.refs import ModelRef, parse_source
from support.s3env import S3Env


def payload(size: int, seed: int = 0) -> bytes:
    """Deterministic bytes that differ per seed at every offset, so a mixed-up file shows."""
    block = hashlib.sha256(f"seed-{seed}".encode()).digest() * (64 * 1024 // 32)
    return (block * (size // len(block) + 1))[:size]


def put_model(client: BaseClient, bucket: str, prefix: str, files: dict[str, bytes]) -> ModelRef:
    """PUT each of `files` (name -> bytes) under `prefix`, creating the bucket if it is new.

    Single PUTs, so each ETag is the MD5 of the bytes.
    """
    if bucket not in {b["Name"] for b in client.list_buckets()["Buckets"]}:
        client.create_bucket(Bucket=bucket)
    for name, data in files.items():
        client.put_object(Bucket=bucket, Key=prefix + name, Body=data)
    return parse_source(f"s3://{bucket}/{prefix}")


def upload(env: S3Env, bucket: str, prefix: str, files: dict[str, bytes]) -> ModelRef:
    """`put_model` through a client of its own, for tests that hold an S3Env, not a client."""
    client = env.boto3_client()
    try:
        return put_model(client, bucket, prefix, files)
    finally:
        client.close()
