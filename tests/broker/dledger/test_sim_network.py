"""The simulator's network model: FIFO per channel, loss and partitions break connections,
reordering and duplication only without FIFO, and the same seed gives the same deliveries."""

from __future__ import annotations

import random

from tests.broker.dledger.sim_network import NetworkProfile, SimNetwork

REQ = ("n0", "n1", "req")


def test_fifo_channel_delivers_in_send_order() -> None:
    net = SimNetwork(random.Random(1), NetworkProfile(slow_probability=0.3, slow_delay=0.5))
    times = [net.transmit(i * 0.001, REQ)[0][0] for i in range(200)]
    assert times == sorted(times)
    assert any(
        b - a > 0.05 for a, b in zip(times, times[1:], strict=False)
    )  # slow ones hold others


def test_reordering_and_duplicates_only_without_fifo() -> None:
    profile = NetworkProfile(slow_probability=0.3, slow_delay=0.5, duplicate=0.2, fifo=False)
    net = SimNetwork(random.Random(1), profile)
    arrivals = [net.transmit(i * 0.001, REQ) for i in range(200)]
    firsts = [a[0][0] for a in arrivals]
    assert firsts != sorted(firsts)
    assert any(len(a) == 2 for a in arrivals)
    fifo = SimNetwork(random.Random(1), NetworkProfile(duplicate=0.9))
    assert all(len(fifo.transmit(0.0, REQ)) == 1 for _ in range(50))


def test_a_loss_breaks_the_connection() -> None:
    net = SimNetwork(random.Random(3), NetworkProfile(loss=0.5))
    sent = []
    for i in range(40):
        sent.extend(net.transmit(i * 0.001, REQ))
    alive = [net.alive(REQ, epoch) for _, epoch in sent]
    assert alive.count(True) < len(alive)  # earlier epochs are gone
    assert net.alive(REQ, net.epoch(REQ))


def test_partitions_cut_and_heal() -> None:
    net = SimNetwork(random.Random(2))
    ((_, epoch),) = net.transmit(0.0, REQ)
    net.partition([["n0"], ["n1", "n2"]])
    assert not net.connected("n0", "n1") and net.connected("n1", "n2")
    assert not net.alive(REQ, epoch)  # what was in flight is lost
    assert net.transmit(0.1, REQ) == []
    assert net.transmit(0.1, ("n2", "n1", "resp")) != []
    net.heal()
    assert net.transmit(0.2, REQ) != [] and net.connected("n0", "n1")


def test_same_seed_same_deliveries() -> None:
    def run() -> list[list[tuple[float, int]]]:
        net = SimNetwork(random.Random(9), NetworkProfile(loss=0.1, fifo=False, duplicate=0.1))
        return [net.transmit(i * 0.01, REQ) for i in range(100)]

    assert run() == run()
