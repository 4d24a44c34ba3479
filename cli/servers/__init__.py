"""One server in the foreground: `rmq namesrv`, `rmq broker`, and `python -m cli.servers.node`.

* `node.py`: the flags-to-config mapping and serving of both servers, and the lean argparse
  entry point that `rmq up` and the chaos harness spawn (no typer, whose imports would slow
  every node's start);
* `serve.py`: run one service until Ctrl-C, SIGTERM or, for a supervised node, stdin EOF;
* `commands.py`: the typer commands `rmq namesrv` and `rmq broker`.
"""
