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

from collections.abc import Mapping
from typing import Protocol

from common.errors import error_for_response
from common.remoting.channel import Handler
from common.remoting.codes import ResponseCode
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


class RequestHelpers:
    """One request, one answer: what `ClientAPI` and `AdminAPI` build every call on."""

    def __init__(self, remoting: Invoker) -> None:
        self.remoting = remoting

    async def _call(
        self,
        addr: str,
        code: int,
        ext: Mapping[str, object] | None = None,
        body: bytes = b"",
        *,
        timeout: float,
    ) -> RemotingCommand:
        return await self.remoting.invoke(addr, RemotingCommand.request(code, ext, body), timeout)

    async def _call_ok(
        self,
        addr: str,
        code: int,
        ext: Mapping[str, object] | None = None,
        body: bytes = b"",
        *,
        timeout: float,
    ) -> RemotingCommand:
        """The answer if it is SUCCESS, else the error class of its code (common.errors)."""
        resp = await self._call(addr, code, ext, body, timeout=timeout)
        if resp.code != ResponseCode.SUCCESS:
            raise error_for_response(resp.code, resp.remark)
        return resp
