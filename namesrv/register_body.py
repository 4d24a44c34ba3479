"""Decoding REGISTER_BROKER bodies (sans-I/O): plain JSON, zlib-compressed, and pre-3.0.11.

Theory of operation
-------------------
A broker announces its topics in one of three shapes (`registerBrokerWithFilterServer` in
`namesrv/processor/DefaultRequestProcessor.java`, `common/protocol/body/RegisterBrokerBody.java`):

* `RegisterBrokerBody` JSON (the default): `{"filterServerList":[...],
  "topicConfigSerializeWrapper":{"dataVersion":{...},"topicConfigTable":{name: TopicConfig}}}`.
* The same content as a zlib stream when the header says `compressed=true`: big-endian int
  length-prefixed DataVersion JSON, an int topic count, one length-prefixed
  `"<name> <readQ> <writeQ> <perm> <filterType>"` string per topic, then a length-prefixed JSON
  array of filter servers. topicSysFlag and order do not travel in this form (they read as 0).
* Brokers older than V3_0_11 (request version < 37) send a bare TopicConfigSerializeWrapper.

Only what routing needs is kept: the DataVersion (equality is all the nameserver ever asks of
it), and per topic the queue counts, perm and topicSysFlag.
Anything malformed raises `RegisterBodyError`; the processor answers it with SYSTEM_ERROR.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from common.model import DataVersion
from common.serde import loads, to_json
from namesrv.routeinfo import TopicQueueConfig

V3_0_11 = 37  # MQVersion ordinal from which brokers send RegisterBrokerBody
# Bound on the inflated size of a compressed body: a hostile stream cannot balloon in memory.
MAX_INFLATED_SIZE = 64 * 1024 * 1024

ZERO_VERSION = DataVersion(timestamp=0, counter=0)


class RegisterBodyError(ValueError):
    """A REGISTER_BROKER body that does not decode."""


@attrs.frozen
class RegisterBody:
    data_version: DataVersion
    topic_configs: dict[str, TopicQueueConfig]
    filter_server_list: list[str]


def data_version_from(obj: Any) -> DataVersion:
    """The DataVersion of a parsed JSON object; missing fields read as 0 (as fastjson does).
    Fields we do not know (5.x `stateVersion`) are ignored."""
    if obj is None:
        return ZERO_VERSION
    if not isinstance(obj, Mapping):
        raise RegisterBodyError(f"dataVersion is not an object: {obj!r}")
    try:
        return DataVersion(
            timestamp=int(obj.get("timestamp") or 0), counter=int(obj.get("counter") or 0)
        )
    except (TypeError, ValueError) as exc:
        raise RegisterBodyError(f"bad dataVersion {obj!r}") from exc


def data_version_json(version: DataVersion) -> bytes:
    return to_json(version)


def decode_register_body(body: bytes, *, compressed: bool, version: int) -> RegisterBody:
    if not body:
        # No body: version {0, 0}, no topics (what Java's processor substitutes).
        return RegisterBody(ZERO_VERSION, {}, [])
    if version < V3_0_11:
        return _from_wrapper(_json_object(body), [])
    if compressed:
        return _decode_compressed(body)
    obj = _json_object(body)
    filters = _filter_list(obj.get("filterServerList"))
    wrapper = obj.get("topicConfigSerializeWrapper")
    return _from_wrapper({} if wrapper is None else wrapper, filters)


def _json_object(body: bytes) -> Mapping[str, Any]:
    try:
        obj = loads(bytes(body))
    except ValueError as exc:
        raise RegisterBodyError(f"register body is not JSON: {exc}") from exc
    if not isinstance(obj, Mapping):
        raise RegisterBodyError("register body is not a JSON object")
    return obj


def _filter_list(obj: Any) -> list[str]:
    if obj is None:
        return []
    if not isinstance(obj, list):
        raise RegisterBodyError(f"filterServerList is not a list: {obj!r}")
    return [str(x) for x in obj]


def _from_wrapper(wrapper: Any, filters: list[str]) -> RegisterBody:
    if not isinstance(wrapper, Mapping):
        raise RegisterBodyError("topicConfigSerializeWrapper is not an object")
    table = wrapper.get("topicConfigTable")
    table = {} if table is None else table
    if not isinstance(table, Mapping):
        raise RegisterBodyError("topicConfigTable is not an object")
    configs: dict[str, TopicQueueConfig] = {}
    for name, tc in table.items():
        if not isinstance(tc, Mapping):
            raise RegisterBodyError(f"topic config of {name!r} is not an object")
        topic = str(tc.get("topicName") or name)
        try:
            configs[topic] = TopicQueueConfig(
                topic_name=topic,
                read_queue_nums=int(tc.get("readQueueNums", 16)),
                write_queue_nums=int(tc.get("writeQueueNums", 16)),
                perm=int(tc.get("perm", 6)),
                topic_sys_flag=int(tc.get("topicSysFlag", 0)),
            )
        except (TypeError, ValueError) as exc:
            raise RegisterBodyError(f"bad topic config for {name!r}: {exc}") from exc
    return RegisterBody(data_version_from(wrapper.get("dataVersion")), configs, filters)


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def int32(self) -> int:
        if self.pos + 4 > len(self.data):
            raise RegisterBodyError("compressed register body truncated")
        (n,) = struct.unpack_from(">i", self.data, self.pos)
        self.pos += 4
        return n

    def chunk(self) -> bytes:
        n = self.int32()
        if n < 0 or self.pos + n > len(self.data):
            raise RegisterBodyError("compressed register body truncated")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out


def _inflate(body: bytes) -> bytes:
    d = zlib.decompressobj()
    try:
        out = d.decompress(bytes(body), MAX_INFLATED_SIZE)
    except zlib.error as exc:
        raise RegisterBodyError(f"compressed register body does not inflate: {exc}") from exc
    if d.unconsumed_tail:
        raise RegisterBodyError("compressed register body inflates beyond the size limit")
    return out


def _decode_compressed(body: bytes) -> RegisterBody:
    r = _Reader(_inflate(body))
    try:
        version = data_version_from(json.loads(r.chunk()))
        count = r.int32()
        if count < 0:
            raise RegisterBodyError("negative topic count")
        configs: dict[str, TopicQueueConfig] = {}
        for _ in range(count):
            tc = _decode_topic_config(r.chunk().decode("utf-8"))
            configs[tc.topic_name] = tc
        filters = _filter_list(json.loads(r.chunk()))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RegisterBodyError(f"bad compressed register body: {exc}") from exc
    # Anything after the filter list (5.x topic queue mappings) is not ours to read.
    return RegisterBody(version, configs, filters)


def _decode_topic_config(s: str) -> TopicQueueConfig:
    parts = s.split(" ")
    if len(parts) < 5:
        raise RegisterBodyError(f"bad topic config entry {s!r}")
    try:
        return TopicQueueConfig(
            topic_name=parts[0],
            read_queue_nums=int(parts[1]),
            write_queue_nums=int(parts[2]),
            perm=int(parts[3]),
        )
    except ValueError as exc:
        raise RegisterBodyError(f"bad topic config entry {s!r}") from exc


def encode_compressed_register_body(
    data_version: DataVersion,
    topics: Iterable[TopicQueueConfig],
    filter_server_list: list[str] | None = None,
    *,
    topic_filter_type: str = "SINGLE_TAG",
) -> bytes:
    """The compressed form a broker sends (used by tests; a broker may use it too)."""
    topics = list(topics)

    def chunk(b: bytes) -> bytes:
        return struct.pack(">i", len(b)) + b

    raw = [chunk(data_version_json(data_version)), struct.pack(">i", len(topics))]
    for tc in topics:
        line = (
            f"{tc.topic_name} {tc.read_queue_nums} {tc.write_queue_nums} {tc.perm} "
            f"{topic_filter_type}"
        )
        raw.append(chunk(line.encode()))
    raw.append(chunk(json.dumps(filter_server_list or []).encode()))
    return zlib.compress(b"".join(raw), 9)
