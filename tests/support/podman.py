"""Real containers for the container tier: podman as root, a stand-in base image, the image built.

podman runs with the project's scripts/containers.conf (runc, cgroupfs, rlimits the
sandbox grants; /etc is never touched). No image registry is reachable, so the
Dockerfile's base, python:3.11-slim-bookworm, is stood in for by an image made from
Debian's packages with mmdebstrap: its Python is Debian's 3.11 in /usr/bin, with
`python` linked on PATH. It is made once per recipe and kept across runs under a name
that carries the recipe's hash (older recipes' images are removed when a new one is
made); it is a test fixture and never shipped. Everything else a test makes (images,
pods, containers, secrets) is named with the session's id and removed by name.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent.parent
CONF = ROOT / "scripts" / "containers.conf"
#: the Debian release of python:3.11-slim-bookworm, and what its stand-in needs: Python with
#: venv (the build stage), CA certificates, and groupadd/useradd (the final stage)
SUITE = "bookworm"
PACKAGES = ("python3", "python3-venv", "ca-certificates", "passwd")
BASE_REPO = "localhost/modelsync-test-base"
PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_LOCKS = Path(tempfile.gettempdir())
#: a session's names: several sessions on one machine share podman's storage
SESSION = uuid.uuid4().hex[:8]


@functools.cache
def unavailable_reason() -> str | None:
    """Why this machine cannot run the container tier, or None when it can."""
    if os.geteuid() != 0:
        return "the container tier runs podman as root"
    missing = [tool for tool in ("podman", "runc", "mmdebstrap") if shutil.which(tool) is None]
    if missing:
        return f"{', '.join(missing)} missing (scripts/setup installs them as root)"
    done = subprocess.run(
        ["podman", "info", "--format", "{{.Host.OCIRuntime.Name}}"],
        env=podman_env(), capture_output=True, text=True, timeout=60, check=False,
    )
    if done.returncode != 0:
        return f"podman does not work here: {done.stderr.strip()[-300:]}"
    return None


def podman_env() -> dict[str, str]:
    return {**os.environ, "CONTAINERS_CONF": str(CONF)}


#: the network `podman kube play` puts pods on
KUBE_NETWORK = "podman-default-kube-network"
#: /sys/class/net/*/addr_assign_type of an address set by hand (NET_ADDR_SET)
_ADDR_SET = "3"


class Podman:
    """podman calls with the project's settings; what is made through it is removed by `cleanup`."""

    def __init__(self) -> None:
        self._made: list[tuple[str, str]] = []

    def __call__(
        self, *args: str, timeout_s: float = 120, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            ["podman", *args], env=podman_env(), capture_output=True, text=True, timeout=timeout_s,
            check=False,
        )
        if check and done.returncode != 0:
            raise AssertionError(f"podman {' '.join(args)} exited {done.returncode}:\n{done.stderr[-3000:]}")
        return done

    def made(self, kind: str, name: str) -> str:
        """Remember `name` (a manifest, image, pod, secret or volume) for `cleanup`; returns it."""
        self._made.append((kind, name))
        return name

    def inspect(self, name: str) -> dict[str, Any]:
        (found,) = json.loads(self("inspect", name).stdout)
        return dict(found)

    def exit_code(self, container: str, timeout_s: float = 120) -> int:
        """Wait for `container` to exit and return its code."""
        return int(self("wait", container, timeout_s=timeout_s).stdout.strip().splitlines()[-1])

    def settle(self, pod: str, timeout_s: float = 60) -> None:
        """Wait until `pod` has stopped and podman's own clean-up after the stop has ended.

        `kube play` gives a pod the exit policy `stop`: when its last container exits, podman
        stops the infra container and releases the pod's address from clean-up processes that
        run after `podman stop` has returned (three such processes in one trace). A container
        started again before they end races them: under load one of them released the address
        the restarted pod had just been given, the next pod got it too, and the daemon's
        connections to the store timed out until that pod ended.
        """
        ids = self.container_ids(pod)
        deadline = time.monotonic() + timeout_s
        while self.pod(pod)["State"] != "Exited":
            assert time.monotonic() < deadline, f"pod {pod} did not stop"
            time.sleep(0.1)
        self.wait_for_cleanups(ids, deadline)

    def pin_bridge_address(self, network: str = KUBE_NETWORK) -> None:
        """Fix the MAC address of `network`'s bridge at the one it has now, once per bridge.

        netavark 1.4 (Debian 12) leaves a bridge's address to the kernel, which gives it the
        lowest address among its ports: it changed three times in ten seconds as the tier's pods
        came and went. A pod that resolved its gateway before a change sends to an address no
        port answers until its neighbour entry expires (up to ~45 s): the daemon's connections
        to the store on the host timed out four times in a row, in two full-suite runs. An
        address set by hand is one the kernel keeps.
        """
        found = self("network", "inspect", network, "--format", "{{.NetworkInterface}}", check=False)
        device = Path("/sys/class/net", found.stdout.strip())
        if found.returncode != 0 or not found.stdout.strip() or not device.exists():
            return
        if (device / "addr_assign_type").read_text().strip() != _ADDR_SET:
            address = (device / "address").read_text().strip()
            subprocess.run(["ip", "link", "set", "dev", device.name, "address", address], check=True)

    def pod(self, pod: str) -> dict[str, Any]:
        """`podman pod inspect`: the pod's state and its containers."""
        return dict(json.loads(self("pod", "inspect", pod).stdout))

    def container_ids(self, pod: str) -> list[str]:
        return [c["Id"] for c in self.pod(pod)["Containers"]]

    def ended(self, pod: str) -> bool:
        """Whether `pod`'s containers have stopped or are stopping (it is no longer Running)."""
        return self.pod(pod)["State"] != "Running"

    def remove_pod(self, pod: str) -> None:
        """`pod rm -f`, then wait for the clean-ups of its containers (see `settle`)."""
        ids = self.container_ids(pod)
        self("pod", "rm", "-f", pod, timeout_s=120)
        self.wait_for_cleanups(ids, time.monotonic() + 60)

    @staticmethod
    def wait_for_cleanups(ids: list[str], deadline: float) -> None:
        while busy := [a for a in _command_lines() if "cleanup" in a and any(i in a for i in ids)]:
            assert time.monotonic() < deadline, f"{len(busy)} clean-ups of {ids} left"
            time.sleep(0.1)

    def cleanup(self) -> list[str]:
        """Remove what was made, newest first, each by name; returns what could not be removed."""
        left = []
        commands = {"pod": ("pod", "rm", "-f"), "secret": ("secret", "rm"), "image": ("rmi", "-f"),
                    "manifest": ("manifest", "rm"), "volume": ("volume", "rm", "-f")}
        for kind, name in reversed(self._made):
            done = self(*commands[kind], name, check=False, timeout_s=120)
            gone = "no such" in done.stderr.lower() or "not known" in done.stderr
            if done.returncode != 0 and not gone:
                left.append(f"{kind} {name}: {done.stderr.strip()}")
        self._made.clear()
        return left


def _command_lines() -> list[list[str]]:
    """Every process's arguments (those that end while read are left out)."""
    lines = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                lines.append((entry / "cmdline").read_bytes().decode(errors="replace").split("\0"))
            except OSError:
                continue
    return lines


def base_recipe(arch: str) -> list[str]:
    """The mmdebstrap command that makes the stand-in base (its output tar comes last)."""
    return [
        "mmdebstrap", "--variant=minbase", f"--arch={arch}", f"--include={','.join(PACKAGES)}",
        # What python:3.11-slim has and the Dockerfile uses: `python` on PATH.
        "--customize-hook=ln -s /usr/bin/python3 \"$1/usr/local/bin/python\"",
        # Smaller and quicker: no documentation, manuals or translations.
        "--dpkgopt=path-exclude=/usr/share/doc/*", "--dpkgopt=path-exclude=/usr/share/man/*",
        "--dpkgopt=path-exclude=/usr/share/locale/*",
        SUITE,
    ]


def stand_in_base(podman: Podman, arch: str) -> str:
    """The stand-in for python:3.11-slim-bookworm on `arch`, made now unless a run made it before."""
    recipe = base_recipe(arch)
    name = f"{BASE_REPO}-{arch}:{hashlib.sha256(json.dumps(recipe).encode()).hexdigest()[:16]}"
    with (_LOCKS / f"modelsync-test-base-{arch}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one session makes it; the others wait and reuse it
        if podman("image", "exists", name, check=False).returncode == 0:
            return name
        stale = podman("images", "--format", "{{.Repository}}:{{.Tag}}", f"{BASE_REPO}-{arch}", check=False)
        with tempfile.TemporaryDirectory() as tmp:
            rootfs = Path(tmp) / "rootfs.tar"
            # Another arch's package scripts run under qemu: minutes idle, far more on a busy machine.
            done = subprocess.run(
                [*recipe, str(rootfs)], capture_output=True, text=True, timeout=3600, check=False
            )
            assert done.returncode == 0, f"mmdebstrap failed:\n{done.stderr[-3000:]}"
            podman("import", f"--arch={arch}", "--change", f"ENV {PATH_ENV}", str(rootfs), name,
                   timeout_s=300)
        for old in stale.stdout.split():
            if old != name:
                podman("rmi", old, check=False)
    return name


def build_image(podman: Podman, arch: str, wheelhouse: Path, base: str) -> tuple[str, float]:
    """scripts/image for `arch`, offline from `wheelhouse` on `base`: the image's name and seconds taken."""
    tag = podman.made("manifest", f"localhost/modelsync-test:{SESSION}")
    podman.made("image", f"{tag}-{arch}")
    started = time.monotonic()
    done = subprocess.run(
        [str(ROOT / "scripts" / "image"), "--arch", arch, "--wheelhouse", str(wheelhouse), "--base", base,
         "--tag", tag],
        env=podman_env(), capture_output=True, text=True, timeout=3600, check=False,
    )
    assert done.returncode == 0, f"scripts/image failed:\n{done.stdout}\n{done.stderr[-5000:]}"
    return f"{tag}-{arch}", time.monotonic() - started


def fill_wheelhouse(dest: Path, arch: str) -> None:
    """scripts/wheelhouse for one arch: the locks' wheels, hash-checked."""
    done = subprocess.run(
        [str(ROOT / "scripts" / "wheelhouse"), "--arch", arch, "--dest", str(dest)],
        capture_output=True, text=True, timeout=600, check=False,
    )
    assert done.returncode == 0, f"scripts/wheelhouse failed:\n{done.stdout}\n{done.stderr[-3000:]}"
