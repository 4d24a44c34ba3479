"""The broker's ACL guard: which resources a request touches, and the file it is judged by.

``resources_of`` follows RocketMQ 4.9.4's ``PlainAccessValidator.parse`` request by request (a
retry topic ``%RETRY%<group>`` stands for the group); the batch send is checked like a single
send, which RocketMQ 4.9.4 forgets to do.  Requests of other codes touch no resource: they are
checked for account and signature only (and admin rights, plain_acl.py).

:class:`PlainAccessValidator` holds the current config; ``guard`` is the dispatcher's guard
(common/remoting/server.py) and answers a refusal with NO_PERMISSION.  ``run_acl_watch`` reloads
the file when its modification time or size changes (RocketMQ polls every 5 s), reading and
parsing it in a worker thread; a file that does not parse is logged and the config in force
stays.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path

import attrs
import trio
import yaml

from broker.acl.permission_manager import AclEditError
from broker.acl.plain_acl import AclConfig, AclDenied, AclFileError, Perm, judge, parse_plain_acl
from broker.acl.remote_address import peer_ip
from common.config_file import atomic_write
from common.errors import RequestError
from common.model import DataVersion, HeartbeatData
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import RemotingCommand
from common.remoting.server import Channel
from common.serde import from_json
from common.topics import RETRY_GROUP_TOPIC_PREFIX as RETRY

log = logging.getLogger(__name__)

Resources = list[tuple[str, Perm]]


def _send(topic: object, group: object) -> Resources:
    if not isinstance(topic, str):
        return []
    if topic.startswith(RETRY):
        return [(RETRY + str(group), Perm.SUB)] if group is not None else []
    return [(topic, Perm.PUB)]


def resources_of(cmd: RemotingCommand) -> Resources:
    """(resource, permission needed) for each resource ``cmd`` touches."""
    ext = cmd.ext_fields or {}
    code = cmd.code

    def group(key: str) -> Resources:
        value = ext.get(key)
        return [] if value is None else [(RETRY + str(value), Perm.SUB)]

    def topic(key: str = "topic") -> Resources:
        value = ext.get(key)
        return [] if value is None else [(str(value), Perm.SUB)]

    if code == RequestCode.SEND_MESSAGE:
        return _send(ext.get("topic"), ext.get("producerGroup"))
    if code in (RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE):
        if "b" in ext:
            return _send(ext.get("b"), ext.get("a"))
        return _send(ext.get("topic"), ext.get("producerGroup"))
    if code == RequestCode.CONSUMER_SEND_MSG_BACK:
        return group("group")
    if code in (
        RequestCode.PULL_MESSAGE,
        # RocketMQ 5 (PlainAccessResource): pop, ack and change invisible time as a pull
        RequestCode.POP_MESSAGE,
        RequestCode.ACK_MESSAGE,
        RequestCode.CHANGE_MESSAGE_INVISIBLETIME,
    ):
        return topic() + group("consumerGroup")
    if code == RequestCode.QUERY_MESSAGE:
        return topic()
    if code in (RequestCode.UNREGISTER_CLIENT, RequestCode.GET_CONSUMER_LIST_BY_GROUP):
        return group("consumerGroup")
    if code == RequestCode.UPDATE_CONSUMER_OFFSET:
        return group("consumerGroup") + topic()
    if code == RequestCode.HEART_BEAT:
        try:
            heartbeat = from_json(cmd.body_bytes(), HeartbeatData)
        except ValueError as exc:
            raise AclDenied(f"heartbeat body: {exc}") from None
        out: Resources = []
        for consumer in heartbeat.consumerDataSet:
            out.append((RETRY + consumer.groupName, Perm.SUB))
            out.extend((sub.topic, Perm.SUB) for sub in consumer.subscriptionDataSet)
        return out
    return []


@attrs.define(eq=False)
class PlainAccessValidator:
    path: str
    config: AclConfig = attrs.field(factory=AclConfig)
    # (mtime_ns, size) of the file the config came from; None: not read yet or missing
    _seen: tuple[int, int] | None = None
    denied: int = 0
    # bumped whenever a new config comes in force (GET_BROKER_CLUSTER_ACL_INFO's version)
    data_version: DataVersion = attrs.field(factory=DataVersion.now)
    # the YAML document the config in force was read from (GET_BROKER_CLUSTER_ACL_CONFIG)
    document: dict[str, object] = attrs.field(factory=dict)
    # one ACL admin request rewrites the file at a time
    _rewrite_lock: trio.Lock = attrs.field(factory=trio.Lock)

    def guard(self, cmd: RemotingCommand, channel: Channel) -> None:
        """Raise RequestError(NO_PERMISSION) unless the ACL lets ``cmd`` through."""
        try:
            judge(
                self.config,
                code=cmd.code,
                ext=cmd.ext_fields,
                body=cmd.body_bytes(),
                peer_ip=peer_ip(channel.remote_addr),
                resources=resources_of(cmd),
            )
        except AclDenied as exc:
            self.denied += 1
            if self.denied % 1000 == 1:
                log.warning("ACL refused code %d from %s: %s", cmd.code, channel.remote_addr, exc)
            raise RequestError(ResponseCode.NO_PERMISSION, str(exc)) from None

    async def reload_if_changed(self) -> bool:
        """Read the file again if it changed; True when a new config is in force.

        The stat, read and parse run in a worker thread (a slow disk must not stall the
        requests this loop serves); what they found is applied here, on the loop thread.
        """
        read = await trio.to_thread.run_sync(_read_if_changed, self.path, self._seen)
        if read is None:
            return False
        if read.seen is None:
            if self._seen is not None:
                log.error("ACL file %s is gone; the accounts read before stay", self.path)
                self._seen = None
            return False
        self._seen = read.seen
        if read.config is None or read.document is None:
            log.error(
                "ACL file %s not loaded, the accounts read before stay: %s", self.path, read.error
            )
            return False
        self.config = read.config
        self.document = read.document
        self.data_version = self.data_version.next_version()
        log.info("ACL file %s loaded: %d accounts", self.path, len(read.config.accounts))
        return True

    async def rewrite(self, edit: Edit) -> None:
        """Apply ``edit`` to the file and put the result in force (ACL admin requests);
        AclEditError, file and config unchanged, when it is refused."""
        async with self._rewrite_lock:
            read = await trio.to_thread.run_sync(_rewrite_file, self.path, edit)
            assert read.config is not None and read.document is not None
            self._seen = read.seen
            self.config = read.config
            self.document = read.document
            self.data_version = self.data_version.next_version()
            log.info("ACL file %s rewritten: %d accounts", self.path, len(read.config.accounts))


@attrs.frozen
class _FileRead:
    """What one look at the ACL file found."""

    # (mtime_ns, size) of the file; None: the file is missing
    seen: tuple[int, int] | None
    # the parsed file; None when missing or unusable (then ``error`` says why)
    config: AclConfig | None = None
    error: str = ""
    document: dict[str, object] | None = None


def _read_if_changed(path: str, seen: tuple[int, int] | None) -> _FileRead | None:
    """Stat, read and parse ``path`` unless it still matches ``seen`` (then None).

    Blocking: runs in a worker thread, and touches nothing but the file.
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return _FileRead(None)
    now = (st.st_mtime_ns, st.st_size)
    if now == seen:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        config = parse_plain_acl(text)
        doc = yaml.safe_load(text)  # parse_plain_acl proved it is a mapping
        return _FileRead(now, config, document=doc)
    except (OSError, UnicodeDecodeError, AclFileError) as exc:
        return _FileRead(now, error=str(exc))


Edit = Callable[[dict[str, object]], dict[str, object]]


def _rewrite_file(path: str, edit: Edit) -> _FileRead:
    """Read, edit, check and replace the file (blocking: a worker thread runs it).

    AclEditError when the edit is refused or its result would not load; the file is kept."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = yaml.safe_load(f.read())
    except FileNotFoundError:
        doc = None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise AclEditError(f"cannot read the ACL file {path}: {exc}") from None
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise AclEditError(f"the ACL file {path} is not a mapping")
    new = edit(doc)
    text = yaml.safe_dump(new, sort_keys=False, allow_unicode=True)
    try:
        config = parse_plain_acl(text)
    except AclFileError as exc:
        raise AclEditError(str(exc)) from None
    try:
        atomic_write(Path(path), text.encode("utf-8"))
        st = os.stat(path)
    except OSError as exc:
        raise AclEditError(f"cannot write the ACL file {path}: {exc}") from None
    return _FileRead((st.st_mtime_ns, st.st_size), config, document=new)


async def run_acl_watch(
    validator: PlainAccessValidator,
    interval: float = 5.0,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Load the file now, then reload it whenever it changes, until cancelled."""
    await validator.reload_if_changed()
    task_status.started()
    while True:
        await trio.sleep(interval)
        await validator.reload_if_changed()
