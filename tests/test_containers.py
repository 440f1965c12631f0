"""The container tier: the image built from the Dockerfile offline, and the rendered pods run by podman.

The image is built by scripts/image from a wheelhouse that scripts/wheelhouse filled
(`--network none`, no index: nothing unpinned can be fetched) on a stand-in for the
production base (tests/support/podman.py). Then one node, against a real S3 server on
the host (SeaweedFS with identities; the daemon holds the read-only one):

- the datacenter cluster's a100-serving DaemonSet, its pod template under `podman kube
  play` with its securityContext, ConfigMaps and Secret as rendered and the hostPath on
  a directory prepared as the README prepares a node (tests/support/pods.py says what
  differs from a cluster, and why). It stages the schedule's model for the pool as
  rendered (s3://models/Qwen/Qwen3-32B/2025-05-01/, a small stand-in of it in the
  store), is stopped in the middle of that pull and started again;
- the vLLM example's init container, which pulls through the daemon's socket with the
  cache read-only and no keys, then a consumer of another uid that reads every file;
- the operator Jobs, each pod template run against the same cache.

The site values are an operator's: the endpoint (the host, from the pods' bridge
network), the CA, a bandwidth cap and part size that make the first pull last a few
seconds, so that it can be stopped half-way, and the prefix the prefetch Job stages.

It runs whenever podman can run here (scripts/setup installs it as root); otherwise it
is skipped with the reason. Select it with `-m containers`.
"""

from __future__ import annotations

import base64
import copy
import dataclasses
import hashlib
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import certifi
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from support.kube import IMAGE, MANIFESTS, RUN_ON_POOL, by_name, cluster
from support.objects import upload
from support.podman import Podman, build_image, fill_wheelhouse, stand_in_base, unavailable_reason
from support.pods import CACHE_GROUP, Node
from support.safetensors import shard
from support.seaweedfs import Identity, SeaweedFS

from modelsync.adapters.cache import Cache
from modelsync.core.plan import start_jitter_s
from modelsync.core.refs import ModelRef, parse_source
from modelsync.core.schedule import load_schedule

pytestmark = [pytest.mark.containers, pytest.mark.xdist_group("containers"), pytest.mark.timeout(900)]

MiB = 1024 * 1024
POOL = "a100-serving"
#: under the allowed prefix the site sets: what the prefetch Job asks the daemon to stage
EXTRA = "s3://models/extra/tiny/r1/"
FILES = {
    "config.json": b'{"architectures": ["Qwen3ForCausalLM"]}',
    "model.safetensors.index.json": b'{"metadata": {}, "weight_map": {}}',
    **{f"model-0000{i}-of-00003.safetensors": shard(8 * MiB, f"layer{i}") for i in (1, 2, 3)},
}
EXTRA_FILES = {"model.safetensors": shard(MiB)}
SITE = {
    # Slow enough that the daemon is stopped in the middle of its pull: under CI's load
    # `podman stop` took 9.5 s after a quarter of the model to deliver SIGTERM (below).
    "MODELSYNC_MAX_BANDWIDTH": "1Mi",
    "MODELSYNC_PART_SIZE": "1Mi",
    "MODELSYNC_ALLOWED_PREFIXES": "s3://models/extra/",
}
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def scheduled() -> ModelRef:
    """The rendered schedule's model for the pool (windows: always)."""
    (configmap,) = [o for o in cluster("datacenter") if o["metadata"]["name"] == "modelsync-schedule"]
    (model,) = load_schedule(configmap["data"]["schedule.yaml"], "schedule.yaml").for_pool(POOL)
    return model.source


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def podman() -> Iterator[Podman]:
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    made = Podman()
    yield made
    left = made.cleanup()
    assert not left, f"the tier left these behind: {left}"


@pytest.fixture(scope="module")
def image(podman: Podman, tmp_path_factory: pytest.TempPathFactory) -> str:
    wheelhouse = tmp_path_factory.mktemp("wheelhouse")
    fill_wheelhouse(wheelhouse, "amd64")
    name, seconds = build_image(podman, "amd64", wheelhouse, stand_in_base(podman, "amd64"))
    size = podman.inspect(name)["Size"]
    print(f"\n{name}: built offline in {seconds:.0f} s, {size / 1e6:.0f} MB")
    return name


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SeaweedFS, Identity]]:
    """SeaweedFS on every address (the pods reach it from their bridge network), with the models.

    The admin publishes; the daemon gets the read-only identity, as on a node."""
    admin, reader = Identity.admin(), Identity.read_only()
    with SeaweedFS(tmp_path_factory.mktemp("seaweedfs"), [admin, reader], bind="0.0.0.0") as server:
        for ref, files in ((scheduled(), FILES), (parse_source(EXTRA), EXTRA_FILES)):
            upload(server.env(admin), ref.bucket, ref.prefix, files)
        yield server, reader


@pytest.fixture(scope="module")
def node(
    podman: Podman, image: str, store: tuple[SeaweedFS, Identity], tmp_path_factory: pytest.TempPathFactory
) -> Node:
    server, reader = store
    # podman names the host in every container's /etc/hosts: the gateway of the pod's network.
    site = {**SITE, "AWS_ENDPOINT_URL": f"http://host.containers.internal:{server.port}"}
    # The node's name sets the daemon's start jitter (up to 30 s, from the name and the model):
    # a node whose jitter is short, so the pull starts at once.
    model_id = scheduled().model_id
    name = min((f"gpu-a100-{i:02d}" for i in range(100)), key=lambda n: start_jitter_s(n, model_id, 30))
    assert start_jitter_s(name, model_id, 30) < 1
    node = Node(podman, tmp_path_factory.mktemp("node"), image, name, site)
    node.configmap("modelsync-ca")["data"]["ca.crt"] = Path(certifi.where()).read_text()
    node.create_secret(
        {"AWS_ACCESS_KEY_ID": reader.access_key_id, "AWS_SECRET_ACCESS_KEY": reader.secret_access_key}
    )
    return node


@dataclasses.dataclass
class DaemonRun:
    """The daemon pod, and what happened when it was stopped in the middle of its first pull."""

    pod: str
    container: str
    url: str
    grace_s: float
    fetched_before_stop: float
    stop_s: float
    stop_exit_code: int
    ready_after_stop: bool
    fetched_after_restart: float


def metrics(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with _DIRECT.open(url + "/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def fetched(url: str) -> float:
    try:
        return metrics(url).get(("modelsync_fetched_bytes_total", ()), 0.0)
    except (OSError, urllib.error.URLError):
        return 0.0


def staged_gauges(url: str) -> dict[str, float]:
    """model id -> the daemon's `modelsync_model_staged`; empty while its metrics do not answer."""
    try:
        samples = metrics(url)
    except (OSError, urllib.error.URLError):
        return {}
    return {dict(labels)["model"]: v for (name, labels), v in samples.items()
            if name == "modelsync_model_staged"}  # fmt: skip


def wait_until(
    condition: Callable[[], bool], what: str, timeout_s: float, podman: Podman, container: str
) -> None:
    """Poll `condition`; fail with the container's log when it ends or the time runs out."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        state = podman.inspect(container)["State"]
        assert state["Running"], f"{container} ended ({state['ExitCode']}) before {what}:\n" + podman(
            "logs", container, check=False).stderr[-3000:]
        assert time.monotonic() < deadline, f"no {what} within {timeout_s} s:\n" + podman(
            "logs", container, check=False).stderr[-3000:]
        time.sleep(0.2)


def pod_url(podman: Podman, container: str) -> str:
    """Where the kubelet probes the daemon: the pod's IP, the port named metrics."""
    (network,) = podman.inspect(container)["NetworkSettings"]["Networks"].values()
    return f"http://{network['IPAddress']}:9477"


@pytest.fixture(scope="module")
def daemon(podman: Podman, node: Node) -> DaemonRun:
    """The DaemonSet's pod: stopped while staging the schedule's model, started again, staged.

    The tests after the restart's own get a daemon pod played afresh on the staged cache: in two
    full-suite runs the restarted pod's connections to the store timed out while the prefetch
    Job ran (podman 4.3 tears down and remakes a restarted pod's network, see `Podman.settle`),
    and a node's daemon pod is a fresh one after a rollout too."""
    daemonset = node.workload("DaemonSet", f"modelsync-daemon-{POOL}")
    template = daemonset["spec"]["template"]
    pod = node.play("modelsync-daemon", template)
    container = f"{pod}-daemon"
    url = pod_url(podman, container)
    total = sum(len(data) for data in FILES.values())
    # A quarter, not half: the stop must land before the pull's end, and under load `podman stop`
    # took up to 9.5 s to deliver SIGTERM; the rest takes 18 s at the site's 1 MiB/s.
    wait_until(lambda: fetched(url) >= total / 4, "a quarter of the model", 90, podman, container)
    grace_s = float(template["spec"]["terminationGracePeriodSeconds"])
    fetched_before_stop = fetched(url)
    started = time.monotonic()
    podman("stop", "--time", str(int(grace_s)), container, timeout_s=grace_s + 30)
    stop_s = time.monotonic() - started
    at_stop = podman.inspect(container)["State"]["ExitCode"]
    ref = scheduled()
    ready_after_stop = Cache(node.cache).ready_record(ref) is not None
    assert not ready_after_stop, f"the pull ended before the stop landed (podman stop took {stop_s:.1f} s)"
    podman.settle(pod)
    podman("start", container)
    podman.pin_bridge_address()  # the bridge is made again when the pod was its last port
    url = pod_url(podman, container)  # a restarted container gets a new address from podman 4.3

    def staged() -> bool:
        return Cache(node.cache).ready_record(ref) is not None

    wait_until(staged, "the model staged", 120, podman, container)
    wait_until(lambda: fetched(url) > 0, "metrics of the restarted daemon", 30, podman, container)
    restarted = DaemonRun(pod, container, url, grace_s, fetched_before_stop, stop_s, at_stop,
                          ready_after_stop, fetched(url))
    node.remove(pod)
    pod = node.play("modelsync-daemon", template)
    container = f"{pod}-daemon"
    url = pod_url(podman, container)
    wait_until(lambda: staged_gauges(url).get(ref.model_id) == 1, "the fresh daemon's staged model", 60,
               podman, container)
    # A fresh daemon checks each staged model against its source once within its start jitter
    # (30 s), under the model's lock: a verify Job run meanwhile reports it busy, as it should.
    wait_until(lambda: "unchanged at its source" in podman("logs", container).stderr,
               "the fresh daemon's refresh check", 90, podman, container)
    return dataclasses.replace(restarted, pod=pod, container=container, url=url)


#: files podman bind-mounts into every container, over the image's
RUNTIME_MOUNTS = ("/etc/hosts", "/etc/hostname", "/etc/resolv.conf", "/run/.containerenv")


def written_to_root(podman: Podman, container: str) -> list[str]:
    """What changed in the container's root filesystem, besides the mount points the runtime made."""
    mounts = [m["Destination"] for m in podman.inspect(container)["Mounts"]] + list(RUNTIME_MOUNTS)
    changed = []
    for line in podman("diff", container).stdout.splitlines():
        kind, path = line.split(" ", 1)
        made_for_a_mount = path in mounts if kind == "A" else any(m.startswith(path + "/") for m in mounts)
        if not made_for_a_mount:
            changed.append(line)
    return changed


# --------------------------------------------------------------------------- the image


def test_the_image_built_offline_runs_modelsync_as_uid_10001_and_ships_no_pip(
    podman: Podman, image: str
) -> None:
    config = podman.inspect(image)["Config"]
    assert config["User"] == "10001:10001"
    assert config["Entrypoint"] == ["modelsync"]
    version = podman("run", "--rm", "--network", "none", image, "--version")
    assert version.stdout.strip() == "modelsync 0.1.0"
    for module in ("pip", "setuptools", "wheel"):
        script = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is not None)"
        found = podman("run", "--rm", "--network", "none", "--entrypoint", "python", image, "-c", script,
                       check=False)  # fmt: skip
        assert found.returncode == 0, f"{module} is in the image"


# --------------------------------------------------------------------------- the DaemonSet's pod


def test_a_stopped_daemon_ends_within_its_grace_and_a_restarted_one_resumes_the_pull(
    daemon: DaemonRun,
) -> None:
    total = sum(len(data) for data in FILES.values())
    assert daemon.stop_exit_code == 0, "it stopped on SIGTERM, not killed at the end of the grace"
    assert daemon.stop_s < daemon.grace_s
    assert not daemon.ready_after_stop, "the stop came in the middle of the pull"
    assert 0 < daemon.fetched_after_restart < total, "the restarted pull fetched only what was missing"
    print(f"\n{daemon.fetched_before_stop / MiB:.1f} MiB fetched, stopped in {daemon.stop_s:.1f} s (grace "
          f"{daemon.grace_s:.0f} s); restarted, it fetched {daemon.fetched_after_restart / MiB:.1f} of "
          f"{total / MiB:.0f} MiB")


def test_the_daemon_pod_answers_its_probes_and_its_metrics_show_the_staged_model(
    podman: Podman, node: Node, daemon: DaemonRun
) -> None:
    for path in ("/healthz", "/readyz"):
        with _DIRECT.open(daemon.url + path, timeout=5) as response:
            assert response.status == 200, path
    assert staged_gauges(daemon.url)[scheduled().model_id] == 1
    ready = Cache(node.cache).ready_path(scheduled())
    assert {p.name: p.read_bytes() for p in ready.iterdir()} == FILES


def test_the_daemon_runs_with_its_rendered_security_context_and_writes_nothing_outside_the_cache(
    podman: Podman, node: Node, daemon: DaemonRun
) -> None:
    found = podman.inspect(daemon.container)
    env = dict(v.split("=", 1) for v in found["Config"]["Env"])
    budget = node.configmap(f"modelsync-pool-{POOL}")["data"]["MODELSYNC_CACHE_MAX_BYTES"]
    assert env["MODELSYNC_POOL"] == POOL and env["MODELSYNC_CACHE_MAX_BYTES"] == budget
    assert env["AWS_ENDPOINT_URL"] == node.configmap("modelsync-site")["data"]["AWS_ENDPOINT_URL"]
    assert env["AWS_ACCESS_KEY_ID"] and env["AWS_SECRET_ACCESS_KEY"], "the Secret's keys"
    assert found["Config"]["User"] == "10001:10001"
    assert found["HostConfig"]["ReadonlyRootfs"] is True
    assert found["EffectiveCaps"] in (None, [])
    assert "no-new-privileges" in found["HostConfig"]["SecurityOpt"]
    assert written_to_root(podman, daemon.container) == []
    written = [p for p in node.cache.rglob("*") if not p.is_symlink()]
    assert written and all(p.stat().st_uid == 10001 and p.stat().st_gid == CACHE_GROUP for p in written)


# --------------------------------------------------------------------------- the tenant


#: what vLLM does with the ready path: read every file, parse every safetensors header
CONSUMER = r"""
import hashlib, json, os, struct, sys
root = sys.argv[1]
seen = {}
for name in sorted(os.listdir(root)):
    data = open(os.path.join(root, name), "rb").read()
    tensors = None
    if name.endswith(".safetensors"):
        (size,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8 : 8 + size])
        tensors = {k: v["data_offsets"] for k, v in header.items() if k != "__metadata__"}
        assert all(end <= len(data) - 8 - size for _, end in tensors.values()), name
    seen[name] = {"sha256": hashlib.sha256(data).hexdigest(), "tensors": tensors}
print(json.dumps({"uid": os.getuid(), "groups": os.getgroups() + [os.getgid()], "files": seen}))
"""


def test_the_vllm_examples_init_container_pulls_through_the_socket_and_another_uid_reads_every_file(
    podman: Podman, node: Node, daemon: DaemonRun
) -> None:
    (example,) = [d for d in yaml.safe_load_all((MANIFESTS / "examples/vllm-with-init.yaml").read_text())
                  if d and d["kind"] == "Deployment"]
    template = example["spec"]["template"]
    spec = template["spec"]
    stage = by_name(spec["initContainers"])["stage-weights"]
    assert stage["image"] == IMAGE and not [v for v in stage.get("env", []) if v["name"].startswith("AWS_")]
    vllm = by_name(spec["containers"])["vllm"]
    served = vllm["args"][0]  # the init container's link to the pool's variant of the model
    ready_path = "/model-cache/" + scheduled().model_id
    mounts = ("model-cache", "model-link")
    # vLLM's place: the modelsync image's Python, with vLLM's uid, mounts and securityContext.
    # The script travels base64-encoded: podman 4.3's YAML reader fails on a multi-line command.
    run_consumer = f"import base64; exec(base64.b64decode({base64.b64encode(CONSUMER.encode()).decode()!r}))"
    consumer = {
        "name": "consumer", "image": IMAGE, "command": ["python", "-c", run_consumer], "args": [served],
        "securityContext": vllm["securityContext"],
        "volumeMounts": [m for m in vllm["volumeMounts"] if m["name"] in mounts],
    }
    # One pod run to completion (a Deployment's restarts would repeat it); the keep-lease
    # sidecar is left out: podman 4.3 has no native sidecars, it would block the init phase.
    pod = node.play("vllm-qwen3-32b", template, initContainers=[stage], containers=[consumer],
                    restartPolicy="Never", volumes=[v for v in spec["volumes"] if v["name"] in mounts])
    code = podman.exit_code(f"{pod}-consumer")
    logs = podman("logs", f"{pod}-consumer")
    assert code == 0, logs.stderr
    init = podman.inspect(f"{pod}-stage-weights")
    assert init["State"]["ExitCode"] == 0
    assert not [v for v in init["Config"]["Env"] if v.startswith("AWS_")], "the init container holds no keys"
    assert podman("logs", f"{pod}-stage-weights").stdout.strip() == ready_path
    seen = json.loads(logs.stdout)
    assert seen["uid"] == 10002 and CACHE_GROUP in seen["groups"]
    assert {n: f["sha256"] for n, f in seen["files"].items()} == {
        n: hashlib.sha256(d).hexdigest() for n, d in FILES.items()}
    assert all(f["tensors"] for n, f in seen["files"].items() if n.endswith(".safetensors"))


# --------------------------------------------------------------------------- the Jobs


@pytest.mark.parametrize("kind", ["ls", "prefetch", "evict", "verify"])
def test_the_rendered_job_runs_its_pod_template_against_the_nodes_cache(
    podman: Podman, node: Node, daemon: DaemonRun, kind: str
) -> None:
    job = yaml.safe_load(RUN_ON_POOL.render_job(kind, node.name, POOL, IMAGE, EXTRA))
    template = copy.deepcopy(job["spec"]["template"])
    pod = node.play(f"modelsync-{kind}", template)
    (container,) = [f"{pod}-{c['name']}" for c in template["spec"]["containers"]]
    code = podman.exit_code(container)
    logs = podman("logs", container)
    assert code == 0, logs.stdout + logs.stderr
    assert written_to_root(podman, container) == []
    staged = scheduled().model_id
    if kind == "ls":
        assert staged in logs.stdout
    if kind == "prefetch":
        assert logs.stdout.strip().splitlines()[-1] == "/model-cache/" + parse_source(EXTRA).model_id
        assert Cache(node.cache).ready_record(parse_source(EXTRA)) is not None
    if kind == "evict":
        assert Cache(node.cache).ready_record(scheduled()) is not None
    if kind == "verify":
        assert f"ok    {staged}" in logs.stdout
