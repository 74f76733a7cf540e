"""A partition's retention: which ledgers at the front of its log go, and dropping them.

Kafka deletes whole segments from the front of a partition's log; the gateway drops
whole ledgers (a partition's log rolls to a new ledger every ``log_roll_bytes``), with
Kafka's rules, the active (last) ledger never:

- ``retention.ms``: leading ledgers whose largest timestamp is older than
  ``now - retention.ms`` (Kafka's segment rule: timestamps set upstream need not grow
  with offsets, so the last batch's is a lower bound only; a ledger whose last batch
  is old is read once, through its timestamp summary, before it may go);
- ``retention.bytes``: leading ledgers while the log without them still holds at
  least ``retention.bytes``;
- DeleteRecords' low watermark: leading ledgers whose every record lies before it
  (the next ledger starts at or before it).

The decisions are pure (``retention_cut``, ``ledgers_before``); ``drop_front`` carries
one out through ``Logs.truncate`` (one compare-and-set of the log's ledger list, then
the ledgers are deleted), and ``enforce`` runs them for the partitions a gateway
writes. The partition's first offset then moves to the first kept ledger's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import trio

from ledgerd.base.logs import fields
from ledgerd.errors import LedgerdError, NoSuchLedgerError

if TYPE_CHECKING:
    from ledgerd.client import Client
    from ledgerd.kafka.gateway import Gateway
    from ledgerd.kafka.partitions import PartitionLog

__all__ = ["RETENTION_CHECK_S", "Segment", "apply", "apply_to_unused", "drop_before",
           "drop_front", "dropped_end", "enforce", "keep_from", "last_holding",
           "ledgers_before", "reap", "retention_cut", "run"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class Segment:
    """A closed ledger of the log, as retention sees it."""

    size: int  # bytes
    max_timestamp: int  # the largest timestamp of its records (ms; -1: empty), or a
    # lower bound of it at or after ``now - retention.ms`` (it is kept either way)


def retention_cut(closed: Sequence[Segment], active_size: int, *, now_ms: int,
                  retention_ms: int, retention_bytes: int) -> int:
    """How many leading ledgers of ``closed`` (every ledger but the active one, in log
    order) retention drops (-1 settings: no limit of that kind)."""
    cut = 0
    if retention_ms >= 0:
        while cut < len(closed) and closed[cut].max_timestamp < now_ms - retention_ms:
            cut += 1
    if retention_bytes >= 0:
        total = sum(s.size for s in closed[cut:]) + active_size
        while cut < len(closed) and total - closed[cut].size >= retention_bytes:
            total -= closed[cut].size
            cut += 1
    return cut


def ledgers_before(firsts: Sequence[int | None], offset: int) -> int:
    """How many leading ledgers hold only records before ``offset``: ``firsts`` are the
    ledgers' first offsets in log order (None: an empty ledger), and a ledger is wholly
    before ``offset`` when the next non-empty ledger starts at or before it. The last
    ledger never counts."""
    cut = 0
    for i in range(len(firsts) - 1):
        following = next((f for f in firsts[i + 1:] if f is not None), None)
        if following is None or following > offset:
            break
        cut = i + 1
    return cut


async def drop_front(client: Client, part: PartitionLog, count: int, why: str, *,
                     delay_ms: int = 0) -> int:
    """Drop the log's first ``count`` ledgers (never its last): one compare-and-set of
    the ledger list, then the ledgers are deleted, or ``delay_ms`` later (the topic's
    file.delete.delay.ms: ``reap``). Returns how many went. Raises
    LedgerdError if one of them is still open (a writer that died before closing it:
    its recovery by the next writer closes it) or the list changed at the front.

    The ledger that holds the log's last acknowledged batch is never dropped, even
    when it is past retention: the ledgers after it (a writer's new ledger, one rolled
    by segment.ms right after an append) hold no batch, and a new writer takes the
    log's next offset from the last batch listed; with none, the offsets would start
    again at 0 (as Kafka keeps its log end offset in its active segment's name).
    Beside that, the same compare-and-set raises the log's mark to the next offset
    after the last batch dropped (``dropped_end``), which a new writer's end never
    goes below: a second guard, should the last batch ever go all the same."""
    ledgers = await part.ledgers()
    count = min(count, len(ledgers) - 1)
    if count <= 0:
        return 0
    count = min(count, await last_holding(part, ledgers))
    if count <= 0:
        return 0
    dropped = await client.logs.truncate(part.name, ledgers[count], delay_ms=delay_ms,
                                         mark=await dropped_end(part, ledgers[:count]))
    part.start_moved()
    if delay_ms > 0:
        part.note_deferred(int(time.time() * 1000) + delay_ms)
    log.info("kafka_ledgers_dropped", extra=fields(
        topic=part.topic, partition=part.partition, ledgers=len(dropped), why=why))
    return len(dropped)


async def dropped_end(part: PartitionLog, dropped: Sequence[int]) -> int:
    """The next offset after the last batch in ``dropped`` (0 if none holds one): the
    mark a drop of them records. Raises NoSuchLedgerError."""
    for lid in reversed(dropped):
        end = await part.end_of(lid)
        if end is not None:
            return end
    return 0


def keep_from(holding: Sequence[bool | None]) -> int:
    """How many leading ledgers a drop may take so that the log's end stays listed,
    given for each ledger (in log order) whether it holds an acknowledged batch (None:
    not known, ``PartitionLog.holds_batch``): up to the last one known to hold one;
    with none known, all of them only if every one is known to hold none (the log has
    no end to keep), else none (one not known may be the only one with the end)."""
    for i in range(len(holding) - 1, -1, -1):
        if holding[i]:
            return i
    return len(holding) if all(h is False for h in holding) else 0


async def last_holding(part: PartitionLog, ledgers: Sequence[int]) -> int:
    """``keep_from`` of ``ledgers``, read from the last back to the first known to
    hold a batch. A listed ledger that is gone (compaction swapped it, the list
    changed under the round) counts as not known. A ledger known to hold a batch never
    stops holding it, and the list keeps it until a drop that checked this again, so
    the answer stays safe while the list grows or closes its open ledgers."""
    states: list[bool | None] = []
    for lid in reversed(ledgers):
        try:
            held = await part.holds_batch(lid)
        except NoSuchLedgerError:
            held = None
        states.append(held)
        if held:
            break
    states.reverse()
    return len(ledgers) - len(states) + keep_from(states)


async def drop_before(client: Client, part: PartitionLog, offset: int, *,
                      delay_ms: int = 0) -> int:
    """Drop the leading ledgers that hold only records before ``offset``. The ledgers'
    first offsets are read in log order up to the first one past ``offset`` (those
    after it start later still): one or two reads once the front is trimmed."""
    ledgers = await part.ledgers()
    firsts: list[int | None] = []
    for lid in ledgers:
        try:
            first = await part.first_offset(lid)
        except NoSuchLedgerError:
            first = None
        firsts.append(first)
        if first is not None and first > offset:
            break
    return await drop_front(client, part, ledgers_before(firsts, offset),
                            f"before offset {offset}", delay_ms=delay_ms)


async def reap(client: Client, part: PartitionLog) -> int:
    """Delete the partition's dropped ledgers whose file.delete.delay.ms is over (the
    log's record keeps them until then, so a gateway that dies first leaves them to
    the partition's next writer); returns how many."""
    gone = await client.logs.reap(part.name)
    await part.ledgers()  # the record again: when the next deletion is due
    if gone:
        log.info("kafka_dropped_ledgers_deleted", extra=fields(
            topic=part.topic, partition=part.partition, ledgers=len(gone)))
    return len(gone)


async def enforce(client: Client, part: PartitionLog, *, now_ms: int, retention_ms: int,
                  retention_bytes: int, delay_ms: int = 0) -> int:
    """Apply retention.ms / retention.bytes to the partition (its writer's gateway
    calls this); returns the ledgers dropped. A failure leaves the log as it was and
    is raised (the next round tries again)."""
    ledgers = await part.ledgers()
    if len(ledgers) < 2:
        return 0
    # only the ledgers before the last known to hold a batch may go (``drop_front``):
    # the rest are not looked at (an idle partition's kept ledger, past retention,
    # would otherwise be read whole for its largest timestamp every round)
    limit = min(len(ledgers) - 1, await last_holding(part, ledgers))
    if limit <= 0:
        return 0
    closed: list[Segment] = []
    cutoff = now_ms - retention_ms
    leading = retention_ms >= 0  # every ledger so far is past retention.ms
    for lid in ledgers[:limit]:
        size, newest = await part.ledger_summary(lid)  # its last batch's
        if leading and newest < cutoff:
            newest = max(newest, await part.largest_timestamp(lid))
        leading = leading and newest < cutoff
        closed.append(Segment(size=size, max_timestamp=newest))
    active = 0  # the ledgers kept whatever retention says (an open one's length: 0)
    for lid in ledgers[limit:]:
        try:
            active += (await client.ledger_metadata(lid)).length
        except (NoSuchLedgerError, LedgerdError):
            pass
    cut = retention_cut(closed, active, now_ms=now_ms, retention_ms=retention_ms,
                        retention_bytes=retention_bytes)
    if not cut:
        return 0
    return await drop_front(client, part, cut, "retention", delay_ms=delay_ms)


RETENTION_CHECK_S = 5.0  # how often a gateway applies retention (Kafka: 5 minutes)


async def run(gw: Gateway) -> None:
    """Every RETENTION_CHECK_S, for each partition this gateway leads and has in use
    (``gw.partitions``), and every ``retention_check_interval_ms`` (from the first
    round on) for every other partition it leads too (``apply_to_unused``: a partition
    nobody produced to or fetched from since the gateway started, which Kafka's
    retention covers as well): drop the ledgers that retention.ms / retention.bytes or
    the DeleteRecords low watermark no longer keep, and delete the dropped ledgers
    whose file.delete.delay.ms is over. A partition that fails is logged and tried
    again next round."""

    next_unused = trio.current_time()
    while True:
        await trio.sleep(RETENTION_CHECK_S)
        for (topic, p), part in list(gw.partitions.items()):
            if gw.owns(f"{topic}/{p}"):
                await apply(gw, topic, p, part)
        if trio.current_time() >= next_unused:
            next_unused = trio.current_time() + gw.config.retention_check_interval_ms / 1000
            await apply_to_unused(gw)


async def apply(gw: Gateway, topic: str, p: int, part: PartitionLog, *,
                unused: bool = False) -> None:
    """One partition's retention round (errors logged, never raised); ``unused``: the
    partition was just opened for it, so its log record is read first (when its
    dropped ledgers are due; a partition in use learns that as it reads the record)."""
    record = gw.topic_store.cached(topic)
    if record is None:
        return
    policy = gw.topic_policy(topic)
    try:
        if unused:
            await part.ledgers()
        delay = policy.file_delete_delay_ms
        if record.start_of(p) > 0:
            await drop_before(gw.client, part, record.start_of(p), delay_ms=delay)
        if policy.has_retention:
            await enforce(gw.client, part, now_ms=int(time.time() * 1000),
                          retention_ms=policy.retention_ms,
                          retention_bytes=policy.retention_bytes, delay_ms=delay)
        if part.deferred_due_ms <= int(time.time() * 1000):
            await reap(gw.client, part)
    except Exception as exc:  # this partition waits for the next round
        log.warning("kafka_retention_deferred", extra=fields(
            topic=topic, partition=p, error=repr(exc)))


async def apply_to_unused(gw: Gateway) -> int:
    """A retention round for each partition this gateway leads that is not in use
    here; each is opened for its round only (and let go after it unless a client
    started using it meanwhile). Returns how many were visited."""
    async def visit(topic: str, p: int, part: PartitionLog) -> None:
        await apply(gw, topic, p, part, unused=True)

    try:
        return await gw.each_unused_partition(visit)
    except Exception as exc:  # ZooKeeper away: the next round
        log.warning("kafka_retention_deferred", extra=fields(topic="*", error=repr(exc)))
        return 0
