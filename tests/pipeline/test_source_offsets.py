"""Offset specs, ranges, rate limiting and data-loss checks of the rocketmq source."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.source_offsets import (
    QueueKey,
    QueueRange,
    data_loss,
    offsets_from_json,
    offsets_to_json,
    parse_key,
    rate_limit,
    resolve_offset,
    split_range,
)

A0 = QueueKey("t", "broker-a", 0)
A1 = QueueKey("t", "broker-a", 1)
B0 = QueueKey("t", "broker-b", 0)


def test_json_round_trip_and_shape() -> None:
    offsets = {A0: 3, A1: 0, B0: 7, QueueKey("u", "broker-a", 12): 1}
    js = offsets_to_json(offsets)
    assert js == {"t": {"broker-a/0": 3, "broker-a/1": 0, "broker-b/0": 7}, "u": {"broker-a/12": 1}}
    assert offsets_from_json(js) == offsets


def test_broker_names_with_slashes_parse_from_the_right() -> None:
    assert parse_key("a/b/3") == ("a/b", 3)
    for bad in ("a", "a/", "/3", "a/x"):
        with pytest.raises(ValueError):
            parse_key(bad)


def test_resolve_special_values_and_missing_queues() -> None:
    spec = {A0: -2, A1: -1, B0: 5}
    assert resolve_offset(spec, A0, 10, 20, missing="earliest") == 10
    assert resolve_offset(spec, A1, 10, 20, missing="earliest") == 20
    assert resolve_offset(spec, B0, 10, 20, missing="earliest") == 5
    other = QueueKey("t", "broker-c", 0)
    assert resolve_offset(spec, other, 10, 20, missing="earliest") == 10
    assert resolve_offset(spec, other, 10, 20, missing="latest") == 20
    assert resolve_offset("latest", A0, 10, 20, missing="earliest") == 20
    assert resolve_offset("earliest", A0, 10, 20, missing="latest") == 10


def test_split_range() -> None:
    r = QueueRange("t", "broker-a", 0, 5, 25)
    parts = split_range(r, 7)
    assert [(p.start, p.end) for p in parts] == [(5, 12), (12, 19), (19, 25)]
    assert split_range(QueueRange("t", "b", 0, 5, 5), 7) == []


def test_rate_limit_proportional_to_backlog() -> None:
    start = {A0: 0, A1: 100, B0: 50}
    latest = {A0: 300, A1: 200, B0: 50}  # backlogs 300, 100, 0
    end = rate_limit(start, latest, 40)
    assert end == {A0: 30, A1: 110, B0: 50}
    # everything fits: the latest offsets as they are
    assert rate_limit(start, latest, 1000) == latest


def test_rate_limit_new_queue_without_start_takes_latest() -> None:
    assert rate_limit({A0: 0}, {A0: 10, A1: 99}, 5) == {A0: 5, A1: 99}


@given(
    st.lists(st.tuples(st.integers(0, 1000), st.integers(0, 1000)), min_size=1, max_size=8),
    st.integers(1, 3000),
)
def test_rate_limit_never_exceeds_limit_and_never_goes_back(
    pairs: list[tuple[int, int]], limit: int
) -> None:
    keys = [QueueKey("t", "b", i) for i in range(len(pairs))]
    start = {k: s for k, (s, _) in zip(keys, pairs, strict=True)}
    latest = {k: s + n for k, (s, n) in zip(keys, pairs, strict=True)}
    end = rate_limit(start, latest, limit)
    read = sum(end[k] - start[k] for k in keys)
    assert read == min(limit, sum(n for _, n in pairs))
    assert all(start[k] <= end[k] <= latest[k] for k in keys)


def test_data_loss_both_ways() -> None:
    assert data_loss(A0, 5, 5, 10) is None
    assert data_loss(A0, 10, 5, 10) is None
    below = data_loss(A0, 2, 5, 10)
    assert below is not None and "t broker-a/0" in below and "2..4" in below
    above = data_loss(A0, 11, 5, 10)
    assert above is not None and "past the queue's max offset 10" in above
