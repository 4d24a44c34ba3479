"""MessageStoreConfig: the store half of RocketMQ's broker configuration.

Theory of operation
-------------------
A frozen attrs value handed to ``run_message_store`` / ``run_memory_store``.  Sizes are bytes, times
are seconds (floats, read on Trio's clock); the broker's ``broker.conf`` parser converts RocketMQ's
millisecond properties.  Defaults are RocketMQ 4.9's (``store/config/MessageStoreConfig.java``).
The HA fields live here, as in RocketMQ, so the HA service reads them from the same object.

``delay_level_millis`` parses ``message_delay_level`` ("1s 5s ... 2h") into milliseconds per
level (level 1 is index 0), the table ScheduleMessageService uses to compute deliver times.
"""

from __future__ import annotations

import functools
import os

import attrs

_UNIT_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


@functools.lru_cache(maxsize=16)
def parse_delay_levels(text: str) -> tuple[int, ...]:
    """ "1s 5s 10m 2h" -> (1000, 5000, 600000, 7200000); raises ValueError on a bad token."""
    out = []
    for tok in text.split():
        unit = tok[-1:]
        if unit not in _UNIT_MS or not tok[:-1].isdigit():
            raise ValueError(f"bad delay level {tok!r} in {text!r}")
        out.append(int(tok[:-1]) * _UNIT_MS[unit])
    if not out:
        raise ValueError("message_delay_level defines no level")
    return tuple(out)


def parse_dledger_peers(text: str) -> dict[str, str]:
    """ "n0-127.0.0.1:40911;n1-127.0.0.1:40912" -> {"n0": "127.0.0.1:40911", ...}.

    Member ids are ``n<k>`` (the broker derives brokerId k+1 from them, as RocketMQ does);
    ValueError on a malformed member, a bad port or a repeated id."""
    peers: dict[str, str] = {}
    for part in text.split(";"):
        part = part.strip()
        if not part:
            continue
        member, sep, addr = part.partition("-")
        host, colon, port = addr.rpartition(":")
        if not sep or not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"bad DLedger peer {part!r}, expected n<k>-host:port")
        if not (member[:1] == "n" and member[1:].isdigit()):
            raise ValueError(f"bad DLedger member id {member!r}, expected n0, n1, ...")
        if member in peers:
            raise ValueError(f"DLedger member {member} is listed twice")
        peers[member] = addr
    return peers


def _path_text(path: str | os.PathLike[str]) -> str:
    """A directory given as str or Path, kept as str (os.fspath's overloads leave attrs'
    generated __init__ with a type no Path matches)."""
    return os.fspath(path)


@attrs.frozen
class MessageStoreConfig:
    store_path_root_dir: str = attrs.field(converter=_path_text)
    # None -> <root>/commitlog
    store_path_commit_log: str | None = None
    mapped_file_size_commit_log: int = 1024 * 1024 * 1024
    mapped_file_size_consume_queue: int = 300_000 * 20
    flush_disk_type: str = "ASYNC_FLUSH"  # or "SYNC_FLUSH"
    sync_flush_timeout: float = 5.0
    flush_interval_commit_log: float = 0.5
    flush_interval_consume_queue: float = 1.0
    # Checkpoint file rewrite period (RocketMQ flushes it with the consume queues).
    checkpoint_interval: float = 1.0
    max_message_size: int = 4 * 1024 * 1024
    broker_role: str = "ASYNC_MASTER"  # "SYNC_MASTER", "SLAVE"
    message_delay_level: str = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
    # RocketMQ 5 timer messages (broker/timer). timerWheelEnable: RocketMQ's default is true
    # too. timerRollWindowSlot: slots the in-memory wheel spans before a far timer is rolled
    # (RocketMQ: 2 days on its on-disk wheel; ours is in memory, so one hour).
    timer_wheel_enable: bool = True
    timer_max_delay_sec: int = 3 * 24 * 3600
    timer_precision_ms: int = 1000
    timer_roll_window_slot: int = 3600
    access_message_in_memory_max_ratio: int = 40
    max_transfer_bytes_on_message_in_memory: int = 256 * 1024
    max_transfer_count_on_message_in_memory: int = 32
    max_transfer_bytes_on_message_in_disk: int = 64 * 1024
    max_transfer_count_on_message_in_disk: int = 8
    default_query_max_num: int = 32
    message_index_enable: bool = True
    max_hash_slot_num: int = 5_000_000
    max_index_num: int = 5_000_000 * 4
    # Recovery checks each record's body CRC (RocketMQ checkCRCOnRecover, default true).
    check_crc_on_recover: bool = True
    # After a crash, the records of the last segment and of this many bytes below the checkpoint
    # (whichever reaches further) are checked too, body CRC included: a disk that lied about a
    # flush loses its latest writes (recovery.py). broker.conf: crcCheckWindowOnRecover.
    crc_check_window_on_recover: int = 128 * 1024 * 1024
    # Release page-cache pages of the CommitLog once flushed (see mapped_file.py).
    release_flushed_pages: bool = True
    delete_when: str = "04"
    file_reserved_time: int = 72
    # Disk space (clean_service.py; RocketMQ CleanCommitLogService): the check's period; the
    # used ratio from which expired files go without waiting for deleteWhen (percent); the
    # forced-clean ratio, at or below which refused puts resume; from which puts are refused
    # (DISK_FULL).
    clean_resource_interval: float = 10.0
    # True: over the forced-clean ratio the oldest segments go, expired or not, as RocketMQ does
    # by default.  False here by default: a full disk refuses puts and deletes only what
    # fileReservedTime lets go, so nothing acknowledged and unexpired is lost to it.
    clean_file_forcibly_enable: bool = False
    disk_max_used_space_ratio: int = 75
    disk_space_clean_forcibly_ratio: float = 0.85
    disk_space_warning_level_ratio: float = 0.90
    # HA (read by broker/ha)
    slave_timeout: float = 3.0
    ha_master_address: str | None = None
    ha_send_heartbeat_interval: float = 5.0
    ha_housekeeping_interval: float = 20.0
    ha_transfer_batch_size: int = 32 * 1024
    ha_slave_fallbehind_max: int = 256 * 1024 * 1024
    # DLedger mode (read by broker/dledger; the names of RocketMQ's MessageStoreConfig.java)
    enable_dleger_commit_log: bool = False
    # "" -> the broker's name (run_broker fills it in)
    dleger_group: str = ""
    # "n0-127.0.0.1:40911;n1-127.0.0.1:40912;n2-127.0.0.1:40913"
    dleger_peers: str = ""
    dleger_self_id: str = ""
    preferred_leader_id: str | None = None
    # RocketMQ's meaning (DLedgerCommitLog sets it as DLedgerConfig.dataStorePath): the directory
    # of the DLedger data files alone; None -> <storePathRootDir>/dledger-<selfId>/data.  The
    # member's index/, currterm and checkpoint are always in <storePathRootDir>/dledger-<selfId>/
    store_path_dledger_commit_log: str | None = None
    # on unless broker.conf says otherwise, unlike DLedger's own default (broker/config.py says
    # why it stays wire-compatible)
    enable_batch_push: bool = True
    # DLedgerConfig.java timings (openmessaging/dledger) in ms, by its names, with its defaults
    heart_beat_time_interval_ms: int = 2000
    max_heart_beat_leak: int = 3
    min_vote_interval_ms: int = 300
    max_vote_interval_ms: int = 1000
    max_wait_ack_time_ms: int = 2500
    max_push_time_out_ms: int = 1000

    @property
    def commit_log_dir(self) -> str:
        return self.store_path_commit_log or os.path.join(self.store_path_root_dir, "commitlog")

    @property
    def dledger_member_dir(self) -> str:
        """``<storePathRootDir>/dledger-<selfId>`` (DLedgerConfig.getDefaultPath with RocketMQ's
        storeBaseDir): index/, currterm, checkpoint, and data/ unless storePathDLedgerCommitLog."""
        return os.path.join(self.store_path_root_dir, f"dledger-{self.dleger_self_id}")

    @property
    def dledger_data_dir(self) -> str:
        """Where the DLedger data files are (DLedgerConfig.getDataStorePath)."""
        return self.store_path_dledger_commit_log or os.path.join(self.dledger_member_dir, "data")

    def dledger_peer_map(self) -> dict[str, str]:
        """``dleger_peers`` as member id -> DLedger address; ValueError naming what is wrong."""
        return parse_dledger_peers(self.dleger_peers)

    def check_dledger(self) -> None:
        """Everything DLedger mode needs, checked together (ValueError naming the property)."""
        peers = self.dledger_peer_map()
        if not peers:
            raise ValueError("dLegerPeers is empty")
        if self.dleger_self_id not in peers:
            raise ValueError(
                f"dLegerSelfId {self.dleger_self_id!r} is not one of dLegerPeers "
                f"({', '.join(peers)})"
            )
        if self.preferred_leader_id and self.preferred_leader_id not in peers:
            raise ValueError(f"preferredLeaderId {self.preferred_leader_id!r} is not a peer")
        if self.min_vote_interval_ms > self.max_vote_interval_ms:
            raise ValueError("minVoteIntervalMs is larger than maxVoteIntervalMs")

    @property
    def delay_level_millis(self) -> tuple[int, ...]:
        return parse_delay_levels(self.message_delay_level)

    @property
    def max_delay_level(self) -> int:
        return len(self.delay_level_millis)
