"""`rmq store verify MASTER_STORE SLAVE_STORE`: compare two CommitLogs (`store_verify.py`); on
stores in RocketMQ's DLedger layout, check one member or two (`dledger_store_verify.py`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from cli.app import examples

if TYPE_CHECKING:
    from broker.dledger.broker.dledger_commitlog import DLedgerStorePaths


@examples(
    "rmq store verify .rmq/broker-a .rmq/broker-a-s1",
    "rmq store verify /data/master/store/commitlog /data/slave/store/commitlog",
    "rmq store verify .rmq/broker-a .rmq/broker-a-s1 --json",
    "rmq store verify M S || echo diverged   # exit 2: different; 1: an error (not a store)",
    "rmq store verify .rmq/broker-a-n0   # a DLedger member's store alone (dledger-<id>/ in it)",
)
def verify_cmd(
    master: Annotated[Path, typer.Argument(help="The master's storePathRootDir (or commitlog/).")],
    slave: Annotated[
        Path | None,
        typer.Argument(
            help="The slave's storePathRootDir (or commitlog/); optional for a DLedger store."
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON document.")] = False,
) -> None:
    """Exit 0 when the slave's CommitLog is a byte-identical prefix of the master's, 2 when
    it is not (a difference, or a slave ahead of its master), 1 on an error such as a path
    that is not a store (one `error:` line, like every rmq command). Stop the brokers first, or accept that the newest bytes may move.

    A store in RocketMQ's DLedger layout (a dledger-<selfId>/ member directory in it: Apache's,
    a classic store switched to DLedger, ours) is recognised from its files and checked on
    that layout: entries against their index units, each record's PHYSICALOFFSET (entry pos +
    48) and BODYCRC, the classic records below dividedCommitlogOffset, and ConsumeQueue units
    against the records they point at; given two, their common entries are compared too.
    Exit 2 names the damage or the difference."""
    if _dledger_paths(master) is not None or (slave and _dledger_paths(slave) is not None):
        _verify_dledger(master, slave, as_json)
        return
    if slave is None:
        typer.echo(
            f"error: {str(master)!r} is not a DLedger store: a classic store is verified "
            "against its slave (give SLAVE_STORE)",
            err=True,
        )
        raise typer.Exit(1)
    from cli.admin.store_verify import VerifyError, verify

    try:
        result = verify(master, slave)
    except VerifyError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    if as_json:
        typer.echo(json.dumps(result.to_json(), indent=2))
    else:
        typer.echo(result.line())
    raise typer.Exit(0 if result.ok else 2)


def _dledger_paths(path: Path) -> DLedgerStorePaths | None:
    """The DLedger member at ``path``, None for anything else (errors are the caller's to
    report: an unreadable path falls through to the classic check, which names it)."""
    from broker.dledger.broker.dledger_commitlog import DLedgerStoreError, find_dledger_store

    try:
        return find_dledger_store(path)
    except DLedgerStoreError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None


def _verify_dledger(master: Path, slave: Path | None, as_json: bool) -> None:
    from cli.admin.dledger_store_verify import check_member, check_pair

    mpaths = _dledger_paths(master)
    spaths = _dledger_paths(slave) if slave is not None else None
    if mpaths is None or (slave is not None and spaths is None):
        other = master if mpaths is None else slave
        typer.echo(
            f"error: {str(other)!r} is not a DLedger store, the other one is: a DLedger "
            "member is compared with another member",
            err=True,
        )
        raise typer.Exit(1)
    if slave is None or spaths is None:
        member = check_member(master, mpaths)
        if as_json:
            typer.echo(json.dumps({"layout": "dledger", **member.to_json()}, indent=2))
        else:
            typer.echo(member.line())
            for problem in member.problems:
                typer.echo(f"  {problem}")
        raise typer.Exit(0 if member.ok else 2)
    pair = check_pair(master, mpaths, slave, spaths)
    if as_json:
        typer.echo(json.dumps(pair.to_json(), indent=2))
    else:
        for line in pair.lines():
            typer.echo(line)
    raise typer.Exit(0 if pair.ok else 2)
