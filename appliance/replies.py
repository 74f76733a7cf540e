"""Replies owed on a bookie connection: what each holds until sent, and their encoding.

A ``ReplyItem`` is one reply owed: the request's correlation id and api, its status, and
either the response message or, for an add, the ids it answers (ledger, first entry,
count: an OK AddResponse is encoded straight from them, so an add's entries are never
kept for its reply). A run of one-entry adds with one outcome is one item with the
frames' correlation ids in ``cids`` (entry ``entry_id + i`` for the i-th): one object
per run, not per entry, on the bookie's hottest path. An add's reply also waits for the journal group that makes its
entries durable; a group that failed turns its OK into IO_ERROR. ``started`` is when
the request was read (0.0 for replies that time themselves), for the latency metrics.

Both transports encode through ``encode_replies``; replies the journal's syncer sent
already encoded are counted through ``count_sent_adds``, as ``encode_replies`` would
have counted them.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ledgerd.appliance.metrics import BookieMetrics
from ledgerd.wire.connection import ServerConnection
from ledgerd.wire.frames import encode_add_response
from ledgerd.wire.messages import (
    ApiKey,
    Message,
    ReadLacResponse,
    ReadRangeResponse,
    ReadResponse,
    ReadStrideResponse,
)
from ledgerd.wire.status import Status

if TYPE_CHECKING:
    from ledgerd.disk.journal import JournalGroup

__all__ = ["ReplyItem", "count_sent_adds", "encode_ok_adds", "encode_replies", "replies_in",
           "reply_bytes"]

_ADD = int(ApiKey.ADD)
_READ = int(ApiKey.READ)


def reply_bytes(resp: Message | None) -> int:
    """What a reply holds in memory until it is sent (entries dominate)."""
    if isinstance(resp, (ReadRangeResponse, ReadStrideResponse)):
        return 64 + sum(map(len, resp.entries))
    if isinstance(resp, ReadResponse):
        return 64 + len(resp.entry)
    if isinstance(resp, ReadLacResponse):
        return 64 + len(resp.explicit_lac) + len(resp.last_entry)
    return 64


class ReplyItem:
    """One reply owed on a connection (see the module docstring)."""

    __slots__ = ("api_key", "cids", "correlation_id", "count", "entry_id", "group",
                 "ledger_id", "message", "started", "status")

    def __init__(self, correlation_id: int, api_key: int, status: int,
                 message: Message | None, group: JournalGroup | None, started: float,
                 ledger_id: int = -1, entry_id: int = -1, count: int = 0,
                 cids: list[int] | None = None) -> None:
        self.correlation_id = correlation_id
        self.api_key = api_key
        self.status = status
        self.message = message
        self.group = group
        self.started = started
        self.ledger_id = ledger_id
        self.entry_id = entry_id
        self.count = count
        self.cids = cids  # a run's frames (one entry each), or None: one reply

    @property
    def replies(self) -> int:
        """How many replies (frames answered) the item stands for."""
        return 1 if self.cids is None else len(self.cids)

    def __repr__(self) -> str:
        return (f"ReplyItem(cid={self.correlation_id}, api={self.api_key}, "
                f"status={self.status}, group={self.group!r})")


def encode_replies(conn: ServerConnection, metrics: BookieMetrics, items: list[ReplyItem]
                   ) -> tuple[bytes, int]:
    """The bytes of ``items``' replies, in order, and the ``reply_bytes`` of the non-add
    ones among them; counts each by api and status and observes the add and read
    latencies."""
    count = metrics.count
    add_latency = metrics.add_latency
    read_latency = metrics.read_latency
    send_add_ok = conn.send_add_ok
    chunks = []
    now = time.perf_counter()
    adds = ok_adds = sent_bytes = 0
    add_t0 = 0.0
    for item in items:
        api = item.api_key
        t0 = item.started
        if api == _ADD:
            status = item.status
            group = item.group
            if group is not None and group.error is not None:
                status = Status.IO_ERROR
            cids = item.cids
            if cids is None:
                n = 1
                if status == 0:
                    chunks.append(send_add_ok(item.correlation_id, item.ledger_id,
                                              item.entry_id, item.count))
                else:
                    chunks.append(conn.send(item.correlation_id, status, None))
            else:
                n = len(cids)
                if status == 0:
                    lid = item.ledger_id
                    eid = item.entry_id
                    chunks += [send_add_ok(cid, lid, eid + i, 1) for i, cid in enumerate(cids)]
                else:
                    chunks += [conn.send(cid, status, None) for cid in cids]
            if status == 0:
                ok_adds += n
            else:
                count(api, status, n)
            if adds and t0 != add_t0:
                add_latency.observe(now - add_t0, adds)
                adds = 0
            add_t0 = t0
            adds += n
        else:
            resp = item.message
            chunks.append(conn.send(item.correlation_id, item.status, resp))
            sent_bytes += reply_bytes(resp)
            count(api, item.status)
            if api == _READ and t0:  # slow-path reads time themselves
                read_latency.observe(now - t0)
    if adds:
        add_latency.observe(now - add_t0, adds)
    if ok_adds:
        count(_ADD, 0, ok_adds)
    return b"".join(chunks), sent_bytes


def count_sent_adds(metrics: BookieMetrics, items: list[ReplyItem]) -> None:
    """Count and time OK add replies that went out already encoded (the journal's
    syncer sent them), as ``encode_replies`` would have."""
    observe = metrics.add_latency.observe
    now = time.perf_counter()
    adds = 0
    add_t0 = 0.0
    total = 0
    for item in items:
        t0 = item.started
        if adds and t0 != add_t0:
            observe(now - add_t0, adds)
            adds = 0
        add_t0 = t0
        n = 1 if item.cids is None else len(item.cids)
        adds += n
        total += n
    if adds:
        observe(now - add_t0, adds)
        metrics.count(_ADD, 0, total)


def encode_ok_adds(items: list[ReplyItem]) -> tuple[bytes, int]:
    """The OK AddResponses of ``items`` (OK adds), in order, as the syncer sends them,
    and how many replies that is."""
    out = []
    for item in items:
        cids = item.cids
        if cids is None:
            out.append(encode_add_response(item.correlation_id, 0, item.ledger_id,
                                           item.entry_id, item.count))
        else:
            lid = item.ledger_id
            eid = item.entry_id
            out += [encode_add_response(cid, 0, lid, eid + i, 1) for i, cid in enumerate(cids)]
    return b"".join(out), len(out)


def replies_in(items: list[ReplyItem]) -> int:
    """How many replies ``items`` stand for."""
    return sum(1 if item.cids is None else len(item.cids) for item in items)
