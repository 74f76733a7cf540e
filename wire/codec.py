"""Fast codecs derived from the construct layouts, plus the plain construct codecs.

construct parses about 20k frames/s on this machine, ``struct.Struct`` over 1M/s. So
at import time each layout in :mod:`wire.layouts` is compiled into a *plan*: runs of
fixed-size fields become one ``struct.Struct`` (with the count or length prefix of the
next variable field folded in), byte strings and arrays become loops with bounds checks.
The plan is then turned into Python source for an encoder and a decoder, so the hot path
makes one ``pack``/``unpack_from`` call per fixed run and nothing else.

Nothing here is written twice by hand: a layout this compiler does not understand raises
at import. The decoders never allocate past the frame: every length and count is checked
against the bytes left before use, and every body must end exactly at the frame's end.

``tests/wire/test_codec.py`` proves the two codecs give identical bytes and identical
decoded messages for every message type.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import construct

from ledgerd.wire.errors import (
    EntryCountMismatchError,
    MalformedBodyError,
    TruncatedFrameError,
    UnencodableMessageError,
)
from ledgerd.wire.messages import REQUEST_TYPES, RESPONSE_TYPES, Message

__all__ = [
    "BodyCodec",
    "FixedField",
    "Plan",
    "build_plan",
    "construct_decode",
    "construct_encode",
    "fast_codec",
]

Encoder = Callable[[Any], bytes]
Decoder = Callable[[bytes, int, int], Any]


@dataclass(frozen=True, slots=True)
class FixedField:
    name: str
    fmt: str  # one struct format item, e.g. "q" or "20s"
    size: int


@dataclass(frozen=True, slots=True)
class Step:
    """One step of a plan.

    kind "fixed": ``fields`` packed with one struct;
    kind "blob": a byte string with a ``prefix_fmt`` length;
    kind "blobs": an array of byte strings, ``count_fmt`` count, ``prefix_fmt`` lengths;
    kind "structs": an array of fixed-size structs (``fields``), ``count_fmt`` count.
    """

    kind: str
    name: str = ""
    fields: tuple[FixedField, ...] = ()
    count_fmt: str = ""
    prefix_fmt: str = ""


@dataclass(frozen=True, slots=True)
class Plan:
    steps: tuple[Step, ...]
    terminated: bool


def _unwrap(sub: Any) -> Any:
    while isinstance(sub, construct.Renamed):
        sub = sub.subcon
    return sub


def _fixed_format(sub: Any) -> tuple[str, int] | None:
    sub = _unwrap(sub)
    if isinstance(sub, construct.FormatField):
        fmt = sub.fmtstr
        if fmt[0] != ">":
            raise TypeError(f"layout field {sub} is not big-endian")
        return fmt[1:], struct.calcsize(fmt)
    if isinstance(sub, construct.Bytes) and isinstance(sub.length, int):
        return f"{sub.length}s", sub.length
    return None


def _blob_prefix(sub: Any) -> str | None:
    sub = _unwrap(sub)
    if isinstance(sub, construct.Prefixed) and sub.subcon is construct.GreedyBytes \
            and not sub.includelength:
        found = _fixed_format(sub.lengthfield)
        if found is None:
            raise TypeError(f"blob length field {sub.lengthfield} is not fixed-size")
        return found[0]
    return None


def _prefixed_array(sub: Any) -> tuple[str, Any] | None:
    """Recognise construct's PrefixedArray (a FocusedSeq of count + Array)."""
    sub = _unwrap(sub)
    if not isinstance(sub, construct.FocusedSeq) or len(sub.subcons) != 2:
        return None
    count, items = sub.subcons
    if getattr(count, "name", None) != "count" or getattr(items, "name", None) != "items":
        return None
    count_fmt = _fixed_format(_unwrap(count).subcon)
    if count_fmt is None:
        raise TypeError("array count is not fixed-size")
    return count_fmt[0], _unwrap(items).subcon


def build_plan(layout: Any) -> Plan:
    """Compile a construct ``Struct`` into a plan; raises TypeError on anything unknown."""
    if not isinstance(layout, construct.Struct):
        raise TypeError(f"layout must be a construct Struct, got {layout!r}")
    steps: list[Step] = []
    run: list[FixedField] = []
    terminated = False
    for sub in layout.subcons:
        if terminated:
            raise TypeError("Terminated must be the last field of a layout")
        inner = _unwrap(sub)
        if inner is construct.Terminated:
            terminated = True
            continue
        name = sub.name
        if name is None:
            raise TypeError(f"unnamed field {sub!r} in layout")
        fixed = _fixed_format(inner)
        if fixed is not None:
            run.append(FixedField(name, fixed[0], fixed[1]))
            continue
        if run:
            steps.append(Step("fixed", fields=tuple(run)))
            run = []
        prefix = _blob_prefix(inner)
        if prefix is not None:
            steps.append(Step("blob", name=name, prefix_fmt=prefix))
            continue
        array = _prefixed_array(inner)
        if array is not None:
            count_fmt, element = array
            elem_prefix = _blob_prefix(element)
            if elem_prefix is not None:
                steps.append(Step("blobs", name=name, count_fmt=count_fmt, prefix_fmt=elem_prefix))
                continue
            element = _unwrap(element)
            if isinstance(element, construct.Struct):
                elem_fields = []
                for esub in element.subcons:
                    efixed = _fixed_format(esub)
                    if efixed is None or esub.name is None:
                        raise TypeError(f"array element field {esub!r} is not fixed-size")
                    elem_fields.append(FixedField(esub.name, efixed[0], efixed[1]))
                steps.append(Step("structs", name=name, count_fmt=count_fmt,
                                  fields=tuple(elem_fields)))
                continue
        raise TypeError(f"layout field {name!r} ({inner!r}) is not supported by the fast codec")
    if run:
        steps.append(Step("fixed", fields=tuple(run)))
    return Plan(tuple(steps), terminated)


# ---------------------------------------------------------------------------------------
# Source generation. Counts and length prefixes of a variable field are folded into the
# preceding fixed run so a one-entry Add is one pack call plus the entry bytes.


@dataclass(slots=True)
class _Gen:
    consts: dict[str, Any]
    lines: list[str]
    n: int = 0

    def const(self, value: Any) -> str:
        self.n += 1
        name = f"_c{self.n}"
        self.consts[name] = value
        return name


def _segments(plan: Plan) -> list[tuple[list[FixedField], Step | None]]:
    """Pair each variable step with the fixed run before it (possibly empty)."""
    out: list[tuple[list[FixedField], Step | None]] = []
    run: list[FixedField] = []
    for step in plan.steps:
        if step.kind == "fixed":
            run.extend(step.fields)
        else:
            out.append((run, step))
            run = []
    if run or not out:
        out.append((run, None))
    return out


def _prefix_of(step: Step) -> str:
    return step.count_fmt if step.kind in ("blobs", "structs") else step.prefix_fmt


# Frame headers the encoders can fold into their first pack call: the fields after
# `size` are passed in as arguments named like the header fields.
_HEADERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "body": ("", ()),
    "request": ("ihhi", ("api_key", "api_version", "correlation_id")),
    "response": ("iih", ("correlation_id", "status")),
}


def _gen_encoder(cls: type[Message], plan: Plan, header: str) -> tuple[str, dict[str, Any]]:
    """Source of ``encode(m, *header_args) -> bytes`` for a body or a whole frame.

    For frames the size is computed first (fixed sizes plus the variable lengths), so
    the header, the fixed fields and the first length prefix go out in one pack.
    """
    g = _Gen({}, [])
    w = g.lines.append
    hfmt, hargs = _HEADERS[header]
    w(f"def encode(m{''.join(', ' + a for a in hargs)}):")
    segments = _segments(plan)
    # Sizes: fixed bytes known now, variable parts summed at run time.
    fixed_total = struct.calcsize(">" + hfmt) - (4 if hfmt else 0)
    variable: list[str] = []
    for run, step in segments:
        fixed_total += struct.calcsize(">" + "".join(f.fmt for f in run))
        if step is None:
            continue
        fixed_total += struct.calcsize(">" + _prefix_of(step))
        if step.kind == "blob":
            variable.append(f"len(m.{step.name})")
        elif step.kind == "blobs":
            w(f"    lens_{step.name} = list(map(len, m.{step.name}))")
            psize = struct.calcsize(">" + step.prefix_fmt)
            variable.append(f"sum(lens_{step.name}) + {psize} * len(lens_{step.name})")
        elif step.kind == "structs":
            esize = struct.calcsize(">" + "".join(f.fmt for f in step.fields))
            variable.append(f"{esize} * len(m.{step.name})")
    first = True
    w("    parts = []")
    w("    add = parts.append")
    for run, step in segments:
        fmt = ">" + "".join(f.fmt for f in run)
        args = [f"m.{f.name}" for f in run]
        if first and hfmt:
            size_expr = " + ".join([str(fixed_total), *variable])
            fmt = ">" + hfmt + fmt[1:]
            args = [size_expr, *hargs, *args]
        first = False
        if step is not None:
            fmt += _prefix_of(step)
            args.append(f"len(m.{step.name})")
        if args:
            sc = g.const(struct.Struct(fmt))
            w(f"    add({sc}.pack({', '.join(args)}))")
        if step is None:
            continue
        if step.kind == "blob":
            w(f"    add(m.{step.name})")
        elif step.kind == "blobs":
            p = g.const(struct.Struct(">" + step.prefix_fmt).pack)
            chain = g.const(itertools.chain.from_iterable)
            w(f"    parts.extend({chain}(zip(map({p}, lens_{step.name}), m.{step.name})))")
        elif step.kind == "structs":
            e = g.const(struct.Struct(">" + "".join(f.fmt for f in step.fields)))
            eargs = ", ".join(f"item.{f.name}" for f in step.fields)
            w(f"    for item in m.{step.name}:")
            w(f"        add({e}.pack({eargs}))")
    w("    return b''.join(parts)")
    return "\n".join(g.lines), g.consts


def _gen_decoder(cls: type[Message], plan: Plan) -> tuple[str, dict[str, Any]]:
    """Source of ``decode(buf, off, end) -> message``.

    The message is built through its slot descriptors rather than ``__init__``: the
    layout already guarantees what ``__post_init__`` would check (a 20-byte key is 20
    bytes), and it is three times faster.
    """
    g = _Gen({}, [])
    w = g.lines.append
    cname = g.const(cls)
    new = g.const(object.__new__)
    trunc = g.const(TruncatedFrameError)
    mism = g.const(EntryCountMismatchError)
    malformed = g.const(MalformedBodyError)
    label = cls.__name__
    w("def decode(buf, off, end):")
    assigned: list[str] = []
    for run, step in _segments(plan):
        fmt = ">" + "".join(f.fmt for f in run)
        names = [f.name for f in run]
        if step is not None:
            fmt += _prefix_of(step)
            names.append(f"n_{step.name}")
        if names:
            s = struct.Struct(fmt)
            sc = g.const(s)
            w(f"    if end - off < {s.size}:")
            w(f"        raise {trunc}({label!r} + ' fixed fields', {s.size}, end - off)")
            w(f"    {', '.join(names)}, = {sc}.unpack_from(buf, off)")
            w(f"    off += {s.size}")
            assigned.extend(f.name for f in run)
        if step is None:
            continue
        n = f"n_{step.name}"
        what = f"{label}.{step.name}"
        if step.kind == "blob":
            w(f"    if {n} > end - off:")
            w(f"        raise {trunc}({what!r}, {n}, end - off)")
            w(f"    {step.name} = buf[off:off + {n}]")
            w(f"    off += {n}")
        elif step.kind == "blobs":
            p = struct.Struct(">" + step.prefix_fmt)
            pc = g.const(p.unpack_from)
            w(f"    if {n} * {p.size} > end - off:")
            w(f"        raise {mism}({what!r}, {n}, 'more items than bytes left')")
            w("    items = []")
            w("    append = items.append")
            w(f"    for _ in range({n}):")
            w(f"        if end - off < {p.size}:")
            w(f"            raise {mism}({what!r}, {n}, 'frame ends before an item length')")
            w(f"        size, = {pc}(buf, off)")
            w(f"        off += {p.size}")
            w("        if size > end - off:")
            w(f"            raise {trunc}({what!r} + ' item', size, end - off)")
            w("        append(buf[off:off + size])")
            w("        off += size")
            w(f"    {step.name} = tuple(items)")
        elif step.kind == "structs":
            e = struct.Struct(">" + "".join(f.fmt for f in step.fields))
            ec = g.const(e)
            elem_cls = g.const(cls.ELEMENTS[step.name])
            kw = ", ".join(f"{f.name}=t[{i}]" for i, f in enumerate(step.fields))
            w(f"    if {n} * {e.size} > end - off:")
            w(f"        raise {mism}({what!r}, {n}, 'more items than bytes left')")
            w(f"    {step.name} = tuple({elem_cls}({kw}) for t in "
              f"{ec}.iter_unpack(buf[off:off + {n} * {e.size}]))")
            w(f"    off += {n} * {e.size}")
        assigned.append(step.name)
    if plan.terminated:
        w("    if off != end:")
        w(f"        raise {malformed}({label!r} + ': ' + str(end - off) + ' bytes after the last field')")
    w(f"    m = {new}({cname})")
    for name in assigned:
        setter = g.const(cls.__dict__[name].__set__)
        w(f"    {setter}(m, {name})")
    w("    return m")
    return "\n".join(g.lines), g.consts


@dataclass(frozen=True, slots=True)
class BodyCodec:
    """The derived codecs of one message type, with their generated source.

    ``encode(m)`` gives the body; ``encode_request(m, api_key, api_version,
    correlation_id)`` and ``encode_response(m, correlation_id, status)`` give whole
    frames; ``decode(buf, off, end)`` reads a body from ``buf[off:end]``.
    """

    cls: type[Message]
    plan: Plan
    encode: Encoder
    encode_request: Callable[..., bytes]
    encode_response: Callable[..., bytes]
    decode: Decoder
    source: str


def _compile(cls: type[Message]) -> BodyCodec:
    plan = build_plan(cls.LAYOUT)
    layout_names = {s.name for s in plan.steps if s.name} | {
        f.name for s in plan.steps if s.kind == "fixed" for f in s.fields}
    class_names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    if layout_names != class_names:
        raise TypeError(f"{cls.__name__} fields {sorted(class_names)} differ from its layout "
                        f"{sorted(layout_names)}")
    sources = []
    funcs = []
    for kind, (src, consts) in (("encode", _gen_encoder(cls, plan, "body")),
                                ("encode_request", _gen_encoder(cls, plan, "request")),
                                ("encode_response", _gen_encoder(cls, plan, "response")),
                                ("decode", _gen_decoder(cls, plan))):
        namespace: dict[str, Any] = dict(consts)
        exec(compile(src, f"<wire.codec {kind} {cls.__name__}>", "exec"), namespace)
        funcs.append(namespace["decode" if kind == "decode" else "encode"])
        sources.append(src)
    encode, encode_request, encode_response, decode = funcs
    return BodyCodec(cls, plan, encode, encode_request, encode_response, decode,
                     "\n\n".join(sources))


_CODECS: dict[type[Message], BodyCodec] = {}
for _cls in (*REQUEST_TYPES.values(), *RESPONSE_TYPES.values()):
    _CODECS[_cls] = _compile(_cls)


def fast_codec(cls: type[Message]) -> BodyCodec:
    """The derived codec of ``cls``."""
    return _CODECS[cls]


# ---------------------------------------------------------------------------------------
# The plain construct codecs: the reference the fast ones are tested against, and what
# the inspection tools use.


def _to_construct(msg: Message) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in fields(msg):  # type: ignore[arg-type]
        value = getattr(msg, f.name)
        if f.name in msg.ELEMENTS:
            value = [{ef.name: getattr(v, ef.name) for ef in fields(v)} for v in value]
        elif isinstance(value, tuple):
            value = list(value)
        out[f.name] = value
    return out


def construct_encode(msg: Message) -> bytes:
    """Encode a body with construct (slow; the reference)."""
    try:
        return bytes(msg.LAYOUT.build(_to_construct(msg)))
    except construct.ConstructError as exc:
        raise UnencodableMessageError(f"{type(msg).__name__}: cannot encode: {exc}") from exc


def construct_decode(cls: type[Message], body: bytes) -> Message:
    """Decode a body with construct (slow; the reference). Raises WireError only."""
    try:
        parsed = cls.LAYOUT.parse(body)
    except construct.TerminatedError as exc:
        raise MalformedBodyError(f"{cls.__name__}: bytes after the last field") from exc
    except construct.StreamError as exc:
        raise TruncatedFrameError(cls.__name__, len(body) + 1, len(body)) from exc
    except construct.ConstructError as exc:
        raise MalformedBodyError(f"{cls.__name__}: {exc}") from exc
    kwargs: dict[str, Any] = {}
    for f in fields(cls):  # type: ignore[arg-type]
        value = parsed[f.name]
        if f.name in cls.ELEMENTS:
            elem = cls.ELEMENTS[f.name]
            value = tuple(elem(**{k: v for k, v in item.items() if not k.startswith("_")})
                          for item in value)
        elif isinstance(value, list):
            value = tuple(value)
        kwargs[f.name] = value
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise MalformedBodyError(f"{cls.__name__}: {exc}") from exc

