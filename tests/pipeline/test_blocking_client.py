"""The live reader's blocking client reconnects once when its cached connection died (the
node restarted between two micro-batches), instead of failing the query."""

from __future__ import annotations

import socket
import threading

from common.remoting.codec import FrameDecoder, encode
from common.remoting.codes import RequestCode
from pipeline.blocking_client import BlockingClient


def _serve(listener: socket.socket, answers: int, seen: list[int]) -> None:
    # one answer per connection, then the connection is closed: like a node restarting
    for _ in range(answers):
        conn, _ = listener.accept()
        with conn:
            decoder = FrameDecoder()
            while True:
                cmds = decoder.feed(conn.recv(65536))
                if cmds:
                    seen.append(cmds[0].opaque)
                    conn.sendall(encode(cmds[0].response(remark="ok")))
                    break


def test_a_dead_cached_connection_is_replaced_once() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    addr = f"127.0.0.1:{listener.getsockname()[1]}"
    seen: list[int] = []
    server = threading.Thread(target=_serve, args=(listener, 2, seen), daemon=True)
    server.start()
    with listener, BlockingClient(timeout=5.0) as client:
        assert client.call(addr, RequestCode.GET_BROKER_RUNTIME_INFO).remark == "ok"
        # the server closed that connection; the next call finds it dead and reconnects
        assert client.call(addr, RequestCode.GET_BROKER_RUNTIME_INFO).remark == "ok"
    server.join(5)
    assert len(seen) == 2
