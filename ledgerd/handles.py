"""Ledger handles: ``WriteHandle`` (create) and ``ReadHandle`` (open), over trio.

A write handle runs a ``LedgerWriter`` through an ``AddPipeline``. ``append`` awaits
durability (Qa bookies have journaled the entry and every earlier one completed);
``submit`` only waits for room (the throttle and the outstanding-adds cap) and returns
a ``PendingAppend`` to await later, so one task can keep thousands of appends in flight.
Ensemble changes CAS the metadata (``change_ensemble``); a handle whose ledger was
fenced or closed under it fails, and so does every pending and later append.

Both handles read: ``read(first, last)`` is an async iterator of verified entries with
failover across each entry's write set; ``read_lac`` asks the bookies;
``wait_lac_beyond`` long-polls until the LAC passes an entry.

Handles know their client only as ``ClientServices``: the pool, the nursery, the
flusher, the metrics, the ledger manager and placement, never the ``Client`` itself.
"""

from __future__ import annotations

import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterable
from dataclasses import dataclass
from typing import Any

import trio

from ledgerd.base.logs import fields
from ledgerd.bookies import BookiePool
from ledgerd.config import ClientConfig
from ledgerd.deadlines import DeadlineSleep
from ledgerd.errors import (
    LeadershipLostError,
    LedgerClosedError,
    LedgerFencedError,
    LedgerHandleError,
    LedgerUnavailableError,
    NotEnoughBookiesError,
    ReadBeyondLacError,
    refused,
)
from ledgerd.machines.changes import (
    ClosedChangeError,
    FencedChangeError,
    TermChangedError,
    change_ensemble,
    close_as_writer,
    failure_kind,
)
from ledgerd.machines.placement import Placement, choose_ensemble, choose_replacements
from ledgerd.machines.reads import FollowerLac
from ledgerd.machines.throttle import TokenBucket
from ledgerd.machines.writer import FailureKind, LedgerWriter
from ledgerd.metadata.errors import ChangeRejectedError, MetadataError
from ledgerd.metadata.ledger import LedgerMetadata
from ledgerd.metadata.ledgers import LedgerManager
from ledgerd.metrics import ClientMetrics
from ledgerd.pipeline import AddPipeline, EnsembleChangeError, SendFlusher
from ledgerd.reads import LedgerView, fetch_range, long_poll, read_lac
from ledgerd.wire.compression import compress_payload
from ledgerd.wire.entry import (
    ENTRY_HEADER_SIZE,
    Entry,
    encode_lac_body,
)
from ledgerd.wire.errors import MessageTooLargeError
from ledgerd.wire.frames import encode_request
from ledgerd.wire.messages import NO_MASTER_KEY, AddFlags, AddRequest, WriteLacRequest
from ledgerd.wire.status import UnauthorizedError

__all__ = ["ClientServices", "PendingAppend", "ReadHandle", "WriteHandle"]

log = logging.getLogger(__name__)
_READ_WINDOW = 64
_READ_WINDOW_MAX = 1024
_SUBMIT_CHUNK = 1024  # submit_many's entries per machine call (at most)


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientServices:
    """What a handle uses of the client that made it: its connections and nursery
    (background work ends with the client), its send flusher, metrics, ledger metadata,
    and the bookies placement chooses from (``writable_bookies``, ``placement``)."""

    config: ClientConfig
    pool: BookiePool
    nursery: trio.Nursery
    flusher: SendFlusher
    metrics: ClientMetrics
    ledgers: LedgerManager
    rng: random.Random
    writable_bookies: Callable[[], Awaitable[set[str]]]
    placement: Callable[[], Awaitable[Placement]]


class PendingAppend:
    """An append in flight: ``await p`` (or ``await p.wait()``) gives its entry id once
    durable, or raises the handle's error."""

    __slots__ = ("_callback", "_error", "_event", "completed_at", "done", "entry_id",
                 "submitted_at")

    def __init__(self, entry_id: int, submitted_at: float) -> None:
        self.entry_id = entry_id
        self.done = False
        self.submitted_at = submitted_at
        self.completed_at = 0.0  # trio.current_time() when it became durable (or failed)
        self._error: BaseException | None = None
        self._event: trio.Event | None = None
        self._callback: Callable[[PendingAppend], None] | None = None

    def _finish(self, at: float, error: BaseException | None = None) -> None:
        self.done = True
        self.completed_at = at
        self._error = error
        if self._event is not None:
            self._event.set()
        if self._callback is not None:
            self._callback(self)

    @property
    def error(self) -> BaseException | None:
        """Why the append failed (None while pending or once durable)."""
        return self._error

    def on_done(self, callback: Callable[[PendingAppend], None]) -> None:
        """Call ``callback(self)`` (in the client's trio thread) once the append is durable
        or failed; at once if it already is. One callback per append: no task waits."""
        if self.done:
            callback(self)
        else:
            self._callback = callback

    async def wait(self) -> int:
        await self._wait_done()
        if self._error is not None:
            raise self._error
        return self.entry_id

    async def _wait_done(self) -> None:
        if not self.done:
            if self._event is None:
                self._event = trio.Event()
            await self._event.wait()

    def __await__(self) -> Generator[Any, None, int]:
        return self.wait().__await__()


class _HandleBase:
    def __init__(self, services: ClientServices, ledger_id: int, metadata: LedgerMetadata, version: int,
                 view: LedgerView) -> None:
        self.services = services
        self.ledger_id = ledger_id
        self.metadata = metadata
        self.version = version
        self._view = view
        self._lac = metadata.last_entry_id if metadata.is_closed else -1

    @property
    def last_add_confirmed(self) -> int:
        """The last entry known to be confirmed (durable on an ack quorum)."""
        return self._lac

    @property
    def ensemble_size(self) -> int:
        return self.metadata.ensemble_size

    @property
    def is_closed(self) -> bool:
        return self.metadata.is_closed

    def _sync_view(self) -> LedgerView:
        self._view.metadata = self.metadata
        return self._view

    def _bounds(self, first: int, last: int | None) -> int:
        lac = self.last_add_confirmed
        if last is None:
            last = lac
        if first < 0:
            raise ValueError(f"first entry {first} is negative")
        if first < self.metadata.start_entry:
            raise ValueError(f"ledger {self.ledger_id}: entries before "
                             f"{self.metadata.start_entry} were trimmed (asked from {first})")
        if last > lac:
            raise ReadBeyondLacError(self.ledger_id, last, lac)
        return last

    async def read(self, first: int = 0, last: int | None = None) -> AsyncIterator[Entry]:
        """Entries ``first..last`` (default: up to the last confirmed entry), verified,
        fetched 64 at a time at first, then in windows doubling up to 1024. An
        unbounded ledger's no-op entries (the ends of its terms' recoveries) are
        skipped."""
        last = self._bounds(first, last)
        start, window = first, _READ_WINDOW
        while start <= last:
            end = min(last, start + window - 1)
            for entry in await self.read_batch(start, end):
                yield entry
            start = end + 1
            # A long read grows its window (one round of requests each), so the first
            # entries come soon and a whole-ledger scan pays few round trips.
            window = min(window * 2, _READ_WINDOW_MAX)

    async def read_batch(self, first: int, last: int) -> list[Entry]:
        """Entries ``first..last`` at once: ReadRange per run, per-entry failover."""
        last = self._bounds(first, last)
        if first > last:
            return []
        metrics = self.services.metrics
        t0 = trio.current_time() if metrics.enabled else 0.0
        entries = await fetch_range(self._sync_view(), first, last)
        if metrics.enabled:
            metrics.read_latency.observe(trio.current_time() - t0)
        if self.metadata.unbounded:
            return [e for e in entries if e.length >= 0]
        return entries

    async def read_entry(self, entry_id: int) -> bytes:
        """One entry's payload (an unbounded ledger's no-op entry reads as ValueError)."""
        async for e in self.read(entry_id, entry_id):
            return e.payload
        raise ValueError(f"ledger {self.ledger_id}: entry {entry_id} is a no-op entry (the "
                         "end of a term's recovery), not data")


class ReadHandle(_HandleBase):
    """A ledger opened for reading (after recovery, or without it)."""

    def __init__(self, services: ClientServices, ledger_id: int, metadata: LedgerMetadata, version: int,
                 view: LedgerView) -> None:
        super().__init__(services, ledger_id, metadata, version, view)
        # An unbounded ledger's LAC, heard from a bookie, is read up to only with metadata
        # read after it was heard (a deposed leader's values can sit on bookies the held
        # fragment list still names; docs/client.md, "Following an unbounded ledger").
        self._follow = FollowerLac(unbounded=metadata.unbounded, lac=self._lac)

    @property
    def length(self) -> int:
        return self.metadata.length

    async def refresh(self) -> LedgerMetadata:
        """Re-read the metadata (a ledger opened without recovery may have closed since;
        an unbounded ledger's later fragments and terms)."""
        covers = self._follow.metadata_read_begins()
        self.metadata, self.version = await self.services.ledgers.read(
            self.ledger_id, fresh=self.metadata.unbounded)
        closed = self.metadata.is_closed
        self._follow.on_metadata(
            covers, last_entry_id=self.metadata.last_entry_id if closed else None)
        self._lac = self.metadata.last_entry_id if closed else self._follow.readable
        return self.metadata

    async def _heard(self, lac: int) -> None:
        """A LAC the bookies told: on a bounded ledger it is readable at once; on an
        unbounded one once the metadata has been read again after hearing it. If
        cancelled (or the metadata read fails), the LAC stays where it was."""
        if self._follow.on_lac(lac):
            await self.refresh()
        elif not self.metadata.is_closed:
            self._lac = self._follow.readable

    async def read_lac(self) -> int:
        """Ask the bookies for the last confirmed entry; never moves backwards. On an
        unbounded ledger a new LAC also re-reads the metadata (one read per call that
        finds the LAC moved), so that entries up to it are read where they are now."""
        if self.metadata.is_closed:
            return self._lac
        await self._heard(await read_lac(self._sync_view()))
        return self._lac

    async def wait_lac_beyond(self, entry_id: int, timeout: float = 10.0) -> int:
        """Wait (long polls) until the LAC passes ``entry_id`` or ``timeout`` ends; returns
        the LAC then (``<= entry_id`` on timeout). A closed ledger returns at once. On an
        unbounded ledger, as ``read_lac``: a LAC that moved re-reads the metadata."""
        with trio.move_on_after(timeout):
            while self._lac <= entry_id and not self.metadata.is_closed:
                poll = min(timeout, 10.0)
                lac = await long_poll(self._sync_view(), max(self._lac, entry_id), poll)
                if lac > self._lac:
                    await self._heard(lac)
                    break
                await self.refresh()  # nothing moved: has it been closed?
        return self._lac

    async def close(self) -> None:
        """Nothing to release on the bookies; present for symmetry with WriteHandle."""

    async def __aenter__(self) -> ReadHandle:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def add_frame_overhead(digest_size: int) -> int:
    """Bytes an Add frame carrying one entry spends on everything but its payload."""
    empty = AddRequest(ledger_id=0, first_entry_id=0, master_key=NO_MASTER_KEY, entries=(b"",))
    return len(encode_request(empty, 0, 0)) - 4 + ENTRY_HEADER_SIZE + digest_size + 32


class WriteHandle(_HandleBase):
    """A ledger this client created and writes; one writer per ledger."""

    def __init__(self, services: ClientServices, ledger_id: int, metadata: LedgerMetadata, version: int,
                 view: LedgerView, key: bytes, *, last_add_confirmed: int = -1,
                 length: int = 0) -> None:
        super().__init__(services, ledger_id, metadata, version, view)
        cfg = services.config
        # An unbounded ledger's writer holds the metadata's term (its writing term),
        # writes with the guaranteed write quorum, and rolls fragments.
        self.term = metadata.term if metadata.unbounded else 0
        self._key = key
        self._compress = metadata.compression == "zstd"
        self._digester = view.digester
        self._max_frame = cfg.max_frame_bytes
        self._max_payload = cfg.max_frame_bytes - add_frame_overhead(view.digester.size)
        first, ensemble = metadata.last_ensemble
        writer = LedgerWriter(metadata.ensemble_size, metadata.write_quorum,
                              metadata.ack_quorum, ensemble,
                              last_add_confirmed=last_add_confirmed, length=length,
                              add_timeout=cfg.add_entry_timeout_ms / 1000,
                              guaranteed_write_quorum=metadata.unbounded,
                              fragment_first=first,
                              fragment_entries=cfg.unbounded_fragment_entries
                              if metadata.unbounded else 0)
        self._scope = trio.CancelScope()
        self._pipeline = AddPipeline(services.pool, services.nursery, ledger_id, key, writer,
                                     flags=AddFlags.NONE, term=self.term,
                                     digester=self._digester, replace=self._replace,
                                     on_completed=self._completed, on_failed=self._failed,
                                     on_released=self._progress_made,
                                     on_timer_changed=self._wake_service,
                                     flusher=services.flusher)
        self._waiters: dict[int, PendingAppend] = {}
        self._error: LedgerHandleError | UnauthorizedError | None = None
        self._closing = False
        self._closed = False
        self._progress = trio.Event()
        self._throttle = TokenBucket(cfg.throttle, now=trio.current_time())
        self.max_outstanding = max(1, cfg.max_inflight_per_bookie // 2)
        self._lac_interval = cfg.explicit_lac_interval_ms / 1000
        self._lac_written = -1
        self._last_activity = trio.current_time()
        # The service task sleeps until the next deadline; with none, until an append,
        # a completion or an ensemble change wakes it.
        self._sleep = DeadlineSleep()
        services.nursery.start_soon(self._service)

    # -- state -------------------------------------------------------------------------

    @property
    def last_add_confirmed(self) -> int:
        return self._pipeline.writer.lac

    @property
    def length(self) -> int:
        return self._pipeline.writer.length

    @property
    def outstanding(self) -> int:
        return len(self._waiters)

    @property
    def ensemble(self) -> tuple[str, ...]:
        return tuple(self._pipeline.writer.ensemble)

    @property
    def ensemble_changes(self) -> int:
        return self._pipeline.ensemble_changes

    def _check_usable(self) -> None:
        if self._error is not None:
            raise self._error
        if self._closing or self._closed:
            raise LedgerClosedError(self.ledger_id, "handle is closed")

    # -- appends -----------------------------------------------------------------------

    async def submit(self, data: bytes) -> PendingAppend:
        """Append one entry; returns at once (after the throttle and the outstanding cap)
        with its id in a PendingAppend to await for durability. The entry goes out with
        every entry submitted beside it once this task yields (the client's flusher).

        Raises MessageTooLargeError (the handle stays usable) for an entry that cannot
        fit one frame of ``max_frame_bytes`` with its headers.

        If cancelled, the entry was not sent (cancellation can only land in the throttle
        or the outstanding-cap wait, before the entry gets an id).
        """
        self._check_usable()
        now = trio.current_time()
        if self._throttle.rate:
            delay = self._throttle.take(now)
            if delay > 0:
                await trio.sleep(delay)
                now = trio.current_time()
                self._check_usable()
        if self._in_flight() >= self.max_outstanding:
            while self._in_flight() >= self.max_outstanding and self._error is None:
                await self._wait_progress()
            now = trio.current_time()
            self._check_usable()
        return self._submit_now(data, now)

    async def submit_many(self, items: Iterable[bytes]) -> list[PendingAppend]:
        """``submit`` for several entries, in order: they go out together (one encode
        pass, one machine call, one AddRequest per bookie for up to 256 of them), which
        costs a fraction of as many ``submit`` calls. Returns once all are sent, with a
        PendingAppend for each.

        Raises MessageTooLargeError, sending none of them, if any entry cannot fit one
        frame. If cancelled (in the throttle or the outstanding-cap wait) or if the
        handle fails meanwhile, a prefix of them may have been sent, as with ``submit``
        called in a loop.
        """
        self._check_usable()
        if self._compress:
            payloads = [self._payload(d) for d in items]
        else:
            payloads = [d if type(d) is bytes else bytes(d) for d in items]
            if payloads and max(map(len, payloads)) > self._max_payload:
                for d in payloads:
                    self._payload(d)  # raises for the first one too large
        out: list[PendingAppend] = []
        i = 0
        while i < len(payloads):
            while self._in_flight() >= self.max_outstanding and self._error is None:
                await self._wait_progress()
            self._check_usable()
            room = self.max_outstanding - self._in_flight()
            chunk = payloads[i:i + min(room, _SUBMIT_CHUNK)]
            now = trio.current_time()
            if self._throttle.rate:
                delay = self._throttle.take(now, len(chunk))
                if delay > 0:
                    await trio.sleep(delay)
                    now = trio.current_time()
                    self._check_usable()
            out += self._submit_chunk(chunk, now)
            i += len(chunk)
        return out

    def _submit_chunk(self, payloads: list[bytes], now: float) -> list[PendingAppend]:
        first = self._pipeline.append_many(payloads, now)
        pending = [PendingAppend(eid, now) for eid in range(first, first + len(payloads))]
        if self._error is not None:  # failed while sending (a synchronous failure)
            for p in pending:
                p._finish(now, self._error)
            self.services.metrics.adds_failed += len(pending)
        else:
            self._waiters.update(zip(range(first, first + len(payloads)), pending, strict=True))
            self.services.metrics.outstanding += len(pending)
        self._last_activity = now
        self._sleep.wake()
        return pending

    def _payload(self, data: bytes) -> bytes:
        """The bytes stored for ``data`` (compressed if the ledger compresses); raises
        MessageTooLargeError for an entry that cannot fit one frame."""
        payload = compress_payload(data) if self._compress else bytes(data)
        if len(payload) > self._max_payload:
            # The call fails alone: sent, the frame would be refused and the refusal
            # would look like a failed bookie (an ensemble change, then a dead handle).
            raise MessageTooLargeError(
                f"an entry of {len(payload)} bytes" + (" (compressed)" if self._compress
                                                        else ""),
                len(payload) + self._max_frame - self._max_payload, self._max_frame)
        return payload

    def _submit_now(self, data: bytes, now: float) -> PendingAppend:
        payload = self._payload(data)
        eid = self._pipeline.defer(payload)
        p = PendingAppend(eid, now)
        if self._error is not None:  # failed while sending (a synchronous failure)
            p._finish(now, self._error)
            self.services.metrics.adds_failed += 1
        else:
            self._waiters[eid] = p
            self.services.metrics.outstanding += 1
        self._last_activity = now
        self._sleep.wake()
        return p

    async def append(self, data: bytes) -> int:
        """Append one entry and wait until it is durable; returns its entry id.

        If cancelled, the entry may exist on some bookies (or become durable later) and
        keeps its id; later appends follow it. Recover the ledger (``open_ledger``)
        before trusting its end.
        """
        return await (await self.submit(data))

    async def append_many(self, items: Iterable[bytes]) -> list[int]:
        """Append entries in order (``submit_many``); returns their ids once all are
        durable (raises the first failure). If cancelled, any prefix of them may have
        been sent and may become durable, as with ``append``."""
        pending = await self.submit_many(items)
        if pending and not pending[-1].done:
            # Appends complete in order: once the last is done, so is every other one.
            await pending[-1]._wait_done()
        return [await p for p in pending]

    def _in_flight(self) -> int:
        """Appends this handle holds: pending ones, and (GWQ) acknowledged ones a slow
        bookie still owes, whose bytes stay for re-sending; a slow peer grows neither
        past ``max_outstanding``."""
        lagging = self._pipeline.writer.lagging
        return len(self._waiters) + (len(lagging) if self._pipeline.writer.gwq else 0)

    async def _wait_progress(self) -> None:
        self._progress = trio.Event() if self._progress.is_set() else self._progress
        await self._progress.wait()

    def _progress_made(self) -> None:
        self._progress.set()

    def _completed(self, entry_ids: tuple[int, ...], lac: int) -> None:
        waiters = self._waiters
        now = trio.current_time()  # once per completed batch, not per entry
        metrics = self.services.metrics
        done = 0
        observe = metrics.add_latency.observe if metrics.enabled else None
        # Appends submitted together (one submit_many chunk) share a submit time: one
        # observation of n, as the bookie does for its add replies.
        t0 = -1.0
        same = 0
        for eid in entry_ids:
            p = waiters.pop(eid, None)
            if p is not None:
                if p._event is None and p._callback is None:  # nobody waits on it yet
                    p.done = True
                    p.completed_at = now
                else:
                    p._finish(now)
                done += 1
                if observe is not None:
                    if p.submitted_at != t0:
                        if same:
                            observe(now - t0, same)
                        t0 = p.submitted_at
                        same = 0
                    same += 1
        if same and observe is not None:
            observe(now - t0, same)
        metrics.adds_ok += done
        metrics.outstanding -= done
        self._progress.set()
        if self._lac_interval and not waiters:
            # An explicit-LAC deadline may start now (the handle went idle), earlier than
            # the add timeout the service sleeps on: end that sleep too (wake() ends only
            # an idle one). Not while appends are pending: the deadline needs none, and
            # each recomputation walks every pending entry.
            self._sleep.interrupt()

    def _failed(self, kind: FailureKind, reason: str, entry_ids: tuple[int, ...]) -> None:
        error: LedgerHandleError | UnauthorizedError
        if kind is FailureKind.FENCED:
            error = LedgerFencedError(self.ledger_id, reason)
        elif kind is FailureKind.TERM:
            error = LeadershipLostError(self.ledger_id, reason)
        elif kind is FailureKind.CLOSED:
            error = LedgerClosedError(self.ledger_id, reason)
        elif kind is FailureKind.UNAUTHORIZED:
            error = refused(self.ledger_id, reason, self._key, self.metadata.password_check)
        elif kind in (FailureKind.NO_BOOKIES, FailureKind.METADATA, FailureKind.UNAVAILABLE):
            error = LedgerUnavailableError(self.ledger_id, reason, kind)
        else:
            error = LedgerHandleError(self.ledger_id, reason)
        self._error = error
        log.warning("ledger_handle_failed", extra=fields(ledger=self.ledger_id, kind=kind.value,
                                                         reason=reason, pending=len(entry_ids)))
        waiters, self._waiters = self._waiters, {}
        now = trio.current_time()
        for p in waiters.values():
            p._finish(now, error)
        self.services.metrics.adds_failed += len(waiters)
        self.services.metrics.outstanding -= len(waiters)
        self._progress.set()

    # -- ensemble change ---------------------------------------------------------------

    async def _replace(self, first: int, failed: dict[int, str],
                       ensemble: tuple[str, ...]) -> tuple[str, ...]:
        services = self.services
        try:
            if failed:
                new = choose_replacements(await services.writable_bookies(), ensemble, failed,
                                          services.rng, avoid=services.pool.recent_failures(),
                                          write_quorum=self.metadata.write_quorum,
                                          placement=await services.placement())
            else:  # a full fragment of an unbounded ledger: a fresh ensemble
                new = choose_ensemble(await services.writable_bookies(), len(ensemble),
                                      services.rng, avoid=services.pool.recent_failures(),
                                      write_quorum=self.metadata.write_quorum,
                                      placement=await services.placement())
        except NotEnoughBookiesError as exc:
            raise EnsembleChangeError(FailureKind.NO_BOOKIES, str(exc)) from exc
        term = self.term
        try:
            self.metadata, self.version = await services.ledgers.update(
                self.ledger_id, lambda md: change_ensemble(md, ensemble, first, new, term))
        except ChangeRejectedError as exc:
            raise EnsembleChangeError(failure_kind(exc), str(exc)) from exc
        except MetadataError as exc:
            raise EnsembleChangeError(FailureKind.METADATA, str(exc)) from exc
        services.metrics.ensemble_changes += 1
        return new

    # -- background: add timeouts and explicit LAC -------------------------------------

    def _wake_service(self) -> None:
        self._sleep.wake()

    def _next_deadline(self) -> float | None:
        """The writer's next add timeout, or the explicit-LAC write, whichever is first.
        The LAC write waits for an idle handle (no appends pending): while some are, its
        deadline would stay in the past and the service task would spin (a completion
        ends the sleep and brings it back)."""
        deadline = self._pipeline.next_deadline()
        writer = self._pipeline.writer
        if (self._lac_interval and self._error is None and not self._waiters
                and writer.published_lac > self._lac_written):
            lac_at = self._last_activity + self._lac_interval
            deadline = lac_at if deadline is None else min(deadline, lac_at)
        return deadline

    async def _service(self) -> None:
        """Sleep until the next deadline, then apply it: no polling while idle."""
        with self._scope:
            while True:
                if not await self._sleep.until(self._next_deadline()):
                    continue
                self._pipeline.on_timer()
                if self._lac_interval and self._error is None:
                    self._maybe_write_lac()

    def _maybe_write_lac(self) -> None:
        w = self._pipeline.writer
        now = trio.current_time()
        if (w.published_lac > self._lac_written and not self._waiters
                and now >= self._last_activity + self._lac_interval):
            # The same sum as the deadline's: ``now - last >= interval`` can be False at
            # that very deadline (1.2 - 1.0 < 0.2 in floating point), and the service
            # task then spun on a deadline that never passed (a mock clock stays there).
            req = self._lac_request(w.published_lac)
            for bookie in w.ensemble:
                self.services.pool.send(bookie, req, lambda *_a: None)

    # -- close -------------------------------------------------------------------------

    async def close(self) -> None:
        """Wait for pending appends, then CAS the metadata to CLOSED at the LAC.

        Raises LedgerFencedError if another client is recovering the ledger, and
        LedgerClosedError if it was closed at an end other than this writer's LAC.
        If cancelled, the ledger may be CLOSED or still OPEN (the CAS may have landed);
        the handle takes no more appends either way, and ``open_ledger`` settles it.
        """
        if self._closed:
            return
        try:
            await self._drain()
            if self._error is not None and not isinstance(self._error, LedgerHandleError):
                raise self._error
            w = self._pipeline.writer
            term = self.term
            try:
                self.metadata, self.version = await self.services.ledgers.update(
                    self.ledger_id, lambda md: close_as_writer(md, w.lac, w.length, term))
            except TermChangedError as exc:
                raise LeadershipLostError(self.ledger_id, str(exc)) from exc
            except FencedChangeError as exc:
                raise LedgerFencedError(self.ledger_id, str(exc)) from exc
            except ClosedChangeError as exc:
                raise LedgerClosedError(self.ledger_id, str(exc)) from exc
        finally:
            self._closed = True
            self._scope.cancel()

    async def _drain(self) -> None:
        """Take no more appends and wait for the pending ones (or the handle's failure)."""
        self._closing = True
        while self._waiters and self._error is None:
            await self._wait_progress()

    def _lac_request(self, lac: int) -> WriteLacRequest:
        self._lac_written = lac
        body = encode_lac_body(self._digester, self.ledger_id, lac)
        return WriteLacRequest(ledger_id=self.ledger_id, lac=lac, master_key=self._key,
                               term=self.term, lac_body=body)

    async def abandon(self) -> None:
        """Stop writing without closing the ledger: wait for pending appends, then take
        no more (an unbounded ledger's writer that is done for now; the next writer
        takes the ledger over). The metadata stays OPEN."""
        if self._closed:
            return
        try:
            await self._drain()
            w = self._pipeline.writer
            if self._error is None and w.published_lac > self._lac_written:
                await self._write_lac_now(w.published_lac)
        finally:
            self._closed = True
            self._scope.cancel()

    async def _write_lac_now(self, lac: int) -> None:
        """Write the LAC to the ensemble and wait for the answers (best effort: a bookie
        that does not answer within the add timeout is skipped), so that readers see the
        last entries of a writer that stops without closing."""
        req = self._lac_request(lac)
        timeout = self.services.config.add_entry_timeout_ms / 1000
        async with trio.open_nursery() as nursery:
            for bookie in self._pipeline.writer.ensemble:
                nursery.start_soon(self.services.pool.call, bookie, req, timeout)

    async def __aenter__(self) -> WriteHandle:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
