"""Recovering a ledger over the network: the trio transport of ``RecoveryRun``.

The driver's logic (requests, reply decoding, effect routing, local ensembles, deadlines)
is ``ledgerd.machines.recovery_run``, which the simulator runs too; this module adds the
metadata CASes, the bookie pool, an AddPipeline for the rewrites, and a timer task.

1. CAS the metadata to IN_RECOVERY (``begin_recovery``; a CLOSED ledger needs nothing).
2. Feed the machine the answers to its fencing reads and recovery reads (FENCE |
   HIGH_PRIORITY, with the master key); a digest that does not verify counts as a
   failed answer, a reply that does not come within the read timeout as a timeout.
3. Re-send every recovered entry, byte for byte, with RECOVERY_ADD through an
   ``AddPipeline``; its ensemble changes stay local to this recovery.
4. On ``Finished``, CAS to CLOSED together with those ensembles (``close_recovered``);
   if another recoverer closed first, its end is adopted.

Anything that stops recovery raises LedgerRecoveryError; the ledger stays IN_RECOVERY
and a later recovery starts over (fencing is idempotent). The one exception: bookies
that refuse the recovery (its key or its principal's role) before its fence covers the
ledger; then the recovery took nothing from the writer and puts the ledger back OPEN
(``_reopen``), so a caller without the right cannot stop a live writer by trying.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable
from functools import partial

import trio

from ledgerd.base.errors import LedgerdError
from ledgerd.base.logs import fields
from ledgerd.bookie_client import BookieConnectionError
from ledgerd.bookies import BookiePool
from ledgerd.deadlines import DeadlineSleep
from ledgerd.errors import LeadershipLostError, LedgerRecoveryError, refused
from ledgerd.machines.changes import (
    TermChangedError,
    abandon_recovery,
    begin_recovery,
    begin_term,
    close_recovered,
    open_term,
)
from ledgerd.machines.placement import NotEnoughBookiesError
from ledgerd.machines.recovery import Aborted, Finished
from ledgerd.machines.recovery_run import RecoveryRun
from ledgerd.machines.writer import FailureKind, LedgerWriter
from ledgerd.metadata.errors import BadVersionError, NoNodeError
from ledgerd.metadata.ledger import LedgerMetadata, LedgerState
from ledgerd.metadata.ledgers import LedgerManager
from ledgerd.pipeline import AddPipeline, EnsembleChangeError
from ledgerd.wire.entry import Digester
from ledgerd.wire.entry_check import EntryCheck
from ledgerd.wire.messages import AddFlags, Message, ReadRequest, ReadResponse
from ledgerd.wire.status import Status, UnauthorizedError

__all__ = ["TakeOver", "recover_ledger", "take_over"]

log = logging.getLogger(__name__)


class _PipelineRewriter:
    """Rewrites through an AddPipeline: batched runs, BUSY retries, the pool.

    Recovered entries arrive one reply at a time; they wait here until the run's timer
    task flushes them (it runs once the connection reader has handled the whole
    received chunk), so a chunk's entries share AddRequests instead of one each.
    """

    def __init__(self, pipeline: AddPipeline, wake: Callable[[], None]) -> None:
        self.pipeline = pipeline
        self.wake = wake
        self.pending: list[bytes] = []
        self.next_id = -1

    def append(self, entry_id: int, entry: bytes, now: float, truncate: bool = False) -> None:
        if truncate:  # a term's no-op: its own pipeline, one entry, sent with TRUNCATE
            self.pipeline.flags |= AddFlags.TRUNCATE
        if not self.pending:
            self.next_id = entry_id
            self.wake()
        assert entry_id == self.next_id + len(self.pending), (entry_id, self.next_id)
        self.pending.append(entry)

    def flush(self, now: float) -> None:
        if self.pending:
            entries, self.pending = self.pending, []
            first = self.pipeline.append_encoded(entries, now)
            assert first == self.next_id, (first, self.next_id)

    def next_deadline(self) -> float | None:
        return self.pipeline.next_deadline()

    def on_timer(self, now: float) -> None:
        self.pipeline.on_timer()


class _Run:
    """The trio transport of one ``RecoveryRun``: reads through the pool, rewrites
    through an AddPipeline, and a timer task sleeping until the run's next deadline."""

    def __init__(self, pool: BookiePool, nursery: trio.Nursery, ledger_id: int,
                 md: LedgerMetadata, key: bytes, digester: Digester | EntryCheck, *,
                 read_timeout: float,
                 add_timeout: float, writable: Callable[[], Awaitable[set[str]]],
                 rng: random.Random, read_window: int = 64, term: int = 0) -> None:
        self.pool = pool
        self.term = term
        self.nursery = nursery
        self.ledger_id = ledger_id
        self.key = key
        self.writable = writable
        self.rng = rng
        self.run = RecoveryRun(md, ledger_id, key, digester, read_timeout=read_timeout,
                               add_timeout=add_timeout, send_read=self._send_read,
                               make_rewriter=self._make_rewriter, read_window=read_window,
                               term=term)
        # The timer task's sleep; replies and rewrite changes wake it from idleness.
        self._sleep = DeadlineSleep()
        self.done = trio.Event()
        self.rewriters: list[_PipelineRewriter] = []  # the rewrites', then a term's no-op

    def _after_input(self) -> None:
        if self.run.is_over:
            self.done.set()
        self._sleep.wake()

    # -- reads -------------------------------------------------------------------------

    def _send_read(self, req: ReadRequest, entry_id: int, index: int, bookie: str) -> None:
        self.pool.send(bookie, req, partial(self._on_reply, entry_id, index, bookie))

    def _on_reply(self, entry_id: int, index: int, bookie: str, status: int,
                  response: Message | None, error: BookieConnectionError | None) -> None:
        if error is not None:
            self.pool.note_failure(bookie)
            status = Status.IO_ERROR
        elif status == Status.OK and not isinstance(response, ReadResponse):
            status = Status.IO_ERROR
        entry = response.entry if isinstance(response, ReadResponse) else b""
        wanted = self.run.machine.wants(entry_id, index)
        if self.run.on_read_reply(entry_id, index, status, entry,
                                  trio.current_time()) is None and status == Status.OK and wanted:
            log.warning("recovery_read_bad_entry", extra=fields(
                ledger=self.ledger_id, entry=entry_id, bookie=bookie))
        self._after_input()

    # -- rewrites ----------------------------------------------------------------------

    def _make_rewriter(self, writer: LedgerWriter) -> _PipelineRewriter:
        pipeline = AddPipeline(
            self.pool, self.nursery, self.ledger_id, self.key, writer,
            flags=AddFlags.RECOVERY_ADD | AddFlags.HIGH_PRIORITY, term=self.term,
            replace=self._replace,
            on_completed=self._rewritten, on_failed=self._rewrite_failed,
            on_timer_changed=self._sleep.wake)
        rewriter = _PipelineRewriter(pipeline, self._sleep.interrupt)
        self.rewriters.append(rewriter)
        return rewriter

    def _rewritten(self, entry_ids: tuple[int, ...], _lac: int) -> None:
        self.run.on_rewritten(entry_ids, trio.current_time())
        self._after_input()

    def _rewrite_failed(self, kind: FailureKind, reason: str, _ids: tuple[int, ...]) -> None:
        self.run.on_rewrite_failed(kind, reason)
        self._after_input()

    async def _replace(self, first: int, failed: dict[int, str],
                       ensemble: tuple[str, ...]) -> tuple[str, ...]:
        try:
            return self.run.choose_replacement(first, failed, ensemble, await self.writable(),
                                               self.rng, avoid=self.pool.recent_failures())
        except NotEnoughBookiesError as exc:
            raise EnsembleChangeError(FailureKind.NO_BOOKIES, str(exc)) from exc

    # -- time --------------------------------------------------------------------------

    async def timers(self) -> None:
        """Rewrites waiting to be sent, then read and rewrite timeouts: sleep until the
        run's next deadline or until rewrites wait."""
        while not self.done.is_set():
            for rewriter in self.rewriters:
                rewriter.flush(trio.current_time())
            if not await self._sleep.until(self.run.next_deadline()):
                continue
            self.run.on_timer(trio.current_time())
            self._after_input()


async def _run(pool: BookiePool, ledger_id: int, md: LedgerMetadata, key: bytes,
               digester: Digester | EntryCheck, *, read_timeout: float, add_timeout: float,
               writable: Callable[[], Awaitable[set[str]]], rng: random.Random,
               read_window: int, term: int = 0) -> tuple[Finished, dict[int, tuple[str, ...]]]:
    """One recovery run to its end: the Finished outcome and its local ensembles.
    Raises ``_Refused`` (a bookie answered UNAUTHORIZED before the fence covered the
    ledger), UnauthorizedError (later), LeadershipLostError (a higher term, with
    ``term``) or LedgerRecoveryError."""
    async with trio.open_nursery() as nursery:
        run = _Run(pool, nursery, ledger_id, md, key, digester, read_timeout=read_timeout,
                   add_timeout=add_timeout, writable=writable, rng=rng,
                   read_window=read_window, term=term)
        nursery.start_soon(run.timers)
        run.run.begin(trio.current_time())
        run._after_input()
        await run.done.wait()
        nursery.cancel_scope.cancel()
    if run.run.finished is None:
        aborted = run.run.aborted or Aborted(FailureKind.UNAVAILABLE, "stopped")
        if aborted.kind is FailureKind.UNAUTHORIZED:
            error = refused(ledger_id, aborted.reason, key, md.password_check)
            if not run.run.machine.coverage.covered:
                raise _Refused(error)
            raise error
        if aborted.kind is FailureKind.TERM:
            raise LeadershipLostError(ledger_id, aborted.reason)
        raise LedgerRecoveryError(ledger_id, aborted.reason, kind=aborted.kind)
    return run.run.finished, dict(run.run.ensembles)


class _Refused(LedgerdError):
    """The bookies refused the recovery before its fence covered the ledger: its key or
    its principal's role (``error`` says which). Nothing the old writer needs was taken
    from it, so the ledger need not stay IN_RECOVERY."""

    def __init__(self, error: UnauthorizedError) -> None:
        super().__init__(str(error))
        self.error = error


async def _reopen(ledgers: LedgerManager, ledger_id: int, md: LedgerMetadata,
                  version: int, reason: str) -> None:
    """Put back OPEN a ledger this recovery moved to IN_RECOVERY and the bookies then
    refused, with one compare-and-set at the version the recovery wrote: if anyone
    wrote since (another recoverer's begin, a worker), it stays as they left it.

    Why this is safe: while the version is ours no other recovery has begun (each
    writes at its begin), so nobody relies on the metadata staying put; a bookie that
    did accept a fence stays fenced, and the writer that adds there next is stopped
    by it (FENCED) as by any recovery. Left IN_RECOVERY, the ledger would fail its live
    writer's next ensemble change or close (LedgerFencedError) for a recovery that
    never had the right to run."""
    try:
        await ledgers.write(ledger_id, abandon_recovery(md), version)
    except (BadVersionError, NoNodeError):
        log.info("recovery_refused_left_in_recovery", extra=fields(
            ledger=ledger_id, reason=reason))
        return
    log.warning("recovery_refused_ledger_reopened", extra=fields(ledger=ledger_id,
                                                                 reason=reason))


async def recover_ledger(ledgers: LedgerManager, pool: BookiePool, ledger_id: int, key: bytes,
                         digester: Digester | EntryCheck, *, read_timeout: float, add_timeout: float,
                         writable: Callable[[], Awaitable[set[str]]],
                         rng: random.Random, read_window: int = 64,
                         ) -> tuple[LedgerMetadata, int]:
    """Fence, find the end, rewrite, close; returns the CLOSED metadata and its version.

    Raises UnauthorizedError (a bookie refused the key or the caller's role:
    BadPasswordError, or AccessDeniedError saying which) or LedgerRecoveryError (with
    the FailureKind that stopped it). A recovery the bookies refused before its fence
    covered the ledger puts the ledger back OPEN if this call moved it to IN_RECOVERY
    and nobody wrote the metadata since (``_reopen``); any other failure, and
    cancellation, leave it IN_RECOVERY and fenced, with any prefix of the rewrites
    done; running recovery again finishes it.

    ``digester`` may be an unkeyed ``EntryCheck`` (an HMAC ledger without its password):
    replicas must then agree, and a disagreement or bytes failing the checks raise
    LedgerRecoveryError with ``FailureKind.CORRUPT`` before anything unvouched is
    rewritten; only a recovery with the password can finish that ledger.
    """
    was: list[LedgerState] = []

    def begin(cur: LedgerMetadata) -> LedgerMetadata:
        was.append(cur.state)
        return begin_recovery(cur)

    md, version = await ledgers.update(ledger_id, begin)
    if md.is_closed:
        return md, version
    log.info("recovery_started", extra=fields(ledger=ledger_id,
                                              ensemble=",".join(md.last_ensemble[1])))
    try:
        fin, ensembles = await _run(pool, ledger_id, md, key, digester,
                                    read_timeout=read_timeout, add_timeout=add_timeout,
                                    writable=writable, rng=rng, read_window=read_window)
    except _Refused as refusal:
        if was[-1] is LedgerState.OPEN and not md.unbounded:
            await _reopen(ledgers, ledger_id, md, version, str(refusal.error))
        raise refusal.error from None
    md, version = await ledgers.update(
        ledger_id, lambda cur: close_recovered(cur, ensembles, fin.last_entry_id, fin.length))
    log.info("recovery_finished", extra=fields(ledger=ledger_id, last_entry=md.last_entry_id,
                                               length=md.length,
                                               recovered_by_us=md.last_entry_id == fin.last_entry_id))
    return md, version


class TakeOver:
    """What a takeover leaves a new leader: the metadata at its writing term, the
    metadata version, and the last entry (the no-op) and length its writes follow."""

    def __init__(self, md: LedgerMetadata, version: int, last_entry_id: int,
                 length: int) -> None:
        self.md = md
        self.version = version
        self.last_entry_id = last_entry_id
        self.length = length


async def take_over(ledgers: LedgerManager, pool: BookiePool, ledger_id: int, key: bytes,
                    digester: Digester, *, read_timeout: float, add_timeout: float,
                    writable: Callable[[], Awaitable[set[str]]], rng: random.Random,
                    read_window: int = 64) -> TakeOver:
    """Become the writer of an unbounded ledger: raise the term by CAS,
    recover the tail in that term (term reads, rewrites at the whole write quorum, a
    TRUNCATE no-op), then CAS it OPEN at the next term.

    Raises LeadershipLostError if another writer raised the term meanwhile (at a
    bookie or at either CAS), UnauthorizedError, or LedgerRecoveryError. If cancelled,
    the ledger stays IN_RECOVERY at the raised term; the next takeover starts over.
    A takeover the bookies refuse leaves it so too: the term was raised in the
    metadata first and terms never go back, unlike a bounded ledger's
    refused recovery (``abandon_recovery``). Nothing was taken from the ledger: the
    next leader's takeover raises the term again and opens it, and a replication
    worker that must heal it takes it over after its grace period
    (``replication._heal_open``); the deposed writer sees LeadershipLostError.
    """
    try:
        md, _ = await ledgers.update(ledger_id, begin_term)
    except TermChangedError as exc:
        raise LeadershipLostError(ledger_id, str(exc)) from exc
    term = md.term
    log.info("term_started", extra=fields(ledger=ledger_id, term=term,
                                          ensemble=",".join(md.last_ensemble[1])))
    try:
        fin, ensembles = await _run(pool, ledger_id, md, key, digester,
                                    read_timeout=read_timeout, add_timeout=add_timeout,
                                    writable=writable, rng=rng, read_window=read_window,
                                    term=term)
    except _Refused as refusal:
        raise refusal.error from None
    try:
        md, version = await ledgers.update(
            ledger_id, lambda cur: open_term(cur, term, ensembles, fin.noops))
    except TermChangedError as exc:
        raise LeadershipLostError(ledger_id, str(exc)) from exc
    log.info("term_opened", extra=fields(ledger=ledger_id, term=md.term,
                                         noop=fin.last_entry_id, length=fin.length))
    return TakeOver(md, version, fin.last_entry_id, fin.length)
