"""Nameserver configuration and its Java-properties view.

`NamesrvConfig` is a frozen attrs value: the service keeps the current one and swaps it for an
evolved copy when UPDATE_NAMESRV_CONFIG arrives, so every reader sees one consistent snapshot.

On the wire (GET_NAMESRV_CONFIG / UPDATE_NAMESRV_CONFIG) the config travels as Java properties
text with RocketMQ's names: durations in milliseconds (as `NamesrvConfig` in 5.x), booleans as
`true`/`false`. Our attributes keep seconds, like every other duration in this code base.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import attrs

from common.tls import TlsServerConfig

# Properties that may never be changed remotely: they name files on the server
# (RocketMQ keeps the same blacklist in NamesrvController.configBlackList).
PROTECTED_PROPERTIES = frozenset({"kvConfigPath", "configStorePath"})


def _default_kv_config_path() -> str:
    return os.path.join(os.path.expanduser("~"), "namesrv", "kvConfig.json")


@attrs.frozen
class NamesrvConfig:
    listen_port: int = 9876
    host: str = "127.0.0.1"
    kv_config_path: str = attrs.field(factory=_default_kv_config_path)
    # Seconds between two scans for brokers that stopped registering (4.9.7: 10 s).
    scan_not_active_broker_interval: float = 10.0
    # A broker not heard from for this long is dropped (4.9.7 BROKER_CHANNEL_EXPIRED_TIME).
    broker_channel_expired_time: float = 120.0
    # When true, GET_ROUTEINFO_BY_TOPIC fills orderTopicConf from KV namespace ORDER_TOPIC_CONFIG.
    order_message_enable: bool = False
    product_env_name: str = "center"
    cluster_test: bool = False
    # the Prometheus exporter (RocketMQ 5's keys; docs/metrics.md): 0 leaves it off; the host
    # defaults to the listen host
    metrics_prom_exporter_host: str = ""
    metrics_prom_exporter_port: int = 0
    # TLS on the listen port (common/tls.py; RocketMQ's tls.server.* keys, read from the file
    # `rmq namesrv --tls-config` names as RocketMQ reads tls.config.file)
    tls: TlsServerConfig = attrs.field(factory=TlsServerConfig)

    def to_properties(self) -> dict[str, str]:
        """The config as RocketMQ property names and string values."""
        return {
            name: _encode_value(spec, getattr(self, attr)) for name, (attr, spec) in _PROPS.items()
        }

    def updated(self, props: Mapping[str, str]) -> NamesrvConfig:
        """A copy with the known properties of `props` applied; unknown names are ignored
        (as RocketMQ's Configuration.update does). Raises ValueError for an ill-typed value and
        PermissionError for a protected one."""
        protected = PROTECTED_PROPERTIES.intersection(props)
        if protected:
            raise PermissionError(f"Can not update config path: {', '.join(sorted(protected))}")
        # Any: evolve's keywords are typed per field, and which field gets which value is the
        # _PROPS table's business (each kind decodes to its field's type), not something a
        # checker can follow through a name lookup.
        changes: dict[str, Any] = {}
        for name, raw in props.items():
            if name not in _PROPS:
                continue
            attr, spec = _PROPS[name]
            changes[attr] = _decode_value(name, spec, raw)
        return attrs.evolve(self, **changes)


# property name -> (attribute, value kind). "ms" values are seconds scaled by 1000.
_PROPS: dict[str, tuple[str, str]] = {
    "listenPort": ("listen_port", "int"),
    "bindAddress": ("host", "str"),
    "kvConfigPath": ("kv_config_path", "str"),
    "scanNotActiveBrokerInterval": ("scan_not_active_broker_interval", "ms"),
    "brokerChannelExpiredTime": ("broker_channel_expired_time", "ms"),
    "orderMessageEnable": ("order_message_enable", "bool"),
    "productEnvName": ("product_env_name", "str"),
    "clusterTest": ("cluster_test", "bool"),
    "metricsPromExporterHost": ("metrics_prom_exporter_host", "str"),
    "metricsPromExporterPort": ("metrics_prom_exporter_port", "int"),
}


def _encode_value(kind: str, value: object) -> str:
    if kind == "bool":
        return "true" if value else "false"
    if kind == "ms":
        if not isinstance(value, int | float):
            raise TypeError(f"a duration in seconds, not {value!r}")
        return str(round(value * 1000))
    return str(value)


def _decode_value(name: str, kind: str, raw: str) -> object:
    raw = raw.strip()
    try:
        if kind == "int":
            return int(raw)
        if kind == "ms":
            ms = int(raw)
            if ms <= 0:
                raise ValueError("must be positive")
            return ms / 1000.0
    except ValueError as exc:
        raise ValueError(f"bad value for {name}: {raw!r} ({exc})") from None
    if kind == "bool":
        # Java's Boolean.parseBoolean: anything but "true" (any case) is false.
        return raw.lower() == "true"
    return raw


def parse_properties(text: str) -> dict[str, str]:
    """Parse Java properties text: `key=value`, `key: value` or `key value` lines, `#`/`!`
    comments, backslash line continuations and the common escapes."""
    props: dict[str, str] = {}
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i].lstrip()
        i += 1
        if not line or line[0] in "#!":
            continue
        # A line ending in an odd number of backslashes continues on the next line.
        while _continues(line) and i < len(lines):
            line = line[:-1] + lines[i].lstrip()
            i += 1
        if _continues(line):
            line = line[:-1]
        key, value = _split_entry(line)
        props[_unescape(key)] = _unescape(value)
    return props


def format_properties(props: Mapping[str, str]) -> str:
    """`key=value` lines, as RocketMQ's MixAll.properties2String writes them."""
    return "".join(f"{k}={v}\n" for k, v in props.items())


def _continues(line: str) -> bool:
    n = len(line) - len(line.rstrip("\\"))
    return n % 2 == 1


def _split_entry(line: str) -> tuple[str, str]:
    j = 0
    while j < len(line):
        c = line[j]
        if c == "\\":
            j += 2
            continue
        if c in "=: \t\f":
            break
        j += 1
    key = line[:j]
    # The separator is optional whitespace, then at most one '=' or ':', then whitespace.
    rest = line[j:].lstrip(" \t\f")
    if rest[:1] in ("=", ":"):
        rest = rest[1:].lstrip(" \t\f")
    return key, rest


_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def _unescape(s: str) -> str:
    if "\\" not in s:
        return s
    out: list[str] = []
    j = 0
    while j < len(s):
        c = s[j]
        if c == "\\" and j + 1 < len(s):
            n = s[j + 1]
            if n == "u" and j + 6 <= len(s):
                try:
                    out.append(chr(int(s[j + 2 : j + 6], 16)))
                    j += 6
                    continue
                except ValueError:
                    pass
            out.append(_ESCAPES.get(n, n))
            j += 2
            continue
        out.append(c)
        j += 1
    return "".join(out)
