"""Broker configuration (RocketMQ ``BrokerConfig`` + the broker-facing half of ``MessageStoreConfig``).

Theory of operation
-------------------
``BrokerConfig`` is a frozen attrs value: a running broker never sees its configuration change
under it.  Times are seconds (floats) like everything on the Trio clock; the RocketMQ property
names that carry milliseconds are converted when parsed.

``BrokerConfig.from_properties(text)`` reads a RocketMQ ``broker.conf`` (Java properties syntax:
``key=value``, ``key: value`` or ``key value``; ``#``/``!`` comments).  Each known property name
maps to one field either of the broker config or of the nested ``MessageStoreConfig``; RocketMQ's
historic misspellings (``mapedFileSizeCommitLog``) are accepted next to the fixed ones.  Unknown
names are ignored with a warning (a real broker.conf carries many knobs we do not implement);
a value that does not parse raises ``ValueError`` naming the property, so a typo never silently
turns into a default.

Like ``BrokerStartup``: a master always has brokerId 0 and a SLAVE must have brokerId > 0.  In
DLedger mode (``enableDLegerCommitLog=true``) brokerRole and brokerId are ignored: the broker's
role follows its Raft role at run time (broker/dledger/broker/roles.py).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any  # one use: _FieldValues, whose comment says why

import attrs

from broker.store.config import MessageStoreConfig, parse_delay_levels, parse_dledger_peers
from common.mixall import MASTER_ID
from common.tls import TlsClientConfig, TlsServerConfig, tls_properties

log = logging.getLogger(__name__)


def _parse_bool(v: str) -> bool:
    low = v.strip().lower()
    if low == "true":
        return True
    if low == "false":
        return False
    raise ValueError(f"expected true or false, got {v!r}")


def _parse_int(v: str) -> int:
    return int(v.strip())


def _parse_ms(v: str) -> float:
    """A RocketMQ millisecond property -> seconds."""
    return int(v.strip()) / 1000.0


def _parse_ratio(v: str) -> float:
    r = float(v)
    if not 0.0 < r <= 1.0:
        raise ValueError(f"{v!r} is not a ratio in (0, 1]")
    return r


def _parse_str(v: str) -> str:
    return v.strip()


def _parse_delay_levels(v: str) -> str:
    parse_delay_levels(v.strip())  # raises ValueError for a bad token
    return v.strip()


def _parse_positive_int(v: str) -> int:
    n = int(v.strip())
    if n <= 0:
        raise ValueError(f"expected a positive number, got {v!r}")
    return n


def _parse_peers(v: str) -> str:
    parse_dledger_peers(v)  # raises ValueError naming the bad member
    return v.strip()


def _parse_member_id(v: str) -> str:
    member = v.strip()
    if not (member[:1] == "n" and member[1:].isdigit()):
        raise ValueError(f"expected a DLedger member id n0, n1, ..., got {v!r}")
    return member


def _parse_role(v: str) -> str:
    role = v.strip().upper()
    if role not in ("ASYNC_MASTER", "SYNC_MASTER", "SLAVE"):
        raise ValueError(f"expected ASYNC_MASTER, SYNC_MASTER or SLAVE, got {v!r}")
    return role


def _parse_flush(v: str) -> str:
    kind = v.strip().upper()
    if kind not in ("ASYNC_FLUSH", "SYNC_FLUSH"):
        raise ValueError(f"expected ASYNC_FLUSH or SYNC_FLUSH, got {v!r}")
    return kind


# RocketMQ 5's proxy serves gRPC here by default (ProxyConfig.grpcServerPort)
DEFAULT_GRPC_PORT = 8081


@attrs.frozen
class BrokerConfig:
    broker_name: str = "broker-a"
    broker_cluster_name: str = "DefaultCluster"
    broker_id: int = MASTER_ID
    broker_ip1: str = "127.0.0.1"
    # Advertised HA address host (RocketMQ brokerIP2); defaults to broker_ip1.
    broker_ip2: str | None = None
    # Host to bind; RocketMQ binds 0.0.0.0, tests and `rmq up` use loopback.
    listen_host: str = "127.0.0.1"
    listen_port: int = 10911
    namesrv_addr: str | None = None
    store: MessageStoreConfig = attrs.field(
        factory=lambda: MessageStoreConfig(store_path_root_dir="store")
    )
    auto_create_topic_enable: bool = True
    auto_create_topic_max: int = 1000
    # plain ACL (broker/acl): off by default, as in RocketMQ; the file is RocketMQ's
    # $ROCKETMQ_HOME/conf/plain_acl.yml unless aclFile (ours) names another
    acl_enable: bool = False
    acl_file: str | None = None
    # how often the file is checked for changes (RocketMQ: 5 s)
    acl_watch_interval: float = 5.0
    # TEST ONLY, never set it: every 5th single send is answered SEND_OK and not stored. The
    # chaos harness's checker must catch it (tests/chaos); nothing else reads it
    chaos_ack_before_store: bool = False
    default_topic_queue_nums: int = 8
    auto_create_subscription_group: bool = True
    cluster_topic_enable: bool = True
    broker_topic_enable: bool = True
    trace_topic_enable: bool = False
    register_name_server_period: float = 30.0
    register_broker_timeout: float = 6.0
    region_id: str = "DefaultRegion"
    trace_on: bool = True
    # SEND_REPLY_MESSAGE: also store the reply in <cluster>_REPLY_TOPIC after pushing it
    store_reply_message_enable: bool = True
    broker_permission: int = 6
    long_polling_enable: bool = True
    short_polling_time: float = 1.0
    # Cap on how long one PULL may be held, whatever suspendTimeoutMillis the client asks for.
    max_pull_suspend: float = 15.0
    slave_read_enable: bool = False
    # SQL92 subscriptions (broker/filter); off by default, as in RocketMQ
    enable_property_filter: bool = False
    offset_check_in_slave: bool = False
    flush_consumer_offset_interval: float = 5.0
    channel_expired_timeout: float = 120.0
    client_scan_interval: float = 10.0
    rebalance_lock_max_live_time: float = 60.0
    # Whether the VIP ("fast") channel on listen_port - 2 is opened.
    fast_channel_enable: bool = True
    # SLAVE metadata sync (broker/slave_sync.py): period and delay of the first round.
    slave_sync_interval: float = 60.0
    slave_sync_initial_delay: float = 3.0
    # DLedger mode: a follower's slave sync period (ours; the consumer offsets a new leader
    # starts from are at most this old, so it is far shorter than the classic 60 s)
    dledger_slave_sync_interval: float = 5.0
    # where UPDATE_BROKER_CONFIG writes changed keys (broker/configuration.py): the -c file the
    # broker was started with; None: <storePathRootDir>/config/broker.properties, as RocketMQ's
    # BrokerPathConfigHelper (which is not read back at start, there as here)
    broker_config_path: str | None = None
    # transactional messages (broker/transaction): RocketMQ's names and defaults
    reject_transaction_message: bool = False
    # a half message younger than this is not checked back yet (transactionTimeOut, 6 s)
    transaction_timeout: float = 6.0
    # checks of one half message before it is moved to TRANS_CHECK_MAX_TIME_TOPIC
    transaction_check_max: int = 15
    # the period of the check rounds (transactionCheckInterval, 60 s)
    transaction_check_interval: float = 60.0
    # pop (broker/pop): the revive round period (reviveInterval, 1 s), the revive queues of the
    # cluster's revive topic (reviveQueueNum, 8) and the cap on pops held for long polling at
    # once (maxPopPollingSize, 100000); a group's queue is not popped while this many of its
    # messages are in flight (popInflightMessageThreshold; RocketMQ applies it only with
    # enablePopMessageThreshold, we always do: it bounds the in-flight table)
    revive_interval: float = 1.0
    pop_inflight_message_threshold: int = 10000
    revive_queue_num: int = 8
    max_pop_polling_size: int = 100000
    # the Prometheus exporter (RocketMQ 5's keys; docs/metrics.md): 0 leaves it off; the host
    # defaults to listen_host
    metrics_prom_exporter_host: str = ""
    metrics_prom_exporter_port: int = 0
    # RocketMQ 5's gRPC endpoint (broker/grpc; the proxy's grpcServerPort, 8081); an ephemeral
    # port when listenPort is 0 (tests), -1: not served.  None: the default, 8081, served only
    # when it is free, so several brokers of one host started from 4.x broker.conf files (which
    # never name it) keep starting; a port set explicitly that cannot be bound stops the broker
    grpc_server_port: int | None = None
    # TLS (common/tls.py): RocketMQ's tls.server.* keys for the remoting, VIP and gRPC ports;
    # tls.enable / tls.client.* for the broker's own connections (to the nameservers)
    tls: TlsServerConfig = attrs.field(factory=TlsServerConfig)
    tls_client: TlsClientConfig = attrs.field(factory=TlsClientConfig)

    @property
    def broker_role(self) -> str:
        return self.store.broker_role

    @property
    def is_slave(self) -> bool:
        return self.store.broker_role == "SLAVE"

    @property
    def namesrv_addrs(self) -> list[str]:
        if not self.namesrv_addr:
            return []
        return [a.strip() for a in self.namesrv_addr.split(";") if a.strip()]

    @property
    def acl_file_path(self) -> str:
        if self.acl_file:
            return self.acl_file
        home = os.environ.get("ROCKETMQ_HOME", ".")
        return os.path.join(home, "conf", "plain_acl.yml")

    @property
    def ha_port(self) -> int:
        """RocketMQ forces haListenPort = listenPort + 1 (0 stays ephemeral)."""
        return self.listen_port + 1 if self.listen_port else 0

    @property
    def grpc_port(self) -> int | None:
        """The gRPC port to bind (0: any free one), None when the endpoint is off."""
        port = DEFAULT_GRPC_PORT if self.grpc_server_port is None else self.grpc_server_port
        if port < 0:
            return None
        return port if self.listen_port else 0

    @property
    def vip_port(self) -> int:
        return self.listen_port - 2 if self.listen_port else 0

    @classmethod
    def from_properties(cls, text: str, **overrides: object) -> BrokerConfig:
        """Build from broker.conf text; ``overrides`` (field names) win over the file."""
        props = parse_properties(text)
        broker_kw: _FieldValues = {}
        store_kw: _FieldValues = {}
        store_fields = {f.name for f in attrs.fields(MessageStoreConfig)}
        # RocketMQ reads these from -D system properties and tls.config.file; both may be here
        tls_props = tls_properties(props, parse_properties)
        broker_kw["tls"] = TlsServerConfig.from_properties(tls_props)
        broker_kw["tls_client"] = TlsClientConfig.from_properties(tls_props)
        for name, raw in props.items():
            if name.startswith("tls."):
                continue
            spec = _PROPERTIES.get(name)
            if spec is None:
                log.warning("broker.conf: ignoring unknown property %s", name)
                continue
            target, field, parse = spec
            try:
                value = parse(raw)
            except ValueError as exc:
                raise ValueError(f"broker.conf: bad value for {name}: {exc}") from None
            if target == "store":
                if field in store_fields:
                    store_kw[field] = value
                else:
                    log.warning("broker.conf: %s is not supported by this store; ignored", name)
            else:
                broker_kw[field] = value
        store_over = overrides.pop("store", None)
        if store_over is not None and not isinstance(store_over, MessageStoreConfig):
            raise TypeError(f"store must be a MessageStoreConfig, not {type(store_over).__name__}")
        if store_over is not None:
            store = attrs.evolve(store_over, **store_kw) if store_kw else store_over
        else:
            store_kw.setdefault("store_path_root_dir", "store")
            # DLedger's batch push is on unless broker.conf says otherwise (MessageStoreConfig's
            # default; DLedger's own is off: one entry per push, 2-3x slower here).  It stays
            # wire-compatible: a DLedger 0.3.1.2 follower takes a batch push whatever its own
            # isEnableBatchPush (DLedgerEntryPusher.EntryHandler.handlePush checks
            # request.isBatch()), and the leader's pushes stay within a Java member's frame
            # (raft/entry_pusher.py)
            store = MessageStoreConfig(**store_kw)
        broker_kw.update(overrides)
        return cls(store=store, **broker_kw).validated()

    @property
    def dledger(self) -> bool:
        """DLedger mode: the role and brokerId follow the Raft role
        (broker/dledger/broker/roles.py)."""
        return self.store.enable_dleger_commit_log

    def validated(self) -> BrokerConfig:
        """Apply BrokerStartup's role rules; raises ValueError for an impossible combination."""
        if self.dledger:
            # brokerRole and brokerId are decided at run time by the DLedger role; what is set
            # of the group must agree with itself (run_broker checks it is complete)
            store = self.store
            if store.dleger_peers and store.dleger_self_id:
                store.check_dledger()
            return self
        if self.is_slave:
            if self.broker_id <= MASTER_ID:
                raise ValueError("brokerId must be > 0 for a SLAVE broker")
            return self
        if self.broker_id != MASTER_ID:
            log.warning(
                "brokerRole %s forces brokerId 0 (was %d)", self.broker_role, self.broker_id
            )
            return attrs.evolve(self, broker_id=MASTER_ID)
        return self


def parse_properties(text: str) -> dict[str, str]:
    """Java properties, the subset broker.conf files use (no line continuations/escapes)."""
    out: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        cut = len(line)
        for i, ch in enumerate(line):
            if ch in "=:" or ch.isspace():
                cut = i
                break
        key = line[:cut].strip()
        rest = line[cut:].lstrip()
        if rest[:1] in ("=", ":"):
            rest = rest[1:]
        out[key] = rest.strip()
    return out


# Keyword arguments for BrokerConfig(...) / MessageStoreConfig(...): attrs checks each value
# against its field's type, but which field a property's parsed value goes to is known only at
# run time (the _PROPERTIES table), so the values are Any for the constructor calls
_FieldValues = dict[str, Any]  # type: ignore[explicit-any]
_Spec = tuple[str, str, Callable[[str], object]]

# property name -> (which config, field name, parser)
_PROPERTIES: dict[str, _Spec] = {
    "brokerClusterName": ("broker", "broker_cluster_name", _parse_str),
    "brokerName": ("broker", "broker_name", _parse_str),
    "brokerId": ("broker", "broker_id", _parse_int),
    "brokerIP1": ("broker", "broker_ip1", _parse_str),
    "brokerIP2": ("broker", "broker_ip2", _parse_str),
    "listenPort": ("broker", "listen_port", _parse_int),
    "namesrvAddr": ("broker", "namesrv_addr", _parse_str),
    "autoCreateTopicEnable": ("broker", "auto_create_topic_enable", _parse_bool),
    "aclEnable": ("broker", "acl_enable", _parse_bool),
    "aclFile": ("broker", "acl_file", _parse_str),
    "aclFileWatchInterval": ("broker", "acl_watch_interval", _parse_ms),
    "chaosAckBeforeStore": ("broker", "chaos_ack_before_store", _parse_bool),
    # ours: the number of topics past which sends no longer auto-create one
    "autoCreateTopicMax": ("broker", "auto_create_topic_max", _parse_positive_int),
    "defaultTopicQueueNums": ("broker", "default_topic_queue_nums", _parse_int),
    "autoCreateSubscriptionGroup": ("broker", "auto_create_subscription_group", _parse_bool),
    "clusterTopicEnable": ("broker", "cluster_topic_enable", _parse_bool),
    "brokerTopicEnable": ("broker", "broker_topic_enable", _parse_bool),
    "traceTopicEnable": ("broker", "trace_topic_enable", _parse_bool),
    "registerNameServerPeriod": ("broker", "register_name_server_period", _parse_ms),
    "registerBrokerTimeoutMills": ("broker", "register_broker_timeout", _parse_ms),
    "regionId": ("broker", "region_id", _parse_str),
    "traceOn": ("broker", "trace_on", _parse_bool),
    "storeReplyMessageEnable": ("broker", "store_reply_message_enable", _parse_bool),
    "brokerPermission": ("broker", "broker_permission", _parse_int),
    "longPollingEnable": ("broker", "long_polling_enable", _parse_bool),
    "shortPollingTimeMills": ("broker", "short_polling_time", _parse_ms),
    "slaveReadEnable": ("broker", "slave_read_enable", _parse_bool),
    "enablePropertyFilter": ("broker", "enable_property_filter", _parse_bool),
    "offsetCheckInSlave": ("broker", "offset_check_in_slave", _parse_bool),
    "flushConsumerOffsetInterval": ("broker", "flush_consumer_offset_interval", _parse_ms),
    "fastChannelEnable": ("broker", "fast_channel_enable", _parse_bool),
    # ours (Java has no knob): the slave metadata sync period in ms
    "slaveSyncInterval": ("broker", "slave_sync_interval", _parse_ms),
    # ours too: the same for a DLedger follower
    "dLegerSlaveSyncInterval": ("broker", "dledger_slave_sync_interval", _parse_ms),
    "rejectTransactionMessage": ("broker", "reject_transaction_message", _parse_bool),
    "transactionTimeOut": ("broker", "transaction_timeout", _parse_ms),
    "transactionCheckMax": ("broker", "transaction_check_max", _parse_positive_int),
    "transactionCheckInterval": ("broker", "transaction_check_interval", _parse_ms),
    "reviveInterval": ("broker", "revive_interval", _parse_ms),
    "reviveQueueNum": ("broker", "revive_queue_num", _parse_positive_int),
    "maxPopPollingSize": ("broker", "max_pop_polling_size", _parse_positive_int),
    "popInflightMessageThreshold": (
        "broker",
        "pop_inflight_message_threshold",
        _parse_positive_int,
    ),
    # RocketMQ 5's Prometheus exporter (docs/metrics.md)
    "metricsPromExporterHost": ("broker", "metrics_prom_exporter_host", _parse_str),
    "metricsPromExporterPort": ("broker", "metrics_prom_exporter_port", _parse_int),
    # RocketMQ 5's gRPC endpoint (broker/grpc)
    "grpcServerPort": ("broker", "grpc_server_port", _parse_int),
    # MessageStoreConfig
    "storePathRootDir": ("store", "store_path_root_dir", _parse_str),
    "storePathCommitLog": ("store", "store_path_commit_log", _parse_str),
    "mapedFileSizeCommitLog": ("store", "mapped_file_size_commit_log", _parse_int),
    "mappedFileSizeCommitLog": ("store", "mapped_file_size_commit_log", _parse_int),
    "mapedFileSizeConsumeQueue": ("store", "mapped_file_size_consume_queue", _parse_int),
    "mappedFileSizeConsumeQueue": ("store", "mapped_file_size_consume_queue", _parse_int),
    "flushDiskType": ("store", "flush_disk_type", _parse_flush),
    "brokerRole": ("store", "broker_role", _parse_role),
    "deleteWhen": ("store", "delete_when", _parse_str),
    "fileReservedTime": ("store", "file_reserved_time", _parse_int),
    "cleanResourceInterval": ("store", "clean_resource_interval", _parse_ms),
    "diskMaxUsedSpaceRatio": ("store", "disk_max_used_space_ratio", _parse_int),
    "cleanFileForciblyEnable": ("store", "clean_file_forcibly_enable", _parse_bool),
    # Java reads these two from system properties (rocketmq.broker.diskSpace*Ratio)
    "diskSpaceCleanForciblyRatio": ("store", "disk_space_clean_forcibly_ratio", _parse_ratio),
    "diskSpaceWarningLevelRatio": ("store", "disk_space_warning_level_ratio", _parse_ratio),
    "maxHashSlotNum": ("store", "max_hash_slot_num", _parse_positive_int),
    "maxIndexNum": ("store", "max_index_num", _parse_positive_int),
    # ours: bytes below the checkpoint whose records a crash recovery checks, body CRC included,
    # besides the whole last segment (broker/store/recovery.py)
    "crcCheckWindowOnRecover": ("store", "crc_check_window_on_recover", _parse_int),
    "maxMessageSize": ("store", "max_message_size", _parse_int),
    "messageDelayLevel": ("store", "message_delay_level", _parse_delay_levels),
    "timerWheelEnable": ("store", "timer_wheel_enable", _parse_bool),
    "timerMaxDelaySec": ("store", "timer_max_delay_sec", _parse_positive_int),
    "timerPrecisionMs": ("store", "timer_precision_ms", _parse_positive_int),
    "timerRollWindowSlot": ("store", "timer_roll_window_slot", _parse_positive_int),
    "syncFlushTimeout": ("store", "sync_flush_timeout", _parse_ms),
    "slaveTimeout": ("store", "slave_timeout", _parse_ms),
    "flushIntervalCommitLog": ("store", "flush_interval_commit_log", _parse_ms),
    "accessMessageInMemoryMaxRatio": ("store", "access_message_in_memory_max_ratio", _parse_int),
    "haMasterAddress": ("store", "ha_master_address", _parse_str),
    "haSendHeartbeatInterval": ("store", "ha_send_heartbeat_interval", _parse_ms),
    "haHousekeepingInterval": ("store", "ha_housekeeping_interval", _parse_ms),
    "haTransferBatchSize": ("store", "ha_transfer_batch_size", _parse_int),
    "haSlaveFallbehindMax": ("store", "ha_slave_fallbehind_max", _parse_int),
    "defaultQueryMaxNum": ("store", "default_query_max_num", _parse_int),
    "maxTransferBytesOnMessageInMemory": (
        "store",
        "max_transfer_bytes_on_message_in_memory",
        _parse_int,
    ),
    "maxTransferCountOnMessageInMemory": (
        "store",
        "max_transfer_count_on_message_in_memory",
        _parse_int,
    ),
    "maxTransferBytesOnMessageInDisk": (
        "store",
        "max_transfer_bytes_on_message_in_disk",
        _parse_int,
    ),
    "maxTransferCountOnMessageInDisk": (
        "store",
        "max_transfer_count_on_message_in_disk",
        _parse_int,
    ),
    "enableDLegerCommitLog": ("store", "enable_dleger_commit_log", _parse_bool),
    "dLegerGroup": ("store", "dleger_group", _parse_str),
    "dLegerSelfId": ("store", "dleger_self_id", _parse_member_id),
    "dLegerPeers": ("store", "dleger_peers", _parse_peers),
    "preferredLeaderId": ("store", "preferred_leader_id", _parse_member_id),
    "storePathDLedgerCommitLog": ("store", "store_path_dledger_commit_log", _parse_str),
    "isEnableBatchPush": ("store", "enable_batch_push", _parse_bool),
    "enableBatchPush": ("store", "enable_batch_push", _parse_bool),
    # DLedgerConfig's own names (milliseconds, kept as such: DLedger's core counts in ms)
    "heartBeatTimeIntervalMs": ("store", "heart_beat_time_interval_ms", _parse_positive_int),
    "maxHeartBeatLeak": ("store", "max_heart_beat_leak", _parse_positive_int),
    "minVoteIntervalMs": ("store", "min_vote_interval_ms", _parse_positive_int),
    "maxVoteIntervalMs": ("store", "max_vote_interval_ms", _parse_positive_int),
    "maxWaitAckTimeMs": ("store", "max_wait_ack_time_ms", _parse_positive_int),
    "maxPushTimeOutMs": ("store", "max_push_time_out_ms", _parse_positive_int),
}
