"""FIFO queue selection: Guava's consistent hash of Java's String hash, as RocketMQ 5's proxy."""

from __future__ import annotations

from broker.grpc.producer import consistent_hash
from common.string_hash import java_string_hash


def test_consistent_hash_is_in_range_and_stable() -> None:
    for key in ("g1", "order-42", "中文", ""):
        h = java_string_hash(key)
        assert consistent_hash(h, 1) == 0
        for n in range(1, 40):
            assert 0 <= consistent_hash(h, n) < n
            assert consistent_hash(h, n) == consistent_hash(h, n)


def test_one_more_bucket_moves_a_key_only_to_the_new_bucket() -> None:
    """Guava's consistentHash contract: growing n to n+1 keeps a key or moves it to n."""
    for i in range(300):
        h = java_string_hash(f"group-{i}")
        for n in range(1, 20):
            before, after = consistent_hash(h, n), consistent_hash(h, n + 1)
            assert after in (before, n)


def test_keys_spread_over_the_buckets() -> None:
    counts = [0] * 8
    for i in range(4000):
        counts[consistent_hash(java_string_hash(f"k{i}"), 8)] += 1
    assert min(counts) > 350
