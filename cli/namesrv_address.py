"""The nameserver address every `rmq` command and node falls back on.

`rmq --namesrv` (or `-n`) wins, then the environment's RMQ_NAMESRV, then the local default.
Imports nothing: the lean node entry point (`python -m cli.servers.node`) reads it too.
"""

from __future__ import annotations

import os

DEFAULT_NAMESRV = "127.0.0.1:9876"
NAMESRV_ENV = "RMQ_NAMESRV"


def namesrv_from_env() -> str:
    """RMQ_NAMESRV when it is set and not empty, else the default."""
    return os.environ.get(NAMESRV_ENV) or DEFAULT_NAMESRV
