"""The official RocketMQ 5 Python client (`rocketmq-python-client` 5.1.2) against `rmq up`.

Compatibility is judged by the real client over gRPC (the broker's MessagingService), not by
ours: each scenario runs tests/interop/py5_driver.py in the client's own venv and reads its
JSON events (docs/grpc-clients.md says what the client sends and needs back). The cluster is
`rmq up`'s default, a SYNC_MASTER with its slave, with transaction check-backs within a second.

Producer: normal, FIFO (message groups), delay (delivery timestamp), transaction commit and
rollback, an orphan resolved through the client's TransactionChecker (RecoverOrphanedTransaction
Command on its telemetry stream). SimpleConsumer and PushConsumer: tag and SQL92 filters, ack,
change invisible duration, redelivery of an unacked message with its delivery attempt, FIFO order
per message group, dead-lettering after the group's max attempts. Every acked send is received,
and nothing acked is received again.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.interop.py5_harness import (
    FAST_TRANSACTIONS,
    Py5,
    acked_bodies,
    cluster_config,
    grpc_endpoint,
    read_topic,
)

if TYPE_CHECKING:
    from tests.conftest import ClusterRunner, LocalCluster

pytestmark = [pytest.mark.interop, pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def cluster(
    cluster_runner: ClusterRunner, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalCluster]:
    d = tmp_path_factory.mktemp("py5")
    conf = cluster_config(d / "conf", **FAST_TRANSACTIONS)
    with cluster_runner(d / "rmq", "--config", str(conf)) as c:
        yield c


@pytest.fixture(scope="module")
def py5(py5_python: Path, cluster: LocalCluster) -> Py5:
    return Py5(py5_python, grpc_endpoint(cluster.data_dir), cluster.namesrv_addr)


def bodies(prefix: str, n: int) -> set[str]:
    return {f"{prefix}body-{i}" for i in range(n)}


def recv_of(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e["event"] == "recv"]


def assert_acked_once(events: list[dict[str, Any]], expected: set[str]) -> None:
    acked = acked_bodies(events)
    assert set(acked) == expected, (
        sorted(expected - set(acked))[:10],
        sorted(set(acked) - expected)[:10],
    )
    twice = {b: c for b, c in acked.items() if c > 1}
    assert not twice, f"acked more than once: {list(twice.items())[:10]}"
    late = [e["body"] for e in events if e["event"] == "recv" and e.get("late")]
    assert not late, f"received again after the ack: {late[:10]}"


# -- producer + SimpleConsumer ------------------------------------------------------------


def test_normal_messages_are_received_once_with_their_properties(tmp_path: Path, py5: Py5) -> None:
    topic, group, n = "Py5Normal", "py5-normal", 60
    py5.topic(topic)
    py5.group(group)
    events = py5.produce(tmp_path, topic, n, "--tags-cycle", "TagA,TagB", "--props", "color=red")
    sent = {e["i"]: e for e in events if e["event"] == "sent"}
    assert len({e["msg_id"] for e in sent.values()}) == n
    ev, done = py5.simple(tmp_path, topic, group, n, "--invisible", "20", "--linger", "3")
    assert done["complete"], done
    assert_acked_once(ev, bodies("", n))
    for e in recv_of(ev):
        i = e["seq"]
        assert e["body"] == f"body-{i}"
        assert e["msg_id"] == sent[i]["msg_id"]  # the client's own message id survives
        assert e["topic"] == topic
        assert e["tag"] == ("TagA" if i % 2 == 0 else "TagB")
        assert e["keys"] == [f"key-{i}"]
        assert e["props"]["color"] == "red"
        assert e["attempt"] == 1
        assert not e["corrupted"]


def test_an_unacked_message_comes_back_with_its_next_delivery_attempt(
    tmp_path: Path, py5: Py5
) -> None:
    topic, group, n = "Py5Redeliver", "py5-redeliver", 20
    py5.topic(topic)
    py5.group(group)
    py5.produce(tmp_path, topic, n)
    # every 5th is left unacked on its first delivery; its invisible time runs out (10 s:
    # RocketMQ's least for a receive, the proxy's minInvisibleTimeMillsForRecv)
    ev, done = py5.simple(
        tmp_path, topic, group, n,
        "--invisible", "10", "--no-ack-every", "5", "--no-ack-attempts", "1", "--linger", "3",
    )  # fmt: skip
    assert done["complete"], done
    assert_acked_once(ev, bodies("", n))
    withheld = {f"body-{i}" for i in range(0, n, 5)}
    assert {e["body"] for e in ev if e["event"] == "no_ack"} == withheld
    by_body: dict[str, list[int]] = defaultdict(list)
    for e in recv_of(ev):
        by_body[e["body"]].append(e["attempt"])
    for b, attempts in by_body.items():
        assert attempts == ([1, 2] if b in withheld else [1]), (b, attempts)


def test_change_invisible_duration_brings_a_message_back_sooner_and_its_new_handle_acks(
    tmp_path: Path, py5: Py5
) -> None:
    topic, group, n = "Py5Invisible", "py5-invisible", 12
    py5.topic(topic)
    py5.group(group)
    py5.produce(tmp_path, topic, n)
    # received invisible for 60 s; every 3rd is set to 1 s and left: it is back long before 60 s.
    # The others get 30 s more, then are acked with the handle the change returned.
    ev, done = py5.simple(
        tmp_path, topic, group, n,
        "--invisible", "60", "--no-ack-every", "3", "--no-ack-attempts", "1",
        "--withhold-invisible", "1", "--change-invisible", "30", "--linger", "2",
        timeout=40,
    )  # fmt: skip
    assert done["complete"], done
    assert_acked_once(ev, bodies("", n))
    assert not [e for e in ev if e["event"] in ("change_error", "ack_error")]
    first: dict[str, int] = {}
    for e in recv_of(ev):
        if e["attempt"] == 1:
            first[e["body"]] = e["recv_ms"]
        else:
            assert e["attempt"] == 2 and e["seq"] % 3 == 0, e
            assert e["recv_ms"] - first[e["body"]] < 20_000, "came back only when 60 s ran out"
    changed = Counter(e["body"] for e in ev if e["event"] == "changed")
    assert changed == Counter(bodies("", n))  # once each: 1 s for the left, 30 s for the acked


def test_tag_and_sql92_filters_select_on_the_broker(tmp_path: Path, py5: Py5) -> None:
    topic, n = "Py5Filters", 30
    py5.topic(topic)
    py5.group("py5-tags")
    py5.group("py5-sql")
    # tags cycle A, B, C; the property `seq` is the index
    py5.produce(tmp_path, topic, n, "--tags-cycle", "TagA,TagB,TagC")
    want_tags = {f"body-{i}" for i in range(n) if i % 3 in (0, 2)}
    ev, done = py5.simple(
        tmp_path, topic, "py5-tags", len(want_tags), "--tag-expr", "TagA || TagC", "--linger", "3"
    )
    assert done["complete"], done
    assert_acked_once(ev, want_tags)
    want_sql = {f"body-{i}" for i in range(n) if i % 3 == 1 and i >= 10}
    ev, done = py5.simple(
        tmp_path, topic, "py5-sql", len(want_sql), "--sql", "TAGS = 'TagB' AND seq >= 10",
        "--linger", "3",
    )  # fmt: skip
    assert done["complete"], done
    assert_acked_once(ev, want_sql)


def test_delay_messages_arrive_at_their_delivery_time(tmp_path: Path, py5: Py5) -> None:
    topic, group, n = "Py5Delay", "py5-delay", 6
    py5.topic(topic, "DELAY")
    py5.group(group)
    events = py5.produce(tmp_path, topic, n, "--type", "delay", "--delay-s", "6")
    deliver_at = {e["i"]: e["deliver_at"] for e in events if e["event"] == "sent"}
    ev, done = py5.simple(tmp_path, topic, group, n, "--linger", "2", timeout=60)
    assert done["complete"], done
    assert_acked_once(ev, bodies("", n))
    for e in recv_of(ev):
        due_ms = deliver_at[e["seq"]] * 1000
        # second precision: never before its second, and within a few seconds of it
        assert e["recv_ms"] >= due_ms - 1000, (e["recv_ms"] - due_ms, e)
        assert e["recv_ms"] <= due_ms + 10_000, (e["recv_ms"] - due_ms, e)
        assert e["delivery_ts"] == due_ms


def test_transactions_commit_and_rollback(tmp_path: Path, py5: Py5) -> None:
    topic, group = "Py5Tx", "py5-tx"
    py5.topic(topic, "TRANSACTION")
    py5.group(group)
    py5.produce(tmp_path, topic, 10, "--type", "transaction", "--tx-action", "commit",
                "--prefix", "c-")  # fmt: skip
    py5.produce(tmp_path, topic, 10, "--type", "transaction", "--tx-action", "rollback",
                "--prefix", "r-")  # fmt: skip
    ev, done = py5.simple(tmp_path, topic, group, 10, "--linger", "4")
    assert done["complete"], done
    assert_acked_once(ev, bodies("c-", 10))
    assert not [e for e in recv_of(ev) if e["body"].startswith("r-")]


def test_an_orphan_transaction_is_resolved_by_the_client_checker(tmp_path: Path, py5: Py5) -> None:
    topic, group = "Py5TxOrphan", "py5-tx-orphan"
    py5.topic(topic, "TRANSACTION")
    py5.group(group)
    # half messages never ended by the producer: the broker asks its checker (over the
    # producer's telemetry stream), which answers COMMIT for one run, ROLLBACK for the other
    for prefix, answer in (("oc-", "commit"), ("or-", "rollback")):
        events = py5.produce(
            tmp_path, topic, 4, "--type", "transaction", "--tx-action", "none",
            "--checker", answer, "--wait-checks", "4", "--check-timeout", "60",
            "--prefix", prefix, "--linger", "2",
        )  # fmt: skip
        sent_ids = {e["msg_id"] for e in events if e["event"] == "sent"}
        checks = [e for e in events if e["event"] == "check"]
        assert {e["msg_id"] for e in checks} == sent_ids, (checks, sent_ids)
        assert {e["body"] for e in checks} == bodies(prefix, 4)
    ev, done = py5.simple(tmp_path, topic, group, 4, "--linger", "5")
    assert done["complete"], done
    assert_acked_once(ev, bodies("oc-", 4))
    assert not [e for e in recv_of(ev) if e["body"].startswith("or-")]


def test_fifo_messages_of_a_group_come_in_order_each_after_the_previous_is_acked(
    tmp_path: Path, py5: Py5
) -> None:
    topic, group, n = "Py5Fifo", "py5-fifo", 45
    py5.topic(topic, "FIFO")
    py5.group(group, "--orderly")
    py5.produce(tmp_path, topic, n, "--type", "fifo", "--groups", "3")
    # every 7th is left unacked once: nothing later of its group may come before it is back.
    # One message per receive: a batch may hold several of a group, and the contract is then
    # to process them in order (a consumer leaving the first unacked must drop the rest)
    ev, done = py5.simple(
        tmp_path, topic, group, n, "--invisible", "10", "--batch", "1", "--withhold-invisible", "1",
        "--no-ack-every", "7", "--no-ack-attempts", "1", "--linger", "3", timeout=90,
    )  # fmt: skip
    assert done["complete"], done
    assert_acked_once(ev, bodies("", n))
    per_group: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for e in recv_of(ev):
        assert e["group"] == f"g{e['seq'] % 3}" == e["props"]["grp"]
        per_group[e["group"]].append((e["seq"], e["attempt"]))
    for g, seen in per_group.items():
        expected: list[tuple[int, int]] = []
        for s in range(int(g[1:]), n, 3):
            expected += [(s, 1), (s, 2)] if s % 7 == 0 else [(s, 1)]
        assert seen == expected, (g, seen)


def test_simple_consumer_dead_letters_after_max_attempts(tmp_path: Path, py5: Py5) -> None:
    topic, group = "Py5Dlq", "py5-dlq"
    py5.topic(topic)
    py5.group(group, "--retry-max-times", "2")  # 3 deliveries, then %DLQ%py5-dlq
    py5.produce(tmp_path, topic, 3, "--prefix", "d-")
    ev, _ = py5.simple(
        tmp_path, topic, group, 0, "--invisible", "10", "--withhold-invisible", "1",
        "--no-ack-every", "1", "--no-ack-attempts", "99", "--linger", "0", timeout=30,
    )  # fmt: skip
    attempts: dict[str, list[int]] = defaultdict(list)
    for e in recv_of(ev):
        attempts[e["body"]].append(e["attempt"])
    assert attempts == {b: [1, 2, 3] for b in bodies("d-", 3)}, attempts
    dlq = read_topic(py5.namesrv, f"%DLQ%{group}")
    assert sorted(m["body"] for m in dlq) == sorted(bodies("d-", 3))


# -- PushConsumer -------------------------------------------------------------------------


def test_push_consumer_receives_every_message_once_with_filters(tmp_path: Path, py5: Py5) -> None:
    topic, n = "Py5Push", 40
    py5.topic(topic)
    py5.group("py5-push-all")
    py5.group("py5-push-tag")
    py5.group("py5-push-sql")
    py5.produce(tmp_path, topic, n, "--tags-cycle", "TagA,TagB")
    for group, args, want in (
        ("py5-push-all", (), bodies("", n)),
        ("py5-push-tag", ("--tag-expr", "TagB"), {f"body-{i}" for i in range(1, n, 2)}),
        ("py5-push-sql", ("--sql", "seq < 10"), bodies("", 10)),
    ):
        ev, done = py5.push(tmp_path, topic, group, len(want), *args, "--linger", "3")
        assert done["complete"], (group, done)
        got = Counter(e["body"] for e in recv_of(ev))
        assert set(got) == want, group
        assert all(c == 1 for c in got.values()), (group, got.most_common(3))
        assert all(e["attempt"] == 1 for e in recv_of(ev))


def test_push_consumer_failure_is_redelivered_with_its_attempt(tmp_path: Path, py5: Py5) -> None:
    topic, group, n = "Py5PushRetry", "py5-push-retry", 20
    py5.topic(topic)
    py5.group(group)
    py5.produce(tmp_path, topic, n)
    ev, done = py5.push(
        tmp_path, topic, group, n, "--fail-every", "4", "--fail-attempts", "1", "--linger", "3",
        timeout=90,
    )  # fmt: skip
    assert done["complete"], done
    failed = {e["body"] for e in ev if e["event"] == "fail"}
    assert failed == {f"body-{i}" for i in range(0, n, 4)}
    ok = Counter(e["body"] for e in recv_of(ev))
    assert set(ok) == bodies("", n) and all(c == 1 for c in ok.values())
    for e in recv_of(ev):
        assert e["attempt"] == (2 if e["body"] in failed else 1), e


def test_push_consumer_dead_letters_after_max_attempts(tmp_path: Path, py5: Py5) -> None:
    topic, group = "Py5PushDlq", "py5-push-dlq"
    py5.topic(topic)
    py5.group(group, "--retry-max-times", "1")  # 2 deliveries, then the DLQ
    py5.produce(tmp_path, topic, 2, "--prefix", "pd-")
    ev, _ = py5.push(
        tmp_path, topic, group, 0, "--fail-every", "1", "--fail-attempts", "99", "--linger", "0",
        timeout=25,
    )  # fmt: skip
    attempts: dict[str, list[int]] = defaultdict(list)
    for e in ev:
        if e["event"] == "fail":
            attempts[e["body"]].append(e["attempt"])
    assert {b: sorted(a) for b, a in attempts.items()} == {b: [1, 2] for b in bodies("pd-", 2)}
    dlq = read_topic(py5.namesrv, f"%DLQ%{group}")
    assert sorted(m["body"] for m in dlq) == sorted(bodies("pd-", 2))


def test_push_consumer_fifo_order_and_dead_letter_of_a_poison_message(
    tmp_path: Path, py5: Py5
) -> None:
    topic, group, n = "Py5PushFifo", "py5-push-fifo", 30
    py5.topic(topic, "FIFO")
    py5.group(group, "--orderly", "--retry-max-times", "2")
    py5.produce(tmp_path, topic, n, "--type", "fifo", "--groups", "3")
    # seq 0 (group g0) always fails: the client retries it locally up to the group's max
    # attempts, forwards it to the DLQ, and only then goes on with g0
    ev, done = py5.push(
        tmp_path, topic, group, n - 1, "--fail-every", "1000", "--fail-attempts", "99",
        "--linger", "3", timeout=90,
    )  # fmt: skip
    started = [e for e in ev if e["event"] == "started"]
    assert started and started[0]["fifo"], "the server's settings did not mark the group FIFO"
    assert done["complete"], done
    per_group: dict[str, list[int]] = defaultdict(list)
    for e in ev:
        if e["event"] in ("recv", "fail") and e["seq"] != 0:
            per_group[e["group"]].append(e["seq"])
    for g, seqs in per_group.items():
        assert seqs == sorted(seqs), (g, seqs)
    fails = [e for e in ev if e["event"] == "fail"]
    assert {e["seq"] for e in fails} == {0}
    assert len(fails) == 3  # max attempts = retryMaxTimes + 1
    g0 = [(k, e["seq"]) for k, e in enumerate(ev) if e["event"] == "recv" and e["group"] == "g0"]
    assert [s for _, s in g0] == list(range(3, n, 3))
    last_fail = max(k for k, e in enumerate(ev) if e["event"] == "fail")
    assert g0[0][0] > last_fail, "g0 went on before its poison message was dead-lettered"
    dlq = read_topic(py5.namesrv, f"%DLQ%{group}")
    assert [m["body"] for m in dlq] == ["body-0"]


def test_a_4x_consumer_group_and_a_5x_group_read_the_same_topic(tmp_path: Path, py5: Py5) -> None:
    topic, n = "Py5Shared", 30
    py5.topic(topic)
    py5.group("py5-shared-5x")
    py5.produce(tmp_path, topic, n)
    ev, done = py5.simple(tmp_path, topic, "py5-shared-5x", n, "--linger", "2")
    assert done["complete"], done
    assert_acked_once(ev, bodies("", n))
    # the 4.x pull path of another group still sees all of it, from the start
    got = read_topic(py5.namesrv, topic)
    assert sorted(m["body"] for m in got) == sorted(bodies("", n))
