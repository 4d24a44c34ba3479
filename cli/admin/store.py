"""`rmq store verify MASTER_STORE SLAVE_STORE`: compare two CommitLogs (`store_verify.py`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from cli.app import examples


@examples(
    "rmq store verify .rmq/broker-a .rmq/broker-a-s1",
    "rmq store verify /data/master/store/commitlog /data/slave/store/commitlog",
    "rmq store verify .rmq/broker-a .rmq/broker-a-s1 --json",
    "rmq store verify M S || echo diverged   # exit 2: different; 1: an error (not a store)",
)
def verify_cmd(
    master: Annotated[Path, typer.Argument(help="The master's storePathRootDir (or commitlog/).")],
    slave: Annotated[Path, typer.Argument(help="The slave's storePathRootDir (or commitlog/).")],
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON document.")] = False,
) -> None:
    """Exit 0 when the slave's CommitLog is a byte-identical prefix of the master's, 2 when
    it is not (a difference, or a slave ahead of its master), 1 on an error such as a path
    that is not a store (one `error:` line, like every rmq command). Stop the brokers first, or accept that the newest bytes may move."""
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
