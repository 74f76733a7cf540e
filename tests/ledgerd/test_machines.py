"""The pure protocol machines: write sets, coverage, in-order acks, ensemble change, recovery."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from ledgerd.machines.quorum import (
    EnsembleCoverage,
    ReadOutcome,
    RecoveryRead,
    range_runs,
    stride_runs,
    write_set,
)
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
from ledgerd.machines.writer import (
    ChangeEnsemble,
    Completed,
    Failed,
    FailureKind,
    LedgerWriter,
    SendAdd,
    SendAdds,
)
from ledgerd.wire.entry import Digester, DigestType, encode_entry
from ledgerd.wire.entry_check import EntryCheck, UnkeyedCheck
from ledgerd.wire.status import Status

B = ["b0", "b1", "b2", "b3", "b4"]


def test_write_sets_stripe_round_robin() -> None:
    assert [write_set(e, 3, 2) for e in range(4)] == [(0, 1), (1, 2), (2, 0), (0, 1)]
    assert write_set(7, 5, 3) == (2, 3, 4)


def test_ensemble_coverage_needs_every_window() -> None:
    c = EnsembleCoverage(3, 2, 2)  # need 1 definite per window {0,1},{1,2},{2,0}
    c.record(0, True)
    assert not c.covered  # window {1,2} has nothing
    c.record(1, False)
    assert not c.covered
    c.record(2, True)
    assert c.covered
    c5 = EnsembleCoverage(5, 3, 2)  # need 2 definite in each window of 3
    for i in (0, 2, 4):
        c5.record(i, True)
    assert not c5.covered  # window {1,2,3} holds only index 2
    c5.record(1, True)
    assert c5.covered


def test_recovery_read_rules() -> None:
    r = RecoveryRead((0, 1, 2), 3, 2)  # absent needs 2 negatives
    r.negative_answer(0)
    assert r.outcome is ReadOutcome.PENDING
    r.failure(1)
    assert r.outcome is ReadOutcome.PENDING
    r.negative_answer(2)
    assert r.outcome is ReadOutcome.ABSENT
    u = RecoveryRead((0, 1, 2), 3, 2)
    u.negative_answer(0)
    u.failure(1)
    u.failure(2)
    assert u.outcome is ReadOutcome.UNKNOWN
    f = RecoveryRead((0, 1), 2, 2)
    f.negative_answer(0)
    f.positive(1, b"x")
    assert f.outcome is ReadOutcome.FOUND


def _sends(effects: list[object]) -> list[tuple[int, str]]:
    return [(e.entry_id, e.bookie) for e in effects if isinstance(e, SendAdd)]


def test_completion_is_in_entry_order_and_lac_follows() -> None:
    w = LedgerWriter(3, 2, 2, B[:3])
    e0, s0 = w.append(10, 0.0)
    e1, s1 = w.append(10, 0.0)
    assert (e0, e1) == (0, 1)
    assert _sends(s0) == [(0, "b0"), (0, "b1")] and _sends(s1) == [(1, "b1"), (1, "b2")]
    assert w.on_ack(1, "b1", 0.1) == [] and w.on_ack(1, "b2", 0.1) == []  # 1 waits for 0
    assert w.on_ack(0, "b0", 0.2) == []
    assert w.on_ack(0, "b1", 0.2) == [Completed((0, 1), 1)]
    assert w.lac == 1 and w.length == 20 and w.idle
    assert w.on_ack(0, "b1", 0.3) == []  # a duplicate is harmless


def test_fenced_or_unauthorized_fails_the_handle_and_its_pending_appends() -> None:
    w = LedgerWriter(3, 2, 2, B[:3])
    for _ in range(3):
        w.append(1, 0.0)
    out = w.on_error(1, "b1", Status.FENCED, 0.1)
    assert out == [Failed(FailureKind.FENCED, "bookie b1 says the ledger is fenced", (0, 1, 2))]
    with pytest.raises(RuntimeError):
        w.append(1, 0.2)
    w2 = LedgerWriter(1, 1, 1, ["b0"])
    w2.append(1, 0.0)
    assert w2.on_error(0, "b0", Status.UNAUTHORIZED, 0.1)[0].kind is FailureKind.UNAUTHORIZED  # type: ignore[union-attr]


def test_bookie_failure_changes_ensemble_from_lac_plus_one_and_resends() -> None:
    w = LedgerWriter(3, 2, 2, B[:3])
    for _ in range(4):
        w.append(1, 0.0)
    w.on_ack(0, "b0", 0.1)
    w.on_ack(0, "b1", 0.1)  # LAC 0
    w.on_ack(1, "b1", 0.1)  # entry 1 waits for b2
    out = w.on_error(1, "b2", Status.IO_ERROR, 0.2)
    assert out == [ChangeEnsemble(1, {2: "b2"})]
    # During the change nothing completes, even with enough acks.
    assert w.on_ack(3, "b0", 0.3) == [] and w.on_ack(3, "b1", 0.3) == []
    e4, sent = w.append(1, 0.3)
    assert e4 == 4
    assert sent == []  # held until the change is done
    out = w.ensemble_changed(1, ["b0", "b1", "b9"], 0.4)
    sends = _sends(out)
    # Entries 1 and 2 (write sets include index 2) go to b9; entry 4 is sent in full.
    assert (1, "b9") in sends and (2, "b9") in sends and (4, "b1") in sends and (4, "b2") \
        not in sends and (4, "b9") in sends
    assert (3, "b9") not in sends  # entry 3's write set is {0, 1}
    assert w.on_ack(1, "b9", 0.5) == [Completed((1,), 1)]
    w.on_ack(2, "b9", 0.5)
    assert w.on_ack(2, "b0", 0.5) == [Completed((2, 3), 3)]
    assert w.on_ack(4, "b2", 0.5) == []  # the replaced bookie no longer counts


def test_add_timeout_is_a_bookie_failure() -> None:
    w = LedgerWriter(3, 2, 2, B[:3], add_timeout=5.0)
    w.append(1, 0.0)
    w.on_ack(0, "b0", 1.0)
    assert w.on_timer(4.9) == []
    assert w.on_timer(5.0) == [ChangeEnsemble(0, {1: "b1"})]
    assert w.on_timer(9.0) == []  # already changing


def _recovered(r: LedgerRecovery, effects: list[object]) -> list[object]:
    return [e for e in effects if isinstance(e, (Rewrite, Finished, Aborted))]


def test_recovery_fences_reads_forward_rewrites_and_finishes() -> None:
    r = LedgerRecovery(3, 2, 2, B[:3], 0, read_window=1)
    assert r.begin(0.0) == [SendFenceRead(0, "b0"), SendFenceRead(1, "b1"), SendFenceRead(2, "b2")]
    assert r.on_fence_answer(0, Status.OK, lac=3, length=40, now=0.0) == []
    out = r.on_fence_answer(2, Status.NO_SUCH_ENTRY, now=0.0)
    assert r.phase is Phase.READING and r.start == 3
    assert out == [SendRecoveryRead(4, 1, "b1"), SendRecoveryRead(4, 2, "b2")]
    out = r.on_read_answer(4, 2, Status.OK, b"e4", 50, now=0.0)
    assert out[0] == Rewrite(4, b"e4", 50)
    assert [e for e in out if isinstance(e, SendRecoveryRead)] == [
        SendRecoveryRead(5, 2, "b2"), SendRecoveryRead(5, 0, "b0")]
    assert r.on_read_answer(5, 2, Status.NO_SUCH_ENTRY, now=0.0) == []  # needs Qw-Qa+1 = 1: done
    assert r.phase is Phase.WRITING
    assert r.on_rewritten([4]) == [Finished(4, 50)]


def test_recovery_start_is_never_below_the_last_fragment() -> None:
    r = LedgerRecovery(3, 2, 2, B[:3], 10)
    r.begin(0.0)
    r.on_fence_answer(0, Status.NO_SUCH_ENTRY, now=0.0)
    r.on_fence_answer(1, Status.NO_SUCH_ENTRY, now=0.0)
    assert r.start == 9
    bad = LedgerRecovery(3, 2, 2, B[:3], 10, start_from_minus_one=True)
    bad.begin(0.0)
    bad.on_fence_answer(0, Status.NO_SUCH_ENTRY, now=0.0)
    bad.on_fence_answer(1, Status.NO_SUCH_ENTRY, now=0.0)
    assert bad.start == -1  # the mutation switch re-introduces #2615


def test_recovery_aborts_without_coverage_or_on_unknown_entries() -> None:
    r = LedgerRecovery(3, 3, 2, B[:3], 0)  # need 2 definite in the single window
    r.begin(0.0)
    r.on_fence_answer(0, Status.OK, lac=-1, now=0.0)
    r.on_fence_timeout(1, now=0.0)
    assert r.on_fence_answer(2, Status.IO_ERROR, now=0.0) == [
        Aborted(FailureKind.UNAVAILABLE,
                "fencing did not reach quorum coverage of the last ensemble")]
    r2 = LedgerRecovery(3, 3, 2, B[:3], 0, read_window=1)
    r2.begin(0.0)
    r2.on_fence_answer(0, Status.NO_SUCH_LEDGER, now=0.0)
    r2.on_fence_answer(1, Status.NO_SUCH_LEDGER, now=0.0)
    assert r2.phase is Phase.READING
    r2.on_read_answer(0, 0, Status.NO_SUCH_ENTRY, now=0.0)
    r2.on_read_timeout(0, 1, now=0.0)
    out = r2.on_read_answer(0, 2, Status.IO_ERROR, now=0.0)
    assert isinstance(out[0], Aborted) and r2.phase is Phase.ABORTED
    r3 = LedgerRecovery(1, 1, 1, ["b0"], 0)
    r3.begin(0.0)
    assert isinstance(r3.on_fence_answer(0, Status.UNAUTHORIZED, now=0.0)[0], Aborted)


def _reading(window: int, max_unwritten: int = 1024) -> tuple[LedgerRecovery, list[object]]:
    """E3/Qw2/Qa2 recovery past its fence (no LAC seen), reading from entry 0."""
    r = LedgerRecovery(3, 2, 2, B[:3], 0, read_window=window, max_unwritten=max_unwritten)
    r.begin(0.0)
    r.on_fence_answer(0, Status.NO_SUCH_LEDGER, now=0.0)
    return r, r.on_fence_answer(1, Status.NO_SUCH_LEDGER, now=0.0)


def test_recovery_reads_a_window_and_rewrites_in_entry_order() -> None:
    r, out = _reading(4)
    assert sorted({e.entry_id for e in out if isinstance(e, SendRecoveryRead)}) == [0, 1, 2, 3]
    assert r.on_read_answer(2, 2, Status.OK, b"e2", 30, now=0.0) == []
    assert r.on_read_answer(1, 1, Status.OK, b"e1", 20, now=0.0) == []
    out = r.on_read_answer(0, 0, Status.OK, b"e0", 10, now=0.0)
    assert [e for e in out if isinstance(e, Rewrite)] == [
        Rewrite(0, b"e0", 10), Rewrite(1, b"e1", 20), Rewrite(2, b"e2", 30)]
    # the window moved three entries on: reads for 4, 5, 6 went out
    assert sorted({e.entry_id for e in out if isinstance(e, SendRecoveryRead)}) == [4, 5, 6]
    assert not r.wants(0, 1)  # the other replica of a found entry is not decoded
    assert r.wants(3, 0)


def test_recovery_ends_at_the_first_absent_entry_whatever_the_order() -> None:
    r, _ = _reading(6)
    # entry 2 proven absent (Qw-Qa+1 = 1 negative) before 0 and 1 are decided
    assert r.on_read_answer(2, 2, Status.NO_SUCH_ENTRY, now=0.0) == []
    assert not r.wants(3, 0) and not r.wants(4, 1)  # reads past the end are dropped
    assert r.on_read_answer(3, 0, Status.OK, b"e3", 40, now=0.0) == []  # ignored
    assert r.on_read_answer(2, 0, Status.OK, b"e2", 30, now=0.0) == []  # absent stays absent
    r.on_read_answer(1, 1, Status.OK, b"e1", 20, now=0.0)
    out = r.on_read_answer(0, 1, Status.OK, b"e0", 10, now=0.0)
    assert [e for e in out if isinstance(e, Rewrite)] == [Rewrite(0, b"e0", 10),
                                                          Rewrite(1, b"e1", 20)]
    assert r.phase is Phase.WRITING
    assert r.on_rewritten([0, 1]) == [Finished(1, 20)]


def test_recovery_aborts_on_an_unknown_entry_only_when_it_is_next() -> None:
    r, _ = _reading(4)
    r.on_read_answer(1, 1, Status.IO_ERROR, now=0.0)
    assert r.on_read_answer(1, 2, Status.IO_ERROR, now=0.0) == []  # unknown, but 0 first
    out = r.on_read_answer(0, 0, Status.OK, b"e0", 10, now=0.0)
    assert out[0] == Rewrite(0, b"e0", 10)
    assert out[-1] == Aborted(FailureKind.UNAVAILABLE, "entry 1: neither found nor provably absent")
    # an unknown entry past the proven end does not matter
    r2, _ = _reading(4)
    r2.on_read_answer(2, 2, Status.IO_ERROR, now=0.0)
    r2.on_read_answer(2, 0, Status.IO_ERROR, now=0.0)
    r2.on_read_answer(1, 1, Status.NO_SUCH_ENTRY, now=0.0)
    r2.on_read_answer(0, 0, Status.OK, b"e0", 10, now=0.0)
    assert r2.on_rewritten([0]) == [Finished(0, 10)]


def test_recovery_pauses_reading_while_rewrites_are_behind() -> None:
    r, _ = _reading(8, max_unwritten=2)
    out = r.on_read_answer(0, 0, Status.OK, b"e0", 10, now=0.0)
    assert {e.entry_id for e in out if isinstance(e, SendRecoveryRead)} == {8}
    out = r.on_read_answer(1, 1, Status.OK, b"e1", 20, now=0.0)
    assert not [e for e in out if isinstance(e, SendRecoveryRead)]  # two unwritten: wait
    out = r.on_rewritten([0, 1], now=1.0)
    assert {e.entry_id for e in out if isinstance(e, SendRecoveryRead)} == {9}
    assert r.outstanding[(9, 0)] == 1.0  # sent at the rewrite's time, for its timeout
    with pytest.raises(ValueError, match="read_window"):
        LedgerRecovery(3, 2, 2, B[:3], 0, read_window=0)


# -- recovery without the digest's key (HMAC ledgers, autorecovery workers) ----------------

HMAC = Digester(DigestType.HMAC, b"pw")
UNKEYED = UnkeyedCheck(DigestType.HMAC.size)
LID = 7


def _hmac_entries(n: int, in_flight_from: int | None = None) -> list[bytes]:
    """Entries 0..n-1 as a writer makes them: entry e carries LAC e - 1, or (sent while
    the adds from ``in_flight_from`` on were all in flight) ``in_flight_from - 1``."""
    out, length = [], 0
    for e in range(n):
        payload = b"payload %d;" % e + bytes(e % 7)
        length += len(payload)
        lac = e - 1 if in_flight_from is None else min(e, in_flight_from) - 1
        out.append(encode_entry(HMAC, LID, e, lac, length, payload))
    return out


def _holdings(entries: list[bytes], e: int, qw: int,
              only: dict[int, set[int]] | None = None) -> list[dict[int, bytes]]:
    """What each bookie of an E-bookie ensemble holds: the entries of its write sets
    (``only``: entry id -> the indexes that got that one)."""
    held: list[dict[int, bytes]] = [{} for _ in range(e)]
    for eid, data in enumerate(entries):
        for i in (only or {}).get(eid, set(write_set(eid, e, qw))):
            held[i][eid] = data
    return held


def _drive(r: LedgerRecovery, held: list[dict[int, bytes]], verifier: Digester | EntryCheck,
           down: frozenset[int] = frozenset()) -> tuple[list[int], RecoveryEffect | None]:
    """Run a recovery against bookies holding ``held`` (``down``: answer IO_ERROR), each
    read answered in the order asked, each rewrite acknowledged at once: the entries
    rewritten, and the Finished or Aborted it ended with."""
    queue: list[RecoveryEffect] = list(r.begin(0.0))
    rewritten: list[int] = []
    end: RecoveryEffect | None = None
    while queue:
        eff = queue.pop(0)
        if isinstance(eff, (SendFenceRead, SendRecoveryRead)):
            eid = eff.entry_id if isinstance(eff, SendRecoveryRead) else -1
            mine = held[eff.index]
            if eff.index in down:
                status, data = Status.IO_ERROR, b""
            elif not mine:
                status, data = Status.NO_SUCH_LEDGER, b""
            elif eid < 0:
                status, data = Status.OK, mine[max(mine)]
            elif eid in mine:
                status, data = Status.OK, mine[eid]
            else:
                status, data = Status.NO_SUCH_ENTRY, b""
            queue += feed_reply(r, verifier, LID, eid, eff.index, status, data, 0.0)[0]
        elif isinstance(eff, Rewrite):
            rewritten.append(eff.entry_id)
            queue += r.on_rewritten([eff.entry_id], 0.0)
        elif isinstance(eff, (Finished, Aborted)):
            end = eff
    return rewritten, end


@pytest.mark.parametrize(("quorums", "down", "tail_on"), [
    ((3, 2, 2), frozenset({0}), {2}),        # a lost bookie; the in-doubt entry on one
    ((3, 2, 2), frozenset(), {2}),
    ((3, 3, 2), frozenset({2}), {0, 1}),     # Qw 3: two survivors of every entry
    ((3, 2, 1), frozenset(), set()),         # the tail reached nobody
    ((5, 3, 2), frozenset({4}), {1, 2}),
], ids=["E3Qw2-lost", "E3Qw2", "E3Qw3-lost", "E3Qw2Qa1-no-tail", "E5Qw3-lost"])
def test_unkeyed_recovery_ends_where_recovery_with_the_key_ends(
        quorums: tuple[int, int, int], down: frozenset[int], tail_on: set[int]) -> None:
    e, qw, qa = quorums
    # 0..8 acknowledged; 9..11 sent together (LAC 8), 11 in doubt (in its write set)
    entries = _hmac_entries(12, in_flight_from=9)
    held = _holdings(entries, e, qw, only={11: tail_on})
    ends = []
    for verifier in (HMAC, UNKEYED):
        r = LedgerRecovery(e, qw, qa, B[:e], 0, read_window=4,
                           unkeyed_digest_size=None if verifier is HMAC else 20)
        rewritten, end = _drive(r, held, verifier, down)
        assert isinstance(end, Finished), end
        ends.append((rewritten, end))
    assert ends[0] == ends[1]
    last = 11 if tail_on else 10
    length = int.from_bytes(entries[last][24:32], "big")
    assert ends[1][1] == Finished(last, length)


def test_unkeyed_recovery_takes_an_entry_only_once_every_replica_answered() -> None:
    entries = _hmac_entries(3)
    r = LedgerRecovery(3, 3, 2, B[:3], 0, read_window=1, unkeyed_digest_size=20)
    r.begin(0.0)
    feed_reply(r, UNKEYED, LID, -1, 0, Status.OK, entries[1], 0.0)  # LAC 0: start there
    out, _ = feed_reply(r, UNKEYED, LID, -1, 1, Status.OK, entries[1], 0.0)
    assert {x.entry_id for x in out if isinstance(x, SendRecoveryRead)} == {1}
    assert feed_reply(r, UNKEYED, LID, 1, 0, Status.OK, entries[1], 0.0)[0] == []
    assert r.wants(1, 1) and r.wants(1, 2)  # the second copy is still wanted
    assert feed_reply(r, UNKEYED, LID, 1, 2, Status.IO_ERROR, b"", 0.0)[0] == []
    out, _ = feed_reply(r, UNKEYED, LID, 1, 1, Status.OK, entries[1], 0.0)
    assert out[0] == Rewrite(1, entries[1], int.from_bytes(entries[1][24:32], "big"))
    # a replica that failed (a lost bookie) leaves one copy, checked without the key
    out, _ = feed_reply(r, UNKEYED, LID, 2, 2, Status.OK, entries[2], 0.0)
    out += feed_reply(r, UNKEYED, LID, 2, 0, Status.IO_ERROR, b"", 0.0)[0]
    assert out == []
    out, _ = feed_reply(r, UNKEYED, LID, 2, 1, Status.IO_ERROR, b"", 0.0)
    assert [x.entry_id for x in out if isinstance(x, Rewrite)] == [2]
    c = RecoveryRead((0, 1), 2, 2, corroborate=True)
    c.positive(0, b"x")
    assert c.outcome is ReadOutcome.PENDING
    c.positive(1, b"y")
    assert c.outcome is ReadOutcome.CONFLICT


def _flip_last_byte(data: bytes) -> bytes:
    return data[:-1] + bytes([data[-1] ^ 1])


def _with_header(data: bytes, field: int, value: int) -> bytes:
    return data[:8 * field] + value.to_bytes(8, "big", signed=True) + data[8 * field + 8:]


@pytest.mark.parametrize(("corrupt", "reason"), [
    (_flip_last_byte, "replicas b1 and b2 hold different bytes"),
    (lambda d: d[:40], "bookie b2 holds bytes that fail the checks"),
    (lambda d: _with_header(d, 0, LID + 1), "bookie b2 holds bytes that fail the checks"),
], ids=["payload-flipped", "truncated", "other-ledger"])
def test_unkeyed_recovery_rewrites_nothing_replicas_cannot_vouch_for(
        corrupt: Callable[[bytes], bytes], reason: str) -> None:
    entries = _hmac_entries(12, in_flight_from=8)  # recovery reads from entry 8 on
    held = _holdings(entries, 3, 3)
    held[2][9] = corrupt(held[2][9])
    r = LedgerRecovery(3, 3, 2, B[:3], 0, read_window=4, unkeyed_digest_size=20)
    rewritten, end = _drive(r, held, UNKEYED, frozenset({0}))
    assert isinstance(end, Aborted) and end.kind is FailureKind.CORRUPT, end
    assert 9 not in rewritten and reason in end.reason
    # with the key, the replica whose digest fails is passed over and the ledger closes
    r = LedgerRecovery(3, 3, 2, B[:3], 0, read_window=4)
    assert _drive(r, held, HMAC, frozenset({0}))[1] == Finished(
        11, int.from_bytes(entries[11][24:32], "big"))


def test_unkeyed_recovery_refuses_a_broken_length_chain_or_a_corrupt_fence_answer() -> None:
    entries = _hmac_entries(6)
    # entry 3's length does not grow by its payload from entry 2's (on every replica;
    # the digest would be the writer's to vouch for, and nobody can check it)
    entries[3] = _with_header(entries[3], 3, int.from_bytes(entries[3][24:32], "big") + 1)
    held = _holdings(entries, 3, 2)
    for h in held:
        h.pop(5, None)
        h.pop(4, None)
    held[0][1] = held[1][1] = entries[1]
    r = LedgerRecovery(3, 2, 2, B[:3], 0, read_window=2, unkeyed_digest_size=20)
    r.begin(0.0)
    r.on_fence_answer(0, Status.OK, lac=0, length=0, now=0.0)
    out = r.on_fence_answer(1, Status.OK, lac=0, length=0, now=0.0)
    queue = list(out)
    rewritten, end = [], None
    while queue:
        eff = queue.pop(0)
        if isinstance(eff, SendRecoveryRead):
            mine = held[eff.index]
            st, data = (Status.OK, mine[eff.entry_id]) if eff.entry_id in mine else \
                (Status.NO_SUCH_ENTRY, b"")
            queue += feed_reply(r, UNKEYED, LID, eff.entry_id, eff.index, st, data, 0.0)[0]
        elif isinstance(eff, Rewrite):
            rewritten.append(eff.entry_id)
            queue += r.on_rewritten([eff.entry_id], 0.0)
        elif isinstance(eff, (Finished, Aborted)):
            end = eff
    assert rewritten == [1, 2]
    assert isinstance(end, Aborted) and end.kind is FailureKind.CORRUPT
    assert "entry 3: length" in end.reason
    # a bookie's last entry (the fence's answer) that fails the checks: its LAC cannot
    # be trusted, so the fence stops rather than start from it
    good = _hmac_entries(3)
    r = LedgerRecovery(3, 2, 2, B[:3], 0, unkeyed_digest_size=20)
    r.begin(0.0)
    out, _ = feed_reply(r, UNKEYED, LID, -1, 0, Status.OK, _with_header(good[2], 2, 2), 0.0)
    assert isinstance(out[0], Aborted) and out[0].kind is FailureKind.CORRUPT
    assert "answered the fence" in out[0].reason
    with pytest.raises(ValueError, match="no-op"):
        LedgerRecovery(3, 2, 2, B[:3], 0, new_term=True, unkeyed_digest_size=20)


def test_placement_is_random_writable_only_and_excludes_the_ensemble() -> None:
    import random

    from ledgerd.machines.placement import (
        NotEnoughBookiesError,
        choose_ensemble,
        choose_replacements,
    )

    rng = random.Random(7)
    seen = {choose_ensemble({"a", "b", "c", "d"}, 3, rng) for _ in range(50)}
    assert len(seen) > 5 and all(len(set(e)) == 3 for e in seen)
    assert choose_ensemble({"a", "b", "c"}, 3, random.Random(1)) == \
        choose_ensemble({"c", "b", "a"}, 3, random.Random(1))  # same seed, same pick
    new = choose_replacements({"a", "b", "c", "d"}, ("a", "b", "c"), {1}, rng)
    assert new == ("a", "d", "c")
    with pytest.raises(NotEnoughBookiesError, match="needed 2, found 1"):
        choose_replacements({"a", "b", "c", "d"}, ("a", "b", "c"), {0, 1}, rng)
    with pytest.raises(NotEnoughBookiesError, match="needed 3, found 2"):
        choose_ensemble({"a", "b"}, 3, rng)


# -- metadata changes and the throttle ---------------------------------------------------

from ledgerd.machines.changes import (  # noqa: E402
    ClosedChangeError,
    EnsembleConflictError,
    FencedChangeError,
    begin_recovery,
    change_ensemble,
    close_as_writer,
    close_recovered,
)
from ledgerd.machines.throttle import TokenBucket  # noqa: E402
from ledgerd.metadata.errors import ChangeRejectedError  # noqa: E402
from ledgerd.metadata.ledger import LedgerMetadata, LedgerState  # noqa: E402


def _md(**kw: object) -> LedgerMetadata:
    base: dict[str, object] = dict(ensemble_size=3, write_quorum=2, ack_quorum=2,
                                   ensembles=((0, ("b0", "b1", "b2")),))
    base.update(kw)
    return LedgerMetadata(**base)  # type: ignore[arg-type]


def test_ensemble_change_rules() -> None:
    md = _md()
    new = change_ensemble(md, ("b0", "b1", "b2"), 5, ("b0", "b3", "b2"))
    assert new.ensembles == ((0, ("b0", "b1", "b2")), (5, ("b0", "b3", "b2")))
    with pytest.raises(EnsembleConflictError):
        change_ensemble(new, ("b0", "b1", "b2"), 7, ("b4", "b1", "b2"))
    with pytest.raises(FencedChangeError):
        change_ensemble(md.with_state(LedgerState.IN_RECOVERY), ("b0", "b1", "b2"), 5,
                        ("b0", "b3", "b2"))
    with pytest.raises(ClosedChangeError):
        change_ensemble(md.closed(3, 30), ("b0", "b1", "b2"), 5, ("b0", "b3", "b2"))


def test_writer_close_rules_follow_the_seed() -> None:
    md = _md()
    assert close_as_writer(md, 9, 90).state is LedgerState.CLOSED
    closed = md.closed(9, 90)
    assert close_as_writer(closed, 9, 90) is closed  # same end: success, nothing to write
    with pytest.raises(ClosedChangeError, match="closed at entry 9"):
        close_as_writer(closed, 12, 120)
    with pytest.raises(FencedChangeError):
        close_as_writer(md.with_state(LedgerState.IN_RECOVERY), 9, 90)
    assert issubclass(ClosedChangeError, ChangeRejectedError)


def test_recovery_begin_and_close() -> None:
    md = _md()
    rec = begin_recovery(md)
    assert rec.state is LedgerState.IN_RECOVERY
    assert begin_recovery(rec).state is LedgerState.IN_RECOVERY  # a second recoverer
    closed = close_recovered(rec, {4: ("b0", "b1", "b3")}, 6, 60)
    assert closed.ensembles[-1] == (4, ("b0", "b1", "b3")) and closed.last_entry_id == 6
    assert close_recovered(closed, {}, 3, 30) is closed  # the first close wins
    assert begin_recovery(closed) is closed


def test_token_bucket() -> None:
    t = TokenBucket(100, burst=2, now=0.0)
    assert t.take(0.0) == 0 and t.take(0.0) == 0
    assert t.take(0.0) == pytest.approx(0.01)  # third add waits one token's time
    assert t.take(1.0) == 0
    assert TokenBucket(0).take(0.0) == 0  # unlimited
    with pytest.raises(ValueError):
        TokenBucket(-1)


def test_out_of_order_mutation_switch_breaks_ordering() -> None:
    w = LedgerWriter(2, 2, 1, ["b0", "b1"], complete_out_of_order=True)
    w.append(1, 0.0)
    w.append(1, 0.0)
    assert w.on_ack(1, "b0", 0.0) == [Completed((1,), 1)]  # entry 0 still pending
    ok = LedgerWriter(2, 2, 1, ["b0", "b1"])
    ok.append(1, 0.0)
    ok.append(1, 0.0)
    assert ok.on_ack(1, "b0", 0.0) == []


def test_placement_avoids_recent_failures_while_it_can() -> None:
    import random

    from ledgerd.machines.placement import choose_ensemble, choose_replacements

    rng = random.Random(1)
    for _ in range(20):
        assert "b4" not in choose_ensemble(B, 4, rng, avoid={"b4"})
    assert len(choose_ensemble(B, 5, rng, avoid={"b4"})) == 5  # needs everyone: uses b4
    new = choose_replacements(B, ["b0", "b1", "b2"], {1}, rng, avoid={"b3"})
    assert new == ("b0", "b4", "b2")
    new = choose_replacements(B, ["b0", "b1", "b2"], {0, 1}, rng, avoid={"b3"})
    assert set(new) == {"b3", "b4", "b2"}


def test_range_runs_cover_the_range_once_on_bookies_that_hold_each_run() -> None:
    for e, qw in [(1, 1), (3, 3), (3, 2), (5, 3), (5, 1), (4, 2)]:
        for first, last, limit in [(0, 99, 7), (13, 200, 1000), (5, 5, 3), (9, 8, 4)]:
            runs = range_runs(first, last, e, qw, limit)
            covered = [x for _, a, b in runs for x in range(a, b + 1)]
            assert covered == list(range(first, last + 1))
            for index, a, b in runs:
                assert b - a + 1 <= limit
                assert all(index in write_set(x, e, qw) for x in range(a, b + 1))
    assert {i for i, _, _ in range_runs(0, 299, 3, 3, 100)} == {0, 1, 2}
    with pytest.raises(ValueError, match="run_limit"):
        range_runs(0, 1, 3, 3, 0)


def test_stride_runs_cover_the_range_once_one_class_per_bookie() -> None:
    for e, qw in [(3, 2), (5, 3), (5, 1), (4, 2), (2, 1)]:
        for first, last, limit in [(0, 99, 7), (13, 200, 1000), (5, 5, 3), (9, 8, 4),
                                   (0, 1, 1)]:
            runs = stride_runs(first, last, e, qw, limit)
            covered = sorted(x for _, a, b in runs for x in range(a, b + 1, e))
            assert covered == list(range(first, last + 1))
            for index, a, b in runs:
                assert (b - a) % e == 0 and (b - a) // e + 1 <= limit
                assert all(index in write_set(x, e, qw) for x in range(a, b + 1, e))
    # A long range: one request per bookie, not one per run of Qw entries.
    assert sorted(i for i, _, _ in stride_runs(0, 1022, 3, 2, 1024)) == [0, 1, 2]
    with pytest.raises(ValueError, match="run_limit"):
        stride_runs(0, 1, 3, 2, 0)


def test_writer_next_deadline_is_the_earliest_unanswered_add() -> None:
    w = LedgerWriter(3, 2, 2, B[:3], add_timeout=5.0)
    assert w.next_deadline() is None  # nothing waits: the driver sleeps until woken
    w.append(1, 1.0)
    w.append(1, 2.0)
    assert w.next_deadline() == 6.0
    w.on_ack(0, "b0", 2.5)
    w.on_ack(0, "b1", 2.5)
    assert w.next_deadline() == 7.0  # entry 0 is answered; entry 1 was sent at 2.0
    assert w.on_timer(6.9) == []
    # Entry 0 completed, so the change starts at entry 1 (its write set: b1, b2).
    assert w.on_timer(7.0) == [ChangeEnsemble(1, {1: "b1"})]
    # The bookie being replaced times out no further: no deadline in the past.
    deadline = w.next_deadline()
    assert deadline is None or deadline > 7.0


def test_a_run_of_acks_completes_like_the_acks_one_by_one() -> None:
    import random

    rng = random.Random(5)
    for _ in range(50):
        one, run = (LedgerWriter(3, 2, 2, B[:3]) for _ in range(2))
        for w in (one, run):
            for _ in range(12):
                w.append(1, 0.0)
        done_one: list[int] = []
        done_run: list[int] = []
        for _ in range(8):
            bookie = rng.choice(B[:3])
            first = rng.randrange(12)
            count = rng.randrange(1, 13 - first)
            for eid in range(first, first + count):
                for eff in one.on_ack(eid, bookie, 0.0):
                    done_one += eff.entry_ids  # type: ignore[union-attr]
            for eff in run.on_ack_run(first, count, bookie, 0.0):
                done_run += eff.entry_ids  # type: ignore[union-attr]
        assert done_one == done_run and one.lac == run.lac
        assert set(one.lagging) == set(run.lagging)


def _state(w: LedgerWriter) -> tuple[object, ...]:
    return (w.last_pushed, dict(w.lengths), w.rotate_at, w.changing,
            {e: (p.length, p.sent, p.waiting, p.acks, p.sent_at)
             for e, p in w.pending.items()})


def _per_bookie(effects: list[object]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for e in effects:
        if isinstance(e, SendAdd):
            out.setdefault(e.bookie, []).append(e.entry_id)
        elif isinstance(e, SendAdds):
            out.setdefault(e.bookie, []).extend(e.entry_ids)
        else:
            out.setdefault("other", []).append(repr(e))  # type: ignore[arg-type]
    return {b: sorted(ids) for b, ids in out.items()}  # type: ignore[type-var]


@pytest.mark.parametrize("layout", [(1, 1, 1), (3, 2, 2), (5, 3, 2), (3, 3, 2)])
def test_append_many_is_that_many_appends(layout: tuple[int, int, int]) -> None:
    """The batched append leaves the machine as the appends one by one would, and asks
    for the same sends; also across a filling fragment (an unbounded ledger's rotation)
    and during an ensemble change (nothing sent)."""
    import random

    e, qw, qa = layout
    rng = random.Random(e * 100 + qw)
    for case in range(30):
        kw = {"fragment_first": 0, "fragment_entries": rng.randrange(5, 40)} if case % 3 == 0 \
            else {}
        one, many = (LedgerWriter(e, qw, qa, B[:e], **kw) for _ in range(2))  # type: ignore[arg-type]
        for _ in range(rng.randrange(1, 4)):
            lengths = [rng.randrange(1, 100) for _ in range(rng.randrange(1, 30))]
            sent_one: list[object] = []
            for n in lengths:
                sent_one += one.append(n, 1.0)[1]
            first, sent_many = many.append_many(lengths, 1.0)
            assert first == one.last_pushed - len(lengths) + 1
            assert _per_bookie(sent_one) == _per_bookie(sent_many)
            assert _state(one) == _state(many)
            if case % 5 == 1:  # an ensemble change starts: later appends wait for it
                for w in (one, many):
                    w.on_error(first, B[first % e], Status.IO_ERROR, 1.5)
                assert _state(one) == _state(many)


@pytest.mark.parametrize("batched", [True, False])
def test_reserved_ids_are_the_ones_the_next_appends_take(batched: bool) -> None:
    """``reserve`` hands out ids before the appends; the next appends take exactly
    those, and the machine's state is as if the ids had never been reserved."""
    w, plain = LedgerWriter(3, 2, 2, B[:3]), LedgerWriter(3, 2, 2, B[:3])
    w.append(10, 0.0)
    plain.append(10, 0.0)
    assert [w.reserve() for _ in range(4)] == [1, 2, 3, 4]
    assert w.last_pushed == 0 and list(w.pending) == [0]  # nothing appended yet
    if batched:
        assert w.append_many([1, 2, 3, 4], 1.0)[0] == 1
        plain.append_many([1, 2, 3, 4], 1.0)
    else:
        assert [w.append(n, 1.0)[0] for n in (1, 2, 3, 4)] == [1, 2, 3, 4]
        for n in (1, 2, 3, 4):
            plain.append(n, 1.0)
    assert w.reserved == 0 and _state(w) == _state(plain)
    assert w.reserve() == 5  # after the reserved ones are taken, on from the last pushed


def test_reservations_lapse_when_the_handle_fails() -> None:
    w = LedgerWriter(3, 2, 2, B[:3])
    w.reserve()
    w.reserve()
    w.on_error(0, B[0], Status.FENCED, 0.0)  # no such pending entry: ignored
    w.append(1, 0.0)
    assert w.on_error(0, B[0], Status.FENCED, 0.0)[0] == Failed(
        FailureKind.FENCED, f"bookie {B[0]} says the ledger is fenced", (0,))
    assert w.reserved == 0
