"""The operator Jobs and the daemon, run as rendered: each container's command, environment and mounts,
taken from the YAML the cluster would receive, executed against a moto server.

A small kubelet stand-in turns a rendered container into a process: hostPath and
emptyDir volumes become directories under the test's node root, ConfigMap
volumes are written out from the rendered cluster's ConfigMaps, env and envFrom
resolve against those ConfigMaps and a Secret holding the test keys, and mount
paths in arguments and values map to those directories. The site values an
operator sets in the cluster folder are set the same way: the endpoint (the
moto server) and the CA file. Nothing else of the YAML is changed, except that
the daemon listens on a free loopback port (tests never bind other addresses).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import certifi
import pytest
import yaml
from support.kube import by_name, cluster, pod_spec, rendered_job
from support.objects import payload, upload
from support.s3env import S3Env
from support.safetensors import shard

from modelsync.errors import ExitCode

Obj = dict[str, Any]
POOL = "b300-serving"
NODE = "gpu-b300-07"
MiB = 1024 * 1024


class Node:
    """One node's view of the rendered cluster: its root directory, the ConfigMaps, the Secret."""

    def __init__(self, root: Path, env: S3Env) -> None:
        self.root = root
        self.objects = cluster("datacenter")
        self.configmaps = {
            o["metadata"]["name"]: dict(o["data"]) for o in self.objects if o["kind"] == "ConfigMap"
        }
        self.configmaps["modelsync-site"]["AWS_ENDPOINT_URL"] = env.endpoint_url
        self.secrets = {
            "modelsync-s3-credentials": {
                "AWS_ACCESS_KEY_ID": env.access_key_id,
                "AWS_SECRET_ACCESS_KEY": env.secret_access_key,
            }
        }

    def fill_in_the_ca(self) -> None:
        """What the operator does in manifests/clusters/<cluster>/ca.crt."""
        self.configmaps["modelsync-ca"]["ca.crt"] = Path(certifi.where()).read_text()

    @property
    def cache(self) -> Path:
        return self.root / "model-cache"

    def process(self, spec: Obj, container: Obj) -> tuple[list[str], dict[str, str]]:
        """The argv and environment the kubelet would give `container`, on this node."""
        mounts = self._mount(spec, container)
        env = {"PATH": os.environ["PATH"], "HOME": str(self.root / "home"), "LANG": "C.UTF-8",
               "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}
        for source in container.get("envFrom", []):
            env.update(self.configmaps[source["configMapRef"]["name"]])
        for var in container.get("env", []):
            value = self._value(var)
            if value is not None:
                env[var["name"]] = value
        assert "command" not in container, "the image's entrypoint, modelsync, runs the args"
        # Loopback and a free port: tests bind nothing else, and run side by side.
        args = [re.sub(r"^0\.0\.0\.0:\d+$", "127.0.0.1:0", a) for a in container["args"]]
        argv = [sys.executable, "-m", "modelsync", *(self._local(a, mounts) for a in args)]
        return argv, {k: self._local(v, mounts) for k, v in env.items()}

    def run(self, job: Obj) -> subprocess.CompletedProcess[str]:
        spec = pod_spec(job)
        (container,) = spec["containers"]
        argv, env = self.process(spec, container)
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)

    def _value(self, var: Obj) -> str | None:
        if "value" in var:
            return str(var["value"])
        ref = var["valueFrom"]
        if "fieldRef" in ref:
            assert ref["fieldRef"]["fieldPath"] == "spec.nodeName"
            return NODE
        kind, store = ("configMapKeyRef", self.configmaps) if "configMapKeyRef" in ref else (
            "secretKeyRef", self.secrets)
        key = ref[kind]
        value = store.get(key["name"], {}).get(key["key"])
        assert value is not None or key.get("optional"), f"{var['name']}: {key} does not resolve"
        return value

    def _mount(self, spec: Obj, container: Obj) -> dict[str, Path]:
        volumes = by_name(spec["volumes"])
        mounts = {}
        for mount in container["volumeMounts"]:
            volume = volumes[mount["name"]]
            if "hostPath" in volume:
                local = self.root / volume["hostPath"]["path"].lstrip("/")
                assert local.is_dir(), "type: Directory: node preparation creates it"
            elif "configMap" in volume:
                local = self.root / "configmaps" / container["name"] / mount["name"]
                local.mkdir(parents=True, exist_ok=True)
                for key, text in self.configmaps[volume["configMap"]["name"]].items():
                    (local / key).write_text(text)
            else:
                local = self.root / "emptydir" / container["name"] / mount["name"]
                local.mkdir(parents=True, exist_ok=True)
            mounts[mount["mountPath"]] = local
        return mounts

    @staticmethod
    def _local(text: str, mounts: dict[str, Path]) -> str:
        for path in sorted(mounts, key=len, reverse=True):
            if text == path or text.startswith(path + "/"):
                return str(mounts[path]) + text[len(path) :]
        return text


def job(kind: str, model: str = "deepseek-v3") -> Obj:
    return rendered_job(kind, POOL, NODE, model)


@pytest.fixture
def node(tmp_path: Path, moto_subprocess_s3_env: S3Env) -> Node:
    """A prepared node (its /model-cache exists) and the schedule's deepseek-v3 in the store, small."""
    schedule = yaml.safe_load(_schedule_text())
    (deepseek,) = [m for m in schedule["models"] if m["name"] == "deepseek-v3"]
    bucket, _, prefix = deepseek["source"].removeprefix("s3://").partition("/")
    upload(moto_subprocess_s3_env, bucket, prefix, {
        "model-00001-of-00002.safetensors": SHARDS[0],
        "model-00002-of-00002.safetensors": SHARDS[1],
        "config.json": b'{"architectures": ["DeepseekV3ForCausalLM"]}',
    })
    upload(moto_subprocess_s3_env, bucket, "unlisted/model/r1/", {"w.bin": payload(MiB, 3)})
    node = Node(tmp_path / "node", moto_subprocess_s3_env)
    node.cache.mkdir(parents=True)
    (node.root / "home").mkdir()
    return node


def _schedule_text() -> str:
    (obj,) = [o for o in cluster("datacenter") if o["metadata"]["name"] == "modelsync-schedule"]
    text: str = obj["data"]["schedule.yaml"]
    return text


STAGED = "models/deepseek-ai/DeepSeek-V3/2025-03-24"
#: valid shards (random tensor bytes): every pull scrubs safetensors headers
SHARDS = (shard(3 * MiB), shard(MiB))


def test_the_jobs_run_as_rendered_prefetch_ls_verify_evict(node: Node) -> None:
    placeholder = node.run(job("prefetch"))
    assert placeholder.returncode == ExitCode.USAGE
    assert re.fullmatch(r"error: .*AWS_CA_BUNDLE.*holds no PEM certificate.*\n", placeholder.stderr)

    node.fill_in_the_ca()
    prefetched = node.run(job("prefetch"))
    assert prefetched.returncode == 0, prefetched.stderr
    assert prefetched.stdout.strip().splitlines()[-1] == str(node.cache / STAGED)
    assert (node.cache / STAGED / "model-00002-of-00002.safetensors").read_bytes() == SHARDS[1]

    listed = node.run(job("ls"))
    assert listed.returncode == 0, listed.stderr
    assert STAGED in listed.stdout
    assert "budget" in listed.stdout.splitlines()[-1], "the pool's budget reaches the Job"

    verified = node.run(job("verify"))
    assert verified.returncode == 0, verified.stderr
    assert f"ok    {STAGED}" in verified.stdout

    evicted = node.run(job("evict"))
    assert evicted.returncode == 0, evicted.stderr
    assert (node.cache / STAGED).is_dir(), "a dry run touches nothing"


def test_the_prefetch_job_asks_the_daemon_run_from_the_rendered_daemonset(node: Node) -> None:
    node.fill_in_the_ca()
    (daemonset,) = [o for o in node.objects if o["metadata"]["name"] == f"modelsync-daemon-{POOL}"]
    spec = pod_spec(daemonset)
    argv, env = node.process(spec, by_name(spec["containers"])["daemon"])
    log = node.root / "daemon.log"
    with log.open("wb") as out:
        daemon = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        for _ in _until(lambda: (node.cache / ".modelsync/daemon.sock").exists()):
            assert daemon.poll() is None, log.read_text()
        prefetched = node.run(job("prefetch"))
        assert prefetched.returncode == 0, prefetched.stderr + log.read_text()
        assert prefetched.stdout.strip() == str(node.cache / STAGED)
        assert f"serving the local API on {node.cache}" in log.read_text()

        refused = node.run(job("prefetch", model="s3://models/unlisted/model/r1/"))
        assert refused.returncode == ExitCode.NOT_ALLOWED, refused.stderr
        # A prefetch done here would have pulled it: the daemon answered, and refused.
        assert refused.stderr.startswith("error: ") and len(refused.stderr.splitlines()) == 1
        assert not (node.cache / "models/unlisted").exists()
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)
    assert daemon.returncode == 0, log.read_text()


def _until(condition: Any, timeout_s: float = 30) -> Iterator[None]:
    """Yield (so the caller can check its process) until `condition()` holds."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        yield
        time.sleep(0.1)


# ---- values reach the YAML as quoted scalars, never pasted -------------------------------

RUN_ON_POOL = Path(__file__).resolve().parents[1] / "jobs" / "run_on_pool.py"
#: values that, pasted, would start a comment, a mapping, a flow collection, an anchor or a
#: tag, read as another type, or end the string early
HOSTILE_MODELS = [
    "s3://models/org/a #1/",
    "s3://models/org/a: b/",
    "s3://models/org/{x}/[y]/",
    's3://models/org/"quoted" and \'single\'/',
    "&anchor *alias !!python/object:os.system",
    "null",
    "0x10",
    "s3://models/org/back\\slash/é/",
]


def dry_run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(RUN_ON_POOL), "--dry-run", *args],
        capture_output=True, text=True, timeout=60, check=False,
    )


@pytest.mark.parametrize("model", HOSTILE_MODELS)
def test_the_runner_renders_a_hostile_model_and_image_as_one_string_each(model: str) -> None:
    image = "registry.example/modelsync:1 # not a comment"
    done = dry_run("--pool", POOL, "--nodes", "n1,n2", "--image", image, "prefetch", "--model", model)
    assert done.returncode == 0, done.stderr
    jobs = [doc for doc in yaml.safe_load_all(done.stdout) if doc]
    assert [j["metadata"]["name"] for j in jobs] == ["modelsync-prefetch-n1", "modelsync-prefetch-n2"]
    for job, node in zip(jobs, ("n1", "n2"), strict=True):
        (container,) = pod_spec(job)["containers"]
        assert container["args"] == ["prefetch", "--schedule", "/etc/modelsync/schedule.yaml", model]
        assert container["image"] == image
        terms = pod_spec(job)["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert terms["nodeSelectorTerms"][0]["matchFields"][0]["values"] == [node]


def test_a_newline_in_a_value_never_becomes_another_container_argument() -> None:
    """Rendered directly (the runner refuses such a value before it gets here)."""
    from support.kube import RUN_ON_POOL as runner

    injected = "deepseek-v3\n            - --cache-dir\n            - /tmp/elsewhere"
    image = "img:1\nimagePullPolicy: Always"
    job = yaml.safe_load(runner.render_job("prefetch", "n1", POOL, image, injected))
    (container,) = pod_spec(job)["containers"]
    assert container["args"][-1] == injected and len(container["args"]) == 4
    assert container["image"] == image
    assert container["imagePullPolicy"] == "IfNotPresent"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--nodes", "n1,,n2", "ls"), "an empty node name"),
        (("--nodes", "", "ls"), "an empty node name"),
        (("--nodes", "n1: x", "ls"), "is not a Kubernetes node name"),
        (("--pool", "b300 serving", "--nodes", "n1", "ls"), "not an accelerator.pool label value"),
        (("--nodes", "n1", "prefetch", "--model", "deepseek-v3\n- --cache-dir"), "control character"),
        (("--nodes", "n1", "prefetch", "--model=--cache-dir=/tmp/x"), "starts with '-'"),
        (("--nodes", "n1", "prefetch"), "needs --model"),
        (("--nodes", "n1", "--timeout", "0", "ls"), "--timeout: '0' is not a positive"),
        (("--nodes", "n1", "--timeout", "inf", "ls"), "--timeout: 'inf' is not a positive, finite"),
        (("--nodes", "n1", "--poll-interval", "-1", "ls"), "--poll-interval"),
        (("--nodes", "n1", "--poll-interval", "nan", "ls"), "--poll-interval"),
        (("--nodes", "n1", "--out", "/dev/null", "ls"), "exists and is not a directory"),
    ],
)
def test_the_runner_refuses_a_bad_argument_with_one_line_and_exit_2(args: tuple[str, ...], says: str) -> None:
    argv = args if "--pool" in args else ("--pool", POOL, *args)
    done = dry_run(*argv)
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert line.startswith("error: ") and says in line
