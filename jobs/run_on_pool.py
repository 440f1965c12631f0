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
import json
import math
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

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


#: the templates' placeholders; each stands for a whole YAML scalar (a job's and a ConfigMap's
#: name are whole scalars too, so the pool's name is never pasted into a longer one)
PLACEHOLDERS = ("NODE_NAME", "POOL_NAME", "POOL_TAINT", "MODELSYNC_IMAGE", "MODEL_TO_STAGE")


def render_job(kind: str, node: str, pool: str, image: str, model: str | None = None) -> str:
    """The template of `kind` with every placeholder replaced by its value as a quoted scalar.

    A value is never pasted into the YAML: JSON's double-quoted string is YAML's too, so a
    `#`, a colon, a quote or a newline in a value stays part of that one string instead of
    starting a comment, a mapping or another container argument. Comment lines keep their
    placeholders (they tell a reader what to replace by hand).
    """
    text = (JOBS_DIR / f"{kind}-job.yaml").read_text()
    if "MODEL_TO_STAGE" in text and not model:
        raise SystemExit(f"error: the {kind} Job needs --model (a schedule name or an s3:// source)")
    values = {
        f"modelsync-{kind}-NODE_NAME": job_name(kind, node),
        "modelsync-pool-POOL_NAME": f"modelsync-pool-{pool}",
        "NODE_NAME": node,
        "POOL_NAME": pool,
        "POOL_TAINT": pool_taint(pool),
        "MODELSYNC_IMAGE": image,
        "MODEL_TO_STAGE": model or "",
    }
    alternatives = "|".join(re.escape(k) for k in sorted(values, key=len, reverse=True))
    # a placeholder as a whole scalar: after `key: `, `- `, `[` or `, `; before the line's end, `]` or `,`
    scalar = re.compile(rf"(?<=[\s\[,])({alternatives})(?=\s*(?:$|[\],]))")
    lines = []
    for number, line in enumerate(text.splitlines(keepends=True), 1):
        if not line.lstrip().startswith("#"):
            if any(p in scalar.sub("", line) for p in PLACEHOLDERS):
                raise ValueError(f"{kind}-job.yaml:{number}: a placeholder inside a longer scalar")
            line = scalar.sub(lambda found: json.dumps(values[found.group(1)]), line)
        lines.append(line)
    return "".join(lines)


def deadline_s(manifest: str) -> float:
    """The Job's activeDeadlineSeconds: Kubernetes stops it then, so waiting longer is pointless."""
    found = re.search(r"^  activeDeadlineSeconds: (\d+)$", manifest, re.M)
    return float(found.group(1)) if found else 6 * 3600.0


#: a Kubernetes node name is a DNS subdomain: lowercase letters, digits, `-` and `.`, at most 253
_NODE_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
#: a label value (accelerator.pool): at most 63 letters, digits, `-`, `_`, `.`, alphanumeric at both ends
_LABEL_VALUE = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")


def positive_seconds(text: str) -> float:
    """An interval or a timeout: a finite number of seconds above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive, finite number of seconds")
    return value


def node_names(text: str) -> list[str]:
    """Comma-separated node names, each a Kubernetes node name; none empty."""
    names = [name.strip() for name in text.split(",")]
    for name in names:
        check_node_name(name)
    return names


def check_node_name(name: str) -> str:
    if not name:
        raise argparse.ArgumentTypeError("an empty node name (two commas, or one at an end)")
    if not _NODE_NAME.fullmatch(name):
        raise argparse.ArgumentTypeError(f"{name!r} is not a Kubernetes node name")
    return name


def pool_name(text: str) -> str:
    if not _LABEL_VALUE.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not an accelerator.pool label value")
    return text


def plain_value(text: str) -> str:
    """A model or an image: not empty, no control character (a newline is never part of either)."""
    if not text.strip() or any(ord(c) < 0x20 or ord(c) == 0x7F for c in text):
        raise argparse.ArgumentTypeError(f"{text!r} is empty or holds a control character")
    return text


def model_value(text: str) -> str:
    """A schedule name or an s3:// source: a plain value, never read as an option of modelsync."""
    if text.startswith("-"):
        raise argparse.ArgumentTypeError(f"{text!r} starts with '-'; name a model or an s3:// source")
    return plain_value(text)


def out_dir(text: str) -> Path:
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} exists and is not a directory")
    return path


class Parser(argparse.ArgumentParser):
    """Arguments whose mistakes are one line, `error: ...`, and exit 2, as modelsync's own."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message}; see {self.prog} --help\n")


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
    parser = Parser(description=__doc__.splitlines()[0])
    parser.add_argument("job", choices=JOB_KINDS)
    parser.add_argument(
        "--pool", required=True, type=pool_name, help="accelerator.pool value, e.g. b300-serving"
    )
    parser.add_argument("--model", type=model_value, help="prefetch: a schedule name or an s3:// source")
    parser.add_argument(
        "--nodes", type=node_names, help="comma-separated nodes [default: every node of the pool]"
    )
    parser.add_argument(
        "--image", type=plain_value, help="[default: the image of the pool's modelsync DaemonSet]"
    )
    parser.add_argument("--parallel", type=int, default=4, help="Jobs running at once [4]")
    parser.add_argument(
        "--timeout",
        type=positive_seconds,
        help="seconds to wait per node [the Job's activeDeadlineSeconds + 5 min]",
    )
    parser.add_argument(
        "--poll-interval", type=positive_seconds, default=5.0, help="seconds between status checks [5]"
    )
    parser.add_argument("--out", type=out_dir, default=Path("modelsync-results"), help="directory for logs")
    parser.add_argument("--context", help="kubectl context")
    parser.add_argument("--kubectl", default="kubectl")
    parser.add_argument("--dry-run", action="store_true", help="print the Jobs; apply nothing")
    args = parser.parse_args(argv)
    if args.parallel < 1:
        parser.error("--parallel must be at least 1")
    if args.job == "prefetch" and not args.model:
        parser.error("the prefetch Job needs --model (a schedule name or an s3:// source)")
    kubectl = Kubectl(args.kubectl, args.context, NAMESPACE)
    try:
        nodes = args.nodes or [check_node_name(n) for n in kubectl.pool_nodes(args.pool)]
        image = args.image or ("MODELSYNC_IMAGE" if args.dry_run else kubectl.daemon_image(args.pool))
    except (RuntimeError, OSError, subprocess.TimeoutExpired, argparse.ArgumentTypeError) as exc:
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
    try:
        args.out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        print(f"error: --out {args.out}: {exc.strerror}", file=sys.stderr)
        return 2
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
