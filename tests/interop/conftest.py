"""Fixtures of the interop tests: the official RocketMQ 5 Python client's venv."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.interop.py5_venv import ensure_py5_python


@pytest.fixture(scope="session")
def py5_python() -> Path:
    """The interpreter of `rocketmq-python-client`'s own venv (built on first use, cached under
    ~/.cache/trio-rmq/). Building it needs pip's index; if it fails the test fails, naming why."""
    return ensure_py5_python()
