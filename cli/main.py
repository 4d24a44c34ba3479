"""The `rmq` command: run a local cluster, servers, and talk to them.

Commands are thin: parse options, `trio.run(...)` one coroutine, hand the result to
`cli/render.py`. Imports of trio, the servers and the client happen inside the commands.
The application and its shared helpers live in `cli/app.py`; each `cli/cmd_*.py` module adds
its commands on import.
"""

from __future__ import annotations

import os
import sys

import typer

# Importing a command module registers its commands on `app`.
from cli import (  # noqa: F401
    cmd_admin,
    cmd_bench,
    cmd_dledger,
    cmd_local,
    cmd_servers,
    cmd_store,
    cmd_top,
)

# isort: split
# after the others: `rmq --help` keeps the order users know, chaos last of the commands
from cli import cmd_chaos  # noqa: F401
from cli.app import app
from cli.cmd_local import up
from cli.node import (
    BROKER_FLAG_PROPERTIES,
    broker_properties,
    properties_text,
)
from cli.up_arguments import fast_up_arguments

__all__ = [
    "BROKER_FLAG_PROPERTIES",
    "app",
    "broker_properties",
    "fast_up_arguments",
    "main",
    "properties_text",
]


def main() -> None:
    """Console-script entry point (`rmq`)."""
    fast = fast_up_arguments(sys.argv[1:])
    if fast is not None:
        try:
            up(**fast)
        except typer.Exit as exc:
            sys.exit(exc.exit_code)
        except KeyboardInterrupt:  # before trio.run took over the signal: what click says
            print("Aborted!", file=sys.stderr)
            sys.exit(1)
        return
    # Tests and `rmq up` children run with the repo as cwd; nothing to set up here beyond typer.
    app(prog_name=os.path.basename(sys.argv[0]) if sys.argv[0].endswith("rmq") else "rmq")


if __name__ == "__main__":
    main()
