"""``DefaultMessageStore.append_message_group`` (the single sends of one socket read as one
CommitLog write) leaves the store as the same sends one ``append_message`` each would: the same
CommitLog and ConsumeQueue bytes, across segment rolls, the same results, and a refused message
answered alone."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

from broker.store import (
    MessageStoreConfig,
    PendingPut,
    PutMessageResult,
    PutMessageStatus,
    run_message_store,
)
from broker.store.message_store import DefaultMessageStore
from common.message import MessageExtBrokerInner
from common.message_properties import MessageConst

# a CommitLog segment holds ~20 of these records: the groups below roll several segments
SMALL: dict[str, Any] = dict(
    mapped_file_size_commit_log=4096,
    mapped_file_size_consume_queue=20 * 8,
)


def mk(
    topic: str = "T", qid: int = 0, body: bytes = b"x" * 64, **props: str
) -> MessageExtBrokerInner:
    return MessageExtBrokerInner(
        topic=topic,
        queue_id=qid,
        body=body,
        properties=dict(props),
        born_host=("10.0.0.1", 1),
        store_host=("127.0.0.1", 10911),
    )


@contextlib.asynccontextmanager
async def opened(root: Path, **kw: Any) -> AsyncIterator[DefaultMessageStore]:
    cfg = MessageStoreConfig(store_path_root_dir=str(root), **{**SMALL, **kw})
    async with trio.open_nursery() as nursery:
        store = await nursery.start(run_message_store, cfg)
        store.clock = lambda: 1_700_000_000_000  # one store timestamp for both stores
        try:
            yield store
        finally:
            nursery.cancel_scope.cancel()


def files(root: Path) -> dict[str, bytes]:
    out = {}
    for sub in ("commitlog", "consumequeue"):
        for dirpath, _dirs, names in os.walk(root / sub):
            for name in names:
                p = Path(dirpath) / name
                out[str(p.relative_to(root))] = p.read_bytes()
    return out


def final(r: PutMessageResult | PendingPut) -> PutMessageResult:
    return r.result if isinstance(r, PendingPut) else r


def groups() -> list[list[MessageExtBrokerInner]]:
    """Runs as a pipelining producer sends them: queues in turn, keys (index entries), one
    refused by the store in the middle, a delayed one, a tag, single-message runs."""
    out = []
    n = 0
    for size in (8, 3, 1, 8, 5, 8, 2, 8, 8, 7):
        run = []
        for _ in range(size):
            n += 1
            props = {MessageConst.KEYS: f"k{n}", MessageConst.UNIQ_KEY: f"U{n:08d}"}
            if n % 6 == 0:
                props[MessageConst.TAGS] = "tag"
            run.append(mk("T" if n % 3 else "U", n % 4, b"b" * (40 + n), **props))
        out.append(run)
    out[3][4] = mk("T" * 200, 0)  # topic too long: the store refuses it
    out[5][2] = mk("T", 1, DELAY="2")  # DELAY: rewritten to SCHEDULE_TOPIC
    return out


@pytest.mark.timeout(60)
async def test_group_leaves_the_bytes_and_results_of_single_puts(tmp_path: Path) -> None:
    async with opened(tmp_path / "one") as one, opened(tmp_path / "grp") as grp:
        statuses = []
        # (two copies: a put may rewrite its message, e.g. the delay to SCHEDULE_TOPIC)
        for run, copy in zip(groups(), groups(), strict=True):
            singles = [final(one.append_message(m)) for m in run]
            grouped = [final(r) for r in grp.append_message_group(copy)]
            assert grouped == singles
            statuses += [r.status for r in singles]
        assert statuses.count(PutMessageStatus.MESSAGE_ILLEGAL) == 1
        assert statuses.count(PutMessageStatus.PUT_OK) == len(statuses) - 1
        assert one.commit_log.max_offset == grp.commit_log.max_offset > 2 * 4096  # 3 segments
        for topic, qid in (("T", 1), ("U", 0), ("SCHEDULE_TOPIC_XXXX", 1)):
            assert one.get_max_offset_in_queue(topic, qid) == grp.get_max_offset_in_queue(
                topic, qid
            )
        for key in ("k1", "k20", "U00000033"):
            assert one._index_candidates(f"T#{key}", 32, 0, 2**62) == grp._index_candidates(
                f"T#{key}", 32, 0, 2**62
            )
    a, b = files(tmp_path / "one"), files(tmp_path / "grp")
    assert len(a) > 6 and a == b


@pytest.mark.timeout(30)
async def test_a_refused_message_is_answered_alone(tmp_path: Path) -> None:
    async with opened(tmp_path / "s") as store:
        run = [mk("T", 0), mk("T" * 200, 0), mk("T", 0)]
        ok1, bad, ok2 = (final(r) for r in store.append_message_group(run))
        assert bad.status is PutMessageStatus.MESSAGE_ILLEGAL and bad.append is None
        assert ok1.ok and ok2.ok
        assert ok1.append is not None and ok2.append is not None
        assert (ok1.append.logics_offset, ok2.append.logics_offset) == (0, 1)
        assert ok2.append.wrote_offset == ok1.append.wrote_offset + ok1.append.wrote_bytes


@pytest.mark.timeout(30)
async def test_group_under_sync_flush_waits_like_single_puts(tmp_path: Path) -> None:
    async with opened(tmp_path / "s", flush_disk_type="SYNC_FLUSH") as store:
        run = [mk("T", q % 2) for q in range(4)]
        run[1].properties[MessageConst.WAIT] = "false"
        out = store.append_message_group(run)
        assert [isinstance(r, PendingPut) for r in out] == [True, False, True, True]
        with trio.fail_after(10):
            done = [await r.wait() if isinstance(r, PendingPut) else r for r in out]
        assert all(r.ok for r in done)
        assert [r.append.logics_offset for r in done if r.append] == [0, 0, 1, 1]


async def test_a_group_is_one_write_heard_before_its_dispatch(tmp_path: Path) -> None:
    # one transfer to the slaves for the group, sent before the master dispatches it (issue 28)
    async with opened(tmp_path, mapped_file_size_commit_log=1 << 20) as store:
        final(store.append_message(mk()))  # the first segment (a group starts none)
        heard: list[tuple[int, int]] = []
        store.add_write_listener(
            lambda: heard.append((store.get_max_phy_offset(), store.dispatch_behind_bytes))
        )
        results = [final(r) for r in store.append_message_group([mk(qid=i % 2) for i in range(5)])]
        first, last = results[0].append, results[-1].append
        assert first is not None and last is not None
        end = last.wrote_offset + last.wrote_bytes
        assert heard == [(end, end - first.wrote_offset)]
        assert store.dispatch_behind_bytes == 0
