"""whiteRemoteAddress matching (RocketMQ ``RemoteAddressStrategyFactory``), IPv4.

The forms plain_acl.yml allows, each naming the addresses a rule admits:

* ``*`` or ``*.*.*.*``: every address;
* ``192.168.0.1``: that address;
* ``192.168.*.*`` / ``192.168.1.*``: trailing segments free;
* ``192.168.1.1-100`` (or ``192.168.1-5.*``): a range in one segment, the later ones free;
* ``192.168.1.{1,2,3}``: a list in the last segment.

An empty string admits nothing.  A malformed rule is a ValueError when the file is read, so a
typo is reported at load time instead of silently admitting or refusing.
"""

from __future__ import annotations

import re
from collections.abc import Callable

Matcher = Callable[[str], bool]

_SEGMENT = re.compile(r"^(\*|\d{1,3}(-\d{1,3})?)$")
_LIST = re.compile(r"^(\d{1,3}\.){3}\{(\d{1,3}(,\d{1,3})*)\}$")


def _byte(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 255:
        raise ValueError(f"{text} is not an IPv4 address byte")
    return value


def compile_rule(rule: str) -> Matcher:
    """A predicate over a peer's IP address string for one whiteRemoteAddress rule."""
    rule = rule.strip()
    if not rule:
        return lambda ip: False
    if rule in ("*", "*.*.*.*"):
        return lambda ip: True
    m = _LIST.match(rule)
    if m:
        prefix = rule[: rule.index("{")]
        allowed = {f"{prefix}{_byte(x)}" for x in m.group(2).split(",")}
        return lambda ip: ip in allowed
    parts = rule.split(".")
    if len(parts) != 4 or not all(_SEGMENT.match(p) for p in parts):
        raise ValueError(f"whiteRemoteAddress {rule!r} is not a form RocketMQ accepts")
    bounds: list[tuple[int, int] | None] = []
    free = False
    for p in parts:
        if p == "*":
            free = True
            bounds.append(None)
            continue
        if free:
            raise ValueError(f"whiteRemoteAddress {rule!r}: only trailing segments may be *")
        lo, _, hi = p.partition("-")
        low, high = _byte(lo), _byte(hi or lo)
        if low > high:
            raise ValueError(f"whiteRemoteAddress {rule!r}: range {p} is empty")
        bounds.append((low, high))

    def matches(ip: str) -> bool:
        segs = ip.split(".")
        if len(segs) != 4:
            return False
        for seg, bound in zip(segs, bounds, strict=True):
            if bound is None:
                continue
            if not seg.isdigit() or not bound[0] <= int(seg) <= bound[1]:
                return False
        return True

    return matches


def peer_ip(remote_addr: str) -> str:
    """The host part of a channel's ``host:port`` remote address."""
    host, sep, _port = remote_addr.rpartition(":")
    return host if sep else remote_addr
