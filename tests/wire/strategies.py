"""Hypothesis strategies for every message type, built from the layouts' plans."""

from __future__ import annotations

import struct
from typing import Any

from hypothesis import strategies as st

from ledgerd.wire.codec import FixedField, build_plan
from ledgerd.wire.messages import Message


def _int_range(fmt: str) -> st.SearchStrategy[int]:
    bits = struct.calcsize(">" + fmt) * 8
    if fmt.isupper():
        return st.integers(0, (1 << bits) - 1)
    return st.integers(-(1 << (bits - 1)), (1 << (bits - 1)) - 1)


def _fixed(f: FixedField) -> st.SearchStrategy[Any]:
    if f.fmt.endswith("s"):
        return st.binary(min_size=f.size, max_size=f.size)
    return _int_range(f.fmt)


def message_strategy(cls: type[Message], max_items: int = 5) -> st.SearchStrategy[Message]:
    plan = build_plan(cls.LAYOUT)
    kwargs: dict[str, st.SearchStrategy[Any]] = {}
    for step in plan.steps:
        if step.kind == "fixed":
            for f in step.fields:
                kwargs[f.name] = _fixed(f)
        elif step.kind == "blob":
            limit = (1 << 15) - 1 if step.prefix_fmt.upper() == "H" else 300
            kwargs[step.name] = st.binary(max_size=min(limit, 300))
        elif step.kind == "blobs":
            kwargs[step.name] = st.lists(st.binary(max_size=200), max_size=max_items).map(tuple)
        elif step.kind == "structs":
            elem = cls.ELEMENTS[step.name]
            elem_st = st.builds(elem, **{f.name: _fixed(f) for f in step.fields})
            kwargs[step.name] = st.lists(elem_st, max_size=max_items).map(tuple)
    return st.builds(cls, **kwargs)
