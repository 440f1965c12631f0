"""The Kubernetes side: manifests/ (kustomize base, per-pool overlays, example) and jobs/.

Three layers, each independent of the others:

* Source checks (always run, PyYAML only): every YAML file parses; the base
  DaemonSet, the schedule ConfigMap, each overlay's patch, each Job template,
  the vLLM example and the Dockerfile state the facts the design relies on.
  The example schedule is checked against the JSON Schema the package ships.
* Rendered checks: each overlay is rendered and the result checked as the
  cluster would receive it. With a kustomize binary (`kustomize`, or the one
  built into `kubectl`) the real tool renders; without one, a small renderer
  below applies the base kustomization and the overlays' strategic-merge
  patches as they are written. A further test, run only when the real tool
  exists, checks that both renderings agree, which keeps the small one honest.
* Schema checks (run when the `kubernetes_validate` package is installed):
  every rendered object, Job and the example validate strictly against the
  Kubernetes OpenAPI schemas, offline.
"""

from __future__ import annotations

import copy
import functools
import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
MANIFESTS = ROOT / "manifests"
BASE = MANIFESTS / "base"
OVERLAYS = MANIFESTS / "overlays"
EXAMPLE = MANIFESTS / "examples" / "vllm-with-init.yaml"
JOBS = ROOT / "jobs"
DOCKERFILE = ROOT / "Dockerfile"

POOLS = ("spark-serving", "a100-serving", "b300-serving")
NAMESPACE = "modelsync"
PORT = 9477
CACHE = "/model-cache"
UID = 10001
GID = 10001
SECRET = "modelsync-s3-credentials"
JOB_FILES = ("prefetch-job.yaml", "evict-job.yaml", "verify-job.yaml", "ls-job.yaml")
CLUSTER_SCOPED = {"Namespace", "PriorityClass"}

Obj = dict[str, Any]


# --------------------------------------------------------------------------- helpers


def load_all(path: Path) -> list[Obj]:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    assert all(isinstance(d, dict) for d in docs), f"{path}: every document must be a mapping"
    return docs


def load_one(path: Path) -> Obj:
    docs = load_all(path)
    assert len(docs) == 1, f"{path}: expected one document, found {len(docs)}"
    return docs[0]


def yaml_files() -> list[Path]:
    return sorted([*MANIFESTS.rglob("*.yaml"), *JOBS.rglob("*.yaml")])


def by_name(items: list[Obj] | None) -> dict[str, Obj]:
    return {item["name"]: item for item in items or []}


def env_of(container: Obj) -> dict[str, Obj]:
    return by_name(container.get("env"))


def one(objs: list[Obj], kind: str) -> Obj:
    found = [o for o in objs if o["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def pod_spec(workload: Obj) -> Obj:
    spec: Obj = workload["spec"]["template"]["spec"]
    return spec


def daemon_container(ds: Obj) -> Obj:
    return by_name(pod_spec(ds)["containers"])["daemon"]


def quantity(value: str | int) -> float:
    """A Kubernetes quantity as a number (cores or bytes)."""
    text = str(value)
    suffixes = {
        "m": 1e-3,
        "Ki": 2**10,
        "Mi": 2**20,
        "Gi": 2**30,
        "Ti": 2**40,
        "k": 1e3,
        "M": 1e6,
        "G": 1e9,
        "T": 1e12,
    }
    for suffix, factor in sorted(suffixes.items(), key=lambda kv: -len(kv[0])):
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * factor
    return float(text)


def port_number(container: Obj, port: int | str) -> int:
    if isinstance(port, int):
        return port
    return int(by_name(container["ports"])[port]["containerPort"])


def mounts_of(spec: Obj, container: Obj) -> dict[str, tuple[Obj, Obj]]:
    """mountPath -> (volumeMount, volume)."""
    volumes = by_name(spec.get("volumes"))
    return {m["mountPath"]: (m, volumes[m["name"]]) for m in container.get("volumeMounts", [])}


def base_image() -> str:
    images = load_one(BASE / "kustomization.yaml")["images"]
    (entry,) = [i for i in images if i["name"] == "modelsync"]
    return f"{entry['newName']}:{entry['newTag']}"


def comment_free(path: Path) -> str:
    return "\n".join(line.split("#", 1)[0] for line in path.read_text().splitlines())


# --------------------------------------------------------------------------- rendering


def kustomize_command() -> list[str] | None:
    if shutil.which("kustomize"):
        return ["kustomize", "build"]
    if shutil.which("kubectl"):
        return ["kubectl", "kustomize"]
    return None


@functools.cache
def render_with_tool(directory: str) -> tuple[Obj, ...]:
    command = kustomize_command()
    assert command is not None
    done = subprocess.run(
        [*command, directory], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, f"{' '.join(command)} {directory} failed:\n{done.stderr}"
    return tuple(d for d in yaml.safe_load_all(done.stdout) if d is not None)


def strategic_merge(target: Any, patch: Any) -> Any:
    """The part of a strategic merge patch these manifests use: maps merge
    key by key; lists of maps that all have a name merge by name (containers,
    env, volumes, ...); any other value is replaced."""
    if isinstance(target, dict) and isinstance(patch, dict):
        merged = dict(target)
        for key, value in patch.items():
            merged[key] = strategic_merge(target[key], value) if key in target else value
        return merged
    if (
        isinstance(target, list)
        and isinstance(patch, list)
        and all(isinstance(i, dict) and "name" in i for i in [*target, *patch])
    ):
        result = [copy.deepcopy(i) for i in target]
        index = {item["name"]: n for n, item in enumerate(result)}
        for item in patch:
            if item["name"] in index:
                result[index[item["name"]]] = strategic_merge(result[index[item["name"]]], item)
            else:
                result.append(copy.deepcopy(item))
        return result
    return copy.deepcopy(patch)


def apply_kustomization(directory: Path) -> list[Obj]:
    kustomization = load_one(directory / "kustomization.yaml")
    objs: list[Obj] = []
    for resource in kustomization.get("resources", []):
        path = (directory / resource).resolve()
        objs.extend(apply_kustomization(path) if path.is_dir() else load_all(path))
    for entry in kustomization.get("labels", []):
        for obj in objs:
            obj.setdefault("metadata", {}).setdefault("labels", {}).update(entry["pairs"])
    if "namespace" in kustomization:
        for obj in objs:
            if obj["kind"] not in CLUSTER_SCOPED:
                obj["metadata"]["namespace"] = kustomization["namespace"]
    for image in kustomization.get("images", []):
        for obj in objs:
            if obj["kind"] in {"DaemonSet", "Deployment", "Job"}:
                spec = pod_spec(obj)
                for c in [*spec.get("initContainers", []), *spec["containers"]]:
                    if c["image"] == image["name"]:
                        c["image"] = f"{image['newName']}:{image['newTag']}"
    for entry in kustomization.get("patches", []):
        patch = (
            yaml.safe_load(entry["patch"])
            if "patch" in entry
            else load_one(directory / entry["path"])
        )
        target = entry.get("target", {})
        kind = target.get("kind", patch["kind"])
        name = target.get("name", patch["metadata"]["name"])
        matches = [
            n for n, o in enumerate(objs) if o["kind"] == kind and o["metadata"]["name"] == name
        ]
        assert len(matches) == 1, f"{directory}: patch target {kind}/{name} not found once"
        if not entry.get("options", {}).get("allowNameChange"):
            patch.setdefault("metadata", {})["name"] = name
        objs[matches[0]] = strategic_merge(objs[matches[0]], patch)
    return objs


def render(directory: Path) -> list[Obj]:
    """Render with the real tool when there is one, else with the small renderer."""
    if kustomize_command() is not None:
        return copy.deepcopy(list(render_with_tool(str(directory))))
    return apply_kustomization(directory)


needs_kustomize = pytest.mark.skipif(
    kustomize_command() is None, reason="no kustomize binary (kustomize or kubectl) on PATH"
)


# --------------------------------------------------------------------------- source checks


@pytest.mark.parametrize("path", yaml_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_yaml_file_parses_into_kubernetes_objects(path: Path) -> None:
    for doc in load_all(path):
        assert isinstance(doc.get("apiVersion"), str) and isinstance(doc.get("kind"), str)


def test_expected_files_exist() -> None:
    for pool in POOLS:
        assert (OVERLAYS / pool / "kustomization.yaml").is_file()
    for name in JOB_FILES:
        assert (JOBS / name).is_file()
    for path in (EXAMPLE, JOBS / "README.md", DOCKERFILE, ROOT / ".dockerignore"):
        assert path.is_file(), path


def test_base_lists_every_file_in_its_folder() -> None:
    listed = set(load_one(BASE / "kustomization.yaml")["resources"])
    on_disk = {p.name for p in BASE.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == on_disk


def test_base_daemonset_runs_the_daemon_as_designed() -> None:
    ds = load_one(BASE / "daemonset.yaml")
    spec = pod_spec(ds)
    container = daemon_container(ds)
    assert container["args"] == [
        "daemon",
        "--schedule",
        "/etc/modelsync/schedule.yaml",
        "--listen",
        f"0.0.0.0:{PORT}",
    ]
    assert spec["terminationGracePeriodSeconds"] == 30
    assert spec["serviceAccountName"] == "modelsync"
    assert spec["priorityClassName"] == load_one(BASE / "priorityclass.yaml")["metadata"]["name"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec[
        "tolerations"
    ]
    annotations = ds["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(PORT)
    assert annotations["prometheus.io/path"] == "/metrics"


def test_base_daemonset_mounts_the_schedule_as_a_directory_so_updates_arrive() -> None:
    ds = load_one(BASE / "daemonset.yaml")
    container = daemon_container(ds)
    mounts = mounts_of(pod_spec(ds), container)
    mount, volume = mounts["/etc/modelsync"]
    assert "subPath" not in mount, "a subPath mount never sees ConfigMap updates"
    assert volume["configMap"]["name"] == "modelsync-schedule"
    schedule_arg = container["args"][container["args"].index("--schedule") + 1]
    assert Path(schedule_arg).parent == Path("/etc/modelsync")
    key = Path(schedule_arg).name
    assert key in load_one(BASE / "configmap-schedule.yaml")["data"]


def test_base_daemonset_environment() -> None:
    ds = load_one(BASE / "daemonset.yaml")
    container = daemon_container(ds)
    env = env_of(container)
    for name in (
        "MODELSYNC_POOL",
        "MODELSYNC_CACHE_DIR",
        "MODELSYNC_CACHE_MAX_BYTES",
        "AWS_ENDPOINT_URL",
        "AWS_REGION",
        "AWS_CA_BUNDLE",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
    ):
        assert name in env, name
    assert env["MODELSYNC_CACHE_DIR"]["value"] == CACHE
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        assert env[name]["valueFrom"]["secretKeyRef"] == {"name": SECRET, "key": name}
    s3 = load_one(BASE / "configmap-s3.yaml")
    for name in ("AWS_ENDPOINT_URL", "AWS_REGION"):
        ref = env[name]["valueFrom"]["configMapKeyRef"]
        assert ref["name"] == s3["metadata"]["name"] and ref["key"] in s3["data"]
    # The CA bundle path is a key of the CA ConfigMap, mounted where the env says.
    bundle = Path(env["AWS_CA_BUNDLE"]["value"])
    _, volume = mounts_of(pod_spec(ds), container)[str(bundle.parent)]
    ca = load_one(BASE / "configmap-ca.yaml")
    assert volume["configMap"]["name"] == ca["metadata"]["name"]
    assert bundle.name in ca["data"]


def test_schedule_configmap_holds_a_schedule_for_the_known_pools() -> None:
    data = load_one(BASE / "configmap-schedule.yaml")["data"]
    schedule = yaml.safe_load(data["schedule.yaml"])
    assert schedule["version"] == 1
    assert schedule["timezone"] == "Asia/Seoul"
    assert set(schedule["defaults"]) == {"lead", "keep", "priority"}
    names = [m["name"] for m in schedule["models"]]
    assert len(names) == len(set(names))
    for model in schedule["models"]:
        assert re.fullmatch(r"s3://[a-z0-9.-]+/.+/", model["source"]), model["source"]
        assert set(model["pools"]) <= set(POOLS)
        assert model["windows"]


def test_schedule_configmap_matches_the_shipped_schedule_schema() -> None:
    schema_file = ROOT / "modelsync" / "schema" / "schedule.schema.json"
    if not schema_file.is_file():
        pytest.skip("the package ships no schedule schema yet")
    schema = json.loads(schema_file.read_text())
    validator = jsonschema.validators.validator_for(schema)
    validator.check_schema(schema)
    text = load_one(BASE / "configmap-schedule.yaml")["data"]["schedule.yaml"]
    errors = [e.message for e in validator(schema).iter_errors(yaml.safe_load(text))]
    assert not errors


@pytest.mark.parametrize("pool", POOLS)
def test_overlay_is_a_patch_of_the_base_not_a_copy(pool: str) -> None:
    directory = OVERLAYS / pool
    assert [p.name for p in directory.iterdir()] == ["kustomization.yaml"]
    kustomization = load_one(directory / "kustomization.yaml")
    assert kustomization["resources"] == ["../../base"]
    (entry,) = kustomization["patches"]
    assert entry["target"] == {"kind": "DaemonSet", "name": "modelsync-daemon"}
    patch = yaml.safe_load(entry["patch"])
    assert patch["kind"] == "DaemonSet"
    spec = patch["spec"]["template"]["spec"]
    assert spec["nodeSelector"]["accelerator.pool"] == pool
    container = by_name(spec["containers"])["daemon"]
    assert env_of(container)["MODELSYNC_POOL"]["value"] == pool
    assert "MODELSYNC_CACHE_MAX_BYTES" in env_of(container)
    assert "resources" in container


def job(name: str) -> Obj:
    return load_one(JOBS / name)


@pytest.mark.parametrize("name", JOB_FILES)
def test_job_template_basics(name: str) -> None:
    obj = job(name)
    assert obj["kind"] == "Job"
    assert obj["metadata"]["namespace"] == NAMESPACE
    assert "NODE_NAME" in obj["metadata"]["name"]
    assert obj["spec"]["backoffLimit"] == 0
    assert obj["spec"]["ttlSecondsAfterFinished"] > 0
    assert obj["spec"]["activeDeadlineSeconds"] > 0
    spec = pod_spec(obj)
    assert spec["nodeName"] == "NODE_NAME"
    assert spec["restartPolicy"] == "Never"
    (container,) = spec["containers"]
    assert container["image"] == base_image()
    assert container["resources"]["limits"]["memory"]
    mount, volume = mounts_of(spec, container)[CACHE]
    assert volume["hostPath"]["path"] == CACHE
    assert not mount.get("readOnly", False)
    # Jobs must not look like daemon pods to the metrics Service.
    assert obj["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"] != (
        "daemon"
    )


@pytest.mark.parametrize("name", JOB_FILES)
def test_job_runs_with_the_daemons_security_context(name: str) -> None:
    ds = load_one(BASE / "daemonset.yaml")
    daemon_pod = pod_spec(ds)["securityContext"]
    daemon_ctr = daemon_container(ds)["securityContext"]
    spec = pod_spec(job(name))
    pod = spec["securityContext"]
    for key in ("runAsNonRoot", "runAsUser", "runAsGroup", "fsGroup", "seccompProfile"):
        assert pod[key] == daemon_pod[key], key
    assert spec["containers"][0]["securityContext"] == daemon_ctr


def test_job_commands() -> None:
    def args(name: str) -> list[str]:
        result: list[str] = pod_spec(job(name))["containers"][0]["args"]
        return result

    assert args("ls-job.yaml")[0] == "ls"
    assert args("prefetch-job.yaml") == ["prefetch", "MODEL_TO_STAGE"]
    assert args("evict-job.yaml") == ["evict", "--unused-for", "7d", "--dry-run"]
    assert args("verify-job.yaml") == ["verify", "--full"]


@pytest.mark.parametrize("name", JOB_FILES)
def test_job_with_placeholders_filled_in_is_valid(name: str) -> None:
    text = (JOBS / name).read_text()
    filled = text.replace("NODE_NAME", "gpu-b300-07").replace(
        "MODEL_TO_STAGE", "s3://models/Qwen/Qwen3-32B/2025-05-01/"
    )
    obj = yaml.safe_load(filled)
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", obj["metadata"]["name"])
    assert len(obj["metadata"]["name"]) <= 63
    assert pod_spec(obj)["nodeName"] == "gpu-b300-07"
    leftover = re.findall(
        r"\b[A-Z][A-Z0-9]*_[A-Z0-9_]+\b",
        comment_free(JOBS / name).replace("NODE_NAME", "").replace("MODEL_TO_STAGE", ""),
    )
    # Capitalised words left are env var names, never unfilled placeholders.
    env_names = set(env_of(pod_spec(obj)["containers"][0]))
    assert set(leftover) <= env_names


def test_jobs_readme_covers_every_template() -> None:
    text = (JOBS / "README.md").read_text()
    for name in JOB_FILES:
        assert name in text
    for phrase in ("NODE_NAME", "MODEL_TO_STAGE", "--dry-run", "daemon.sock"):
        assert phrase in text


def test_vllm_example_reads_the_path_the_init_container_pulls() -> None:
    deployment = load_one(EXAMPLE)
    spec = pod_spec(deployment)
    (init,) = spec["initContainers"]
    assert init["image"] == base_image()
    assert init["args"][0] == "pull"
    source = init["args"][1]
    assert source == "s3://models/Qwen/Qwen3-32B/2025-05-01/"
    ready_path = f"{CACHE}/{source.removeprefix('s3://').rstrip('/')}"
    vllm = by_name(spec["containers"])["vllm"]
    assert ready_path in vllm["args"]
    init_mount, init_volume = mounts_of(spec, init)[CACHE]
    vllm_mount, vllm_volume = mounts_of(spec, vllm)[CACHE]
    assert init_volume["hostPath"]["path"] == vllm_volume["hostPath"]["path"] == CACHE
    assert not init_mount.get("readOnly", False)
    assert vllm_mount["readOnly"] is True
    pod = spec["securityContext"]
    assert pod["runAsGroup"] == GID and GID in pod["supplementalGroups"]


def test_dockerfile() -> None:
    lines = [
        line.strip()
        for line in DOCKERFILE.read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    assert lines[0] == "FROM python:3.11-slim"
    assert 'ENTRYPOINT ["modelsync"]' in lines
    users = [line.split()[1] for line in lines if line.startswith("USER ")]
    assert users and users[-1] == f"{UID}:{GID}"
    assert any(re.search(r"\bpip install\b.* \.(\s|$)", line) for line in lines)
    assert f"EXPOSE {PORT}" in lines


# --------------------------------------------------------------------------- rendered checks


@pytest.fixture(scope="module", params=POOLS)
def pool(request: pytest.FixtureRequest) -> str:
    value: str = request.param
    return value


@pytest.fixture(scope="module")
def rendered(pool: str) -> list[Obj]:
    return render(OVERLAYS / pool)


def test_rendered_overlay_has_one_daemonset_for_its_pool(pool: str, rendered: list[Obj]) -> None:
    ds = one(rendered, "DaemonSet")
    assert ds["metadata"]["name"] == f"modelsync-daemon-{pool}"
    assert ds["metadata"]["namespace"] == NAMESPACE
    expected = {"accelerator.pool": pool}
    if pool == "spark-serving":
        expected["kubernetes.io/arch"] = "arm64"
    assert pod_spec(ds)["nodeSelector"] == expected
    selector = ds["spec"]["selector"]["matchLabels"]
    labels = ds["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= labels.items()
    assert container_image_is_pinned(daemon_container(ds)["image"])


def container_image_is_pinned(image: str) -> bool:
    return "/" in image and ":" in image.rsplit("/", 1)[1] and not image.endswith(":latest")


def test_rendered_env_names_the_pool_and_a_budget(pool: str, rendered: list[Obj]) -> None:
    container = daemon_container(one(rendered, "DaemonSet"))
    names = [e["name"] for e in container["env"]]
    assert len(names) == len(set(names)), "an env var is set twice"
    env = env_of(container)
    assert env["MODELSYNC_POOL"]["value"] == pool
    budget = env["MODELSYNC_CACHE_MAX_BYTES"]["value"]
    share = re.fullmatch(r"(\d+(?:\.\d+)?)%", budget)
    if share:
        assert 50 <= float(share.group(1)) <= 95
    else:
        assert re.fullmatch(r"\d+(\.\d+)?\s*(B|[KMGTP]i?B?)?", budget), budget


def test_rendered_probes_use_the_listen_port(rendered: list[Obj]) -> None:
    container = daemon_container(one(rendered, "DaemonSet"))
    for probe, path in (
        ("livenessProbe", "/healthz"),
        ("readinessProbe", "/readyz"),
        ("startupProbe", "/healthz"),
    ):
        get = container[probe]["httpGet"]
        assert get["path"] == path
        assert port_number(container, get["port"]) == PORT


def test_rendered_cache_is_the_nodes_hostpath_read_write(rendered: list[Obj]) -> None:
    ds = one(rendered, "DaemonSet")
    mount, volume = mounts_of(pod_spec(ds), daemon_container(ds))[CACHE]
    assert volume["hostPath"] == {"path": CACHE, "type": "Directory"}
    assert not mount.get("readOnly", False)


def test_rendered_security_context_is_non_root_and_locked_down(rendered: list[Obj]) -> None:
    ds = one(rendered, "DaemonSet")
    pod = pod_spec(ds)["securityContext"]
    assert pod["runAsNonRoot"] is True
    assert pod["runAsUser"] == UID and pod["runAsUser"] != 0
    assert pod["runAsGroup"] == GID and pod["fsGroup"] == GID
    assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
    ctr = daemon_container(ds)["securityContext"]
    assert ctr["readOnlyRootFilesystem"] is True
    assert ctr["allowPrivilegeEscalation"] is False
    assert ctr["capabilities"] == {"drop": ["ALL"]}
    assert ctr.get("privileged", False) is False


def test_rendered_resources_have_limits_that_cover_requests(rendered: list[Obj]) -> None:
    resources = daemon_container(one(rendered, "DaemonSet"))["resources"]
    for key in ("cpu", "memory"):
        assert quantity(resources["requests"][key]) <= quantity(resources["limits"][key])
    # The pull keeps ~128 MiB in flight; the design sizes the daemon at ~256 MiB.
    assert 192 * 2**20 <= quantity(resources["limits"]["memory"]) <= 512 * 2**20


def test_b300_daemons_may_use_more_cpu_than_the_other_pools() -> None:
    def cpu_limit(pool: str) -> float:
        ds = one(render(OVERLAYS / pool), "DaemonSet")
        return quantity(daemon_container(ds)["resources"]["limits"]["cpu"])

    assert cpu_limit("b300-serving") > cpu_limit("a100-serving") >= cpu_limit("spark-serving")


def test_rendered_references_resolve(rendered: list[Obj]) -> None:
    ds = one(rendered, "DaemonSet")
    spec = pod_spec(ds)
    names = {(o["kind"], o["metadata"]["name"]) for o in rendered}
    assert ("ServiceAccount", spec["serviceAccountName"]) in names
    assert ("PriorityClass", spec["priorityClassName"]) in names
    assert ("Namespace", NAMESPACE) in names
    for volume in spec["volumes"]:
        if "configMap" in volume:
            assert ("ConfigMap", volume["configMap"]["name"]) in names
    for var in daemon_container(ds)["env"]:
        ref = var.get("valueFrom", {})
        if "configMapKeyRef" in ref:
            cm = [
                o
                for o in rendered
                if o["kind"] == "ConfigMap"
                and o["metadata"]["name"] == ref["configMapKeyRef"]["name"]
            ]
            assert cm and ref["configMapKeyRef"]["key"] in cm[0]["data"]
        if "secretKeyRef" in ref:
            # Created by the operator, never committed.
            assert ref["secretKeyRef"]["name"] == SECRET
    assert not [o for o in rendered if o["kind"] == "Secret"]
    for obj in rendered:
        if obj["kind"] not in CLUSTER_SCOPED:
            assert obj["metadata"]["namespace"] == NAMESPACE


def test_rendered_metrics_service_selects_the_daemon_pods(rendered: list[Obj]) -> None:
    service = one(rendered, "Service")
    assert service["spec"]["clusterIP"] == "None"
    pod_labels = one(rendered, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert [p["port"] for p in service["spec"]["ports"]] == [PORT]


def test_overlays_can_be_applied_side_by_side() -> None:
    """Apart from its DaemonSet, every overlay renders the same objects, and the
    DaemonSets differ in name and selector: applying all three to one cluster
    neither overwrites one pool's daemon nor lets two DaemonSets claim a pod."""
    shared = []
    daemonsets = []
    for pool in POOLS:
        objs = render(OVERLAYS / pool)
        shared.append(
            sorted(
                (o for o in objs if o["kind"] != "DaemonSet"),
                key=lambda o: (o["kind"], o["metadata"]["name"]),
            )
        )
        daemonsets.append(one(objs, "DaemonSet"))
    assert shared[0] == shared[1] == shared[2]
    assert len({d["metadata"]["name"] for d in daemonsets}) == len(POOLS)
    selectors = [d["spec"]["selector"]["matchLabels"] for d in daemonsets]
    for n, selector in enumerate(selectors):
        for m, other in enumerate(daemonsets):
            if n != m:
                labels = other["spec"]["template"]["metadata"]["labels"]
                assert not selector.items() <= labels.items()


@needs_kustomize
def test_base_renders_with_kustomize() -> None:
    objs = render_with_tool(str(BASE))
    ds = one(list(objs), "DaemonSet")
    assert env_of(daemon_container(ds))["MODELSYNC_POOL"]["value"] == "set-by-overlay"


def normalised(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: normalised(v) for k, v in value.items()}
    if isinstance(value, list):
        items = [normalised(v) for v in value]
        if all(isinstance(i, dict) and "name" in i for i in items):
            items.sort(key=lambda i: i["name"])
        return items
    return value


@needs_kustomize
@pytest.mark.parametrize("directory", [BASE, *(OVERLAYS / p for p in POOLS)], ids=lambda d: d.name)
def test_small_renderer_agrees_with_kustomize(directory: Path) -> None:
    def keyed(objs: Any) -> dict[tuple[str, str], Any]:
        return {(o["kind"], o["metadata"]["name"]): normalised(o) for o in objs}

    assert keyed(apply_kustomization(directory)) == keyed(render_with_tool(str(directory)))


# --------------------------------------------------------------------------- schema checks


def everything_to_validate() -> Iterator[tuple[str, Obj]]:
    for pool in POOLS:
        for obj in render(OVERLAYS / pool):
            yield f"{pool}:{obj['kind']}/{obj['metadata']['name']}", obj
    for name in JOB_FILES:
        text = (JOBS / name).read_text().replace("NODE_NAME", "gpu-b300-07")
        yield name, yaml.safe_load(text.replace("MODEL_TO_STAGE", "qwen3-0.6b"))
    yield EXAMPLE.name, load_one(EXAMPLE)


@pytest.mark.parametrize("version", ["1.29.0", "latest"])
def test_every_object_validates_against_the_kubernetes_schemas(version: str) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    target = kubernetes_validate.latest_version() if version == "latest" else version
    for label, obj in everything_to_validate():
        try:
            kubernetes_validate.validate(obj, target, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{label} is invalid for Kubernetes {target}: {exc.message}")
