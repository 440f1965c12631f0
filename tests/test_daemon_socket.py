"""The daemon's socket as a shared resource: a hostile tenant cannot lock the others out.

A real daemon process; the hostile client is this test (uid 0) opening
hundreds of idle and malformed connections, the honest one a keyless tenant
pod of another uid in the cache's group (tests/test_tenant_pull.py's
`tenant`). Idle connections are closed after REQUEST_TIMEOUT_S, each uid holds
at most MAX_CONNECTIONS_PER_UID, malformed requests get one error line, and
the daemon's log holds no traceback.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from support.daemon import Daemon, schedule_text
from support.objects import payload, upload
from support.other_users import OtherUser
from support.s3env import S3Env
from support.waiting import wait_for
from test_tenant_pull import needs_mount_namespace, tenant

from modelsync.core.refs import parse_source
from modelsync.local_api.client import call
from modelsync.local_api.guard import (
    MAX_CONNECTIONS_PER_UID,
    MAX_REQUEST_BYTES,
    MAX_REQUEST_DEPTH,
    REQUEST_TIMEOUT_S,
    Admission,
    LogThrottle,
    shape_error,
)
from modelsync.local_api.protocol import socket_path

MiB = 1024 * 1024
ALLOWED = "s3://models/extra/m/r1/"
IDLE = 300
#: one of each kind of request that is no request, each sent many times
MALFORMED = [
    b"[" * 100_000 + b"\n",  # nested far past any limit, and longer than one
    b'{"op": ' * (MAX_REQUEST_DEPTH + 1) + b"\n",  # nested one level too deep, short
    b"x" * (MAX_REQUEST_BYTES + 10),  # no newline, over the size limit
    b"\x00\xff\xfe garbage\n",
    b'{"op": "pull", "model": 7}\n',
    b'{"op": "status"',  # half a request, never finished
]
#: a tenant's uid: another than the hostile test's, in the cache's group (the daemon runs as root)
TENANT_USER = OtherUser(10004, groups=(0,))


@pytest.fixture
def daemon(tmp_path: Path, moto_subprocess_s3_env: S3Env, start_daemon: Callable[..., Daemon]) -> Daemon:
    ref = parse_source(ALLOWED)
    upload(moto_subprocess_s3_env, ref.bucket, ref.prefix, {"weights.bin": payload(2 * MiB, 5)})
    schedule = tmp_path / "schedule.yaml"
    schedule.write_text(schedule_text([]))
    return start_daemon(schedule, moto_subprocess_s3_env.subprocess_env(), "--allow", "s3://models/extra/")


def connect(sock_path: Path) -> socket.socket:
    """A connection, once the daemon's backlog has room for it (a blocking connect waits for that)."""
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.connect(str(sock_path))
    client.settimeout(REQUEST_TIMEOUT_S + 10)
    return client


def answer(client: socket.socket) -> list[bytes]:
    """Everything the daemon sends until it hangs up, as lines."""
    data = b""
    try:
        while chunk := client.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass  # it hung up on a request it did not read to the end; what it said came first
    finally:
        client.close()
    return data.splitlines()


def send_malformed(sock_path: Path, request: bytes) -> list[bytes]:
    client = connect(sock_path)
    # refused (over the cap) or cut off (over the size) before all of it was sent
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        client.sendall(request)
    return answer(client)


def tracebacks(daemon: Daemon) -> list[dict[str, object]]:
    return [e for e in daemon.logs() if "traceback" in e or "Traceback" in str(e.get("msg"))]


@TENANT_USER.needs_the_checkout
@needs_mount_namespace
@pytest.mark.root
def test_hundreds_of_idle_and_malformed_connections_do_not_lock_out_a_keyless_tenant(
    tmp_path: Path, daemon: Daemon
) -> None:
    sock_path = socket_path(daemon.cache)
    home = tmp_path / "tenant-home"
    home.mkdir()
    started = time.monotonic()
    idle: list[socket.socket] = []
    try:
        idle += [connect(sock_path) for _ in range(IDLE)]
        with ThreadPoolExecutor(max_workers=16) as pool:
            replies = pool.map(lambda r: send_malformed(sock_path, r), MALFORMED * 20)
            view = Path("/mnt/model-cache")
            pulled = pool.submit(
                tenant, daemon.cache, home, "pull", ALLOWED, as_user=TENANT_USER.setpriv, view=view
            )
            done = pulled.result(timeout=120)
            answers = list(replies)
        # Each idle connection was answered: admitted ones timed out, the rest were refused at once.
        reading = time.monotonic()
        idle_answers = [json.loads(answer(client)[0]) for client in idle]
        answered_s = time.monotonic() - reading
    finally:
        for client in idle:
            client.close()

    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "/mnt/model-cache/models/extra/m/r1"
    assert (daemon.cache / "models/extra/m/r1/weights.bin").read_bytes() == payload(2 * MiB, 5)
    for lines in answers:
        assert len(lines) == 1, lines
        reply = json.loads(lines[0])
        assert reply["ok"] is False and reply["code"] in {"usage", "daemon_busy"}, reply
    assert answered_s < REQUEST_TIMEOUT_S + 5
    codes = [reply["code"] for reply in idle_answers]
    assert 0 < codes.count("usage") <= MAX_CONNECTIONS_PER_UID
    assert codes.count("usage") + codes.count("daemon_busy") == IDLE
    # With the idle ones gone, each malformed request is read, and refused for what it is.
    errors = [json.loads(send_malformed(sock_path, request)[0])["error"] for request in MALFORMED]
    assert f"more than {MAX_REQUEST_DEPTH} levels" in errors[1]
    assert "at most 64.0 KiB" in errors[0] and "at most 64.0 KiB" in errors[2]
    assert "not JSON" in errors[3]
    assert "'model': s3://" in errors[4]
    assert f"no whole request within {REQUEST_TIMEOUT_S:.0f} s" in errors[5]
    assert tracebacks(daemon) == []
    refused_lines = [e for e in daemon.logs() if e.get("code") == "daemon_busy"]
    refused = sum(int(str(e["refused"])) for e in refused_lines)
    elapsed_s = time.monotonic() - started
    print(f"{refused} refusals logged in {len(refused_lines)} lines over {elapsed_s:.1f} s")
    assert 0 < len(refused_lines) <= 2 + elapsed_s / 10, "refusals are logged a line per 10 s, with a count"


def open_descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_a_daemon_out_of_file_descriptors_logs_one_line_a_second_and_serves_again_once_they_free(
    daemon: Daemon,
) -> None:
    pid = daemon.process.pid
    limit = open_descriptors(pid) + 6
    subprocess.run(["prlimit", "--pid", str(pid), f"--nofile={limit}:{limit}"], check=True)
    sock_path = socket_path(daemon.cache)
    started = time.monotonic()
    held: list[socket.socket] = []
    try:
        held += [connect(sock_path) for _ in range(20)]  # the kernel queues them; the daemon accepts 6
        wait_for(
            lambda: any(e.get("code") == "accept_failed" for e in daemon.logs()),
            what="an accept() that failed for want of descriptors",
        )
    finally:
        for client in held:
            client.close()
    reply = call(sock_path, {"op": "status"}, timeout_s=REQUEST_TIMEOUT_S + 10)
    elapsed_s = time.monotonic() - started

    assert reply is not None and reply["ok"] is True
    failed = [e for e in daemon.logs() if e.get("code") == "accept_failed"]
    print(f"{len(failed)} accept_failed lines in {elapsed_s:.1f} s")
    assert len(failed) <= elapsed_s + 2, "a failing accept() must not spin"
    assert "Too many open files" in str(failed[0]["msg"])
    assert tracebacks(daemon) == []


def test_admission_caps_each_uid_and_the_total_and_frees_a_place_when_a_connection_ends() -> None:
    admission = Admission(max_total=3, max_per_uid=2)
    assert [admission.admit(1000), admission.admit(1000)] == [None, None]
    refused = admission.admit(1000)
    assert refused is not None and "uid 1000 already holds 2 connections" in refused
    assert admission.admit(1001) is None
    refused = admission.admit(1002)
    assert refused is not None and "already serves 3 connections" in refused
    admission.release(1000)
    assert admission.admit(1002) is None


def test_a_throttled_log_reports_the_first_event_at_once_and_the_rest_as_one_count_when_due() -> None:
    throttle = LogThrottle(every_s=10.0)
    assert throttle.due("uid", now=0.0) == 1
    assert [throttle.due("uid", now=t) for t in (1.0, 2.0, 3.0)] == [0, 0, 0]
    assert throttle.quiet_s("uid", now=3.0) == 7.0
    assert throttle.flush("uid", now=9.0) == 0
    assert throttle.flush("uid", now=10.0) == 3
    assert throttle.flush("uid", now=30.0) == 0, "nothing left to report"
    assert throttle.due("uid", now=30.0) == 1


@pytest.mark.parametrize(
    ("line", "refused"),
    [
        (b'{"op": "prefetch", "models": ["s3://b/p/"]}', False),
        (b'{"a": "[[[[[[[[[[[[[[[[[[[[[["}', False),  # brackets in a string do not count
        (b'{"a": "\\"[[[[[[[[[[[[[[[[[["}', False),  # nor after an escaped quote
        (b"[" * MAX_REQUEST_DEPTH + b"]" * MAX_REQUEST_DEPTH, False),
        (b"[" * (MAX_REQUEST_DEPTH + 1), True),
        (b'{"a": {"b": ' * 5 + b"1" + b"}}" * 5, True),
    ],
)
def test_nesting_is_judged_before_parsing_and_strings_do_not_count(line: bytes, refused: bool) -> None:
    assert (shape_error(line) is not None) == refused
