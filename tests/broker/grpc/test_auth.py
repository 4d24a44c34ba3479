"""The plain ACL on the gRPC endpoint (broker/grpc/auth.py): the authorization header, the
signature, which resources each request touches, and the codes a refusal answers with."""

from __future__ import annotations

import hashlib
import hmac

import pytest
from google.protobuf.message import Message

from broker.acl.plain_acl import AclDenied, Perm, parse_plain_acl
from broker.grpc.auth import (
    AuthHeaderError,
    Refused,
    authenticate,
    authorize,
    parse_authorization,
    resources_of,
    sign,
)
from common.grpc.v2 import definition_pb2 as pb
from common.grpc.v2 import service_pb2 as spb

pytestmark = pytest.mark.timeout(10)

ACL = parse_plain_acl(
    """
globalWhiteRemoteAddresses:
  - 10.10.103.*
accounts:
  - accessKey: producer-key
    secretKey: producer-secret
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms:
      - Orders=PUB|SUB
      - ReadOnly=SUB
    groupPerms:
      - Banned=DENY
  - accessKey: trusted-key
    secretKey: trusted-secret
    whiteRemoteAddress: 192.168.0.*
"""
)
DATE = "20260129T101530Z"


def header(ak: str, signature: str) -> str:
    # byte for byte what rocketmq-python-client 5.1.2 sends (rocketmq/v5/util/signature.py)
    return f"MQv2-HMAC-SHA1 Credential={ak}, SignedHeaders=x-mq-date-time, Signature={signature}"


def signed(ak: str, sk: str, date: str = DATE) -> dict[str, str]:
    return {"x-mq-date-time": date, "authorization": header(ak, sign(sk, date))}


def res(name: str, namespace: str = "") -> pb.Resource:
    return pb.Resource(name=name, resource_namespace=namespace)


# -- the header and the signature ---------------------------------------------------------


def test_the_signature_is_the_hex_hmac_sha1_of_the_date_time() -> None:
    expected = hmac.new(b"producer-secret", DATE.encode(), hashlib.sha1).hexdigest()
    assert sign("producer-secret", DATE) == expected
    assert len(expected) == 40


def test_the_header_parses_as_rocketmq_reads_it() -> None:
    h = parse_authorization(header("producer-key", "ab01ff"))
    assert h.method == "MQv2-HMAC-SHA1"
    assert h.access_key == "producer-key"
    assert h.signed_headers == ("x-mq-date-time",)
    assert h.signature == bytes.fromhex("ab01ff")
    # the credential may carry a scope after '/': the access key is what precedes it
    scoped = parse_authorization("MQv2-HMAC-SHA1 Credential=ak/2026/region,Signature=00")
    assert scoped.access_key == "ak" and scoped.signature == b"\x00"
    # the client with empty credentials: an empty access key
    assert parse_authorization(header("", "00")).access_key == ""


@pytest.mark.parametrize(
    "bad",
    [
        "MQv2-HMAC-SHA1",  # no items
        "MQv2-HMAC-SHA1 Credential",  # an item without '='
        "MQv2-HMAC-SHA1 Credential=ak, Signature=xyz",  # not hex
    ],
)
def test_a_malformed_header_is_an_error(bad: str) -> None:
    with pytest.raises(AuthHeaderError):
        parse_authorization(bad)


def test_authentication_finds_the_account_and_checks_the_signature() -> None:
    account = authenticate(ACL, signed("producer-key", "producer-secret"), "127.0.0.1:5000")
    assert account is not None and account.access_key == "producer-key"


@pytest.mark.parametrize(
    ("metadata", "message"),
    [
        (
            signed("producer-key", "wrong-secret"),
            "Check signature failed for accessKey=producer-key",
        ),
        (signed("nobody-key", "whatever-secret"), "No acl config for nobody-key"),
        (signed("", ""), "No acl config for "),
        ({"x-mq-date-time": DATE}, "No accessKey is configured"),
        ({"authorization": header("producer-key", "00")}, "Check signature failed"),
        ({"x-mq-date-time": DATE, "authorization": "garbage"}, "incorrect"),
        # the signature is of the date-time header: another date does not verify
        (
            {
                "x-mq-date-time": "20260129T101531Z",
                "authorization": header("producer-key", sign("producer-secret", DATE)),
            },
            "Check signature failed",
        ),
    ],
)
def test_a_failed_authentication_is_unauthorized(metadata: dict[str, str], message: str) -> None:
    with pytest.raises(Refused) as info:
        authenticate(ACL, metadata, "127.0.0.1:5000")
    assert info.value.code == pb.UNAUTHORIZED
    assert message in info.value.message
    assert info.value.status.code == 40100


def test_white_listed_peers_skip_the_signature_and_the_permissions() -> None:
    # globally white-listed: no header at all
    assert authenticate(ACL, {}, "10.10.103.7:1234") is None
    # the account's whiteRemoteAddress: a wrong signature is not looked at
    assert authenticate(ACL, signed("trusted-key", "wrong"), "192.168.0.9:1234") is None
    authorize(None, spb.SendMessageRequest(messages=[pb.Message(topic=res("Anything"))]))


# -- resources and permissions ------------------------------------------------------------

CASES: list[tuple[Message, list[tuple[str, Perm]]]] = [
    (
        spb.SendMessageRequest(messages=[pb.Message(topic=res("T")), pb.Message(topic=res("T"))]),
        [("T", Perm.PUB)],
    ),
    (
        spb.ReceiveMessageRequest(group=res("G"), message_queue=pb.MessageQueue(topic=res("T"))),
        [("%RETRY%G", Perm.SUB), ("T", Perm.SUB)],
    ),
    (
        spb.AckMessageRequest(group=res("G"), topic=res("T")),
        [("%RETRY%G", Perm.SUB), ("T", Perm.SUB)],
    ),
    (
        spb.ChangeInvisibleDurationRequest(group=res("G"), topic=res("T")),
        [("%RETRY%G", Perm.SUB), ("T", Perm.SUB)],
    ),
    (
        spb.ForwardMessageToDeadLetterQueueRequest(group=res("G"), topic=res("T")),
        [("%RETRY%G", Perm.SUB), ("T", Perm.SUB)],
    ),
    (
        spb.QueryAssignmentRequest(group=res("G"), topic=res("T")),
        [("%RETRY%G", Perm.SUB), ("T", Perm.SUB)],
    ),
    (spb.QueryRouteRequest(topic=res("T")), [("T", Perm.ANY)]),
    (spb.EndTransactionRequest(topic=res("T")), [("T", Perm.PUB)]),
    (
        spb.HeartbeatRequest(client_type=pb.SIMPLE_CONSUMER, group=res("G")),
        [("%RETRY%G", Perm.SUB)],
    ),
    (
        spb.HeartbeatRequest(client_type=pb.PUSH_CONSUMER, group=res("G")),
        [("%RETRY%G", Perm.SUB)],
    ),
    # a producer's heartbeat touches nothing (signature only), as in RocketMQ
    (spb.HeartbeatRequest(client_type=pb.PRODUCER), []),
    (spb.NotifyClientTerminationRequest(group=res("G")), [("%RETRY%G", Perm.SUB)]),
    (spb.NotifyClientTerminationRequest(), []),
    (
        spb.TelemetryCommand(
            settings=pb.Settings(publishing=pb.Publishing(topics=[res("A"), res("B")]))
        ),
        [("A", Perm.PUB), ("B", Perm.PUB)],
    ),
    (
        spb.TelemetryCommand(
            settings=pb.Settings(
                subscription=pb.Subscription(
                    group=res("G"), subscriptions=[pb.SubscriptionEntry(topic=res("T"))]
                )
            )
        ),
        [("%RETRY%G", Perm.SUB), ("T", Perm.SUB)],
    ),
    # a telemetry answer (not settings): signature only
    (spb.TelemetryCommand(verify_message_result=spb.VerifyMessageResult(nonce="n")), []),
    # ours (RocketMQ's ACL 1.0 maps none of them): as PULL_MESSAGE / UPDATE_CONSUMER_OFFSET
    (
        spb.PullMessageRequest(group=res("G"), message_queue=pb.MessageQueue(topic=res("T"))),
        [("%RETRY%G", Perm.SUB), ("T", Perm.SUB)],
    ),
    (
        spb.UpdateOffsetRequest(group=res("G"), message_queue=pb.MessageQueue(topic=res("T"))),
        [("%RETRY%G", Perm.SUB), ("T", Perm.SUB)],
    ),
    (
        spb.GetOffsetRequest(group=res("G"), message_queue=pb.MessageQueue(topic=res("T"))),
        [("%RETRY%G", Perm.SUB), ("T", Perm.SUB)],
    ),
    (spb.QueryOffsetRequest(message_queue=pb.MessageQueue(topic=res("T"))), [("T", Perm.ANY)]),
    # namespaces wrap as RocketMQ 5's NamespaceUtil: ns%name
    (
        spb.ReceiveMessageRequest(
            group=res("G", "ns"), message_queue=pb.MessageQueue(topic=res("T", "ns"))
        ),
        [("%RETRY%ns%G", Perm.SUB), ("ns%T", Perm.SUB)],
    ),
]


@pytest.mark.parametrize(("request_", "expected"), CASES)
def test_each_request_maps_to_its_resources(
    request_: Message, expected: list[tuple[str, Perm]]
) -> None:
    assert resources_of(request_) == expected


@pytest.mark.parametrize(
    "bad",
    [
        spb.SendMessageRequest(),
        spb.SendMessageRequest(messages=[pb.Message(topic=res("A")), pb.Message(topic=res("B"))]),
        spb.HeartbeatRequest(client_type=pb.SIMPLE_CONSUMER),
        spb.TelemetryCommand(settings=pb.Settings()),
    ],
)
def test_requests_rocketmq_cannot_judge_are_refused(bad: Message) -> None:
    with pytest.raises(AclDenied):
        resources_of(bad)


def test_a_missing_permission_is_forbidden() -> None:
    account = ACL.accounts["producer-key"]
    authorize(account, spb.SendMessageRequest(messages=[pb.Message(topic=res("Orders"))]))
    authorize(account, spb.QueryRouteRequest(topic=res("ReadOnly")))  # ANY: SUB is enough
    refusals = {
        "no PUB on ReadOnly": (
            spb.SendMessageRequest(messages=[pb.Message(topic=res("ReadOnly"))]),
            "No default permission for topic:ReadOnly",
        ),
        "default DENY": (
            spb.QueryRouteRequest(topic=res("Elsewhere")),
            "No default permission for topic:Elsewhere",
        ),
        "group DENY": (
            spb.ReceiveMessageRequest(
                group=res("Banned"), message_queue=pb.MessageQueue(topic=res("Orders"))
            ),
            "No default permission for group:Banned",
        ),
        "empty send": (spb.SendMessageRequest(), "messageCount is zero"),
    }
    for name, (request, message) in refusals.items():
        with pytest.raises(Refused) as info:
            authorize(account, request)
        assert info.value.code == pb.FORBIDDEN, name
        assert info.value.status.code == 40300, name
        assert message in info.value.message, name
