"""RemotingCommand: one request or response of the RocketMQ remoting protocol.

Theory of operation: a command is a plain record (code, opaque, flag, remark, extFields, body); the
codec (``common/remoting/codec.py``) turns it into frames and back. Everything here is on the hot path
of every send and pull, so the class is a slotted attrs class **without validators**; the codec is
the place where untrusted input is checked.

extFields are always ``str -> str`` once decoded: Java clients send strings only, the C++ client
mixes JSON numbers and booleans (``src/protocol/CommandHeader.cpp`` in apache/rocketmq-client-cpp
2.0), and the codec stringifies them. Handlers read them through :meth:`RemotingCommand.get_str` /
``get_int`` / ``get_bool``, which raise :class:`common.errors.BadRequestHeader` (answered as
SYSTEM_ERROR "the custom field <x> is null") for a missing or ill-typed field, like Java's
``decodeCommandCustomHeader``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import attrs

from common.errors import BadRequestHeader
from common.remoting.codes import ResponseCode, SerializeType

RESPONSE_FLAG = 1
ONEWAY_FLAG = 2
CURRENT_VERSION = 407  # MQVersion.V4_9_7 ordinal


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()

_INT_RE = re.compile(r"[+-]?[0-9]+")

# One run of body bytes: a memoryview is how the broker hands over a slice of a mapped file.
BodyPart = bytes | bytearray | memoryview
# A command's body: one part, or (responses only) parts written back to back without joining.
Body = BodyPart | list[BodyPart] | tuple[BodyPart, ...]


def stringify(value: object) -> str:
    """Java ``toString`` of a header value: booleans as ``true``/``false``, everything else str()."""
    if isinstance(value, str):
        return value
    if value is True:
        return "true"
    if value is False:
        return "false"
    return str(value)


def stringify_fields(fields: Mapping[str, object] | None) -> dict[str, str]:
    """Header values as the wire wants them; ``None`` values are left out (fastjson skips nulls)."""
    if not fields:
        return {}
    return {str(k): stringify(v) for k, v in fields.items() if v is not None}


def _body_repr(body: Body) -> str:
    if isinstance(body, list | tuple):
        return f"<{len(body)} parts, {sum(memoryview(p).nbytes for p in body)} bytes>"
    return f"<{memoryview(body).nbytes} bytes>"


@attrs.define(eq=False, slots=True)
class RemotingCommand:
    code: int
    language: str = "JAVA"
    version: int = CURRENT_VERSION
    opaque: int = 0
    flag: int = 0
    remark: str | None = None
    ext_fields: dict[str, str] = attrs.field(factory=dict)
    body: Body = attrs.field(default=b"", repr=_body_repr)
    serialize_type: SerializeType = SerializeType.JSON

    @property
    def is_response(self) -> bool:
        return bool(self.flag & RESPONSE_FLAG)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flag & ONEWAY_FLAG)

    @classmethod
    def request(
        cls,
        code: int,
        ext_fields: Mapping[str, object] | None = None,
        body: Body = b"",
        *,
        oneway: bool = False,
    ) -> RemotingCommand:
        """A request; values are stringified and ``opaque`` is assigned when it is sent."""
        return cls(
            code=int(code),
            ext_fields=stringify_fields(ext_fields),
            body=body,
            flag=ONEWAY_FLAG if oneway else 0,
        )

    def response(
        self,
        code: int = ResponseCode.SUCCESS,
        remark: str | None = None,
        ext_fields: Mapping[str, object] | None = None,
        body: Body = b"",
    ) -> RemotingCommand:
        """The answer to this request: RESPONSE flag, same opaque and serialize type."""
        return RemotingCommand(
            code=int(code),
            opaque=self.opaque,
            flag=RESPONSE_FLAG,
            remark=remark,
            ext_fields=stringify_fields(ext_fields),
            body=body,
            serialize_type=self.serialize_type,
        )

    @property
    def body_length(self) -> int:
        body = self.body
        if isinstance(body, bytes):
            return len(body)
        if isinstance(body, list | tuple):
            return sum(memoryview(p).nbytes for p in body)
        return memoryview(body).nbytes

    def body_bytes(self) -> bytes:
        """The body as one bytes object (joins multi-part bodies; copies memoryviews)."""
        body = self.body
        if isinstance(body, bytes):
            return body
        if isinstance(body, list | tuple):
            return b"".join(body)
        return bytes(body)

    # --- typed header access -------------------------------------------------------------------

    def get_str(self, name: str, default: Any = MISSING) -> str:
        value = self.ext_fields.get(name)
        if value is None:
            if default is MISSING:
                raise BadRequestHeader(name)
            return default
        return value

    def get_int(self, name: str, default: Any = MISSING) -> int:
        """Parse like Java ``Long.parseLong`` (optional sign, ASCII digits only)."""
        value = self.ext_fields.get(name)
        if value is None:
            if default is MISSING:
                raise BadRequestHeader(name)
            return default
        if not _INT_RE.fullmatch(value):
            raise BadRequestHeader(name, value, "integer")
        return int(value)

    def get_bool(self, name: str, default: Any = MISSING) -> bool:
        """``true``/``false`` in any case; ``1``/``0`` too, because the C++ client sends them."""
        value = self.ext_fields.get(name)
        if value is None:
            if default is MISSING:
                raise BadRequestHeader(name)
            return default
        lowered = value.lower()
        if lowered in ("true", "1"):
            return True
        if lowered in ("false", "0", ""):
            return False
        raise BadRequestHeader(name, value, "boolean")
