"""Kafka message schemas, declared once, and the one codec that reads and writes them.

Kafka declares each request and response as a JSON schema whose fields carry version
ranges; its generator derives the codecs. This module does the same in Python: a
message is a tuple of :class:`Field` (name, type, the versions that carry it), and
:func:`decode` / :func:`encode` walk that declaration for the version on the wire, so a
field is written down in exactly one place and both directions agree by construction.

Types (``docs/design/protocol.md`` of Kafka, KIP-482 for the flexible forms):

- ``INT8`` … ``INT64``, ``BOOL`` big-endian; ``UINT32`` unsigned; ``UUID`` 16 raw
  bytes (a topic id; all zero = none).
- ``STRING`` int16 length + UTF-8; ``NULLABLE_STRING`` -1 = None; ``BYTES`` int32
  length; ``NULLABLE_BYTES`` -1 = None (record sets are nullable bytes).
- ``Array(fields...)`` int32 count (-1 = None when ``nullable``), of structs;
  ``Array(INT32)`` of a scalar.
- ``Struct(fields...)`` one struct inline; a nullable one after an int8 (-1 = None).
- In a *flexible* version (``flexible_from`` of the message) strings, bytes and arrays
  use unsigned-varint lengths + 1 (0 = null) and every struct ends with tagged fields
  (read and skipped; written empty).

Decoding is bounded by the frame: every length is checked against the bytes left, so a
hostile length costs an error, not memory.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ledgerd.base.errors import LedgerdError

__all__ = [
    "BOOL", "BYTES", "INT8", "INT16", "INT32", "INT64", "NULLABLE_BYTES", "NULLABLE_STRING",
    "STRING", "UINT32", "UUID", "ZERO_UUID", "Array", "Field", "KafkaDecodeError", "Message",
    "Reader", "Struct", "decode", "encode", "struct_of", "uvarint",
]


class KafkaDecodeError(LedgerdError, ValueError):
    """The peer sent bytes that do not parse as the declared message (close or answer
    INVALID_REQUEST / CORRUPT_MESSAGE; never a bug of ours)."""


@dataclass(frozen=True, slots=True)
class Scalar:
    name: str
    fmt: str  # struct format, or "" for the variable-length kinds

    def __repr__(self) -> str:
        return self.name


INT8 = Scalar("int8", ">b")
INT16 = Scalar("int16", ">h")
INT32 = Scalar("int32", ">i")
INT64 = Scalar("int64", ">q")
UINT32 = Scalar("uint32", ">I")
BOOL = Scalar("bool", ">?")
UUID = Scalar("uuid", ">16s")
STRING = Scalar("string", "")
NULLABLE_STRING = Scalar("nullable_string", "")
BYTES = Scalar("bytes", "")
NULLABLE_BYTES = Scalar("nullable_bytes", "")

_STRUCTS = {s.name: struct.Struct(s.fmt)
            for s in (INT8, INT16, INT32, INT64, UINT32, BOOL, UUID)}
ZERO_UUID = bytes(16)


@dataclass(frozen=True, slots=True)
class Array:
    """An array of structs (``fields``) or of one scalar (``of``)."""

    fields: tuple[Field, ...] = ()
    of: Scalar | None = None
    nullable: bool = False

    @classmethod
    def of_scalar(cls, scalar: Scalar, nullable: bool = False) -> Array:
        return cls((), scalar, nullable)


def array(*fields: Field, nullable: bool = False) -> Array:
    return Array(tuple(fields), None, nullable)


@dataclass(frozen=True, slots=True)
class Struct:
    """One struct inline (Kafka's struct-typed field: its fields, then in a flexible
    version its tags). A nullable one is preceded by an int8: -1 null, 1 present."""

    fields: tuple[Field, ...]
    nullable: bool = False


def struct_of(*fields: Field, nullable: bool = False) -> Struct:
    return Struct(tuple(fields), nullable)


@dataclass(frozen=True, slots=True)
class Field:
    name: str
    kind: Scalar | Array | Struct
    since: int = 0
    until: int = 1 << 30  # last version that carries the field
    default: Any = None  # value when decoding a version without it / encoding a missing key

    def present(self, version: int) -> bool:
        return self.since <= version <= self.until


@dataclass(frozen=True, slots=True)
class Message:
    """A request or response body: its fields and the first flexible version."""

    fields: tuple[Field, ...]
    flexible_from: int = 1 << 30

    def is_flexible(self, version: int) -> bool:
        return version >= self.flexible_from


def uvarint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


class Reader:
    """Reads a frame's body front to back; every overrun is a KafkaDecodeError."""

    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes | memoryview, pos: int = 0) -> None:
        self.buf = memoryview(buf)
        self.pos = pos

    @property
    def remaining(self) -> int:
        return len(self.buf) - self.pos

    def take(self, n: int, what: str) -> memoryview:
        if n < 0 or n > self.remaining:
            raise KafkaDecodeError(f"{what}: needs {n} bytes, {self.remaining} left")
        view = self.buf[self.pos:self.pos + n]
        self.pos += n
        return view

    def scalar(self, kind: Scalar, what: str) -> Any:
        s = _STRUCTS[kind.name]
        return s.unpack(self.take(s.size, what))[0]

    def uvarint(self, what: str) -> int:
        value = shift = 0
        while True:
            byte = self.take(1, what)[0]
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7
            if shift > 63:
                raise KafkaDecodeError(f"{what}: varint longer than 10 bytes")

    def length(self, flexible: bool, wide: bool, what: str) -> int:
        """A length prefix: -1 means null."""
        if flexible:
            return self.uvarint(what) - 1
        return int(self.scalar(INT32 if wide else INT16, what))

    def skip_tags(self, what: str) -> None:
        for _ in range(self.uvarint(what)):
            self.uvarint(what)
            self.take(self.uvarint(what), what)


def _read(kind: Scalar | Array | Struct, r: Reader, version: int, flexible: bool,
          what: str) -> Any:
    if isinstance(kind, Struct):
        if kind.nullable:
            flag = r.scalar(INT8, what)
            if flag < 0:
                return None
        return _read_struct(kind.fields, r, version, flexible, what)
    if isinstance(kind, Array):
        n = r.length(flexible, True, what)
        if n < 0:
            if not kind.nullable:
                raise KafkaDecodeError(f"{what}: null array where one is required")
            return None
        if n > r.remaining:  # every element takes at least one byte
            raise KafkaDecodeError(f"{what}: {n} elements in {r.remaining} bytes")
        if kind.of is not None:
            return [_read(kind.of, r, version, flexible, what) for _ in range(n)]
        return [_read_struct(kind.fields, r, version, flexible, what) for _ in range(n)]
    if kind.fmt:
        return r.scalar(kind, what)
    wide = kind in (BYTES, NULLABLE_BYTES)
    n = r.length(flexible, wide, what)
    if n < 0:
        if kind in (STRING, BYTES):
            raise KafkaDecodeError(f"{what}: null where a value is required")
        return None
    raw = r.take(n, what)
    if wide:
        return bytes(raw)
    try:
        return str(raw, "utf-8")
    except UnicodeDecodeError:
        raise KafkaDecodeError(f"{what}: not UTF-8") from None


def _read_struct(fields: tuple[Field, ...], r: Reader, version: int, flexible: bool,
                 what: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in fields:
        out[f.name] = (_read(f.kind, r, version, flexible, f"{what}.{f.name}")
                       if f.present(version) else f.default)
    if flexible:
        r.skip_tags(what)
    return out


def decode(message: Message, version: int, r: Reader, what: str = "body") -> dict[str, Any]:
    """The message's fields at ``version`` read from ``r`` (fields the version lacks
    take their defaults)."""
    return _read_struct(message.fields, r, version, message.is_flexible(version), what)


def _write(kind: Scalar | Array | Struct, value: Any, out: list[bytes], version: int,
           flexible: bool) -> None:
    if isinstance(kind, Struct):
        if kind.nullable:
            if value is None:
                out.append(b"\xff")
                return
            out.append(b"\x01")
        _write_struct(kind.fields, value if value is not None else {}, out, version,
                      flexible)
        return
    if isinstance(kind, Array):
        if value is None:
            out.append(b"\x00" if flexible else b"\xff\xff\xff\xff")
            return
        out.append(uvarint(len(value) + 1) if flexible else struct.pack(">i", len(value)))
        for item in value:
            if kind.of is not None:
                _write(kind.of, item, out, version, flexible)
            else:
                _write_struct(kind.fields, item, out, version, flexible)
        return
    if kind.fmt:
        out.append(_STRUCTS[kind.name].pack(value))
        return
    wide = kind in (BYTES, NULLABLE_BYTES)
    if value is None:
        out.append(b"\x00" if flexible else (b"\xff\xff\xff\xff" if wide else b"\xff\xff"))
        return
    raw = value.encode() if isinstance(value, str) else bytes(value)
    if flexible:
        out.append(uvarint(len(raw) + 1))
    else:
        out.append(struct.pack(">i" if wide else ">h", len(raw)))
    out.append(raw)


def _write_struct(fields: tuple[Field, ...], values: Mapping[str, Any], out: list[bytes],
                  version: int, flexible: bool) -> None:
    for f in fields:
        if f.present(version):
            _write(f.kind, values.get(f.name, f.default), out, version, flexible)
    if flexible:
        out.append(b"\x00")


def encode(message: Message, version: int, values: Mapping[str, Any]) -> list[bytes]:
    """The message at ``version`` as byte pieces (missing keys take their defaults)."""
    out: list[bytes] = []
    _write_struct(message.fields, values, out, version, message.is_flexible(version))
    return out


def fields(*items: Field) -> tuple[Field, ...]:
    return items


def names(values: Iterable[Field]) -> list[str]:
    return [f.name for f in values]
