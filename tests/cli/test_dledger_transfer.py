"""`rmq dledger leadership-transfer`: the whole flow against a fake cluster (nameserver, brokers
and DLedger members in memory), and its one-line errors."""

from __future__ import annotations

import json
from typing import Any, cast

import attrs
import pytest
import trio
import trio.lowlevel

from broker.dledger.driver.transport import DLedgerClient, RpcTimeout, RpcUnreachable
from broker.dledger.raft.messages import (
    LeadershipTransferRequest,
    LeadershipTransferResponse,
    MetadataRequest,
    MetadataResponse,
)
from cli.dledger.commands import show_outcome
from cli.dledger.transfer import (
    TransferError,
    TransferOutcome,
    choose_group,
    leadership_transfer,
    parse_target,
)
from common.remoting.codes import DLedgerResponseCode, RequestCode, ResponseCode
from common.remoting.command import RemotingCommand

NAMESRV = "127.0.0.1:9876"


@attrs.define
class FakeMember:
    group: str
    self_id: str
    broker_addr: str
    dledger_addr: str
    role: str = "FOLLOWER"
    term: int = 3
    leader: str | None = None
    up: bool = True


@attrs.define(eq=False)
class FakeCluster:
    """Brokers answer runtime info, members answer METADATA and LEADERSHIP_TRANSFER; a transfer
    makes the target lead in the next term (or is answered with `refuse`)."""

    members: list[FakeMember]
    refuse: DLedgerResponseCode | None = None
    hang: bool = False  # the leader never answers the transfer
    transfers: list[tuple[str, LeadershipTransferRequest]] = attrs.Factory(list)
    metadata_asked: list[str] = attrs.Factory(list)

    def peers(self, group: str) -> str:
        return ";".join(f"{m.self_id}-{m.dledger_addr}" for m in self.members if m.group == group)

    # --- the remoting Invoker (nameserver and brokers) ---

    async def invoke(
        self, addr: str, cmd: RemotingCommand, timeout: float = 3.0
    ) -> RemotingCommand:
        await trio.lowlevel.checkpoint()
        if addr == NAMESRV and cmd.code == RequestCode.GET_BROKER_CLUSTER_INFO:
            table: dict[str, Any] = {}
            for m in self.members:
                if not m.up:
                    continue
                bid = 0 if m.role == "LEADER" else int(m.self_id[1:]) + 1
                entry = table.setdefault(m.group, {"brokerName": m.group, "brokerAddrs": {}})
                entry["brokerAddrs"][str(bid)] = m.broker_addr
            # a classic broker too: it is no member and is left out
            table["classic"] = {"brokerName": "classic", "brokerAddrs": {"0": "127.0.0.1:20911"}}
            body = {"brokerAddrTable": table, "clusterAddrTable": {"C": sorted(table)}}
            return cmd.response(body=json.dumps(body).encode())
        if cmd.code == RequestCode.GET_BROKER_RUNTIME_INFO:
            if addr == "127.0.0.1:20911":
                return cmd.response(body=json.dumps({"table": {"brokerVersion": "x"}}).encode())
            m = self._by_broker(addr)
            if not m.up:
                raise ConnectionRefusedError(addr)
            t = {
                "dledgerGroup": m.group,
                "dledgerSelfId": m.self_id,
                "dledgerRole": m.role,
                "dledgerTerm": str(m.term),
                "dledgerLeaderId": m.leader or "",
                "dledgerLedgerEndIndex": "10",
                "dledgerCommittedIndex": "10",
                "dledgerPeers": self.peers(m.group),
            }
            return cmd.response(body=json.dumps({"table": t}).encode())
        return cmd.response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED)

    def _by_broker(self, addr: str) -> FakeMember:
        return next(m for m in self.members if m.broker_addr == addr)

    # --- the DLedger client ---

    async def call(
        self, addr: str, request: Any, *, timeout: float = 3.0, task_status: object = None
    ) -> MetadataResponse | LeadershipTransferResponse:
        await trio.lowlevel.checkpoint()
        m = next(m for m in self.members if m.dledger_addr == addr)
        if not m.up:
            raise RpcUnreachable(f"{addr} refused")
        if isinstance(request, MetadataRequest):
            self.metadata_asked.append(m.self_id)
            return MetadataResponse(
                group=m.group, remote_id="rmq-cli", local_id=m.self_id, leader_id=m.leader
            )
        assert isinstance(request, LeadershipTransferRequest)
        self.transfers.append((m.self_id, request))
        if self.hang:
            await trio.sleep(timeout)
            raise RpcTimeout("no answer")
        if self.refuse is not None:
            return LeadershipTransferResponse(
                group=m.group, remote_id="x", local_id=m.self_id, code=self.refuse
            )
        await trio.sleep(0.3)  # the target's election
        group = [g for g in self.members if g.group == m.group]
        for g in group:
            g.term += 1
            g.leader = request.transferee_id
            g.role = "LEADER" if g.self_id == request.transferee_id else "FOLLOWER"
        return LeadershipTransferResponse(group=m.group, remote_id="x", local_id=m.self_id)


def cluster(groups: tuple[str, ...] = ("broker-a",), leader: str = "n0") -> FakeCluster:
    members = []
    for g, group in enumerate(groups):
        for k in range(3):
            port = 10911 + 30 * g + 10 * k
            members.append(
                FakeMember(
                    group,
                    f"n{k}",
                    f"127.0.0.1:{port}",
                    f"127.0.0.1:{port + 2}",
                    role="LEADER" if f"n{k}" == leader else "FOLLOWER",
                    leader=leader,
                )
            )
    return FakeCluster(members)


async def transfer(fake: FakeCluster, to: str, **kw: Any) -> TransferOutcome:
    # the fake answers the two DLedger requests the transfer sends (through call)
    dledger = cast(DLedgerClient, fake)
    return await leadership_transfer(NAMESRV, to, remoting=fake, dledger=dledger, **kw)


async def test_the_transfer_goes_to_the_leader_and_waits_until_the_target_leads(autojump_clock):
    fake = cluster()
    outcome = await transfer(fake, "n2")
    assert (outcome.group, outcome.previous_leader, outcome.new_leader) == ("broker-a", "n0", "n2")
    assert outcome.moved and outcome.term == 4 and 0.3 <= outcome.seconds < 1
    ((asked, request),) = fake.transfers
    assert asked == "n0"  # sent to the leader's DLedger address
    assert request == LeadershipTransferRequest(
        group="broker-a",
        remote_id="n0",
        local_id="rmq-cli",
        leader_id="n0",
        term=3,
        transfer_id="n0",
        transferee_id="n2",
    )
    assert fake.metadata_asked == ["n0"]  # the first member that answers names the leader


async def test_a_node_name_says_the_group_and_a_dead_member_is_skipped(autojump_clock):
    fake = cluster(("broker-a", "broker-b"), leader="n1")
    fake.members[3].up = False  # broker-b-n0
    outcome = await transfer(fake, "broker-b-n2")
    assert (outcome.group, outcome.previous_leader, outcome.new_leader) == ("broker-b", "n1", "n2")
    assert fake.metadata_asked == ["n1"]  # n0 of broker-b is down: its METADATA failed
    assert [m.role for m in fake.members[:3]] == ["FOLLOWER", "LEADER", "FOLLOWER"]  # untouched


async def test_the_leader_as_target_is_no_error_and_sends_nothing(autojump_clock):
    fake = cluster(leader="n1")
    outcome = await transfer(fake, "n1")
    assert not outcome.moved and outcome.new_leader == "n1" and outcome.term == 3
    assert fake.transfers == []


def _leaderless(f: FakeCluster) -> None:
    for m in f.members:
        m.leader, m.role = None, "CANDIDATE"


@pytest.mark.parametrize(
    ("setup", "to", "kw", "message"),
    [
        (lambda f: None, "n7", {}, r"broker-a has no member n7 \(members: n0, n1, n2\)"),
        (lambda f: None, "x7", {}, r"--to takes a member id \(n0, n1, ...\) or a node name"),
        (lambda f: None, "n1", {"group": "broker-z"}, r"no DLedger group 'broker-z' \(groups:"),
        (
            lambda f: setattr(f, "refuse", DLedgerResponseCode.FALL_BEHIND_TOO_MUCH),
            "n1",
            {},
            r"leader n0 refused to hand over to n1: FALL_BEHIND_TOO_MUCH \(417\)",
        ),
        (
            _leaderless,
            "n1",
            {},
            r"broker-a has no leader right now",
        ),
        (lambda f: setattr(f, "hang", True), "n1", {"timeout": 2.0}, r"did not finish within 2 s"),
        (lambda f: setattr(f, "members", []), "n1", {}, r"no DLedger group is registered"),
    ],
)
async def test_failures_are_one_line(autojump_clock, setup, to, kw, message):
    fake = cluster()
    setup(fake)
    with pytest.raises(TransferError, match=message) as caught:
        await transfer(fake, to, **kw)
    assert "\n" not in str(caught.value)


async def test_several_groups_need_a_group(autojump_clock):
    with pytest.raises(TransferError, match=r"2 DLedger groups \(broker-a, broker-b\); name one"):
        await transfer(cluster(("broker-a", "broker-b")), "n1")
    outcome = await transfer(cluster(("broker-a", "broker-b")), "n1", group="broker-b")
    assert outcome.group == "broker-b" and outcome.new_leader == "n1"


def test_parse_target_and_choose_group_alone():
    assert parse_target("n1", None) == (None, "n1")
    assert parse_target("broker-a-n12", None) == ("broker-a", "n12")
    assert parse_target("my-group-x-n0", "my-group-x") == ("my-group-x", "n0")
    with pytest.raises(TransferError, match="is a member of broker-a, not of --group broker-b"):
        parse_target("broker-a-n1", "broker-b")
    with pytest.raises(TransferError, match="no DLedger group"):
        choose_group([], None)


def test_the_outcome_is_one_line_or_one_json_document(capsys):
    show_outcome(TransferOutcome("broker-a", "n0", "n2", 5, True, 0.42))
    assert capsys.readouterr().out == "broker-a: leadership moved n0 -> n2 (term 5, 0.42 s)\n"
    show_outcome(TransferOutcome("broker-a", "n2", "n2", 5, False, 0.0))
    assert capsys.readouterr().out == "broker-a: n2 already leads (term 5); nothing to move\n"
    show_outcome(TransferOutcome("broker-a", "n0", "n2", 5, True, 0.50049), as_json=True)
    assert json.loads(capsys.readouterr().out) == {
        "group": "broker-a",
        "previous_leader": "n0",
        "new_leader": "n2",
        "term": 5,
        "moved": True,
        "seconds": 0.5,
    }


def test_the_command_without_a_cluster_is_one_error_line():
    from typer.testing import CliRunner

    from cli.main import app

    r = CliRunner().invoke(
        app, ["-n", "127.0.0.1:1", "dledger", "leadership-transfer", "--to", "n1", "--timeout", "2"]
    )
    assert r.exit_code == 1
    assert r.output.startswith("error: ") and r.output.count("\n") == 1, r.output
