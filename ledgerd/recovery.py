"""Recovering a ledger over the network: the trio driver of ``LedgerRecovery``.

1. CAS the metadata to IN_RECOVERY (``begin_recovery``; a CLOSED ledger needs nothing).
2. Feed the machine the answers to its fencing reads and recovery reads (FENCE |
   HIGH_PRIORITY, with the master key); a digest that does not verify counts as a
   failed answer, a reply that does not come within the read timeout as a timeout.
3. Re-send every recovered entry, byte for byte, with RECOVERY_ADD through an
   ``AddPipeline``; its ensemble changes stay local to this recovery.
4. On ``Finished``, CAS to CLOSED together with those ensembles (``close_recovered``);
   if another recoverer closed first, its end is adopted.

Anything that stops recovery raises LedgerRecoveryError; the ledger stays IN_RECOVERY
and a later recovery starts over (fencing is idempotent).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable
from functools import partial

import trio

from ledgerd.base.logs import fields
from ledgerd.bookie_client import BookieConnectionError
from ledgerd.bookies import BookiePool
from ledgerd.deadlines import DeadlineSleep
from ledgerd.errors import BadPasswordError, LedgerRecoveryError
from ledgerd.machines.changes import begin_recovery, close_recovered
from ledgerd.machines.placement import NotEnoughBookiesError, choose_replacements
from ledgerd.machines.recovery import (
    Aborted,
    Finished,
    LedgerRecovery,
    Phase,
    RecoveryEffect,
    Rewrite,
    SendFenceRead,
    SendRecoveryRead,
    feed_reply,
)
from ledgerd.machines.writer import FailureKind, LedgerWriter
from ledgerd.pipeline import AddPipeline, EnsembleChangeError
from metadata.ledger import LedgerMetadata
from metadata.ledgers import LedgerManager
from wire.entry import Digester
from wire.messages import AddFlags, Message, ReadFlags, ReadRequest, ReadResponse
from wire.status import Status

__all__ = ["recover_ledger"]

log = logging.getLogger(__name__)
_RECOVERY_READ = ReadFlags.FENCE | ReadFlags.HIGH_PRIORITY


class _Run:
    def __init__(self, pool: BookiePool, nursery: trio.Nursery, ledger_id: int,
                 md: LedgerMetadata, key: bytes, digester: Digester, *, read_timeout: float,
                 add_timeout: float, writable: Callable[[], Awaitable[set[str]]],
                 rng: random.Random) -> None:
        self.pool = pool
        self.nursery = nursery
        self.ledger_id = ledger_id
        self.md = md
        self.key = key
        self.digester = digester
        self.read_timeout = read_timeout
        self.add_timeout = add_timeout
        self.writable = writable
        self.rng = rng
        first, ensemble = md.last_ensemble
        self.machine = LedgerRecovery(md.ensemble_size, md.write_quorum, md.ack_quorum,
                                      ensemble, first, read_timeout=read_timeout)
        self.pipeline: AddPipeline | None = None
        self.ensembles: dict[int, tuple[str, ...]] = {}
        # The timer task's sleep; replies and rewrite changes wake it from idleness.
        self._sleep = DeadlineSleep()
        self.finished: Finished | None = None
        self.aborted: Aborted | None = None
        self.done = trio.Event()

    # -- effects -----------------------------------------------------------------------

    def apply(self, effects: list[RecoveryEffect]) -> None:
        m = self.machine
        for eff in effects:
            if isinstance(eff, SendFenceRead):
                self._read(-1, eff.index, eff.bookie)
            elif isinstance(eff, SendRecoveryRead):
                self._read(eff.entry_id, eff.index, eff.bookie)
            elif isinstance(eff, Rewrite):
                pipeline = self._pipeline()
                entry = eff.entry
                eid = pipeline.append(0, lambda *_a, entry=entry: entry, trio.current_time())
                assert eid == eff.entry_id, (eid, eff.entry_id)
            elif isinstance(eff, Finished):
                self.finished = eff
                self.done.set()
            elif isinstance(eff, Aborted):
                self.aborted = eff
                self.done.set()
        if m.phase in (Phase.DONE, Phase.ABORTED):
            self.done.set()

    def _pipeline(self) -> AddPipeline:
        if self.pipeline is None:
            m = self.machine
            md = self.md
            writer = LedgerWriter(md.ensemble_size, md.write_quorum, md.ack_quorum, m.ensemble,
                                  last_add_confirmed=m.start, add_timeout=self.add_timeout)
            self.pipeline = AddPipeline(
                self.pool, self.nursery, self.ledger_id, self.key, writer,
                flags=AddFlags.RECOVERY_ADD | AddFlags.HIGH_PRIORITY, replace=self._replace,
                on_completed=lambda ids, _lac: self.apply(self.machine.on_rewritten(ids)),
                on_failed=self._rewrite_failed, on_timer_changed=self._wake_timers)
        return self.pipeline

    def _wake_timers(self) -> None:
        self._sleep.wake()

    def _rewrite_failed(self, kind: FailureKind, reason: str, _ids: tuple[int, ...]) -> None:
        self.aborted = Aborted(kind, f"rewriting recovered entries failed: {reason}")
        self.done.set()

    async def _replace(self, first: int, failed: dict[int, str],
                       ensemble: tuple[str, ...]) -> tuple[str, ...]:
        try:
            new = choose_replacements(await self.writable(), ensemble, failed, self.rng,
                                      avoid=self.pool.recent_failures())
        except NotEnoughBookiesError as exc:
            raise EnsembleChangeError(FailureKind.NO_BOOKIES, str(exc)) from exc
        self.ensembles[first] = new  # local until the closing CAS
        return new

    # -- reads -------------------------------------------------------------------------

    def _read(self, entry_id: int, index: int, bookie: str) -> None:
        req = ReadRequest(ledger_id=self.ledger_id, entry_id=entry_id, flags=_RECOVERY_READ,
                          master_key=self.key)
        self.pool.send(bookie, req, partial(self._on_reply, entry_id, index, bookie))

    def _on_reply(self, entry_id: int, index: int, bookie: str, status: int,
                  response: Message | None, error: BookieConnectionError | None) -> None:
        if error is not None:
            self.pool.note_failure(bookie)
            status = Status.IO_ERROR
        entry = response.entry if isinstance(response, ReadResponse) else b""
        if status == Status.OK and not isinstance(response, ReadResponse):
            status = Status.IO_ERROR
        effects, decoded = feed_reply(self.machine, self.digester, self.ledger_id, entry_id,
                                      index, status, entry, trio.current_time())
        if status == Status.OK and decoded is None:
            log.warning("recovery_read_bad_entry", extra=fields(
                ledger=self.ledger_id, entry=entry_id, bookie=bookie))
        self.apply(effects)
        self._sleep.wake()

    def _next_deadline(self) -> float | None:
        deadline = self.machine.next_deadline()
        if self.pipeline is not None:
            rewrite = self.pipeline.next_deadline()
            if rewrite is not None and (deadline is None or rewrite < deadline):
                deadline = rewrite
        return deadline

    async def timers(self) -> None:
        """Read and rewrite timeouts: sleep until the machines' next deadline."""
        while not self.done.is_set():
            if not await self._sleep.until(self._next_deadline()):
                continue
            self.apply(self.machine.on_timer(trio.current_time()))
            if self.pipeline is not None:
                self.pipeline.on_timer()


async def recover_ledger(ledgers: LedgerManager, pool: BookiePool, ledger_id: int, key: bytes,
                         digester: Digester, *, read_timeout: float, add_timeout: float,
                         writable: Callable[[], Awaitable[set[str]]],
                         rng: random.Random) -> tuple[LedgerMetadata, int]:
    """Fence, find the end, rewrite, close; returns the CLOSED metadata and its version.

    Raises BadPasswordError (a bookie refused the key) or LedgerRecoveryError (with the
    FailureKind that stopped it). If cancelled, the ledger stays IN_RECOVERY and fenced,
    with any prefix of the rewrites done; running recovery again finishes it.
    """
    md, version = await ledgers.update(ledger_id, begin_recovery)
    if md.is_closed:
        return md, version
    log.info("recovery_started", extra=fields(ledger=ledger_id,
                                              ensemble=",".join(md.last_ensemble[1])))
    async with trio.open_nursery() as nursery:
        run = _Run(pool, nursery, ledger_id, md, key, digester, read_timeout=read_timeout,
                   add_timeout=add_timeout, writable=writable, rng=rng)
        nursery.start_soon(run.timers)
        run.apply(run.machine.begin(trio.current_time()))
        await run.done.wait()
        nursery.cancel_scope.cancel()
    if run.finished is None:
        aborted = run.aborted or Aborted(FailureKind.UNAVAILABLE, "stopped")
        if aborted.kind is FailureKind.UNAUTHORIZED:
            raise BadPasswordError(ledger_id)
        raise LedgerRecoveryError(ledger_id, aborted.reason, kind=aborted.kind)
    fin = run.finished
    md, version = await ledgers.update(
        ledger_id, lambda cur: close_recovered(cur, run.ensembles, fin.last_entry_id, fin.length))
    log.info("recovery_finished", extra=fields(ledger=ledger_id, last_entry=md.last_entry_id,
                                               length=md.length,
                                               recovered_by_us=md.last_entry_id == fin.last_entry_id))
    return md, version
