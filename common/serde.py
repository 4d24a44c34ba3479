"""JSON in and out, the way RocketMQ peers write and read it.

Theory of operation: Java RocketMQ writes JSON with fastjson, which by default emits *unquoted*
integer map keys (``{"brokerAddrs":{0:"10.0.0.1:10911"}}``) and accepts single quotes and bare
keys on input. The C++ client writes standard JSON. So:

* :func:`loads` first tries :func:`json.loads` (fast, C-accelerated; nearly every input takes this
  path) and only when that fails falls back to a small tolerant recursive-descent parser that also
  accepts unquoted keys (identifiers or numbers) and single-quoted strings. Unquoted numeric keys
  become strings (``{0:"a"}`` -> ``{"0": "a"}``), as they would be in standard JSON, and the
  converter turns them into ``int`` where the model says so. Trailing garbage is an error.
* :func:`dumps` writes compact strict JSON: map keys are always quoted. Both Java (fastjson) and the
  C++ client (jsoncpp) accept quoted keys, so we never need to write the fastjson flavour.
* :data:`converter` is the one cattrs converter between attrs models (``common/model.py``) and
  JSON-ready values. Models register their special hooks on it when imported.
"""

from __future__ import annotations

import base64
import enum
import json
from collections.abc import Callable
from typing import Any, TypeVar

import attrs
import cattrs
from cattrs.gen import make_dict_unstructure_fn

T = TypeVar("T")

__all__ = ["converter", "dumps", "from_json", "loads", "to_json"]


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-standard JSON constant {name}")


def loads(data: bytes | bytearray | memoryview | str) -> Any:
    """Parse JSON from any RocketMQ peer; raises ValueError on malformed input."""
    if isinstance(data, bytes | bytearray | memoryview):
        try:
            text = bytes(data).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"JSON is not UTF-8: {exc}") from None
    else:
        text = data
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
    except ValueError:
        pass
    try:
        return _TolerantParser(text).parse()
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def _default(obj: Any) -> Any:
    if isinstance(obj, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(obj)).decode("ascii")  # fastjson writes byte[] as base64
    if isinstance(obj, enum.Enum):
        return obj.name
    if isinstance(obj, set | frozenset):
        return sorted(obj)
    if attrs.has(type(obj)):
        return converter.unstructure(obj)
    raise TypeError(f"cannot serialize {type(obj).__name__} to JSON")


def dumps(obj: Any) -> bytes:
    """Compact strict JSON as UTF-8 bytes; int map keys are written quoted (``{"0": ...}``)."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False, default=_default).encode(
        "utf-8"
    )


# --- tolerant parser ---------------------------------------------------------------------------

_WS = " \t\n\r"
_ESCAPES = {
    '"': '"',
    "'": "'",
    "\\": "\\",
    "/": "/",
    "b": "\b",
    "f": "\f",
    "n": "\n",
    "r": "\r",
    "t": "\t",
}
_BARE_KEY_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_$-+.")


class _TolerantParser:
    """fastjson-lenient JSON: bare (incl. numeric) keys and single-quoted strings."""

    def __init__(self, text: str) -> None:
        self.s = text
        self.i = 0

    def fail(self, what: str) -> ValueError:
        return ValueError(f"invalid JSON at char {self.i}: {what}")

    def ws(self) -> None:
        s, i, n = self.s, self.i, len(self.s)
        while i < n and s[i] in _WS:
            i += 1
        self.i = i

    def parse(self) -> Any:
        self.ws()
        value = self.value()
        self.ws()
        if self.i != len(self.s):
            raise self.fail("trailing characters")
        return value

    def value(self) -> Any:
        if self.i >= len(self.s):
            raise self.fail("unexpected end")
        c = self.s[self.i]
        if c == "{":
            return self.obj()
        if c == "[":
            return self.arr()
        if c in "\"'":
            return self.string()
        for word, val in (("true", True), ("false", False), ("null", None)):
            if self.s.startswith(word, self.i):
                self.i += len(word)
                return val
        return self.number()

    def obj(self) -> dict[str, Any]:
        self.i += 1
        out: dict[str, Any] = {}
        self.ws()
        if self.s.startswith("}", self.i):
            self.i += 1
            return out
        while True:
            self.ws()
            key = self.key()
            self.ws()
            if not self.s.startswith(":", self.i):
                raise self.fail("expected ':'")
            self.i += 1
            self.ws()
            out[key] = self.value()
            self.ws()
            if self.s.startswith(",", self.i):
                self.i += 1
                continue
            if self.s.startswith("}", self.i):
                self.i += 1
                return out
            raise self.fail("expected ',' or '}'")

    def key(self) -> str:
        if self.i < len(self.s) and self.s[self.i] in "\"'":
            return self.string()
        start = self.i
        while self.i < len(self.s) and self.s[self.i] in _BARE_KEY_CHARS:
            self.i += 1
        if self.i == start:
            raise self.fail("expected a key")
        return self.s[start : self.i]

    def arr(self) -> list[Any]:
        self.i += 1
        out: list[Any] = []
        self.ws()
        if self.s.startswith("]", self.i):
            self.i += 1
            return out
        while True:
            self.ws()
            out.append(self.value())
            self.ws()
            if self.s.startswith(",", self.i):
                self.i += 1
                continue
            if self.s.startswith("]", self.i):
                self.i += 1
                return out
            raise self.fail("expected ',' or ']'")

    def string(self) -> str:
        s = self.s
        quote = s[self.i]
        self.i += 1
        parts: list[str] = []
        start = self.i
        while True:
            if self.i >= len(s):
                raise self.fail("unterminated string")
            c = s[self.i]
            if c == quote:
                parts.append(s[start : self.i])
                self.i += 1
                return "".join(parts)
            if c == "\\":
                parts.append(s[start : self.i])
                if self.i + 1 >= len(s):
                    raise self.fail("unterminated escape")
                e = s[self.i + 1]
                if e == "u":
                    hex4 = s[self.i + 2 : self.i + 6]
                    if len(hex4) != 4 or any(h not in "0123456789abcdefABCDEF" for h in hex4):
                        raise self.fail("bad \\u escape")
                    cp = int(hex4, 16)
                    self.i += 6
                    low = s[self.i + 2 : self.i + 6]
                    if (
                        0xD800 <= cp <= 0xDBFF
                        and s.startswith("\\u", self.i)
                        and len(low) == 4
                        and all(h in "0123456789abcdefABCDEF" for h in low)
                        and 0xDC00 <= int(low, 16) <= 0xDFFF
                    ):
                        # a UTF-16 surrogate pair, as json.loads joins it
                        cp = 0x10000 + ((cp - 0xD800) << 10) + (int(low, 16) - 0xDC00)
                        self.i += 6
                    parts.append(chr(cp))
                elif e in _ESCAPES:
                    parts.append(_ESCAPES[e])
                    self.i += 2
                else:
                    raise self.fail(f"bad escape \\{e}")
                start = self.i
            else:
                self.i += 1

    def number(self) -> int | float:
        s, start = self.s, self.i
        while self.i < len(s) and s[self.i] in "+-0123456789.eE":
            self.i += 1
        token = s[start : self.i]
        if not token:
            raise self.fail("unexpected character")
        try:
            return json.loads(token)  # exact JSON number grammar
        except ValueError:
            raise self.fail(f"bad number {token!r}") from None


# --- the converter -----------------------------------------------------------------------------

converter = cattrs.Converter()


def _structure_bool(value: Any, _type: Any) -> bool:
    # fastjson and the C++ client send real booleans; string forms appear in headers copied into
    # bodies. bool("false") would be True, so never fall back to bool().
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value != 0
    if isinstance(value, str) and value.lower() in ("true", "1"):
        return True
    if isinstance(value, str) and value.lower() in ("false", "0", ""):
        return False
    raise ValueError(f"not a boolean: {value!r}")


def _structure_int(value: Any, _type: Any) -> int:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        return int(value.strip())  # e.g. the C++ client's "subVersion":"1795313758651"
    if isinstance(value, float) and value.is_integer():
        return int(value)
    raise ValueError(f"not an integer: {value!r}")


def _structure_str(value: Any, _type: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool | int | float):
        return json.dumps(value)
    raise ValueError(f"not a string: {value!r}")


converter.register_structure_hook(bool, _structure_bool)
converter.register_structure_hook(int, _structure_int)
converter.register_structure_hook(str, _structure_str)
converter.register_unstructure_hook(frozenset, lambda v: sorted(v))
converter.register_unstructure_hook(set, lambda v: sorted(v))


def _omit_none_factory(cls: type) -> Callable[[Any], dict[str, Any]]:
    # fastjson never writes null fields; matching that keeps optional fields out of our JSON.
    base: Callable[[Any], dict[str, Any]] = make_dict_unstructure_fn(cls, converter)

    def unstructure(obj: Any) -> dict[str, Any]:
        return {k: v for k, v in base(obj).items() if v is not None}

    return unstructure


converter.register_unstructure_hook_factory(attrs.has, _omit_none_factory)


def to_json(obj: Any) -> bytes:
    return dumps(converter.unstructure(obj))


def from_json(data: bytes | bytearray | memoryview | str, cls: type[T]) -> T:
    """Parse and structure; any malformed input raises ValueError (cattrs errors included)."""
    value = loads(data)
    try:
        return converter.structure(value, cls)
    except (cattrs.BaseValidationError, TypeError, KeyError, AttributeError) as exc:
        raise ValueError(f"invalid {cls.__name__} JSON: {exc}") from exc
