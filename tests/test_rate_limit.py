"""A pull's bandwidth cap: the token bucket's depth and the receive buffers that keep the store's
egress following the cap (docs/schedule.md, "The pool plan against a measured pool")."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from modelsync.adapters.http.conns import Connections
from modelsync.adapters.http.rate_limit import TokenBucket, capped_read_bytes
from modelsync.adapters.http.route import Endpoint

MiB = 1024 * 1024


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_a_capped_pull_starts_at_its_cap_and_after_a_pause_bursts_a_tenth_of_a_second() -> None:
    time = FakeTime()
    bucket = TokenBucket(4 * MiB, clock=time.clock, sleep=time.sleep)
    bucket.consume(MiB)  # no second of tokens to start with: a quarter of a second to wait
    assert time.slept == [pytest.approx(0.25)]

    time.now += 60.0  # a minute without reading: the bucket holds a tenth of a second
    bucket.consume(MiB)
    assert time.slept[1:] == [pytest.approx(0.25 - 0.1)]


def test_the_cap_holds_over_time_whatever_the_read_sizes() -> None:
    time = FakeTime()
    bucket = TokenBucket(4 * MiB, clock=time.clock, sleep=time.sleep)
    for size in [MiB, 64 * 1024, 3 * MiB, 1, 512 * 1024] * 20:
        bucket.consume(size)
    read = 20 * (MiB + 64 * 1024 + 3 * MiB + 1 + 512 * 1024)
    assert time.now == pytest.approx(read / (4 * MiB))  # exactly the cap: it started empty


@pytest.mark.parametrize(
    ("rate", "connections", "expected"),
    [
        (3686 * 1024, 8, 64 * 1024),  # the fleet test's cap: 46 KiB, but a response head must fit
        (16 * MiB, 8, int(16 * MiB / 8 * 0.1)),  # a tenth of a second of each connection's share
        (80 * MiB, 8, MiB),  # up to a MiB per connection
        (100 * MiB, 8, None),  # beyond: a short burst anyway, leave it to the kernel
        (10 * MiB, 0, MiB),
    ],
)
def test_each_connection_of_a_capped_pull_reads_and_buffers_a_tenth_of_a_second_of_its_share(
    rate: int, connections: int, expected: int | None
) -> None:
    assert capped_read_bytes(rate, connections) == expected


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield server


@pytest.mark.parametrize("wanted", [None, 128 * 1024])
def test_connections_set_the_receive_buffer_they_are_given(
    listener: socket.socket, wanted: int | None
) -> None:
    port = listener.getsockname()[1]
    conns = Connections(
        ssl_context=None,
        connect_timeout_s=2,
        read_timeout_s=2,
        wait_all=True,
        proxy_for=lambda _url: None,
        receive_buffer_bytes=wanted,
    )
    try:
        sock = conns.get(Endpoint(tls=False, host="127.0.0.1", port=port, netloc=f"127.0.0.1:{port}")).sock
        size = sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
    finally:
        conns.close()
    if wanted is None:
        assert size >= 64 * 1024  # the kernel's default, tuned as it goes
    else:
        assert size == 2 * wanted  # Linux doubles it for its bookkeeping
