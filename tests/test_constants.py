"""One source of truth for every RocketMQ constant: a second definition fails here.

Copies drift: the broker, `rmq top` and `rmq group list` once each had their own list of system
groups, and no two agreed. Each name below has one home; this test reads every first-party
module (with ast, nothing executed) and fails when another module defines the name at module
level (an assignment, a class, an enum, a function), when a home no longer defines it, or when
a module spells one of the homes' string values under another name (`TOOLS_CONSUMER =
"TOOLS_CONSUMER"` is the same constant as `TOOLS_CONSUMER_GROUP`). Importing a name is how
everyone else gets it.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("common", "namesrv", "broker", "rmq", "cli", "pipeline")

HOMES: dict[str, frozenset[str]] = {
    # TopicValidator's and MixAll's topic names
    "common.topics": frozenset(
        {
            "AUTO_CREATE_TOPIC_KEY_TOPIC",
            "SCHEDULE_TOPIC",
            "BENCHMARK_TOPIC",
            "RMQ_SYS_TRANS_HALF_TOPIC",
            "RMQ_SYS_TRANS_OP_HALF_TOPIC",
            "TRANS_CHECK_MAX_TIME_TOPIC",
            "RMQ_SYS_TRACE_TOPIC",
            "SELF_TEST_TOPIC",
            "OFFSET_MOVED_EVENT",
            "SYSTEM_TOPIC_PREFIX",
            "RETRY_GROUP_TOPIC_PREFIX",
            "DLQ_GROUP_TOPIC_PREFIX",
            "REPLY_TOPIC_POSTFIX",
            "SYSTEM_TOPICS",
            "retry_topic",
            "dlq_topic",
            "is_system_topic",
        }
    ),
    # MixAll's group names and the master's broker id
    "common.mixall": frozenset(
        {
            "MASTER_ID",
            "TOOLS_CONSUMER_GROUP",
            "FILTERSRV_CONSUMER_GROUP",
            "MONITOR_CONSUMER_GROUP",
            "SELF_TEST_CONSUMER_GROUP",
            "ONS_HTTP_PROXY_GROUP",
            "CID_ONSAPI_PULL_GROUP",
            "CID_ONSAPI_PERMISSION_GROUP",
            "CID_ONSAPI_OWNER_GROUP",
            "CID_SYS_RMQ_TRANS",
            "CID_RMQ_SYS_PREFIX",
            "SYSTEM_GROUPS",
            "is_system_group",
        }
    ),
    # the wire enums and flag sets
    "common.model": frozenset(
        {
            "MessageModel",
            "ConsumeFromWhere",
            "ConsumeType",
            "PermName",
            "TopicSysFlag",
        }
    ),
    # the consume-queue filter the store applies and the long-poll service waits with
    "broker.store.results": frozenset({"MessageFilter"}),
}

# RocketMQ's other spellings of a constant that has a home above: defined nowhere.
ALIASES: dict[str, str] = {
    "DEFAULT_TOPIC": "AUTO_CREATE_TOPIC_KEY_TOPIC",
    "AUTO_CREATE_TOPIC": "AUTO_CREATE_TOPIC_KEY_TOPIC",
    "RMQ_SYS_SCHEDULE_TOPIC": "SCHEDULE_TOPIC",
    "RMQ_SYS_BENCHMARK_TOPIC": "BENCHMARK_TOPIC",
    "RMQ_SYS_SELF_TEST_TOPIC": "SELF_TEST_TOPIC",
    "RMQ_SYS_OFFSET_MOVED_EVENT": "OFFSET_MOVED_EVENT",
    "RMQ_SYS_TRANS_CHECK_MAX_TIME_TOPIC": "TRANS_CHECK_MAX_TIME_TOPIC",
    "TOOLS_CONSUMER": "TOOLS_CONSUMER_GROUP",
    "PERM_PRIORITY": "PermName.PRIORITY",
    "PERM_READ": "PermName.READ",
    "PERM_WRITE": "PermName.WRITE",
    "PERM_INHERIT": "PermName.INHERIT",
}

# Second definitions that other work removes; the lead empties this set. Each entry is
# (name, module). An entry that is no longer true fails too, so the set only shrinks.
_PENDING: set[tuple[str, str]] = set()


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _definitions(tree: ast.Module) -> Iterator[tuple[str, ast.AST | None]]:
    """Names bound at module level (also inside module-level if/try blocks), with the node
    whose value they get (None for a class or function)."""
    stack: list[ast.stmt] = list(tree.body)
    while stack:
        node = stack.pop(0)
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            yield node.name, node
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        yield name.id, node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            yield node.target.id, node.value
        elif isinstance(node, ast.If | ast.Try | ast.With):
            for field in ("body", "orelse", "finalbody", "handlers"):
                for child in getattr(node, field, []):
                    stack.extend(child.body if isinstance(child, ast.ExceptHandler) else [child])


# Parsed once per run (the product's sources do not change while the suite runs): ten tests
# read it, and parsing every module took seconds each time. Callers copy, never mutate, it.
@functools.cache
def _scan() -> dict[str, list[tuple[str, ast.AST | None]]]:
    return {
        module: list(_definitions(ast.parse(path.read_text(encoding="utf-8"))))
        for module, path in _modules().items()
    }


def _problems(scan: dict[str, list[tuple[str, ast.AST | None]]]) -> set[tuple[str, str, str]]:
    """(name, module, why) for every definition that should not be there."""
    home_of = {name: home for home, names in HOMES.items() for name in names}
    home_values: dict[str, str] = {}  # a home's string constant value -> its name
    for home, names in HOMES.items():
        for name, value in scan.get(home, []):
            if name in names and isinstance(value, ast.Constant) and isinstance(value.value, str):
                home_values[value.value] = name
    found: set[tuple[str, str, str]] = set()
    for module, definitions in scan.items():
        for name, value in definitions:
            if name in home_of and module != home_of[name]:
                found.add((name, module, f"a second {name}; import it from {home_of[name]}"))
            elif name in ALIASES:
                found.add((name, module, f"RocketMQ's other name for {ALIASES[name]}"))
            elif (
                module not in HOMES
                and isinstance(value, ast.Constant)
                and isinstance(value.value, str)
                and value.value in home_values
            ):
                same = home_values[value.value]
                found.add((name, module, f"the value of {same}; import that instead"))
    return found


def test_every_home_defines_its_names() -> None:
    scan = _scan()
    for home, names in HOMES.items():
        missing = names - {name for name, _ in scan[home]}
        assert not missing, f"{home} no longer defines {sorted(missing)}: update HOMES"


def test_no_second_definition() -> None:
    found = _problems(_scan())
    bad = sorted(p for p in found if (p[0], p[1]) not in _PENDING)
    assert not bad, "\n".join(f"{module}: {name} is {why}" for name, module, why in bad)


def test_pending_exceptions_are_still_needed() -> None:
    # Once the store imports SCHEDULE_TOPIC (say), its entry must go: the set only shrinks.
    found = {(name, module) for name, module, _ in _problems(_scan())}
    stale = sorted(_PENDING - found)
    assert not stale, f"remove from _PENDING, these copies are gone: {stale}"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("SYSTEM_GROUPS = ('TOOLS_CONSUMER',)", {("SYSTEM_GROUPS", "x.y")}),
        ("class MessageModel: pass", {("MessageModel", "x.y")}),
        ("import enum\nConsumeFromWhere = enum.Enum('C', 'A B')", {("ConsumeFromWhere", "x.y")}),
        ("if True:\n    MASTER_ID: int = 0", {("MASTER_ID", "x.y")}),
        ("PERM_READ = 4", {("PERM_READ", "x.y")}),
        ("GROUP = 'TOOLS_CONSUMER'", {("GROUP", "x.y")}),
        ("from common.mixall import MASTER_ID\ndef f():\n    MASTER_ID = 1", set()),
    ],
)
def test_the_scan_finds_second_definitions(source: str, expected: set[tuple[str, str]]) -> None:
    # The check must be able to fail: a made-up module next to the real homes.
    scan = {**_scan(), "x.y": list(_definitions(ast.parse(source)))}
    assert {(name, module) for name, module, _ in _problems(scan) if module == "x.y"} == expected
