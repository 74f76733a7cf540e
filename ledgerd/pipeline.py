"""The sending side of a ledger writer: carries out what ``LedgerWriter`` asks for.

An ``AddPipeline`` owns one ``LedgerWriter``, the ledger's ``Digester`` and the encoded
bytes of its pending entries. ``defer`` / ``append_many`` ask the machine for entry ids
(``reserve``, ``append_many``) and the sends to make, and encode the entries here
(``append_encoded`` takes recovery's rewrites, already encoded); sends are
grouped per bookie into AddRequests (SPARSE where a striped ledger's ids have gaps:
one request per bookie per flush, not one per run of Qw entries) and handed to the
``BookiePool`` with a callback, so replies feed straight back into the machine from the
connection's reader, and completions reach ``on_completed`` in entry order. No quorum
logic lives here: this is I/O.

Two policies are the owner's: ``replace`` picks and records a new ensemble (a metadata
CAS for a write handle; a local choice for recovery), and ``on_completed`` /
``on_failed`` say what completion means. A bookie that answers TOO_MANY_REQUESTS is
asked again shortly, without telling the machine (it is alive, only busy); the add
timeout still applies.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from functools import partial

import trio

from ledgerd.base.errors import LedgerdError
from ledgerd.base.logs import fields
from ledgerd.bookie_client import BookieConnectionError
from ledgerd.bookies import BookiePool
from ledgerd.machines.writer import (
    ChangeEnsemble,
    Completed,
    Effect,
    Failed,
    FailureKind,
    LedgerWriter,
    Released,
    SendAdd,
    SendAdds,
)
from ledgerd.wire.entry import Digester, encode_entries
from ledgerd.wire.messages import AddFlags, AddRequest, Message
from ledgerd.wire.status import Status

__all__ = ["AddPipeline", "EnsembleChangeError", "SendFlusher"]

log = logging.getLogger(__name__)

_MAX_RUN_ENTRIES = 256
_MAX_RUN_BYTES = 2 << 20
_BUSY_RETRY_S = 0.01
_SPARSE = int(AddFlags.SPARSE)
_TRUNCATE = int(AddFlags.TRUNCATE)


class EnsembleChangeError(LedgerdError):
    def __init__(self, kind: FailureKind, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason


Replace = Callable[[int, dict[int, str], tuple[str, ...]], Awaitable[tuple[str, ...]]]


class SendFlusher:
    """Sends of many pipelines, flushed once per scheduling pass of the event loop.

    A task that submits entries in a loop (``submit``, ``append_many``, many handles at
    once) runs without yielding; each pipeline marks itself here and its sends wait in
    its per-bookie lists. When that task yields, ``run`` flushes every marked pipeline:
    consecutive entries for one bookie share one AddRequest (one encode, one frame, one
    bookie-side insert) instead of one frame per entry.
    """

    def __init__(self) -> None:
        self._marked: list[AddPipeline] = []
        self._wake = trio.Event()

    def mark(self, pipeline: AddPipeline) -> None:
        if not self._marked:
            self._wake.set()
        self._marked.append(pipeline)

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            marked, self._marked = self._marked, []
            for pipeline in marked:
                pipeline.flush()


class AddPipeline:
    """One ledger's adds: entry ids from the writer machine, entries encoded with the
    ledger's ``digester`` (None: only ``append_encoded``, for entries that come encoded),
    sends batched per bookie, replies fed back to the machine."""

    def __init__(self, pool: BookiePool, nursery: trio.Nursery, ledger_id: int,
                 master_key: bytes, writer: LedgerWriter, *, flags: int, term: int = 0,
                 digester: Digester | None = None, replace: Replace,
                 on_completed: Callable[[tuple[int, ...], int], None],
                 on_failed: Callable[[FailureKind, str, tuple[int, ...]], None],
                 on_timer_changed: Callable[[], None] = lambda: None,
                 on_released: Callable[[], None] = lambda: None,
                 flusher: SendFlusher | None = None) -> None:
        self.pool = pool
        self.nursery = nursery
        self.ledger_id = ledger_id
        self.key = master_key
        self.writer = writer
        self.flags = flags
        self.term = term
        self.replace = replace
        self.on_completed = on_completed
        self.on_failed = on_failed
        # Called when the writer's next deadline may have appeared (an ensemble change
        # ended): a driver sleeping with no deadline recomputes it.
        self.on_timer_changed = on_timer_changed
        self.on_released = on_released  # GWQ entries left the writer's lagging set
        self.entries: dict[int, bytes] = {}
        self._out: dict[str, list[int]] = {}
        # With a flusher, sends wait for its next pass (batched); without, they go now.
        self._flusher = flusher
        self._marked = False
        self.ensemble_changes = 0
        self.digester = digester
        # ``defer``'s payloads (their ids reserved), appended at the flusher's next pass.
        self._deferred: list[bytes] = []

    def defer(self, payload: bytes) -> int:
        """Add one entry, returning its id (reserved from the machine) at once; the
        machine takes it, with every entry deferred beside it, in one ``append_many`` at
        the flusher's next pass: a task submitting entries one by one pays the batched
        path's cost per entry, not ``append``'s."""
        eid = self.writer.reserve()
        self._deferred.append(payload)
        if self._flusher is None:
            self._take_deferred()
        elif not self._marked:
            self._marked = True
            self._flusher.mark(self)
        return eid

    def _take_deferred(self) -> None:
        payloads, self._deferred = self._deferred, []
        if self.writer.failed is not None:
            return  # the handle failed meanwhile, and their appends with it
        self.append_many(payloads, trio.current_time())
        self.on_timer_changed()  # their add timeout: a driver sleeping idle recomputes

    def append_many(self, payloads: Sequence[bytes], now: float) -> int:
        """Append entries in one pass (ids from the machine, bytes encoded here, with
        the LAC the machine publishes now); returns the first id."""
        if self._deferred:
            self._take_deferred()
        digester = self.digester
        assert digester is not None, "this pipeline takes encoded entries only"
        w = self.writer
        first, effects = w.append_many([len(p) for p in payloads], now)
        lengths = w.lengths
        encoded = encode_entries(digester, self.ledger_id, first, w.published_lac,
                                 [lengths[eid] for eid in range(first, first + len(payloads))],
                                 payloads)
        entries = self.entries
        for eid, data in enumerate(encoded, first):
            entries[eid] = data
        self.apply(effects)
        return first

    def append_encoded(self, entries: list[bytes], now: float) -> int:
        """Add entries already encoded (recovery's rewrites, byte for byte) in one pass,
        so consecutive ones share AddRequests; returns the first one's id."""
        if self._deferred:
            self._take_deferred()
        w = self.writer
        first = -1
        effects: list[Effect] = []
        stored = self.entries
        for data in entries:
            eid, more = w.append(0, now)
            if first < 0:
                first = eid
            stored[eid] = data
            effects += more
        self.apply(effects)
        return first

    def next_deadline(self) -> float | None:
        """The writer's next timeout (None: nothing waits for an answer)."""
        return self.writer.next_deadline()

    def on_timer(self) -> None:
        """Apply the writer's timeouts as of now (call at ``next_deadline``)."""
        effects = self.writer.on_timer(trio.current_time())
        if effects:
            self.apply(effects)

    # -- effects -----------------------------------------------------------------------

    def apply(self, effects: list[Effect]) -> None:
        out = self._out
        for eff in effects:
            if type(eff) is SendAdd:
                ids = out.get(eff.bookie)
                if ids is None:
                    out[eff.bookie] = [eff.entry_id]
                else:
                    ids.append(eff.entry_id)
            elif type(eff) is SendAdds:
                ids = out.get(eff.bookie)
                if ids is None:
                    out[eff.bookie] = list(eff.entry_ids)
                else:
                    ids.extend(eff.entry_ids)
            elif type(eff) is Completed:
                # Sends queued before this completion need the bytes it drops: after an
                # ensemble change the writer re-sends entries to the new bookie and then
                # completes those that reached Qa during the change.
                if out:
                    self._flush()
                    out = self._out
                entries = self.entries
                if not self.writer.gwq:
                    for eid in eff.entry_ids:
                        entries.pop(eid, None)
                else:  # kept until Released: an ensemble change may re-send them
                    lagging = self.writer.lagging
                    for eid in eff.entry_ids:
                        if eid not in lagging:
                            entries.pop(eid, None)
                self.on_completed(eff.entry_ids, eff.lac)
            elif type(eff) is Released:
                for eid in eff.entry_ids:
                    self.entries.pop(eid, None)
                self.on_released()
            elif type(eff) is ChangeEnsemble:
                self._start_change(eff)
            elif type(eff) is Failed:
                if out:
                    self._flush()
                    out = self._out
                for eid in eff.entry_ids:
                    self.entries.pop(eid, None)
                self.on_failed(eff.kind, eff.reason, eff.entry_ids)
        if out:
            if self._flusher is None:
                self._flush()
            elif not self._marked:
                self._marked = True
                self._flusher.mark(self)

    def flush(self) -> None:
        """Append what was deferred and send what waits (the flusher's pass)."""
        if self._deferred:
            self._take_deferred()
        if self._out:
            self._flush()
        self._marked = False

    def _flush(self) -> None:
        out, self._out = self._out, {}
        entries = self.entries
        # One AddRequest per bookie and up to _MAX_RUN_ENTRIES / _MAX_RUN_BYTES: SPARSE
        # when the ids have gaps (a striped ledger's, or re-sends after a change). The
        # bookie client splits a sparse request into runs for a bookie without ADD v1.
        sparse = not self.flags & _TRUNCATE
        for bookie, ids in out.items():
            ids = sorted(set(ids)) if len(ids) > 1 else ids  # a re-send may repeat an id
            n = len(ids)
            i = 0
            while i < n:
                first = ids[i]
                data = entries[first]
                run = [data]
                nbytes = len(data)
                j = i + 1
                gaps = False
                while j < n and j - i < _MAX_RUN_ENTRIES:
                    eid = ids[j]
                    if eid != first + (j - i):
                        if not sparse:
                            break
                        gaps = True
                    data = entries[eid]
                    if nbytes + len(data) > _MAX_RUN_BYTES:
                        break
                    run.append(data)
                    nbytes += len(data)
                    j += 1
                self._send(bookie, ids[i:j] if gaps else range(first, j - i + first),
                           tuple(run))
                i = j

    def _send(self, bookie: str, ids: Sequence[int], run: tuple[bytes, ...]) -> None:
        flags = self.flags | _SPARSE if type(ids) is not range else self.flags
        req = AddRequest(ledger_id=self.ledger_id, first_entry_id=ids[0], flags=flags,
                         master_key=self.key, term=self.term, entries=run)
        self.pool.send(bookie, req, partial(self._on_reply, bookie, ids, req))

    def _on_reply(self, bookie: str, ids: Sequence[int], req: AddRequest, status: int,
                  response: Message | None, error: BookieConnectionError | None) -> None:
        w = self.writer
        now = trio.current_time()
        effects: list[Effect] = []
        if error is None and status == Status.OK:
            effects = w.on_ack_entries(ids, bookie, now)
        elif error is None and status == Status.TOO_MANY_REQUESTS and not self.pool.closed:
            self.nursery.start_soon(self._retry_busy, bookie, ids, req)
            return
        else:
            if error is not None:
                self.pool.note_failure(bookie)
            code = Status.IO_ERROR if error is not None else status
            log.info("add_failed", extra=fields(ledger=self.ledger_id, bookie=bookie,
                                                first=ids[0], count=len(ids),
                                                status=error.reason if error else code))
            for eid in ids:
                effects += w.on_error(eid, bookie, code, now)
        if effects:
            self.apply(effects)

    async def _retry_busy(self, bookie: str, ids: Sequence[int], req: AddRequest) -> None:
        await trio.sleep(_BUSY_RETRY_S)
        # Only entries the machine still waits for from this bookie.
        if self.writer.failed is None and bookie in self.writer.ensemble and all(
                eid in self.writer.pending for eid in ids):
            self.pool.send(bookie, req, partial(self._on_reply, bookie, ids, req))

    def _start_change(self, eff: ChangeEnsemble) -> None:
        """Start an ensemble change, unless the client is closing: closing fails every
        connection, and the failures must end the handle, not start changes in a nursery
        that is shutting down (the fault harness found "Nursery is closed to new
        arrivals" raised out of the client's exit)."""
        if not self.pool.closed:
            try:
                self.nursery.start_soon(self._change, eff)
                return
            except RuntimeError:  # the client's nursery is already closed
                pass
        self.apply(self.writer.ensemble_change_failed(FailureKind.UNAVAILABLE,
                                                      "the client is closed"))

    async def _change(self, eff: ChangeEnsemble) -> None:
        w = self.writer
        try:
            new = await self.replace(eff.first_entry_id, eff.failed, tuple(w.ensemble))
        except EnsembleChangeError as exc:
            # Say why the bookies were replaced too: "not enough bookies" alone hides
            # a cause the user can fix (TLS required, a wrong CA, a refused role).
            causes = sorted({f"{a}: {self.pool.last_error(a)}" for a in eff.failed.values()
                             if self.pool.last_error(a)})
            reason = exc.reason + (f" (the bookies failed: {'; '.join(causes[:3])})"
                                   if causes else "")
            log.warning("ensemble_change_failed", extra=fields(
                ledger=self.ledger_id, first=eff.first_entry_id, reason=reason))
            self.apply(w.ensemble_change_failed(exc.kind, reason))
            self.on_timer_changed()
            return
        self.ensemble_changes += 1
        log.info("ensemble_changed", extra=fields(
            ledger=self.ledger_id, first=eff.first_entry_id,
            replaced=",".join(eff.failed.values()), ensemble=",".join(new)))
        self.apply(w.ensemble_changed(eff.first_entry_id, new, trio.current_time()))
        self.on_timer_changed()
