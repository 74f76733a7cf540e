"""``ledgerd shell metadata rebuild``: gather what the bookies hold, plan, and write.

The I/O around :mod:`metadata.rebuild` (pure): every bookie named (registered, in the
snapshot's cookies, or ``--bookies``) is asked for its holdings page by page
(``LedgerHoldingsRequest``, an admin request) and for its status (the cluster instance
its cookie names; all must agree); entry 0 of each ledger neither the live metadata
nor the snapshot describes is read to learn its digest type and whether it is a log
header (``metadata.logheader``). The plan is printed; with ``--apply`` the cluster root
is made if missing (with the bookies' instance id, LAYOUT last), the GC freeze flag
set, the ledgers written (a restored OPEN ledger the bookies show moved on is written
over, by compare-and-set), the id counter advanced past them, the logs the headers
name written (no cursors), and the Kafka topic records their headers carry (topics
neither live nor in the snapshot; no group offsets).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

import trio

from ledgerd.metadata.ledger import LedgerMetadata
from ledgerd.metadata.rebuild import (
    BookieLedger,
    LedgerPlan,
    Plan,
    RebuildInput,
    merge_ranges,
    plan_rebuild,
)
from ledgerd.metadata.snapshot import Snapshot, category
from ledgerd.metadata.store import MetadataStore

__all__ = ["Gathered", "apply_plan", "gather", "max_held_ledger_id", "snapshot_ledgers"]

PAGE_LEDGERS = 2000
PAGE_RANGES = 20000


class RebuildError(Exception):
    pass


class Gathered:
    def __init__(self) -> None:
        self.held: dict[int, list[BookieLedger]] = {}
        self.instance_ids: dict[str, str] = {}
        self.unreachable: dict[str, str] = {}
        self.corrupt_headers: dict[int, str] = {}  # ledger -> why its log header is bad


async def _bookie_holdings(address: str, secret: bytes, out: Gathered) -> None:
    from ledgerd.bookie_client import open_bookie_client
    from ledgerd.wire.messages import (
        AdminStatusRequest,
        LedgerHoldingsRequest,
        LedgerHoldingsResponse,
    )
    from ledgerd.wire.status import Status

    ranges: dict[int, list[tuple[int, int]]] = {}
    states: dict[int, Any] = {}
    async with open_bookie_client(address, connect_timeout=5) as c:
        st, resp = await c.call(AdminStatusRequest(secret=secret))
        if st != Status.OK or resp is None:
            raise RebuildError(f"status refused: {Status(st).name}"
                               + (" (pass --secret)" if st == Status.UNAUTHORIZED else ""))
        out.instance_ids[address] = str(json.loads(resp.status_json).get("instance_id", ""))
        first_ledger, first_entry = 0, 0
        while True:
            st, resp = await c.call(LedgerHoldingsRequest(
                first_ledger_id=first_ledger, first_entry_id=first_entry,
                max_ledgers=PAGE_LEDGERS, max_ranges=PAGE_RANGES, secret=secret))
            if st != Status.OK or not isinstance(resp, LedgerHoldingsResponse):
                raise RebuildError(f"holdings refused: {Status(st).name}")
            for held in resp.ledgers:
                states[held.ledger_id] = held
            for r in resp.ranges:
                ranges.setdefault(r.ledger_id, []).append((r.first_entry_id, r.last_entry_id))
            if resp.is_last:
                break
            first_ledger, first_entry = resp.next_ledger_id, resp.next_entry_id
    for lid, held in states.items():
        out.held.setdefault(lid, []).append(BookieLedger(
            bookie_id=address, ledger_id=lid, ranges=merge_ranges(ranges.get(lid, [])),
            fenced=held.is_fenced, term=held.term, lac=held.lac,
            key_check=held.key_check.hex() if held.has_key else ""))


async def gather(bookies: Iterable[str], secret: bytes) -> Gathered:
    """Every bookie's holdings (an unreachable bookie is recorded, not fatal)."""
    from ledgerd.errors import LedgerdError

    out = Gathered()

    async def one(address: str) -> None:
        try:
            await _bookie_holdings(address, secret, out)
        except (RebuildError, LedgerdError, OSError, trio.BrokenResourceError) as exc:
            out.unreachable[address] = str(exc)

    async with trio.open_nursery() as nursery:
        for b in sorted(set(bookies)):
            nursery.start_soon(one, b)
    return out


async def _max_held_ledger_id(address: str, secret: bytes) -> int:
    """The highest ledger id ``address`` holds (-1: none), by LedgerHoldings pages of one
    ledger and one range: galloping then bisecting on ``first_ledger_id`` (about two
    requests per bit of the id, whatever the bookie holds)."""
    from ledgerd.bookie_client import open_bookie_client
    from ledgerd.wire.messages import LedgerHoldingsRequest, LedgerHoldingsResponse
    from ledgerd.wire.status import Status

    async with open_bookie_client(address, connect_timeout=5) as c:
        async def first_at_or_after(ledger_id: int) -> int | None:
            st, resp = await c.call(LedgerHoldingsRequest(
                first_ledger_id=ledger_id, max_ledgers=1, max_ranges=1, secret=secret))
            if st != Status.OK or not isinstance(resp, LedgerHoldingsResponse):
                raise RebuildError(f"holdings refused: {Status(st).name}")
            return resp.ledgers[0].ledger_id if resp.ledgers else None

        low = await first_at_or_after(0)
        if low is None:
            return -1
        step = 1
        while (found := await first_at_or_after(low + step)) is not None:
            low, step = found, step * 2
        high = low + step  # no ledger at or after it
        while high - low > 1:
            found = await first_at_or_after((low + high) // 2)
            if found is None:
                high = (low + high) // 2
            else:
                low = found
        return low


async def max_held_ledger_id(bookies: Iterable[str], secret: bytes
                             ) -> tuple[int | None, dict[str, str]]:
    """The highest ledger id any of ``bookies`` holds (None when none answered; -1 when
    they hold nothing) and the bookies that did not answer, with why."""
    from ledgerd.errors import LedgerdError

    found: list[int] = []
    unreachable: dict[str, str] = {}

    async def one(address: str) -> None:
        try:
            found.append(await _max_held_ledger_id(address, secret))
        except (RebuildError, LedgerdError, OSError, trio.BrokenResourceError) as exc:
            unreachable[address] = str(exc) or type(exc).__name__

    async with trio.open_nursery() as nursery:
        for b in sorted(set(bookies)):
            nursery.start_soon(one, b)
    return (max(found) if found else None), unreachable


async def read_first_entries(wanted: dict[int, list[str]], *, chunk: int = 1000
                             ) -> dict[int, bytes]:
    """Entry 0 of each ledger in ``wanted`` (ledger -> its holders): one connection per
    bookie, every bookie at once, reads pipelined ``chunk`` at a time; a ledger no
    holder answers for is left out (its digest type is then assumed)."""
    from ledgerd.bookie_client import open_bookie_client
    from ledgerd.errors import LedgerdError
    from ledgerd.wire.messages import ReadRequest, ReadResponse
    from ledgerd.wire.status import Status

    out: dict[int, bytes] = {}
    pending = dict(wanted)
    while pending:
        by_bookie: dict[str, list[int]] = {}
        for lid, holders in pending.items():
            if holders:
                by_bookie.setdefault(holders[0], []).append(lid)
        if not by_bookie:
            break

        async def from_bookie(address: str, lids: list[int]) -> None:
            try:
                async with open_bookie_client(address, connect_timeout=5) as c:
                    for i in range(0, len(lids), chunk):
                        part = lids[i:i + chunk]
                        replies = await c.call_many([ReadRequest(ledger_id=lid, entry_id=0)
                                                     for lid in part])
                        for lid, (st, resp) in zip(part, replies, strict=True):
                            if st == Status.OK and isinstance(resp, ReadResponse):
                                out[lid] = bytes(resp.entry)
            except (LedgerdError, OSError, trio.BrokenResourceError):
                pass

        async with trio.open_nursery() as nursery:  # every bookie at once
            for address, lids in sorted(by_bookie.items()):
                nursery.start_soon(from_bookie, address, lids)
        # Ledgers not read yet are tried on their next holder.
        pending = {lid: holders[1:] for lid, holders in pending.items()
                   if lid not in out and len(holders) > 1}
    return out


def snapshot_ledgers(snap: Snapshot | None) -> dict[int, LedgerMetadata]:
    from ledgerd.metadata.paths import ledger_id_from_path

    if snap is None:
        return {}
    out = {}
    layout = snap.layout
    for n in snap.nodes:
        if category(n.path, layout) == "ledgers":
            lid = ledger_id_from_path("", layout, "/" + n.path)
            out[lid] = LedgerMetadata.from_json(n.data, n.path)
    return out


async def plan(store: MetadataStore | None, root: str, layout: str, gathered: Gathered,
               snap: Snapshot | None) -> Plan:
    """The plan: live ledgers are left alone; digest types are read from the bookies
    (entry 0) for ledgers the snapshot does not describe."""
    from ledgerd.metadata.kafka_topics import TopicStore
    from ledgerd.metadata.ledgers import LedgerManager
    from ledgerd.metadata.logheader import (
        CorruptLogHeaderError,
        LogHeader,
        decode_log_header,
        payload_of_entry,
    )
    from ledgerd.metadata.logs import LogStore
    from ledgerd.metadata.paths import kafka_root
    from ledgerd.metadata.rebuild import detect_digest

    live: set[int] = set()
    if store is not None and await store.exists(f"{root}/LAYOUT") is not None:
        async for lid in LedgerManager(store, root, layout).iter_ledger_ids():
            live.add(lid)
    known = snapshot_ledgers(snap)
    digests: dict[int, str] = {}
    headers: dict[int, LogHeader] = {}
    firsts = await read_first_entries({
        lid: [h.bookie_id for h in gathered.held[lid] if h.holds(0)]
        for lid in sorted(set(gathered.held) - live - set(known))})
    for lid, first in firsts.items():
        if first:
            digests[lid] = detect_digest(first)
            try:
                header = decode_log_header(payload_of_entry(first, digests[lid]))
            except CorruptLogHeaderError as exc:
                gathered.corrupt_headers[lid] = str(exc)
                continue
            if header is not None:
                headers[lid] = header
    snap_layout = snap.layout if snap else ""  # a scan of the nodes: once, not per node
    logs = [n.path for n in snap.nodes if category(n.path, snap_layout) == "logs"] if snap \
        else []
    live_logs: list[str] = []
    live_topics: list[str] = []
    if live:
        live_logs = await LogStore(store, f"{root.rstrip('/')}/logs").names() \
            if store is not None else []
    if store is not None and await store.exists(root) is not None:
        live_topics = await TopicStore(store, kafka_root(root)).names()
    snap_topics = [n.path.rsplit("/", 1)[-1] for n in snap.nodes
                   if category(n.path, snap_layout) == "kafka_topics"] if snap else []
    return plan_rebuild(RebuildInput(held=gathered.held, live=frozenset(live), snapshot=known,
                                     digests=digests, snapshot_logs=logs,
                                     now_ms=int(time.time() * 1000), headers=headers,
                                     live_logs=frozenset(live_logs),
                                     live_topics=frozenset(live_topics),
                                     snapshot_topics=frozenset(snap_topics)))


async def apply_plan(store: MetadataStore, root: str, layout: str, instance: str,
                     the_plan: Plan) -> int:
    """Write the plan's ledgers (GC frozen first; the root made if missing, LAYOUT
    last), then its logs; returns how many ledgers were written. A ledger or log created
    meanwhile is left alone; a restored ledger (``update``) is written over only while
    its live metadata still ends with the snapshot's fragments and is OPEN."""
    from ledgerd.metadata.backup import advance_counter, create_nodes, set_freeze
    from ledgerd.metadata.cluster import FIXED_NODES, _layout_bytes
    from ledgerd.metadata.errors import NodeExistsError
    from ledgerd.metadata.kafka_topics import TopicStore
    from ledgerd.metadata.ledger import LedgerState
    from ledgerd.metadata.ledgers import LedgerManager
    from ledgerd.metadata.logs import LogRecord, LogStore
    from ledgerd.metadata.paths import kafka_root

    has_layout = await store.exists(f"{root}/LAYOUT") is not None
    if not has_layout:
        if await store.exists(root) is None:
            await store.create(root, make_parents=True)
        for name in FIXED_NODES:
            try:
                await store.create(f"{root}/{name}")
            except NodeExistsError:
                pass
        try:
            await store.create(f"{root}/INSTANCEID", instance.encode())
        except NodeExistsError:
            pass
    await set_freeze(store, root, "metadata rebuilt from the bookies; check it, then clear "
                                  "with `ledgerd shell metadata gc-freeze --clear`")
    ledgers = LedgerManager(store, root, layout)
    updates = {p.ledger_id: p.update for p in the_plan.ledgers}
    written = 0
    top = max((p.ledger_id for p in the_plan.writable), default=-1)
    limit = trio.Semaphore(16)  # the ZooKeeper store's own limit

    async def write(lid: int, md: LedgerMetadata) -> None:
        nonlocal written
        async with limit:
            if updates.get(lid):
                live, version = await ledgers.read(lid)
                if live.state is LedgerState.OPEN and \
                        md.ensembles[:len(live.ensembles)] == live.ensembles:
                    await ledgers.write(lid, replace(live, ensembles=md.ensembles), version)
                    written += 1
                return
            for _ in range(3):
                try:
                    await ledgers.create(md, ledger_id=lid)
                    written += 1
                    return
                except NodeExistsError:
                    # The ledger itself (created meanwhile: left alone), or one of its
                    # parent directories made by a parallel create: then try again.
                    if await ledgers.exists(lid):
                        return
            raise RebuildError(f"could not create ledger {lid}'s metadata")

    # The parent directories first (shared by up to 10,000 ledgers each, one depth at a
    # time), then every ledger node pipelined (``create_nodes``), in bounded chunks so
    # only one chunk's JSON is held at once. A ledger whose node exists is left alone;
    # any other failure takes the one-at-a-time path, which retries.
    paths = {p.ledger_id: ledgers.path(p.ledger_id) for p in the_plan.writable}
    parents = sorted({parent for path in paths.values()
                      for parent in _parents(path, root)}, key=lambda x: (x.count("/"), x))
    for depth in sorted({x.count("/") for x in parents}):
        await create_nodes(store, [(x, b"") for x in parents if x.count("/") == depth])
    # restored ledgers brought up to date (``update``) go the one-at-a-time way: their
    # nodes exist, and they are written over by compare-and-set
    slow: list[LedgerPlan] = [p for p in the_plan.writable if updates.get(p.ledger_id)]
    chunk = 5000
    plans = [p for p in the_plan.writable if not updates.get(p.ledger_id)]
    for i in range(0, len(plans), chunk):
        part = plans[i:i + chunk]
        errors = await create_nodes(store, [(paths[p.ledger_id], _json(p)) for p in part])
        for p, err in zip(part, errors, strict=True):
            if err is None:
                written += 1
            elif not isinstance(err, NodeExistsError):
                slow.append(p)
    async with trio.open_nursery() as nursery:
        for p in slow:
            assert p.metadata is not None
            nursery.start_soon(write, p.ledger_id, p.metadata)
    # Every planned ledger is read back (pipelined): one missing is written again the
    # slow way, and one still missing fails the rebuild rather than leaving it short
    # in silence (a 100,000-ledger bench round found 48,803 after an apply that
    # reported no error; not reproduced).
    read_many = getattr(store, "read_many", None)
    if read_many is not None:
        found = await read_many([paths[p.ledger_id] for p in plans])
        missing = [p for p, got in zip(plans, found, strict=True) if got is None]
        async with trio.open_nursery() as nursery:
            for p in missing:
                assert p.metadata is not None
                nursery.start_soon(write, p.ledger_id, p.metadata)
        if missing and any(got is None for got in
                           await read_many([paths[p.ledger_id] for p in missing])):
            raise RebuildError(f"{len(missing)} planned ledger(s) were missing after the "
                               "writes and could not all be written again")
    if top >= 0:
        await advance_counter(store, f"{root}/idgen", top + 1)
    logs = LogStore(store, f"{root.rstrip('/')}/logs")
    for lp in the_plan.logs:
        try:
            await logs.create(lp.name, LogRecord(lp.ledgers, lp.base, first_seq=lp.first_seq,
                                                 writers=lp.writers))
        except NodeExistsError:
            pass  # created meanwhile: left alone
    topics = TopicStore(store, kafka_root(root))
    for tp in the_plan.topics:
        try:
            await topics.create(tp.name, tp.record)
        except NodeExistsError:
            pass  # created meanwhile (a gateway, an operator): left alone
    if not has_layout:
        await store.create(f"{root}/LAYOUT", _layout_bytes(layout))
    return written


def _parents(path: str, root: str) -> list[str]:
    """The directories between ``root`` (excluded) and ``path`` (excluded)."""
    parts = path[len(root):].strip("/").split("/")[:-1]
    return [root + "/" + "/".join(parts[:k]) for k in range(1, len(parts) + 1)]


def _json(p: LedgerPlan) -> bytes:
    assert p.metadata is not None
    return p.metadata.to_json()


async def close_rebuilt(zk: str, the_plan: Plan, cluster_secret: bytes) -> dict[int, str]:
    """Fence and close every ledger the plan wrote OPEN, by the protocol's recovery with
    the cluster's recovery credential (bookies must hold the same cluster secret);
    returns per ledger "closed at N" or the error. If cancelled, a ledger may be left
    IN_RECOVERY and fenced: the next recovery finishes it."""
    import ledgerd
    from ledgerd.errors import LedgerdError
    from ledgerd.metadata.ledger import LedgerState
    from ledgerd.replication import Credentials, ReplicationOptions, _close

    out: dict[int, str] = {}
    creds = Credentials(cluster_secret=cluster_secret)
    async with ledgerd.open_client(zk) as client:
        for p in the_plan.writable:
            assert p.metadata is not None
            if p.metadata.state is not LedgerState.OPEN:
                continue
            try:
                md, _ = await client.ledgers.read(p.ledger_id)
                closed = await _close(client, p.ledger_id, md, creds, ReplicationOptions())
                out[p.ledger_id] = f"closed at {closed.last_entry_id}"
            except LedgerdError as exc:
                out[p.ledger_id] = f"not closed: {exc}"
    return out
