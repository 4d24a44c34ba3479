"""Brokers in DLedger mode: configuration, and whole groups on the in-memory networks."""

from __future__ import annotations

import pytest

from broker.config import BrokerConfig
from broker.service import dledger_broker_config

PEERS = "n0-127.0.0.1:40911;n1-127.0.0.1:40912;n2-127.0.0.1:40913"


# --- configuration ------------------------------------------------------------------------------


def test_dledger_keys_are_read_by_their_rocketmq_names():
    config = BrokerConfig.from_properties(
        f"""
        brokerName=RaftNode00
        brokerRole=ASYNC_MASTER
        brokerId=7
        enableDLegerCommitLog=true
        dLegerGroup=RaftNode00
        dLegerPeers={PEERS}
        dLegerSelfId=n1
        preferredLeaderId=n2
        storePathRootDir=/tmp/rmq
        storePathDLedgerCommitLog=/tmp/rmq/raft
        isEnableBatchPush=true
        heartBeatTimeIntervalMs=500
        maxHeartBeatLeak=4
        minVoteIntervalMs=100
        maxVoteIntervalMs=200
        maxWaitAckTimeMs=1500
        maxPushTimeOutMs=700
        dLegerSlaveSyncInterval=2000
        """
    )
    s = config.store
    assert config.dledger and s.enable_dleger_commit_log
    assert (s.dleger_group, s.dleger_self_id, s.preferred_leader_id) == ("RaftNode00", "n1", "n2")
    assert s.dledger_peer_map() == {
        "n0": "127.0.0.1:40911",
        "n1": "127.0.0.1:40912",
        "n2": "127.0.0.1:40913",
    }
    assert s.dledger_store_dir == "/tmp/rmq/raft" and s.enable_batch_push
    assert (s.heart_beat_time_interval_ms, s.max_heart_beat_leak) == (500, 4)
    assert (s.min_vote_interval_ms, s.max_vote_interval_ms) == (100, 200)
    assert (s.max_wait_ack_time_ms, s.max_push_time_out_ms) == (1500, 700)
    assert config.dledger_slave_sync_interval == 2.0
    # the role is the Raft role's, so brokerRole/brokerId rules are not applied
    assert config.broker_id == 7


def test_dledger_defaults_are_dledgers():
    config = BrokerConfig.from_properties(
        f"enableDLegerCommitLog=true\ndLegerPeers={PEERS}\ndLegerSelfId=n0\nbrokerName=b\n"
        "storePathRootDir=/data\nenableBatchPush=false\n"
    )
    s = config.store
    assert s.dledger_store_dir == "/data/dledger_commitlog"
    assert (s.heart_beat_time_interval_ms, s.max_heart_beat_leak) == (2000, 3)
    assert (s.min_vote_interval_ms, s.max_vote_interval_ms) == (300, 1000)
    assert (s.max_wait_ack_time_ms, s.max_push_time_out_ms) == (2500, 1000)
    assert not s.enable_batch_push and s.preferred_leader_id is None
    assert config.dledger_slave_sync_interval == 5.0
    # the group defaults to the broker name when run
    assert dledger_broker_config(config).store.dleger_group == "b"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("dLegerPeers=n0-127.0.0.1", "dLegerPeers"),
        ("dLegerPeers=n0-127.0.0.1:99999", "dLegerPeers"),
        ("dLegerPeers=a-127.0.0.1:1", "member id"),
        ("dLegerPeers=n0-h:1;n0-h:2", "listed twice"),
        ("dLegerSelfId=zero", "dLegerSelfId"),
        ("heartBeatTimeIntervalMs=0", "heartBeatTimeIntervalMs"),
        ("maxVoteIntervalMs=-5", "maxVoteIntervalMs"),
        ("maxWaitAckTimeMs=soon", "maxWaitAckTimeMs"),
        ("isEnableBatchPush=yes", "isEnableBatchPush"),
        ("enableDLegerCommitLog=1", "enableDLegerCommitLog"),
        (f"enableDLegerCommitLog=true\ndLegerPeers={PEERS}\ndLegerSelfId=n5", "not one of"),
        (
            f"enableDLegerCommitLog=true\ndLegerPeers={PEERS}\ndLegerSelfId=n0\n"
            "preferredLeaderId=n9",
            "preferredLeaderId",
        ),
        (
            f"enableDLegerCommitLog=true\ndLegerPeers={PEERS}\ndLegerSelfId=n0\n"
            "minVoteIntervalMs=900\nmaxVoteIntervalMs=800",
            "minVoteIntervalMs",
        ),
    ],
)
def test_bad_dledger_values_are_config_errors(text, message):
    with pytest.raises(ValueError, match=message):
        BrokerConfig.from_properties(text)


def test_an_incomplete_group_fails_at_start():
    config = BrokerConfig.from_properties("enableDLegerCommitLog=true\ndLegerSelfId=n0\n")
    with pytest.raises(ValueError, match="dLegerPeers is empty"):
        dledger_broker_config(config)
