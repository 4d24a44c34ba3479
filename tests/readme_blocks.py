"""The fenced code blocks of README.md, for the tests that run them (not a test module).

tests/test_readme.py and tests/pipeline/test_readme_spark.py load this file by path (test
modules cannot import each other).
"""

from __future__ import annotations

import re
from pathlib import Path

import attrs

README = Path(__file__).resolve().parents[1] / "README.md"

_FENCE = re.compile(r"^```(\S*)\s*$")


@attrs.frozen
class Block:
    lang: str
    text: str
    line: int  # of the opening fence, 1-based

    def __str__(self) -> str:
        return f"README.md:{self.line} ({self.lang})"


def blocks(path: Path = README) -> list[Block]:
    """Every fenced block in order; an unclosed fence is an error."""
    found: list[Block] = []
    lang: str | None = None
    start = 0
    body: list[str] = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        m = _FENCE.match(line)
        if lang is None:
            if m:
                lang, start, body = m.group(1), n, []
        elif line.strip() == "```":
            found.append(Block(lang, "\n".join(body) + "\n", start))
            lang = None
        else:
            body.append(line)
    if lang is not None:
        raise ValueError(f"README.md:{start}: unclosed code fence")
    return found


def is_spark(block: Block) -> bool:
    return block.lang == "python" and "import pipeline" in block.text
