"""The log cleaner: compaction passes over the compacted partitions a gateway leads.

Every ``compaction_backoff_ms`` (Kafka: ``log.cleaner.backoff.ms``), for each partition
of a ``cleanup.policy=compact`` topic this gateway leads, ``clean`` runs one pass when
``compaction.should_clean`` says so:

1. the closed ledgers are looked at (never the active, last one; an empty closed ledger
   is skipped) and the cleanable ones chosen (``min.compaction.lag.ms``);
2. the dirty part is read: its transactions followed (``compaction.TxnScan``: the
   aborted ones, and the stable end, before the first one not resolved in the
   cleanable ledgers), and the offset map built below that end
   (``compaction.map_batch``: data records and those of committed transactions, at
   most ``compaction_map_bytes / ENTRY_BYTES`` entries, aborted ranges counted; a full
   map ends the pass's range there, logged and counted in
   ``ledgerd_kafka_compaction_partial_passes``): as it is read up to its first
   transactional batch, from there (if any) in a second read;
3. each cleanable ledger below that range's end is read and its batches compacted
   (``compaction.compact_batch``); one where nothing goes keeps its ledger. Each other
   one is read again and written, batch by batch, into a *replacement*: a new ledger
   with the old one's quorums and custom metadata, its log header's place (entry 0) and
   ``clean-through`` (the pass's range end, where the next pass's dirty part starts)
   and ``compacted-for`` (the log) added, closed when written;
4. ``Logs.replace_ledgers`` puts every replacement in its old ledger's place with one
   compare-and-set of the log's ledger list, refused if one of them is no longer
   listed (retention or a new writer changed the list: the replacements are deleted and
   the next pass starts again), and the old ledgers are deleted the topic's
   ``file.delete.delay.ms`` later (the same compare-and-set puts them on the record's
   deferred deletions: ``Logs.reap``, run by ``retention.reap``), or at once if it is 0.

Crash safety: until the compare-and-set the list names only the old ledgers, after it
only the new ones; each replacement holds every record compaction keeps at its
original offset, so either list serves every key's latest value. A replacement written
by a gateway that died before the swap is on no list: ``sweep_orphans`` (each gateway,
every ``compaction_orphan_age_s / 2``) deletes the ledgers tagged ``compacted-for`` a
log that does not list them once they are ``compaction_orphan_age_s`` old, and a pass
that has run for half that gives up before its swap, so no live pass's ledger is
swept. An old ledger whose deletion after the swap failed (with no delay) is deleted by
the next pass (its replacement's custom metadata names it: ``replaces``); one whose
deletion is deferred stays on the record until it is due, whoever writes the log then.

Readers: a gateway that held the old ledger (its handle, a remembered position, the
read-ahead) gets NoSuchLedgerError or EntryUnavailableError from it once it is
deleted, forgets what it knew of unlisted ledgers and reads again from the list
(``PartitionLog.forget_unlisted``); entry ids and offsets are the same in the
replacement. Until the bookies' GC drops the old ledger's entries, a reader still
holding it reads the uncompacted batches: the same records at the same offsets, more
of them; so does the writer's tail cache, which may still hold the last batches of a
ledger just compacted (it rolled recently), and the read-ahead.

``sweep_orphans`` reads the metadata of every ledger (one ZooKeeper read each), every
``compaction_orphan_age_s / 2`` on every gateway: with many ledgers, keep that age
long (an hour by default).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import trio

from ledgerd.base.crashpoints import crash_point
from ledgerd.base.logs import fields
from ledgerd.errors import NoSuchLedgerError
from ledgerd.kafka.compaction import (
    CLEAN_THROUGH_KEY,
    COMPACTED_LOG_KEY,
    ENTRY_BYTES,
    Compacted,
    LedgerView,
    OffsetMap,
    TxnScan,
    cleanable_prefix,
    compact_batch,
    first_dirty,
    map_batch,
    should_clean,
)
from ledgerd.kafka.records import BatchHeader
from ledgerd.ledgerlog import LogFencedError, NoSuchLogError
from ledgerd.metadata.logheader import first_log_entry

if TYPE_CHECKING:
    from ledgerd.client import Client
    from ledgerd.kafka.gateway import Gateway
    from ledgerd.kafka.metrics import GatewayMetrics
    from ledgerd.kafka.partitions import PartitionLog
    from ledgerd.kafka.topic_configs import TopicPolicy

__all__ = ["CleanerState", "PassResult", "clean", "run", "sweep_orphans"]

log = logging.getLogger(__name__)

REPLACES_KEY = "ledgerd.kafka.replaces"  # a replacement's custom metadata: the old ledger
READ_CHUNK = 64  # entries read at a time
NEVER = 2**63 - 1


@dataclass(slots=True)
class CleanerState:
    """What a gateway remembers of a partition's compaction between passes (lost on
    restart, which costs one pass)."""

    clean_through: int = -1  # the range the last pass covered ended here
    tombstones_due_ms: int | None = None  # when the earliest kept tombstone is due
    swept: bool = False  # old ledgers a crash left after a swap were looked for


@dataclass(frozen=True, slots=True, kw_only=True)
class PassResult:
    ledgers_replaced: int
    records_removed: int
    bytes_before: int  # of the ledgers replaced
    bytes_after: int  # of their replacements
    covered: int  # the pass's range ended at this offset
    map_full: bool
    seconds: float


async def _entries(part: PartitionLog, lid: int, first: int, last: int,
                   ) -> list[bytes]:
    return await part.read_entries(lid, first, last)


async def _views(client: Client, part: PartitionLog,
                 ) -> tuple[list[LedgerView], dict[int, tuple[int, int, dict[str, str]]]]:
    """The log's closed ledgers but the last one (stopping at an open one), and per
    ledger (first entry, last entry, custom metadata)."""
    views: list[LedgerView] = []
    extent: dict[int, tuple[int, int, dict[str, str]]] = {}
    for lid in (await part.ledgers())[:-1]:
        md = await client.ledger_metadata(lid)
        if not md.is_closed:
            break
        custom = dict(md.custom_metadata)
        first = first_log_entry(md.custom_metadata)
        if md.last_entry_id < first:
            continue  # no batch: nothing to compact
        extent[lid] = (first, md.last_entry_id, custom)
        head = await part.batch_header(lid, first)
        tail = await part.batch_header(lid, md.last_entry_id)
        views.append(LedgerView(ledger_id=lid, first_offset=head.base_offset,
                                next_offset=tail.next_offset, size=md.length,
                                max_timestamp=tail.max_timestamp,
                                clean_through=int(custom.get(CLEAN_THROUGH_KEY, "-1"))))
    return views, extent


async def _scan_dirty(part: PartitionLog, cleanable: list[LedgerView],
                      extent: dict[int, tuple[int, int, dict[str, str]]], dirty_from: int,
                      each: Callable[[bytes], int | None]) -> int | None:
    """Call ``each`` (in a worker thread) on the batches of the cleanable ledgers from
    the one holding ``dirty_from`` on, in offset order, until it returns an offset,
    which is returned (None: it never did)."""
    for lv in cleanable:
        if lv.next_offset <= dirty_from:
            continue
        first, last, _ = extent[lv.ledger_id]
        for at in range(first, last + 1, READ_CHUNK):
            batches = await _entries(part, lv.ledger_id, at, min(last, at + READ_CHUNK - 1))

            def chunk(batches: list[bytes] = batches) -> int | None:
                for b in batches:
                    stop = each(b)
                    if stop is not None:
                        return stop
                return None

            stop = await trio.to_thread.run_sync(chunk)
            if stop is not None:
                return stop
    return None


async def _delete_replaced(client: Client, extent: dict[int, tuple[int, int, dict[str, str]]],
                           deferred: frozenset[int]) -> None:
    """Delete old ledgers a crash left after their swap (their replacements name them),
    except those whose deletion the log's record defers (``Logs.reap`` deletes them)."""
    for _, _, custom in extent.values():
        old = custom.get(REPLACES_KEY)
        if old is None or int(old) in deferred:
            continue
        try:
            await client.delete_ledger(int(old))
            log.info("kafka_compaction_old_ledger_deleted", extra=fields(ledger=old))
        except NoSuchLedgerError:
            pass


async def clean(client: Client, part: PartitionLog, policy: TopicPolicy, state: CleanerState,
                *, now_ms: int, map_entries: int, max_pass_s: float,
                ) -> PassResult | None:
    """One compaction pass over ``part`` if one is due (None if not); see the module
    docstring. Raises LogFencedError if the log's list changed meanwhile and LedgerdError
    for a failed read or write: the log is then as it was (replacements written are
    deleted). If cancelled, replacements written may remain on no list
    (``sweep_orphans`` deletes them)."""
    started = trio.current_time()
    views, extent = await _views(client, part)
    if not state.swept:
        record, _ = await client.logs.store.get(part.name)
        await _delete_replaced(client, extent,
                               frozenset(lid for lid, _ in record.deferred))
        state.swept = True
    cleanable = views[:cleanable_prefix(views, now_ms=now_ms,
                                        min_compaction_lag_ms=policy.min_compaction_lag_ms)]
    dirty_from = first_dirty(cleanable, state.clean_through)
    if not should_clean(cleanable, dirty_from=dirty_from,
                        min_dirty_ratio=policy.min_cleanable_dirty_ratio,
                        delete_retention_ms=policy.delete_retention_ms,
                        tombstones_due_ms=state.tombstones_due_ms, now_ms=now_ms):
        return None
    # the dirty part's transactions, then the offset map below its stable end
    omap = OffsetMap(map_entries)
    txns = TxnScan(omap, dirty_from=dirty_from)
    await _scan_dirty(part, cleanable, extent, dirty_from, txns.add)
    stable = txns.stable_end(cleanable[-1].next_offset)
    aborted = txns.aborted

    mapped_to = txns.mapped_to  # what the scan mapped as it read (all, without txns)

    def mapped(batch: bytes) -> int | None:
        if BatchHeader.parse(batch).base_offset >= stable:
            return stable
        return map_batch(omap, batch, dirty_from=mapped_to, aborted=aborted)

    stop = None
    if not txns.map_full and mapped_to < stable:
        stop = await _scan_dirty(part, cleanable, extent, mapped_to, mapped)
    full = txns.map_full or (stop is not None and stop < stable)
    covered = stable if stop is None else min(stop, stable)
    if full:
        log.warning("kafka_compaction_map_full", extra=fields(
            topic=part.topic, partition=part.partition, keys=len(omap),
            aborted_txns=len(aborted), covered=covered))
    # which ledgers lose records
    oldest_tombstone = -1
    changed: list[LedgerView] = []
    removed_total = 0

    def compacted(batches: list[bytes]) -> list[Compacted]:
        return [compact_batch(b, omap, covered=covered, now_ms=now_ms,
                              delete_retention_ms=policy.delete_retention_ms,
                              aborted=aborted)
                for b in batches]

    # the decisions depend only on the batch, the map, covered and the aborted
    # transactions: a replacement removes exactly what was decided here
    for lv in cleanable:
        if lv.first_offset >= covered:
            break
        first, last, _ = extent[lv.ledger_id]
        removed = 0
        for at in range(first, last + 1, READ_CHUNK):
            out = await trio.to_thread.run_sync(compacted, await _entries(
                part, lv.ledger_id, at, min(last, at + READ_CHUNK - 1)))
            removed += sum(c.removed for c in out)
            for c in out:
                if c.oldest_tombstone >= 0:
                    oldest_tombstone = c.oldest_tombstone if oldest_tombstone < 0 \
                        else min(oldest_tombstone, c.oldest_tombstone)
        if removed:
            changed.append(lv)
            removed_total += removed
    # replacements, written batch by batch
    swap: dict[int, int] = {}
    before = after = 0
    listed = await part.ledgers()
    try:
        for lv in changed:
            if trio.current_time() - started > max_pass_s:
                raise LogFencedError(part.name, f"compaction pass over {max_pass_s:.0f} s: "
                                                "given up before its swap")
            first, last, _ = extent[lv.ledger_id]
            if lv.ledger_id not in listed:
                raise LogFencedError(part.name, f"ledger {lv.ledger_id} left the log during "
                                                "the compaction pass (retention?)")
            i = listed.index(lv.ledger_id)
            prev = -1 if i == 0 else swap.get(listed[i - 1], listed[i - 1])
            handle = await client.logs.new_replacement(
                part.name, lv.ledger_id, prev,
                custom={CLEAN_THROUGH_KEY: str(covered), COMPACTED_LOG_KEY: part.name,
                        REPLACES_KEY: str(lv.ledger_id)})
            swap[lv.ledger_id] = handle.ledger_id
            for at in range(first, last + 1, READ_CHUNK):
                out = await trio.to_thread.run_sync(compacted, await _entries(
                    part, lv.ledger_id, at, min(last, at + READ_CHUNK - 1)))
                await handle.append_many([c.batch for c in out])
                crash_point("kafka_compaction.writing")
            if handle.last_add_confirmed != last:
                raise LogFencedError(part.name, f"replacement of ledger {lv.ledger_id} "
                                                f"ends at entry {handle.last_add_confirmed}, "
                                                f"not {last}")
            await handle.close()
            before += lv.size
            after += handle.metadata.length
        if swap:
            crash_point("kafka_compaction.written")
            if trio.current_time() - started > max_pass_s:
                # a replacement older than the orphan age could be swept (deleted as
                # an orphan) by another gateway just as it is listed
                raise LogFencedError(part.name, f"compaction pass over {max_pass_s:.0f} s: "
                                                "given up before its swap")

            def deleting() -> None:
                crash_point("kafka_compaction.swapped")
            await client.logs.replace_ledgers(part.name, swap, deleted=deleting,
                                              delay_ms=policy.file_delete_delay_ms)
            if policy.file_delete_delay_ms > 0:
                part.note_deferred(now_ms + policy.file_delete_delay_ms)
    except BaseException:
        with trio.move_on_after(10, shield=True):
            # Only replacements the log does not list are this pass's to delete: a
            # failure or cancellation after the swap (deleting an old ledger at once,
            # or a compare-and-set ZooKeeper applied before it was cancelled) leaves
            # them listed, holding the partition's records. If the list cannot be
            # read, none is deleted (sweep_orphans takes the unlisted ones later).
            try:
                on_list: set[int] | None = set(await client.logs.ledgers(part.name))
            except Exception:
                on_list = None
            for new in swap.values():
                if on_list is None or new in on_list:
                    continue
                try:
                    await client.delete_ledger(new)
                except Exception as exc:  # sweep_orphans deletes it later
                    log.warning("kafka_compaction_cleanup_failed", extra=fields(
                        ledger=new, error=repr(exc)))
        raise
    if swap:
        await part.forget_unlisted()
    state.clean_through = covered
    state.tombstones_due_ms = NEVER if oldest_tombstone < 0 \
        else oldest_tombstone + policy.delete_retention_ms
    result = PassResult(ledgers_replaced=len(swap), records_removed=removed_total,
                        bytes_before=before, bytes_after=after, covered=covered,
                        map_full=full, seconds=trio.current_time() - started)
    log.info("kafka_compaction_pass", extra=fields(
        topic=part.topic, partition=part.partition, replaced=len(swap),
        removed=removed_total, bytes_before=before, bytes_after=after, covered=covered,
        map_full=full, aborted_txns=len(aborted), open_txns=txns.unresolved,
        seconds=round(result.seconds, 3)))
    return result


async def sweep_orphans(client: Client, *, older_than_s: float) -> list[int]:
    """Delete the replacements no log lists (a pass died before its swap) once they
    are ``older_than_s`` old; returns them."""
    listed: dict[str, set[int]] = {}
    gone: list[int] = []
    now_ms = time.time() * 1000
    async for lid in client.list_ledgers():
        try:
            md = await client.ledger_metadata(lid)
        except NoSuchLedgerError:
            continue
        name = dict(md.custom_metadata).get(COMPACTED_LOG_KEY)
        if name is None or not md.ctime_ms or now_ms - md.ctime_ms < older_than_s * 1000:
            continue
        if name not in listed:
            try:
                listed[name] = set(await client.logs.ledgers(name))
            except NoSuchLogError:
                listed[name] = set()
        if lid in listed[name]:
            continue
        try:
            await client.delete_ledger(lid)
        except NoSuchLedgerError:
            continue
        gone.append(lid)
        log.info("kafka_compaction_orphan_deleted", extra=fields(ledger=lid, log=name))
    return gone


def _count(metrics: GatewayMetrics, result: PassResult) -> None:
    metrics.compaction_passes += 1
    metrics.compaction_partial_passes += result.map_full
    metrics.compaction_records_removed += result.records_removed
    metrics.compaction_bytes_before += result.bytes_before
    metrics.compaction_bytes_after += result.bytes_after


def state_of(states: dict[tuple[str, int], tuple[str, CleanerState]],
             partition: tuple[str, int], topic_id: str) -> CleanerState:
    """What the cleaner remembers of ``partition`` of the topic with ``topic_id``: a
    fresh state when the topic was deleted and made again under its name (a new log,
    whose offsets below the old one's ``clean_through`` no pass has compacted)."""
    kept = states.get(partition)
    if kept is None or kept[0] != topic_id:
        kept = states[partition] = (topic_id, CleanerState())
    return kept[1]


async def run(gw: Gateway) -> None:
    """Every ``compaction_backoff_ms``: a pass (``clean``) for each compacted partition
    this gateway leads and has in use (``gw.partitions``), and every
    ``retention_check_interval_ms`` (from the first round on) for each other compacted
    partition it leads (one nobody used since the gateway started, whose tombstones
    and older values are due all the same); every half ``compaction_orphan_age_s``,
    ``sweep_orphans``. A partition that fails is logged and tried again next round."""

    cfg = gw.config
    # per partition: the topic id its state is of (a topic deleted and made again under
    # the same name is a new log: what a pass remembered of the old one must not count)
    states: dict[tuple[str, int], tuple[str, CleanerState]] = {}
    next_sweep = trio.current_time() + min(60.0, cfg.compaction_orphan_age_s / 2)

    async def one(topic: str, p: int, part: PartitionLog) -> None:
        record = gw.topic_store.cached(topic)
        if record is None:
            return
        policy = gw.topic_policy(topic)  # its configs over the dynamic broker configs'
        if not policy.compact:
            return
        state = state_of(states, (topic, p), record.topic_id)
        try:
            result = await clean(gw.client, part, policy, state,
                                 now_ms=int(time.time() * 1000),
                                 map_entries=cfg.compaction_map_bytes // ENTRY_BYTES,
                                 max_pass_s=cfg.compaction_orphan_age_s / 2)
        except Exception as exc:  # this partition waits for the next round
            gw.metrics.compaction_failures += 1
            log.warning("kafka_compaction_deferred", extra=fields(
                topic=topic, partition=p, error=repr(exc)))
            return
        if result is not None:
            _count(gw.metrics, result)

    def compacted(topic: str) -> bool:
        return gw.topic_policy(topic).compact

    next_unused = trio.current_time()
    while True:
        await trio.sleep(cfg.compaction_backoff_ms / 1000)
        for (topic, p), part in list(gw.partitions.items()):
            if gw.owns(f"{topic}/{p}"):
                await one(topic, p, part)
        for key in [k for k in states if not gw.owns(f"{k[0]}/{k[1]}")]:
            del states[key]
        if trio.current_time() >= next_unused:
            next_unused = trio.current_time() + cfg.retention_check_interval_ms / 1000
            try:
                await gw.each_unused_partition(one, only=compacted)
            except Exception as exc:  # ZooKeeper away: the next round
                log.warning("kafka_compaction_deferred", extra=fields(
                    topic="*", partition=-1, error=repr(exc)))
        if trio.current_time() >= next_sweep:
            next_sweep = trio.current_time() + cfg.compaction_orphan_age_s / 2
            try:
                gw.metrics.compaction_orphans_deleted += len(
                    await sweep_orphans(gw.client, older_than_s=cfg.compaction_orphan_age_s))
                gw.metrics.compaction_sweeps += 1
            except Exception as exc:
                log.warning("kafka_compaction_sweep_deferred", extra=fields(error=repr(exc)))
