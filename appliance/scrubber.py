"""The scrubber: a bookie proves it holds every entry its fragments say it should.

BookKeeper's local scrub (``localScrubPeriod``, ``localScrubRateLimit``) and the
auditor's sampled verification (``auditorLedgerVerificationPercentage``), done by the
bookie on its own storage. One pass right after start (journal replay and the first
checkpoint are done by then), then one every ``local_scrub_period_s``:

1. Walk every ledger in the metadata store (not only those stored here: a bookie that
   lost a whole ledger no longer lists it), at ``auditor_metadata_reads_per_s``.
2. For each ledger whose ensembles name this bookie, the entries it should hold come
   from ``machines.holdings.expected_runs``: every fragment naming it, the write-set
   striping rule, a closed ledger up to its last entry, an open one up to the LAC this
   bookie knows (the highest carried by an entry it stores).
3. ``local_scrub_verification_percentage`` of them (all at 100) are read from local
   storage at ``local_scrub_rate_limit`` entries a second. An entry is *missing* when
   storage does not hold it or cannot read it, or when its bytes do not verify: the
   header must carry this ledger and entry, and a CRC32C/CRC32 digest must match
   (HMAC ledgers are checked by header only: only their password verifies them).
4. A ledger with missing entries is marked under-replicated in the queue
   (``underreplication/ledgers/…/urL<id>``) naming this bookie and the ranges of entry
   ids found missing; the replication workers then copy those fragments from the
   surviving replicas to a replacement bookie (``ledgerd.replication``); a range in an
   open ledger's last fragment is healed after the grace period as a lost bookie's
   would be (a bounded ledger closed, an unbounded one's fragment split at its LAC),
   and the mark stays until every entry is back at Qw. The mark is
   made whether or not autorecovery is enabled: it is a fact about the data, and the
   switch only stops the copying. Logged as ``scrub_found_missing``.

Counts go to metrics (``ledgerd_scrub_*``) and ``/status``. Cancelling a pass loses
nothing: a ledger is marked as soon as its own check ends; the next pass starts over.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import asdict, dataclass
from typing import Any

import trio

from ledgerd.appliance.metrics import BookieMetrics
from ledgerd.base.logs import fields
from ledgerd.disk.errors import EntryNotFoundError, LedgerNotFoundError, StorageError
from ledgerd.disk.storage import LedgerStorage
from ledgerd.machines.holdings import MissingRanges, expected_count, iter_expected_runs, sample
from ledgerd.machines.throttle import TokenBucket
from ledgerd.metadata.errors import NoNodeError
from ledgerd.metadata.ledger import LedgerMetadata
from ledgerd.metadata.ledgers import LedgerManager
from ledgerd.metadata.underreplication import UnderreplicationManager
from ledgerd.wire.entry import Digester, DigestType, decode_entry, peek_entry_header
from ledgerd.wire.errors import WireError

__all__ = ["ScrubOptions", "ScrubPass", "Scrubber", "register_scrub_metrics"]

log = logging.getLogger(__name__)

PAGE_IN_CHUNK = 1024  # entries whose index pages are read ahead in one worker-thread call


@dataclass(frozen=True, slots=True, kw_only=True)
class ScrubOptions:
    period_s: float = 86400.0          # 0: no scrubbing at all
    rate_per_s: float = 1000.0         # entries read a second
    percentage: float = 100.0          # share of the expected entries each pass reads
    metadata_reads_per_s: float = 1000.0

    def __post_init__(self) -> None:
        if self.period_s < 0 or self.rate_per_s <= 0 or self.metadata_reads_per_s <= 0 \
                or not 0 <= self.percentage <= 100:
            raise ValueError(f"bad scrub options: {self}")


@dataclass
class ScrubPass:
    """One pass, as ``status()["scrub"]`` reports it (the running one or the last)."""

    number: int = 0
    started: float = 0.0   # wall clock
    seconds: float = 0.0
    ledgers: int = 0       # ledgers naming this bookie
    entries_expected: int = 0
    entries_checked: int = 0
    entries_missing: int = 0
    entries_corrupt: int = 0  # held but unreadable or not verifying (counted as missing)
    ledgers_marked: int = 0
    done: bool = False


class Scrubber:
    """The scrubber of one bookie; ``ledgers``/``marks`` are set once the bookie has a
    metadata store (without one a pass does nothing)."""

    def __init__(self, storage: LedgerStorage, bookie_id: str, options: ScrubOptions, *,
                 rng: random.Random | None = None) -> None:
        self.storage = storage
        self.bookie_id = bookie_id
        self.options = options
        self.rng = rng or random.Random()
        self.ledgers: LedgerManager | None = None
        self.marks: UnderreplicationManager | None = None
        self.running = False
        self.passes = 0
        self.entries_checked = 0
        self.entries_missing = 0
        self.entries_corrupt = 0
        self.ledgers_marked = 0
        self.seconds_total = 0.0
        self.current: ScrubPass | None = None
        self.last: ScrubPass | None = None
        self.pass_done = trio.Event()
        self._entries = TokenBucket(options.rate_per_s)
        self._metadata = TokenBucket(options.metadata_reads_per_s)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """A pass now, then one every period, until cancelled (period 0: none)."""
        task_status.started()
        if self.options.period_s <= 0:
            return
        while True:
            await self.scrub_once()
            await trio.sleep(self.options.period_s)

    async def scrub_once(self) -> ScrubPass:
        """One pass over every ledger naming this bookie; returns its counts."""
        p = ScrubPass(number=self.passes + 1, started=time.time())
        self.current, self.running = p, True
        t0 = trio.current_time()
        self._entries.at = self._metadata.at = t0
        try:
            if self.ledgers is not None:
                async for lid in self.ledgers.iter_ledger_ids():
                    await self._pace(self._metadata, 1)
                    try:
                        md, _ = await self.ledgers.read(lid)
                    except NoNodeError:
                        continue  # deleted while we walked
                    if any(self.bookie_id in ens for _, ens in md.ensembles):
                        await self._scrub_ledger(lid, md, p)
            p.done = True
        finally:
            p.seconds = trio.current_time() - t0
            self.running, self.current, self.last = False, None, p
            self.passes += 1
            self.seconds_total += p.seconds
            self.pass_done.set()
            self.pass_done = trio.Event()
        log.info("scrub_pass", extra=fields(
            ledgers=p.ledgers, expected=p.entries_expected, checked=p.entries_checked,
            missing=p.entries_missing, corrupt=p.entries_corrupt, marked=p.ledgers_marked,
            seconds=round(p.seconds, 3)))
        return p

    async def _scrub_ledger(self, lid: int, md: LedgerMetadata, p: ScrubPass) -> None:
        storage = self.storage
        held = storage.ledger_exists(lid)
        lac = -1 if md.is_closed or not held else storage.lac(lid)
        p.ledgers += 1
        p.entries_expected += expected_count(iter_expected_runs(md, self.bookie_id, lac))
        digester = (Digester(DigestType(md.digest_type))
                    if md.digest_type in ("crc32c", "crc32") else None)
        found = MissingRanges()
        checked = corrupt = 0
        paged = -1
        runs = iter_expected_runs(md, self.bookie_id, lac)
        for run, e in sample(runs, self.options.percentage, self.rng):
            await self._pace(self._entries, 1)
            if held and e > paged:  # index pages off the event loop, a chunk at a time
                paged = min(run.last, e + PAGE_IN_CHUNK - 1)
                if storage.pages_missing(lid, e, paged - e + 1):
                    await storage.page_in(lid, e, paged - e + 1)
            verdict = self._check(lid, e, digester) if held else "missing"
            corrupt += verdict == "corrupt"
            checked += 1
            found.add(e, verdict == "ok")
        p.entries_checked += checked
        p.entries_missing += found.missing
        p.entries_corrupt += corrupt
        self.entries_checked += checked
        self.entries_missing += found.missing
        self.entries_corrupt += corrupt
        if not found.missing:
            return
        ranges = found.ranges
        log.warning("scrub_found_missing", extra=fields(
            ledger=lid, bookie_id=self.bookie_id, missing=found.missing, corrupt=corrupt,
            held=held, ranges=",".join(f"{a}-{b}" for a, b in ranges[:8])))
        if self.marks is not None and self.ledgers is not None \
                and await self.ledgers.exists(lid):  # not deleted while we read
            await self.marks.mark_underreplicated(lid, [self.bookie_id],
                                                  {self.bookie_id: ranges})
            p.ledgers_marked += 1
            self.ledgers_marked += 1

    def _check(self, lid: int, e: int, digester: Digester | None) -> str:
        """``ok``, ``missing`` (not held) or ``corrupt`` (held, but unreadable or not
        the entry it should be)."""
        try:
            data = self.storage.read_entry(lid, e)
        except (EntryNotFoundError, LedgerNotFoundError):
            return "missing"
        except (StorageError, OSError) as exc:
            log.warning("scrub_unreadable_entry", extra=fields(ledger=lid, entry=e,
                                                               error=repr(exc)))
            return "corrupt"
        try:
            if digester is not None:
                decode_entry(digester, data, ledger_id=lid, entry_id=e)
            else:
                header = peek_entry_header(data)
                if (header.ledger_id, header.entry_id) != (lid, e):
                    return "corrupt"
        except WireError:
            return "corrupt"
        return "ok"

    async def _pace(self, bucket: TokenBucket, n: int) -> None:
        wait = bucket.take(trio.current_time(), n)
        if wait:
            await trio.sleep(wait)
        else:
            await trio.lowlevel.checkpoint_if_cancelled()

    def status(self) -> dict[str, Any]:
        return {"running": self.running, "passes": self.passes,
                "entries_checked": self.entries_checked,
                "entries_missing": self.entries_missing,
                "entries_corrupt": self.entries_corrupt,
                "ledgers_marked": self.ledgers_marked,
                "current": asdict(self.current) if self.current else None,
                "last": asdict(self.last) if self.last else None}


def register_scrub_metrics(m: BookieMetrics, scrubber: Scrubber) -> None:
    """The scrubber's counters on the bookie's metrics registry."""
    m.counter("ledgerd_scrub_passes", "Scrub passes finished.", lambda: scrubber.passes)
    m.counter("ledgerd_scrub_entries_checked", "Entries the scrubber read back.",
              lambda: scrubber.entries_checked)
    m.counter("ledgerd_scrub_entries_missing", "Entries this bookie should hold and does "
              "not (or cannot read, or that do not verify).",
              lambda: scrubber.entries_missing)
    m.counter("ledgerd_scrub_entries_corrupt", "Missing entries that were held but "
              "unreadable or did not verify.", lambda: scrubber.entries_corrupt)
    m.counter("ledgerd_scrub_ledgers_marked", "Ledgers the scrubber marked "
              "under-replicated.", lambda: scrubber.ledgers_marked)
    m.counter("ledgerd_scrub_seconds", "Time spent in scrub passes.",
              lambda: scrubber.seconds_total)
    m.gauge("ledgerd_scrub_running", "1 while a scrub pass runs.",
            lambda: float(scrubber.running))
