"""The separator line `rmq up` writes into a node's log at each start (cli/local/up.py): the
child's own first write, naming the pid the node keeps, before anything the node prints."""

from __future__ import annotations

import subprocess
import sys

import pytest

from cli.local.up import with_separator
from tests.integration.test_local_status_truth import SEPARATOR

pytestmark = pytest.mark.timeout(30)

# a node that prints the moment it runs, and its pid
EAGER = "import os; print('first words', os.getpid(), flush=True)"


@pytest.mark.parametrize("restarts", [0, 2])
def test_the_separator_comes_first_and_names_the_pid_the_node_keeps(restarts: int) -> None:
    command = with_separator([sys.executable, "-c", EAGER], "broker-a-s1", restarts)
    out = subprocess.run(command, capture_output=True, text=True, check=True, timeout=20)
    first, second = out.stdout.splitlines()
    m = SEPARATOR.match(first)
    assert m and m["node"] == "broker-a-s1", first
    assert (m["again"] or "") == (f" (restart {restarts})" if restarts else "")
    assert second == f"first words {m['pid']}"


def test_arguments_reach_the_node_unchanged() -> None:
    tricky = ["a b", "$HOME", "'\"", "%s\\n", ""]
    command = with_separator(
        [sys.executable, "-c", "import sys; print(sys.argv[1:])", *tricky], "n", 0
    )
    out = subprocess.run(command, capture_output=True, text=True, check=True, timeout=20)
    assert out.stdout.splitlines()[1] == repr(tricky)
