"""Edits of plain_acl.yml the ACL admin requests make (RocketMQ ``PlainPermissionManager``'s
``updateAccessConfig``, ``deleteAccessConfig``, ``updateGlobalWhiteAddrsConfig``).

Theory of operation
-------------------
Each edit is a pure function from the file's YAML document (a dict) to the new document, so
it is tested without a broker; :meth:`broker.acl.validator.PlainAccessValidator.rewrite` reads
the file, applies one, checks the result parses as a usable ACL (plain_acl.py) and only then
replaces the file and the config in force.  A refused edit raises :class:`AclEditError` and
leaves the file as it was.

As RocketMQ: an update names an account by accessKey; fields the request leaves out (null
there, None here) keep their value, ``admin`` is always set, and an unknown accessKey adds an
account.  Resource lists arrive comma-separated (``topicA=PUB,topicB=SUB``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs


class AclEditError(ValueError):
    """The edit cannot be made; the message is the remark."""


@attrs.frozen
class AccountUpdate:
    """CreateAccessConfigRequestHeader: None keeps the account's current value."""

    access_key: str
    secret_key: str | None = None
    white_remote_address: str | None = None
    admin: bool = False
    default_topic_perm: str | None = None
    default_group_perm: str | None = None
    topic_perms: Sequence[str] | None = None
    group_perms: Sequence[str] | None = None


def split_list(text: str | None) -> list[str] | None:
    """RocketMQ ``UtilAll.split(text, ",")``: None stays None, blanks are dropped."""
    if text is None:
        return None
    return [part.strip() for part in text.split(",") if part.strip()]


def _accounts(doc: dict[str, object]) -> list[object]:
    accounts = doc.get("accounts")
    if accounts is None:
        accounts = doc["accounts"] = []
    if not isinstance(accounts, list):
        raise AclEditError("accounts in the ACL file is not a list")
    return accounts


def _same_key(account: object, access_key: str) -> bool:
    return isinstance(account, dict) and str(account.get("accessKey")) == access_key


def update_account(doc: Mapping[str, object], update: AccountUpdate) -> dict[str, object]:
    out = dict(doc)
    accounts = list(_accounts(out))
    out["accounts"] = accounts
    index = next((i for i, a in enumerate(accounts) if _same_key(a, update.access_key)), None)
    old = accounts[index] if index is not None else None
    account: dict[str, object] = dict(old) if isinstance(old, dict) else {}
    fields = {
        "accessKey": update.access_key,
        "secretKey": update.secret_key,
        "whiteRemoteAddress": update.white_remote_address,
        "defaultTopicPerm": update.default_topic_perm,
        "defaultGroupPerm": update.default_group_perm,
        "topicPerms": list(update.topic_perms) if update.topic_perms is not None else None,
        "groupPerms": list(update.group_perms) if update.group_perms is not None else None,
    }
    for key, value in fields.items():
        if value is not None:
            account[key] = value
    account["admin"] = update.admin
    if index is None:
        accounts.append(account)
    else:
        accounts[index] = account
    return out


def delete_account(doc: Mapping[str, object], access_key: str) -> dict[str, object]:
    out = dict(doc)
    accounts = _accounts(out)
    kept = [a for a in accounts if not _same_key(a, access_key)]
    if len(kept) == len(accounts):
        raise AclEditError(f"accessKey {access_key} is not in the ACL file")
    out["accounts"] = kept
    return out


def set_global_white(doc: Mapping[str, object], addrs: Sequence[str]) -> dict[str, object]:
    out = dict(doc)
    out["globalWhiteRemoteAddresses"] = list(addrs)
    return out


__all__ = [
    "AccountUpdate",
    "AclEditError",
    "delete_account",
    "set_global_white",
    "split_list",
    "update_account",
]
