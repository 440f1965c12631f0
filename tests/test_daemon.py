"""The node daemon as a real subprocess against a moto server in its own process.

Schedules are written for each test with a cron window two to three minutes
ahead and a lead of ten minutes, so "prefetch now" happens at once (cron has
minute resolution). Ticks are 1 s and the start jitter is 0. Metrics are
scraped over HTTP and parsed with prometheus_client's parser, so values are
checked, not just names.

The loop's decisions are tested without a daemon: the queue's order, jitter,
backoff and foreground precedence as tables (test_daemon_queue.py), the loop's
sequencing with a fake pull (test_reconcile.py). These runs show them wired up.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import pytest
from support.cli import run_cli
from support.daemon import POOL, ConfigMapDir, Daemon, schedule_text
from support.faultproxy import FaultProxy
from support.objects import payload, upload
from support.s3env import S3Env
from support.waiting import wait_for

from modelsync.adapters.cache import STATE_DIR, Cache
from modelsync.core.refs import parse_source
from modelsync.core.units import format_bytes

MiB = 1024 * 1024


# ---- tests ----------------------------------------------------------------------------


def test_daemon_stages_a_model_before_its_window_and_reports_it_in_metrics(
    tmp_path: Path, moto_subprocess_s3_env: S3Env, start_daemon: Callable[..., Daemon]
) -> None:
    files = {"config.json": b"{}", "weights.bin": payload(3 * MiB, 1)}
    upload(moto_subprocess_s3_env, "models", "org/m1/r1/", files)
    schedule = tmp_path / "schedule.yaml"
    schedule.write_text(schedule_text([("m1", "s3://models/org/m1/r1/", "soon")]))
    daemon = start_daemon(schedule, moto_subprocess_s3_env.subprocess_env())

    ready = tmp_path / "cache/models/org/m1/r1"
    wait_for(lambda: (ready / "weights.bin").exists(), what="the model is staged")
    assert (ready / "weights.bin").read_bytes() == files["weights.bin"]
    wait_for(lambda: daemon.metric("modelsync_pull_duration_seconds_count") == 1, what="pull counted")

    assert daemon.get("/healthz")[0] == 200
    assert daemon.get("/readyz")[0] == 200
    assert daemon.get("/other")[0] == 404
    total = sum(len(d) for d in files.values())
    assert daemon.metric("modelsync_fetched_bytes_total") == total
    margin = daemon.metric(
        "modelsync_ready_before_window_seconds", model="models/org/m1/r1", name="m1", variant=""
    )
    assert margin is not None and 60 < margin < 200, "ready 1-3 minutes before the window opens"
    wait_for(
        lambda: daemon.metric("modelsync_models", state="prefetch", staged="true") == 1,
        what="the staged model is counted by state",
    )
    assert daemon.metric("modelsync_models", state="prefetch", staged="false") == 0
    assert daemon.metric("modelsync_cache_used_bytes") == total
    assert daemon.metric("modelsync_schedule_last_load_ok") == 1
    assert daemon.metric("modelsync_schedule_fits_budget") == 1
    reconciled = daemon.metric("modelsync_last_reconcile_timestamp_seconds")
    assert reconciled is not None and abs(time.time() - reconciled) < 10

    code, seconds = daemon.stop()
    assert code == 0 and seconds < 10
    assert not (tmp_path / "cache" / STATE_DIR / "daemon.sock").exists()


def test_daemon_reloads_a_swapped_schedule_and_keeps_the_last_good_one_when_the_next_is_bad(
    tmp_path: Path, moto_subprocess_s3_env: S3Env, start_daemon: Callable[..., Daemon]
) -> None:
    upload(moto_subprocess_s3_env, "models", "org/m2/r1/", {"w.bin": payload(MiB, 2)})
    configmap = ConfigMapDir(tmp_path / "etc")
    configmap.write(schedule_text([("m2", "s3://models/org/m2/r1/", "later")]))
    daemon = start_daemon(configmap.path, moto_subprocess_s3_env.subprocess_env())
    wait_for(lambda: daemon.get("/readyz")[0] == 200, what="ready")
    assert daemon.metric("modelsync_models", state="upcoming", staged="false") == 1

    configmap.write(schedule_text([("m2", "s3://models/org/m2/r1/", "soon")]))
    staged = tmp_path / "cache/models/org/m2/r1/w.bin"
    wait_for(staged.exists, what="the reloaded schedule is acted on")

    configmap.write("version: 1\nmodels:\n  - source: s3://models/org/m2/r1/\n    pools: [x]\n    bogus: 1\n")
    wait_for(
        lambda: daemon.metric("modelsync_schedule_load_errors_total", code="bad_schedule") == 1,
        what="the refused schedule is counted",
    )
    assert daemon.metric("modelsync_schedule_last_load_ok") == 0
    refused = daemon.wait_for_log(lambda e: e.get("level") == "error")
    assert refused["code"] == "bad_schedule"
    assert "schedule.yaml:5: models[0].bogus: unknown key" in str(refused["msg"])
    assert daemon.get("/readyz")[0] == 200, "the last good schedule is still in force"
    assert daemon.metric("modelsync_models", state="prefetch", staged="true") == 1
    assert daemon.stop()[0] == 0


def test_prefetch_goes_through_the_socket_and_a_concurrent_pull_attaches_without_a_second_download(
    tmp_path: Path, moto_subprocess_s3_env: S3Env, start_daemon: Callable[..., Daemon]
) -> None:
    size = 6 * MiB
    upload(moto_subprocess_s3_env, "models", "org/m3/r1/", {"weights.bin": payload(size, 3)})
    with FaultProxy(moto_subprocess_s3_env.endpoint_url) as proxy:
        env = moto_subprocess_s3_env.via(proxy.endpoint_url).subprocess_env()
        schedule = tmp_path / "schedule.yaml"
        schedule.write_text(schedule_text([]))
        daemon = start_daemon(
            schedule, env, "--max-bandwidth", "3Mi/s", "--part-size", "1Mi", "--allow", "s3://models/org/"
        )
        cache = ["--cache-dir", str(tmp_path / "cache")]

        queued = run_cli(env, "prefetch", "--no-wait", "models/org/m3/r1", *cache)
        assert queued.returncode == 0, queued.stderr
        assert "queued by the daemon" in queued.stderr
        wait_for(lambda: (daemon.metric("modelsync_fetched_bytes_total") or 0) > 0, what="the daemon pulls")

        pulled = run_cli(env, "pull", "s3://models/org/m3/r1/", "--quiet", *cache)
        assert pulled.returncode == 0, pulled.stderr
        path = tmp_path / "cache/models/org/m3/r1"
        assert pulled.stdout.strip().splitlines()[-1] == str(path)
        assert (path / "weights.bin").read_bytes() == payload(size, 3)
        assert proxy.bytes_sent("weights.bin") == size, "the second puller downloaded nothing"

        waited = run_cli(env, "prefetch", "s3://models/org/m3/r1/", *cache)
        assert waited.returncode == 0, waited.stderr
        assert waited.stdout.strip() == str(path)
    assert daemon.stop()[0] == 0


def test_daemon_stops_within_10s_of_sigterm_mid_pull_and_leaves_a_journal_to_resume(
    tmp_path: Path, moto_subprocess_s3_env: S3Env, start_daemon: Callable[..., Daemon]
) -> None:
    upload(moto_subprocess_s3_env, "models", "org/m4/r1/", {"weights.bin": payload(16 * MiB, 4)})
    schedule = tmp_path / "schedule.yaml"
    schedule.write_text(schedule_text([("m4", "s3://models/org/m4/r1/", "always")]))
    env = moto_subprocess_s3_env.subprocess_env()
    daemon = start_daemon(schedule, env, "--max-bandwidth", "2Mi/s", "--part-size", "1Mi")
    wait_for(lambda: (daemon.metric("modelsync_fetched_bytes_total") or 0) >= 2 * MiB, what="the pull runs")

    code, seconds = daemon.stop()
    assert code == 0
    assert seconds < 10
    staging = tmp_path / "cache" / STATE_DIR / "staging"
    journals = [p.name for p in staging.iterdir() if p.name.endswith(".journal")]
    assert journals, "a journal is left to resume from"
    assert not (tmp_path / "cache/models/org/m4/r1").exists()

    cache = str(tmp_path / "cache")
    resumed = run_cli(env, "pull", "s3://models/org/m4/r1/", "--quiet", "--cache-dir", cache)
    assert resumed.returncode == 0, resumed.stderr
    assert (tmp_path / "cache/models/org/m4/r1/weights.bin").read_bytes() == payload(16 * MiB, 4)


def test_daemon_stops_within_its_grace_of_sigterm_while_every_transfer_hangs(
    tmp_path: Path, moto_subprocess_s3_env: S3Env, start_daemon: Callable[..., Daemon]
) -> None:
    """Every GET stalls mid-body and the read timeout is 30 s: only shutting the sockets down stops it."""
    upload(moto_subprocess_s3_env, "models", "org/hang/r1/", {"weights.bin": payload(8 * MiB, 9)})
    schedule = tmp_path / "schedule.yaml"
    schedule.write_text(schedule_text([("hang", "s3://models/org/hang/r1/", "always")]))
    with FaultProxy(moto_subprocess_s3_env.endpoint_url) as proxy:
        proxy.add_fault("stall", match="weights.bin", arg=64 * 1024, times=10_000)
        env = moto_subprocess_s3_env.via(proxy.endpoint_url).subprocess_env()
        env["MODELSYNC_READ_TIMEOUT"] = "30"
        daemon = start_daemon(schedule, env, "--part-size", "1Mi", "--concurrency", "4")

        def hanging() -> int:
            return len([r for r in proxy.requests("weights.bin", "GET") if r.body_bytes_sent and not r.done])

        wait_for(lambda: hanging() >= 4, what="every transfer hangs")
        time.sleep(0.3)

        code, seconds = daemon.stop()

    print(f"daemon exited {seconds:.2f} s after SIGTERM with every transfer hanging")
    assert code == 0
    assert seconds < 8.0  # LoopConfig.stop_grace_s
    still_pulling = [e for e in daemon.logs() if "still being pulled" in str(e.get("msg"))]
    assert still_pulling == [], "the pull stopped within the grace"
    staging = tmp_path / "cache" / STATE_DIR / "staging"
    assert [p for p in staging.iterdir() if p.name.endswith(".journal")]


def test_daemon_stays_healthy_and_ready_while_s3_is_unreachable(
    tmp_path: Path, start_daemon: Callable[..., Daemon]
) -> None:
    schedule = tmp_path / "schedule.yaml"
    schedule.write_text(schedule_text([("m5", "s3://models/org/m5/r1/", "always")]))
    env = S3Env("http://127.0.0.1:9").subprocess_env()  # the discard port: nothing listens
    daemon = start_daemon(schedule, env)
    wait_for(
        lambda: (daemon.metric("modelsync_pull_failures_total", code="remote_unavailable") or 0) >= 1,
        timeout_s=30,
        what="the failed attempt is counted",
    )
    assert daemon.get("/healthz")[0] == 200
    assert daemon.get("/readyz")[0] == 200
    failure = daemon.wait_for_log(lambda e: e.get("level") == "error")
    assert failure["code"] == "remote_unavailable" and failure["model"] == "m5"
    assert daemon.stop()[0] == 0


def test_daemon_logs_a_missing_aws_profile_as_a_configuration_error_not_a_bug(
    tmp_path: Path, start_daemon: Callable[..., Daemon]
) -> None:
    schedule = tmp_path / "schedule.yaml"
    schedule.write_text(schedule_text([("m6", "s3://models/org/m6/r1/", "always")]))
    (tmp_path / "aws-config").write_text("[profile known]\nregion = us-east-1\n")
    env = S3Env("http://127.0.0.1:9").subprocess_env()
    env.update({"AWS_PROFILE": "nosuchprofile", "AWS_CONFIG_FILE": str(tmp_path / "aws-config")})
    daemon = start_daemon(schedule, env)

    failure = daemon.wait_for_log(lambda e: e.get("level") == "error", timeout_s=30)

    assert failure["code"] == "bad_config" and failure["model"] == "m6"
    assert "AWS profile 'nosuchprofile'" in str(failure["msg"])
    assert not any("a bug" in str(e.get("msg")) or "Traceback" in str(e) for e in daemon.logs())


def test_an_unsigned_model_the_schedule_requires_signed_is_refused_counted_and_logged(
    tmp_path: Path, start_daemon: Callable[..., Daemon], moto_subprocess_s3_env: S3Env
) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    public_key = tmp_path / "release.pub.pem"
    public_key.write_bytes(
        ec.generate_private_key(ec.SECP256R1())
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    upload(moto_subprocess_s3_env, "models", "org/m9/r1/", {"w.bin": payload(MiB, 9)})
    schedule = tmp_path / "schedule.yaml"
    schedule.write_text(
        schedule_text([("m9", "s3://models/org/m9/r1/", "always")])
        + f"    signature: {{mode: required, public_keys: [{public_key}]}}\n"
    )
    daemon = start_daemon(schedule, moto_subprocess_s3_env.subprocess_env())

    wait_for(
        lambda: (daemon.metric("modelsync_pull_failures_total", code="unsigned_model") or 0) >= 1,
        timeout_s=30,
        what="the refusal is counted",
    )
    assert (daemon.metric("modelsync_verification_failures_total") or 0) >= 1
    failure = daemon.wait_for_log(lambda e: e.get("code") == "unsigned_model")
    assert failure["model"] == "m9" and "is unsigned" in str(failure["msg"])
    assert not (tmp_path / "cache/models/org/m9/r1").exists()
    assert daemon.stop()[0] == 0


def test_prefetch_without_a_daemon_pulls_the_model_itself_as_a_foreground_pull(
    tmp_path: Path, moto_subprocess_s3_env: S3Env
) -> None:
    upload(moto_subprocess_s3_env, "models", "org/m6/r1/", {"w.bin": payload(MiB, 6)})
    cache = tmp_path / "cache"
    result = run_cli(
        moto_subprocess_s3_env.subprocess_env(), "prefetch", "models/org/m6/r1", "--cache-dir", str(cache)
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(cache / "models/org/m6/r1")
    assert (cache / "models/org/m6/r1/w.bin").read_bytes() == payload(MiB, 6)


def budget_env(env: S3Env, budget: str) -> dict[str, str]:
    """A cache budget, and an in-use grace short enough that recency protects nothing in a test."""
    return {**env.subprocess_env(), "MODELSYNC_CACHE_MAX_BYTES": budget, "MODELSYNC_IN_USE_GRACE": "1s"}


def stage_with_pull(env: dict[str, str], cache: Path, source: str) -> None:
    pulled = run_cli(env, "pull", source, "--quiet", "--cache-dir", str(cache))
    assert pulled.returncode == 0, pulled.stderr
    # used before the in-use grace: only the schedule can protect it now
    Cache(cache).touch(parse_source(source), at=time.time() - 60)


def test_daemon_evicts_a_model_past_its_keep_time_to_stage_the_next_and_counts_the_eviction(
    tmp_path: Path, moto_subprocess_s3_env: S3Env, start_daemon: Callable[..., Daemon]
) -> None:
    for name in ("a", "b"):
        upload(moto_subprocess_s3_env, "models", f"org/{name}/r1/", {"w.bin": payload(2 * MiB, ord(name))})
    env = budget_env(moto_subprocess_s3_env, "3Mi")  # room for one model of two
    cache = tmp_path / "cache"
    stage_with_pull(env, cache, "s3://models/org/a/r1/")
    schedule = tmp_path / "schedule.yaml"
    schedule.write_text(
        schedule_text([("a", "s3://models/org/a/r1/", "closed"), ("b", "s3://models/org/b/r1/", "soon")])
    )
    daemon = start_daemon(schedule, env)

    wait_for(lambda: (cache / "models/org/b/r1/w.bin").exists(), what="b is staged")
    assert not (cache / "models/org/a/r1").exists(), "a made room for b"
    wait_for(lambda: daemon.metric("modelsync_evictions_total") == 1, what="the eviction is counted")
    evicted = daemon.wait_for_log(lambda e: "evicted" in e)
    assert evicted["evicted"] == ["models/org/a/r1"] and evicted["model"] == "b"
    assert daemon.metric("modelsync_fetched_bytes_total") == 2 * MiB
    wait_for(lambda: daemon.metric("modelsync_cache_used_bytes") == 2 * MiB, what="the cache is re-read")
    assert daemon.metric("modelsync_schedule_fits_budget") == 1
    assert "_created" not in daemon.get("/metrics")[1], "no _created twin series"
    assert daemon.stop()[0] == 0


def test_daemon_never_evicts_a_model_within_its_keep_time_and_reports_the_misfit_without_thrashing(
    tmp_path: Path, moto_subprocess_s3_env: S3Env, start_daemon: Callable[..., Daemon]
) -> None:
    for name in ("a", "b"):
        upload(moto_subprocess_s3_env, "models", f"org/{name}/r1/", {"w.bin": payload(2 * MiB, ord(name))})
    env = budget_env(moto_subprocess_s3_env, "3Mi")
    cache = tmp_path / "cache"
    stage_with_pull(env, cache, "s3://models/org/a/r1/")
    schedule = tmp_path / "schedule.yaml"
    schedule.write_text(
        schedule_text([("a", "s3://models/org/a/r1/", "kept"), ("b", "s3://models/org/b/r1/", "soon")])
    )
    daemon = start_daemon(schedule, env)

    misfit = daemon.wait_for_log(lambda e: e.get("code") == "over_budget")
    assert misfit["level"] == "error"
    assert daemon.metric("modelsync_schedule_fits_budget") == 0
    def failures() -> list[dict[str, object]]:
        return [e for e in daemon.logs() if e.get("code") == "disk_full"]

    wait_for(lambda: len(failures()) >= 2, "a retry")
    first, second = failures()[:2]
    assert first["model"] == second["model"] == "b"
    # the backoff's arithmetic is core/queue.py's (test_daemon_queue.py); here, that the loop applies it
    assert 0.5 <= float(first["retry_in_s"]) <= 1.0 and 1.0 <= float(second["retry_in_s"]) <= 2.0
    assert (daemon.metric("modelsync_pull_failures_total", code="disk_full") or 0) >= 2
    assert (cache / "models/org/a/r1/w.bin").exists(), "a is within its keep time"
    assert not (cache / "models/org/b/r1").exists()
    assert daemon.metric("modelsync_evictions_total") == 0

    plan = run_cli(env, "plan", "--schedule", str(schedule), "--pool", POOL, "--cache-dir", str(cache))
    assert plan.returncode == 0, plan.stderr
    assert "fits the budget: NO" in plan.stdout
    assert daemon.stop()[0] == 0


def test_a_foreground_pull_pauses_the_daemons_prefetch_which_then_resumes_from_its_journal(
    tmp_path: Path, moto_subprocess_s3_env: S3Env, start_daemon: Callable[..., Daemon]
) -> None:
    size = 10 * MiB
    upload(moto_subprocess_s3_env, "models", "org/slow/r1/", {"slow.bin": payload(size, 7)})
    upload(moto_subprocess_s3_env, "models", "org/fg/r1/", {"fg.bin": payload(3 * MiB, 8)})
    cache = tmp_path / "cache"
    with FaultProxy(moto_subprocess_s3_env.endpoint_url) as proxy:
        env = moto_subprocess_s3_env.via(proxy.endpoint_url).subprocess_env()
        schedule = tmp_path / "schedule.yaml"
        schedule.write_text(schedule_text([("slow", "s3://models/org/slow/r1/", "always")]))
        # one part at a time, so the journal holds every part finished before the pause
        daemon = start_daemon(
            schedule, env, "--max-bandwidth", "2Mi/s", "--part-size", "1Mi", "--concurrency", "1"
        )
        wait_for(lambda: (daemon.metric("modelsync_fetched_bytes_total") or 0) >= 2 * MiB, what="prefetch")

        foreground = subprocess.Popen(
            [sys.executable, "-m", "modelsync", "pull", "s3://models/org/fg/r1/", "--quiet",
             "--max-bandwidth", "1Mi", "--cache-dir", str(cache)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        try:
            wait_for(lambda: daemon.metric("modelsync_prefetch_paused") == 1, what="the prefetch pauses")
            daemon.wait_for_log(lambda e: "resumes later" in str(e.get("msg")))
            paused_at = daemon.metric("modelsync_fetched_bytes_total")
            time.sleep(0.7)
            assert daemon.metric("modelsync_fetched_bytes_total") == paused_at, "nothing fetched while paused"
            assert daemon.metric("modelsync_prefetch_paused") == 1 and foreground.poll() is None
            out, err = foreground.communicate(timeout=30)
        finally:
            if foreground.poll() is None:
                foreground.kill()
                foreground.communicate()
        assert foreground.returncode == 0, err
        assert out.strip() == str(cache / "models/org/fg/r1")

        wait_for(lambda: (cache / "models/org/slow/r1/slow.bin").exists(), what="the prefetch resumes")
        assert (cache / "models/org/slow/r1/slow.bin").read_bytes() == payload(size, 7)
        # the pause ends on the daemon's first tick after the foreground pull's marker is gone,
        # which under load can come after the prefetch's last part landed
        wait_for(lambda: daemon.metric("modelsync_prefetch_paused") == 0, what="the pause ends")
        # a refetch from scratch would add the 2+ MiB fetched before the pause; a resume
        # repeats at most the one part that was in flight
        assert proxy.bytes_sent("slow.bin") <= size + MiB
    assert daemon.stop()[0] == 0


def shared_revisions(env: S3Env) -> tuple[int, int]:
    """Two revisions of one model that share everything but config.json, as the issue's cache did.

    Returns the bytes the cache holds once both are pulled (the shared file once) and
    the size of one config.json.
    """
    weights = payload(4 * MiB, 7)
    configs = {rev: json.dumps({"revision": rev, "pad": "x" * 80}).encode() for rev in ("r1", "r2")}
    for rev, config in configs.items():
        upload(env, "models", f"org/m/{rev}/", {"weights.bin": weights, "config.json": config})
    config_bytes = len(configs["r1"])
    return len(weights) + 2 * config_bytes, config_bytes


def test_ls_plan_evict_and_the_daemon_agree_on_revisions_that_share_files(
    tmp_path: Path, moto_subprocess_s3_env: S3Env, start_daemon: Callable[..., Daemon]
) -> None:
    used, config_bytes = shared_revisions(moto_subprocess_s3_env)
    env = budget_env(moto_subprocess_s3_env, "5Mi")
    cache = tmp_path / "cache"
    for rev in ("r1", "r2"):
        stage_with_pull(env, cache, f"s3://models/org/m/{rev}/")
    schedule = tmp_path / "schedule.yaml"
    schedule.write_text(schedule_text([("m", "s3://models/org/m/r2/", "soon")]))
    at = ("--cache-dir", str(cache))

    def plan(budget: str) -> dict[str, object]:
        result = run_cli(env, "plan", "--schedule", str(schedule), "--pool", POOL, "--offline",
                         "--json", "--budget", budget, *at)
        assert result.returncode == 0, result.stderr
        doc: dict[str, object] = json.loads(result.stdout)
        return doc

    listed = run_cli(env, "ls", "--json", *at)
    assert json.loads(listed.stdout)["totals"]["used_bytes"] == used
    assert run_cli(env, "ls", *at).stdout.splitlines()[-1].startswith(
        f"2 models, {format_bytes(used)} used of a 5.0 MiB budget,"
    )
    roomy = plan("5Mi")
    assert (roomy["used_bytes"], roomy["fits"], roomy["evict"]) == (used, True, [])

    # Over by half a config.json: evicting r1 frees exactly its config.json, and says so.
    tight = plan(str(used - config_bytes // 2))
    assert (tight["used_bytes"], tight["fits"], tight["evict"]) == (used, True, ["models/org/m/r1"])
    assert tight["eviction"]["freed_bytes"] == config_bytes  # type: ignore[index]
    dry = run_cli(env, "evict", "models/org/m/r1", "--dry-run", *at)
    assert dry.stdout.splitlines()[0] == f"evict 1 model, freeing {format_bytes(config_bytes)}"

    # Over by two config.json files: r1 cannot free that much, and r2 is what the schedule wants.
    short = plan("4Mi")
    summary = str(short["eviction"]["summary"])  # type: ignore[index]
    assert short["fits"] is False
    assert summary.startswith(
        f"cannot free {format_bytes(2 * config_bytes)}: evicting every eligible model frees only "
        f"{format_bytes(config_bytes)}; protected: models/org/m/r2 (the schedule needs it: prefetch on m)"
    ), summary

    over_ls = run_cli({**env, "MODELSYNC_CACHE_MAX_BYTES": "4Mi"}, "ls", *at).stdout.splitlines()[-1]
    assert f"used of a 4.0 MiB budget (over by {format_bytes(2 * config_bytes)})," in over_ls

    daemon = start_daemon(schedule, env)
    wait_for(lambda: daemon.metric("modelsync_cache_used_bytes") == used, what="the cache is counted")
    assert daemon.metric("modelsync_schedule_fits_budget") == 1
    assert daemon.metric("modelsync_cache_budget_bytes") == 5 * MiB
    assert not [e for e in daemon.logs() if e.get("code") == "over_budget"]
    assert daemon.stop()[0] == 0

    over = start_daemon(schedule, {**env, "MODELSYNC_CACHE_MAX_BYTES": "4Mi"})
    misfit = over.wait_for_log(lambda e: e.get("code") == "over_budget")
    assert misfit["msg"] == f"cache budget: {summary}"
    assert over.metric("modelsync_schedule_fits_budget") == 0
    assert over.metric("modelsync_cache_used_bytes") == used
    assert over.stop()[0] == 0


def test_the_daemons_refresh_checks_do_not_count_as_uses_of_a_model(
    tmp_path: Path, moto_subprocess_s3_env: S3Env, start_daemon: Callable[..., Daemon]
) -> None:
    upload(moto_subprocess_s3_env, "models", "org/r/r1/", {"w.bin": payload(MiB, 9)})
    env = budget_env(moto_subprocess_s3_env, "10Mi")
    cache = tmp_path / "cache"
    stage_with_pull(env, cache, "s3://models/org/r/r1/")
    used_marker = next((cache / STATE_DIR / "used").iterdir())
    hours_ago = time.time() - 5 * 3600
    os.utime(used_marker, (hours_ago, hours_ago))
    schedule = tmp_path / "schedule.yaml"
    schedule.write_text(schedule_text([("r", "s3://models/org/r/r1/", "soon")]))

    daemon = start_daemon(schedule, env, "--refresh", "1s")
    # two checks that ended, one after the other (one pull at a time)
    wait_for(lambda: sum("unchanged at its source" in str(e.get("msg")) for e in daemon.logs()) >= 2,
               what="two refresh checks")

    assert abs(used_marker.stat().st_mtime - hours_ago) < 1
    listed = json.loads(run_cli(env, "ls", "--json", "--cache-dir", str(cache)).stdout)
    last_used = datetime.fromisoformat(listed["models"][0]["last_used"]).timestamp()
    assert last_used == pytest.approx(hours_ago, abs=1)
    assert daemon.stop()[0] == 0
