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
    WriteNoop,
    feed_reply,
    noop_length,
)
from ledgerd.machines.writer import FailureKind, LedgerWriter
from ledgerd.metadata.ledger import LedgerMetadata
from ledgerd.wire.entry import Digester, Entry, encode_entry
from ledgerd.wire.entry_check import EntryCheck, KeyedCheck
from ledgerd.wire.messages import ReadFlags, ReadRequest

__all__ = ["RECOVERY_READ_FLAGS", "RecoveryRun", "Rewriter"]

RECOVERY_READ_FLAGS = ReadFlags.FENCE | ReadFlags.HIGH_PRIORITY


class Rewriter(Protocol):
    """Where recovered entries go: a recovery-mode writer's transport. It reports back
    with ``RecoveryRun.on_rewritten`` and ``on_rewrite_failed``."""

    def append(self, entry_id: int, entry: bytes, now: float, truncate: bool = False,
               ) -> None: ...

    def next_deadline(self) -> float | None: ...

    def on_timer(self, now: float) -> None: ...


class RecoveryRun:
    """One attempt to recover ``md``'s ledger (already IN_RECOVERY); see the theory above.

    ``send_read(request, entry_id, index, bookie)`` sends a read; its reply comes back
    through ``on_read_reply``. ``make_rewriter(writer)`` is called once, at the first
    recovered entry, with the recovery-mode writer to send rewrites through.

    With ``term`` (unbounded ledgers: the term this client just raised in metadata), the
    run starts that term: reads carry the term instead of the fence, rewrites carry it
    too and must reach the whole write quorum, and the end gets a TRUNCATE no-op entry
    (``LedgerRecovery(new_term=True)``). ``rewrites_at_ack_quorum`` re-introduces the
    divergence the guaranteed write quorum prevents (the simulator's self-test only).

    ``verifier`` checks what the reads return: a ``Digester`` (or a keyed
    ``EntryCheck``), or an unkeyed ``EntryCheck`` (an HMAC ledger recovered with the
    recovery credential only), with which replicas must corroborate each other
    (``LedgerRecovery(unkeyed_digest_size=...)``) and no term can be started.
    """

    def __init__(self, md: LedgerMetadata, ledger_id: int, key: bytes,
                 verifier: Digester | EntryCheck, *,
                 read_timeout: float, add_timeout: float,
                 send_read: Callable[[ReadRequest, int, int, str], None],
                 make_rewriter: Callable[[LedgerWriter], Rewriter],
                 read_flags: int = RECOVERY_READ_FLAGS, read_window: int = 64,
                 term: int = 0, rewrites_at_ack_quorum: bool = False,
                 start_from_minus_one: bool = False) -> None:
        self.md = md
        self.ledger_id = ledger_id
        self.key = key
        self.verifier = verifier
        # The no-op's digest: a term's end marker is written, so it needs the key.
        self.digester: Digester | None = None
        unkeyed: int | None = None
        if isinstance(verifier, Digester):
            self.digester = verifier
        elif isinstance(verifier, KeyedCheck):
            self.digester = verifier.digester
        else:
            unkeyed = verifier.digest_size
        if term and unkeyed is not None:
            raise ValueError("a new term writes a no-op entry, whose digest needs the key")
        self.add_timeout = add_timeout
        self.send_read = send_read
        self.make_rewriter = make_rewriter
        self.term = term
        # A term's reads adopt the term on each bookie instead of fencing the ledger
        # (a fence would stop this term's own writes too).
        self.read_flags = read_flags & ~ReadFlags.FENCE if term else read_flags
        self.rewrite_quorum = md.ack_quorum if rewrites_at_ack_quorum or not term \
            else md.write_quorum
        first, ensemble = md.last_ensemble
        self.machine = LedgerRecovery(md.ensemble_size, md.write_quorum, md.ack_quorum,
                                      ensemble, first, read_timeout=read_timeout,
                                      read_window=read_window, new_term=bool(term),
                                      start_from_minus_one=start_from_minus_one,
                                      unkeyed_digest_size=unkeyed)
        self.writer: LedgerWriter | None = None
        self.rewriter: Rewriter | None = None
        # A term's no-op goes to every bookie of the ensemble (its own writer, E of E):
        # a bookie outside the no-op's write set may hold a former term's entries past it.
        self.noop: tuple[int, bytes] | None = None
        self.noop_rewriter: Rewriter | None = None
        self.rewrites_at_ack_quorum = rewrites_at_ack_quorum
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
        effects, decoded = feed_reply(self.machine, self.verifier, self.ledger_id, entry_id,
                                      index, status, entry, now)
        self._apply(effects, now)
        return decoded

    def on_rewritten(self, entry_ids: tuple[int, ...], now: float) -> None:
        self._apply(self.machine.on_rewritten(entry_ids, now), now)
        self._maybe_send_noop(now)

    def _maybe_send_noop(self, now: float) -> None:
        """Send the no-op once every rewrite before it is acknowledged, through a writer
        whose write set is the whole ensemble (the rewrites' ensemble as changed)."""
        if self.noop is None or self.noop_rewriter is not None or self.is_over:
            return
        entry_id, data = self.noop
        if self.machine.rewrites_pending != {entry_id}:
            return
        md, m = self.md, self.machine
        ensemble = self.writer.ensemble if self.writer is not None else m.ensemble
        e = md.ensemble_size
        quorums = (md.write_quorum, md.ack_quorum) if self.rewrites_at_ack_quorum else (e, e)
        writer = LedgerWriter(e, *quorums, ensemble, last_add_confirmed=entry_id - 1,
                              add_timeout=self.add_timeout)
        self.noop_rewriter = self.make_rewriter(writer)
        self.noop_rewriter.append(entry_id, data, now, truncate=True)

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
        for rewriter in (self.rewriter, self.noop_rewriter):
            if rewriter is not None:
                rewrite = rewriter.next_deadline()
                if rewrite is not None and (deadline is None or rewrite < deadline):
                    deadline = rewrite
        return deadline

    def on_timer(self, now: float) -> None:
        self._apply(self.machine.on_timer(now), now)
        for rewriter in (self.rewriter, self.noop_rewriter):
            if rewriter is not None and not self.is_over:
                rewriter.on_timer(now)

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
            elif isinstance(eff, WriteNoop):
                assert self.digester is not None  # refused at construction
                self.noop = (eff.entry_id, encode_entry(
                    self.digester, self.ledger_id, eff.entry_id, eff.lac,
                    noop_length(eff.length), b""))
                self._maybe_send_noop(now)
            elif isinstance(eff, Finished):
                self.finished = eff
            elif isinstance(eff, Aborted):
                self.aborted = eff

    def _read(self, entry_id: int, index: int, bookie: str) -> None:
        req = ReadRequest(ledger_id=self.ledger_id, entry_id=entry_id, flags=self.read_flags,
                          master_key=self.key, term=self.term)
        self.send_read(req, entry_id, index, bookie)

    def _rewriter(self) -> Rewriter:
        if self.rewriter is None:
            md, m = self.md, self.machine
            self.writer = LedgerWriter(md.ensemble_size, md.write_quorum,
                                       self.rewrite_quorum, m.ensemble,
                                       last_add_confirmed=m.start,
                                       add_timeout=self.add_timeout)
            self.rewriter = self.make_rewriter(self.writer)
        return self.rewriter
