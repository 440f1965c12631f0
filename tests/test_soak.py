"""The soak: kill -9 at random moments, and a store that misbehaves in every way at once.

On demand only (`-m soak`; scripts/test leaves it out): a few minutes by default,
`MODELSYNC_SOAK_MINUTES=20` for a long run. Both tests run the real CLI (and the
daemon) against SeaweedFS and print their figures; the promise they hold the
tool to is that no model is ever ready with files other than the published ones,
that no command prints a traceback, and that none hangs.

- The kill sweep SIGKILLs `pull`, a deduplicating pull, `publish`, `evict` and
  `gc` at a random moment, runs the same command again to completion, and checks
  every ready model after each round.
- The mixed-fault run puts the fault proxy between the store and three
  concurrent pullers plus a daemon sharing one cache with a budget too small for
  every model, and queues resets, 503s, stalls, truncations, flipped bytes and
  slow headers for the whole run, while a checker compares the ready models and
  runs `verify --full`.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support.cli import write_model
from support.daemon import Daemon, schedule_text
from support.faultproxy import FaultProxy
from support.objects import payload
from support.s3env import S3Env
from support.seaweedfs import SeaweedFS
from support.soak import (
    Figures,
    check_ready_models,
    elapsed_since,
    file_digests,
    kill_at,
    run,
    soak_seconds,
)

pytestmark = [pytest.mark.soak, pytest.mark.xdist_group("seaweedfs")]

KiB = 1024
MiB = 1024 * KiB
KILL_SWEEP_S = soak_seconds(0.4)
FAULT_RUN_S = soak_seconds(0.6)
#: time to set up, drain and check after the soak's own minutes
MARGIN_S = 600


@pytest.fixture
def proxy(seaweedfs: SeaweedFS) -> Iterator[FaultProxy]:
    with FaultProxy(seaweedfs.endpoint_url) as started:
        yield started


def model_files(seed: int, big_bytes: int) -> dict[str, bytes]:
    return {
        "weights.bin": payload(big_bytes, seed),
        "extra.bin": payload(big_bytes // 3, seed + 1000),
        "config.json": b'{"seed": %d}' % seed,
    }


def publish_all(
    figures: Figures, env: dict[str, str], work: Path, bucket: str, models: dict[str, dict[str, bytes]]
) -> None:
    for prefix, files in models.items():
        local = write_model(work / f"local-{prefix.replace('/', '-')}", files)
        code, _out, err = run(figures, env, "publish", str(local), f"s3://{bucket}/{prefix}", "--quiet")
        assert code == 0, err


@pytest.mark.timeout(KILL_SWEEP_S + MARGIN_S)
def test_kill_minus_nine_at_random_moments_never_leaves_a_wrong_ready_model(
    tmp_path: Path, seaweed_admin: S3Env, seaweed_bucket: str, capsys: pytest.CaptureFixture[str]
) -> None:
    figures = Figures()
    rng = random.Random()
    cache = tmp_path / "cache"
    env = seaweed_admin.subprocess_env() | {"MODELSYNC_PART_SIZE": "1Mi", "MODELSYNC_IN_USE_GRACE": "0s"}
    rev1 = model_files(1, 6 * MiB)
    rev2 = {**rev1, "extra.bin": payload(2 * MiB, 77), "config.json": b'{"rev": 2}'}
    models = {"sweep/a/": model_files(10, 6 * MiB), "sweep/d/rev1/": rev1, "sweep/d/rev2/": rev2}
    publish_all(figures, env, tmp_path, seaweed_bucket, models)
    expected = {f"{seaweed_bucket}/{p.rstrip('/')}": file_digests(f) for p, f in models.items()}
    uri = {prefix: f"s3://{seaweed_bucket}/{prefix}" for prefix in models}
    at = ("--cache-dir", str(cache))
    slow = ("--max-bandwidth", "3Mi", "--quiet", *at)

    def pull(prefix: str, *extra: str) -> None:
        code, _out, err = run(figures, env, "pull", uri[prefix], "--quiet", *extra, *at)
        if code != 0:
            figures.note("failures", f"pull {prefix} exited {code}: {err.strip()[-300:]}")

    def evict_if_ready(prefix: str) -> None:
        model = f"{seaweed_bucket}/{prefix.rstrip('/')}"
        if (cache / model).is_dir():
            code, _out, err = run(figures, env, "evict", model, *at)
            if code != 0:
                figures.note("failures", f"evict {model} exited {code}: {err.strip()[-300:]}")

    def sweep_pull() -> int | None:
        evict_if_ready("sweep/a/")
        killed = kill_at(figures, env, rng.uniform(0.2, 3.5), "pull", uri["sweep/a/"], *slow)
        pull("sweep/a/")
        return killed

    def sweep_dedup_pull() -> int | None:
        pull("sweep/d/rev1/")
        evict_if_ready("sweep/d/rev2/")
        killed = kill_at(figures, env, rng.uniform(0.2, 2.5), "pull", uri["sweep/d/rev2/"], *slow)
        pull("sweep/d/rev2/")
        return killed

    published = 0

    def sweep_publish() -> int | None:
        nonlocal published
        published += 1
        prefix = f"sweep/pub/{published}/"
        files = model_files(100 + published, 4 * MiB)
        local = write_model(tmp_path / f"pub-{published}", files)
        dest = f"s3://{seaweed_bucket}/{prefix}"
        killed = kill_at(figures, env, rng.uniform(0.3, 2.5), "publish", str(local), dest, "--quiet")
        code, _out, err = run(figures, env, "publish", str(local), dest, "--quiet")
        if code != 0:
            figures.note("failures", f"publish {prefix} again exited {code}: {err.strip()[-300:]}")
            return killed
        expected[f"{seaweed_bucket}/{prefix.rstrip('/')}"] = file_digests(files)
        uri[prefix] = dest
        pull(prefix)
        check_ready_models(figures, env, cache, expected)
        evict_if_ready(prefix)
        return killed

    def sweep_evict() -> int | None:
        pull("sweep/a/")
        pull("sweep/d/rev1/")
        pull("sweep/d/rev2/")
        killed = kill_at(figures, env, rng.uniform(0.3, 1.5), "evict", "--to-size", "0", *at)
        code, _out, err = run(figures, env, "evict", "--to-size", "0", *at)
        if code != 0:
            figures.note("failures", f"evict --to-size 0 again exited {code}: {err.strip()[-300:]}")
        return killed

    def sweep_gc() -> int | None:
        evict_if_ready("sweep/a/")
        kill_at(figures, env, rng.uniform(0.3, 1.5), "pull", uri["sweep/a/"], *slow)  # leaves staging
        killed = kill_at(figures, env, rng.uniform(0.3, 1.2), "gc", "--older-than", "0s", *at)
        code, _out, err = run(figures, env, "gc", "--older-than", "0s", *at)
        if code != 0:
            figures.note("failures", f"gc again exited {code}: {err.strip()[-300:]}")
        pull("sweep/a/")
        return killed

    sweeps: dict[str, Callable[[], int | None]] = {
        "pull": sweep_pull,
        "dedup pull": sweep_dedup_pull,
        "publish": sweep_publish,
        "evict": sweep_evict,
        "gc": sweep_gc,
    }
    started = time.monotonic()
    while time.monotonic() - started < KILL_SWEEP_S:
        for name, sweep in sweeps.items():
            figures.count(f"{name} killed" if sweep() is None else f"{name} done first")
            check_ready_models(figures, env, cache, expected)
    code, out, err = run(figures, env, "verify", "--full", *at)
    if code != 0:
        figures.note("failures", f"verify --full exited {code}: {out[-300:]} {err[-300:]}")

    keys = [k for name in sweeps for k in (f"{name} killed", f"{name} done first")]
    with capsys.disabled():
        kills = sum(figures.counts[k] for k in keys if "killed" in k)
        print(f"\nsoak kill sweep ({elapsed_since(started)}): {kills} kills")
        print(figures.line("soak kill sweep", [*keys, "ready models checked"]))
        for key in sorted(k for k in figures.counts if "before its kill" in k):
            print(f"  {figures.counts[key]} x {key}")
        for problem in figures.problems()[:20]:
            print(f"  {problem}")
    assert figures.problems() == []


#: the faults the run draws from, with the argument each takes (bytes, an offset or seconds)
FAULTS: dict[str, Callable[[random.Random], float]] = {
    "reset": lambda rng: rng.randrange(0, 512 * KiB),
    "truncate": lambda rng: rng.randrange(0, 512 * KiB),
    "status503": lambda rng: rng.choice([0, 1]),
    "stall": lambda rng: rng.randrange(0, 256 * KiB),
    "bitflip": lambda rng: rng.randrange(0, 1 * MiB),
    "delay": lambda rng: rng.uniform(0.2, 2.0),
}


def storm(proxy: FaultProxy, figures: Figures, stop: threading.Event, rng: random.Random) -> None:
    """Queue a random fault every few hundred milliseconds; flipped bytes only in object bodies.

    The proxy's request log is cleared now and then, or a long run would hold it all.
    """
    last_clear = time.monotonic()
    while not stop.wait(rng.uniform(0.1, 0.5)):
        action = rng.choice(list(FAULTS))
        match = ".bin" if action == "bitflip" else ""
        if time.monotonic() - last_clear > 30:
            proxy.clear()
            last_clear = time.monotonic()
        proxy.add_fault(action, match, FAULTS[action](rng))  # type: ignore[arg-type]
        figures.count(f"fault {action}")


@pytest.mark.timeout(FAULT_RUN_S + MARGIN_S)
def test_concurrent_pullers_and_a_daemon_through_a_faulty_store_never_serve_a_wrong_model(
    tmp_path: Path,
    seaweed_admin: S3Env,
    seaweed_reader: S3Env,
    seaweed_bucket: str,
    proxy: FaultProxy,
    capsys: pytest.CaptureFixture[str],
) -> None:
    figures = Figures()
    rng = random.Random()
    cache = tmp_path / "cache"
    models = {f"mixed/m{i}/": model_files(200 + i, (3 + i % 3) * MiB) for i in range(6)}
    publish_all(figures, seaweed_admin.subprocess_env(), tmp_path, seaweed_bucket, models)
    expected = {f"{seaweed_bucket}/{p.rstrip('/')}": file_digests(f) for p, f in models.items()}
    uris = [f"s3://{seaweed_bucket}/{p}" for p in models]
    # Room for about half the models: pulls evict, and wait for models still in use.
    env = seaweed_reader.via(proxy.endpoint_url).subprocess_env() | {
        "MODELSYNC_PART_SIZE": "1Mi",
        "MODELSYNC_CACHE_MAX_BYTES": "24Mi",
        "MODELSYNC_IN_USE_GRACE": "3s",
        "MODELSYNC_READ_TIMEOUT": "3",
        "MODELSYNC_BACKOFF_FLOOR": "0.2",
        "MODELSYNC_RETRY_BUDGET": "90s",
        "MODELSYNC_ROOM_WAIT": "60s",
    }
    schedule = tmp_path / "schedule.yaml"
    schedule.write_text(schedule_text([("m0", uris[0], "always"), ("m1", uris[1], "always")]))
    cache.mkdir()
    daemon = Daemon(cache, schedule, env)
    stop = threading.Event()
    started = time.monotonic()

    def puller() -> None:
        while time.monotonic() - started < FAULT_RUN_S:
            uri = rng.choice(uris)
            code, _out, err = run(figures, env, "pull", uri, "--quiet", "--cache-dir", str(cache))
            figures.count(f"pulls exit {code}")
            if code != 0:
                figures.sample(f"exit {code}", err.strip()[-400:])
            if code not in (0, 5, 6, 7):
                figures.note("failures", f"pull exited {code}: {err.strip()[-300:]}")

    def checker() -> None:
        rounds = 0
        while not stop.wait(8):
            rounds += 1
            check_ready_models(figures, env, cache, expected)
            if rounds % 6 == 0:
                code, out, err = run(figures, env, "verify", "--full", "--cache-dir", str(cache))
                figures.count(f"verify --full exit {code}")
                if code != 0:
                    figures.note("failures", f"verify --full exited {code}: {out[-300:]} {err[-300:]}")

    threads = [threading.Thread(target=puller, name=f"puller-{i}") for i in range(3)]
    threads += [
        threading.Thread(target=storm, args=(proxy, figures, stop, rng), name="storm"),
        threading.Thread(target=checker, name="checker"),
    ]
    try:
        for thread in threads:
            thread.start()
        for thread in threads[:3]:
            thread.join()
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        code, stop_s = daemon.stop()
    log = daemon.log_path.read_text()
    if "Traceback" in log:
        figures.note("tracebacks", f"daemon log: {log[log.index('Traceback') - 200 :][:1500]}")
    if stop_s > 10:
        figures.note("hangs", f"the daemon took {stop_s:.1f} s to stop on SIGTERM")
    if code not in (0, 143):
        figures.note("failures", f"the daemon exited {code} on SIGTERM")
    check_ready_models(figures, env, cache, expected)
    daemon_pulls = sum(1 for entry in daemon.logs() if " is ready at " in str(entry.get("msg")))
    daemon_errors = sum(1 for entry in daemon.logs() if entry.get("level") == "error")

    pulls = sorted(k for k in figures.counts if k.startswith("pulls exit"))
    faults = sorted(k for k in figures.counts if k.startswith("fault "))
    verifies = sorted(k for k in figures.counts if k.startswith("verify"))
    with capsys.disabled():
        daemon_figures = f"daemon pulls {daemon_pulls}, daemon errors {daemon_errors}"
        print(f"\nsoak faults ({elapsed_since(started)}): {daemon_figures}")
        print(figures.line("soak faults", [*pulls, *verifies, *faults, "ready models checked"]))
        for what, text in sorted(figures.samples.items()):
            print(f"  a pull's {what}: {text}")
        for problem in figures.problems()[:20]:
            print(f"  {problem}")
    assert figures.counts["pulls exit 0"] > 0
    assert figures.problems() == []
