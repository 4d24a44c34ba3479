"""``BrokerConfig.from_properties``'s ``store`` override is checked where it is taken."""

from __future__ import annotations

import pytest

from broker.config import BrokerConfig
from broker.store.config import MessageStoreConfig


def test_store_override_must_be_a_store_config() -> None:
    # (before: taken as it was, and the broker failed later with an AttributeError)
    with pytest.raises(TypeError, match="MessageStoreConfig"):
        BrokerConfig.from_properties("brokerName=b", store="/tmp/store")


def test_store_override_takes_the_file_store_properties() -> None:
    store = MessageStoreConfig(store_path_root_dir="/x")
    c = BrokerConfig.from_properties("maxMessageSize=1024\n", store=store)
    assert c.store.store_path_root_dir == "/x" and c.store.max_message_size == 1024
