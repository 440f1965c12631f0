"""The Kubernetes delivery as tests see it: cluster folders rendered by the real kustomize, the Job
templates filled in by jobs/run_on_pool.py, and the pod-spec accessors the checks share."""

from __future__ import annotations

import functools
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent.parent
MANIFESTS = ROOT / "manifests"
JOBS = ROOT / "jobs"
IMAGE = "registry.example.internal/platform/modelsync:0.1.0"

Obj = dict[str, Any]


@functools.cache
def kustomize(directory: Path) -> tuple[Obj, ...]:
    """`kubectl kustomize DIR`, parsed; kubectl is installed on the project's machines."""
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl is needed to render the manifests (kubectl kustomize); install it"
    done = subprocess.run(
        [kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, f"kubectl kustomize {directory} failed:\n{done.stderr}"
    return tuple(d for d in yaml.safe_load_all(done.stdout) if d is not None)


def cluster(name: str) -> list[Obj]:
    """What Argo CD applies to the cluster `name` (manifests/clusters/<name>)."""
    return list(kustomize(MANIFESTS / "clusters" / name))


def _load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module


#: jobs/run_on_pool.py, a script rather than a package module
RUN_ON_POOL = _load(JOBS / "run_on_pool.py")


def rendered_job(kind: str, pool: str, node: str = "gpu-node-07", model: str = "deepseek-v3") -> Obj:
    """The Job `kind` as run_on_pool.py applies it to `node` of `pool`."""
    obj: Obj = yaml.safe_load(RUN_ON_POOL.render_job(kind, node, pool, IMAGE, model))
    return obj


def pod_spec(workload: Obj) -> Obj:
    """The pod spec of a DaemonSet, Deployment or Job, or of a KServe predictor."""
    if workload["kind"] == "InferenceService":
        predictor: Obj = workload["spec"]["predictor"]
        return predictor
    spec: Obj = workload["spec"]["template"]["spec"]
    return spec


def containers(spec: Obj) -> list[Obj]:
    return [*spec.get("initContainers", []), *spec["containers"]]


def by_name(items: list[Obj] | None) -> dict[str, Obj]:
    return {item["name"]: item for item in items or []}
