"""How the clients of every `rmq` command reach the servers: plain TCP, or TLS when asked.

`RMQ_TLS=1` (or `rmq --tls`, which sets it) turns TLS on for every client a command opens; the
servers' certificates are checked against `RMQ_TLS_CA`, else the CA `rmq up --tls` made in the
default data directory (`.rmq/tls/ca.pem`) when there is one, else the system's CAs.
Imports nothing heavy until TLS is asked for (ssl and the client stack load then).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from common.remoting.network import Network

__all__ = ["TLS_CA_ENV", "TLS_ENV", "network_from_env"]

TLS_ENV = "RMQ_TLS"
TLS_CA_ENV = "RMQ_TLS_CA"
# where `rmq up --tls` keeps its CA in the default data directory (cli/local/certificates.py)
DEFAULT_CA = Path(".rmq/tls/ca.pem")


def network_from_env() -> Network | None:
    """A TLS network when RMQ_TLS is 1/true/yes/on (module docstring); None (plain TCP)
    otherwise."""
    if os.environ.get(TLS_ENV, "").strip().lower() not in ("1", "true", "yes", "on"):
        return None
    from common.remoting.network import TCP
    from common.tls import TlsClientConfig, client_network

    ca = os.environ.get(TLS_CA_ENV) or None
    if ca is None and DEFAULT_CA.is_file():
        ca = str(DEFAULT_CA)
    return client_network(TlsClientConfig(enable=True, trust_cert_path=ca), TCP)
