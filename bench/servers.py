"""Real S3 API servers holding copies of the data sets: SeaweedFS, or moto for smoke runs.

nginx (bench.nginx) serves files with no signature check. SeaweedFS checks SigV4 on every
request and serves ranges from its own storage, so it shows what a real store costs; moto
reads a whole object on every ranged GET and is no throughput reference (--small only).
Both are the integration tier's own fixtures (tests/support), started here as the tests
start them. Each bucket gets a manifest whose ETags are the server's (multipart ETags for
big objects).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from support.service import Service

from bench.contenders import ACCESS_KEY_ID, SECRET_ACCESS_KEY, s3env
from bench.data import PREFIX, Prepared
from bench.harness import BenchError
from modelsync.core.manifest import MANIFEST_NAME, render_manifest


def start_server(kind: str, state: Path) -> Service:
    """A started `kind` server ("seaweedfs" or "moto") that knows the bench identity."""
    try:
        if kind == "seaweedfs":
            from support.seaweedfs import Identity, SeaweedFS, weed_binary

            weed_binary()
            bench = Identity("bench", ACCESS_KEY_ID, SECRET_ACCESS_KEY, Identity.admin().actions)
            return SeaweedFS(state, [bench]).start()
        from support.motoserver import SubprocessMoto

        state.mkdir(parents=True, exist_ok=True)
        return SubprocessMoto(log_dir=state).start()  # moto accepts any credentials
    except ImportError as exc:
        raise BenchError(f"the {kind} test fixture cannot be imported ({exc}); run scripts/setup") from None
    except (RuntimeError, TimeoutError) as exc:
        raise BenchError(f"{kind} did not start: {exc}") from None


class UploadedEndpoint:
    """A server of `kind` with every prepared data set uploaded, for the life of a `with` block."""

    def __init__(self, kind: str, prepared: list[Prepared], data_root: Path, state: Path) -> None:
        self.kind = kind
        self.prepared = prepared
        self.data_root = data_root
        self.state = state
        self.url = ""
        self._server: Service | None = None

    def __enter__(self) -> UploadedEndpoint:
        try:
            self._server = start_server(self.kind, self.state)
            self.url = self._server.endpoint_url
            self._upload()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _upload(self) -> None:
        client: Any = s3env(self.url).boto3_client(read_timeout_s=300)
        try:
            for prep in self.prepared:
                ds = prep.dataset
                print(f"uploading {ds.name} to {self.kind} ...", flush=True)
                client.create_bucket(Bucket=ds.bucket)
                for path, _ in ds.files:
                    client.upload_file(str(ds.model_dir(self.data_root) / path), ds.bucket,
                                       f"{PREFIX}/{path}")
                if not ds.manifest:
                    continue
                etags = {
                    o["Key"][len(PREFIX) + 1:]: o["ETag"].strip('"')
                    for page in client.get_paginator("list_objects_v2").paginate(
                        Bucket=ds.bucket, Prefix=f"{PREFIX}/")
                    for o in page.get("Contents", [])
                }
                manifest = render_manifest(
                    type(e)(e.path, e.size_bytes, e.xxh3_128, etags[e.path]) for e in prep.entries
                )
                client.put_object(Bucket=ds.bucket, Key=f"{PREFIX}/{MANIFEST_NAME}", Body=manifest)
        finally:
            client.close()

    def __exit__(self, *exc: object) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.stop()
