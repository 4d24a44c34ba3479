"""``RequestDispatcher.register_run``: the requests of the run codes that one read delivers in a
row go to the run handler together, in arrival order, and each gets its own answer or error."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from common.errors import RequestError
from common.remoting.codec import encode
from common.remoting.command import RemotingCommand
from common.remoting.server import Channel, RequestDispatcher, handle_stream
from tests.support.wire import read_answers

RUN_CODE = 1020
OTHER_CODE = 1021


def request(code: int, i: int) -> bytes:
    cmd = RemotingCommand.request(code, {"i": i})
    cmd.opaque = i + 1
    return encode(cmd)


@pytest.mark.timeout(30)
async def test_runs_keep_order_and_answer_each_request_alone(autojump_clock: Any) -> None:
    seen: list[tuple[str, list[int]]] = []

    def single(cmd: RemotingCommand, channel: Channel) -> RemotingCommand:
        seen.append(("single", [int(cmd.ext_fields["i"])]))
        return cmd.response(remark="single")

    def run(cmds: list[RemotingCommand], channel: Channel) -> list[Any]:
        ids = [int(c.ext_fields["i"]) for c in cmds]
        seen.append(("run", ids))
        out: list[Any] = []
        for i in ids:
            if i == 3:
                out.append(RequestError(17, "refused alone"))
            else:
                out.append(RemotingCommand(code=0, remark=f"run of {len(ids)}"))
        return out

    def other(cmd: RemotingCommand, channel: Channel) -> RemotingCommand:
        seen.append(("other", [int(cmd.ext_fields["i"])]))
        return cmd.response(remark="other")

    def guard(cmd: RemotingCommand, channel: Channel) -> None:
        if cmd.ext_fields.get("i") == "5":
            raise RequestError(16, "no permission")

    d = RequestDispatcher()
    d.register(RUN_CODE, single, inline=True)
    d.register(OTHER_CODE, other, inline=True)
    d.register_run([RUN_CODE], run)
    d.guard = guard
    codes = [RUN_CODE] * 6 + [OTHER_CODE, RUN_CODE, OTHER_CODE] + [RUN_CODE] * 3
    async with trio.open_nursery() as nursery:
        client, server = trio.testing.memory_stream_pair()
        nursery.start_soon(lambda: handle_stream(server, d))
        # one write: the server reads all twelve requests in one chunk
        await client.send_all(b"".join(request(code, i) for i, code in enumerate(codes)))
        with trio.fail_after(10):
            got = await read_answers(client, len(codes))
        await client.aclose()
    # runs of the run code in a row go together; the guard's refusal (5) never reaches it; a
    # lone one between two others (7) goes to the single handler
    assert seen == [
        ("run", [0, 1, 2, 3, 4]),
        ("other", [6]),
        ("single", [7]),
        ("other", [8]),
        ("run", [9, 10, 11]),
    ]
    assert {o: (r.code, r.remark) for o, r in got.items()} == {
        1: (0, "run of 5"),
        2: (0, "run of 5"),
        3: (0, "run of 5"),
        4: (17, "refused alone"),
        5: (0, "run of 5"),
        6: (16, "no permission"),
        7: (0, "other"),
        8: (0, "single"),
        9: (0, "other"),
        10: (0, "run of 3"),
        11: (0, "run of 3"),
        12: (0, "run of 3"),
    }


def test_run_codes_need_an_inline_handler_and_follow_registration() -> None:
    d = RequestDispatcher()
    with pytest.raises(ValueError):
        d.register_run([RUN_CODE], lambda cmds, ch: [])
    d.register(RUN_CODE, lambda cmd, ch: None, inline=True)
    d.register_run([RUN_CODE], lambda cmds, ch: [])
    assert d.run_codes == {RUN_CODE}
    # a new handler for the code (not the run handler's any more): served one by one
    d.register(RUN_CODE, lambda cmd, ch: None, inline=True)
    assert d.run_codes == frozenset()
