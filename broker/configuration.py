"""The broker's configuration as UPDATE_BROKER_CONFIG changes it (RocketMQ ``Configuration``).

Theory of operation
-------------------
RocketMQ's ``Configuration.update`` sets the named fields of the config objects by reflection,
bumps the configuration's DataVersion (the ``version`` header of GET_BROKER_CONFIG) and writes
every property back to the broker's config file (the ``-c`` file, else
``~/store/config/broker.properties``).  Unknown names and values that do not parse are dropped
silently there; a key is then "updated" but nothing happened.

We keep the facts and refuse the silent part.  :func:`plan_update` reads the request's
properties and sorts every key into one of three kinds, or refuses the whole request (nothing
applied) with a remark naming the key:

* *live*: read by the request paths through ``controller.config`` (or copied into a manager,
  which :meth:`Configuration.apply` updates too), so the new value holds from the next request;
* *restart*: accepted and written to the file, but a part built at start holds the old value
  (ports, store sizes, HA timings); the answer's remark lists these keys;
* *refused*: unknown names, values that do not parse, and the keys that name files or
  directories.  Writing paths from the network is how RocketMQ's own updateBrokerConfig became
  an attack vector (its 5.x ``configBlackList``); a path is changed in the file, by hand.

The file is rewritten key by key (:func:`merge_properties`): a changed key's line is replaced in
place, a new key appended, comments and other lines kept.  RocketMQ writes every property
instead; a restart reads the same values either way, and the operator's file stays readable.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from broker.config import _PROPERTIES, BrokerConfig, _FieldValues, _parse_ms, parse_properties
from common.model import DataVersion

# property names whose new value holds from the next request (see the module docstring)
LIVE_KEYS = frozenset(
    {
        "brokerPermission",
        "autoCreateTopicEnable",
        "autoCreateTopicMax",
        "autoCreateSubscriptionGroup",
        "longPollingEnable",
        "shortPollingTimeMills",
        "slaveReadEnable",
        "offsetCheckInSlave",
        "regionId",
        "traceOn",
        "defaultQueryMaxNum",
    }
)

# files and directories: never written from the network
REFUSED_KEYS = frozenset(
    {
        "storePathRootDir",
        "storePathCommitLog",
        "storePathDLedgerCommitLog",
        "aclFile",
        "chaosAckBeforeStore",
        "brokerConfigPath",
        "configBlackList",
    }
)

# the body of one request is at most this many keys and bytes (a config has fewer than 100)
MAX_KEYS = 500
MAX_BODY = 64 * 1024


class ConfigUpdateError(ValueError):
    """The update is refused as a whole; the message is the remark."""


@attrs.frozen
class UpdatePlan:
    # property name -> its text as it goes to the file
    raw: Mapping[str, str]
    # the running config with the live keys applied
    config: BrokerConfig
    live: tuple[str, ...]
    restart: tuple[str, ...]


def plan_update(current: BrokerConfig, text: str) -> UpdatePlan:
    """What an UPDATE_BROKER_CONFIG body asks for; ConfigUpdateError if any key is refused."""
    props = parse_properties(text)
    if not props:
        raise ConfigUpdateError("the body holds no property (expected key=value lines)")
    if len(props) > MAX_KEYS:
        raise ConfigUpdateError(f"too many properties: {len(props)} > {MAX_KEYS}")
    broker_kw: _FieldValues = {}
    store_kw: _FieldValues = {}
    live: list[str] = []
    restart: list[str] = []
    for name, raw in props.items():
        if name in REFUSED_KEYS:
            raise ConfigUpdateError(
                f"{name} cannot be changed over the network; edit the config file and restart"
            )
        spec = _PROPERTIES.get(name)
        if spec is None:
            raise ConfigUpdateError(f"unknown broker config key {name}")
        target, field, parse = spec
        try:
            value = parse(raw)
        except ValueError as exc:
            raise ConfigUpdateError(f"bad value for {name}: {exc}") from None
        if name not in LIVE_KEYS:
            restart.append(name)
            continue
        live.append(name)
        (store_kw if target == "store" else broker_kw)[field] = value
    config = current
    if store_kw:
        config = attrs.evolve(config, store=attrs.evolve(config.store, **store_kw))
    if broker_kw:
        config = attrs.evolve(config, **broker_kw)
    return UpdatePlan({k: v.strip() for k, v in props.items()}, config, tuple(live), tuple(restart))


def merge_properties(text: str, changes: Mapping[str, str]) -> str:
    """``text`` (a properties file) with each key of ``changes`` set: its last line replaced
    in place, or a line appended; everything else kept as it was."""
    lines = text.splitlines()
    last: dict[str, int] = {}
    for i, line in enumerate(lines):
        stripped = line.strip()
        if not stripped or stripped[0] in "#!":
            continue
        key = next(iter(parse_properties(stripped)), "")
        if key in changes:
            last[key] = i
    for key, value in changes.items():
        if key in last:
            lines[last[key]] = f"{key}={value}"
        else:
            lines.append(f"{key}={value}")
    return "\n".join(lines) + "\n"


def _property_names() -> dict[tuple[str, str], tuple[str, bool]]:
    """(config, field) -> (its property name, whether it counts milliseconds); of two
    spellings of one field the later in the table (the fixed one) wins."""
    out = {}
    for name, (target, field, parse) in _PROPERTIES.items():
        out[(target, field)] = (name, parse is _parse_ms)
    return out


_NAMES = _property_names()


def _text(value: object, ms: bool) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if ms and isinstance(value, int | float):
        return str(round(value * 1000))
    return str(value)


def _camel(field: str) -> str:
    head, *rest = field.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


def config_properties(config: BrokerConfig, live: Mapping[str, str] | None = None) -> str:
    """GET_BROKER_CONFIG's body: every setting as ``key=value`` lines, under the property name
    UPDATE_BROKER_CONFIG and broker.conf take, in that name's unit (milliseconds for the
    ``...Mills``/``...Interval`` keys); settings of ours with no property keep their field
    name in camelCase.  ``live`` overrides values (brokerId and brokerRole follow DLedger)."""
    pairs: dict[str, str] = {}
    for target, obj in (("broker", config), ("store", config.store)):
        for f in attrs.fields(type(obj)):
            value = getattr(obj, f.name)
            if attrs.has(type(value)):
                continue
            name, ms = _NAMES.get((target, f.name), (_camel(f.name), False))
            pairs[name] = _text(value, ms)
    pairs.update(live or {})
    return "".join(f"{k}={v}\n" for k, v in sorted(pairs.items()))


@attrs.define(eq=False)
class Configuration:
    """The DataVersion GET_BROKER_CONFIG reports, and where updates are persisted."""

    path: str
    data_version: DataVersion = attrs.field(factory=DataVersion.now)

    def bump(self) -> None:
        self.data_version = self.data_version.next_version()


__all__ = [
    "LIVE_KEYS",
    "REFUSED_KEYS",
    "ConfigUpdateError",
    "Configuration",
    "UpdatePlan",
    "config_properties",
    "merge_properties",
    "plan_update",
]
