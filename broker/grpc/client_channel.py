"""A 5.x gRPC client seen as a 4.x client connection (``Channel``) by the broker's managers.

The broker's producer and consumer managers, the transaction check and the send path all work
on :class:`~common.remoting.channel.Channel` objects: a 4.x client is its TCP connection. A 5.x
client has no such connection (its calls come on HTTP/2 streams, perhaps over several
connections), so each client id gets one :class:`GrpcClientChannel`: registered with the
managers like a connection (``rmq top`` and the group's consumer list see it), used as the
"connection" a send came on (its peer address is the born host), and, for the transaction
check, the way a CHECK_TRANSACTION_STATE reaches the client: ``send`` turns that command into
a Telemetry ``RecoverOrphanedTransactionCommand`` on the client's open telemetry stream (RocketMQ
5's proxy does the same in ``GrpcClientChannel`` / ``ProxyChannel``). Other 4.x pushes
(NOTIFY_CONSUMER_IDS_CHANGED) mean nothing to a 5.x client and are dropped. Without an open
telemetry stream a check is dropped too; the half message is checked again next round.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import trio

from broker.grpc.converter import message_of
from common.grpc.v2 import definition_pb2 as pb
from common.grpc.v2 import service_pb2 as spb
from common.message import RecordDecodeError, decode_record
from common.remoting.channel import PROTOCOL_ATTR, Channel
from common.remoting.codes import RequestCode
from common.remoting.command import RemotingCommand

log = logging.getLogger(__name__)

TelemetrySend = Callable[[spb.TelemetryCommand], Awaitable[None]]


class _NoStream(trio.abc.Stream):
    """The stream under a GrpcClientChannel: there is none (nothing is ever written to it)."""

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        raise trio.ClosedResourceError("a gRPC client has no remoting connection")

    async def wait_send_all_might_not_block(self) -> None:
        raise trio.ClosedResourceError("a gRPC client has no remoting connection")

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        return b""

    async def aclose(self) -> None:
        pass


def transaction_id(commit_log_offset: int, tran_state_table_offset: int) -> str:
    """The transaction id a 5.x producer carries back in EndTransaction: where the half message
    is (the 4.x END_TRANSACTION needs both offsets), so ending it needs no server state."""
    return f"{commit_log_offset:X}-{tran_state_table_offset:X}"


def parse_transaction_id(text: str) -> tuple[int, int] | None:
    head, sep, tail = text.partition("-")
    try:
        return (int(head, 16), int(tail, 16)) if sep else None
    except ValueError:
        return None


class GrpcClientChannel(Channel):
    def __init__(self, client_id: str, remote_addr: str, namespace: str = "") -> None:
        super().__init__(_NoStream(), remote_addr)
        # what the admin answers (connection lists, producer info) say it speaks: the value of
        # the `x-mq-protocol` header the 5.x clients send; a 4.x connection has no entry
        self.attrs[PROTOCOL_ATTR] = "GRPC_V2"
        self.client_id = client_id
        self.namespace = namespace
        self.telemetry: TelemetrySend | None = None
        self.last_seen = trio.current_time()
        self.settings: pb.Settings | None = None
        # the producer groups (topics) and consumer group this client is registered under
        self.producer_groups: set[str] = set()
        self.consumer_group: str | None = None

    def __repr__(self) -> str:
        return f"<GrpcClientChannel {self.client_id} {self.remote_addr}>"

    async def send(self, cmd: RemotingCommand) -> None:
        if cmd.code != RequestCode.CHECK_TRANSACTION_STATE:
            return
        push = self.telemetry
        if push is None:
            log.info("check of %s: client %s has no telemetry stream", cmd.ext_fields, self)
            return
        fields = cmd.ext_fields
        try:
            msg = decode_record(cmd.body_bytes())
            commit_log_offset = int(fields.get("commitLogOffset", msg.commit_log_offset))
            table_offset = int(fields.get("tranStateTableOffset", msg.queue_offset))
        except (RecordDecodeError, ValueError) as exc:
            log.warning("check for %s: undecodable half message: %s", self, exc)
            return
        command = spb.TelemetryCommand(
            recover_orphaned_transaction_command=spb.RecoverOrphanedTransactionCommand(
                message=message_of(msg, namespace=self.namespace),
                transaction_id=transaction_id(commit_log_offset, table_offset),
            )
        )
        await push(command)
