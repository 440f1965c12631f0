#!/usr/bin/env python3
"""Run one modelsync Job on every node of a pool, a few at a time, and collect each node's result.

    jobs/run_on_pool.py --pool b300-serving ls
    jobs/run_on_pool.py --pool b300-serving --parallel 4 prefetch --model deepseek-v3
    jobs/run_on_pool.py --pool b300-serving verify --out /tmp/verify-results
    jobs/run_on_pool.py --pool spark-serving --nodes spark-01 --dry-run evict   # print the Job, apply nothing

For each node: fill in the template jobs/<job>-job.yaml, delete a finished Job
of the same name, apply, wait until it succeeds or fails, save its log to
`--out/<node>.log` and record the container's exit code. At most `--parallel`
Jobs run at once, so a whole pool never hits the object store (or its disks)
at the same instant. Prints one line per node and a summary; exits 0 when every
node succeeded, 1 otherwise. Needs only Python 3.11 and kubectl.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

JOBS_DIR = Path(__file__).resolve().parent
JOB_KINDS = ("ls", "prefetch", "evict", "verify")
NAMESPACE = "modelsync"
#: Kubernetes limits a Job's name to 63 characters (it becomes a label value)
MAX_NAME_CHARS = 63


def pool_taint(pool: str) -> str:
    """The value of the pool's `dedicated` taint: b300-serving -> gpu-b300 (the platform's naming)."""
    return "gpu-" + pool.removesuffix("-serving")


def job_name(kind: str, node: str) -> str:
    name = f"modelsync-{kind}-{node}"
    if len(name) <= MAX_NAME_CHARS:
        return name
    digest = hashlib.sha256(node.encode()).hexdigest()[:8]
    return f"{name[: MAX_NAME_CHARS - 9].rstrip('-.')}-{digest}"


def render_job(kind: str, node: str, pool: str, image: str, model: str | None = None) -> str:
    """The template of `kind` with every placeholder filled in."""
    text = (JOBS_DIR / f"{kind}-job.yaml").read_text()
    if "MODEL_TO_STAGE" in text and not model:
        raise SystemExit(f"error: the {kind} Job needs --model (a schedule name or an s3:// source)")
    text = text.replace(f"modelsync-{kind}-NODE_NAME", job_name(kind, node))
    for placeholder, value in (
        ("NODE_NAME", node),
        ("POOL_NAME", pool),
        ("POOL_TAINT", pool_taint(pool)),
        ("MODELSYNC_IMAGE", image),
        ("MODEL_TO_STAGE", model or ""),
    ):
        text = text.replace(placeholder, value)
    return text


def deadline_s(manifest: str) -> float:
    """The Job's activeDeadlineSeconds: Kubernetes stops it then, so waiting longer is pointless."""
    found = re.search(r"^  activeDeadlineSeconds: (\d+)$", manifest, re.M)
    return float(found.group(1)) if found else 6 * 3600.0


@dataclass(frozen=True, slots=True)
class NodeResult:
    node: str
    outcome: str
    exit_code: int | None
    log: Path | None

    @property
    def ok(self) -> bool:
        return self.outcome == "succeeded"


class Kubectl:
    def __init__(self, binary: str, context: str | None, namespace: str) -> None:
        self._base = [binary, *(["--context", context] if context else []), "-n", namespace]

    def run(self, *args: str, stdin: str | None = None, check: bool = True) -> str:
        done = subprocess.run(
            [*self._base, *args], input=stdin, capture_output=True, text=True, check=False, timeout=120
        )
        if check and done.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)}: {done.stderr.strip() or done.returncode}")
        return done.stdout

    def pool_nodes(self, pool: str) -> list[str]:
        out = self.run("get", "nodes", "-l", f"accelerator.pool={pool}", "-o", "name")
        return sorted(line.removeprefix("node/") for line in out.split())

    def daemon_image(self, pool: str) -> str:
        image = self.run(
            "get", "daemonset", f"modelsync-daemon-{pool}",
            "-o", "jsonpath={.spec.template.spec.containers[0].image}",
        ).strip()
        if not image:
            raise RuntimeError(f"the DaemonSet modelsync-daemon-{pool} names no image")
        return image


def run_on_node(
    kubectl: Kubectl, manifest: str, name: str, node: str, out: Path, timeout_s: float, poll_s: float
) -> NodeResult:
    kubectl.run("delete", "job", name, "--ignore-not-found", "--wait=true")
    kubectl.run("apply", "-f", "-", stdin=manifest)
    deadline = time.monotonic() + timeout_s
    outcome = "timed out"
    while time.monotonic() < deadline:
        status = kubectl.run("get", "job", name, "-o", "jsonpath={.status.succeeded}/{.status.failed}")
        succeeded, _, failed = status.strip().partition("/")
        if succeeded not in ("", "0"):
            outcome = "succeeded"
            break
        if failed not in ("", "0"):
            outcome = "failed"
            break
        time.sleep(poll_s)
    log = out / f"{node}.log"
    log.write_text(kubectl.run("logs", f"job/{name}", "--all-containers", check=False))
    code = kubectl.run(
        "get", "pods", "-l", f"job-name={name}",
        "-o", "jsonpath={.items[-1:].status.containerStatuses[0].state.terminated.exitCode}",
        check=False,
    ).strip()
    return NodeResult(node, outcome, int(code) if code.isdigit() else None, log)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("job", choices=JOB_KINDS)
    parser.add_argument("--pool", required=True, help="accelerator.pool value, e.g. b300-serving")
    parser.add_argument("--model", help="prefetch: a schedule name or an s3:// source")
    parser.add_argument("--nodes", help="comma-separated nodes [default: every node of the pool]")
    parser.add_argument("--image", help="[default: the image of the pool's modelsync DaemonSet]")
    parser.add_argument("--parallel", type=int, default=4, help="Jobs running at once [4]")
    parser.add_argument(
        "--timeout", type=float, help="seconds to wait per node [the Job's activeDeadlineSeconds + 5 min]"
    )
    parser.add_argument("--poll-interval", type=float, default=5.0, help="seconds between status checks [5]")
    parser.add_argument("--out", type=Path, default=Path("modelsync-results"), help="directory for logs")
    parser.add_argument("--context", help="kubectl context")
    parser.add_argument("--kubectl", default="kubectl")
    parser.add_argument("--dry-run", action="store_true", help="print the Jobs; apply nothing")
    args = parser.parse_args(argv)
    if args.parallel < 1:
        parser.error("--parallel must be at least 1")
    kubectl = Kubectl(args.kubectl, args.context, NAMESPACE)
    try:
        nodes = args.nodes.split(",") if args.nodes else kubectl.pool_nodes(args.pool)
        image = args.image or ("MODELSYNC_IMAGE" if args.dry_run else kubectl.daemon_image(args.pool))
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not nodes:
        print(f"error: no node carries accelerator.pool={args.pool}", file=sys.stderr)
        return 2
    manifests = {node: render_job(args.job, node, args.pool, image, args.model) for node in nodes}
    timeout_s = args.timeout or deadline_s(next(iter(manifests.values()))) + 300
    if args.dry_run:
        print("---\n".join(manifests.values()), end="")
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    results: list[NodeResult] = []
    with concurrent.futures.ThreadPoolExecutor(args.parallel) as pool:
        futures = {
            pool.submit(
                run_on_node,
                kubectl, text, job_name(args.job, node), node, args.out, timeout_s, args.poll_interval,
            ): node
            for node, text in manifests.items()
        }
        for future in concurrent.futures.as_completed(futures):
            node = futures[future]
            try:
                result = future.result()
            except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
                result = NodeResult(node, f"not run ({exc})", None, None)
            results.append(result)
            code = "" if result.exit_code is None else f" (exit {result.exit_code})"
            where = f", log {result.log}" if result.log else ""
            print(f"{node}: {result.outcome}{code}{where}", flush=True)
    failed = [r for r in results if not r.ok]
    print(f"{len(results) - len(failed)} of {len(results)} nodes succeeded", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
