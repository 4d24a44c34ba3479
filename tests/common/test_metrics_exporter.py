"""The metrics port's HTTP core (sans-I/O) and its Trio server's bounds (common/metrics/exporter.py)."""

from __future__ import annotations

import functools

import pytest
import trio
from prometheus_client import CollectorRegistry, Counter

from common.metrics.exporter import ExporterLimits, MetricsExchange, run_metrics_server

BODY = b"# a rendering\n"


def exchange(max_header_bytes: int = 8192) -> MetricsExchange:
    return MetricsExchange(lambda: BODY, max_header_bytes)


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def test_get_metrics_answers_the_rendering_and_closes():
    ex = exchange()
    answer = ex.receive(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    assert answer is not None
    assert status_of(answer) == 200
    assert answer.endswith(BODY)
    assert b"connection: close" in answer.lower()
    assert b"text/plain; version=0.0.4" in answer


def test_a_request_in_pieces_is_answered_once_complete():
    ex = exchange()
    request = b"GET /metrics?x=1 HTTP/1.1\r\nHost: x\r\nAccept: */*\r\n\r\n"
    for i in range(len(request) - 1):
        assert ex.receive(request[i : i + 1]) is None
    answer = ex.receive(request[-1:])
    assert answer is not None and status_of(answer) == 200


def test_head_has_no_body_other_paths_and_methods_are_refused():
    head = exchange().receive(b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    assert head is not None and status_of(head) == 200 and not head.endswith(BODY)
    missing = exchange().receive(b"GET /favicon.ico HTTP/1.1\r\nHost: x\r\n\r\n")
    assert missing is not None and status_of(missing) == 404
    post = exchange().receive(b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc")
    assert post is not None and status_of(post) == 405


@pytest.mark.parametrize(
    "garbage",
    [
        b"\x00\x01\x02\xff garbage\r\n\r\n",
        b"GET\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\nno colon here\r\n\r\n",
        b"\r\n\r\n\r\n",
    ],
)
def test_garbage_gets_400(garbage: bytes) -> None:
    answer = exchange().receive(garbage)
    assert answer is not None and status_of(answer) == 400


def test_a_head_past_the_cap_is_refused_without_waiting_for_its_end():
    ex = exchange(max_header_bytes=1024)
    assert ex.receive(b"GET /metrics HTTP/1.1\r\nHost: x\r\n") is None
    answer = None
    for _ in range(100):
        answer = ex.receive(b"X-Pad: " + b"a" * 200 + b"\r\n")
        if answer is not None:
            break
    assert answer is not None and status_of(answer) in (400, 431)


def test_eof_before_a_request_answers_nothing():
    ex = exchange()
    assert ex.receive(b"GET /met") is None
    answer = ex.receive(b"")
    assert answer is not None and status_of(answer) == 400  # a request cut short
    assert exchange().receive(b"") == b""


# --- the Trio server ---------------------------------------------------------------------------


async def _fetch(port: int, request: bytes = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n") -> bytes:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(request)
        out = b""
        while chunk := await stream.receive_some(65536):
            out += chunk
    return out


def _registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    Counter("probe_total", "a counter", registry=registry).inc(3)
    return registry


@pytest.mark.timeout(30)
async def test_server_serves_the_registry_and_sheds_slow_and_excess_clients(nursery):
    limits = ExporterLimits(max_connections=8, exchange_timeout=0.5)
    handle = await nursery.start(
        functools.partial(run_metrics_server, limits=limits), _registry(), "127.0.0.1", 0
    )
    assert b"probe_total 3.0" in await _fetch(handle.port)

    # slow clients: half a request each, never finished: they hold every slot...
    slow = [await trio.open_tcp_stream("127.0.0.1", handle.port) for _ in range(8)]
    for s in slow:
        await s.send_all(b"GET /metr")
    await trio.sleep(0.1)
    assert handle.connections == 8
    # ... so one more is closed at once, unanswered
    assert await _fetch(handle.port) == b""
    assert handle.refused_connections >= 1
    # until the exchange timeout lets go of them: closed by the server, unanswered
    with trio.fail_after(5):
        for s in slow:
            assert await s.receive_some(1024) == b""
            await s.aclose()
    assert handle.connections == 0
    assert b"probe_total 3.0" in await _fetch(handle.port)
    # garbage is answered 400 and the server goes on
    assert (await _fetch(handle.port, b"\x16\x03\x01 not http\r\n\r\n")).startswith(b"HTTP/1.1 400")
    assert b"probe_total 3.0" in await _fetch(handle.port)
