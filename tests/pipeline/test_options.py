"""Reader options: every bad option fails on the driver with a message naming it."""

from __future__ import annotations

import pickle

import pytest

from pipeline.options import OptionError, ReaderOptions, parse_reader_options
from pipeline.source_offsets import QueueKey

NS = {"namesrv": "127.0.0.1:9876"}


def parse(streaming: bool = False, **opts: str) -> ReaderOptions:
    return parse_reader_options({**NS, **opts}, streaming=streaming)


def test_defaults_batch_and_stream() -> None:
    batch = parse(topic="t")
    assert (batch.starting, batch.ending) == ("earliest", "latest")
    assert batch.fail_on_data_loss is True and batch.read_from_slave is False
    stream = parse(streaming=True, topic="t")
    assert stream.starting == "latest"
    assert stream.pull_group == "TRIO_RMQ_SPARK_READER"


def test_topics_comma_list_and_case_insensitive_keys() -> None:
    o = parse_reader_options(
        {
            "NAMESRV": "a:1;b:2",
            "Topic": " x, y ,x",
            "FAILONDATALOSS": "False",
            "maxoffsetspertrigger": "10",
            "consumerGroup": "cg",
        },
        streaming=True,
    )
    assert o.topics == ("x", "y")
    assert o.fail_on_data_loss is False
    assert o.max_offsets_per_trigger == 10
    assert o.pull_group == "cg"
    assert pickle.loads(pickle.dumps(o)) == o


def test_json_offsets() -> None:
    o = parse(
        topic="t",
        startingOffsets='{"t": {"broker-a/0": 5, "broker-b/3": -2}}',
        endingOffsets='{"t": {"broker-a/0": -1}}',
    )
    assert o.starting == {QueueKey("t", "broker-a", 0): 5, QueueKey("t", "broker-b", 3): -2}
    assert o.ending == {QueueKey("t", "broker-a", 0): -1}


@pytest.mark.parametrize(
    ("opts", "streaming", "named"),
    [
        ({"topic": "t", "namesrv": ""}, False, "namesrv"),
        ({"topic": "t", "namesrv": "localhost"}, False, "namesrv"),
        ({}, False, "topic"),
        ({"topic": "t", "topicPattern": "t.*"}, False, "topicPattern"),
        ({"topicPattern": "t(("}, False, "topicPattern"),
        ({"topic": "t", "startingOffsets": "{not json"}, False, "startingOffsets"),
        ({"topic": "t", "startingOffsets": "yesterday"}, False, "startingOffsets"),
        ({"topic": "t", "startingOffsets": '{"t": {"broker-a": 1}}'}, False, "startingOffsets"),
        ({"topic": "t", "startingOffsets": '{"t": [1]}'}, False, "startingOffsets"),
        ({"topic": "t", "startingOffsets": '{"t": {"b/0": "1"}}'}, False, "startingOffsets"),
        ({"topic": "t", "startingOffsets": '{"t": {"b/0": -3}}'}, False, "startingOffsets"),
        ({"topic": "t", "endingOffsets": "earliest"}, False, "endingOffsets"),
        ({"topic": "t", "endingOffsets": '{"t": {"b/0": -2}}'}, False, "endingOffsets"),
        ({"topic": "t", "endingOffsets": "latest"}, True, "endingOffsets"),
        ({"topic": "t", "startingTimestamp": "soon"}, False, "startingTimestamp"),
        (
            {"topic": "t", "startingTimestamp": "1", "startingOffsets": "earliest"},
            False,
            "startingTimestamp",
        ),
        ({"topic": "t", "maxOffsetsPerTrigger": "0"}, True, "maxOffsetsPerTrigger"),
        ({"topic": "t", "failOnDataLoss": "maybe"}, False, "failOnDataLoss"),
        ({"topic": "t", "readFromSlave": "1"}, False, "readFromSlave"),
        ({"topic": "t", "tags": "||"}, False, "tags"),
        ({"topic": "t", "timeout": "-1"}, False, "timeout"),
        ({"topic": "t", "consumerGroup": "a b"}, False, "consumerGroup"),
        ({"topic": "t", "startingOffset": "earliest"}, False, "startingOffsets"),
    ],
)
def test_bad_option_names_the_option(opts: dict, streaming: bool, named: str) -> None:
    full = {**NS, **opts}
    with pytest.raises(OptionError) as info:
        parse_reader_options(full, streaming=streaming)
    assert named in str(info.value)


def test_unknown_option_suggests_spelling() -> None:
    with pytest.raises(
        OptionError, match=r"unknown option 'maxoffsetpertrigger'.*maxOffsetsPerTrigger"
    ):
        parse(topic="t", maxOffsetPerTrigger="5")
