"""plain_acl.yml parsing and the judgement of one request (RocketMQ 4.9.4's rules)."""

from __future__ import annotations

import pytest

from broker.acl.plain_acl import AclDenied, AclFileError, Perm, judge, parse_perm, parse_plain_acl
from broker.acl.remote_address import compile_rule
from broker.acl.validator import resources_of
from common.remoting.codes import RequestCode
from common.remoting.command import RemotingCommand
from common.session_credentials import SessionCredentials, calculate_signature

ACL = """
globalWhiteRemoteAddresses:
  - 10.10.103.*
accounts:
  - accessKey: RocketMQ
    secretKey: 12345678
    whiteRemoteAddress: 192.168.0.*
    admin: false
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms:
      - topicA=DENY
      - topicB=PUB|SUB
      - topicC=SUB
    groupPerms:
      - groupA=DENY
      - groupB=PUB|SUB
  - accessKey: rocketmq2
    secretKey: 12345678
    admin: true
"""
USER = SessionCredentials("RocketMQ", "12345678")


def send(
    topic: str, creds: SessionCredentials | None = USER, body: bytes = b"hello"
) -> RemotingCommand:
    cmd = RemotingCommand.request(
        RequestCode.SEND_MESSAGE_V2, {"a": "pg", "b": topic, "c": "TBW102", "e": 0}, body
    )
    if creds is not None:
        creds.sign(cmd)
    return cmd


def check(cmd: RemotingCommand, ip: str = "127.0.0.1", text: str = ACL) -> None:
    judge(
        parse_plain_acl(text),
        code=cmd.code,
        ext=cmd.ext_fields,
        body=cmd.body_bytes(),
        peer_ip=ip,
        resources=resources_of(cmd),
    )


def test_a_signed_send_to_a_permitted_topic_is_allowed():
    check(send("topicB"))


def test_the_signature_is_rocketmqs():
    # the extField values in the order of their names (AccessKey included, Signature not),
    # then the body; HMAC-SHA1 under the secret key, base64
    ext = send("topicB").ext_fields
    assert sorted(ext) == ["AccessKey", "Signature", "a", "b", "c", "e"]
    content = b"RocketMQ" + b"pg" + b"topicB" + b"TBW102" + b"0" + b"hello"
    assert ext["Signature"] == calculate_signature("12345678", content)


@pytest.mark.parametrize(
    ("cmd", "message"),
    [
        (send("topicB", SessionCredentials("nobody-at-all", "12345678")), "No acl config for"),
        (send("topicB", SessionCredentials("RocketMQ", "wrong-secret")), "Check signature failed"),
        (send("topicA"), "No default permission for topic:topicA"),
        (send("topicC"), "No default permission for topic:topicC"),  # SUB only
        (send("topicZ"), "No default permission for topic:topicZ"),  # default DENY
        (send("topicB", None), "No accessKey is configured"),
    ],
)
def test_denials_name_their_cause(cmd, message):
    with pytest.raises(AclDenied, match=message):
        check(cmd)


def test_a_tampered_body_fails_the_signature():
    cmd = send("topicB")
    cmd.body = b"HELLO"
    with pytest.raises(AclDenied, match="Check signature failed"):
        check(cmd)


def test_white_addresses():
    unsigned = send("topicA", None)
    check(unsigned, ip="10.10.103.7")  # globally white: nothing else is checked
    with pytest.raises(AclDenied):
        check(unsigned, ip="10.10.104.7")
    forged = send("topicB", SessionCredentials("RocketMQ", "not-the-secret"))
    check(forged, ip="192.168.0.9")  # the account's white address skips the signature
    with pytest.raises(AclDenied, match="Check signature failed"):
        check(forged, ip="192.168.1.9")


def test_groups_admin_and_retry_topics():
    pull = RemotingCommand.request(
        RequestCode.PULL_MESSAGE, {"consumerGroup": "groupA", "topic": "topicB"}
    )
    USER.sign(pull)
    with pytest.raises(AclDenied, match="No default permission for group:groupA"):
        check(pull)
    pull = RemotingCommand.request(
        RequestCode.PULL_MESSAGE, {"consumerGroup": "g", "topic": "topicC"}
    )
    USER.sign(pull)
    check(pull)  # topicC SUB, group by default SUB
    create = RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": "x"})
    USER.sign(create)
    with pytest.raises(AclDenied, match="Need admin permission for request code=17"):
        check(create)
    admin = SessionCredentials("rocketmq2", "12345678")
    admin.sign(create)
    check(create)
    check(send("anything", admin))  # an admin without entries may touch anything
    # a send to a retry topic needs SUB on the group (the consumer's send back)
    assert resources_of(send("%RETRY%groupB")) == [("%RETRY%pg", Perm.SUB)]


def test_pop_codes_need_sub_on_topic_and_group():
    for code in (
        RequestCode.POP_MESSAGE,
        RequestCode.ACK_MESSAGE,
        RequestCode.CHANGE_MESSAGE_INVISIBLETIME,
    ):
        cmd = RemotingCommand.request(code, {"consumerGroup": "cg", "topic": "T"})
        assert resources_of(cmd) == [("T", Perm.SUB), ("%RETRY%cg", Perm.SUB)]


def test_perms_and_addresses_parse_as_rocketmq():
    assert parse_perm("PUB|SUB") == parse_perm(" SUB|PUB ") == Perm.PUB | Perm.SUB
    assert parse_perm(None) == parse_perm("WRITE") == Perm.DENY
    assert compile_rule("192.168.1.1-100")("192.168.1.50")
    assert not compile_rule("192.168.1.1-100")("192.168.1.150")
    assert compile_rule("192.168.1.{1,2,3}")("192.168.1.2")
    assert not compile_rule("192.168.1.{1,2,3}")("192.168.1.4")
    assert compile_rule("*")("8.8.8.8") and not compile_rule("")("8.8.8.8")
    with pytest.raises(ValueError):
        compile_rule("192.168.*.1")


@pytest.mark.parametrize(
    "text",
    [
        "accounts: [{accessKey: short, secretKey: 12345678}]",
        "accounts: [{accessKey: longenough, secretKey: 12345678, topicPerms: [noequals]}]",
        "accounts: [{accessKey: longenough, secretKey: 12345678, whiteRemoteAddress: 1.2.3}]",
        "accounts: {not: a list}",
        "- just\n- a list",
        "accounts: [: bad yaml",
        "",  # empty: an editor caught half-way must not drop every account
    ],
)
def test_bad_files_are_refused_with_a_reason(text):
    with pytest.raises(AclFileError):
        parse_plain_acl(text)
