"""The bookie's rules as pure code: a request and the ledger's state in, a decision out.

Every rule a bookie applies to a request lives here, and nowhere else; storage stores
what the core accepted, the trio handlers carry requests to it and decisions to storage,
and the simulator's bookies (``tests/sim``) run this same core. The rules, as
BookKeeper's bookie applies them:

- **Master key.** The first add (or fencing read) of a ledger binds its master key; a
  request with a different key answers UNAUTHORIZED. A fence with no key is refused.
- **Recovery credential.** With a cluster secret, ``wire.entry.recovery_key(secret,
  ledger)`` stands in for the master key on RECOVERY_ADDs and fencing reads only
  (autorecovery copies and fences without the ledger's password), and ForceLedger; it
  never binds a key, and a plain add or a WriteLac carrying it answers UNAUTHORIZED,
  whether or not the bookie holds a key for the ledger yet.
- **Fencing.** A plain add to a fenced ledger answers FENCED; RECOVERY_ADD bypasses the
  fence (the recovering client rewrites what it found).
- **Terms** (unbounded ledgers). Term 0 means the request does not use terms.
  A term below the ledger's answers INVALID_TERM; a higher one is adopted, journaled
  before anything the request stores. Once a ledger has a term, every add, recovery
  add, WriteLac and fencing read must carry one (term 0 answers INVALID_TERM: a
  client that does not know the term cannot slip past it); only plain reads need none.
  A read carrying a term (a new term's recovery read) must carry the ledger's key, as a
  fence must: without it anyone could raise the term and stop the writer.
- **TRUNCATE.** An add with TRUNCATE makes the bookie drop every entry after the last one
  it carries (the no-op entry that ends a term's recovery).
- **Read-only.** A read-only bookie refuses writes with READ_ONLY, except HIGH_PRIORITY
  adds (recovery) while its storage still works.
- **Entry headers.** Every entry of an add starts with its ledger id and entry id, and
  they must be the request's (BAD_REQUEST otherwise): a bookie never stores an entry
  under ids its own bytes contradict.
- **Reads.** Entry -1 means the last entry stored here. A read that fences, carries a
  term, or long-polls must wait; every other read is answered at once.
- **LAC and long polls.** A long poll answers once this bookie's LAC passes
  ``previous_lac`` (or at its timeout, capped at ``MAX_LONG_POLL_S``), and with
  PIGGYBACK it carries entry ``previous_lac + 1``. ReadLac answers NO_SUCH_ENTRY when the
  bookie holds neither an explicit LAC nor any entry.
- **Range reads.** At least one entry, at most ``max_count``; the byte budget leaves room
  in the response frame for everything that is not entry bytes.

Decisions are ``Status`` (refuse with this status) or ``Accept`` (go ahead, journaling
what it names first). The common outcome is the shared ``ACCEPT`` instance, so the add
path allocates nothing for a decision.

``RuleBreaks`` re-introduces known bugs on purpose, for the simulator's mutation
self-test (the checker must catch each); production never sets one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Protocol

from ledgerd.wire.entry import ENTRY_HEADER_SIZE, recovery_key, unpack_entry_ids
from ledgerd.wire.messages import (
    NO_MASTER_KEY,
    AddFlags,
    ForceLedgerRequest,
    Message,
    ReadFlags,
    ReadRangeRequest,
    ReadRequest,
    ReadStrideRequest,
    WriteLacRequest,
)
from ledgerd.wire.status import Status

__all__ = [
    "ACCEPT",
    "MAX_LONG_POLL_S",
    "RANGE_OVERHEAD",
    "Accept",
    "AddLike",
    "BookieCore",
    "Decision",
    "LedgerState",
    "RuleBreaks",
    "entry_ids",
]

MAX_LONG_POLL_S = 60.0
# Room left in a response frame for everything but entry bytes, and per entry (its length).
RANGE_OVERHEAD = 64
RANGE_PER_ENTRY = 4

# The ids every entry starts with (``wire.layouts.ENTRY_HEADER``: ledger_id, entry_id).
# Plain ints: an IntFlag operand would route every ``&`` through enum's Python code
# (measured by bench/bookie.py on the 1-entry case).
_RECOVERY = int(AddFlags.RECOVERY_ADD)
_ADD_HIGH_PRIORITY = int(AddFlags.HIGH_PRIORITY)
_TRUNCATE = int(AddFlags.TRUNCATE)
_SPARSE = int(AddFlags.SPARSE)
_FENCE = int(ReadFlags.FENCE)
_PIGGYBACK = int(ReadFlags.PIGGYBACK)


def entry_ids(req: AddLike) -> list[int] | None:
    """A SPARSE add's entry ids, from its entries' headers: None unless every entry
    names the request's ledger, the first is ``first_entry_id`` and the ids strictly
    ascend (a sparse add never truncates)."""
    lid = req.ledger_id
    unpack = unpack_entry_ids
    ids: list[int] = []
    previous = req.first_entry_id - 1
    for entry in req.entries:
        if len(entry) < ENTRY_HEADER_SIZE:
            return None
        elid, eid = unpack(entry)
        if elid != lid or eid <= previous or (not ids and eid != req.first_entry_id):
            return None
        ids.append(eid)
        previous = eid
    return None if req.flags & _TRUNCATE else ids


class LedgerState(Protocol):
    """What the core needs to know of a ledger (``disk.index.LedgerIndex`` is one)."""

    master_key: bytes
    fenced: bool
    term: int


class AddLike(Protocol):
    """What the core reads of an Add: an ``AddRequest``, or a run of one-entry Add frames
    cut from a connection's buffer (``wire.connection.AddRun``), which decodes to one."""

    @property
    def ledger_id(self) -> int: ...
    @property
    def first_entry_id(self) -> int: ...
    @property
    def flags(self) -> int: ...
    @property
    def master_key(self) -> bytes: ...
    @property
    def term(self) -> int: ...
    @property
    def entries(self) -> Sequence[bytes]: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class Accept:
    """Go ahead. Journal, before anything the request stores, what is named here."""

    bind_key: bytes = b""     # bind this master key (the ledger has none yet)
    new_term: int = 0         # adopt this higher term
    fence: bool = False       # set the fence bit
    truncate: bool = False    # drop every entry after the last one of this add
    entry_ids: list[int] | None = None  # a SPARSE add's ids, read from its entries


ACCEPT = Accept()
Decision = Accept | Status


@dataclass(frozen=True, slots=True)
class RuleBreaks:
    """Known bookie bugs, re-introduced for the simulator's self-test only."""

    fenced_accepts_adds: bool = False    # plain adds pass the fence
    stale_term_accepted: bool = False    # a term below the ledger's is not refused
    term_zero_bypasses: bool = False     # term 0 skips the term check on a termed ledger

    def active(self) -> list[str]:
        return [f.name for f in fields(self) if getattr(self, f.name)]


class BookieCore:
    """The bookie's rules. Stateless apart from the rule breaks it was built with."""

    __slots__ = ("breaks", "recovery_secret")

    def __init__(self, breaks: RuleBreaks | None = None, *,
                 recovery_secret: bytes = b"") -> None:
        self.breaks = breaks or RuleBreaks()
        self.recovery_secret = recovery_secret

    def is_recovery_credential(self, ledger_id: int, key: bytes) -> bool:
        """True if ``key`` is this cluster's recovery credential for ``ledger_id``."""
        secret = self.recovery_secret
        return bool(secret) and key == recovery_key(secret, ledger_id)

    # -- writes ------------------------------------------------------------------------

    def on_add(self, req: AddLike, ledger: LedgerState | None, read_only: bool,
               storage_failed: bool) -> Decision:
        """Decide an Add: refused with a status, or accepted (maybe binding the key,
        adopting a term, truncating after it). Checks in BookKeeper's order: read-only,
        the request itself, the key, the fence, the term.

        Hot: runs once per Add frame (bench/bookie.py's 1-entry case); positional
        arguments and the shared ``ACCEPT`` keep it near the inline checks it replaced.
        """
        flags = req.flags
        if read_only and (storage_failed or not flags & _ADD_HIGH_PRIORITY):
            return Status.READ_ONLY
        entries = req.entries
        lid, first = req.ledger_id, req.first_entry_id
        if first < 0 or not entries:
            return Status.BAD_REQUEST
        unpack = unpack_entry_ids
        ids: list[int] | None = None
        if flags & _SPARSE:
            ids = entry_ids(req)
            if ids is None:
                return Status.BAD_REQUEST
        else:
            for i, entry in enumerate(entries):
                if len(entry) < ENTRY_HEADER_SIZE or unpack(entry) != (lid, first + i):
                    return Status.BAD_REQUEST
        truncate = flags & _TRUNCATE != 0
        key = ledger.master_key if ledger is not None else b""
        sent = req.master_key
        if key != sent:
            # The recovery credential stands in for the key on RECOVERY_ADDs and binds
            # nothing; on a plain add it is refused even where no key is bound yet, or
            # anyone holding the cluster secret could bind it as a new ledger's key and
            # lock the writer out of that bookie.
            secret = self.recovery_secret
            if secret and sent == recovery_key(secret, lid):
                if not flags & _RECOVERY:
                    return Status.UNAUTHORIZED
                sent = b""
            elif key:
                return Status.UNAUTHORIZED
        if ledger is None:
            return Accept(bind_key=sent, new_term=req.term, truncate=truncate,
                          entry_ids=ids)
        if ledger.fenced and not flags & _RECOVERY and not self.breaks.fenced_accepts_adds:
            return Status.FENCED
        term = req.term
        new_term = 0
        if term != ledger.term:
            if term > ledger.term:
                new_term = term
            elif not term:
                if not self.breaks.term_zero_bypasses:
                    return Status.INVALID_TERM
            elif not self.breaks.stale_term_accepted:
                return Status.INVALID_TERM
        bind = b"" if key else sent
        if not bind and not new_term and not truncate and ids is None:
            return ACCEPT
        return Accept(bind_key=bind, new_term=new_term, truncate=truncate, entry_ids=ids)

    def on_term(self, term: int, ledger: LedgerState | None) -> Decision:
        """A request's term against the ledger's: refuse a lower one (term 0 included,
        once the ledger has a term), adopt a higher one."""
        current = ledger.term if ledger is not None else 0
        if not term:
            if current and not self.breaks.term_zero_bypasses:
                return Status.INVALID_TERM
            return ACCEPT
        if term < current and not self.breaks.stale_term_accepted:
            return Status.INVALID_TERM
        if term > current:
            return Accept(new_term=term)
        return ACCEPT

    def on_fence(self, master_key: bytes, ledger: LedgerState | None,
                 ledger_id: int = -1) -> Decision:
        """A fencing read: it must carry the ledger's key (or the recovery credential);
        on a ledger this bookie never saw, the key binds (the recovering client's key is
        the ledger's key), the credential does not."""
        if master_key == NO_MASTER_KEY:
            return Status.UNAUTHORIZED
        if (ledger is None or ledger.master_key != master_key) and \
                self.is_recovery_credential(ledger_id, master_key):
            return Accept(fence=True)
        if ledger is None or not ledger.master_key:
            return Accept(bind_key=master_key, fence=True)
        if ledger.master_key != master_key:
            return Status.UNAUTHORIZED
        return Accept(fence=True)

    def on_recovery_read(self, req: ReadRequest | ReadRangeRequest | ReadStrideRequest,
                         ledger: LedgerState | None) -> Decision:
        """A read's term and fence, combined: the term is adopted first, then the fence.
        A plain read (no fence, no term) passes; one with a term needs the key."""
        fencing = bool(req.flags & _FENCE)
        if not fencing and not req.term:
            return ACCEPT
        term = self.on_term(req.term, ledger)
        if not isinstance(term, Accept):
            return term
        fence = self.on_fence(req.master_key, ledger, req.ledger_id)
        if not isinstance(fence, Accept):
            return fence
        return Accept(bind_key=fence.bind_key, new_term=term.new_term, fence=fencing)

    def on_write_lac(self, req: WriteLacRequest, ledger: LedgerState | None, *,
                     read_only: bool) -> Decision:
        """An explicit LAC: only on a writable bookie, for a ledger held here, with its key."""
        if read_only:
            return Status.READ_ONLY
        if ledger is None:
            return Status.NO_SUCH_LEDGER
        term = self.on_term(req.term, ledger)  # term 0 on a termed ledger: refused
        if not isinstance(term, Accept):
            return term
        if ledger.master_key != req.master_key and (
                ledger.master_key or self.is_recovery_credential(req.ledger_id, req.master_key)):
            return Status.UNAUTHORIZED  # the recovery credential writes no LAC
        return term

    def on_force_ledger(self, req: ForceLedgerRequest, ledger: LedgerState | None) -> Status:
        """A journal barrier: any caller for a ledger not held here, else its key's holder
        (or the recovery credential's: autorecovery checks its credential with it)."""
        if ledger is not None and ledger.master_key not in (b"", req.master_key) and \
                not self.is_recovery_credential(req.ledger_id, req.master_key):
            return Status.UNAUTHORIZED
        return Status.OK

    # -- reads -------------------------------------------------------------------------

    @staticmethod
    def is_immediate(req: Message) -> bool:
        """True for a read answered at once; False if it fences, carries a term or waits."""
        if type(req) is ReadRequest:
            return not (req.flags & _FENCE or req.term or req.timeout_ms > 0)
        if type(req) is ReadRangeRequest or type(req) is ReadStrideRequest:
            return not (req.flags & _FENCE or req.term)
        return False

    def is_settled_recovery_read(self, req: Message, ledger: LedgerState | None,
                                 durably_fenced: bool) -> bool:
        """True for a fencing read that changes nothing here: the ledger is fenced
        durably, the key is accepted and binds nothing, the term is not new. It is
        answered at once, like a plain read (recovery sends one per entry it reads)."""
        if type(req) is ReadRequest:
            if req.timeout_ms > 0:
                return False
        elif type(req) is not ReadRangeRequest and type(req) is not ReadStrideRequest:
            return False
        if not durably_fenced or not req.flags & _FENCE:
            return False
        decision = self.on_recovery_read(req, ledger)
        return (isinstance(decision, Accept) and not decision.bind_key
                and not decision.new_term)

    @staticmethod
    def entry_to_read(entry_id: int, last_entry_id: int) -> int:
        """Entry -1 is the last entry stored here."""
        return last_entry_id if entry_id == -1 else entry_id

    @staticmethod
    def range_budget(req: ReadRangeRequest | ReadStrideRequest, max_frame_bytes: int
                     ) -> tuple[int, int, int] | Status:
        """(max entries, byte budget, bytes charged per entry besides its own) for a
        range read, or BAD_REQUEST.

        The budget is the smaller of the request's and what a response frame can carry,
        less the response's own fields; each entry *returned* is charged its length
        field too. (Charging it per entry *asked for* left a read with a count above
        max_bytes / 4, "as many as fit", a single entry.)
        """
        if req.max_count < 1 or req.first_entry_id < 0 or getattr(req, "stride", 1) < 1:
            return Status.BAD_REQUEST
        max_bytes = min(req.max_bytes, max_frame_bytes - RANGE_OVERHEAD)
        return req.max_count, max(0, max_bytes), RANGE_PER_ENTRY

    @staticmethod
    def long_poll_timeout(req: ReadRequest) -> float:
        """Seconds a long poll may wait (the request's timeout, capped)."""
        return min(req.timeout_ms / 1000.0, MAX_LONG_POLL_S)

    @staticmethod
    def long_poll_ready(exists: bool, lac: int, previous_lac: int) -> bool:
        """A long poll answers once the ledger exists here and its LAC passed the reader's."""
        return exists and lac > previous_lac

    @staticmethod
    def piggyback_entry(req: ReadRequest, lac: int) -> int:
        """The entry a long poll's answer carries (-1: none): ``previous_lac + 1`` with
        PIGGYBACK once the LAC has passed it."""
        if req.flags & _PIGGYBACK and lac > req.previous_lac:
            return req.previous_lac + 1
        return -1

    @staticmethod
    def read_lac_status(explicit_lac: bytes, last_entry: bytes) -> Status:
        """ReadLac: NO_SUCH_ENTRY unless the bookie holds an explicit LAC or an entry."""
        return Status.OK if explicit_lac or last_entry else Status.NO_SUCH_ENTRY
