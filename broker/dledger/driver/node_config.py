"""DLedgerConfig: one member's settings (DLedger's names and defaults: ``DLedgerConfig.java`` in
openmessaging/dledger 0.3.1.2), and where its files and peers are.

Theory of operation: a frozen value the driver (node.py) reads once.  The timing fields carry
the same names and defaults as :class:`broker.dledger.raft.core.CoreConfig` and go to the core
unchanged (:meth:`DLedgerConfig.core_config`); the rest is the driver's: file sizes, the flush
and checkpoint periods, the disk-full ratio and the RPC timeout.

``peers`` is DLedger's string, ``id-host:port`` joined by ``;``; the member id is everything
before the first ``-`` (DLedgerConfig.getPeerAddr splits it the same way).

Invariant: a config that constructs names its own member among ``peers`` and has no repeated
member (checked in ``__attrs_post_init__``, ValueError naming what is wrong).
"""

from __future__ import annotations

import os

import attrs

from broker.dledger.driver.entry_coder import NOOP_RECORD
from broker.dledger.raft.core import CoreConfig
from broker.store.config import MessageStoreConfig

__all__ = ["DLedgerConfig", "parse_peers"]


def parse_peers(peers: str) -> dict[str, str]:
    """``"n0-127.0.0.1:40911;n1-127.0.0.1:40912"`` -> ``{"n0": "127.0.0.1:40911", ...}``."""
    found: dict[str, str] = {}
    for part in peers.split(";"):
        part = part.strip()
        if not part:
            continue
        member, sep, addr = part.partition("-")
        host, colon, port = addr.rpartition(":")
        if not member or not sep or not host or not colon or not port.isdigit():
            raise ValueError(f"bad DLedger peer {part!r}, expected id-host:port")
        if member in found:
            raise ValueError(f"DLedger member {member} is listed twice in {peers!r}")
        found[member] = addr
    return found


@attrs.frozen
class DLedgerConfig:
    group: str
    self_id: str
    # "n0-127.0.0.1:40911;n1-127.0.0.1:40912;n2-127.0.0.1:40913"
    peers: str
    # the member's files go under <store_base_dir>/dledger-<self_id>/ (the broker's:
    # storePathRootDir, as RocketMQ's DLedgerCommitLog sets DLedgerConfig.storeBaseDir)
    store_base_dir: str
    # --- the core's (CoreConfig's names and defaults) ---
    heart_beat_time_interval_ms: int = 2000
    max_heart_beat_leak: int = 3
    min_vote_interval_ms: int = 300
    max_vote_interval_ms: int = 1000
    max_pending_requests_num: int = 10000
    max_wait_ack_time_ms: int = 2500
    max_push_time_out_ms: int = 1000
    max_in_flight_pushes: int = 1000
    # on unless said otherwise (DLedger's default is off): a DLedger 0.3.1.2 follower takes batch
    # pushes whatever its own setting (broker/config.py says where this was checked)
    enable_batch_push: bool = True
    max_batch_push_entries: int = 64
    max_batch_push_bytes: int = 4 << 20
    # a member started with no vote in its term (a fresh group) asks for votes after a vote
    # pause, not a leak period (raft/election.py)
    fast_first_vote: bool = True
    preferred_leader_id: str | None = None
    min_take_leadership_vote_interval_ms: int = 30
    max_take_leadership_vote_interval_ms: int = 100
    leadership_transfer_wait_timeout_ms: int = 1000
    max_leadership_transfer_wait_index: int = 1000
    # --- the driver's ---
    data_file_size: int = 1 << 30
    index_file_size: int = 32 * 5 * 1024 * 1024
    # entry bodies are CommitLog records: write pos + 48 into their PHYSICALOFFSET as the
    # leader appends them (RocketMQ's DLedgerCommitLog append hook; mmap_file_store.py)
    patch_physical_offset: bool = False
    # DLedgerConfig.dataStorePath (RocketMQ's storePathDLedgerCommitLog): the data files'
    # directory; None -> <store_dir>/data
    data_dir: str | None = None
    # the body of a new leader's no-op entry (CoreConfig.noop_body): the broker's is
    # entry_coder.NOOP_RECORD, which a Java member can read
    noop_body: bytes = b""
    flush_file_interval_ms: int = 10
    check_point_interval_ms: int = 3000
    # min(0.95, diskSpaceRatioToForceClean + 0.05): appends fail with DISK_FULL at or above it
    disk_full_ratio: float = 0.90
    # DLedger's CleanSpaceService judges the disk every 100 ms: a member that met ENOSPC takes
    # appends again that soon after space returns
    disk_check_interval_ms: int = 100
    # DLedgerRpcNettyService waits 3 s for every answer
    rpc_timeout_ms: int = 3000

    def __attrs_post_init__(self) -> None:
        peers = self.peer_addresses()
        if self.self_id not in peers:
            raise ValueError(f"DLedger selfId {self.self_id!r} is not one of peers {self.peers!r}")
        if self.preferred_leader_id is not None and self.preferred_leader_id not in peers:
            raise ValueError(f"preferredLeaderId {self.preferred_leader_id!r} is not a peer")

    @classmethod
    def from_store_config(cls, store: MessageStoreConfig, *, group: str) -> DLedgerConfig:
        """The member a broker's store config describes (RocketMQ's ``dLeger*`` keys and the
        DLedger timings by DLedger's names); ``group`` when ``dLegerGroup`` is empty (the
        broker name, as RocketMQ does)."""
        return cls(
            group=store.dleger_group or group,
            self_id=store.dleger_self_id,
            peers=store.dleger_peers,
            store_base_dir=store.store_path_root_dir,
            data_dir=store.store_path_dledger_commit_log,
            # RocketMQ's DLedgerCommitLog sizes the entry files as the CommitLog's
            data_file_size=store.mapped_file_size_commit_log,
            patch_physical_offset=True,
            noop_body=NOOP_RECORD,
            preferred_leader_id=store.preferred_leader_id or None,
            enable_batch_push=store.enable_batch_push,
            heart_beat_time_interval_ms=store.heart_beat_time_interval_ms,
            max_heart_beat_leak=store.max_heart_beat_leak,
            min_vote_interval_ms=store.min_vote_interval_ms,
            max_vote_interval_ms=store.max_vote_interval_ms,
            max_wait_ack_time_ms=store.max_wait_ack_time_ms,
            max_push_time_out_ms=store.max_push_time_out_ms,
        )

    def peer_addresses(self) -> dict[str, str]:
        """Every member (self included) -> its DLedger address ``host:port``."""
        return parse_peers(self.peers)

    @property
    def store_dir(self) -> str:
        """``<store_base_dir>/dledger-<self_id>``: index/, currterm, checkpoint, and data/
        unless ``data_dir`` is set."""
        return os.path.join(self.store_base_dir, f"dledger-{self.self_id}")

    @property
    def data_store_path(self) -> str:
        """DLedgerConfig.getDataStorePath: ``data_dir`` or ``<store_dir>/data``."""
        return self.data_dir or os.path.join(self.store_dir, "data")

    def core_config(self) -> CoreConfig:
        return CoreConfig(
            group=self.group,
            self_id=self.self_id,
            peers=tuple(sorted(self.peer_addresses())),
            heart_beat_time_interval_ms=self.heart_beat_time_interval_ms,
            max_heart_beat_leak=self.max_heart_beat_leak,
            min_vote_interval_ms=self.min_vote_interval_ms,
            max_vote_interval_ms=self.max_vote_interval_ms,
            max_pending_requests_num=self.max_pending_requests_num,
            max_wait_ack_time_ms=self.max_wait_ack_time_ms,
            max_push_time_out_ms=self.max_push_time_out_ms,
            max_in_flight_pushes=self.max_in_flight_pushes,
            enable_batch_push=self.enable_batch_push,
            max_batch_push_entries=self.max_batch_push_entries,
            max_batch_push_bytes=self.max_batch_push_bytes,
            fast_first_vote=self.fast_first_vote,
            preferred_leader_id=self.preferred_leader_id,
            min_take_leadership_vote_interval_ms=self.min_take_leadership_vote_interval_ms,
            max_take_leadership_vote_interval_ms=self.max_take_leadership_vote_interval_ms,
            leadership_transfer_wait_timeout_ms=self.leadership_transfer_wait_timeout_ms,
            max_leadership_transfer_wait_index=self.max_leadership_transfer_wait_index,
            noop_body=self.noop_body,
        )
