"""Run one server node: the code behind `rmq namesrv` / `rmq broker`, and a lean entry point.

Theory of operation: `rmq up` starts one interpreter per node, and every millisecond an
interpreter spends importing before it listens is start-up time the user waits for. typer
converts each command's parameters through pydantic (100-200 ms of imports on a busy host),
so the nodes `rmq up` spawns do not go through typer: they run

    python -m cli.servers.node namesrv --host H --port P [--data-dir D] [--watch-stdin]
    python -m cli.servers.node broker [--config F] [--name N] ... [--watch-stdin]

parsed here with argparse. The typer commands (`commands.py`) call the same functions
(`serve_namesrv`, `serve_broker`, `broker_properties`, and `run_main` of `cli/errors.py`), so
flags map to the same config and errors follow the same policy either way: a user's error (port
in use, bad config) prints ONE line on stderr and exits 1, no traceback.

This module imports nothing heavy at import time: trio, the servers and the renderers are
imported inside the functions that need them.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cli.errors import Exit, describe_os_error, run_main
from cli.namesrv_address import namesrv_from_env

if TYPE_CHECKING:
    import argparse

FLUSH_TYPES = ("SYNC_FLUSH", "ASYNC_FLUSH")
BROKER_ROLES = ("ASYNC_MASTER", "SYNC_MASTER", "SLAVE")

# Flags of `rmq broker` and the broker.conf property each one overrides.
BROKER_FLAG_PROPERTIES = {
    "name": "brokerName",
    "cluster": "brokerClusterName",
    "broker_id": "brokerId",
    "host": "brokerIP1",
    "port": "listenPort",
    "namesrv": "namesrvAddr",
    "data_dir": "storePathRootDir",
    "flush": "flushDiskType",
    "role": "brokerRole",
    "metrics_port": "metricsPromExporterPort",
    "grpc_port": "grpcServerPort",
    # RocketMQ's -Dtls.config.file: a tls.properties (common/tls.py)
    "tls_config": "tls.config.file",
}


def broker_properties(conf_text: str | None, overrides: dict[str, Any]) -> dict[str, str]:
    """broker.conf properties with the given flags applied on top (flags win)."""
    from namesrv.config import parse_properties

    props = parse_properties(conf_text or "")
    for flag, value in overrides.items():
        if value is not None:
            props[BROKER_FLAG_PROPERTIES[flag]] = str(value)
    return props


def properties_text(props: dict[str, str]) -> str:
    """Java properties text that parses back to exactly `props` (backslashes escaped)."""

    def esc(s: str, *, key: bool) -> str:
        s = s.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")
        if key:
            for ch in "=: ":
                s = s.replace(ch, "\\" + ch)
        elif s.startswith(" "):
            s = "\\" + s
        return s

    return "".join(f"{esc(k, key=True)}={esc(v, key=False)}\n" for k, v in props.items())


def config_file_error(path: Path, exc: OSError | UnicodeDecodeError) -> str:
    """Why broker.conf `path` could not be read, in one line."""
    if isinstance(exc, UnicodeDecodeError):
        return f"{path}: not a text file"
    return describe_os_error(exc)


def make_data_dir(data_dir: Path) -> None:
    """Create a node's data directory; one error line and `Exit(1)` when that cannot be done
    (a path under a regular file, under /proc, not writable...)."""
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        from cli import render

        why = "not a directory" if isinstance(exc, FileExistsError) else exc.strerror or exc
        render.error(f"cannot create data directory {data_dir}: {why}")
        raise Exit(1) from None


# --- the two servers -------------------------------------------------------------------------

# A node's log is read after the fact (`rmq status` shows its last lines, a user greps it
# for when something happened), so every logged line says when.
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure_logging() -> None:
    """Log WARNING and above to stderr with a timestamp (a no-op if logging is set up)."""
    import logging

    logging.basicConfig(format=LOG_FORMAT, level=logging.WARNING)


def serve_namesrv(
    *,
    port: int,
    host: str,
    data_dir: Path | None,
    watch_stdin: bool = False,
    metrics_port: int = 0,
    tls_config: Path | None = None,
) -> None:
    """Run a nameserver until Ctrl-C, SIGTERM (or stdin EOF with `watch_stdin`);
    `metrics_port`: serve Prometheus metrics there (docs/metrics.md; 0: no); `tls_config`: a
    RocketMQ tls.properties (tls.server.mode, tls.server.certPath ...; common/tls.py)."""
    configure_logging()
    kwargs: dict[str, Any] = {
        "listen_port": port,
        "host": host,
        "metrics_prom_exporter_port": metrics_port,
    }
    if data_dir is not None:
        make_data_dir(data_dir)
        kwargs["kv_config_path"] = str(data_dir / "kvConfig.json")

    async def main() -> None:
        from cli import render
        from cli.servers.serve import serve_until_stopped
        from namesrv.config import NamesrvConfig
        from namesrv.service import run_namesrv

        if tls_config is not None:
            from common.tls import TlsServerConfig, tls_properties
            from namesrv.config import parse_properties

            props = tls_properties({"tls.config.file": str(tls_config)}, parse_properties)
            kwargs["tls"] = TlsServerConfig.from_properties(props)
        config = NamesrvConfig(**kwargs)
        await serve_until_stopped(
            run_namesrv,
            config,
            on_started=lambda h: render.listening("namesrv", f"{host}:{h.port}"),
            watch_stdin=watch_stdin,
        )

    run_main(main)


def serve_broker(
    props: dict[str, str],
    *,
    data_dir: Path | None = None,
    watch_stdin: bool = False,
    config_file: Path | None = None,
) -> None:
    """Run a broker configured by broker.conf `props` until Ctrl-C, SIGTERM (or stdin EOF)."""
    configure_logging()
    if data_dir is not None:
        make_data_dir(data_dir)
    # UPDATE_BROKER_CONFIG writes changed keys back to the -c file, as RocketMQ does
    config_path = str(config_file.resolve()) if config_file is not None else None

    async def main() -> None:
        from broker.config import BrokerConfig
        from broker.service import run_broker
        from cli import render
        from cli.servers.serve import serve_until_stopped

        config = BrokerConfig.from_properties(
            properties_text(props), broker_config_path=config_path
        )
        await serve_until_stopped(
            run_broker,
            config,
            on_started=lambda h: render.listening(
                f"broker {config.broker_name}", f"{config.broker_ip1}:{h.port}"
            ),
            watch_stdin=watch_stdin,
        )

    run_main(main)


# --- the lean entry point --------------------------------------------------------------------


def _choice(allowed: Sequence[str]) -> Callable[[str], str]:
    def parse(value: str) -> str:
        if value.upper() not in allowed:
            raise ValueError(value)  # argparse: "invalid <name> value"
        return value.upper()

    parse.__name__ = "/".join(allowed)
    return parse


def _parser() -> argparse.ArgumentParser:
    import argparse

    ap = argparse.ArgumentParser(
        prog="python -m cli.servers.node",
        description="Run one trio-rmq server node (what `rmq up` spawns; see `rmq --help`).",
    )
    sub = ap.add_subparsers(dest="kind", required=True)
    ns = sub.add_parser("namesrv", help="Run a nameserver.")
    ns.add_argument("--port", "-p", type=int, default=9876)
    ns.add_argument("--host", default="127.0.0.1")
    ns.add_argument("--data-dir", type=Path)
    ns.add_argument("--metrics-port", type=int, default=0)
    ns.add_argument("--tls-config", type=Path)
    ns.add_argument("--watch-stdin", action="store_true")
    br = sub.add_parser("broker", help="Run a broker; flags override the config file.")
    br.add_argument("--config", "-c", type=Path, dest="config_file")
    br.add_argument("--name")
    br.add_argument("--cluster")
    br.add_argument("--id", type=int, dest="broker_id")
    br.add_argument("--host")
    br.add_argument("--port", "-p", type=int)
    br.add_argument("--namesrv")
    br.add_argument("--data-dir", type=Path)
    br.add_argument("--flush", type=_choice(FLUSH_TYPES))
    br.add_argument("--role", type=_choice(BROKER_ROLES))
    br.add_argument("--metrics-port", type=int)
    br.add_argument("--grpc-port", type=int)
    br.add_argument("--tls-config", type=Path)
    br.add_argument("--watch-stdin", action="store_true")
    return ap


def broker_props_from_args(args: argparse.Namespace) -> dict[str, str]:
    """broker.conf properties of parsed `broker` arguments (config file, then flags)."""
    conf_text = args.config_file.read_text() if args.config_file is not None else None
    overrides = {flag: getattr(args, flag) for flag in BROKER_FLAG_PROPERTIES}
    props = broker_properties(conf_text, overrides)
    props.setdefault("namesrvAddr", namesrv_from_env())
    return props


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.kind == "namesrv":
            serve_namesrv(
                port=args.port,
                host=args.host,
                data_dir=args.data_dir,
                watch_stdin=args.watch_stdin,
                metrics_port=args.metrics_port,
                tls_config=args.tls_config,
            )
            return 0
        try:
            props = broker_props_from_args(args)
        except (OSError, UnicodeDecodeError) as exc:
            from cli import render

            render.error(f"cannot read config file: {config_file_error(args.config_file, exc)}")
            return 1
        serve_broker(
            props,
            data_dir=args.data_dir,
            watch_stdin=args.watch_stdin,
            config_file=args.config_file,
        )
    except Exit as exc:
        return exc.code
    return 0


if __name__ == "__main__":
    sys.exit(main())
