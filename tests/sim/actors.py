"""Simulated bookies and metadata, and the clients that drive the real machines.

``SimBookie`` decides with the production bookie core (``appliance.core``); only its
storage and time are simulated. ``SimWriter`` runs ``LedgerWriter``; ``SimRecoverer``
runs the production recovery driver's logic (``ledgerd.machines.recovery_run``) with a
recovery-mode ``LedgerWriter`` for the rewrites; every metadata change goes through the
client's own pure change functions (``ledgerd.machines.changes``) in a compare-and-set
loop. Only the transport differs from the trio client: here a message is an event in the
world, and a timer is armed at each machine's ``next_deadline()``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ledgerd.appliance.core import Accept, BookieCore, RuleBreaks
from ledgerd.machines.changes import (
    begin_recovery,
    change_ensemble,
    close_as_writer,
    close_recovered,
    failure_kind,
)
from ledgerd.machines.placement import NotEnoughBookiesError, choose_ensemble, choose_replacements
from ledgerd.machines.quorum import write_set
from ledgerd.machines.recovery import Finished
from ledgerd.machines.recovery_run import RECOVERY_READ_FLAGS, RecoveryRun
from ledgerd.machines.writer import (
    ChangeEnsemble,
    Completed,
    Effect,
    Failed,
    FailureKind,
    LedgerWriter,
    SendAdd,
)
from ledgerd.metadata.errors import ChangeRejectedError
from ledgerd.metadata.ledger import LedgerMetadata, LedgerState
from ledgerd.wire.entry import (
    Digester,
    DigestType,
    decode_entry,
    encode_entry,
    master_key,
    peek_entry_header,
)
from ledgerd.wire.messages import AddFlags, AddRequest, ReadFlags, ReadRequest
from ledgerd.wire.status import Status
from tests.sim.world import World

__all__ = ["SimBookie", "SimLedger", "SimMetadata", "SimReader", "SimRecoverer", "SimWriter", "payload_for"]

LEDGER = 7
DIGEST = Digester(DigestType.CRC32C)
KEY = master_key(b"sim")
ADD_TIMEOUT = 1.0
READ_TIMEOUT = 1.0


def payload_for(entry_id: int) -> bytes:
    return b"entry-%d" % entry_id


def add_request(entry_id: int, entry: bytes, *, recovery: bool, term: int = 0,
                truncate: bool = False) -> AddRequest:
    flags = AddFlags.RECOVERY_ADD | AddFlags.HIGH_PRIORITY if recovery else AddFlags.NONE
    if truncate:
        flags |= AddFlags.TRUNCATE
    return AddRequest(ledger_id=LEDGER, first_entry_id=entry_id, flags=flags, master_key=KEY,
                      term=term, entries=(entry,))


def read_request(entry_id: int, *, fence: bool) -> ReadRequest:
    if fence:
        return ReadRequest(ledger_id=LEDGER, entry_id=entry_id,
                           flags=ReadFlags.FENCE | ReadFlags.HIGH_PRIORITY, master_key=KEY)
    return ReadRequest(ledger_id=LEDGER, entry_id=entry_id)


class Timer:
    """One re-armable timer in the world: fires once at the deadline it was last armed
    with (None disarms); arming again replaces the previous deadline."""

    def __init__(self, world: World, label: str) -> None:
        self.world = world
        self.label = label
        self.deadline: float | None = None
        self._generation = 0

    def arm(self, deadline: float | None, fire: Callable[[], None]) -> None:
        if deadline == self.deadline:
            return
        self.deadline = deadline
        self._generation += 1
        if deadline is None:
            return
        generation = self._generation

        def on_time() -> None:
            if generation == self._generation:
                self.deadline = None
                fire()
        self.world.at_time(deadline, on_time, self.label)


# Labels name statuses on every answer; the enum lookup is measurably slow there.
_STATUS_NAMES = {int(st): st.name for st in Status}

# -- bookies ---------------------------------------------------------------------------


@dataclass
class SimLedger:
    """One ledger as a simulated bookie keeps it: what the core reads (key, fence, term)
    plus the entries, each with the part of it that survived a journal sync."""

    entries: dict[int, bytes] = field(default_factory=dict)   # readable (maybe unsynced)
    durable: dict[int, bytes] = field(default_factory=dict)   # survived fdatasync
    master_key: bytes = b""
    fenced: bool = False
    term: int = 0
    key_durable: bytes = b""
    fence_durable: bool = False
    term_durable: int = 0

    @property
    def is_known(self) -> bool:
        return bool(self.master_key or self.entries or self.fenced or self.term)

    # The highest LAC and id held, kept as entries come and computed again after
    # anything that removes one (the checker asks after every event).
    _lac: int | None = None
    _last: int | None = None

    def lac(self) -> int:
        """The highest LAC any entry held here carries (a bookie's view of the LAC)."""
        if self._lac is None:
            self._lac = max((peek_entry_header(e).lac for e in self.entries.values()),
                            default=-1)
        return self._lac

    def last(self) -> int:
        """The highest entry id held here (-1: none)."""
        if self._last is None:
            self._last = max(self.entries, default=-1)
        return self._last

    def put(self, entry_id: int, entry: bytes) -> None:
        if entry_id in self.entries:
            self._lac = None  # a replaced entry may have carried the highest LAC
        elif self._lac is not None:
            self._lac = max(self._lac, peek_entry_header(entry).lac)
        self.entries[entry_id] = entry
        if self._last is not None:
            self._last = max(self._last, entry_id)

    def truncate_after(self, entry_id: int) -> None:
        for later in [e for e in self.entries if e > entry_id]:
            del self.entries[later]
        self._lac = self._last = None

    def restore(self, entries: dict[int, bytes]) -> None:
        self.entries = entries
        self._lac = self._last = None


class SimBookie:
    """A bookie whose rules are the production ``appliance.core.BookieCore``: entries
    readable at once, acknowledged after a journal sync; a fencing read is answered once
    the fence is durable; crashes lose what was not synced (or, with
    ``lose_unsynced=False``, nothing). Only storage and time are simulated."""

    def __init__(self, world: World, name: str) -> None:
        self.world = world
        self.name = name
        self.up = True
        self.incarnation = 0
        self.ledger = SimLedger()
        self.durable_changes = 0
        m = world.mutations
        self.core = BookieCore(RuleBreaks(fenced_accepts_adds=m.fenced_accepts_adds,
                                          stale_term_accepted=m.stale_term_accepted))
        # Invariant 4's evidence, observed here and judged by the checker.
        self.fenced_add_accepted = False
        # For incremental checkers: ids whose entry changed since they last looked, and
        # whether something changed many at once (a truncate, a crash).
        self.touched: set[int] = set()
        self.changed_many = False

    def _sync(self, then: Callable[[], None], label: str) -> None:
        inc = self.incarnation
        def done() -> None:
            if self.up and self.incarnation == inc:
                then()
        self.world.at(0.0002 + self.world.rng.random() * 0.003, done, f"{self.name} {label}")

    def _state(self) -> SimLedger | None:
        return self.ledger if self.ledger.is_known else None

    def on_add(self, req: AddRequest, reply: Callable[[int], None]) -> None:
        if not self.up:
            return
        led = self.ledger
        entry_id, entry = req.first_entry_id, req.entries[0]
        decision = self.core.on_add(req, self._state(), False, False)
        if not isinstance(decision, Accept):
            status = decision
            self.world.send(lambda: reply(status),
                            f"{self.name} -> {_STATUS_NAMES[status]} {entry_id}")
            return
        if led.fenced and not req.flags & AddFlags.RECOVERY_ADD:
            self.world.log(f"{self.name} accepts plain add {entry_id} on a fenced ledger")
            self.fenced_add_accepted = True
        if decision.bind_key:
            led.master_key = decision.bind_key
        if decision.new_term:
            led.term = max(led.term, decision.new_term)
        led.put(entry_id, entry)
        self.touched.add(entry_id)
        self.world.stored = True
        if decision.truncate:
            self.changed_many = True
            led.truncate_after(entry_id)

        def synced() -> None:
            led.durable[entry_id] = led.entries.get(entry_id, entry)
            if decision.truncate:
                for later in [e for e in led.durable if e > entry_id and e not in led.entries]:
                    del led.durable[later]
            led.key_durable = led.master_key
            led.term_durable = max(led.term_durable, decision.new_term)
            self.durable_changes += 1
            self.world.send(lambda: reply(Status.OK), f"{self.name} -> ack {entry_id}")
        self._sync(synced, f"sync {entry_id}")

    def on_read(self, req: ReadRequest, reply: Callable[[int, bytes], None]) -> None:
        if not self.up:
            return
        led = self.ledger

        def answer() -> None:
            if not led.is_known:
                status, data = Status.NO_SUCH_LEDGER, b""
            else:
                last = led.last()
                entry_id = self.core.entry_to_read(req.entry_id, last)
                if entry_id in led.entries:
                    status, data = Status.OK, led.entries[entry_id]
                else:
                    status, data = Status.NO_SUCH_ENTRY, b""
            self.world.send(lambda: reply(status, data),
                            f"{self.name} -> read {req.entry_id} {_STATUS_NAMES[status]}")

        if self.core.is_immediate(req):
            answer()
            return
        decision = self.core.on_recovery_read(req, self._state())
        if not isinstance(decision, Accept):
            status = decision
            self.world.send(lambda: reply(status, b""),
                            f"{self.name} -> read {req.entry_id} {_STATUS_NAMES[status]}")
            return
        if decision.bind_key:
            led.master_key = decision.bind_key
        if decision.new_term:
            led.term = max(led.term, decision.new_term)
        if decision.fence:
            led.fenced = True
        if decision.fence or decision.new_term or decision.bind_key:
            def durable() -> None:
                led.fence_durable = led.fenced
                led.key_durable = led.master_key
                led.term_durable = max(led.term_durable, led.term)
                answer()
            self._sync(durable, "sync fence/term")
        else:
            answer()

    def crash(self, lose_unsynced: bool) -> None:
        self.up = False
        self.changed_many = True
        self.world.stored = True
        self.incarnation += 1
        led = self.ledger
        if lose_unsynced:
            led.restore(dict(led.durable))
            led.fenced = led.fence_durable
            led.master_key = led.key_durable
            led.term = led.term_durable
        else:
            led.durable = dict(led.entries)
            led.fence_durable = led.fenced
            led.key_durable = led.master_key
            led.term_durable = led.term
            self.durable_changes += 1

    def restart(self) -> None:
        self.up = True


# -- metadata ----------------------------------------------------------------------------


class SimMetadata:
    """One ledger's metadata node: versioned, compare-and-set, delayed but reliable."""

    def __init__(self, world: World, md: LedgerMetadata) -> None:
        self.world = world
        self.md = md
        self.version = 0
        self.history: list[LedgerMetadata] = [md]

    def read(self, reply: Callable[[LedgerMetadata, int], None]) -> None:
        md, v = self.md, self.version
        self.world.at(self.world.metadata_delay(), lambda: reply(md, v), "md read")

    def write(self, md: LedgerMetadata, version: int, reply: Callable[[bool, int], None]) -> None:
        def apply() -> None:
            if version != self.version:
                self.world.at(self.world.metadata_delay(), lambda: reply(False, -1),
                              "md conflict")
                return
            old = self.md
            if old.state is LedgerState.CLOSED:
                self.world.fail(f"metadata changed after CLOSED: {old} -> {md}")
            self.md = md
            self.version += 1
            self.history.append(md)
            v = self.version
            self.world.log(f"md v{v} {md.state.value} last={md.last_entry_id} "
                           f"ensembles={[(f, list(b)) for f, b in md.ensembles]}")
            self.world.at(self.world.metadata_delay(), lambda: reply(True, v), "md written")
        self.world.at(self.world.metadata_delay(), apply, "md write")


def cas(meta: SimMetadata, alive: Callable[[], bool],
        change: Callable[[LedgerMetadata], LedgerMetadata],
        done: Callable[[LedgerMetadata | None, ChangeRejectedError | None], None]) -> None:
    """The compare-and-set loop of ``metadata.cas.cas_update``, as events."""
    def attempt() -> None:
        meta.read(on_read)

    def on_read(md: LedgerMetadata, version: int) -> None:
        if not alive():
            return
        try:
            new = change(md)
        except ChangeRejectedError as exc:
            done(None, exc)
            return
        if new is md:
            done(md, None)
            return
        meta.write(new, version, lambda ok, _v: (done(new, None) if ok else attempt())
                   if alive() else None)
    attempt()


# -- the writer --------------------------------------------------------------------------


class SimWriter:
    def __init__(self, world: World, meta: SimMetadata, bookies: dict[str, SimBookie],
                 entries: int, observer: Any) -> None:
        self.world = world
        self.meta = meta
        self.bookies = bookies
        self.total = entries
        self.observer = observer
        md = meta.md
        self.w = LedgerWriter(md.ensemble_size, md.write_quorum, md.ack_quorum,
                              md.last_ensemble[1], add_timeout=ADD_TIMEOUT,
                              complete_out_of_order=world.mutations.out_of_order_completion)
        self.alive = True
        self.entries: dict[int, bytes] = {}
        self.acked: list[int] = []
        self.appended = 0
        self.failed: FailureKind | None = None
        self.closed: str | None = None  # "ok" or the close error
        self.max_lac = -1
        self.die_after_change = False  # a crash right after an ensemble change (#2615)
        self.timer = Timer(world, "writer timer")

    def start(self) -> None:
        self._schedule_append()

    def _schedule_append(self) -> None:
        r = self.world.rng
        self.world.at(r.expovariate(1 / 0.02), self._append, "writer append")

    def _arm_timer(self) -> None:
        """As the trio driver: one timer, at the machine's next deadline."""
        self.timer.arm(self.w.next_deadline(), self._on_timer)

    def _on_timer(self) -> None:
        if not self.alive or self.failed is not None or self.closed is not None:
            return
        self.apply(self.w.on_timer(self.world.now))

    def _append(self) -> None:
        if not self.alive or self.failed is not None:
            return
        if self.appended >= self.total:
            self._maybe_close()
            return
        payload = payload_for(self.appended)
        eid, effects = self.w.append(len(payload), self.world.now)
        assert eid == self.appended
        self.appended += 1
        self.entries[eid] = encode_entry(DIGEST, LEDGER, eid, self.w.lac, self.w.lengths[eid],
                                         payload)
        self.apply(effects)
        self._schedule_append()

    def apply(self, effects: list[Effect]) -> None:
        for eff in effects:
            if isinstance(eff, SendAdd):
                self._send(eff)
            elif isinstance(eff, Completed):
                self.acked.extend(eff.entry_ids)
                if eff.lac < self.max_lac:
                    self.world.fail(f"writer LAC went back from {self.max_lac} to {eff.lac}")
                self.max_lac = eff.lac
                self.observer.on_acked(eff.entry_ids, eff.lac)
            elif isinstance(eff, ChangeEnsemble):
                self._change(eff)
            elif isinstance(eff, Failed):
                self.failed = eff.kind
                self.world.log(f"writer failed: {eff.kind.value} {eff.reason}")
        self._arm_timer()

    def _send(self, eff: SendAdd) -> None:
        bookie = self.bookies[eff.bookie]
        entry = self.entries[eff.entry_id]
        eid, name = eff.entry_id, eff.bookie

        def reply(status: int) -> None:
            if self.alive:
                if status == Status.OK:
                    self.apply(self.w.on_ack(eid, name, self.world.now))
                else:
                    self.apply(self.w.on_error(eid, name, status, self.world.now))
        req = add_request(eid, entry, recovery=False)
        self.world.send(lambda: bookie.on_add(req, reply), f"add {eid} -> {name}")

    def _change(self, eff: ChangeEnsemble) -> None:
        ensemble = tuple(self.w.ensemble)
        try:
            new = choose_replacements(self.bookies, ensemble, eff.failed, self.world.rng)
        except NotEnoughBookiesError as exc:
            self.apply(self.w.ensemble_change_failed(FailureKind.NO_BOOKIES, str(exc)))
            return

        def done(md: LedgerMetadata | None, err: ChangeRejectedError | None) -> None:
            if err is None:
                if self.die_after_change and self.world.rng.random() < 0.5:
                    self.die()  # the CAS landed; the writer died before acting on it
                    return
                self.apply(self.w.ensemble_changed(eff.first_entry_id, new, self.world.now))
                if self.die_after_change:
                    self.world.at(self.world.rng.uniform(0, 0.02), self.die,
                                  "kill writer after its ensemble change")
            else:
                self.apply(self.w.ensemble_change_failed(failure_kind(err), str(err)))
        cas(self.meta, lambda: self.alive,
            lambda md: change_ensemble(md, ensemble, eff.first_entry_id, new), done)

    def _maybe_close(self) -> None:
        if self.closed is not None or self.failed is not None or not self.alive:
            return
        if not self.w.idle:
            self.world.at(0.05, self._maybe_close, "writer close wait")
            return
        lac, length = self.w.lac, self.w.length

        def done(md: LedgerMetadata | None, err: ChangeRejectedError | None) -> None:
            self.closed = "ok" if err is None else type(err).__name__
            self.world.log(f"writer close: {self.closed}")
            if err is None and md is not None and md.last_entry_id != lac:
                self.world.fail(f"writer close succeeded at {md.last_entry_id}, LAC {lac}")
        self.closed = "closing"
        cas(self.meta, lambda: self.alive, lambda md: close_as_writer(md, lac, length), done)

    def die(self) -> None:
        self.alive = False
        self.world.log("writer died")


# -- recovery -----------------------------------------------------------------------------


class _SimRewriter:
    """A recovery run's rewrites as world messages: the recovery-mode writer's SendAdds
    become RECOVERY_ADD requests to the simulated bookies; its ensemble changes stay local
    (or, under the ``early_recovery_ensemble_commit`` mutation, are CASed at once)."""

    def __init__(self, owner: SimRecoverer, attempt: int, writer: LedgerWriter) -> None:
        self.owner = owner
        self.attempt = attempt
        self.writer = writer
        self.entries: dict[int, bytes] = {}
        self.truncate: set[int] = set()
        self.term: int = getattr(owner, "term", 0)

    def append(self, entry_id: int, entry: bytes, now: float, truncate: bool = False) -> None:
        eid, effects = self.writer.append(0, now)
        assert eid == entry_id, (eid, entry_id)
        self.entries[eid] = entry
        if truncate and not self.owner.world.mutations.no_truncate:
            self.truncate.add(eid)
        self._apply(effects)

    def next_deadline(self) -> float | None:
        return self.writer.next_deadline()

    def on_timer(self, now: float) -> None:
        self._apply(self.writer.on_timer(now))

    def _apply(self, effects: list[Effect]) -> None:
        owner, run = self.owner, self.owner.run
        for eff in effects:
            if not owner._live(self.attempt):
                return
            if isinstance(eff, SendAdd):
                self._send(eff)
            elif isinstance(eff, Completed):
                run.on_rewritten(eff.entry_ids, owner.world.now)
            elif isinstance(eff, ChangeEnsemble):
                self._change(eff)
            elif isinstance(eff, Failed):
                run.on_rewrite_failed(eff.kind, eff.reason)
        owner._after_input(self.attempt)

    def _send(self, eff: SendAdd) -> None:
        owner, w = self.owner, self.writer
        bookie = owner.bookies[eff.bookie]
        eid, name = eff.entry_id, eff.bookie

        def reply(status: int) -> None:
            if owner._live(self.attempt):
                now = owner.world.now
                self._apply(w.on_ack(eid, name, now) if status == Status.OK
                            else w.on_error(eid, name, status, now))
        req = add_request(eid, self.entries[eid], recovery=True, term=self.term,
                          truncate=eid in self.truncate)
        owner.world.send(lambda: bookie.on_add(req, reply),
                         f"{owner.name} rewrite {eid} -> {name}")

    def _change(self, eff: ChangeEnsemble) -> None:
        owner, w = self.owner, self.writer
        ensemble = tuple(w.ensemble)
        early = owner.world.mutations.early_recovery_ensemble_commit
        try:
            if early:  # the bug: not kept for the closing CAS, committed at once instead
                new = choose_replacements(owner.bookies, ensemble, eff.failed, owner.world.rng)
            else:
                new = owner.run.choose_replacement(eff.first_entry_id, eff.failed, ensemble,
                                                   owner.bookies, owner.world.rng)
        except NotEnoughBookiesError as exc:
            self._apply(w.ensemble_change_failed(FailureKind.NO_BOOKIES, str(exc)))
            return
        if not early:
            self._apply(w.ensemble_changed(eff.first_entry_id, new, owner.world.now))
            return

        def done(md: LedgerMetadata | None, err: ChangeRejectedError | None) -> None:
            if not owner._live(self.attempt):
                return
            if err is not None:
                self._apply(w.ensemble_change_failed(FailureKind.METADATA, str(err)))
            else:
                self._apply(w.ensemble_changed(eff.first_entry_id, new, owner.world.now))
        cas(owner.meta, lambda: owner._live(self.attempt),
            lambda md: md.with_ensemble(eff.first_entry_id, new), done)


class SimRecoverer:
    """A recoverer that runs the production driver's logic (``RecoveryRun``: requests,
    reply decoding, effect routing, local ensembles, deadlines) over world messages; the
    metadata steps are the client's own change functions in a CAS loop."""

    def __init__(self, world: World, meta: SimMetadata, bookies: dict[str, SimBookie],
                 name: str, observer: Any) -> None:
        self.world = world
        self.meta = meta
        self.bookies = bookies
        self.name = name
        self.observer = observer
        self.alive = True
        self.attempt = 0
        self.result: LedgerMetadata | None = None
        self.timer = Timer(world, f"{name} timer")
        self._closing = False

    def start(self) -> None:
        if not self.alive or self.result is not None:
            return
        self.attempt += 1
        attempt = self.attempt
        cas(self.meta, lambda: self.alive and self.attempt == attempt, begin_recovery,
            lambda md, err: self._begun(attempt, md))

    def _begun(self, attempt: int, md: LedgerMetadata | None) -> None:
        assert md is not None
        if md.is_closed:
            self._finish(md)
            return
        mutations = self.world.mutations
        flags = (ReadFlags.HIGH_PRIORITY if mutations.unfenced_recovery_reads
                 else RECOVERY_READ_FLAGS)
        self.run = RecoveryRun(
            md, LEDGER, KEY, DIGEST, read_timeout=READ_TIMEOUT, add_timeout=ADD_TIMEOUT,
            send_read=lambda req, eid, index, name: self._send_read(attempt, req, eid, index,
                                                                    name),
            make_rewriter=lambda writer: _SimRewriter(self, attempt, writer),
            read_flags=flags, start_from_minus_one=mutations.recovery_from_minus_one)
        self._closing = False
        self.world.log(f"{self.name} recovery attempt {attempt} on {list(md.last_ensemble[1])}")
        self.run.begin(self.world.now)
        self._after_input(attempt)

    def _live(self, attempt: int) -> bool:
        return self.alive and self.attempt == attempt and self.result is None

    def _after_input(self, attempt: int) -> None:
        """As the trio driver after every input: the outcome, else one timer at the run's
        next deadline."""
        if not self._live(attempt):
            return
        run = self.run
        if run.aborted is not None:
            self._retry(run.aborted.reason)
        elif run.finished is not None:
            if not self._closing:
                self._closing = True
                self._close(attempt, run.finished, dict(run.ensembles))
        else:
            def fire() -> None:
                if self._live(attempt) and self.run is run:
                    run.on_timer(self.world.now)
                    self._after_input(attempt)
            self.timer.arm(run.next_deadline(), fire)

    def _retry(self, reason: str) -> None:
        self.world.log(f"{self.name} aborted: {reason}")
        self.attempt += 1  # stale answers of this attempt are now ignored
        self.timer.arm(None, lambda: None)
        self.world.at(0.2, self.start, f"{self.name} retry")

    def _send_read(self, attempt: int, req: ReadRequest, entry_id: int, index: int,
                   name: str) -> None:
        run = self.run
        bookie = self.bookies[name]

        def reply(status: int, data: bytes) -> None:
            if not self._live(attempt) or self.run is not run:
                return
            decoded = run.on_read_reply(entry_id, index, status, data, self.world.now)
            if decoded is not None and entry_id < 0:
                self.observer.on_lac_seen(decoded.lac, f"{self.name} fence read")
            elif decoded is not None:
                self.observer.on_entry_read(entry_id, decoded.payload, self.name)
            self._after_input(attempt)
        self.world.send(lambda: bookie.on_read(req, reply),
                        f"{self.name} read {entry_id} -> {name}")

    def _close(self, attempt: int, fin: Finished, ensembles: dict[int, tuple[str, ...]]) -> None:
        def done(md: LedgerMetadata | None, err: ChangeRejectedError | None) -> None:
            if not self._live(attempt):
                return
            if err is not None:
                self._retry(f"close failed: {err}")
                return
            assert md is not None
            self._finish(md)
        cas(self.meta, lambda: self._live(attempt),
            lambda md: close_recovered(md, ensembles, fin.last_entry_id, fin.length), done)

    def _finish(self, md: LedgerMetadata) -> None:
        self.result = md
        self.world.log(f"{self.name} done: ledger closed at {md.last_entry_id}")

    def die(self) -> None:
        self.alive = False
        self.world.log(f"{self.name} died")


# -- readers ------------------------------------------------------------------------------


class SimReader:
    """Follows the ledger (non-fencing reads of each bookie's last entry for the LAC, then
    the entries up to it); once the ledger is CLOSED, reads it whole, once."""

    def __init__(self, world: World, meta: SimMetadata, bookies: dict[str, SimBookie],
                 name: str, observer: Any, *, tail: bool) -> None:
        self.world = world
        self.meta = meta
        self.bookies = bookies
        self.name = name
        self.observer = observer
        self.tail = tail
        self.lac = -1
        self.next = 0
        self.result: tuple[int, list[bytes]] | None = None
        self._round = 0

    def start(self) -> None:
        self.world.at(0.05, self._poll, f"{self.name} poll")

    def _poll(self) -> None:
        if self.result is not None:
            return
        self.meta.read(self._on_metadata)

    def _on_metadata(self, md: LedgerMetadata, _version: int) -> None:
        if md.is_closed:
            self._read_closed(md)
            return
        if self.tail:
            self._round += 1
            rnd = self._round
            for name in md.last_ensemble[1]:
                bookie = self.bookies[name]

                def reply(status: int, data: bytes, rnd: int = rnd) -> None:
                    if status == Status.OK and rnd == self._round and self.result is None:
                        lac = peek_entry_header(data).lac
                        self.observer.on_lac_seen(lac, self.name)
                        if lac > self.lac:
                            self.lac = lac
                            self._read_confirmed(md)
                self.world.send(lambda b=bookie, r=reply: b.on_read(read_request(-1, fence=False),
                                                                   r),
                                f"{self.name} lac? -> {name}")
        self.world.at(0.1, self._poll, f"{self.name} poll")

    def _read_confirmed(self, md: LedgerMetadata) -> None:
        while self.next <= self.lac:
            eid = self.next
            self.next += 1
            self._read_entry(md, eid, 0, lambda e, data: self.observer.on_entry_read(
                e, data, self.name))

    def _read_entry(self, md: LedgerMetadata, eid: int, attempt: int,
                    got: Callable[[int, bytes], None]) -> None:
        ensemble = md.ensemble_for(eid)
        ws = write_set(eid, md.ensemble_size, md.write_quorum)
        name = ensemble[ws[attempt % len(ws)]]
        bookie = self.bookies[name]
        answered = [False]

        def reply(status: int, data: bytes) -> None:
            if answered[0]:
                return
            answered[0] = True
            if status == Status.OK:
                got(eid, decode_entry(DIGEST, data, ledger_id=LEDGER, entry_id=eid).payload)
            else:
                self.world.at(0.05, lambda: self._read_entry(md, eid, attempt + 1, got),
                              f"{self.name} retry {eid}")

        def timeout() -> None:
            if not answered[0]:
                answered[0] = True
                self._read_entry(md, eid, attempt + 1, got)
        req = read_request(eid, fence=False)
        self.world.send(lambda: bookie.on_read(req, reply), f"{self.name} read {eid}")
        self.world.at(READ_TIMEOUT, timeout, f"{self.name} read timeout {eid}")

    def _read_closed(self, md: LedgerMetadata) -> None:
        if self.result is not None or getattr(self, "_closing_read", False):
            return
        self._closing_read = True
        last = md.last_entry_id
        got: dict[int, bytes] = {}

        def one(eid: int, data: bytes) -> None:
            got[eid] = data
            self.observer.on_entry_read(eid, data, self.name)
            if len(got) == last + 1:
                self.result = (last, [got[i] for i in range(last + 1)])
                self.observer.on_reader_done(self.name, self.result)
        if last < 0:
            self.result = (last, [])
            self.observer.on_reader_done(self.name, self.result)
        for eid in range(last + 1):
            self._read_entry(md, eid, 0, one)


def initial_metadata(world: World, bookies: list[str], e: int, qw: int, qa: int) -> LedgerMetadata:
    ensemble = choose_ensemble(bookies, e, world.rng)
    return LedgerMetadata(ensemble_size=e, write_quorum=qw, ack_quorum=qa,
                          ensembles=((0, ensemble),))
