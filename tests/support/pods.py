"""The rendered pod specs as `podman kube play` runs them on one node: what changes, and why.

A pod template (the DaemonSet's, a Job's, the vLLM example's) becomes a Pod with its
containers, securityContexts, volumes, env and envFrom as rendered. podman 4.3 plays
Pods, ConfigMaps and Deployments, not DaemonSets or Jobs; the few things that differ
from the cluster are done here and only here:

- the image: the one the tier built, as a cluster folder's `images:` would set it;
- the hostPath /model-cache: a temporary directory prepared as the README prepares a
  node (group 10001, mode 2775);
- the Secret: podman 4.3 stores a played Secret in a form its own secretKeyRef cannot
  read, so the Secret's `data` goes in as a podman secret (JSON of base64 values, what
  secretKeyRef reads), under a name of this session's;
- `fieldRef: spec.nodeName` (no downward API in podman 4.3): the node's name as a value;
- init containers are kept after they ran (a podman annotation), for their logs;
- a declared containerPort is published on a free host port: podman 4.3 publishes it on the
  host under its own number, where the suite's daemons on the host listen too (9477); the
  tier reaches the pod at its IP, as the kubelet's probes and Prometheus do;
- pod and ConfigMap names carry the session's id, so sessions on one machine never
  collide (podman keeps a ConfigMap volume as a named volume, the ConfigMap's name).

The site values an operator sets in the cluster folder are set as the operator does:
the endpoint, the CA (certifi's bundle), the bandwidth cap and the allowed prefixes in
modelsync-site.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import socket
from pathlib import Path
from typing import Any

import yaml

from support.kube import IMAGE, cluster
from support.podman import SESSION, Podman

Obj = dict[str, Any]
SECRET = "modelsync-s3-credentials"
CACHE_GROUP = 10001


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("0.0.0.0", 0))
        return int(probe.getsockname()[1])


def prepare_cache(path: Path) -> Path:
    """The README's node preparation: the cache group owns the directory, setgid."""
    path.mkdir(parents=True)
    os.chown(path, -1, CACHE_GROUP)
    path.chmod(0o2775)
    return path


class Node:
    """One node: its cache, the cluster's ConfigMaps with the site's values, and the Secret in podman."""

    def __init__(self, podman: Podman, workdir: Path, image: str, name: str, site: dict[str, str]) -> None:
        self.podman = podman
        self.workdir = workdir
        self.image = image
        self.name = name
        self.cache = prepare_cache(workdir / "model-cache")
        self.objects = cluster("datacenter")
        self.configmaps = {
            o["metadata"]["name"]: copy.deepcopy(o) for o in self.objects if o["kind"] == "ConfigMap"
        }
        self.configmaps["modelsync-site"]["data"].update(site)
        for name, configmap in self.configmaps.items():
            configmap["metadata"]["name"] = podman.made("volume", f"{name}-{SESSION}")
        self.secret = f"{SECRET}-{SESSION}"
        #: pods played that have not yet been seen to stop and settle, oldest first
        self._played: list[str] = []

    def create_secret(self, data: dict[str, str]) -> None:
        """The Secret modelsync-s3-credentials, with the daemon's keys (see the module's docstring)."""
        encoded = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
        path = self.workdir / "secret.json"
        path.write_text(json.dumps(encoded))
        self.podman("secret", "create", self.podman.made("secret", self.secret), str(path))

    def configmap(self, name: str) -> Obj:
        """The ConfigMap `name` as rendered and as the site set it; change it before `play`."""
        return self.configmaps[name]

    def workload(self, kind: str, name: str) -> Obj:
        (found,) = [o for o in self.objects if o["kind"] == kind and o["metadata"]["name"] == name]
        return copy.deepcopy(found)

    def play(self, name: str, template: Obj, **spec_changes: Any) -> str:
        """`podman kube play` the pod template as a Pod named `name`-<session>; returns the pod's name."""
        pod_name = f"{name}-{SESSION}"
        spec = copy.deepcopy(template["spec"])
        spec.update(copy.deepcopy(spec_changes))
        self.localize(spec)
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": pod_name,
                "labels": template.get("metadata", {}).get("labels", {}),
                # Keep init containers once they ran (podman removes them by default): their
                # logs and exit codes are part of what the tests check.
                "annotations": {"io.podman.annotations.init.container.type": "always"},
            },
            "spec": spec,
        }
        path = self.workdir / f"{pod_name}.yaml"
        # No folded lines: podman's YAML parser misreads PyYAML's escaped line continuations.
        path.write_text(yaml.safe_dump_all([*self.configmaps.values(), pod], sort_keys=False, width=2**20))
        # A pod that ran to its end releases its address in clean-ups after it stopped (see
        # `Podman.settle`): the next pod must not be given that address while they run.
        for earlier in [p for p in self._played if self.podman.ended(p)]:
            self.podman.settle(earlier)
            self._played.remove(earlier)
        self.podman.made("pod", pod_name)
        self.podman("kube", "play", str(path), timeout_s=180)
        self.podman.pin_bridge_address()
        self._played.append(pod_name)
        return pod_name

    def remove(self, pod: str) -> None:
        """Remove a played pod, and wait until podman is done with its address."""
        self.podman.remove_pod(pod)
        if pod in self._played:
            self._played.remove(pod)

    def localize(self, spec: Obj) -> Obj:
        """The changes of the module's docstring, on one pod spec."""
        for container in [*spec.get("initContainers", []), *spec["containers"]]:
            if container["image"] == IMAGE:
                container["image"] = self.image
            for port in container.get("ports", []):
                port["hostPort"] = free_port()
            for source in container.get("envFrom", []):
                self._rename(source["configMapRef"])
            for var in container.get("env", []):
                ref = var.get("valueFrom", {})
                if ref.get("fieldRef", {}).get("fieldPath") == "spec.nodeName":
                    del var["valueFrom"]
                    var["value"] = self.name
                if ref.get("secretKeyRef", {}).get("name") == SECRET:
                    ref["secretKeyRef"]["name"] = self.secret
                if "configMapKeyRef" in ref:
                    self._rename(ref["configMapKeyRef"])
        for volume in spec.get("volumes", []):
            if volume.get("hostPath", {}).get("path") == "/model-cache":
                volume["hostPath"]["path"] = str(self.cache)
            if "configMap" in volume:
                self._rename(volume["configMap"])
        return spec

    def _rename(self, ref: Obj) -> None:
        ref["name"] = self.configmaps[ref["name"]]["metadata"]["name"]
