"""One recovery attempt, transport-neutral: the logic of the recovery driver.

``LedgerRecovery`` decides; this runs it. It builds the read requests the machine asks
for, turns replies into machine inputs (``feed_reply``: digest check, header fields),
routes the machine's effects (reads out, rewrites into a recovery-mode ``LedgerWriter``,
the outcome kept), chooses replacement bookies for the rewrites and remembers those
ensemble changes locally (they land with the closing CAS), and merges the deadlines of
the machine and the rewrites. It does no I/O and reads no clock.

Two transports run it: the trio client (``ledgerd/recovery.py``: the bookie pool, an
``AddPipeline`` for the rewrites, a sleep until ``next_deadline()``) and the simulator
(``tests/sim``: messages in a seeded world). What differs between them is only how a
request travels and how a rewrite's adds are batched and sent.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection
from typing import Protocol

from ledgerd.machines.placement import choose_replacements
from ledgerd.machines.recovery import (
    Aborted,
    Finished,
    LedgerRecovery,
    RecoveryEffect,
    Rewrite,
    SendFenceRead,
    SendRecoveryRead,
    feed_reply,
)
from ledgerd.machines.writer import FailureKind, LedgerWriter
from metadata.ledger import LedgerMetadata
from wire.entry import Digester, Entry
from wire.messages import ReadFlags, ReadRequest

__all__ = ["RECOVERY_READ_FLAGS", "RecoveryRun", "Rewriter"]

RECOVERY_READ_FLAGS = ReadFlags.FENCE | ReadFlags.HIGH_PRIORITY


class Rewriter(Protocol):
    """Where recovered entries go: a recovery-mode writer's transport. It reports back
    with ``RecoveryRun.on_rewritten`` and ``on_rewrite_failed``."""

    def append(self, entry_id: int, entry: bytes, now: float) -> None: ...

    def next_deadline(self) -> float | None: ...

    def on_timer(self, now: float) -> None: ...


class RecoveryRun:
    """One attempt to recover ``md``'s ledger (already IN_RECOVERY); see the theory above.

    ``send_read(request, entry_id, index, bookie)`` sends a read; its reply comes back
    through ``on_read_reply``. ``make_rewriter(writer)`` is called once, at the first
    recovered entry, with the recovery-mode writer to send rewrites through.
    """

    def __init__(self, md: LedgerMetadata, ledger_id: int, key: bytes, digester: Digester, *,
                 read_timeout: float, add_timeout: float,
                 send_read: Callable[[ReadRequest, int, int, str], None],
                 make_rewriter: Callable[[LedgerWriter], Rewriter],
                 read_flags: int = RECOVERY_READ_FLAGS, read_window: int = 64,
                 start_from_minus_one: bool = False) -> None:
        self.md = md
        self.ledger_id = ledger_id
        self.key = key
        self.digester = digester
        self.add_timeout = add_timeout
        self.send_read = send_read
        self.make_rewriter = make_rewriter
        self.read_flags = read_flags
        first, ensemble = md.last_ensemble
        self.machine = LedgerRecovery(md.ensemble_size, md.write_quorum, md.ack_quorum,
                                      ensemble, first, read_timeout=read_timeout,
                                      read_window=read_window,
                                      start_from_minus_one=start_from_minus_one)
        self.writer: LedgerWriter | None = None
        self.rewriter: Rewriter | None = None
        self.ensembles: dict[int, tuple[str, ...]] = {}  # local until the closing CAS
        self.finished: Finished | None = None
        self.aborted: Aborted | None = None

    @property
    def is_over(self) -> bool:
        return self.finished is not None or self.aborted is not None

    # -- inputs ------------------------------------------------------------------------

    def begin(self, now: float) -> None:
        self._apply(self.machine.begin(now), now)

    def on_read_reply(self, entry_id: int, index: int, status: int, entry: bytes,
                      now: float) -> Entry | None:
        """A bookie's reply to a read this run sent (a dead connection: IO_ERROR).
        Returns the entry when it verified, for callers that observe reads; None without
        decoding when the machine no longer waits for this answer."""
        if not self.machine.wants(entry_id, index):
            return None
        effects, decoded = feed_reply(self.machine, self.digester, self.ledger_id, entry_id,
                                      index, status, entry, now)
        self._apply(effects, now)
        return decoded

    def on_rewritten(self, entry_ids: tuple[int, ...], now: float) -> None:
        self._apply(self.machine.on_rewritten(entry_ids, now), now)

    def on_rewrite_failed(self, kind: FailureKind, reason: str) -> None:
        if not self.is_over:
            self.aborted = Aborted(kind, f"rewriting recovered entries failed: {reason}")

    def choose_replacement(self, first: int, failed: dict[int, str],
                           ensemble: tuple[str, ...], candidates: Collection[str],
                           rng: random.Random, avoid: Collection[str] = ()) -> tuple[str, ...]:
        """Replacements for the rewrites' failed bookies, remembered as a local ensemble
        change from ``first``. Raises NotEnoughBookiesError."""
        new = choose_replacements(candidates, ensemble, failed, rng, avoid=avoid)
        self.ensembles[first] = new
        return new

    # -- time --------------------------------------------------------------------------

    def next_deadline(self) -> float | None:
        """The earliest of the machine's read deadline and the rewrites' add deadline."""
        if self.is_over:
            return None
        deadline = self.machine.next_deadline()
        if self.rewriter is not None:
            rewrite = self.rewriter.next_deadline()
            if rewrite is not None and (deadline is None or rewrite < deadline):
                deadline = rewrite
        return deadline

    def on_timer(self, now: float) -> None:
        self._apply(self.machine.on_timer(now), now)
        if self.rewriter is not None and not self.is_over:
            self.rewriter.on_timer(now)

    # -- effects -----------------------------------------------------------------------

    def _apply(self, effects: list[RecoveryEffect], now: float) -> None:
        for eff in effects:
            if self.is_over:
                return
            if isinstance(eff, SendFenceRead):
                self._read(-1, eff.index, eff.bookie)
            elif isinstance(eff, SendRecoveryRead):
                self._read(eff.entry_id, eff.index, eff.bookie)
            elif isinstance(eff, Rewrite):
                self._rewriter().append(eff.entry_id, eff.entry, now)
            elif isinstance(eff, Finished):
                self.finished = eff
            elif isinstance(eff, Aborted):
                self.aborted = eff

    def _read(self, entry_id: int, index: int, bookie: str) -> None:
        req = ReadRequest(ledger_id=self.ledger_id, entry_id=entry_id, flags=self.read_flags,
                          master_key=self.key)
        self.send_read(req, entry_id, index, bookie)

    def _rewriter(self) -> Rewriter:
        if self.rewriter is None:
            md, m = self.md, self.machine
            self.writer = LedgerWriter(md.ensemble_size, md.write_quorum, md.ack_quorum,
                                       m.ensemble, last_add_confirmed=m.start,
                                       add_timeout=self.add_timeout)
            self.rewriter = self.make_rewriter(self.writer)
        return self.rewriter
