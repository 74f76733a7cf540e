"""Autorecovery: the auditor and the replication workers, as supervised trio services.

Runs inside a bookie (``auto_recovery_daemon_enabled = true``) or standalone
(``ledgerd autorecovery --conf F``); both take the bookie's config file. ZooKeeper layout
and BookKeeper's behaviour: ``metadata.underreplication`` and docs/autorecovery.md.

**Auditor.** One per cluster, elected through ZooKeeper (lowest ``V_`` vote). While
elected it

- watches bookie membership and audits lost bookies when ``AuditSchedule`` says so: it
  scans every ledger's metadata (throttled) and marks each ledger that references a bookie
  no longer registered as underreplicated, naming those bookies;
- watches the ``lostBookieRecoveryDelay`` node (``triggeraudit`` rewrites it);
- audits at start (a single lost bookie then still gets its delay), and every
  ``auditor_periodic_bookie_check_interval_s``;
- checks every ledger every ``auditor_periodic_check_interval_s``: the first and last
  entry each available bookie of each final fragment should hold, throttled to
  ``auditor_check_reads_per_s``; a bookie that does not answer OK is marked missing.
  The same pass counts fragments whose write sets break rack placement (reported in
  metrics and the log; ``recover --ledger`` re-places on request);
- follows each ledger it marks that is still open with a lost bookie in its last
  fragment (an unbounded ledger's live writer, or one the workers wait for): a watch on
  its metadata marks it again the moment a writer's ensemble change makes that
  fragment final, so it is copied now, not at the next periodic check.

**Workers.** ``replication_workers`` loops per process, each taking one ledger at a time
from the queue with a lock (a shuffled walk, so workers spread), and running
``ledgerd.replication.rereplicate_ledger`` on it:

- whole again (or deleted): the record is deleted at the version the lock saw, so a
  re-mark meanwhile keeps it queued;
- an open ledger whose last fragment lacks a bookie: the lock is kept for
  ``open_ledger_rereplication_grace_period_ms`` (its writer, if alive, replaces the
  bookie itself; a change of the ledger's metadata ends the wait early for a pass over
  the finished fragments); then the worker fences and closes it and copies the rest,
  or, for an unbounded ledger, heals its open fragment up to the LAC without touching
  its writer (``ledgerd.replication``);
- a failure: the lock is kept for a time that doubles per failure of that ledger, up to
  ``lock_release_of_failed_ledger_grace_period_ms``, so a ledger nobody can copy (no
  surviving replica: counted as unrecoverable) is not hammered.

Both obey the ``disable`` switch, and both survive a ZooKeeper session loss: on LOST they
stop what they hold (their ephemeral votes and locks are gone) and stand again or
resume on the new session.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import trio

from ledgerd.appliance.audit_schedule import AuditSchedule
from ledgerd.appliance.config import BookieConfig
from ledgerd.appliance.durability import (
    DurabilityGauges,
    register_durability_metrics,
    track_durability,
)
from ledgerd.appliance.metrics import BookieMetrics
from ledgerd.base.logs import fields
from ledgerd.base.settings import ConfigError
from ledgerd.bookie_client import Connect, tcp_connect
from ledgerd.client import Client, open_client
from ledgerd.config import ClientConfig
from ledgerd.errors import first_of
from ledgerd.machines.checker import fragments
from ledgerd.machines.placement import Placement, rack_violations
from ledgerd.machines.throttle import TokenBucket
from ledgerd.metadata.errors import MetadataError, NoNodeError
from ledgerd.metadata.ledger import LedgerMetadata
from ledgerd.metadata.store import MetadataStore, SessionEvent, WatchKind
from ledgerd.metadata.underreplication import AuditorElection, UnderreplicationManager
from ledgerd.replication import (
    Credentials,
    Outcome,
    ReplicationOptions,
    probe_failures,
    rereplicate_ledger,
)

__all__ = [
    "Auditor",
    "AutoRecoveryOptions",
    "AutoRecoveryStats",
    "ReplicationWorker",
    "SessionLostError",
    "run_autorecovery",
]

log = logging.getLogger(__name__)

CHECK_ALL_CTIME = "checkallledgersctime"
BOOKIE_CHECK_CTIME = "bookiecheckctime"


class SessionLostError(MetadataError):
    """The ZooKeeper session expired under an auditor or worker (it starts over)."""


@dataclass(frozen=True)
class AutoRecoveryOptions:
    worker_id: str
    lost_bookie_delay_s: int = 0
    periodic_check_s: float = 604800.0
    periodic_bookie_check_s: float = 86400.0
    check_reads_per_s: float = 200.0
    metadata_reads_per_s: float = 1000.0
    open_ledger_grace_s: float = 30.0
    backoff_s: float = 5.0
    failed_lock_cap_s: float = 300.0
    workers: int = 2
    durability_interval_s: float = 60.0
    max_held_locks: int = 1000  # ledgers a process keeps locked (waiting or backing off)
    replication: ReplicationOptions = field(default_factory=ReplicationOptions)

    @classmethod
    def from_config(cls, config: BookieConfig, worker_id: str) -> AutoRecoveryOptions:
        rate = max(0, config.replication_rate_by_bytes)
        return cls(
            worker_id=worker_id,
            lost_bookie_delay_s=config.lost_bookie_recovery_delay_s,
            periodic_check_s=float(config.auditor_periodic_check_interval_s),
            periodic_bookie_check_s=float(config.auditor_periodic_bookie_check_interval_s),
            check_reads_per_s=float(config.auditor_check_reads_per_s),
            metadata_reads_per_s=float(config.auditor_metadata_reads_per_s),
            open_ledger_grace_s=config.open_ledger_rereplication_grace_period_ms / 1000,
            backoff_s=config.rw_rereplicate_backoff_ms / 1000,
            failed_lock_cap_s=config.lock_release_of_failed_ledger_grace_period_ms / 1000,
            workers=config.replication_workers,
            durability_interval_s=float(config.auditor_durability_interval_s),
            replication=ReplicationOptions(batch_entries=config.rereplication_entry_batch_size,
                                           outstanding=config.rereplication_outstanding_batches,
                                           rate_bytes=rate))


@dataclass
class AutoRecoveryStats:
    """Counters for metrics and status (one per process), and the in-process signal
    from the auditor to the workers that it marked something."""

    is_auditor: bool = False
    audits: int = 0
    checks: int = 0
    ledgers_marked: int = 0
    underreplicated: int = 0
    placement_violations: int = 0
    ledgers_replicated: int = 0
    fragments_copied: int = 0
    entries_copied: int = 0
    bytes_copied: int = 0
    failures: int = 0
    unrecoverable: int = 0
    open_ledgers_closed: int = 0
    session_restarts: int = 0
    durability: DurabilityGauges = field(default_factory=DurabilityGauges)
    marked_event: trio.Event = field(default_factory=trio.Event, repr=False)

    def kick(self) -> None:
        """The auditor marked ledgers: wake this process's idle workers."""
        self.marked_event.set()
        self.marked_event = trio.Event()


async def guarded(store: MetadataStore, body: Callable[[], Awaitable[None]]) -> None:
    """Run ``body`` until it returns or the session is LOST (then SessionLostError)."""
    lost = False
    async with trio.open_nursery() as nursery:
        async def watch(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            nonlocal lost
            async with store.session_events() as events:
                task_status.started()
                async for event in events:
                    if event is SessionEvent.LOST:
                        lost = True
                        nursery.cancel_scope.cancel()
                        return

        await nursery.start(watch)
        await body()
        nursery.cancel_scope.cancel()
    if lost:
        raise SessionLostError("ZooKeeper session expired")


_RESTARTABLE = (MetadataError, OSError)


async def _restarting(name: str, store: MetadataStore, body: Callable[[], Awaitable[None]],
                      backoff_s: float, stats: AutoRecoveryStats) -> None:
    """Run ``body`` for ever, starting over after a session loss or a metadata error."""
    delay = min(1.0, backoff_s) or 0.1
    while True:
        try:
            await guarded(store, body)
            return
        except Exception as raised:  # alone, or every member of a nursery's group
            exc = first_of(raised, _RESTARTABLE)
            if exc is None:
                raise
            stats.session_restarts += 1
            log.warning(f"{name}_restarting", extra=fields(error=str(exc), in_s=delay))
            await trio.sleep(delay)
            delay = min(max(backoff_s, 1.0), delay * 2)


# -- the auditor ------------------------------------------------------------------------

class Auditor:
    def __init__(self, client: Client, opts: AutoRecoveryOptions,
                 stats: AutoRecoveryStats) -> None:
        self.client = client
        self.store = client.store
        self.opts = opts
        self.stats = stats
        root = client.config.zk_ledgers_root_path
        self.urm = UnderreplicationManager(self.store, root)
        self.election = AuditorElection(self.store, root)
        self._following: set[int] = set()
        self._nursery: trio.Nursery | None = None
        self._meta_bucket = TokenBucket(opts.metadata_reads_per_s, now=trio.current_time())
        self._read_bucket = TokenBucket(opts.check_reads_per_s, now=trio.current_time())

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        await _restarting("auditor", self.store, self._term, self.opts.backoff_s, self.stats)

    async def _term(self) -> None:
        try:
            async with self.election.candidacy(self.opts.worker_id) as candidate:
                await candidate.wait_elected()
                log.info("auditor_elected", extra=fields(auditor=self.opts.worker_id))
                await self._lead()
        finally:
            self.stats.is_auditor = False

    async def _lead(self) -> None:
        delay = await self.urm.ensure_lost_bookie_delay(self.opts.lost_bookie_delay_s)
        members = await self.client.registry.list_bookies()
        self.schedule = AuditSchedule(members.all, float(delay))
        self._wake = trio.Event()
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._watch_bookies)
            nursery.start_soon(self._watch_delay)
            nursery.start_soon(self._periodic_bookie_check)
            nursery.start_soon(self._periodic_ledger_check)
            nursery.start_soon(track_durability, self.client, self.stats.durability,
                               self.opts.durability_interval_s, self.opts.metadata_reads_per_s)
            await self._startup_audit()
            self.stats.is_auditor = True
            await self._scheduler()

    def _poke(self) -> None:
        self._wake.set()

    async def _watch_bookies(self) -> None:
        async with self.client.registry.watch_bookies() as snapshots:
            async for snapshot in snapshots:
                self.schedule.on_membership(snapshot.all, trio.current_time())
                self._poke()

    async def _watch_delay(self) -> None:
        version: int | None = None
        async with self.store.watch(self.urm.delay_path, WatchKind.DATA) as events:
            async for _ in events:
                try:
                    raw, stat = await self.store.get(self.urm.delay_path)
                except NoNodeError:
                    continue
                if version is not None and stat.version != version:
                    try:
                        value = float(int(raw.decode().strip()))
                    except ValueError:
                        log.warning("lost_bookie_delay_unreadable", extra=fields(value=raw))
                        continue
                    log.info("lost_bookie_delay_written", extra=fields(delay_s=value))
                    self.schedule.on_delay_written(value, trio.current_time())
                    self._poke()
                version = stat.version

    async def _scheduler(self) -> None:
        while True:
            deadline = self.schedule.next_deadline()
            self._wake = trio.Event()
            with trio.move_on_at(deadline if deadline is not None else float("inf")):
                await self._wake.wait()
            if self.schedule.take_due(trio.current_time()):
                await self.audit_bookies()

    async def _startup_audit(self) -> None:
        """At election: a bookie referenced but not registered may have been lost just
        now; one such bookie gets the delay, several are audited at once."""
        index = await self._bookie_index()
        members = await self.client.registry.list_bookies()
        lost = set(index) - set(members.all)
        if len(lost) == 1 and self.schedule.delay_s > 0:
            self.schedule.delay_audit(lost, trio.current_time())
            log.info("auditor_delaying_audit", extra=fields(
                bookies=",".join(sorted(lost)), delay_s=self.schedule.delay_s))
            self._poke()
        elif lost:
            await self._mark(index, lost)

    async def _bookie_index(self) -> dict[str, set[int]]:
        """bookie -> the ledgers whose ensembles reference it (every ledger's metadata,
        read at ``auditor_metadata_reads_per_s``)."""
        index: dict[str, set[int]] = {}
        async for lid, md in self._all_metadata():
            for _, ensemble in md.ensembles:
                for b in ensemble:
                    index.setdefault(b, set()).add(lid)
        return index

    async def _all_metadata(self) -> AsyncIterator[tuple[int, LedgerMetadata]]:
        async for lid in self.client.ledgers.iter_ledger_ids():
            md = await self._paced_read(lid)
            if md is not None:  # else deleted while we walked
                yield lid, md

    async def _paced_read(self, lid: int) -> LedgerMetadata | None:
        """The ledger's metadata within the auditor's metadata read rate; None if it
        was deleted."""
        wait = self._meta_bucket.take(trio.current_time())
        if wait:
            await trio.sleep(wait)
        try:
            md, _ = await self.client.ledgers.read(lid)
        except NoNodeError:
            return None
        return md

    async def audit_bookies(self) -> None:
        """Mark every ledger that references a bookie no longer registered."""
        if not await self.urm.is_enabled():
            log.info("auditor_waiting_for_enable")
            await self.urm.wait_enabled()
        index = await self._bookie_index()
        members = await self.client.registry.list_bookies()
        lost = set(index) - set(members.all) - self.schedule.pending
        self.stats.audits += 1
        if lost:
            await self._mark(index, lost)
        await self.urm.set_check_time(BOOKIE_CHECK_CTIME, int(time.time() * 1000))

    async def _mark(self, index: dict[str, set[int]], lost: set[str]) -> None:
        per_ledger: dict[int, list[str]] = {}
        for bookie in sorted(lost):
            for lid in index.get(bookie, ()):
                per_ledger.setdefault(lid, []).append(bookie)
        for lid, bookies in sorted(per_ledger.items()):
            await self.urm.mark_underreplicated(lid, bookies)
        self.stats.ledgers_marked += len(per_ledger)
        self.stats.kick()
        log.warning("auditor_marked_underreplicated", extra=fields(
            lost=",".join(sorted(lost)), ledgers=len(per_ledger)))
        if self._nursery is not None:
            for lid in per_ledger:
                if lid not in self._following:
                    self._following.add(lid)
                    self._nursery.start_soon(self._follow_open, lid)

    async def _follow_open(self, lid: int) -> None:
        """Until the ledger's last fragment lists no lost bookie (or it is closed or
        deleted): on every change of its metadata, mark it if a final fragment lists a
        bookie that is not registered."""
        try:
            async with self.client.ledgers.watch(lid) as changes:
                async for _ in changes:
                    md = await self._paced_read(lid)
                    if md is None:
                        return
                    registered = (await self.client.registry.list_bookies()).all
                    missing = final_fragments_missing(md, registered)
                    if missing:
                        await self.urm.mark_underreplicated(lid, sorted(missing))
                        self.stats.ledgers_marked += 1
                        self.stats.kick()
                        log.info("auditor_marked_final_fragment", extra=fields(
                            ledger=lid, missing=",".join(sorted(missing))))
                    if md.is_closed or all(b in registered for b in md.last_ensemble[1]):
                        return
        finally:
            self._following.discard(lid)

    async def _periodic_bookie_check(self) -> None:
        interval = self.opts.periodic_bookie_check_s
        if interval <= 0:
            return
        while True:
            await trio.sleep(interval)
            if not self.schedule.waiting_for_delay:
                await self.audit_bookies()

    async def _periodic_ledger_check(self) -> None:
        interval = self.opts.periodic_check_s
        if interval <= 0:
            return
        last = await self.urm.get_check_time(CHECK_ALL_CTIME) / 1000
        await trio.sleep(max(0.0, last + interval - time.time()))
        while True:
            await self.check_all_ledgers()
            await self.urm.set_check_time(CHECK_ALL_CTIME, int(time.time() * 1000))
            await trio.sleep(interval)

    async def check_all_ledgers(self) -> int:
        """Probe every final fragment's first and last entry per available bookie; mark
        the ledgers where one does not answer OK. Returns how many were marked."""
        if not await self.urm.is_enabled():
            await self.urm.wait_enabled()
        members = await self.client.registry.list_bookies(with_racks=True)
        available = members.all
        placement = Placement(members.racks)
        racks = placement.distinct(available)
        violations = 0
        marked = 0
        async for lid, md in self._all_metadata():
            missing = await self._check_ledger(lid, md, available)
            if missing:
                await self.urm.mark_underreplicated(lid, sorted(missing))
                marked += 1
                self.stats.kick()
            if md.is_closed and racks > 1:
                for frag in fragments(md):
                    if rack_violations(frag.ensemble, md.write_quorum, placement, racks):
                        violations += 1
                        log.info("placement_not_rack_aware", extra=fields(
                            ledger=lid, first=frag.first, ensemble=",".join(frag.ensemble)))
        self.stats.checks += 1
        self.stats.ledgers_marked += marked
        self.stats.placement_violations = violations
        self.stats.underreplicated = await self.urm.count()
        log.info("auditor_checked_all_ledgers", extra=fields(marked=marked,
                                                            placement_violations=violations))
        return marked

    async def _check_ledger(self, lid: int, md: LedgerMetadata,
                            available: frozenset[str]) -> set[str]:
        """The bookies that failed a probe (none if the ledger was deleted meanwhile)."""
        failed = await probe_failures(self.client, lid, md, available,
                                      self.opts.replication, self._read_bucket)
        if failed and not await self.client.ledgers.exists(lid):
            return set()
        starts = dict(md.ensembles)
        return {starts[first][index] for first, index in failed}


def final_fragments_missing(md: LedgerMetadata, registered: Collection[str]) -> set[str]:
    """The bookies that final fragments of ``md`` list and that are not registered."""
    return {b for frag in fragments(md) if frag.final
            for b in frag.ensemble if b not in registered}


# -- the workers ------------------------------------------------------------------------

class ReplicationWorker:
    def __init__(self, client: Client, opts: AutoRecoveryOptions, creds: Credentials,
                 stats: AutoRecoveryStats, rng: random.Random | None = None) -> None:
        self.client = client
        self.store = client.store
        self.opts = opts
        self.creds = creds
        self.stats = stats
        self.rng = rng or random.Random()
        self.urm = UnderreplicationManager(self.store, client.config.zk_ledgers_root_path)
        self.failures: dict[int, int] = {}
        self.grace_ends: dict[int, float] = {}  # open ledgers waiting for their writer
        self.locked: set[int] = set()  # ledgers whose lock this worker holds
        self._unlocked = trio.Event()
        self.busy = 0  # ledgers being worked on (for tests and status)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        await _restarting("replication_worker", self.store, self._work, self.opts.backoff_s,
                          self.stats)

    async def _work(self) -> None:
        try:
            async with trio.open_nursery() as held:  # locks kept through a wait
                for _ in range(max(1, self.opts.workers)):
                    held.start_soon(self._loop, held)
        finally:
            # Stopped or restarting: the locks this session still holds would keep the
            # ledgers from every worker until the session ends. (After a session loss
            # they are gone already.)
            with trio.move_on_after(5, shield=True):
                for lid in list(self.locked):
                    try:
                        await self.urm.release_lock(lid)
                    except MetadataError:
                        break
                self.locked.clear()

    async def _loop(self, held: trio.Nursery) -> None:
        while True:
            if not await self.urm.is_enabled():
                log.info("replication_worker_disabled")
                await self.urm.wait_enabled()
            while len(self.locked) >= self.opts.max_held_locks:
                # Every held lock is a ledger waiting out a grace period or a backoff:
                # take no more until one is let go (bounded, however many fail).
                self._unlocked = trio.Event()
                await self._unlocked.wait()
            picked = await self.urm.pick(self.rng, self.opts.worker_id)
            if picked is None:
                await self._idle()
                continue
            self.locked.add(picked[0])
            await self._process(*picked, held, close_open=False)

    async def _idle(self) -> None:
        """Wait for new marks: this process's auditor marked some, the top of the queue
        changed, or the backoff passed (marks from elsewhere under existing
        directories)."""
        kicked = self.stats.marked_event
        with trio.move_on_after(max(self.opts.backoff_s, 0.05)):
            async with trio.open_nursery() as nursery:
                async def top() -> None:
                    async with self.store.watch(f"{self.urm.base}/ledgers",
                                                WatchKind.CHILDREN) as ev:
                        await ev.__anext__()  # the first notification is immediate
                        await ev.__anext__()
                    nursery.cancel_scope.cancel()

                nursery.start_soon(top)
                await kicked.wait()
                nursery.cancel_scope.cancel()

    async def _process(self, lid: int, version: int, held: trio.Nursery, *,
                       close_open: bool) -> None:
        self.busy += 1
        try:
            record = await self.urm.get(lid)  # a scrubber's ranges, if any
            result = await rereplicate_ledger(self.client, lid, self.creds,
                                              self.opts.replication, check=True,
                                              close_open=close_open, progress=self._progress,
                                              reported=record.missing_entries if record else None)
        finally:
            self.busy -= 1
        self.stats.fragments_copied += result.fragments
        if result.closed_by_recovery:
            self.stats.open_ledgers_closed += 1
        if result.outcome is not Outcome.DEFERRED or close_open:
            self.grace_ends.pop(lid, None)
        if result.outcome in (Outcome.REPLICATED, Outcome.DELETED):
            self.failures.pop(lid, None)
            done = await self.urm.mark_replicated(lid, version)
            self._let_go(lid)
            if done:
                self.stats.ledgers_replicated += 1
            log.info("ledger_rereplicated", extra=fields(
                ledger=lid, outcome=result.outcome.value, fragments=result.fragments,
                entries=result.entries, bytes=result.bytes, record_deleted=done))
        elif result.outcome is Outcome.DEFERRED:
            ends = self.grace_ends.setdefault(
                lid, trio.current_time() + self.opts.open_ledger_grace_s)
            log.info("open_ledger_deferred", extra=fields(
                ledger=lid, grace_s=self.opts.open_ledger_grace_s, reason=result.detail))
            held.start_soon(self._after_grace, lid, version, held, ends)
        else:
            n = self.failures[lid] = self.failures.get(lid, 0) + 1
            self.stats.failures += 1
            if result.unreadable:
                self.stats.unrecoverable += 1
            wait = min(self.opts.failed_lock_cap_s, max(self.opts.backoff_s, 0.1) * 2 ** (n - 1))
            if result.no_spare_bookie:
                # Not a failure of the copy: the cluster has no bookie to copy to until
                # one is added or the lost one comes back (a warning, backing off).
                log.warning("rereplication_waiting_for_a_bookie", extra=fields(
                    ledger=lid, reason=result.detail, attempt=n, retry_in_s=wait))
            else:
                log.error("rereplication_failed", extra=fields(
                    ledger=lid, reason=result.detail, attempt=n, retry_in_s=wait,
                    unrecoverable=result.unreadable))
            held.start_soon(self._release_later, lid, wait)

    async def _after_grace(self, lid: int, version: int, held: trio.Nursery,
                           ends: float) -> None:
        """Wait out the grace period of an open ledger's writer; a change of its
        metadata (the writer moved its last fragment, which is then final) ends the
        wait early for a pass that copies final fragments only."""
        with trio.move_on_at(ends):
            try:
                async with self.client.ledgers.watch(lid) as changes:
                    await changes.__anext__()  # the first notification is immediate
                    await changes.__anext__()
            except (NoNodeError, StopAsyncIteration):
                pass  # deleted meanwhile: the pass below finds it gone
        await self._process(lid, version, held, close_open=trio.current_time() >= ends)

    async def _release_later(self, lid: int, wait: float) -> None:
        await trio.sleep(wait)
        await self.urm.release_lock(lid)
        self._let_go(lid)

    def _let_go(self, lid: int) -> None:
        self.locked.discard(lid)
        self._unlocked.set()

    def _progress(self, entries: int, size: int) -> None:
        self.stats.entries_copied += entries
        self.stats.bytes_copied += size


def _stat(stats: AutoRecoveryStats, attr: str) -> float:
    return float(getattr(stats, attr))


def register_autorecovery_metrics(m: BookieMetrics, stats: AutoRecoveryStats) -> None:
    """Autorecovery's counters on a metrics registry (the bookie's, or the standalone
    process's own)."""
    m.gauge("ledgerd_autorecovery_is_auditor", "1 while this process is the auditor.",
            lambda: float(stats.is_auditor))
    m.gauge("ledgerd_autorecovery_underreplicated_ledgers",
            "Ledgers queued as underreplicated (as of the auditor's last check).",
            lambda: stats.underreplicated)
    m.gauge("ledgerd_autorecovery_placement_violations",
            "Fragments whose write sets break rack placement (last periodic check).",
            lambda: stats.placement_violations)
    for name, doc, attr in (
            ("audits", "Lost-bookie audits run.", "audits"),
            ("checks", "Periodic checks of every ledger run.", "checks"),
            ("ledgers_marked", "Ledgers marked underreplicated.", "ledgers_marked"),
            ("ledgers_rereplicated", "Ledgers made whole again.", "ledgers_replicated"),
            ("fragments_copied", "Fragments copied to a replacement.", "fragments_copied"),
            ("entries_copied", "Entries copied.", "entries_copied"),
            ("bytes_copied", "Entry bytes copied.", "bytes_copied"),
            ("failures", "Ledgers whose re-replication failed (retried later).", "failures"),
            ("unrecoverable", "Failures with no readable surviving replica.", "unrecoverable"),
            ("open_ledgers_closed", "Open ledgers fenced and closed after the grace period.",
             "open_ledgers_closed"),
            ("session_restarts", "Auditor/worker restarts after a ZooKeeper session loss.",
             "session_restarts")):
        m.counter(f"ledgerd_autorecovery_{name}", doc, partial(_stat, stats, attr))
    register_durability_metrics(m, stats.durability)


# -- the service ------------------------------------------------------------------------

def client_config_for(config: BookieConfig) -> ClientConfig:
    """The client settings autorecovery runs with (the bookie's cluster, its frame size)."""
    # With TLS on, autorecovery connects to other bookies with TLS too, trusting the
    # bookie's trust file and presenting the bookie's own certificate (issue bookie
    # certificates with the roles autorecovery needs: OU "0:bookie,recovery").
    tls: dict[str, Any] = {}
    if config.tls_certificate_path and config.tls_trust_path:
        tls = {"tls_trust_path": config.tls_trust_path,
               "tls_certificate_path": config.tls_certificate_path,
               "tls_key_path": config.tls_key_path,
               "tls_enabled_protocols": config.tls_enabled_protocols}
    return ClientConfig(zk_servers=config.zk_servers, zk_timeout_ms=config.zk_timeout_ms,
                        zk_ledgers_root_path=config.zk_ledgers_root_path,
                        max_frame_bytes=config.max_frame_bytes, throttle=0, **tls)


def require_secret(config: BookieConfig) -> bytes:
    """The cluster secret, or ConfigError saying autorecovery needs one."""
    secret = config.cluster_secret()
    if not secret:
        raise ConfigError("cluster_secret_file", "", "a file with the cluster secret: "
                          "autorecovery writes with credentials derived from it (`ledgerd "
                          "shell gensecret FILE`, then the same file on every bookie)")
    return secret


async def run_autorecovery(store: MetadataStore, config: BookieConfig, worker_id: str, *,
                           stats: AutoRecoveryStats | None = None,
                           connect: Connect = tcp_connect, auditor: bool = True,
                           task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                           ) -> None:
    """The auditor candidacy and the replication workers of one process, until cancelled.

    Raises ConfigError (before starting) when no cluster secret is configured."""
    secret = require_secret(config)
    opts = AutoRecoveryOptions.from_config(config, worker_id)
    stats = stats if stats is not None else AutoRecoveryStats()
    async with open_client(config=client_config_for(config), store=store,
                           connect=connect) as client:
        worker = ReplicationWorker(client, opts, Credentials(cluster_secret=secret), stats)
        async with trio.open_nursery() as nursery:
            if auditor:
                await nursery.start(Auditor(client, opts, stats).run)
            await nursery.start(worker.run)
            log.info("autorecovery_started", extra=fields(worker=worker_id,
                                                          workers=opts.workers))
            task_status.started()

