"""UPDATE_AND_CREATE_TOPIC's ``attributes`` field (RocketMQ 5): set, kept, refused."""

from __future__ import annotations

from pathlib import Path

import trio
import trio.lowlevel

from common.remoting.client import open_remoting_client
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import RemotingCommand
from tests.broker.grpc.support import grpc_broker
from tests.support.wire import topic_fields


async def test_attributes_set_kept_on_update_and_refused_when_malformed(tmp_path: Path) -> None:
    async with grpc_broker(tmp_path) as b, open_remoting_client() as client:

        async def create(**extra: object) -> RemotingCommand:
            cmd = RemotingCommand.request(
                RequestCode.UPDATE_AND_CREATE_TOPIC, topic_fields("A", **extra)
            )
            return await client.invoke(b.addr, cmd)

        tcm = b.controller.topic_config_manager
        assert (await create(attributes="+message.type=FIFO")).code == ResponseCode.SUCCESS
        tc = tcm.select_topic_config("A")
        assert tc is not None and tc.attributes == {"message.type": "FIFO"}
        # an update without the field (a 4.x admin) keeps them
        assert (await create()).code == ResponseCode.SUCCESS
        tc = tcm.select_topic_config("A")
        assert tc is not None and tc.attributes == {"message.type": "FIFO"}
        bad = await create(attributes="+message.type=SOMETIMES")
        assert bad.code == ResponseCode.SYSTEM_ERROR and "value is not in set" in (bad.remark or "")
        assert (await create(attributes="-message.type")).code == ResponseCode.SUCCESS
        tc = tcm.select_topic_config("A")
        assert tc is not None and not tc.attributes
        await trio.lowlevel.checkpoint()
