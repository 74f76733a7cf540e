"""The bookie core's rules, one per test, with no storage, sockets or trio."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from ledgerd.appliance.core import (
    ACCEPT,
    MAX_LONG_POLL_S,
    Accept,
    BookieCore,
    RuleBreaks,
    entry_ids,
)
from ledgerd.wire.entry import Digester, DigestType, encode_entry
from ledgerd.wire.messages import (
    NO_MASTER_KEY,
    AddFlags,
    AddRequest,
    ForceLedgerRequest,
    ReadFlags,
    ReadRangeRequest,
    ReadRequest,
    WriteLacRequest,
)
from ledgerd.wire.status import Status

KEY = b"k" * 20
OTHER = b"o" * 20
D = Digester(DigestType.CRC32C)
core = BookieCore()


@dataclass
class Ledger:
    master_key: bytes = KEY
    fenced: bool = False
    term: int = 0


def add(first: int = 0, n: int = 1, *, key: bytes = KEY, flags: int = 0, term: int = 0,
        ledger_id: int = 1) -> AddRequest:
    return AddRequest(ledger_id=ledger_id, first_entry_id=first, flags=flags, master_key=key,
                      term=term, entries=tuple(encode_entry(D, ledger_id, first + i, -1, 0, b"x")
                                               for i in range(n)))


def decide(req: AddRequest, ledger: Ledger | None, *, read_only: bool = False,
           storage_failed: bool = False) -> Accept | Status:
    return core.on_add(req, ledger, read_only, storage_failed)


def test_first_add_binds_the_key_and_later_adds_must_match_it() -> None:
    assert decide(add(), None) == Accept(bind_key=KEY)
    assert decide(add(), Ledger(master_key=b"")) == Accept(bind_key=KEY)
    assert decide(add(), Ledger()) is ACCEPT
    assert decide(add(key=OTHER), Ledger()) == Status.UNAUTHORIZED


def test_fenced_ledger_rejects_plain_add_but_not_recovery_add() -> None:
    fenced = Ledger(fenced=True)
    assert decide(add(), fenced) == Status.FENCED
    assert decide(add(flags=AddFlags.RECOVERY_ADD), fenced) is ACCEPT
    # The key is checked before the fence: a stranger learns nothing about the fence.
    assert decide(add(key=OTHER), fenced) == Status.UNAUTHORIZED


def test_terms_lower_refused_higher_adopted() -> None:
    at5 = Ledger(term=5)
    assert decide(add(term=4), at5) == Status.INVALID_TERM
    assert decide(add(term=5), at5) is ACCEPT
    assert decide(add(term=6), at5) == Accept(new_term=6)
    assert decide(add(term=3), None) == Accept(bind_key=KEY, new_term=3)
    assert decide(add(term=0), Ledger()) is ACCEPT  # a ledger without terms


def test_term_zero_does_not_bypass_a_termed_ledger() -> None:
    """The hole issue #18 names: a request without a term must not slip past one."""
    at5 = Ledger(term=5)
    assert decide(add(term=0), at5) == Status.INVALID_TERM
    assert decide(add(term=0, flags=AddFlags.RECOVERY_ADD), at5) == Status.INVALID_TERM
    fence0 = ReadRequest(ledger_id=1, entry_id=-1, flags=ReadFlags.FENCE, master_key=KEY)
    assert core.on_recovery_read(fence0, at5) == Status.INVALID_TERM
    lac0 = WriteLacRequest(ledger_id=1, lac=3, master_key=KEY, lac_body=b"")
    assert core.on_write_lac(lac0, at5, read_only=False) == Status.INVALID_TERM
    # A plain read needs no term.
    assert core.on_recovery_read(ReadRequest(ledger_id=1, entry_id=0), at5) is ACCEPT
    hole = BookieCore(RuleBreaks(term_zero_bypasses=True))
    assert hole.on_add(add(term=0), at5, False, False) is ACCEPT


def test_a_read_carrying_a_term_needs_the_key_and_does_not_fence() -> None:
    term_read = ReadRequest(ledger_id=1, entry_id=-1, master_key=KEY, term=6)
    assert core.on_recovery_read(term_read, Ledger(term=5)) == Accept(new_term=6)
    assert core.on_recovery_read(term_read, None) == Accept(bind_key=KEY, new_term=6)
    stranger = ReadRequest(ledger_id=1, entry_id=-1, term=6)
    assert core.on_recovery_read(stranger, Ledger(term=5)) == Status.UNAUTHORIZED


def test_truncate_flag_is_carried_into_the_decision() -> None:
    got = decide(add(flags=AddFlags.TRUNCATE | AddFlags.RECOVERY_ADD, term=2), Ledger(term=1))
    assert got == Accept(new_term=2, truncate=True)


def test_read_only_refuses_writes_except_high_priority_while_storage_works() -> None:
    hp = add(flags=AddFlags.HIGH_PRIORITY | AddFlags.RECOVERY_ADD)
    assert decide(add(), Ledger(), read_only=True) == Status.READ_ONLY
    assert decide(hp, Ledger(), read_only=True) is ACCEPT
    assert decide(hp, Ledger(), read_only=True, storage_failed=True) == Status.READ_ONLY


def test_entry_headers_must_carry_the_requests_ids() -> None:
    good = add(first=3, n=2)
    assert decide(good, Ledger()) is ACCEPT
    wrong_id = AddRequest(ledger_id=1, first_entry_id=3, master_key=KEY,
                          entries=(good.entries[1], good.entries[0]))
    other_ledger = AddRequest(ledger_id=2, first_entry_id=3, master_key=KEY,
                              entries=good.entries)
    short = AddRequest(ledger_id=1, first_entry_id=3, master_key=KEY, entries=(b"\0" * 31,))
    for req in (wrong_id, other_ledger, short):
        assert decide(req, Ledger()) == Status.BAD_REQUEST


def test_sparse_adds_take_ascending_ids_from_the_entries() -> None:
    def sparse(ids: list[int], *, first: int | None = None, flags: int = 0,
               ledger_id: int = 1) -> AddRequest:
        return AddRequest(ledger_id=1, first_entry_id=ids[0] if first is None else first,
                          flags=AddFlags.SPARSE | flags, master_key=KEY, entries=tuple(
                              encode_entry(D, ledger_id, e, -1, 0, b"x") for e in ids))

    # The ids come out with the decision: the handler stores by them, no second read.
    assert decide(sparse([3, 4, 6, 7, 9]), Ledger()) == Accept(entry_ids=[3, 4, 6, 7, 9])
    assert entry_ids(sparse([3, 4, 6, 7, 9])) == [3, 4, 6, 7, 9]
    assert decide(sparse([5]), None) == Accept(bind_key=KEY, entry_ids=[5])
    for bad in (sparse([3, 4, 4]), sparse([4, 3]), sparse([3, 5], first=2),
                sparse([3, 5], ledger_id=2), sparse([3, 5], flags=AddFlags.TRUNCATE)):
        assert decide(bad, Ledger()) == Status.BAD_REQUEST
    # Without the flag, the same entries are refused: ids must then be consecutive.
    gappy = sparse([3, 5])
    plain = AddRequest(ledger_id=1, first_entry_id=3, master_key=KEY, entries=gappy.entries)
    assert decide(plain, Ledger()) == Status.BAD_REQUEST


def test_fencing_read_needs_the_key_and_binds_it_on_an_unknown_ledger() -> None:
    assert core.on_fence(NO_MASTER_KEY, None) == Status.UNAUTHORIZED
    assert core.on_fence(KEY, None) == Accept(bind_key=KEY, fence=True)
    assert core.on_fence(KEY, Ledger()) == Accept(fence=True)
    assert core.on_fence(OTHER, Ledger()) == Status.UNAUTHORIZED


def test_recovery_read_adopts_the_term_then_fences() -> None:
    fence_t3 = ReadRequest(ledger_id=1, entry_id=-1, flags=ReadFlags.FENCE, master_key=KEY,
                           term=3)
    assert core.on_recovery_read(fence_t3, Ledger(term=2)) == Accept(new_term=3, fence=True)
    assert core.on_recovery_read(fence_t3, Ledger(term=4)) == Status.INVALID_TERM
    plain = ReadRequest(ledger_id=1, entry_id=0)
    assert core.on_recovery_read(plain, Ledger()) is ACCEPT


def test_write_lac_and_force_ledger_rules() -> None:
    wl = WriteLacRequest(ledger_id=1, lac=3, master_key=KEY, lac_body=b"b")
    assert core.on_write_lac(wl, Ledger(), read_only=True) == Status.READ_ONLY
    assert core.on_write_lac(wl, None, read_only=False) == Status.NO_SUCH_LEDGER
    assert core.on_write_lac(wl, Ledger(master_key=OTHER), read_only=False) == \
        Status.UNAUTHORIZED
    assert core.on_write_lac(wl, Ledger(), read_only=False) is ACCEPT
    force = ForceLedgerRequest(ledger_id=1, master_key=KEY)
    assert core.on_force_ledger(force, None) == Status.OK
    assert core.on_force_ledger(force, Ledger(master_key=OTHER)) == Status.UNAUTHORIZED


def test_which_reads_wait() -> None:
    assert core.is_immediate(ReadRequest(ledger_id=1, entry_id=0))
    assert not core.is_immediate(ReadRequest(ledger_id=1, entry_id=0, timeout_ms=5))
    assert not core.is_immediate(ReadRequest(ledger_id=1, entry_id=-1, flags=ReadFlags.FENCE,
                                             master_key=KEY))
    assert not core.is_immediate(ReadRangeRequest(ledger_id=1, first_entry_id=0, max_count=2,
                                                  max_bytes=10, term=1))
    assert not core.is_immediate(ForceLedgerRequest(ledger_id=1, master_key=KEY))


def test_long_poll_and_piggyback_rules() -> None:
    poll = ReadRequest(ledger_id=1, entry_id=5, flags=ReadFlags.PIGGYBACK, previous_lac=4,
                       timeout_ms=10 ** 9)
    assert core.long_poll_timeout(poll) == MAX_LONG_POLL_S
    assert not core.long_poll_ready(True, 4, 4) and core.long_poll_ready(True, 5, 4)
    assert not core.long_poll_ready(False, 9, 4)
    assert core.piggyback_entry(poll, 4) == -1 and core.piggyback_entry(poll, 6) == 5
    assert core.entry_to_read(-1, 7) == 7 and core.entry_to_read(3, 7) == 3
    assert core.read_lac_status(b"", b"") == Status.NO_SUCH_ENTRY
    assert core.read_lac_status(b"x", b"") == Status.OK


def test_range_budget_refuses_nonsense_and_fits_the_frame() -> None:
    bad = ReadRangeRequest(ledger_id=1, first_entry_id=0, max_count=0, max_bytes=100)
    assert core.range_budget(bad, 1 << 20) == Status.BAD_REQUEST
    big = ReadRangeRequest(ledger_id=1, first_entry_id=0, max_count=10, max_bytes=1 << 30)
    count, nbytes, per_entry = core.range_budget(big, 1 << 20)  # type: ignore[misc]
    assert count == 10 and nbytes < 1 << 20 and per_entry == 4
    many = ReadRangeRequest(ledger_id=1, first_entry_id=0, max_count=1 << 30, max_bytes=4096)
    assert core.range_budget(many, 1 << 20) == (1 << 30, 4096, 4)  # not 4096 - 4 * count


def test_rule_breaks_break_exactly_their_rule() -> None:
    broken = BookieCore(RuleBreaks(fenced_accepts_adds=True))
    assert broken.on_add(add(), Ledger(fenced=True), False, False) is ACCEPT
    assert broken.on_add(add(key=OTHER), Ledger(fenced=True), False, False) == Status.UNAUTHORIZED
    stale = BookieCore(RuleBreaks(stale_term_accepted=True))
    assert stale.on_term(1, Ledger(term=3)) is ACCEPT
    assert RuleBreaks().active() == [] and stale.breaks.active() == ["stale_term_accepted"]


@given(key=st.sampled_from([KEY, OTHER, b""]), fenced=st.booleans(),
       ledger_term=st.integers(0, 3), req_term=st.integers(0, 3), recovery=st.booleans(),
       read_only=st.booleans(), known=st.booleans())
def test_add_decision_matches_a_brute_force_reading_of_the_rules(
        key: bytes, fenced: bool, ledger_term: int, req_term: int, recovery: bool,
        read_only: bool, known: bool) -> None:
    ledger = Ledger(master_key=key, fenced=fenced, term=ledger_term) if known else None
    flags = AddFlags.RECOVERY_ADD | AddFlags.HIGH_PRIORITY if recovery else 0
    got = decide(add(flags=flags, term=req_term), ledger, read_only=read_only)
    if read_only and not recovery:
        assert got == Status.READ_ONLY
    elif ledger is not None and ledger.master_key and ledger.master_key != KEY:
        assert got == Status.UNAUTHORIZED
    elif ledger is not None and ledger.fenced and not recovery:
        assert got == Status.FENCED
    elif ledger is not None and req_term < ledger.term:
        assert got == Status.INVALID_TERM
    else:
        assert isinstance(got, Accept)
        assert got.bind_key == (b"" if ledger is not None and ledger.master_key else KEY)
        current = ledger.term if ledger is not None else 0
        assert got.new_term == (req_term if req_term > current else 0)


# -- the recovery credential (autorecovery writes without the ledger's password) --------

SECRET = b"s" * 32
recovering = BookieCore(recovery_secret=SECRET)


def test_recovery_credential_copies_without_binding_and_is_refused_for_plain_adds() -> None:
    from ledgerd.wire.entry import recovery_key

    cred = recovery_key(SECRET, 1)
    rec = int(AddFlags.RECOVERY_ADD | AddFlags.HIGH_PRIORITY)
    # A replacement bookie that never saw the ledger: accepted, no key bound.
    assert recovering.on_add(add(key=cred, flags=rec), None, False, False) == ACCEPT
    # A bookie holding the ledger under its real key, even fenced: accepted.
    assert recovering.on_add(add(key=cred, flags=rec), Ledger(fenced=True), False,
                             False) is ACCEPT
    # An unbound ledger (copied earlier): the credential still binds nothing...
    assert recovering.on_add(add(key=cred, flags=rec), Ledger(master_key=b""), False,
                             False) is ACCEPT
    # ...and the writer's first add binds the real key.
    assert recovering.on_add(add(), Ledger(master_key=b""), False, False) == Accept(bind_key=KEY)
    # Plain adds with the credential, the credential of another ledger, and a core
    # without the secret are all refused.
    assert recovering.on_add(add(key=cred), Ledger(), False, False) == Status.UNAUTHORIZED
    assert recovering.on_add(add(key=recovery_key(SECRET, 2), flags=rec), Ledger(), False,
                             False) == Status.UNAUTHORIZED
    assert core.on_add(add(key=cred, flags=rec), Ledger(), False, False) == Status.UNAUTHORIZED
    assert recovering.on_add(add(key=recovery_key(b"x" * 32, 1), flags=rec), Ledger(), False,
                             False) == Status.UNAUTHORIZED


def test_recovery_credential_never_binds_through_a_plain_add() -> None:
    """A plain add carrying the credential to a bookie that holds no key for the ledger
    (never saw it, or holds it unbound after a copy) is refused, so nobody holding the
    cluster secret can bind it and lock the writer out; the writer's key binds later."""
    from ledgerd.wire.entry import recovery_key

    cred = recovery_key(SECRET, 1)
    for unbound in (None, Ledger(master_key=b"")):
        assert recovering.on_add(add(key=cred), unbound, False, False) == Status.UNAUTHORIZED
        assert recovering.on_add(add(key=cred, flags=int(AddFlags.HIGH_PRIORITY)), unbound,
                                 False, False) == Status.UNAUTHORIZED
        assert recovering.on_add(add(), unbound, False, False) == Accept(bind_key=KEY)
    # Nor does it write an explicit LAC, bound or not (only recovery adds, fencing
    # reads and ForceLedger take it).
    lac = WriteLacRequest(ledger_id=1, lac=0, master_key=cred, lac_body=b"")
    assert recovering.on_write_lac(lac, Ledger(master_key=b""), read_only=False) \
        == Status.UNAUTHORIZED
    assert recovering.on_write_lac(lac, Ledger(), read_only=False) == Status.UNAUTHORIZED
    assert recovering.on_force_ledger(ForceLedgerRequest(ledger_id=1, master_key=cred),
                                      Ledger()) == Status.OK


def test_recovery_credential_fences_without_binding() -> None:
    from ledgerd.wire.entry import recovery_key

    cred = recovery_key(SECRET, 1)
    assert recovering.on_fence(cred, None, 1) == Accept(fence=True)
    assert recovering.on_fence(cred, Ledger(), 1) == Accept(fence=True)
    assert recovering.on_fence(cred, Ledger(), 2) == Status.UNAUTHORIZED
    assert core.on_fence(cred, Ledger(), 1) == Status.UNAUTHORIZED
    fence = ReadRequest(ledger_id=1, entry_id=0, flags=ReadFlags.FENCE, master_key=cred)
    assert recovering.on_recovery_read(fence, None) == Accept(fence=True)
