"""`rmq namesrv` and `rmq broker`: one server in the foreground.

They share their flag handling and serving with `node.py`, and the error policy with
`cli/errors.py`. The argparse entry point of `node.py` (`python -m cli.servers.node`) is what
`rmq up` spawns: typer's parameter conversion imports pydantic, too slow for a node's start-up.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cli.app import _namesrv, examples
from cli.servers.node import (
    BROKER_ROLES,
    FLUSH_TYPES,
    Exit,
    broker_properties,
    config_file_error,
    serve_broker,
    serve_namesrv,
)

# --- servers ---------------------------------------------------------------------------------


@examples("rmq namesrv", "rmq namesrv --port 9877 --data-dir /tmp/ns")
def namesrv(
    port: Annotated[int, typer.Option("--port", "-p", help="Listen port.")] = 9876,
    host: Annotated[str, typer.Option("--host", help="Listen address.")] = "127.0.0.1",
    data_dir: Annotated[
        Path | None,
        typer.Option("--data-dir", help="Directory for kvConfig.json (default ~/namesrv)."),
    ] = None,
    watch_stdin: Annotated[bool, typer.Option("--watch-stdin", hidden=True)] = False,
    tls_config: Annotated[
        Path | None,
        typer.Option("--tls-config", help="RocketMQ tls.properties (tls.server.mode, ...)."),
    ] = None,
) -> None:
    """Run a nameserver until Ctrl-C or SIGTERM.

    No --json: it prints one line once it listens, then only its log. Ask it with
    `rmq cluster --json`.
    """
    try:
        serve_namesrv(
            port=port, host=host, data_dir=data_dir, watch_stdin=watch_stdin, tls_config=tls_config
        )
    except Exit as exc:  # the error line is printed already
        raise typer.Exit(exc.code) from None


@examples(
    "rmq broker",
    "rmq broker -c conf/broker.conf",
    "rmq broker --name broker-b --port 10921 --namesrv 127.0.0.1:9876 --data-dir /tmp/b",
    "rmq broker --name broker-a --id 1 --role SLAVE --port 10931",
)
def broker(
    ctx: typer.Context,
    config_file: Annotated[
        Path | None,
        typer.Option("--config", "-c", help="RocketMQ broker.conf."),
    ] = None,
    name: Annotated[
        str | None, typer.Option("--name", help="brokerName (default broker-a).")
    ] = None,
    cluster: Annotated[str | None, typer.Option("--cluster", help="brokerClusterName.")] = None,
    broker_id: Annotated[
        int | None, typer.Option("--id", help="brokerId: 0 master, >0 slave.")
    ] = None,
    host: Annotated[
        str | None, typer.Option("--host", help="brokerIP1 (default 127.0.0.1).")
    ] = None,
    port: Annotated[
        int | None, typer.Option("--port", "-p", help="listenPort (default 10911).")
    ] = None,
    namesrv: Annotated[
        str | None, typer.Option("--namesrv", help="namesrvAddr (default: the global --namesrv).")
    ] = None,
    data_dir: Annotated[Path | None, typer.Option("--data-dir", help="storePathRootDir.")] = None,
    flush: Annotated[str | None, typer.Option("--flush", help="SYNC_FLUSH or ASYNC_FLUSH.")] = None,
    role: Annotated[
        str | None, typer.Option("--role", help="ASYNC_MASTER, SYNC_MASTER or SLAVE.")
    ] = None,
    tls_config: Annotated[
        Path | None,
        typer.Option("--tls-config", help="tls.config.file: RocketMQ tls.properties."),
    ] = None,
    watch_stdin: Annotated[bool, typer.Option("--watch-stdin", hidden=True)] = False,
) -> None:
    """Run a broker until Ctrl-C or SIGTERM. Flags override the config file.

    No --json: it prints one line once it listens, then only its log. Ask it with
    `rmq broker status ADDR --json`.
    """

    if flush is not None and flush.upper() not in FLUSH_TYPES:
        raise typer.BadParameter("must be SYNC_FLUSH or ASYNC_FLUSH", param_hint="--flush")
    if role is not None and role.upper() not in BROKER_ROLES:
        raise typer.BadParameter("must be ASYNC_MASTER, SYNC_MASTER or SLAVE", param_hint="--role")
    try:
        conf_text = config_file.read_text() if config_file is not None else None
    except (OSError, UnicodeDecodeError) as exc:
        assert config_file is not None
        typer.echo(
            f"error: cannot read config file: {config_file_error(config_file, exc)}", err=True
        )
        raise typer.Exit(1) from None
    overrides = {
        "name": name,
        "cluster": cluster,
        "broker_id": broker_id,
        "host": host,
        "port": port,
        "namesrv": namesrv,
        "data_dir": data_dir,
        "flush": flush.upper() if flush else None,
        "role": role.upper() if role else None,
        "tls_config": tls_config,
    }
    props = broker_properties(conf_text, overrides)
    props.setdefault("namesrvAddr", _namesrv(ctx))
    try:
        serve_broker(props, data_dir=data_dir, watch_stdin=watch_stdin, config_file=config_file)
    except Exit as exc:  # the error line is printed already
        raise typer.Exit(exc.code) from None
