"""The writer machine's rules for unbounded ledgers: INVALID_TERM, GWQ, fragment caps."""

from __future__ import annotations

from ledgerd.machines.writer import (
    ChangeEnsemble,
    Completed,
    Failed,
    FailureKind,
    LedgerWriter,
    Released,
    SendAdd,
)
from ledgerd.wire.status import Status

ENSEMBLE = ["a", "b", "c"]


def gwq(**kw: int) -> LedgerWriter:
    return LedgerWriter(3, 3, 2, ENSEMBLE, add_timeout=1.0, guaranteed_write_quorum=True,
                        **kw)


def test_invalid_term_fails_the_handle_and_never_changes_the_ensemble() -> None:
    w = LedgerWriter(3, 2, 2, ENSEMBLE)
    eid, _ = w.append(1, 0.0)
    effects = w.on_error(eid, "a", Status.INVALID_TERM, 0.1)
    assert [type(e) for e in effects] == [Failed]
    assert effects[0].kind is FailureKind.TERM  # type: ignore[union-attr]
    assert w.changing is None


def test_gwq_completes_at_qa_but_releases_at_qw_and_publishes_the_lafr() -> None:
    w = gwq()
    eid, _ = w.append(1, 0.0)
    w.on_ack(eid, "a", 0.1)
    done = w.on_ack(eid, "b", 0.1)
    assert Completed((0,), 0) in done and w.lac == 0
    assert w.lafr == -1 and w.published_lac == -1  # c has not answered
    assert w.on_ack(eid, "c", 0.2) == [Released((0,))]
    assert w.lafr == 0 and w.published_lac == 0


def test_gwq_change_starts_at_the_lafr_and_resends_acknowledged_entries() -> None:
    w = gwq()
    for _ in range(2):
        w.append(1, 0.0)
    for eid in (0, 1):
        w.on_ack(eid, "a", 0.1)
        w.on_ack(eid, "b", 0.1)
    effects = w.on_timer(2.0)  # c never answered: replaced from the LAFR + 1 = 0
    assert effects == [ChangeEnsemble(0, {2: "c"})]
    resent = w.ensemble_changed(0, ["a", "b", "d"], 2.1)
    assert {(e.entry_id, e.bookie) for e in resent if isinstance(e, SendAdd)} == \
        {(0, "d"), (1, "d")}
    assert w.on_ack(0, "d", 2.2) == [Released((0,))]


def test_a_bookie_holding_a_needed_ack_is_pinned_not_replaced() -> None:
    w = LedgerWriter(3, 3, 1, ENSEMBLE, add_timeout=1.0, guaranteed_write_quorum=True)
    w.append(1, 0.0)
    assert Completed((0,), 0) in w.on_ack(0, "a", 0.1)  # Qa = 1: a's copy is the one
    w.append(1, 0.15)
    assert w.on_error(1, "a", Status.IO_ERROR, 0.2) == []  # a fails entry 1: pinned
    assert w.pinned == {0} and w.changing is None
    # b and c time out: replaced (they hold nothing the entry needs); a is re-sent to.
    effects = w.on_timer(1.5)
    assert any(isinstance(e, ChangeEnsemble) for e in effects)


def test_a_full_fragment_waits_for_the_write_quorum_then_rolls() -> None:
    w = gwq(fragment_entries=2)
    for _ in range(2):
        w.append(1, 0.0)
    eid, effects = w.append(1, 0.0)
    assert eid == 2 and effects == []  # waits: 0 and 1 are not fully replicated
    out = []
    for e in (0, 1):
        for b in ENSEMBLE:
            out += w.on_ack(e, b, 0.1)
    assert ChangeEnsemble(2, {}) in out
    sent = w.ensemble_changed(2, ["d", "e", "f"], 0.2)
    assert {e.bookie for e in sent if isinstance(e, SendAdd)} == {"d", "e", "f"}
    assert w.fragment_first == 2
