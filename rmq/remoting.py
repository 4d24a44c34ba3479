"""What the client needs of a remoting client: the seam between `rmq` and the transport.

`common.remoting.client.RemotingClient` is the one implementation; the Protocols say which of
its methods the client's parts rely on, so a part can be handed anything that answers them (a
client on the in-memory network, a fault-injecting wrapper) and mypy checks the call sites.

- `Invoker`: request/response only. The typed request helpers (`ClientAPI`, `AdminAPI`) and
  the CLI's one-off calls need no more.
- `Remoting`: what a `ClientInstance` holds and lends its parts: it also sends oneway
  requests (the producer's oneway send) and takes the handler for the requests a broker sends
  the client (NOTIFY_CONSUMER_IDS_CHANGED, GET_CONSUMER_RUNNING_INFO, ...).

`close_channel` is not part of it: no part of the client closes a connection by hand.
"""

from __future__ import annotations

from typing import Protocol

from common.remoting.channel import Handler
from common.remoting.command import RemotingCommand


class Invoker(Protocol):
    async def invoke(
        self, addr: str, cmd: RemotingCommand, timeout: float = ...
    ) -> RemotingCommand: ...


class Remoting(Invoker, Protocol):
    async def invoke_oneway(
        self, addr: str, cmd: RemotingCommand, timeout: float = ...
    ) -> None: ...

    def set_request_handler(self, handler: Handler | None) -> None: ...
