"""The ACL file's hot reload: read off the loop thread, and a bad file keeps the accounts in force."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import broker.acl.validator as validator_module
from broker.acl.plain_acl import AclConfig, parse_plain_acl
from broker.acl.validator import PlainAccessValidator

ONE = "accounts: [{accessKey: firstaccount, secretKey: 12345678}]"
TWO = ONE[:-1] + ", {accessKey: secondaccount, secretKey: 12345678}]"


def write(path: Path, text: str, mtime_s: int) -> None:
    """Write ``text`` with a chosen modification time, so each write is seen as a change."""
    path.write_text(text)
    os.utime(path, ns=(mtime_s * 10**9, mtime_s * 10**9))


async def test_reload_parses_in_a_worker_thread_and_keeps_the_accounts_on_a_bad_file(
    tmp_path, monkeypatch
):
    parsed_on: list[threading.Thread] = []

    def parse(text: str) -> AclConfig:
        parsed_on.append(threading.current_thread())
        return parse_plain_acl(text)

    monkeypatch.setattr(validator_module, "parse_plain_acl", parse)
    path = tmp_path / "plain_acl.yml"
    acl = PlainAccessValidator(str(path))
    assert not await acl.reload_if_changed()  # no file yet: nothing to load

    write(path, ONE, 1)
    assert await acl.reload_if_changed()
    assert set(acl.config.accounts) == {"firstaccount"}
    assert parsed_on and threading.main_thread() not in parsed_on
    assert not await acl.reload_if_changed()  # unchanged: not read again
    assert len(parsed_on) == 1

    for i, bad in enumerate(["accounts: [: bad yaml", ""]):
        write(path, bad, 2 + i)
        assert not await acl.reload_if_changed()
        assert set(acl.config.accounts) == {"firstaccount"}
    path.unlink()
    assert not await acl.reload_if_changed()
    assert set(acl.config.accounts) == {"firstaccount"}

    write(path, TWO, 4)
    assert await acl.reload_if_changed()
    assert set(acl.config.accounts) == {"firstaccount", "secondaccount"}
    assert threading.main_thread() not in parsed_on
