"""What the mqadmin-style commands share: the `--json` and `--cluster` options and the Admin
client they open on the global `--namesrv`.

The command modules of the room (`cluster.py`, `topic.py`, `group.py`, `message.py`) and
`rmq produce` / `rmq consume` (`cli/messages/commands.py`) import from here and never from
each other, so each area can change alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from cli.app import _namesrv, credentials_from_env
from cli.client_network import network_from_env

if TYPE_CHECKING:
    from rmq.admin import Admin

JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document instead of tables.")]
ClusterOpt = Annotated[str | None, typer.Option("--cluster", "-c", help="Cluster name.")]


def open_admin(ctx: typer.Context) -> Admin:
    """An Admin client on the nameserver(s) of the global `--namesrv` (enter it to connect)."""
    from rmq import Admin

    return Admin(_namesrv(ctx), credentials=credentials_from_env(), network=network_from_env())
