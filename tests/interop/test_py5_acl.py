"""The official RocketMQ 5 Python client with Credentials against a broker with ``aclEnable``.

The client signs every gRPC call (``authorization: MQv2-HMAC-SHA1 ...``, broker/grpc/auth.py);
the broker judges it by the same plain_acl.yml as its 4.x port. With the right keys the client
sends and receives; with a wrong secret its send fails with UNAUTHORIZED (40100), and an
account without PUB on the topic with FORBIDDEN (40300): the codes the client raises as
``UnauthorizedException`` / ``ForbiddenException``.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

from common.remoting.client import open_remoting_client
from common.remoting.codes import RequestCode
from common.remoting.command import RemotingCommand
from common.session_credentials import SessionCredentials
from tests.broker.grpc.support import grpc_broker
from tests.interop.py5_harness import run_py5
from tests.support.wire import topic_fields

pytestmark = [pytest.mark.interop, pytest.mark.timeout(300)]

ACL = """
accounts:
  - accessKey: admin-key
    secretKey: admin-secret
    admin: true
  - accessKey: producer-key
    secretKey: producer-secret
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
    topicPerms:
      - AclOrders=PUB
  - accessKey: consumer-key
    secretKey: consumer-secret
    defaultTopicPerm: SUB
    defaultGroupPerm: DENY
    groupPerms:
      - acl-readers=SUB
"""


async def _create_topic(addr: str, topic: str) -> None:
    cmd = RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_TOPIC, topic_fields(topic))
    SessionCredentials("admin-key", "admin-secret").sign(cmd)
    async with open_remoting_client() as client:
        answer = await client.invoke(addr, cmd)
    assert answer.code == 0, answer.remark


async def test_the_5x_client_signs_and_is_judged_by_the_plain_acl(
    tmp_path: Path, py5_python: Path
) -> None:
    acl = tmp_path / "plain_acl.yml"
    acl.write_text(ACL)
    async with grpc_broker(tmp_path / "store", acl_enable=True, acl_file=str(acl)) as b:
        await _create_topic(b.addr, "AclOrders")
        endpoint = f"127.0.0.1:{b.grpc_port}"

        async def driver(run: str, *args: str, check: bool = True) -> list[dict[str, Any]]:
            """A driver run with its own scratch HOME under tmp_path/run (client_log reads
            the client's log there)."""
            (tmp_path / run).mkdir()
            call = partial(
                run_py5, py5_python, tmp_path / run, *args, "--endpoint", endpoint, "--topic",
                "AclOrders", timeout=150, check=check,
            )  # fmt: skip
            return await trio.to_thread.run_sync(call)

        def client_log(run: str, cmd: str) -> str:
            log = tmp_path / run / f"home-{cmd}" / "logs" / "rocketmq_python"
            return (log / "rocketmq_client.log").read_text(errors="replace")

        def keys(ak: str, sk: str) -> tuple[str, ...]:
            return ("--access-key", ak, "--secret-key", sk)

        # the right keys: the producer publishes, the consumer account receives and acks
        events = await driver(
            "good-send", "produce", "--count", "5", *keys("producer-key", "producer-secret")
        )
        assert [e["i"] for e in events if e["event"] == "sent"] == list(range(5)), events[-5:]
        events = await driver(
            "good-receive", "simple-consume", "--group", "acl-readers", "--expect", "5", "--timeout", "60",
            "--linger", "1", *keys("consumer-key", "consumer-secret"),
        )  # fmt: skip
        acked = {e["body"] for e in events if e["event"] == "ack"}
        assert acked == {f"body-{i}" for i in range(5)}, events[-5:]

        # a wrong secret: every call is UNAUTHORIZED; the client's route query fails with
        # that code (its log), so its send fails
        events = await driver(
            "wrong-secret", "produce", "--count", "1", *keys("producer-key", "wrong-secret"),
            check=False,
        )  # fmt: skip
        assert [e["event"] for e in events if e["event"] in ("sent", "send_error")] == [
            "send_error"
        ], events[-5:]
        log = client_log("wrong-secret", "produce")
        assert "40100, Check signature failed for accessKey=producer-key" in log, log[-3000:]
        assert "4030" not in log

        # an account that may only SUB the topic: its send is FORBIDDEN
        events = await driver(
            "no-pub", "produce", "--count", "1", *keys("consumer-key", "consumer-secret"),
            check=False,
        )  # fmt: skip
        errors = [e for e in events if e["event"] == "send_error"]
        assert errors and errors[0]["code"] == 40300, events[-5:]
        assert "No default permission for topic:AclOrders" in errors[0]["error"]

        # and a group the producer account may not consume with: its receive is FORBIDDEN
        events = await driver(
            "no-sub", "simple-consume", "--group", "acl-readers", "--expect", "1", "--timeout", "5",
            *keys("producer-key", "producer-secret"), check=False,
        )  # fmt: skip
        codes = {e["code"] for e in events if e["event"] == "receive_error"}
        assert codes == {40300}, events[-5:]
        assert not [e for e in events if e["event"] == "recv"]
