"""AdminAPI's reading of what clients answer through the broker (ConsumerRunningInfo,
ConsumeMessageDirectlyResult, offset tables), in the shapes Java and C++ clients write, from a
fake invoker: no broker needed."""

from __future__ import annotations

import json

import pytest

from common.errors import ProtocolError
from common.model import MessageQueue
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import RemotingCommand
from rmq.admin_api import AdminAPI

MQ = MessageQueue("T", "broker-a", 0)


class Fake:
    def __init__(self, body: bytes, code: int = ResponseCode.SUCCESS) -> None:
        self.body, self.code = body, code
        self.sent: list[RemotingCommand] = []

    async def invoke(
        self, addr: str, cmd: RemotingCommand, timeout: float = 3.0
    ) -> RemotingCommand:
        self.sent.append(cmd)
        return cmd.response(self.code, "remark" if self.code else None, body=self.body)


JAVA_INFO = (
    b'{"jstack":null,"mqTable":{{"brokerName":"broker-a","queueId":0,"topic":"T"}:'
    b'{"cachedMsgCount":2,"commitOffset":5,"locked":false}},'
    b'"properties":{"PROP_CONSUME_TYPE":"CONSUME_PASSIVELY","PROP_THREADPOOL_CORE_SIZE":20},'
    b'"statusTable":{"T":{"consumeOKTPS":1.5,"pullRT":2.0}},'
    b'"subscriptionSet":[{"subString":"*","topic":"T"}]}'
)
# rocketmq-client-cpp 2.x: keys styled over several lines, an empty mqTable written as `}`
CPP_INFO = (
    b'{"mqTable":{{\n   "brokerName" : "broker-a",\n   "queueId" : 0,\n   "topic" : "T"\n}:'
    b'{\n   "commitOffset" : 5\n}},"jstack":"","properties":{"PROP_CONSUME_TYPE":'
    b'"CONSUME_PASSIVELY"},"subscriptionSet":[{"subString":"*","topic":"T"}]}\n'
)
CPP_EMPTY = (
    b'{"mqTable":},"jstack":"","properties":{"PROP_CONSUME_TYPE":"CONSUME_PASSIVELY"},'
    b'"subscriptionSet":[{"subString":"*","topic":"T"}]}\n'
)


async def test_running_info_as_java_writes_it():
    fake = Fake(JAVA_INFO)
    info = await AdminAPI(fake).consumer_running_info("a:1", "g", "c@1", timeout=1)
    (sent,) = fake.sent
    assert sent.code == RequestCode.GET_CONSUMER_RUNNING_INFO
    assert sent.ext_fields == {"consumerGroup": "g", "clientId": "c@1", "jstackEnable": "false"}
    assert info.properties["PROP_THREADPOOL_CORE_SIZE"] == "20"
    assert info.mq_table == [(MQ, {"cachedMsgCount": 2, "commitOffset": 5, "locked": False})]
    assert info.status_table["T"]["consumeOKTPS"] == 1.5
    assert info.subscriptions == [{"subString": "*", "topic": "T"}]
    assert info.jstack is None


@pytest.mark.parametrize(("body", "queues"), [(CPP_INFO, [MQ]), (CPP_EMPTY, [])])
async def test_running_info_as_the_cpp_client_writes_it(body, queues):
    info = await AdminAPI(Fake(body)).consumer_running_info("a:1", "g", "c@1", timeout=1)
    assert [mq for mq, _ in info.mq_table] == queues
    assert info.properties == {"PROP_CONSUME_TYPE": "CONSUME_PASSIVELY"}
    assert info.status_table == {}


async def test_bad_answers():
    with pytest.raises(ProtocolError):
        await AdminAPI(Fake(b"[1]")).consumer_running_info("a:1", "g", "c", timeout=1)
    with pytest.raises(ProtocolError):
        await AdminAPI(Fake(b'{"mqTable":{1:2}}')).consumer_running_info("a:1", "g", "c", timeout=1)
    with pytest.raises(Exception, match="remark"):
        await AdminAPI(Fake(b"", ResponseCode.SYSTEM_ERROR)).consumer_running_info(
            "a:1", "g", "c", timeout=1
        )


async def test_direct_consume_result():
    body = json.dumps(
        {
            "order": False,
            "autoCommit": True,
            "consumeResult": "CR_LATER",
            "remark": "r",
            "spentTimeMills": 12,
        }
    ).encode()
    fake = Fake(body)
    r = await AdminAPI(fake).consume_message_directly("a:1", "g", "c@1", "ID", timeout=1)
    assert (r.consume_result, r.remark, r.spent_time_ms, r.order, r.auto_commit) == (
        "CR_LATER",
        "r",
        12,
        False,
        True,
    )
    assert fake.sent[0].ext_fields == {"consumerGroup": "g", "clientId": "c@1", "msgId": "ID"}
    with pytest.raises(ProtocolError):
        await AdminAPI(Fake(b"[]")).consume_message_directly("a:1", "g", "c", "ID", timeout=1)


async def test_reset_and_status_requests_carry_the_java_admins_fields():
    fake = Fake(b'{"offsetTable":{{"brokerName":"broker-a","queueId":0,"topic":"T"}:3}}')
    table = await AdminAPI(fake).reset_offset("a:1", "T", "g", 123, True, timeout=1)
    assert table == {MQ: 3}
    assert fake.sent[0].code == RequestCode.INVOKE_BROKER_TO_RESET_OFFSET
    assert fake.sent[0].ext_fields == {
        "topic": "T",
        "group": "g",
        "timestamp": "123",
        "isForce": "true",
    }
    fake = Fake(b'{"consumerTable":{"c@1":{{"brokerName":"broker-a","queueId":0,"topic":"T"}:4}}}')
    assert await AdminAPI(fake).consumer_status("a:1", "T", "g", "c@1", timeout=1) == {
        "c@1": {MQ: 4}
    }
    assert fake.sent[0].ext_fields == {"topic": "T", "group": "g", "clientAddr": "c@1"}
