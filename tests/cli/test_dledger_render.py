"""The Raft columns of `rmq cluster` and `rmq top`, from fake runtime-info tables (pure)."""

from __future__ import annotations

import json

import pytest
from rich.console import Console

from cli.admin import render as admin_render
from cli.runtime_info.raft import group_leaders, parse_raft, raft_cell, with_lag, with_lags
from cli.runtime_info.status import BrokerStatus, parse_runtime_info, with_raft_lags
from cli.top.model import NodeInfo, NodeView, TopSnapshot, node_view
from cli.top.screen import render_top

PEERS = "n0-127.0.0.1:10913;n1-127.0.0.1:10923;n2-127.0.0.1:10933"


def table(
    self_id: str, role: str, term: int, end: int, committed: int, leader: str = "n1"
) -> dict[str, str]:
    return {
        "commitLogMaxOffset": str(end * 100),
        "dledgerGroup": "broker-a",
        "dledgerSelfId": self_id,
        "dledgerRole": role,
        "dledgerTerm": str(term),
        "dledgerLeaderId": leader,
        "dledgerLedgerEndIndex": str(end),
        "dledgerCommittedIndex": str(committed),
        "dledgerPeers": PEERS,
    }


GROUP = {
    # node -> (brokerId as registered, runtime info)
    "n0": (2, table("n0", "FOLLOWER", 4, 95, 90)),
    "n1": (0, table("n1", "LEADER", 4, 120, 118)),
    "n2": (3, table("n2", "FOLLOWER", 4, 120, 118)),
}


def statuses() -> list[BrokerStatus]:
    out = []
    for k, (bid, t) in GROUP.items():
        addr = f"127.0.0.1:109{1 + int(k[1])}1"
        out.append(
            parse_runtime_info(
                t,
                broker_name="broker-a",
                broker_id=bid,
                addr=addr,
                cluster="DefaultCluster",
                role="SYNC_MASTER" if bid == 0 else "SLAVE",
            )
        )
    return with_raft_lags(out)


def test_parse_raft_reads_the_runtime_keys_and_ignores_classic_brokers():
    r = parse_raft(GROUP["n0"][1])
    assert r is not None
    assert (r.group, r.self_id, r.role, r.term, r.leader_id) == (
        "broker-a",
        "n0",
        "FOLLOWER",
        4,
        "n1",
    )
    assert (r.ledger_end_index, r.committed_index, r.peers) == (95, 90, PEERS)
    assert parse_raft({"commitLogMaxOffset": "10"}) is None
    blank = parse_raft({"dledgerGroup": "g", "dledgerSelfId": "n0", "dledgerLeaderId": ""})
    assert blank is not None and blank.leader_id is None and blank.term is None


def test_lag_is_the_leaders_end_minus_the_members_and_blank_for_the_leader():
    lags = {s.raft.self_id: s.raft.lag for s in statuses() if s.raft}
    assert lags == {"n0": 25, "n1": None, "n2": 0}
    # without a leader nobody's lag is known
    followers = [parse_raft(GROUP[k][1]) for k in ("n0", "n2")]
    assert [r.lag for r in with_lags(r for r in followers if r)] == [None, None]


def test_a_stale_leader_in_an_older_term_is_not_the_groups_leader():
    old = parse_raft(table("n0", "LEADER", 3, 130, 95))
    new = parse_raft(table("n1", "LEADER", 4, 120, 118))
    assert old is not None and new is not None
    assert group_leaders([old, new])["broker-a"] is new
    assert with_lag(old, new).lag == 0  # ahead with an uncommitted tail: not behind
    assert raft_cell(new, new) == "n1 LEADER *" and raft_cell(old, new) == "n0 LEADER"


def test_rmq_cluster_shows_each_members_raft_state_and_marks_the_leader(capsys):
    admin_render.cluster_status(statuses())
    out = capsys.readouterr().out
    assert "DLedger groups (* = the group's current leader)" in out
    cells = {
        c[1].split()[0]: c
        for line in out.splitlines()
        if line.startswith("│ broker-a │ n")
        for c in [[cell.strip() for cell in line.strip("│ ").split("│")]]
    }
    assert set(cells) == {"n0", "n1", "n2"}
    # group, member, address, term, ledger end, committed, lag, leader
    assert cells["n1"] == [
        "broker-a",
        "n1 LEADER *",
        "127.0.0.1:10921",
        "4",
        "120",
        "118",
        "",
        "n1",
    ]
    assert cells["n0"] == [
        "broker-a",
        "n0 FOLLOWER",
        "127.0.0.1:10911",
        "4",
        "95",
        "90",
        "25",
        "n1",
    ]
    assert cells["n2"][1:7] == ["n2 FOLLOWER", "127.0.0.1:10931", "4", "120", "118", "0"]
    # the brokers table says what replicates them, and there is no HA "no slave" noise
    assert "DLedger broker-a n1 LEADER, term 4" in out
    assert "no slave connections" not in out


def test_rmq_cluster_json_carries_the_raft_state_with_the_lag(capsys):
    admin_render.cluster_status(statuses(), as_json=True)
    doc = json.loads(capsys.readouterr().out)
    raft = {b["raft"]["self_id"]: b["raft"] for b in doc["brokers"]}
    assert raft["n0"]["lag"] == 25 and raft["n1"]["lag"] is None
    assert raft["n1"] == {
        "group": "broker-a",
        "self_id": "n1",
        "role": "LEADER",
        "term": 4,
        "leader_id": "n1",
        "ledger_end_index": 120,
        "committed_index": 118,
        "peers": PEERS,
        "lag": None,
        "rebuilding": False,
    }


def test_a_classic_cluster_shows_no_dledger_table(capsys):
    classic = parse_runtime_info(
        {"commitLogMaxOffset": "5"}, broker_name="broker-a", broker_id=0, addr="a:1"
    )
    admin_render.cluster_status(with_raft_lags([classic]))
    out = capsys.readouterr().out
    assert "DLedger" not in out and "no slave connections" in out


# --- rmq top -----------------------------------------------------------------------------------


def snapshot(*, n1_down: bool = False) -> TopSnapshot:
    nodes = []
    for k, (bid, t) in GROUP.items():
        addr = f"127.0.0.1:109{1 + int(k[1])}1"
        key = ("DefaultCluster", "broker-a", bid)
        got: NodeInfo | BaseException = NodeInfo(t, "SYNC_MASTER" if bid == 0 else "SLAVE")
        if n1_down and k == "n1":
            got = ConnectionRefusedError()
        nodes.append(node_view(addr, key, got, listed=True))
    return TopSnapshot("127.0.0.1:9876", 10.0, 1_700_000_000.0, tuple(nodes))


def text(snap: TopSnapshot, width: int) -> str:
    console = Console(record=True, width=width, color_system=None, highlight=False)
    console.print(render_top(snap, width=width))
    return console.export_text()


def row(out: str, needle: str) -> list[str]:
    (line,) = [line for line in out.splitlines() if needle in line]
    return line.split()


def test_top_shows_raft_role_term_indexes_and_lag_and_names_the_leader():
    out = text(snapshot(), 200)
    assert out.splitlines()[1] == "DLedger leaders: broker-a n1 (term 4)"
    header = row(out, "ledger end")
    for col in ("raft", "term", "ledger", "committed", "lag"):
        assert col in header
    n0 = row(out, "n0 FOLLOWER")
    n1 = row(out, "n1 LEADER *")
    assert n0[n0.index("FOLLOWER") + 1 : n0.index("FOLLOWER") + 5] == ["4", "95", "90", "25"]
    # the leader's lag is blank: term, end, committed, then the next column (the address)
    assert n1[n1.index("*") + 1 : n1.index("*") + 5] == ["4", "120", "118", "127.0.0.1:10921"]


def test_top_without_an_answering_leader_says_so_and_keeps_the_members():
    out = text(snapshot(n1_down=True), 200)
    assert out.splitlines()[1] == "DLedger leaders: broker-a none (electing?)"
    assert "n0 FOLLOWER" in out and "DOWN" in out


@pytest.mark.parametrize("width", [60, 90])
def test_narrow_terminals_keep_the_raft_role_before_the_numbers(width):
    out = text(snapshot(), width)
    assert "n1 LEADER *" in out
    assert all(len(line) <= width for line in out.splitlines())


def test_a_classic_cluster_in_top_has_no_raft_columns():
    node = NodeView("DefaultCluster", "broker-a", 0, "127.0.0.1:10911", role="ASYNC_MASTER")
    out = text(TopSnapshot("127.0.0.1:9876", 1.0, 1_700_000_000.0, (node,)), 200)
    assert "raft" not in out and "leader" not in out and "DLedger" not in out


async def test_top_collector_keeps_a_dead_members_id_and_names_the_new_leader(autojump_clock):
    from cli.top.model import TopCollector
    from common.errors import RemotingConnectError
    from common.model import BrokerData, ClusterInfo

    state = {k: dict(t) for k, (_, t) in GROUP.items()}
    addrs = {k: f"127.0.0.1:109{1 + int(k[1])}1" for k in GROUP}
    down: set[str] = set()

    class Source:
        async def cluster_info(self) -> ClusterInfo:
            ids = {
                (0 if t["dledgerRole"] == "LEADER" else int(k[1]) + 1): addrs[k]
                for k, t in state.items()
                if k not in down
            }
            data = BrokerData("DefaultCluster", "broker-a", ids)
            return ClusterInfo({"broker-a": data}, {"DefaultCluster": ["broker-a"]})

        async def node_info(self, addr: str) -> NodeInfo:
            k = next(k for k, a in addrs.items() if a == addr)
            if k in down:
                raise RemotingConnectError(f"{addr} refused")
            return NodeInfo(state[k], "SLAVE")

        async def topic_list(self) -> list[str]:
            return []

        async def group_list(self) -> list[str]:
            return []

        async def producers(self) -> list[object]:
            return []

    collector = TopCollector(Source(), "127.0.0.1:9876")  # type: ignore[arg-type]
    first = await collector.collect()
    assert first.raft_leaders()["broker-a"].self_id == "n1"
    # n1 dies; n2 wins the election of term 5
    down.add("n1")
    state["n2"].update(dledgerRole="LEADER", dledgerTerm="5", dledgerLeaderId="n2")
    state["n0"].update(dledgerTerm="5", dledgerLeaderId="n2")
    snap = await collector.collect()
    assert snap.raft_leaders()["broker-a"].self_id == "n2"
    dead = snap.node(addrs["n1"])
    assert dead is not None and not dead.alive and dead.raft is not None
    assert dead.raft.self_id == "n1"  # remembered from the last answer
    out = text(snap, 200)
    assert out.splitlines()[1] == "DLedger leaders: broker-a n2 (term 5)"
    assert "n1 DOWN" in out and "n2 LEADER *" in out


def test_a_member_rebuilding_after_a_reset_says_so():
    member = parse_raft({**table("n2", "FOLLOWER", 4, 40, 40), "dledgerRebuilding": "true"})
    leader = parse_raft(table("n1", "LEADER", 4, 120, 118))
    assert member is not None and leader is not None and member.rebuilding
    assert raft_cell(member, leader) == "n2 FOLLOWER rebuilding"
    caught_up = parse_raft({**table("n2", "FOLLOWER", 4, 120, 118), "dledgerRebuilding": "false"})
    assert caught_up is not None and not caught_up.rebuilding
    assert raft_cell(caught_up, leader) == "n2 FOLLOWER"
