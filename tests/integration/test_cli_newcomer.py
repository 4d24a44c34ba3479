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


@pytest.mark.parametrize("how", ["args", "stdin", "json"])
def test_a_send_that_auto_creates_the_topic_says_so_once(ns, how):
    topic = f"CliAuto{how.capitalize()}"
    if how == "stdin":
        first = at(ns[0], "produce", "-t", topic, input="".join(f"m{i}\n" for i in range(600)))
    else:
        extra = ["--json"] if how == "json" else []
        first = at(ns[0], "produce", "-t", topic, "a", "b", "c", *extra)
    assert first.exit_code == 0, first.output
    notes = [line for line in first.stderr.splitlines() if "did not exist" in line]
    assert len(notes) == 1, first.stderr
    assert f"note: topic {topic} did not exist; the broker created it" in notes[0]
    assert "4 queue(s) on broker-a" in notes[0]
    # the topic exists now: no note the second time
    again = at(ns[0], "produce", "-t", topic, "d")
    assert again.exit_code == 0 and "did not exist" not in again.stderr, again.stderr


@pytest.mark.parametrize("follow", [False, True], ids=["caught-up", "follow"])
def test_a_new_group_that_reads_nothing_says_it_starts_at_the_end(ns, follow):
    topic = f"CliNewGroup{int(follow)}"
    assert at(ns[0], "produce", "-t", topic, "one", "two", "three").exit_code == 0
    extra = ["-f", "--idle-timeout", "0.3"] if follow else []
    first = at(ns[0], "consume", "-t", topic, "-g", f"cg-new-{int(follow)}", *extra)
    assert first.exit_code == 0, first.output
    assert first.stdout == ""
    assert first.stderr.splitlines() == [
        f"note: group cg-new-{int(follow)} is new on {topic} and starts at the end; "
        "--from-beginning reads the 3 stored message(s)"
    ]
    # once: the group has offsets now
    again = at(ns[0], "consume", "-t", topic, "-g", f"cg-new-{int(follow)}", *extra)
    assert again.exit_code == 0 and again.stderr == "", again.stderr
    # a new group that starts at the beginning has nothing to be told
    whole = at(ns[0], "consume", "-t", topic, "-g", f"cg-whole-{int(follow)}", "--from-beginning")
    assert whole.exit_code == 0 and whole.stderr == "" and len(whole.stdout.splitlines()) == 3
