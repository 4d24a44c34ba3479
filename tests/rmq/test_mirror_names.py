"""`rmq.sync` and `rmq.aio` offer every public name of `rmq`.

Code moves between Trio, blocking and asyncio by changing one import line
(`from rmq.sync import ConsumeStatus, Message, Producer, PushConsumer`), so each bridge must
export all of `rmq.__all__`: the clients as its own blocking/asyncio versions, every other name
(messages, results, enums, errors, helpers) as the very same object.
"""

from __future__ import annotations

import importlib

import pytest

import rmq

CLIENTS = {
    "Admin",
    "LitePullConsumer",
    "Producer",
    "PullConsumer",
    "PushConsumer",
    "TransactionProducer",
}


def test_clients_are_in_rmq_all() -> None:
    # guards the split below: a client renamed in rmq must be renamed here too
    assert CLIENTS <= set(rmq.__all__)


@pytest.mark.parametrize("bridge", ["rmq.sync", "rmq.aio"])
@pytest.mark.parametrize("name", sorted(rmq.__all__))
def test_bridge_mirrors_public_name(bridge: str, name: str) -> None:
    module = importlib.import_module(bridge)
    assert name in module.__all__, f"{bridge}.__all__ lacks {name}"
    ns: dict = {}
    exec(f"from {bridge} import {name}", ns)  # the import a user writes
    value, original = ns[name], getattr(rmq, name)
    if name in CLIENTS:
        assert value is not original, f"{bridge}.{name} is the Trio client itself"
        assert value.__module__ == bridge
        assert value._async_cls is original
    else:
        assert value is original, f"{bridge}.{name} is not rmq.{name}"


@pytest.mark.parametrize("bridge", ["rmq.sync", "rmq.aio"])
def test_bridge_exports_nothing_rmq_lacks(bridge: str) -> None:
    # a name only one flavour has would break moving code between them
    assert set(importlib.import_module(bridge).__all__) == set(rmq.__all__)


def test_readme_import_line() -> None:
    from rmq.sync import ConsumeStatus, Message, Producer, PushConsumer  # noqa: F401
