"""`rmq dledger ...`: DLedger groups (`rmq up --dledger N`) on purpose.

`rmq dledger leadership-transfer --to n1` moves a group's leadership to member n1 with
DLedger's LEADERSHIP_TRANSFER (the flow is in `cli/dledger/transfer.py`). The members' Raft
state is shown by `rmq cluster` and `rmq top`.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated

import typer

from cli.admin.options import JsonOpt
from cli.app import _namesrv, _run, examples

if TYPE_CHECKING:
    from cli.dledger.transfer import TransferOutcome


@examples(
    "rmq dledger leadership-transfer --to n1                  # the only group",
    "rmq dledger leadership-transfer --to n2 --group broker-b",
    "rmq dledger leadership-transfer --to broker-b-n2         # the node name says the group",
    "rmq dledger leadership-transfer --to n1 --json",
)
def leadership_transfer(
    ctx: typer.Context,
    to: Annotated[
        str,
        typer.Option("--to", help="The member to lead: n0, n1, ... or a node name broker-a-n1."),
    ],
    group: Annotated[
        str | None,
        typer.Option(
            "--group",
            "-g",
            help="The DLedger group (broker name); needed when the cluster has several.",
        ),
    ] = None,
    timeout: Annotated[
        float, typer.Option("--timeout", min=0.1, help="Seconds to wait for the new leader.")
    ] = 10.0,
    as_json: JsonOpt = False,
) -> None:
    """Move a DLedger group's leadership to another member (DLedger LEADERSHIP_TRANSFER).

    Finds the group's members through the nameserver, asks them who leads (METADATA), sends
    the transfer to the leader and waits until the target leads. Prints the outcome in one
    line; exits 1 with one error line when the group or member is unknown, the leader
    refuses (e.g. the target's log is too far behind) or nothing happens in time. A target
    that already leads is no error.
    """
    namesrv = _namesrv(ctx).split(";")[0].strip()

    async def main() -> TransferOutcome:
        from cli.dledger.transfer import leadership_transfer

        return await leadership_transfer(namesrv, to, group=group, timeout=timeout)

    show_outcome(_run(main), as_json=as_json)


def show_outcome(outcome: TransferOutcome, *, as_json: bool = False) -> None:
    """What `rmq dledger leadership-transfer` prints: one line (or one JSON document)."""
    if as_json:
        typer.echo(json.dumps(outcome.to_json(), indent=2))
        return
    term = f"term {'-' if outcome.term is None else outcome.term}"
    if not outcome.moved:
        typer.echo(f"{outcome.group}: {outcome.new_leader} already leads ({term}); nothing to move")
        return
    typer.echo(
        f"{outcome.group}: leadership moved {outcome.previous_leader} -> {outcome.new_leader} "
        f"({term}, {outcome.seconds:.2f} s)"
    )
