import json

import attrs
import pytest

from common import serde
from common.model import (
    BrokerData,
    ClusterInfo,
    ConsumeFromWhere,
    ConsumerOffsetSerializeWrapper,
    ConsumeType,
    DataVersion,
    HeartbeatData,
    KVTable,
    LockBatchRequestBody,
    LockBatchResponseBody,
    MessageModel,
    MessageQueue,
    PermName,
    QueueData,
    RegisterBrokerBody,
    SubscriptionGroupConfig,
    TopicConfig,
    TopicConfigSerializeWrapper,
    TopicList,
    TopicRouteData,
)


def test_route_data_from_fastjson_with_unquoted_keys_and_old_flag_name():
    data = (
        b'{"brokerDatas":[{"brokerAddrs":{0:"10.0.0.1:10911",1:"10.0.0.2:10911"},'
        b'"brokerName":"broker-a","cluster":"DefaultCluster"}],"filterServerTable":{},'
        b'"queueDatas":[{"brokerName":"broker-a","perm":6,"readQueueNums":4,"topicSynFlag":2,'
        b'"writeQueueNums":4}]}'
    )
    route = serde.from_json(data, TopicRouteData)
    assert route.brokerDatas[0].brokerAddrs == {0: "10.0.0.1:10911", 1: "10.0.0.2:10911"}
    assert route.queueDatas == [QueueData("broker-a", 4, 4, 6, 2)]
    assert route.orderTopicConf is None


def test_route_data_out_is_strict_json_with_both_flag_names_and_no_nulls():
    route = TopicRouteData(
        queueDatas=[QueueData("broker-a", 4, 4, 6, 0)],
        brokerDatas=[BrokerData("DefaultCluster", "broker-a", {0: "127.0.0.1:10911"})],
    )
    out = json.loads(serde.to_json(route))
    assert out["brokerDatas"][0]["brokerAddrs"] == {"0": "127.0.0.1:10911"}
    assert out["queueDatas"][0]["topicSysFlag"] == 0
    assert out["queueDatas"][0]["topicSynFlag"] == 0
    assert "orderTopicConf" not in out
    assert serde.from_json(serde.to_json(route), TopicRouteData) == route


def test_cpp_heartbeat_with_int_enums_and_string_sub_version():
    body = (
        b'{"clientID":"14369-127.0.0.1@DEFAULT","consumerDataSet":[{"consumeFromWhere":0,'
        b'"consumeType":1,"groupName":"G","messageModel":1,"subscriptionDataSet":['
        b'{"subString":"*","subVersion":"1795313758651","topic":"%RETRY%G"},'
        b'{"subString":"*","subVersion":"5","topic":"ProbeTopic"}]}]}'
    )
    hb = serde.from_json(body, HeartbeatData)
    assert hb.producerDataSet == []
    [cd] = hb.consumerDataSet
    assert cd.consumeType is ConsumeType.CONSUME_PASSIVELY
    assert cd.messageModel is MessageModel.CLUSTERING
    assert cd.consumeFromWhere is ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET
    assert cd.subscriptionDataSet[0].subVersion == 1795313758651
    assert cd.unitMode is False


def test_java_heartbeat_with_enum_names():
    body = (
        b'{"clientID":"c","consumerDataSet":[{"consumeFromWhere":"CONSUME_FROM_FIRST_OFFSET",'
        b'"consumeType":"CONSUME_ACTIVELY","groupName":"cg","messageModel":"BROADCASTING",'
        b'"subscriptionDataSet":[{"classFilterMode":false,"codeSet":[2598919],"expressionType":"TAG",'
        b'"subString":"TagA","subVersion":1690000000000,"tagsSet":["TagA"],"topic":"T"}],'
        b'"unitMode":false}],"producerDataSet":[{"groupName":"CLIENT_INNER_PRODUCER"}]}'
    )
    hb = serde.from_json(body, HeartbeatData)
    cd = hb.consumerDataSet[0]
    assert cd.consumeFromWhere is ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET
    assert cd.consumeType is ConsumeType.CONSUME_ACTIVELY
    assert cd.messageModel is MessageModel.BROADCASTING
    assert cd.subscriptionDataSet[0].codeSet == [2598919]
    out = json.loads(serde.to_json(hb))
    assert out["consumerDataSet"][0]["consumeType"] == "CONSUME_ACTIVELY"
    assert serde.from_json(serde.to_json(hb), HeartbeatData) == hb


def test_consume_from_where_ordinals_match_java():
    assert int(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET) == 4
    assert int(ConsumeFromWhere.CONSUME_FROM_TIMESTAMP) == 5


def test_bad_enum_value_is_a_value_error():
    with pytest.raises(ValueError):
        serde.from_json(
            b'{"clientID":"c","consumerDataSet":[{"groupName":"g","consumeType":9}]}', HeartbeatData
        )


def test_register_broker_body_round_trip():
    body = RegisterBrokerBody(
        TopicConfigSerializeWrapper(
            {"TopicTest": TopicConfig("TopicTest", 4, 4)}, DataVersion(1690000000000, 3)
        )
    )
    out = json.loads(serde.to_json(body))
    assert out["topicConfigSerializeWrapper"]["dataVersion"] == {
        "timestamp": 1690000000000,
        "counter": 3,
    }
    tc = out["topicConfigSerializeWrapper"]["topicConfigTable"]["TopicTest"]
    assert tc == {
        "topicName": "TopicTest",
        "readQueueNums": 4,
        "writeQueueNums": 4,
        "perm": 6,
        "topicFilterType": "SINGLE_TAG",
        "topicSysFlag": 0,
        "order": False,
    }
    assert out["filterServerList"] == []
    assert serde.from_json(serde.to_json(body), RegisterBrokerBody) == body


def test_topic_config_compact_encoding():
    tc = TopicConfig("T", 8, 4, 7, "MULTI_TAG")
    assert tc.encode() == "T 8 4 7 MULTI_TAG"
    assert TopicConfig.decode(tc.encode()) == tc
    with pytest.raises(ValueError):
        TopicConfig.decode("T 8")


def test_data_version_next():
    dv = DataVersion(5, 2)
    assert dv.next_version(now_ms=9) == DataVersion(9, 3)
    assert DataVersion.now().timestamp > 0


def test_cluster_info_and_misc_bodies():
    ci = serde.from_json(
        b'{"brokerAddrTable":{"broker-a":{"brokerAddrs":{0:"a:1"},"brokerName":"broker-a",'
        b'"cluster":"C"}},"clusterAddrTable":{"C":["broker-a"]}}',
        ClusterInfo,
    )
    assert ci.brokerAddrTable["broker-a"].select_broker_addr() == "a:1"
    assert serde.to_json(TopicList(["a", "b"])) == b'{"topicList":["a","b"]}'
    assert serde.from_json(b'{"table":{"k":"v"}}', KVTable) == KVTable({"k": "v"})
    offsets = serde.from_json(b'{"offsetTable":{"T@g":{0:10,1:7}}}', ConsumerOffsetSerializeWrapper)
    assert offsets.offsetTable == {"T@g": {0: 10, 1: 7}}


def test_lock_bodies_and_hashable_message_queue():
    req = serde.from_json(
        b'{"clientId":"c","consumerGroup":"cg","mqSet":[{"brokerName":"b","queueId":0,"topic":"T"}]}',
        LockBatchRequestBody,
    )
    assert req.mqSet == [MessageQueue("T", "b", 0)]
    assert len({MessageQueue("T", "b", 0), MessageQueue("T", "b", 0)}) == 1
    out = json.loads(serde.to_json(LockBatchResponseBody(req.mqSet)))
    assert out == {"lockOKMQSet": [{"topic": "T", "brokerName": "b", "queueId": 0}]}


def test_subscription_group_defaults_and_frozen():
    sg = SubscriptionGroupConfig("cg")
    assert sg.retryQueueNums == 1 and sg.retryMaxTimes == 16 and sg.consumeEnable
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        sg.retryMaxTimes = 3  # type: ignore[misc]


def test_perm_name():
    assert PermName.is_readable(6) and PermName.is_writeable(6) and not PermName.is_inherited(6)
    assert PermName.to_string(7) == "RWX"
