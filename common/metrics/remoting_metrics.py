"""What every remoting server counts: RPC latency, connections, refusals (RocketMQ 5
``RemotingMetricsManager``; names in docs/metrics.md).

Theory of operation
-------------------
Counting happens on the request path, so it is a dict lookup and a few integer adds, and
nothing of prometheus_client runs per request: :class:`RpcLatency` keeps, per (request code,
response code), the count of answers per latency bucket and their sum in plain lists; the
channel calls it when an answer is queued (``ServerLoad.rpc_observer``, set only when the
node serves metrics).  At scrape time :class:`RemotingCollector` turns those lists and the
server's :class:`~common.remoting.server_limits.ServerLoad` into prometheus_client metric
families.  Everything runs on the node's Trio thread, so no lock is needed.
"""

from __future__ import annotations

import bisect
import enum
from collections.abc import Iterator, Sequence

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.server_limits import ServerLoad

# RocketMQ 5's rocketmq_rpc_latency buckets (RemotingMetricsManager), in milliseconds
RPC_LATENCY_BUCKETS_MS = (1.0, 3.0, 5.0, 10.0, 100.0, 1000.0, 3000.0)
PROTOCOL_REMOTING = "remoting"


def _names(codes: type[enum.IntEnum]) -> dict[int, str]:
    return {int(c): c.name.lower() for c in codes}


_REQUEST_NAMES = _names(RequestCode)
_RESPONSE_NAMES = _names(ResponseCode)


def request_code_name(code: int) -> str:
    """RocketMQ 5's ``request_code`` label value: the constant's name in lower case."""
    return _REQUEST_NAMES.get(code) or str(code)


def response_code_name(code: int) -> str:
    return _RESPONSE_NAMES.get(code) or str(code)


def bucket_samples(bounds: Sequence[float], counts: Sequence[int]) -> list[tuple[str, float]]:
    """Per-bucket counts (the last one past every bound) as Prometheus's cumulative ``le``s."""
    out = []
    total = 0
    for bound, n in zip(bounds, counts, strict=False):
        total += n
        out.append((repr(float(bound)), float(total)))
    total += counts[len(bounds)]
    out.append(("+Inf", float(total)))
    return out


class RpcLatency:
    """Answers per (request code, response code) and latency bucket (module docstring)."""

    def __init__(self) -> None:
        # (request code, response code) -> [count per bucket..., count past the last bound]
        self.buckets: dict[tuple[int, int], list[int]] = {}
        self.sums_ms: dict[tuple[int, int], float] = {}

    def observe(self, request_code: int, response_code: int, seconds: float) -> None:
        key = (request_code, response_code)
        ms = seconds * 1000.0
        counts = self.buckets.get(key)
        if counts is None:
            # a client chooses the codes: only known request codes get a series of their own,
            # so the number of series stays bounded whatever it sends
            if request_code not in _REQUEST_NAMES:
                key = (-1, response_code)
            if response_code not in _RESPONSE_NAMES:
                key = (key[0], -1)
            counts = self.buckets.get(key)
            if counts is None:
                counts = self.buckets[key] = [0] * (len(RPC_LATENCY_BUCKETS_MS) + 1)
                self.sums_ms[key] = 0.0
        counts[bisect.bisect_left(RPC_LATENCY_BUCKETS_MS, ms)] += 1
        self.sums_ms[key] += ms


class RemotingCollector(Collector):
    """rocketmq_rpc_latency and the server's connection and refusal counts, at scrape time."""

    def __init__(
        self, labels: dict[str, str], latency: RpcLatency, loads: Sequence[ServerLoad]
    ) -> None:
        self._names = list(labels)
        self._values = list(labels.values())
        self._latency = latency
        self._loads = loads

    def collect(self) -> Iterator[Metric]:
        names, values = self._names, self._values
        rpc = HistogramMetricFamily(
            "rocketmq_rpc_latency",
            "Milliseconds from a request read to its answer queued.",
            labels=[*names, "protocol_type", "request_code", "response_code"],
        )
        for (req, resp), counts in list(self._latency.buckets.items()):
            rpc.add_metric(
                [
                    *values,
                    PROTOCOL_REMOTING,
                    request_code_name(req) if req >= 0 else "other",
                    response_code_name(resp) if resp >= 0 else "other",
                ],
                bucket_samples(RPC_LATENCY_BUCKETS_MS, counts),
                self._latency.sums_ms[(req, resp)],
            )
        yield rpc
        conns = GaugeMetricFamily(
            "rocketmq_server_connections", "Client connections held now.", labels=names
        )
        conns.add_metric(values, sum(load.connections for load in self._loads))
        yield conns
        refused_c = CounterMetricFamily(
            "rocketmq_server_refused_connections",
            "Connections closed at once for the connection limit.",
            labels=names,
        )
        refused_c.add_metric(values, sum(load.refused_connections for load in self._loads))
        yield refused_c
        refused_r = CounterMetricFamily(
            "rocketmq_server_refused_requests",
            "Requests answered SYSTEM_BUSY for the held-request limits.",
            labels=names,
        )
        refused_r.add_metric(values, sum(load.refused_requests for load in self._loads))
        yield refused_r
