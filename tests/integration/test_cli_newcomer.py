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
from tests.integration.test_cli_admin import ok_json, one_error_line, runner

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


@pytest.mark.parametrize(
    "size", [5 * 1024 * 1024, 4 * 1024 * 1024 - 64], ids=["over-4MiB", "record-over-limit"]
)
def test_stdin_produce_reports_what_was_stored_before_a_line_too_long(ns, size):
    topic = f"CliLong{size}"
    lines = "a\nb\n\n" + "x" * size + "\nc\n"
    result = at(ns[0], "produce", "-t", topic, input=lines)
    assert result.exit_code == 1, result.output
    out = result.stdout.splitlines()
    # the two lines before it were stored, and said so
    assert [line.split()[0] for line in out] == ["SEND_OK", "SEND_OK", "sent"], out
    assert out[-1].startswith(f"sent 2 message(s) to {topic}")
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    # the length when the line ended within what was read, else that it is longer
    said = f"{size} bytes, over" if size < 4 * 1024 * 1024 else "longer than"
    assert f"line 4 of stdin is {said} the " in errors[0], errors[0]
    assert "not sent, nor any line after it" in errors[0], errors[0]
    got = ok_json(ns, "consume", "-t", topic, "-g", f"cg-{topic}", "--from-beginning")
    assert sorted(m["body"] for m in got["messages"]) == ["a", "b"]


def test_stdin_produce_sends_a_line_just_under_the_limit(ns):
    from cli.messages.produce import MessageTemplate, max_line_bytes

    limit = max_line_bytes(MessageTemplate("CliLongOk"))
    result = at(ns[0], "produce", "-t", "CliLongOk", input="x" * limit + "\n")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("SEND_OK")


def test_topic_delete_asks_and_says_what_happens_to_the_groups_offsets(ns):
    assert at(ns[0], "produce", "-t", "CliDel", "a", "b").exit_code == 0
    got = ok_json(ns, "consume", "-t", "CliDel", "-g", "cg-del", "--from-beginning")
    assert got["count"] == 2
    assert "cg-del" in at(ns[0], "group", "list").stdout.splitlines()
    # no answer (stdin ends) and "n" both keep the topic; the question names the group
    for answer in (None, "n\n"):
        kept = at(ns[0], "topic", "delete", "CliDel", input=answer)
        assert kept.exit_code == 1, kept.output
        assert "Delete topic CliDel?" in kept.stderr
        assert "the offsets of group(s) cg-del on it are deleted with it" in kept.stderr
        assert kept.stderr.splitlines()[-1] == (
            "error: topic CliDel not deleted (--yes deletes without asking)"
        )
        assert "CliDel" in ok_json(ns, "topic", "list")["topics"]
    gone = at(ns[0], "topic", "delete", "CliDel", input="y\n")
    assert gone.exit_code == 0, gone.output
    assert "deleted the offsets of group(s) cg-del on CliDel" in gone.stdout
    assert "group(s) cg-del have no offsets left" in gone.stdout
    # group list tells the truth: the group is still there, without offsets
    assert "cg-del  (no offsets)" in at(ns[0], "group", "list").stdout.splitlines()
    assert "cg-del" in ok_json(ns, "group", "list")["without_offsets"]


def test_topic_delete_yes_json_names_the_groups(ns):
    assert at(ns[0], "produce", "-t", "CliDelJ", "a").exit_code == 0
    ok_json(ns, "consume", "-t", "CliDelJ", "-g", "cg-delj", "--from-beginning")
    # the group also reads another topic: it keeps offsets there
    assert at(ns[0], "produce", "-t", "CliKeepJ", "a").exit_code == 0
    ok_json(ns, "consume", "-t", "CliKeepJ", "-g", "cg-delj", "--from-beginning")
    doc = ok_json(ns, "topic", "delete", "CliDelJ", "--yes")
    assert doc["offsets_deleted_for_groups"] == ["cg-delj"]
    assert doc["groups_without_offsets"] == []
    listed = ok_json(ns, "group", "list")
    assert "cg-delj" in listed["groups"] and "cg-delj" not in listed["without_offsets"]
