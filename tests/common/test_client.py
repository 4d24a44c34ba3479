import pytest
import trio
import trio.testing

from common.errors import RemotingConnectError, RemotingTimeoutError
from common.remoting.client import open_remoting_client, parse_addr
from common.remoting.command import RemotingCommand
from common.remoting.server import RequestDispatcher, handle_stream


class MemoryNetwork:
    """Addresses served by in-memory dispatchers; counts connects per address."""

    def __init__(self, nursery):
        self.nursery = nursery
        self.servers: dict[str, RequestDispatcher] = {}
        self.connects: dict[str, int] = {}
        self.server_channels = []

    async def connect(self, addr):
        self.connects[addr] = self.connects.get(addr, 0) + 1
        if addr not in self.servers:
            raise ConnectionRefusedError(f"nothing listens on {addr}")
        client_side, server_side = trio.testing.memory_stream_pair()
        dispatcher = self.servers[addr]
        self.nursery.start_soon(
            lambda: handle_stream(server_side, dispatcher, remote_addr="client")
        )
        return client_side


def server():
    d = RequestDispatcher()

    async def delayed(cmd, channel):
        await trio.sleep(float(cmd.ext_fields["delay"]))
        return cmd.response(remark=cmd.ext_fields["delay"])

    d.register(1, delayed)
    return d


async def test_pipelined_requests_match_by_opaque(autojump_clock):
    async with trio.open_nursery() as nursery:
        net = MemoryNetwork(nursery)
        net.servers["b:1"] = server()
        results = {}
        async with open_remoting_client(connect=net.connect) as client:

            async def call(delay):
                resp = await client.invoke("b:1", RemotingCommand.request(1, {"delay": delay}), 10)
                results[delay] = (resp.remark, trio.current_time())

            async with trio.open_nursery() as calls:
                for delay in ("3", "1", "2"):
                    calls.start_soon(call, delay)
        assert {k: v[0] for k, v in results.items()} == {"1": "1", "2": "2", "3": "3"}
        assert results["1"][1] < results["2"][1] < results["3"][1] < 3.5
        assert net.connects == {"b:1": 1}  # one shared connection


async def test_timeout_then_same_connection_still_works(autojump_clock):
    async with trio.open_nursery() as nursery:
        net = MemoryNetwork(nursery)
        net.servers["b:1"] = server()
        async with open_remoting_client(connect=net.connect) as client:
            start = trio.current_time()
            with pytest.raises(RemotingTimeoutError):
                await client.invoke("b:1", RemotingCommand.request(1, {"delay": "60"}), 2.0)
            assert 2.0 <= trio.current_time() - start < 2.5
            resp = await client.invoke("b:1", RemotingCommand.request(1, {"delay": "0"}), 2.0)
            assert resp.remark == "0"
            # the late answer to the timed-out request arrives and is ignored
            await trio.sleep(70)
            resp = await client.invoke("b:1", RemotingCommand.request(1, {"delay": "0.5"}), 2.0)
            assert resp.remark == "0.5"
        assert net.connects == {"b:1": 1}


async def test_reconnect_after_server_closed_connection(autojump_clock):
    async with trio.open_nursery() as nursery:
        net = MemoryNetwork(nursery)
        d = server()

        async def hang_up(cmd, channel):
            channel.close()

        d.register(2, hang_up)
        net.servers["b:1"] = d
        async with open_remoting_client(connect=net.connect) as client:
            with pytest.raises(RemotingConnectError):
                await client.invoke("b:1", RemotingCommand.request(2), 5)
            assert trio.current_time() < 1  # failed at once, not by timeout
            resp = await client.invoke("b:1", RemotingCommand.request(1, {"delay": "0"}), 5)
            assert resp.code == 0
        assert net.connects == {"b:1": 2}


async def test_pending_requests_fail_when_connection_drops(autojump_clock):
    async with trio.open_nursery() as nursery:
        net = MemoryNetwork(nursery)
        d = server()
        channels = []

        async def remember(cmd, channel):
            channels.append(channel)
            return cmd.response()

        d.register(3, remember)
        net.servers["b:1"] = d
        async with open_remoting_client(connect=net.connect) as client:
            await client.invoke("b:1", RemotingCommand.request(3), 5)
            errors = []

            async def waiting():
                try:
                    await client.invoke("b:1", RemotingCommand.request(1, {"delay": "50"}), 100)
                except RemotingConnectError as exc:
                    errors.append(trio.current_time())
                    assert "closed" in str(exc)

            async with trio.open_nursery() as calls:
                calls.start_soon(waiting)
                calls.start_soon(waiting)
                await trio.sleep(5)
                channels[0].close()
            assert len(errors) == 2 and all(t < 6 for t in errors)


async def test_connect_errors(autojump_clock):
    async with trio.open_nursery() as nursery:
        net = MemoryNetwork(nursery)

        async def never(addr):
            await trio.sleep_forever()

        async with open_remoting_client(connect=net.connect) as client:
            with pytest.raises(RemotingConnectError, match="nothing listens"):
                await client.invoke("nobody:1", RemotingCommand.request(1), 5)
        async with open_remoting_client(connect=never, connect_timeout=1.5) as client:
            with pytest.raises(RemotingConnectError, match="timed out"):
                await client.invoke("slow:1", RemotingCommand.request(1), 5)
            assert 1.5 <= trio.current_time() < 2
            # the overall timeout wins when it is shorter than the connect timeout
            with pytest.raises(RemotingTimeoutError):
                await client.invoke("slow:1", RemotingCommand.request(1), 0.5)


async def test_server_to_client_requests(autojump_clock):
    async with trio.open_nursery() as nursery:
        net = MemoryNetwork(nursery)
        d = server()
        asked = []

        async def ask_back(cmd, channel):
            reply = await channel.invoke(RemotingCommand.request(40, {"consumerGroup": "g"}), 3)
            await channel.send(RemotingCommand.request(40, {"consumerGroup": "push"}, oneway=True))
            return cmd.response(remark=f"{reply.code}:{reply.remark}")

        d.register(4, ask_back)
        net.servers["b:1"] = d
        async with open_remoting_client(connect=net.connect) as client:
            # without a handler the client answers REQUEST_CODE_NOT_SUPPORTED
            resp = await client.invoke("b:1", RemotingCommand.request(4), 5)
            assert resp.remark == "3: request type 40 not supported"

            async def on_request(cmd, channel):
                asked.append(cmd.ext_fields["consumerGroup"])
                return cmd.response(remark="ok")

            client.set_request_handler(on_request)
            resp = await client.invoke("b:1", RemotingCommand.request(4), 5)
            assert resp.remark == "0:ok"
            await trio.sleep(1)
        assert asked == ["g", "push"]


async def test_oneway_and_close_channel(autojump_clock):
    async with trio.open_nursery() as nursery:
        net = MemoryNetwork(nursery)
        d = server()
        got = []

        async def record(cmd, channel):
            got.append(cmd.is_oneway)
            return cmd.response()

        d.register(5, record)
        net.servers["b:1"] = d
        async with open_remoting_client(connect=net.connect) as client:
            await client.invoke_oneway("b:1", RemotingCommand.request(5))
            await trio.sleep(1)
            client.close_channel("b:1")
            await client.invoke("b:1", RemotingCommand.request(5), 3)
        assert got == [True, False]
        assert net.connects == {"b:1": 2}


async def test_errors_in_body_are_not_wrapped_in_groups():
    with pytest.raises(KeyError):
        async with open_remoting_client():
            raise KeyError("mine")


def test_parse_addr():
    assert parse_addr("127.0.0.1:9876") == ("127.0.0.1", 9876)
    assert parse_addr("[::1]:10911") == ("::1", 10911)
    for bad in ("nohost", ":1", "h:x"):
        with pytest.raises(RemotingConnectError):
            parse_addr(bad)
