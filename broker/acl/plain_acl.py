"""plain_acl.yml: RocketMQ 4.x's plain ACL accounts and how a request is judged against them.

Theory of operation
-------------------
The file (``globalWhiteRemoteAddresses``, ``accounts``) is read into a frozen :class:`AclConfig`;
a bad file is a :class:`AclFileError` naming what is wrong, and the caller keeps the config it
had (hot reload never opens the broker up nor locks everybody out because of a typo).

:func:`judge` decides one request, in RocketMQ 4.9.4's order (``PlainPermissionManager.validate``):

1. a peer matching a global white address is allowed, nothing else is checked;
2. the ``AccessKey`` must name an account;
3. a peer matching the account's ``whiteRemoteAddress`` is allowed without signature;
4. the ``Signature`` must be the HMAC-SHA1 of the request (signature.py) under the secret key;
5. admin-only request codes need ``admin: true``;
6. each resource the request touches (``resources_of``) needs its permission: the account's
   entry for it, else ``defaultTopicPerm`` / ``defaultGroupPerm``; DENY beats everything.
   An admin account with no topic or group entries may touch anything.

A refusal is an :class:`AclDenied` with RocketMQ's message; the broker answers it with
NO_PERMISSION (16) and that remark (RocketMQ 4.9 itself answers 1, SYSTEM_ERROR, with the
exception's text; clients treat both as a failed request).
"""

from __future__ import annotations

import enum
import hmac
from collections.abc import Mapping, Sequence

import attrs
import yaml

from broker.acl.remote_address import Matcher, compile_rule
from common.remoting.codes import RequestCode
from common.session_credentials import ACCESS_KEY, SIGNATURE, calculate_signature
from common.session_credentials import combine_request_content as combine
from common.topics import RETRY_GROUP_TOPIC_PREFIX


class Perm(enum.IntFlag):
    """RocketMQ ``Permission`` bits."""

    DENY = 1
    ANY = 2
    PUB = 4
    SUB = 8


_PERMS = {"DENY": Perm.DENY, "PUB": Perm.PUB, "SUB": Perm.SUB}
_PERMS["PUB|SUB"] = _PERMS["SUB|PUB"] = Perm.PUB | Perm.SUB

# request codes only an admin account may send (PlainPermissionManager.ADMIN_CODE)
ADMIN_CODES = frozenset(
    {
        RequestCode.UPDATE_AND_CREATE_TOPIC,
        RequestCode.UPDATE_BROKER_CONFIG,
        RequestCode.DELETE_TOPIC_IN_BROKER,
        RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
        RequestCode.DELETE_SUBSCRIPTIONGROUP,
        # ours: RocketMQ 4.9 lets any signed account change the ACL itself
        RequestCode.UPDATE_AND_CREATE_ACL_CONFIG,
        RequestCode.DELETE_ACL_CONFIG,
        RequestCode.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG,
        RequestCode.GET_BROKER_CLUSTER_ACL_CONFIG,
    }
)


class AclFileError(ValueError):
    """plain_acl.yml cannot be used as it is."""


class AclDenied(Exception):
    """A request the ACL refuses; the message is the remark."""


def parse_perm(text: object) -> Perm:
    """A permission string; anything missing or unknown is DENY, as in RocketMQ."""
    if not isinstance(text, str):
        return Perm.DENY
    return _PERMS.get(text.strip(), Perm.DENY)


@attrs.frozen
class Account:
    access_key: str
    secret_key: str
    white_remote_address: Matcher | None = attrs.field(default=None, eq=False)
    admin: bool = False
    default_topic_perm: Perm = Perm.DENY
    default_group_perm: Perm = Perm.DENY
    # topic name, or %RETRY%<group> for a group -> perm
    resource_perms: Mapping[str, Perm] = attrs.field(factory=dict)

    def perm_for(self, resource: str) -> Perm:
        perm = self.resource_perms.get(resource)
        if perm is not None:
            return perm
        if resource.startswith(RETRY_GROUP_TOPIC_PREFIX):
            return self.default_group_perm
        return self.default_topic_perm


@attrs.frozen
class AclConfig:
    global_white: tuple[Matcher, ...] = ()
    accounts: Mapping[str, Account] = attrs.field(factory=dict)


def _str_list(doc: Mapping[str, object], key: str, where: str) -> list[str]:
    value = doc.get(key) or []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise AclFileError(f"{where}: {key} must be a list of strings")
    return list(value)


def _resource_perms(entries: list[str], *, group: bool, where: str) -> dict[str, Perm]:
    perms = {}
    for entry in entries:
        name, sep, perm = entry.partition("=")
        if not sep or "=" in perm or not name.strip():
            raise AclFileError(f"{where}: Parse resource permission failed for {entry!r}")
        key = name.strip()
        perms[RETRY_GROUP_TOPIC_PREFIX + key if group else key] = parse_perm(perm)
    return perms


def _scalar(value: object) -> object:
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


def _account(doc: object, i: int) -> Account:
    where = f"accounts[{i}]"
    if not isinstance(doc, dict):
        raise AclFileError(f"{where} is not a mapping")
    # YAML reads `secretKey: 12345678` (RocketMQ's own sample) as a number; Java's loader
    # turns it back into the string
    ak, sk = _scalar(doc.get("accessKey")), _scalar(doc.get("secretKey"))
    if not isinstance(ak, str) or not isinstance(sk, str) or len(ak) <= 6 or len(sk) <= 6:
        raise AclFileError(
            f"{where}: The accessKey and secretKey cannot be null and length should longer than 6"
        )
    white = doc.get("whiteRemoteAddress")
    try:
        matcher = compile_rule(white) if isinstance(white, str) and white.strip() else None
    except ValueError as exc:
        raise AclFileError(f"{where}: {exc}") from None
    perms = _resource_perms(_str_list(doc, "topicPerms", where), group=False, where=where)
    perms |= _resource_perms(_str_list(doc, "groupPerms", where), group=True, where=where)
    return Account(
        access_key=ak,
        secret_key=sk,
        white_remote_address=matcher,
        admin=doc.get("admin") is True,
        default_topic_perm=parse_perm(doc.get("defaultTopicPerm")),
        default_group_perm=parse_perm(doc.get("defaultGroupPerm")),
        resource_perms=perms,
    )


def parse_plain_acl(text: str) -> AclConfig:
    """The config a plain_acl.yml text describes; AclFileError if it is not usable."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise AclFileError(f"not YAML: {exc}") from None
    if doc is None:
        # an empty file is refused, as RocketMQ does: caught half-written by an editor, it
        # would otherwise drop every account
        raise AclFileError("the file holds no data")
    if not isinstance(doc, dict):
        raise AclFileError("the top level must be a mapping")
    try:
        white = tuple(compile_rule(r) for r in _str_list(doc, "globalWhiteRemoteAddresses", "top"))
    except ValueError as exc:
        raise AclFileError(str(exc)) from None
    raw_accounts = doc.get("accounts") or []
    if not isinstance(raw_accounts, list):
        raise AclFileError("accounts must be a list")
    accounts: dict[str, Account] = {}
    for i, raw in enumerate(raw_accounts):
        account = _account(raw, i)
        if account.access_key in accounts:
            raise AclFileError(f"accounts[{i}]: accessKey {account.access_key} is listed twice")
        accounts[account.access_key] = account
    return AclConfig(white, accounts)


def judge(
    config: AclConfig,
    *,
    code: int,
    ext: Mapping[str, object] | None,
    body: bytes,
    peer_ip: str,
    resources: Sequence[tuple[str, Perm]],
) -> None:
    """Raise AclDenied unless the request may go on (module docstring for the order)."""
    fields = ext or {}
    ak = fields.get(ACCESS_KEY)
    account = identify(config, None if ak is None else str(ak), peer_ip)
    if account is None:
        return
    expected = calculate_signature(account.secret_key, combine(fields, body))
    if not hmac.compare_digest(str(fields.get(SIGNATURE, "")), expected):
        raise AclDenied(f"Check signature failed for accessKey={ak}")
    if code in ADMIN_CODES and not account.admin:
        raise AclDenied(f"Need admin permission for request code={code}, but accessKey={ak} is not")
    check_resources(account, resources)


def identify(config: AclConfig, access_key: str | None, peer_ip: str) -> Account | None:
    """Steps 1 to 3 of :func:`judge`: the account whose signature is to be checked, or None
    when the peer is white-listed and nothing more is checked. Raises AclDenied."""
    if any(rule(peer_ip) for rule in config.global_white):
        return None
    if access_key is None:
        raise AclDenied("No accessKey is configured")
    account = config.accounts.get(access_key)
    if account is None:
        raise AclDenied(f"No acl config for {access_key}")
    if account.white_remote_address is not None and account.white_remote_address(peer_ip):
        return None
    return account


def check_resources(account: Account, resources: Sequence[tuple[str, Perm]]) -> None:
    """Step 6 of :func:`judge`: raise AclDenied unless ``account`` holds every permission."""
    if not resources or (account.admin and not account.resource_perms):
        return
    for resource, needed in resources:
        owned = account.perm_for(resource)
        if not _permits(needed, owned):
            if resource.startswith(RETRY_GROUP_TOPIC_PREFIX):
                kind, name = "group", resource[len(RETRY_GROUP_TOPIC_PREFIX) :]
            else:
                kind, name = "topic", resource
            raise AclDenied(f"No default permission for {kind}:{name}")


def _permits(needed: Perm, owned: Perm) -> bool:
    """RocketMQ ``Permission.checkPermission``."""
    if owned & Perm.DENY:
        return False
    if needed & Perm.ANY:
        return bool(owned & (Perm.PUB | Perm.SUB))
    return bool(needed & owned)
