"""What a newcomer tripped on (issue 24, item 7), through typer's CliRunner against a real
nameserver and broker running in a background thread (the `ns` fixture of test_cli_admin).

Each test names the trap it guards: the command must say what happened in words a new user
understands, in one line where it is an error.
"""

from __future__ import annotations

import pytest
from typer.testing import Result

from cli.main import app
from tests.integration import test_cli_admin
from tests.integration.test_cli_admin import one_error_line, runner

ns = test_cli_admin.ns  # the module's servers: a nameserver and a broker (memory store)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def at(addr: str, *args: str, input: str | None = None) -> Result:
    return runner.invoke(app, ["-n", addr, *args], input=input)


@pytest.mark.parametrize(
    "args",
    [
        ["topic", "list"],
        ["topic", "route", "T"],
        ["cluster"],
        ["group", "list"],
        ["produce", "-t", "T", "x"],
        ["consume", "-t", "T"],
        ["top", "--once", "--interval", "0.1"],
    ],
    ids=" ".join,
)
def test_a_broker_address_given_as_nameserver_is_named_as_such(ns, args):
    result = at(ns[1], *args)
    one_error_line(result, ns[1], "is a broker, not a nameserver")
