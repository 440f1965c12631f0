"""The boto3 contender: list a prefix, then `download_file` each object, several files at once.

Run as its own process by the harness (bench.contenders) so that its CPU time and peak RSS are its own.
This is how a careful user drives boto3: one `download_file` per file with a tuned
TransferConfig (classic threaded transfer manager, never CRT), files in a thread pool,
one shared client with a connection pool large enough for every thread.
"""

from __future__ import annotations

import argparse
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import boto3
from boto3.s3.transfer import TransferConfig
from botocore.config import Config

MiB = 1 << 20


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--endpoint-url", required=True)
    ap.add_argument("--bucket", required=True)
    ap.add_argument("--prefix", required=True, help="key prefix ending in /")
    ap.add_argument("--dest", type=Path, required=True)
    ap.add_argument("--files-in-parallel", type=int, default=4)
    ap.add_argument("--max-concurrency", type=int, default=8)
    ap.add_argument("--chunk-mib", type=int, default=16)
    ap.add_argument("--io-chunk-kib", type=int, default=1024)
    ap.add_argument("--max-io-queue", type=int, default=100)
    args = ap.parse_args()

    pool = args.files_in_parallel * args.max_concurrency + 2
    client = boto3.client(
        "s3", endpoint_url=args.endpoint_url,
        config=Config(max_pool_connections=pool, s3={"addressing_style": "path"}),
    )
    config = TransferConfig(
        multipart_threshold=args.chunk_mib * MiB,
        multipart_chunksize=args.chunk_mib * MiB,
        max_concurrency=args.max_concurrency,
        io_chunksize=args.io_chunk_kib * 1024,
        max_io_queue=args.max_io_queue,
        use_threads=True,
        preferred_transfer_client="classic",
    )
    keys = [
        obj["Key"]
        for page in client.get_paginator("list_objects_v2").paginate(
            Bucket=args.bucket, Prefix=args.prefix
        )
        for obj in page.get("Contents", [])
        if obj["Key"].startswith(args.prefix)  # a static listing may ignore Prefix
    ]

    def fetch(key: str) -> None:
        target = args.dest / key[len(args.prefix) :]
        target.parent.mkdir(parents=True, exist_ok=True)
        client.download_file(args.bucket, key, str(target), Config=config)

    with ThreadPoolExecutor(args.files_in_parallel) as ex:
        for _ in ex.map(fetch, keys):
            pass
    print(f"{len(keys)} objects")
    return 0


if __name__ == "__main__":
    sys.exit(main())
