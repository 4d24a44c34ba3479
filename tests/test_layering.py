"""Dependencies point one way: common <- namesrv, broker, rmq <- cli, pipeline.

DESIGN.md makes this a rule; this test walks every import statement of every package module
(with ast, so nothing is executed) and fails on an arrow that points the wrong way, and on
relative imports (we use absolute imports only).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# package -> the first-party packages it may import
ALLOWED: dict[str, set[str]] = {
    "common": {"common"},
    "namesrv": {"common", "namesrv"},
    "broker": {"common", "broker"},
    "rmq": {"common", "rmq"},
    "cli": {"common", "namesrv", "broker", "rmq", "cli"},
    "pipeline": {"common", "rmq", "broker", "pipeline"},
}
FIRST_PARTY = set(ALLOWED)


def _imports(path: Path) -> list[tuple[int, str | None, int]]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: list[tuple[int, str | None, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name, 0) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            found.append((node.lineno, node.module, node.level))
    return found


def _modules() -> list[Path]:
    return sorted(p for pkg in ALLOWED for p in (ROOT / pkg).rglob("*.py"))


def test_there_are_modules_to_check() -> None:
    # Guards against the walk silently finding nothing (wrong root) and passing vacuously.
    assert any(p.name == "__init__.py" for p in _modules())


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_point_one_way(path: Path) -> None:
    owner = path.relative_to(ROOT).parts[0]
    bad = []
    for lineno, module, level in _imports(path):
        if level:
            bad.append(f"line {lineno}: relative import (use absolute imports)")
            continue
        top = (module or "").split(".")[0]
        if top in FIRST_PARTY and top not in ALLOWED[owner]:
            bad.append(f"line {lineno}: {owner} must not import {module}")
    assert not bad, "\n".join(bad)
