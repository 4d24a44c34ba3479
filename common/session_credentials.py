"""Session credentials and request signatures of RocketMQ's plain ACL (``AclUtils.combineRequestContent``, ``AclSigner``).

A client with session credentials adds ``AccessKey`` to a request's extFields, then signs: the
content is the values of every extField but ``Signature``, in the order of their names
(Java's TreeMap), concatenated as UTF-8, followed by the body; the signature is the base64 of
its HMAC-SHA1 under the secret key, sent as ``Signature``.  Checked against the official C++
client: it signs the same content (``OnsChannel`` included, since it is an extField).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Mapping

import attrs

from common.remoting.command import RemotingCommand, stringify

ACCESS_KEY = "AccessKey"
SIGNATURE = "Signature"
SECURITY_TOKEN = "SecurityToken"
# fields the content leaves out: the signature itself, and the unique-key query flag RocketMQ
# 4.9.4's validator skips (PlainAccessValidator.parse)
_UNSIGNED = frozenset({SIGNATURE, "_UNIQUE_KEY_QUERY"})


def combine_request_content(ext: Mapping[str, object] | None, body: bytes) -> bytes:
    """What is signed: sorted extField values (no Signature) and the body."""
    parts = []
    for key in sorted(ext or ()):
        if key in _UNSIGNED:
            continue
        value = (ext or {})[key]
        if value is not None:
            parts.append(stringify(value))
    return "".join(parts).encode("utf-8") + body


def calculate_signature(secret_key: str, content: bytes) -> str:
    digest = hmac.new(secret_key.encode("utf-8"), content, hashlib.sha1).digest()
    return base64.b64encode(digest).decode("ascii")


@attrs.frozen
class SessionCredentials:
    """An account of the broker's plain ACL; a client holding one signs every request.

    ``sign`` is RocketMQ's ``AclClientRPCHook.doBeforeRequest``: it adds ``AccessKey`` and
    ``Signature`` (and ``SecurityToken`` when given) to the request's extFields."""

    access_key: str
    secret_key: str = attrs.field(repr=False)
    security_token: str | None = attrs.field(default=None, repr=False)

    def sign(self, cmd: RemotingCommand) -> None:
        ext = dict(cmd.ext_fields or {})
        ext.pop(SIGNATURE, None)
        ext[ACCESS_KEY] = self.access_key
        if self.security_token is not None:
            ext[SECURITY_TOKEN] = self.security_token
        body = cmd.body if isinstance(cmd.body, bytes | bytearray | memoryview) else b""
        ext[SIGNATURE] = calculate_signature(
            self.secret_key, combine_request_content(ext, bytes(body))
        )
        cmd.ext_fields = ext
