"""JSON records in ZooKeeper, each with its encoding declared once.

A record is a frozen dataclass whose fields name their JSON key and codec
(``json_field("generation", COUNT)``); :func:`encode` and :func:`decode` both walk that
one declaration, so the two directions cannot disagree. Every document carries
``"format": N`` (the class's ``FORMAT``). :func:`decode`

- refuses a format it does not know with UnknownFormatError naming the node (a newer
  ledgerd wrote it: better refused than misread, and a CAS never overwrites it);
- reads a document without a format as ``UNVERSIONED`` when the class sets it (the
  documents written before the field existed), and refuses it otherwise;
- ignores keys it does not know (a newer minor change may add one);
- raises CorruptMetadataError naming the node for anything else that does not fit.

A field with a default may be absent (the default is taken); ``omit_default`` leaves it
out of the document while it holds its default, so documents stay as small as the ones
older versions wrote. Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from ledgerd.metadata.errors import CorruptMetadataError, UnknownFormatError

__all__ = [
    "COUNT",
    "INT",
    "INT_LISTS",
    "INT_MAP",
    "OPTIONAL_STR",
    "PORT",
    "STR",
    "STR_MAP",
    "Codec",
    "JsonRecord",
    "decode",
    "encode",
    "json_field",
]

T = TypeVar("T")
R = TypeVar("R", bound="JsonRecord")
_SPEC = "json"


class JsonRecord(Protocol):
    """What :func:`encode` and :func:`decode` need of a record class."""

    FORMAT: ClassVar[int]
    UNVERSIONED: ClassVar[int | None]  # the format of a document without one (None: refuse)


@dataclass(frozen=True, slots=True)
class Codec(Generic[T]):
    """A field's JSON form: ``dump`` to a JSON value, ``load`` back (raising ValueError
    or TypeError for a value that does not fit)."""

    dump: Callable[[T], object]
    load: Callable[[object], T]


@dataclass(frozen=True, slots=True)
class _Spec:
    key: str
    codec: Codec[Any]
    omit_default: bool


def _int(low: int | None, high: int | None = None) -> Callable[[object], int]:
    def load(value: object) -> int:
        if not isinstance(value, int) or isinstance(value, bool) or \
                (low is not None and value < low) or (high is not None and value > high):
            bounds = f" in {low}..{high}" if high is not None else \
                f" >= {low}" if low is not None else ""
            raise ValueError(f"expected an integer{bounds}, got {value!r}")
        return value
    return load


def _str(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {value!r}")
    return value


def _optional_str(value: object) -> str | None:
    return None if value is None else _str(value)


def _str_map(value: object) -> Mapping[str, str]:
    if not isinstance(value, dict):
        raise TypeError(f"expected an object of strings, got {value!r}")
    return {_str(k): _str(v) for k, v in value.items()}


def _int_map(value: object) -> Mapping[int, int]:
    if not isinstance(value, dict):
        raise TypeError(f"expected an object of offsets, got {value!r}")
    count = _int(0)
    return {count(int(k)): count(v) for k, v in value.items()}


def _int_lists(value: object) -> tuple[tuple[int, ...], ...]:
    if not isinstance(value, list) or not all(isinstance(r, list) for r in value):
        raise TypeError(f"expected lists of integers, got {value!r}")
    count = _int(0)
    return tuple(tuple(count(b) for b in r) for r in value)


INT: Codec[int] = Codec(int, _int(None))
COUNT: Codec[int] = Codec(int, _int(0))  # an integer >= 0
PORT: Codec[int] = Codec(int, _int(0, 65535))
STR: Codec[str] = Codec(str, _str)
OPTIONAL_STR: Codec[str | None] = Codec(lambda v: v, _optional_str)
STR_MAP: Codec[Mapping[str, str]] = Codec(lambda m: dict(sorted(m.items())), _str_map)
# partition -> offset, keyed by the partition's decimal string (JSON keys are strings)
INT_MAP: Codec[Mapping[int, int]] = Codec(
    lambda m: {str(k): v for k, v in sorted(m.items())}, _int_map)
INT_LISTS: Codec[tuple[tuple[int, ...], ...]] = Codec(lambda t: [list(r) for r in t],
                                                      _int_lists)
STR_LIST: Codec[tuple[str, ...]] = Codec(list, lambda v: _str_list(v))


def _str_list(value: object) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise TypeError(f"expected a list of strings, got {value!r}")
    return tuple(_str(v) for v in value)


def json_field(key: str, codec: Codec[Any], *, default: Any = dataclasses.MISSING,
               default_factory: Any = dataclasses.MISSING,
               omit_default: bool = False) -> Any:
    """A dataclass field stored under ``key`` with ``codec``."""
    spec = {_SPEC: _Spec(key, codec, omit_default)}
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=spec)
    return dataclasses.field(default=default, metadata=spec)


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def encode(record: JsonRecord) -> bytes:
    """The record's document: ``format`` first, then each declared field."""
    doc: dict[str, object] = {"format": record.FORMAT}
    for f in dataclasses.fields(record):  # type: ignore[arg-type]
        spec: _Spec | None = f.metadata.get(_SPEC)
        if spec is None:
            continue
        value = getattr(record, f.name)
        if spec.omit_default and value == _default(f):
            continue
        doc[spec.key] = spec.codec.dump(value)
    return json.dumps(doc).encode()


def decode(cls: type[R], raw: bytes, path: str) -> R:
    """The record stored at ``path``. Raises UnknownFormatError for a format this
    version does not read and CorruptMetadataError for a document that does not fit
    the declaration (both name ``path``)."""
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        raise CorruptMetadataError(path, f"not JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise CorruptMetadataError(path, f"not a JSON object: {raw[:80]!r}")
    found = doc.get("format", cls.UNVERSIONED)
    if found != cls.FORMAT or isinstance(found, bool):
        raise UnknownFormatError(path, doc.get("format"), cls.FORMAT)
    values: dict[str, Any] = {}
    try:
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            spec: _Spec | None = f.metadata.get(_SPEC)
            if spec is None:
                continue
            if spec.key in doc:
                try:
                    values[f.name] = spec.codec.load(doc[spec.key])
                except (ValueError, TypeError) as exc:
                    raise ValueError(f"{spec.key}: {exc}") from exc
            elif _default(f) is dataclasses.MISSING:
                raise ValueError(f"{spec.key} is missing")
        return cls(**values)
    except (ValueError, TypeError) as exc:
        raise CorruptMetadataError(path, f"not a {cls.__name__}: {exc}") from exc
