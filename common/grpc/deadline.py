"""The ``grpc-timeout`` request header: how long the client waits, as up to 8 digits and a unit."""

from __future__ import annotations

_UNITS = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}


def parse_grpc_timeout(value: str) -> float | None:
    """Seconds, or None for a malformed value (gRPC then treats the call as having none)."""
    if not 2 <= len(value) <= 9:
        return None
    digits, unit = value[:-1], value[-1]
    if not digits.isdigit() or unit not in _UNITS:
        return None
    return int(digits) * _UNITS[unit]
