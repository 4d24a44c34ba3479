"""Plain ACL on a real broker process: our client and the official C++ client with credentials.

The broker runs with ``aclEnable=true`` and a plain_acl.yml the test writes (and rewrites, to
check the hot reload).  Allowed requests go through; a wrong key, a wrong secret (so a wrong
signature) and a topic the account may not publish to are refused with NO_PERMISSION and
RocketMQ's message; the official C++ client signs the way the broker checks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import trio

import rmq
from common.errors import NoPermissionError
from common.remoting.client import open_remoting_client
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import RemotingCommand

if TYPE_CHECKING:
    from tests.conftest import Node

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

DRIVER = Path(__file__).with_name("cpp_driver.py")
ACL = """
accounts:
  - accessKey: producer-key
    secretKey: producer-secret
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms:
      - AclTopic=PUB|SUB
      - Forbidden=SUB
  - accessKey: consumer-key
    secretKey: consumer-secret
    defaultTopicPerm: SUB
    defaultGroupPerm: SUB
"""
GOOD = rmq.SessionCredentials("producer-key", "producer-secret")


def driver(*args: str, timeout: float = 90) -> list[dict]:
    out = subprocess.run(
        [sys.executable, str(DRIVER), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    events = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert events or out.returncode == 0, out.stderr[-2000:]
    return events


@pytest.fixture
async def acl_cluster(procs, tmp_path):
    acl = tmp_path / "plain_acl.yml"
    acl.write_text(ACL)
    ns = procs.namesrv()
    broker = procs.broker(
        "broker-acl",
        namesrvAddr=ns.addr,
        aclEnable="true",
        aclFile=acl,
        aclFileWatchInterval=200,
    )
    async with open_remoting_client() as client:
        with trio.fail_after(30):
            while True:  # up and registered: the route of TBW102 names it
                assert broker.proc.poll() is None, broker.log_tail()
                try:
                    r = await client.invoke(
                        ns.addr,
                        RemotingCommand.request(
                            RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "TBW102"}
                        ),
                    )
                    if r.code == ResponseCode.SUCCESS:
                        break
                except Exception:
                    client.close_channel(ns.addr)
                await trio.sleep(0.2)
    return ns, broker, acl


async def _send(ns: Node, topic: str, creds: rmq.SessionCredentials | None) -> None:
    async with rmq.Producer("acl-pg", ns.addr, credentials=creds, send_timeout=5) as p:
        await p.send(rmq.Message(topic, b"hello"))


async def test_our_client_is_allowed_and_refused_as_the_file_says(acl_cluster):
    ns, broker, acl = acl_cluster
    await _send(ns, "AclTopic", GOOD)
    refusals = {
        "unknown key": (rmq.SessionCredentials("nobody-key", "x" * 8), "No acl config"),
        "wrong secret": (rmq.SessionCredentials("producer-key", "y" * 8), "signature failed"),
        "no credentials": (None, "No accessKey"),
    }
    for name, (creds, message) in refusals.items():
        with pytest.raises(NoPermissionError) as info:  # code 16
            await _send(ns, "AclTopic", creds)
        assert message in str(info.value), (name, str(info.value))
    with pytest.raises(NoPermissionError, match="No default permission for topic:Forbidden"):
        await _send(ns, "Forbidden", GOOD)

    # hot reload: the file now lets the producer publish to Forbidden too
    acl.write_text(ACL.replace("Forbidden=SUB", "Forbidden=PUB"))
    with trio.fail_after(10):
        while True:
            try:
                await _send(ns, "Forbidden", GOOD)
                break
            except NoPermissionError:
                await trio.sleep(0.2)
    # a file that does not parse keeps the accounts in force
    refused = broker.log.read_text().count("not loaded")
    acl.write_text("accounts: [: not yaml")
    with trio.fail_after(10):  # the broker looked at the new file and refused it
        while broker.log.read_text().count("not loaded") == refused:  # noqa: ASYNC110
            await trio.sleep(0.1)
    await _send(ns, "AclTopic", GOOD)


async def test_the_rmq_cli_signs_with_credentials_from_the_environment(acl_cluster):
    ns, broker, acl = acl_cluster

    def cli(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        args = [sys.executable, "-m", "cli.main", "-n", ns.addr, "produce", "-t", "AclTopic", "x"]
        return subprocess.run(
            args, capture_output=True, text=True, timeout=60, env={**os.environ, **env}
        )

    signed = await trio.to_thread.run_sync(
        cli, {"RMQ_ACCESS_KEY": "producer-key", "RMQ_SECRET_KEY": "producer-secret"}
    )
    assert signed.returncode == 0, signed.stderr
    unsigned = await trio.to_thread.run_sync(cli, {})
    assert unsigned.returncode == 1
    assert "No accessKey is configured" in unsigned.stderr, unsigned.stderr


async def _cpp(command: str, ns: Node, flags: str, *, key: str, secret: str) -> list[dict]:
    """The C++ driver's events for ``command`` on AclTopic with ``flags`` (split at spaces),
    signed as account ``key``."""
    argv = [command, "--namesrv", ns.addr, "--topic", "AclTopic", *flags.split()]
    argv += ["--access-key", key, "--secret-key", secret]
    return await trio.to_thread.run_sync(lambda: driver(*argv))


async def test_the_cpp_client_signs_as_the_broker_checks(acl_cluster):
    ns, broker, acl = acl_cluster
    ok = await _cpp("produce", ns, "--count 20", key="producer-key", secret="producer-secret")
    sent = [e for e in ok if e.get("event") == "sent"]
    assert len(sent) == 20 and all(e["status"] == 0 for e in sent), ok[-3:]

    flags = "--count 1 --send-timeout-ms 3000"
    bad = await _cpp("produce", ns, flags, key="producer-key", secret="not-the-secret")
    assert not [e for e in bad if e.get("event") == "sent"], bad
    # the client reports a generic send failure; the broker says why it refused
    assert "Check signature failed for accessKey=producer-key" in broker.log.read_text()

    flags = "--group acl-cg --expect 20 --timeout 60"
    got = await _cpp("consume", ns, flags, key="consumer-key", secret="consumer-secret")
    bodies = {e["body"] for e in got if e.get("event") == "recv"}
    assert len(bodies) == 20, got[-3:]
