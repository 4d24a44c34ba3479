"""`rmq.sync` and `rmq.aio` clients take and return what the Trio clients do.

Each bridge class writes its methods out (a blocking call or a coroutine that runs the Trio
method on the portal), so type checkers and editors see real signatures. These tests keep the
written-out signatures equal to the Trio ones: the same parameter names, kinds, defaults and
types, the same result type, a coroutine exactly where the Trio method is one (asyncio) or a
plain call (blocking), and no Trio method without a twin unless it is listed below with why.
"""

from __future__ import annotations

import inspect
import textwrap
import typing
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
from mypy import api as mypy_api

import rmq
from rmq import aio, sync

ROOT = Path(__file__).resolve().parents[2]
CLIENTS = [
    "Admin",
    "LitePullConsumer",
    "Producer",
    "PullConsumer",
    "PushConsumer",
    "TransactionProducer",
]
BRIDGES = [sync, aio]

# Public members of the Trio clients the bridges leave out: what the client's own machinery
# (ClientInstance, the consume and pull services, rmq/sync_send.py) calls on the Trio object,
# in the portal thread. None of it is a user call.
TRIO_ONLY = {
    "client",  # the ClientInstance, a Trio object
    "over_tcp",  # read by the blocking send path on the Trio producer
    "heartbeat_producer_group",  # ClientInstance's heartbeat hook
    "publish_info",  # a step of the blocking send path
    "send_prepared",  # ditto
    "broadcasting",  # the consume service's view of the message model
    "offset_store",  # the rebalance's and consume service's store
    "consumer_data",  # heartbeat hook
    "compute_pull_from_where",  # rebalance hook
    "start_pull",  # rebalance hook
    "rebalance_immediately",  # NOTIFY_CONSUMER_IDS_CHANGED hook (sets a Trio event)
    "send_message_back",  # the consume service's retry path
    "running_info_json",  # GET_CONSUMER_RUNNING_INFO answer
    "consume_message_directly",  # CONSUME_MESSAGE_DIRECTLY answer
    "offset_table_of",  # GET_CONSUMER_STATUS_FROM_CLIENT answer
    "reset_offset_table",  # RESET_CONSUMER_CLIENT_OFFSET hook
}
# The bridges' own forms: a callback that is a plain function (blocking) or runs on the
# asyncio loop instead of a Trio coroutine, and `send_async`, which starts the send in the
# bridge's own world (a future / an asyncio task) rather than in a Trio nursery.
OWN_FORM = {"register_listener", "register_orderly_listener", "send_async"}
# what only the blocking bridge has: it opens and closes without `with`
SYNC_ONLY = {"open", "close"}


def public(cls: type) -> set[str]:
    return {name for name in dir(cls) if not name.startswith("_")}


def is_property(cls: type, name: str) -> bool:
    return isinstance(inspect.getattr_static(cls, name), property)


def pairs() -> list[tuple[ModuleType, str, str]]:
    out = []
    for bridge in BRIDGES:
        for client in CLIENTS:
            trio_cls = getattr(rmq, client)
            for name in sorted(public(trio_cls) - TRIO_ONLY):
                out.append((bridge, client, name))
    return out


def _id(p: tuple[ModuleType, str, str]) -> str:
    bridge, client, name = p
    return f"{bridge.__name__}.{client}.{name}"


@pytest.mark.parametrize("bridge", BRIDGES, ids=lambda m: m.__name__)
@pytest.mark.parametrize("client", CLIENTS)
def test_bridge_offers_nothing_the_trio_client_lacks(bridge: ModuleType, client: str) -> None:
    extra = public(getattr(bridge, client)) - public(getattr(rmq, client))
    if bridge is sync:
        extra -= SYNC_ONLY
    assert not extra


@pytest.mark.parametrize("bridge", BRIDGES, ids=lambda m: m.__name__)
@pytest.mark.parametrize("client", CLIENTS)
def test_constructor_takes_the_trio_arguments(bridge: ModuleType, client: str) -> None:
    assert inspect.signature(getattr(bridge, client)) == inspect.signature(getattr(rmq, client))


@pytest.mark.parametrize("pair", pairs(), ids=_id)
def test_method_mirrors_the_trio_method(pair: tuple[ModuleType, str, str]) -> None:
    bridge, client, name = pair
    bridge_cls, trio_cls = getattr(bridge, client), getattr(rmq, client)
    assert hasattr(bridge_cls, name), f"{bridge.__name__}.{client} lacks {name}"
    if is_property(trio_cls, name):
        assert is_property(bridge_cls, name)
        want = typing.get_type_hints(inspect.getattr_static(trio_cls, name).fget)
        got = typing.get_type_hints(inspect.getattr_static(bridge_cls, name).fget)
        assert got == want
        return
    ours: Callable[..., object] = getattr(bridge_cls, name)
    theirs: Callable[..., object] = getattr(trio_cls, name)
    if bridge is aio and name not in OWN_FORM:
        assert inspect.iscoroutinefunction(ours) == inspect.iscoroutinefunction(theirs)
    else:
        assert not inspect.iscoroutinefunction(ours)

    got_params = list(inspect.signature(ours).parameters.values())
    want_params = list(inspect.signature(theirs).parameters.values())
    if name == "send_async":  # the Trio form also takes the nursery to start the send in
        want_params = [p for p in want_params if p.name != "nursery"]
    assert [(p.name, p.kind, p.default) for p in got_params] == [
        (p.name, p.kind, p.default) for p in want_params
    ]
    if name not in OWN_FORM:
        assert typing.get_type_hints(ours) == typing.get_type_hints(theirs)


def test_type_checkers_see_the_signatures(tmp_path: Path) -> None:
    snippet = tmp_path / "snippet.py"
    snippet.write_text(
        textwrap.dedent(
            """
            import rmq.aio
            import rmq.sync

            reveal_type(rmq.sync.Producer("pg").send)
            reveal_type(rmq.aio.Producer("pg").send)
            rmq.sync.PushConsumer("g", no_such_option=1)
            """
        )
    )
    out, err, _ = mypy_api.run(
        [
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--cache-dir",
            str(ROOT / ".mypy_cache"),
            str(snippet),
        ]
    )
    revealed = [line for line in out.splitlines() if "Revealed type" in line]
    assert len(revealed) == 2, out + err
    sync_send, aio_send = revealed
    assert "def (msg: rmq.message.Message, *, queue:" in sync_send
    assert sync_send.endswith('-> rmq.send_result.SendResult"')
    assert "def (msg: rmq.message.Message, *, queue:" in aio_send
    assert aio_send.endswith('-> typing.Coroutine[Any, Any, rmq.send_result.SendResult]"')
    assert 'Unexpected keyword argument "no_such_option" for "PushConsumer"' in out
