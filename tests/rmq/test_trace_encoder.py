"""The trace layout, byte for byte as RocketMQ 4.9's TraceDataEncoder writes and reads it.

The expected strings are assembled field by field the way the Java encoder's StringBuilder
assembles them (TraceDataEncoderTest in apache/rocketmq builds its Pub sample the same way), so
a record our client writes reads the same in the Java client and the dashboard, and a record
they write reads here.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import trio

from rmq.trace.dispatcher import AsyncTraceDispatcher
from rmq.trace.encoder import (
    ConsumeReturnType,
    MessageType,
    TraceBean,
    TraceContext,
    TraceType,
    decode,
    encode,
    java_split,
)
from rmq.trace.hooks import EndTransactionTracer

C, F = "\x01", "\x02"
T = 1_700_000_000_123


def java_pub() -> str:
    # StringBuilder.append of each value, CONTENT_SPLITOR between, FIELD_SPLITOR at the end
    return (
        f"Pub{C}{T}{C}DefaultRegion{C}PID-test{C}topic-test{C}"
        f"AC1415116D1418B4AAC217FE1B4E0000{C}Tags{C}Keys{C}127.0.0.1:10911{C}26{C}245{C}"
        f"{MessageType.Normal_Msg.value}{C}0A9A002600002A9F0000000000002329{C}true{F}"
    )


def pub_context() -> TraceContext:
    bean = TraceBean(
        topic="topic-test",
        keys="Keys",
        tags="Tags",
        msg_id="AC1415116D1418B4AAC217FE1B4E0000",
        offset_msg_id="0A9A002600002A9F0000000000002329",
        store_host="127.0.0.1:10911",
        store_time=T,
        msg_type=MessageType.Normal_Msg,
        body_length=26,
    )
    return TraceContext(
        TraceType.Pub,
        time_stamp=T,
        group_name="PID-test",
        region_id="DefaultRegion",
        cost_time=245,
        success=True,
        trace_beans=[bean],
    )


def test_pub_is_byte_exact_and_keyed_by_msg_id_and_keys() -> None:
    bean = encode(pub_context())
    assert bean.trans_data == java_pub()
    assert bean.trans_keys == ("AC1415116D1418B4AAC217FE1B4E0000", "Keys")


def test_sub_before_one_record_per_message() -> None:
    ctx = TraceContext(
        TraceType.SubBefore,
        time_stamp=T,
        region_id=None,  # a message without MSG_REGION: Java appends "null"
        group_name="CID",
        request_id="REQ1",
        trace_beans=[
            TraceBean(msg_id="M1", retry_times=0, keys="k1 k2"),
            TraceBean(msg_id="M2", retry_times=3, keys=None),
        ],
    )
    got = encode(ctx)
    assert got.trans_data == (
        f"SubBefore{C}{T}{C}null{C}CID{C}REQ1{C}M1{C}0{C}k1 k2{F}"
        f"SubBefore{C}{T}{C}null{C}CID{C}REQ1{C}M2{C}3{C}null{F}"
    )
    assert got.trans_keys == ("M1", "k1", "k2", "M2")


def test_sub_after_local_and_cloud() -> None:
    ctx = TraceContext(
        TraceType.SubAfter,
        time_stamp=T,
        group_name="CID",
        request_id="REQ1",
        cost_time=7,
        success=False,
        context_code=ConsumeReturnType.FAILED,
        trace_beans=[TraceBean(msg_id="M1", keys="k1")],
    )
    assert encode(ctx).trans_data == f"SubAfter{C}REQ1{C}M1{C}7{C}false{C}k1{C}4{C}{T}{C}CID{F}"
    ctx.cloud = True
    assert encode(ctx).trans_data == f"SubAfter{C}REQ1{C}M1{C}7{C}false{C}k1{C}4{C}"


def test_end_transaction() -> None:
    ctx = TraceContext(
        TraceType.EndTransaction,
        time_stamp=T,
        region_id="DefaultRegion",
        group_name="PID-test",
        trace_beans=[
            TraceBean(
                topic="topic-test",
                msg_id="M1",
                tags="Tags",
                keys="Keys",
                store_host="127.0.0.1:10911",
                msg_type=MessageType.Trans_msg_Commit,
                transaction_id="TX1",
                transaction_state="COMMIT_MESSAGE",
                from_transaction_check=True,
            )
        ],
    )
    want = (
        f"EndTransaction{C}{T}{C}DefaultRegion{C}PID-test{C}topic-test{C}M1{C}Tags{C}Keys{C}"
        f"127.0.0.1:10911{C}2{C}TX1{C}COMMIT_MESSAGE{C}true{F}"
    )
    assert encode(ctx).trans_data == want
    [back] = decode(want)
    assert back.trace_beans[0].transaction_state == "COMMIT_MESSAGE"
    assert back.trace_beans[0].from_transaction_check is True


def test_end_transaction_as_the_hook_writes_it() -> None:
    # EndTransactionTraceHookImpl: Trans_msg_Commit whatever the state, DefaultRegion when the
    # message names none, "null" for a message without tags or keys; the trace message is
    # keyed by the msgId alone then
    async def nowhere(topic: str, body: bytes, keys: Sequence[str]) -> None:
        raise AssertionError("not sent")

    dispatcher = AsyncTraceDispatcher(nowhere)
    tracer = EndTransactionTracer(dispatcher, "PID-test")
    tracer.record(
        topic="topic-test",
        msg_id="M1",
        tags=None,
        keys=None,
        store_host="10.0.0.5:10911",
        state="ROLLBACK_MESSAGE",
        transaction_id="M1",
        from_check=False,
    )
    tracer.record(  # a record about the trace topic itself is never written
        topic="RMQ_SYS_TRACE_TOPIC",
        msg_id="M2",
        tags=None,
        keys=None,
        store_host="",
        state="UNKNOW",
        transaction_id=None,
        from_check=True,
    )
    ctx = dispatcher._out.receive_nowait()
    with pytest.raises(trio.WouldBlock):
        dispatcher._out.receive_nowait()
    ctx.time_stamp = T
    got = encode(ctx)
    assert got.trans_data == (
        f"EndTransaction{C}{T}{C}DefaultRegion{C}PID-test{C}topic-test{C}M1{C}null{C}null{C}"
        f"10.0.0.5:10911{C}2{C}M1{C}ROLLBACK_MESSAGE{C}false{F}"
    )
    assert got.trans_keys == ("M1",)


def test_decode_what_the_java_client_writes() -> None:
    # a batch as AsyncTraceDispatcher concatenates it: a Pub, a SubBefore and its SubAfter
    data = (
        java_pub()
        + f"SubBefore{C}{T + 5}{C}DefaultRegion{C}CID{C}REQ{C}AC1415116D1418B4AAC217FE1B4E0000{C}1{C}Keys{F}"
        + f"SubAfter{C}REQ{C}AC1415116D1418B4AAC217FE1B4E0000{C}12{C}true{C}Keys{C}0{C}{T + 17}{C}CID{F}"
    )
    pub, before, after = decode(data)
    assert pub.trace_type is TraceType.Pub and pub.cost_time == 245 and pub.success
    assert pub.trace_beans[0].offset_msg_id == "0A9A002600002A9F0000000000002329"
    assert pub.trace_beans[0].store_host == "127.0.0.1:10911"
    assert pub.trace_beans[0].msg_type is MessageType.Normal_Msg
    assert (before.group_name, before.request_id, before.trace_beans[0].retry_times) == (
        "CID",
        "REQ",
        1,
    )
    assert (after.request_id, after.cost_time, after.success, after.time_stamp) == (
        "REQ",
        12,
        True,
        T + 17,
    )
    assert after.group_name == "CID"


@pytest.mark.parametrize("ctx", [pub_context()], ids=["pub"])
def test_round_trip(ctx: TraceContext) -> None:
    [back] = decode(encode(ctx).trans_data)
    assert back.trace_type is ctx.trace_type
    assert back.trace_beans[0].msg_id == ctx.trace_beans[0].msg_id
    assert (back.time_stamp, back.cost_time, back.success) == (T, 245, True)


def test_older_layouts_read_as_java_reads_them() -> None:
    base = java_pub().rstrip(F).split(C)
    # 13 fields (before offsetMsgId): the 13th is the success flag
    [old] = decode(C.join([*base[:12], "false"]) + F)
    assert old.success is False and old.trace_beans[0].offset_msg_id == ""
    # 15 fields (a client that adds its host)
    [newer] = decode(C.join([*base, "10.0.0.9"]) + F)
    assert newer.trace_beans[0].client_host == "10.0.0.9" and newer.success
    # a SubAfter of 7 fields: contextCode, no timestamp or group
    [short] = decode(f"SubAfter{C}R{C}M{C}3{C}true{C}k{C}2{F}")
    assert short.context_code == 2 and short.time_stamp == 0 and short.group_name == ""


def test_java_split_drops_trailing_empties_only() -> None:
    assert java_split("a\x01\x01b\x01\x01", C) == ["a", "", "b"]
    assert java_split("", C) == [""]
    assert java_split("\x01\x01", C) == []


@pytest.mark.parametrize(
    "junk",
    [
        "",
        F,
        "Pub",
        f"Pub{C}x{C}",
        f"SubBefore{C}1{F}",
        f"Pub{C}1{C}r{C}g{C}t{C}m{C}t{C}k{C}h{C}1{C}1{C}9{F}",
        "\x00\xff",
    ],
)
def test_unreadable_records_are_skipped_not_raised(junk: str) -> None:
    # a record ends at \x02: the one after the junk still reads
    assert decode(junk + F + java_pub())[-1].trace_type is TraceType.Pub
    assert decode(junk) == []
