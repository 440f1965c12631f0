"""The benchmark's pieces work: its nginx endpoint behaves like the S3 data plane, its loop mounts
clean up, and the harness runs end to end (a smoke run; performance is never asserted)."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.waiting import wait_for

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the bench package
from bench import REPO
from bench.fsinfo import fs_type, loop_mount, why_not
from bench.nginx import NginxEndpoint, find_nginx, nginx_etag

pytestmark = pytest.mark.skipif(find_nginx() is None, reason="nginx is not installed")

BODY = bytes(range(256)) * 4096  # 1 MiB


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NginxEndpoint]:
    root = tmp_path_factory.mktemp("s3")
    (root / "bucket" / "model").mkdir(parents=True)
    (root / "bucket" / "model" / "weights.bin").write_bytes(BODY)
    with NginxEndpoint(root, access_log=True) as ep:
        yield ep


def request(
    ep: NginxEndpoint, method: str, path: str, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", ep.port, timeout=5)
    try:
        conn.request(method, path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def etag_of(ep: NginxEndpoint) -> str:
    return nginx_etag((ep.root / "bucket" / "model" / "weights.bin").stat())


def test_get_and_head_carry_size_and_etag(endpoint: NginxEndpoint) -> None:
    status, headers, body = request(endpoint, "GET", "/bucket/model/weights.bin")
    assert (status, body) == (200, BODY)
    assert headers["etag"] == f'"{etag_of(endpoint)}"'
    status, headers, body = request(endpoint, "HEAD", "/bucket/model/weights.bin")
    assert (status, body, headers["content-length"]) == (200, b"", str(len(BODY)))


def test_range_with_matching_if_match_is_206(endpoint: NginxEndpoint) -> None:
    status, headers, body = request(
        endpoint, "GET", "/bucket/model/weights.bin",
        {"Range": "bytes=1000-1999", "If-Match": f'"{etag_of(endpoint)}"'},
    )
    assert (status, body) == (206, BODY[1000:2000])
    assert headers["content-range"] == f"bytes 1000-1999/{len(BODY)}"


def test_range_with_stale_or_unquoted_if_match_is_412(endpoint: NginxEndpoint) -> None:
    """nginx compares If-Match literally: the ETag must be sent with its quotes."""
    for value in ('"0-1"', etag_of(endpoint)):
        status, _, _ = request(
            endpoint, "GET", "/bucket/model/weights.bin",
            {"Range": "bytes=0-9", "If-Match": value},
        )
        assert status == 412, value


def test_writes_are_refused_and_directories_are_not_objects(endpoint: NginxEndpoint) -> None:
    for method in ("PUT", "DELETE", "POST"):
        assert request(endpoint, method, "/bucket/model/weights.bin")[0] == 403
    assert request(endpoint, "HEAD", "/bucket/model")[0] == 404
    assert request(endpoint, "GET", "/bucket/missing.bin")[0] == 404


def test_bucket_root_serves_list_objects_v2(endpoint: NginxEndpoint) -> None:
    status, headers, body = request(endpoint, "GET", "/bucket?list-type=2&prefix=model/")
    assert status == 200
    assert headers["content-type"] == "application/xml"
    assert b"<Key>model/weights.bin</Key>" in body
    assert f"<Size>{len(BODY)}</Size>".encode() in body
    assert f"<ETag>&quot;{etag_of(endpoint)}&quot;</ETag>".encode() in body


def test_access_log_counts_requests(endpoint: NginxEndpoint) -> None:
    """nginx writes the line as it finalises the request, which can be after the client has
    its answer: the count is waited for, then must not overshoot. The earlier tests' lines may
    still be on their way too, so the count is taken once the log has stood still."""
    before = endpoint.settled_request_count()
    request(endpoint, "HEAD", "/bucket/model/weights.bin")
    wait_for(lambda: endpoint.request_count() >= before + 1, "the HEAD in the access log", timeout_s=5)
    assert endpoint.settled_request_count() == before + 1


def test_access_log_times_each_request_and_marks_ranged_gets(endpoint: NginxEndpoint) -> None:
    """What the cold-start probe reads: epoch time, request line, whether it asked for a range."""
    before, seen = time.time(), len(endpoint.requests())
    request(endpoint, "GET", "/bucket/model/weights.bin", {"Range": "bytes=0-9"})
    request(endpoint, "GET", "/bucket/model/weights.bin")
    wait_for(lambda: len(endpoint.requests()) >= seen + 2, "both GETs in the access log", timeout_s=5)
    *_, (ranged_at, line, ranged), (_, _, plain) = endpoint.requests()
    assert before - 1 <= ranged_at <= time.time() + 1
    assert line.startswith("GET /bucket/model/weights.bin") and ranged and not plain


@pytest.mark.parametrize("kind", ["xfs", "ext4"])
def test_loop_mount_makes_a_fresh_file_system_and_removes_it(kind: str, tmp_path: Path) -> None:
    if reason := why_not(kind):
        pytest.skip(reason)
    with loop_mount(kind, 512 * 1024 * 1024, tmp_path) as mount:
        (mount / "probe").write_bytes(b"x")
        assert fs_type(mount) == kind
    assert not mount.exists() and list(tmp_path.iterdir()) == []


def test_each_round_starts_one_contender_further_along(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever slows a fresh destination's first run must not fall on one contender every round."""
    from bench import harness

    ran: list[str] = []

    def measure(argv: list[str], env: dict[str, str], **_kw: object) -> harness.Measured:
        ran.append(argv[0])
        return harness.Measured(1.0, 0.0, 0.5, 0.1, 10.0, 0, "", "")

    monkeypatch.setattr(harness, "measure", measure)
    monkeypatch.setattr(harness, "verify", lambda *_a, **_kw: None)
    points = [harness.Point("case", "", name, [name], {}, (), tmp_path / name) for name in "ABC"]
    runs = list(harness.run_points(points, 4, tmp_path))
    assert ran == list("ABC" "BCA" "CAB" "ABC")
    assert [r.round for r in runs] == [1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4]


def test_the_bench_harness_runs_and_times_the_cold_start(tmp_path: Path) -> None:
    """A smoke run of scripts/bench: modelsync alone, a 64 KiB-file cold pull; no timing asserted."""
    done = subprocess.run(
        [str(REPO / "scripts" / "bench"), "--small", "--rounds", "1", "--only", "cold-64m",
         "--dest", "tmpfs", "--endpoint", "nginx", "--contenders", "modelsync",
         "--cache-dir", str(tmp_path / "cache"), "--results-dir", str(tmp_path / "results")],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "first ranged GET after" in done.stdout
    assert len(list((tmp_path / "results").glob("*.json"))) == 1


def test_the_bench_measures_two_source_trees_as_rows_of_their_own(tmp_path: Path) -> None:
    """`--variant NAME=TREE` twice: each tree a modelsync row, interleaved, ratios to the first."""
    done = subprocess.run(
        [str(REPO / "scripts" / "bench"), "--small", "--rounds", "1", "--only", "small-files",
         "--dest", "tmpfs", "--endpoint", "nginx", "--contenders", "modelsync",
         "--variant", f"a={REPO}", "--variant", f"b={REPO}",
         "--cache-dir", str(tmp_path / "cache"), "--results-dir", str(tmp_path / "results")],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (record,) = (tmp_path / "results").glob("*.json")
    kept = json.loads(record.read_text())
    rows = {row["contender"]: row for row in kept["summary"]}
    assert set(rows) == {"modelsync@a", "modelsync@b"}
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True, check=True).stdout.strip()
    assert kept["versions"]["modelsync@a"].startswith(head[:7])  # each tree's commit, by row
    assert rows["modelsync@a"]["time_vs_modelsync"] == 1.0
    assert rows["modelsync@b"]["ok_runs"] == 1 and rows["modelsync@b"]["time_vs_modelsync"] > 0


def test_the_signature_benchmark_pulls_unsigned_and_signed_and_states_the_budget(tmp_path: Path) -> None:
    """A smoke run of scripts/bench signature on tmpfs; its record, never its timing, is checked."""
    done = subprocess.run(
        [str(REPO / "scripts" / "bench"), "signature", "--small", "--rounds", "1", "--dest", "tmpfs",
         "--cache-dir", str(tmp_path / "cache"), "--results-dir", str(tmp_path / "results")],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "signed ÷ unsigned wall time" in done.stdout
    (path,) = (tmp_path / "results").glob("signature-*.json")
    runs = json.loads(path.read_text())["runs"]
    assert sorted(r["label"] for r in runs) == ["signed", "unsigned"]
    assert all(r["error"] is None and r["nginx_cpu_s"] >= 0 for r in runs)
    # the source is read again before each run: fincore finds it cached (a tiny set, just read)
    assert all(r["source_cached"] is None or r["source_cached"] > 0.5 for r in runs)


def test_the_ceiling_counts_lock_samples_by_the_deepest_modelsync_frame(tmp_path: Path) -> None:
    from bench.ceiling import read_raw

    raw = tmp_path / "spy.txt"
    raw.write_text(
        "<module> (modelsync/__main__.py:5);run (modelsync/engine/pull.py:40);"
        "recv (socket.py:10) 7\n"
        "<module> (modelsync/__main__.py:5);feed (/x/modelsync/adapters/digest.py:82) 3\n"
        "<module> (runpy.py:1);exec_module (<frozen importlib._bootstrap_external>:9) 2\n"
        "not a sample line\n"
    )
    total, frames = read_raw(raw)
    assert total == 12
    assert frames == {"engine.pull.run": 7, "adapters.digest.feed": 3,
                      "(outside modelsync: interpreter start-up, imports, libraries)": 2}


def test_the_ceiling_reads_the_pulls_ready_path_past_py_spys_own_lines() -> None:
    from bench.ceiling import printed_path

    stdout = (
        "py-spy> Sampling process 200 times a second. Press Control-C to exit.\n\n"
        "/dest/cache/models/org/m/r1\n\n"
        "py-spy> Stopped sampling because process exited\n"
        "py-spy> Wrote raw flamegraph data to '/w/spy.txt'. Samples: 38 Errors: 5\n"
    )
    assert printed_path(stdout) == Path("/dest/cache/models/org/m/r1")
    assert printed_path("py-spy> Stopped sampling because process exited\n") is None


def test_the_ceilings_slope_counts_the_signature_bundles_check_as_start_up() -> None:
    from bench.ceiling import RATE_HZ, Pair, Sample, slopes
    from bench.data import DataSet

    def pulled(size: str, steady: int, bundle: int) -> Sample:
        frames = {"engine.pull.run": steady, "adapters.oms.verify_bundle": bundle}
        return Sample("main", "tmpfs-signed", size, 1, (steady + bundle) / RATE_HZ, 1.0, 2.0, frames)

    pair = Pair(DataSet("big", ()), DataSet("small", ()), 6.0, 2.0)
    # the bundle's check held the lock 0.9 s in the small pull and 0.4 s in the big one
    samples = [pulled("big", 120, 80), pulled("small", 40, 180)]
    ((per_gib, startup_s, load, big_alone),) = slopes(samples, "main", "tmpfs-signed", pair)
    assert per_gib == pytest.approx((120 - 40) / RATE_HZ / 4)  # 0.10 s/GiB; -0.025 with the check
    assert startup_s == pytest.approx((40 + 180) / RATE_HZ - per_gib * 2)  # the check stays in the start-up
    assert load == 2.0
    assert big_alone == pytest.approx((120 + 80) / RATE_HZ / 6)  # everything the big pull held, per GiB


def test_a_bench_record_says_which_cpu_kernel_mitigations_and_interpreter_speed_it_ran_on() -> None:
    from bench.harness import machine_info

    info = machine_info()
    assert info["cpu_model"] and info["kernel"]
    assert isinstance(info["mitigations"], dict)
    assert "Not affected" not in info["mitigations"].values()
    assert isinstance(info["interpreter_loop_ms"], float) and info["interpreter_loop_ms"] > 0
