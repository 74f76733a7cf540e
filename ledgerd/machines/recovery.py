"""Ledger recovery as a pure state machine (seeds 000/004; bookkeeper-facts §8).

The caller has already moved the metadata from OPEN to IN_RECOVERY (a CAS). Then:

1. **Fence**: a fencing read of entry -1 goes to every bookie of the *last* ensemble.
   An answer is definite when it is OK (the bookie's last entry, whose LAC field the
   caller decoded after checking the digest) or NO_SUCH_ENTRY / NO_SUCH_LEDGER.
   UNAUTHORIZED aborts. Once every write-quorum window of the ensemble has
   ``Qw - Qa + 1`` definite answers, the fence covers the ledger: no ack quorum of the
   old writer can still form.
2. **Start** from ``max(highest LAC seen, first entry of the last fragment - 1)``; never
   from -1 when the last fragment starts later (apache/bookkeeper#2615).
3. **Read forward** with fencing reads (so negatives stay negative,
   apache/bookkeeper#2614) to each entry's write set, ``read_window`` entries in flight
   at once (BookKeeper's batched recovery reads; one entry per round trip cost 4-5 ms
   per tail entry). One positive answer recovers an entry; ``Qw - Qa + 1``
   NO_SUCH_ENTRY answers prove it absent and end the ledger just before it (reads past
   it are dropped); an entry that is neither, once all have answered, aborts recovery
   when it is the next one in order (an unknown entry past the end does not matter).
4. **Rewrite** every recovered entry, in entry order, with RECOVERY_ADD (the caller
   feeds ``Rewrite`` effects to a recovery-mode ``LedgerWriter``; its ensemble changes
   stay local). At most ``max_unwritten`` recovered entries wait for their rewrite
   before reading pauses, so memory stays bounded however long the tail is.
5. **Close**: once the read has ended and every rewrite is acknowledged, ``Finished``
   carries the last entry id and length for the CAS to CLOSED.

**A new term** (unbounded ledgers; ``new_term=True``) runs the same steps with
three differences: the reads carry the term instead of the fence (the driver's
business), an INVALID_TERM answer aborts with ``FailureKind.TERM`` (a higher term took
over), and the end is marked: at the first entry proven absent, N, a no-op entry goes
out with TRUNCATE (``WriteNoop``), so every bookie drops whatever a former term left at N
and beyond. ``Finished`` then ends at N, with the ids of every no-op entry among what it
rewrote (no-ops of earlier terms included) in ``noops``. Rewrites must reach the whole
write quorum, the no-op included (the driver's writer runs with Qa = Qw): without that,
terms diverge (the TLA+ spec's counterexample).

Time: the machine keeps every read it asked for with the time it asked (``now`` comes
with each input), answers a read that is not outstanding (late, after its timeout, or a
duplicate) with nothing, and times reads out itself: drivers sleep until
``next_deadline()`` and call ``on_timer(now)``.

**Without the digest's key** (an HMAC ledger recovered by an autorecovery worker that
holds only the cluster secret; ``unkeyed_digest_size``), an answer's bytes are checked
for everything that needs no key (``wire.entry_check``), and, because that cannot prove
a payload unchanged, replicas must vouch for each other: an entry is taken only once
every replica of its write set has answered (or failed), every positive answer must
hold the same bytes, and each entry taken in order must carry a length that grows by
exactly its payload from the entry before it. A disagreement, or a positive answer
(the fence's included) whose bytes fail those checks, aborts with
``FailureKind.CORRUPT``: nothing that cannot be vouched for is rewritten, and the
ledger waits, fenced, for a recovery that holds the password. Otherwise the run decides
exactly as with the key (the same fence, start, absence rule and end), so the ledger is
closed where a recovery with the password closes it; it only waits for the last
replica's answer where the key would let it take the first. No new term can be started
this way: its no-op entry needs a digest.

``feed_reply`` is the one step from a bookie's reply to a machine input (digest check,
or the checks without the key; LAC and length from the header), shared by the trio
driver and the simulator.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from ledgerd.machines.quorum import (
    EnsembleCoverage,
    ReadOutcome,
    RecoveryRead,
    is_definite,
    write_set,
)
from ledgerd.machines.writer import FailureKind
from ledgerd.wire.entry import ENTRY_HEADER_SIZE, Digester, Entry, decode_entry
from ledgerd.wire.entry_check import EntryCheck, KeyedCheck
from ledgerd.wire.errors import WireError
from ledgerd.wire.status import Status

__all__ = ["Aborted", "Finished", "LedgerRecovery", "Phase", "Rewrite", "SendFenceRead",
           "SendRecoveryRead", "WriteNoop", "noop_length", "real_length"]

_NEGATIVE = (Status.NO_SUCH_ENTRY, Status.NO_SUCH_LEDGER)


class Phase(enum.Enum):
    FENCING = "fencing"
    READING = "reading"
    WRITING = "writing"
    DONE = "done"
    ABORTED = "aborted"


@dataclass(frozen=True, slots=True)
class SendFenceRead:
    index: int
    bookie: str


@dataclass(frozen=True, slots=True)
class SendRecoveryRead:
    entry_id: int
    index: int
    bookie: str


@dataclass(frozen=True, slots=True)
class Rewrite:
    entry_id: int
    entry: bytes
    length: int  # the entry's cumulative ledger length


@dataclass(frozen=True, slots=True)
class WriteNoop:
    """A new term's end marker: a no-op entry at ``entry_id`` written with TRUNCATE,
    carrying the LAC frozen at the start of recovery and the ledger's length so far."""

    entry_id: int
    lac: int
    length: int


@dataclass(frozen=True, slots=True)
class Finished:
    last_entry_id: int
    length: int
    noops: tuple[int, ...] = ()


def noop_length(length: int) -> int:
    """A no-op entry's length field: negative (-1 - the ledger's length), which no data
    entry has, so any reader holding only the entry's bytes can tell it apart."""
    return -1 - length


def real_length(length: int) -> int:
    """The ledger length an entry's length field stands for (no-op or not)."""
    return -1 - length if length < 0 else length


@dataclass(frozen=True, slots=True)
class Aborted:
    """Recovery stopped; ``kind`` says why (drivers branch on it), ``reason`` tells a human."""

    kind: FailureKind
    reason: str


RecoveryEffect = SendFenceRead | SendRecoveryRead | Rewrite | WriteNoop | Finished | Aborted


class LedgerRecovery:
    def __init__(self, ensemble_size: int, write_quorum: int, ack_quorum: int,
                 ensemble: Sequence[str], last_fragment_first_entry: int, *,
                 read_timeout: float = float("inf"), read_window: int = 64,
                 max_unwritten: int = 1024, new_term: bool = False,
                 start_from_minus_one: bool = False,
                 unkeyed_digest_size: int | None = None) -> None:
        if read_window < 1 or max_unwritten < 1:
            raise ValueError(f"read_window and max_unwritten must be at least 1, got "
                             f"{read_window} and {max_unwritten}")
        if new_term and unkeyed_digest_size is not None:
            raise ValueError("a new term writes a no-op entry, whose digest needs the key")
        # Answers checked without the digest's key: replicas must corroborate each other.
        self.unkeyed_digest_size = unkeyed_digest_size
        self.e, self.qw, self.qa = ensemble_size, write_quorum, ack_quorum
        self.ensemble = list(ensemble)
        self.first_of_last = last_fragment_first_entry
        self.coverage = EnsembleCoverage(ensemble_size, write_quorum, ack_quorum)
        self.max_lac = -1
        self.max_lac_length = 0
        self.phase = Phase.FENCING
        self.start = -1
        self.read_window = read_window
        self.max_unwritten = max_unwritten
        # Entries read and not yet taken in order: their reads, and the found ones' lengths.
        self.reads: dict[int, RecoveryRead] = {}
        self.lengths: dict[int, int] = {}
        self.frontier = 0        # the next entry to take in order
        self.next_read = 0       # the next entry to send reads for
        self.end_at = -1         # the first entry proven absent (-1: none yet)
        self.last_found = -1
        self.last_length = 0
        self.read_ended = False
        self.rewrites_pending: set[int] = set()
        self.read_timeout = read_timeout
        # Reads asked for and not answered: (entry id, -1 for the fence; index) -> sent
        # at. Insertion order is send order, so the first one times out first.
        self.outstanding: dict[tuple[int, int], float] = {}
        self.now = 0.0
        self.new_term = new_term
        self.noops: list[int] = []   # no-op entries among the rewrites (and the one written)
        # Mutation switch for the simulator's self-test only (#2615 re-introduced).
        self._start_from_minus_one = start_from_minus_one

    def begin(self, now: float) -> list[RecoveryEffect]:
        self.now = now
        for i in range(len(self.ensemble)):
            self.outstanding[(-1, i)] = now
        return [SendFenceRead(i, b) for i, b in enumerate(self.ensemble)]

    # -- time --------------------------------------------------------------------------

    def next_deadline(self) -> float | None:
        """When the oldest outstanding read times out (None: no read outstanding)."""
        if self.phase in (Phase.DONE, Phase.ABORTED):
            return None
        for sent in self.outstanding.values():
            return sent + self.read_timeout
        return None

    def on_timer(self, now: float) -> list[RecoveryEffect]:
        """Every outstanding read older than ``read_timeout`` failed (an IO_ERROR)."""
        self.now = now
        expired = []
        for key, sent in self.outstanding.items():
            if sent + self.read_timeout > now:
                break
            expired.append(key)
        effects: list[RecoveryEffect] = []
        for entry_id, index in expired:
            if entry_id < 0:
                effects += self.on_fence_timeout(index, now=now)
            else:
                effects += self.on_read_timeout(entry_id, index, now=now)
        return effects

    def wants(self, entry_id: int, index: int) -> bool:
        """True if an answer to this read (entry -1: the fence) would change anything;
        drivers skip decoding the rest (the second replica of an entry already found)."""
        return (entry_id, index) in self.outstanding

    def _answered(self, entry_id: int, index: int, now: float) -> bool:
        """Take an answer off the outstanding table; False if it was not outstanding."""
        self.now = now
        return self.outstanding.pop((entry_id, index), None) is not None

    # -- phase 1: fence ----------------------------------------------------------------

    def on_fence_answer(self, index: int, status: int, lac: int = -1,
                        length: int = 0, *, now: float) -> list[RecoveryEffect]:
        """A fencing read's answer; with OK, ``lac`` and ``length`` from the entry header."""
        if not self._answered(-1, index, now) or self.phase is not Phase.FENCING:
            return []
        if status == Status.UNAUTHORIZED:
            return self._abort(FailureKind.UNAUTHORIZED,
                               f"bookie {self.ensemble[index]} answered UNAUTHORIZED")
        if status == Status.INVALID_TERM:
            return self._abort(FailureKind.TERM, f"bookie {self.ensemble[index]} holds a "
                                                 "higher term: another writer took over")
        self.coverage.record(index, is_definite(status))
        if status == Status.OK and lac > self.max_lac:
            self.max_lac, self.max_lac_length = lac, real_length(length)
        if self.coverage.covered:
            return self._start_reading()
        if self.coverage.all_answered:
            return self._abort(FailureKind.UNAVAILABLE,
                               "fencing did not reach quorum coverage of the last ensemble")
        return []

    def on_fence_timeout(self, index: int, *, now: float) -> list[RecoveryEffect]:
        return self.on_fence_answer(index, Status.IO_ERROR, now=now)

    def _start_reading(self) -> list[RecoveryEffect]:
        self.phase = Phase.READING
        self.outstanding.clear()  # fence answers still to come change nothing now
        self.start = self.max_lac if self._start_from_minus_one else \
            max(self.max_lac, self.first_of_last - 1)
        self.last_found = self.start
        self.last_length = self.max_lac_length
        return self._start_reads(self.start + 1)

    # -- phase 2: read forward ---------------------------------------------------------

    def _start_reads(self, first: int) -> list[RecoveryEffect]:
        self.frontier = self.next_read = first
        return self._fill()

    def _fill(self) -> list[RecoveryEffect]:
        """Send reads for the next entries while the window and the rewrites allow."""
        out: list[RecoveryEffect] = []
        limit = self.frontier + self.read_window
        if self.end_at >= 0:
            limit = min(limit, self.end_at)
        while self.next_read < limit and len(self.rewrites_pending) < self.max_unwritten:
            entry_id = self.next_read
            self.next_read += 1
            indexes = write_set(entry_id, self.e, self.qw)
            for i in indexes:
                self.outstanding[(entry_id, i)] = self.now
            self.reads[entry_id] = RecoveryRead(
                indexes, self.qw, self.qa, corroborate=self.unkeyed_digest_size is not None)
            out += [SendRecoveryRead(entry_id, i, self.ensemble[i]) for i in indexes]
        return out

    def on_read_answer(self, entry_id: int, index: int, status: int, entry: bytes = b"",
                       length: int = 0, *, now: float) -> list[RecoveryEffect]:
        """A recovery read's answer; ``entry`` only when OK *and* its digest checked."""
        if not self._answered(entry_id, index, now) or self.phase is not Phase.READING:
            return []
        r = self.reads.get(entry_id)
        if r is None or 0 <= self.end_at <= entry_id:
            return []  # taken already, or at or past the proven end (absent stays absent)
        if status == Status.OK and entry:
            if r.found is None:
                self.lengths[entry_id] = length
            r.positive(index, entry)
        elif status in _NEGATIVE:
            r.negative_answer(index)
        elif status == Status.UNAUTHORIZED:
            return self._abort(FailureKind.UNAUTHORIZED,
                               f"bookie {self.ensemble[index]} answered UNAUTHORIZED")
        elif status == Status.INVALID_TERM:
            return self._abort(FailureKind.TERM, f"bookie {self.ensemble[index]} holds a "
                                                 "higher term: another writer took over")
        else:
            r.failure(index)
        if r.outcome is ReadOutcome.ABSENT and (self.end_at < 0 or entry_id < self.end_at):
            self._end_at(entry_id)
        return self._advance()

    def on_corrupt_answer(self, entry_id: int, index: int, reason: str, *,
                          now: float) -> list[RecoveryEffect]:
        """An OK answer (entry -1: the fence's) whose bytes fail the checks that need no
        key, which only unkeyed recovery tells apart from a failed read: that replica
        holds bytes its writer never wrote. A fence answer aborts (CORRUPT) at once: the
        LAC it carries cannot be trusted, nor ignored as a mere failure. An entry's is
        decided in order, as a disagreement (an entry past the ledger's end does not
        matter)."""
        if not self._answered(entry_id, index, now):
            return []
        if entry_id < 0:
            if self.phase is not Phase.FENCING:
                return []
            return self._abort(FailureKind.CORRUPT, f"bookie {self.ensemble[index]} "
                               "answered the fence with a last entry whose bytes fail the "
                               f"checks that need no key ({reason})")
        r = self.reads.get(entry_id)
        if self.phase is not Phase.READING or r is None or 0 <= self.end_at <= entry_id:
            return []
        r.corrupt(index, reason)
        return self._advance()

    def _end_at(self, entry_id: int) -> None:
        """``entry_id`` is proven absent: the ledger ends before it; reads past it stop."""
        self.end_at = entry_id
        for later in [e for e in self.reads if e > entry_id]:
            del self.reads[later]
            self.lengths.pop(later, None)
        for key in [k for k in self.outstanding if k[0] > entry_id]:
            del self.outstanding[key]

    def _advance(self) -> list[RecoveryEffect]:
        """Take decided entries in order: rewrite found ones, end at an absent one."""
        out: list[RecoveryEffect] = []
        while True:
            r = self.reads.get(self.frontier)
            if r is None:
                break
            outcome = r.outcome
            entry_id = self.frontier
            if outcome is ReadOutcome.FOUND:
                assert r.found is not None
                del self.reads[entry_id]
                length = self.lengths.pop(entry_id)
                broken = self._breaks_length_chain(entry_id, r.found, length)
                if broken:
                    return out + self._abort(FailureKind.CORRUPT, broken)
                if length < 0:
                    self.noops.append(entry_id)
                self.last_found, self.last_length = entry_id, real_length(length)
                self.rewrites_pending.add(entry_id)
                for i in r.indexes:
                    self.outstanding.pop((entry_id, i), None)
                out.append(Rewrite(entry_id, r.found, length))
                self.frontier += 1
                continue
            if outcome is ReadOutcome.ABSENT:
                self.read_ended = True
                self.phase = Phase.WRITING
                self.outstanding.clear()
                self.reads.clear()
                if self.new_term:
                    out.append(WriteNoop(entry_id, self.start, self.last_length))
                    self.noops.append(entry_id)
                    self.rewrites_pending.add(entry_id)
                    self.last_found = entry_id
                return out + self._maybe_finish()
            if outcome is ReadOutcome.UNKNOWN:
                return out + self._abort(FailureKind.UNAVAILABLE,
                                         f"entry {entry_id}: neither found nor provably absent")
            if outcome is ReadOutcome.CONFLICT:
                assert r.conflict is not None
                if r.corrupt_reason:
                    reason = (f"entry {entry_id}: bookie {self.ensemble[r.conflict]} holds "
                              "bytes that fail the checks that need no key "
                              f"({r.corrupt_reason})")
                else:
                    reason = (f"entry {entry_id}: replicas {self.ensemble[r.found_index]} "
                              f"and {self.ensemble[r.conflict]} hold different bytes, and "
                              "without the password neither can be verified")
                return out + self._abort(FailureKind.CORRUPT, reason)
            break
        return out + self._fill()

    def _breaks_length_chain(self, entry_id: int, entry: bytes, length: int) -> str:
        """Unkeyed only: why ``entry`` (taken in order) cannot follow the entry before
        it, or "". Its length must grow by exactly its payload from the one before; the
        first entry read has no known predecessor (the fence gave the LAC's successor's
        length, not the LAC's), and its own checks bound it."""
        if self.unkeyed_digest_size is None or entry_id <= self.start + 1:
            return ""
        payload = len(entry) - ENTRY_HEADER_SIZE - self.unkeyed_digest_size
        if real_length(length) - self.last_length == payload:
            return ""
        return (f"entry {entry_id}: length {real_length(length)} does not follow entry "
                f"{entry_id - 1}'s {self.last_length} by its {payload}-byte payload, and "
                "without the password neither can be verified")

    def on_read_timeout(self, entry_id: int, index: int, *, now: float) -> list[RecoveryEffect]:
        return self.on_read_answer(entry_id, index, Status.IO_ERROR, now=now)

    # -- phase 3: rewrites -------------------------------------------------------------

    def on_rewritten(self, entry_ids: Sequence[int], now: float | None = None,
                     ) -> list[RecoveryEffect]:
        if now is not None:
            self.now = now
        self.rewrites_pending.difference_update(entry_ids)
        if self.phase is Phase.READING:
            return self._fill()
        return self._maybe_finish()

    def _maybe_finish(self) -> list[RecoveryEffect]:
        if self.phase is Phase.WRITING and self.read_ended and not self.rewrites_pending:
            self.phase = Phase.DONE
            return [Finished(self.last_found, self.last_length, tuple(self.noops))]
        return []

    def _abort(self, kind: FailureKind, reason: str) -> list[RecoveryEffect]:
        if self.phase in (Phase.DONE, Phase.ABORTED):
            return []
        self.phase = Phase.ABORTED
        self.outstanding.clear()
        return [Aborted(kind, reason)]


def feed_reply(machine: LedgerRecovery, verifier: Digester | EntryCheck, ledger_id: int,
               entry_id: int, index: int, status: int, entry: bytes, now: float,
               ) -> tuple[list[RecoveryEffect], Entry | None]:
    """A bookie's reply to a recovery read (``entry_id`` -1: the fencing read), as the
    machine's input: an OK whose entry fails its digest or ids counts as IO_ERROR. With
    an unkeyed ``verifier`` (``EntryCheck`` whose ``keyed`` is False) an OK is checked
    for what needs no key, and one that fails is ``on_corrupt_answer``. Returns the
    effects and the checked entry (None unless OK and checked)."""
    if isinstance(verifier, KeyedCheck):
        verifier = verifier.digester
    if isinstance(verifier, EntryCheck):
        return _feed_unkeyed(machine, verifier, ledger_id, entry_id, index, status, entry, now)
    decoded: Entry | None = None
    if status == Status.OK:
        try:
            decoded = decode_entry(verifier, entry, ledger_id=ledger_id,
                                   entry_id=None if entry_id < 0 else entry_id)
        except WireError:
            status = Status.IO_ERROR
    if entry_id < 0:
        if decoded is not None:
            return machine.on_fence_answer(index, Status.OK, decoded.lac, decoded.length,
                                           now=now), decoded
        return machine.on_fence_answer(index, status, now=now), None
    if decoded is not None:
        return machine.on_read_answer(entry_id, index, Status.OK, bytes(entry), decoded.length,
                                      now=now), decoded
    return machine.on_read_answer(entry_id, index, status, now=now), None


def _feed_unkeyed(machine: LedgerRecovery, check: EntryCheck, ledger_id: int, entry_id: int,
                  index: int, status: int, entry: bytes, now: float,
                  ) -> tuple[list[RecoveryEffect], Entry | None]:
    if status != Status.OK:
        if entry_id < 0:
            return machine.on_fence_answer(index, status, now=now), None
        return machine.on_read_answer(entry_id, index, status, now=now), None
    data = bytes(entry)
    try:
        lac, length = check.entry(data, ledger_id, None if entry_id < 0 else entry_id)
    except WireError as exc:
        return machine.on_corrupt_answer(entry_id, index, str(exc), now=now), None
    eid = entry_id if entry_id >= 0 else int.from_bytes(data[8:16], "big", signed=True)
    checked = Entry(ledger_id, eid, lac, length, data[ENTRY_HEADER_SIZE + check.digest_size:])
    if entry_id < 0:
        return machine.on_fence_answer(index, Status.OK, lac, length, now=now), checked
    return machine.on_read_answer(entry_id, index, Status.OK, data, length, now=now), checked
