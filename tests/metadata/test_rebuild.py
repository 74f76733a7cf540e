"""Rebuild planning (pure): from what each bookie holds back to ledger metadata, under
the striping rule and the recovery rule for the end; checked against a brute-force
reference of where a known ledger's entries went."""

from __future__ import annotations

from dataclasses import replace

import google_crc32c
from hypothesis import given, settings
from hypothesis import strategies as st

from ledgerd.metadata.kafka_topics import (
    TopicOrigin,
    TopicRecord,
    origin_record,
    partition_log_name,
    topic_origin,
)
from ledgerd.metadata.ledger import LedgerMetadata, LedgerState
from ledgerd.metadata.logheader import MAX_EXTRA, LogHeader, first_log_entry
from ledgerd.metadata.rebuild import (
    BookieLedger,
    RebuildInput,
    detect_digest,
    merge_ranges,
    plan_ledger,
    plan_logs,
    plan_rebuild,
)

BOOKIES = ("b0:1", "b1:1", "b2:1", "b3:1", "b4:1")


def _held(ensemble: tuple[str, ...], qw: int, last: int, *, lac: int,
          drop: frozenset[tuple[str, int]] = frozenset()) -> list[BookieLedger]:
    """What each bookie holds after a writer wrote entries 0..last (the reference)."""
    size = len(ensemble)
    ids: dict[str, list[int]] = {b: [] for b in ensemble}
    for e in range(last + 1):
        for i in range(qw):
            b = ensemble[(e + i) % size]
            if (b, e) not in drop:
                ids[b].append(e)
    return [BookieLedger(bookie_id=b, ledger_id=7, ranges=merge_ranges([(e, e) for e in got]),
                         lac=min(lac, max(got)), key_check="ab" * 32)
            for b, got in ids.items() if got]  # a bookie sent nothing holds no ledger


@given(st.integers(1, 5).flatmap(lambda n: st.tuples(
    st.just(n), st.integers(1, n), st.permutations(BOOKIES[:n]), st.integers(0, 40))))
def test_striped_ensemble_and_end_come_back(case: tuple[int, int, list[str], int]) -> None:
    size, qw, order, last = case
    ensemble = tuple(order)
    plan = plan_ledger(7, _held(ensemble, qw, last, lac=max(-1, last - 1)))
    md = plan.metadata
    assert md is not None and not plan.problems, plan
    assert md.state is LedgerState.OPEN and plan.end == last  # recovery closes it there
    assert md.password_check == "ab" * 32
    if last + qw >= size:  # every position got an entry: the ensemble can be known
        assert (md.ensemble_size, md.write_quorum) == (size, qw)
        # The same write sets: every entry is where the reads will look for it.
        for e in range(last + 1):
            want = {ensemble[(e + i) % size] for i in range(qw)}
            got = {md.ensembles[0][1][(e + i) % size] for i in range(qw)}
            assert got == want, (e, ensemble, md.ensembles)


def test_the_end_is_the_last_entry_held_past_the_lac_and_a_lost_acked_entry_is_named() -> None:
    ensemble = BOOKIES[:3]
    held = _held(ensemble, 2, 9, lac=5, drop=frozenset({("b2:1", 8), ("b0:1", 8)}))
    plan = plan_ledger(7, held)
    assert plan.metadata is not None and plan.end == 7
    held = _held(ensemble, 2, 9, lac=9, drop=frozenset({("b2:1", 8), ("b0:1", 8)}))
    plan = plan_ledger(7, held)
    assert plan.metadata is not None and plan.end == 9
    assert any("entry 8" in p and "lost" in p for p in plan.problems)


def test_snapshot_quorums_and_a_closed_end_win() -> None:
    snap = LedgerMetadata(ensemble_size=3, write_quorum=2, ack_quorum=1,
                          ensembles=((0, BOOKIES[:3]),), state=LedgerState.CLOSED,
                          last_entry_id=4, length=50, digest_type="crc32")
    plan = plan_ledger(7, _held(BOOKIES[:3], 2, 4, lac=3), snapshot=snap)
    assert plan.metadata == snap and plan.source == "snapshot"


def test_bookies_that_disagree_on_the_key_leave_the_ledger_out() -> None:
    held = _held(BOOKIES[:2], 2, 3, lac=3)
    held[1] = BookieLedger(bookie_id=held[1].bookie_id, ledger_id=7, ranges=held[1].ranges,
                           key_check="cd" * 32)
    plan = plan_ledger(7, held)
    assert plan.metadata is None and "disagree" in plan.problems[0]


def test_digest_type_from_entry_zero() -> None:
    header = (7).to_bytes(8, "big") + (0).to_bytes(8, "big") + (-1).to_bytes(8, "big",
                                                                            signed=True)
    payload = b"hello"
    head = header + len(payload).to_bytes(8, "big")
    crc = google_crc32c.value(head + payload).to_bytes(4, "big")
    assert detect_digest(head + crc + payload) == "crc32c"
    assert detect_digest(head + bytes(20) + payload) == "hmac"
    assert detect_digest(head + payload) == "dummy"


def test_an_unbounded_ledger_without_a_snapshot_names_its_unknown_noops() -> None:
    held = [BookieLedger(bookie_id=h.bookie_id, ledger_id=7, ranges=h.ranges, lac=h.lac,
                         term=2, key_check=h.key_check)
            for h in _held(BOOKIES[:3], 3, 9, lac=8)]
    plan = plan_ledger(7, held)
    assert plan.metadata is not None and plan.metadata.unbounded and plan.metadata.term == 2
    assert any("no-op entries" in p for p in plan.problems), plan.problems


def _held_with_change(ensembles: list[tuple[int, tuple[str, ...]]], qw: int, last: int,
                      lac: int) -> list[BookieLedger]:
    """What each bookie holds after a writer wrote entries 0..last through these
    fragments (a replaced bookie keeps the entries it got before the change)."""
    ids: dict[str, list[int]] = {}
    for e in range(last + 1):
        ens = [b for first, b in ensembles if first <= e][-1]
        for i in range(qw):
            ids.setdefault(ens[(e + i) % len(ens)], []).append(e)
    return [BookieLedger(bookie_id=b, ledger_id=7, ranges=merge_ranges([(e, e) for e in got]),
                         lac=min(lac, max(got)), key_check="ab" * 32)
            for b, got in ids.items()]


def _readable(md: LedgerMetadata, held: list[BookieLedger], last: int) -> bool:
    """Every entry has a copy on a bookie of its write set under ``md``."""
    for e in range(last + 1):
        ens = md.ensemble_for(e)
        write_set = {ens[(e + i) % md.ensemble_size] for i in range(md.write_quorum)}
        if not any(h.holds(e) for h in held if h.bookie_id in write_set):
            return False
    return True


@settings(deadline=None)
@given(st.integers(2, 5).flatmap(lambda n: st.tuples(
    st.just(n), st.integers(1, n - 1), st.permutations(BOOKIES[:n]), st.integers(0, n - 1),
    st.integers(2 * n, 30), st.integers(10, 40))))
def test_a_bookie_replaced_mid_ledger_splits_it_into_fragments(
        case: tuple[int, int, list[str], int, int, int]) -> None:
    size, qw, order, pos, change, extra = case
    old = tuple(order)
    new = tuple("b9:1" if i == pos else b for i, b in enumerate(old))
    last = change + extra
    held = _held_with_change([(0, old), (change, new)], qw, last, lac=last)
    plan = plan_ledger(7, held)
    md = plan.metadata
    assert md is not None and not plan.problems, plan
    # Not E = every holder (size + 1): the replacement starts a fragment of its own.
    assert (md.ensemble_size, md.write_quorum) == (size, qw), md
    assert len(md.ensembles) == 2 and md.ensembles[1][0] <= change + size, md.ensembles
    assert "b9:1" in md.ensembles[1][1] and "b9:1" not in md.ensembles[0][1]
    assert _readable(md, held, last)


def test_an_open_snapshot_ledger_takes_the_fragments_the_bookies_show_after_it() -> None:
    old, new = BOOKIES[:3], (BOOKIES[0], BOOKIES[3], BOOKIES[2])
    snap = LedgerMetadata(ensemble_size=3, write_quorum=2, ack_quorum=2,
                          ensembles=((0, old),), digest_type="crc32c")
    held = _held_with_change([(0, old), (12, new)], 2, 30, lac=29)
    plan = plan_rebuild(RebuildInput(held={7: held}, live=frozenset({7}), snapshot={7: snap}))
    (p,) = plan.ledgers
    assert p.update and p.metadata is not None and plan.skipped_live == 0
    assert p.metadata.ensembles[0] == (0, old) and BOOKIES[3] in p.metadata.ensembles[1][1]
    assert p.metadata.ack_quorum == 2 and _readable(p.metadata, held, 30)
    # The same ledger whose bookies show nothing new is left alone.
    same = _held_with_change([(0, old)], 2, 30, lac=29)
    plan = plan_rebuild(RebuildInput(held={7: same}, live=frozenset({7}), snapshot={7: snap}))
    assert plan.ledgers == () and plan.skipped_live == 1


def _header(name: str, seq: int, prev: int, first: int) -> LogHeader:
    return LogHeader(name=name, seq=seq, prev_ledger_id=prev, first_offset=first,
                     ensemble_size=3, write_quorum=2, ack_quorum=2)


def test_a_log_comes_back_from_its_headers_in_order_with_its_truncation_point() -> None:
    # Log "a": ledgers 3, 5 truncated away (seq 0, 1); 8 (seq 2, 10 entries from offset
    # 40), 11, 12 on the list; 13 an orphan of seq 4 holding only its header (its writer
    # stopped before adding it); 12 holds entries. Log "b" lives on.
    headers = {8: _header("a", 2, 5, 40), 11: _header("a", 3, 8, 50),
               12: _header("a", 4, 11, 57), 13: _header("a", 4, 11, 57),
               20: _header("b", 0, -1, 0)}
    ends = {8: 10, 11: 7, 12: 3, 13: 0, 20: 5}
    (log,) = plan_logs(headers, ends, live={"b"})
    assert (log.name, log.ledgers, log.base, log.first_seq) == ("a", (8, 11, 12), 40, 2)
    assert log.left_out == (13,) and len(log.problems) == 1
    # A ledger whose end is not where the next header says: named, offsets kept.
    (log,) = plan_logs(headers, {**ends, 11: 6}, live={"b"})
    assert any("move by -1" in p for p in log.problems)
    # Ledger 8 replaced by compaction (ledger 30: same place, its successor's prev
    # gone): the chain goes through the replacement.
    compacted = {**{k: v for k, v in headers.items() if k != 8}, 30: _header("a", 2, 5, 40)}
    (log,) = plan_logs(compacted, {**ends, 30: 10}, live={"b"})
    assert log.ledgers == (30, 11, 12) and log.base == 40 and log.left_out == (13,)
    # A stray replacement beside it (31: a later pass died before its swap, all 10
    # entries written; 32: one that died while writing, 4 of them; 33: holds no log
    # entry): the chain still goes through the complete one, the log is not cut short.
    strays = {**compacted, 31: _header("a", 2, 5, 40), 32: _header("a", 2, 5, 40),
              33: _header("a", 2, 5, 40)}
    (log,) = plan_logs(strays, {**ends, 30: 10, 31: 10, 32: 4, 33: 0}, live={"b"})
    assert log.ledgers == (30, 11, 12) and log.base == 40
    assert log.left_out == (13, 31, 32, 33)
    (log,) = plan_logs(strays, {**ends, 30: 9, 31: 10, 32: 4, 33: 0}, live={"b"})
    assert log.ledgers == (31, 11, 12)
    # Only an empty one where the ledger was: no replacement, the log starts after it.
    empty = {**{k: v for k, v in compacted.items() if k != 30}, 33: _header("a", 2, 5, 40)}
    (log,) = plan_logs(empty, {**ends, 33: 0}, live={"b"})
    assert log.ledgers == (11, 12) and 33 in log.left_out
    # A gap (seq 3 missing): the log starts after it.
    del headers[11]
    (log,) = plan_logs(headers, ends, live={"b"})
    assert log.ledgers == (12,) and log.base == 57 and 8 in log.left_out


def test_a_log_ledger_takes_its_quorums_and_mark_from_its_header() -> None:
    held = _held(BOOKIES[:3], 2, 9, lac=9)
    plan = plan_ledger(7, held, header=_header("a", 0, -1, 0))
    md = plan.metadata
    assert md is not None and not plan.assumed
    assert (md.ensemble_size, md.write_quorum, md.ack_quorum) == (3, 2, 2)
    assert first_log_entry(md.custom_metadata) == 1
    given_ = RebuildInput(held={7: held}, headers={7: _header("a", 0, -1, 0)})
    plan2 = plan_rebuild(given_)
    assert [lg.ledgers for lg in plan2.logs] == [(7,)]
    assert any("cursors" in what for what in plan2.lost)


TOPIC_ID = "ab" * 16


def _kafka(topic: str, p: int, seq: int, prev: int, record: TopicRecord, *,
           writers: int = 1) -> LogHeader:
    return LogHeader(name=partition_log_name(topic, p), seq=seq, prev_ledger_id=prev,
                     first_offset=-1, ensemble_size=3, write_quorum=2, ack_quorum=2,
                     writers=writers, extra=topic_origin(topic, p, record))


@given(st.builds(
    TopicRecord, partitions=st.integers(1, 10_000),
    configs=st.dictionaries(st.text(max_size=20), st.text(max_size=40), max_size=5),
    log_start=st.dictionaries(st.integers(0, 10_000), st.integers(0, 2**63 - 1), max_size=5),
    replicas=st.lists(st.lists(st.integers(0, 99), max_size=3).map(tuple), max_size=3)
    .map(tuple),
    topic_id=st.sampled_from(["", TOPIC_ID])),
    st.text(min_size=1, max_size=60), st.integers(0, 2**31 - 1))
def test_a_topic_origin_round_trips_through_a_log_header(record: TopicRecord, topic: str,
                                                         p: int) -> None:
    extra = topic_origin(topic, p, record)
    assert TopicOrigin.from_extra(extra) == TopicOrigin(topic=topic, partition=p,
                                                        record=origin_record(record, p))
    assert TopicOrigin.from_extra(extra).record.start_of(p) == record.start_of(p)
    assert TopicOrigin.from_extra(b"") is None and TopicOrigin.from_extra(b"{}") is None


def test_a_kafka_topic_comes_back_from_its_partition_logs_headers() -> None:
    old = TopicRecord(partitions=2, configs={"retention.ms": "1000"}, topic_id=TOPIC_ID,
                      log_start={0: 5})
    new = TopicRecord(partitions=3, configs={"retention.ms": "2000"}, topic_id=TOPIC_ID)
    headers = {
        # partition 0: two ledgers (a roll), the second after the configs changed
        4: _kafka("t.x", 0, 0, -1, old, writers=1),
        9: _kafka("t.x", 0, 1, 4, new, writers=3),
        # partition 1: one ledger from before the change; partition 2 never written
        6: _kafka("t.x", 1, 0, -1, old),
        # a topic the live metadata has; a plain log
        7: _kafka("live", 0, 0, -1, old),
        8: _header("plain", 0, -1, 0),
    }
    plan = plan_rebuild(RebuildInput(held={}, headers=headers,
                                     live_topics=frozenset({"live"})))
    (tp,) = plan.topics
    assert (tp.name, tp.ledger_id, tp.problems) == ("t.x", 9, ())
    assert tp.record == TopicRecord(partitions=3, configs={"retention.ms": "2000"},
                                    topic_id=TOPIC_ID, log_start={0: 5})
    assert plan.live_topics == ("live",)
    logs = {lg.name: lg for lg in plan.logs}
    assert logs["kafka.t.x.0"].ledgers == (4, 9) and logs["kafka.t.x.0"].writers == 3
    assert logs["kafka.t.x.1"].ledgers == (6,) and logs["plain"].writers == 0
    # One from the snapshot is left alone too; a header naming another log is ignored.
    plan = plan_rebuild(RebuildInput(held={}, headers={**headers, 10: replace(
        headers[9], name="kafka.other.0")}, snapshot_topics=frozenset({"t.x"})))
    assert [tp.name for tp in plan.topics] == ["live"]
    # An earlier topic of the same name (another id): its ledgers do not count.
    plan = plan_rebuild(RebuildInput(held={}, headers={
        **headers, 2: _kafka("t.x", 7, 0, -1, replace(old, topic_id="cd" * 16))}))
    tp = next(tp for tp in plan.topics if tp.name == "t.x")
    assert tp.record.partitions == 3 and "cd" * 16 in tp.problems[0]
    # Nor does its chain of a partition, though longer (seq 40 against the recreated
    # topic's 0, 1): the log is made of the chosen incarnation's ledgers only.
    plan = plan_rebuild(RebuildInput(held={}, headers={
        **headers, 1: _kafka("t.x", 0, 40, -1, replace(old, topic_id="cd" * 16))}))
    assert {lg.name: lg.ledgers for lg in plan.logs}["kafka.t.x.0"] == (4, 9)
    # A topic whose only header is on a ledger that cannot be rebuilt does not come back
    # (its record would name a partition with no log).
    plan = plan_rebuild(RebuildInput(held={20: _held(BOOKIES[:3], 2, 0, lac=-1)},
                                     headers={20: _kafka("gone", 0, 0, -1, old)}))
    assert plan.ledgers[0].metadata is None and plan.topics == ()


def test_a_topic_origin_stays_within_a_header_whatever_the_partition_count() -> None:
    """Each partition's headers carry its own low watermark, no replica assignment, and
    no configs if they would not fit: a topic of 100,000 partitions, all trimmed by
    DeleteRecords, with a thousand long configs, still fits (a header too big would
    fail every roll of the partition's writer)."""
    big = TopicRecord(partitions=100_000, log_start={p: 7 for p in range(100_000)},
                      replicas=tuple((1, 2, 3) for _ in range(100_000)),
                      configs={f"k{i}": "v" * 100 for i in range(1000)}, topic_id=TOPIC_ID)
    extra = topic_origin("big", 5, big)
    assert 0 < len(extra) <= MAX_EXTRA
    origin = TopicOrigin.from_extra(extra)
    assert origin is not None and origin.record == TopicRecord(
        partitions=100_000, log_start={5: 7}, topic_id=TOPIC_ID)


def test_a_log_ledger_holding_only_its_header_gets_its_whole_ensemble() -> None:
    # E=3, Qw=2: entry 0 (the header) on two bookies; a writer rolled to it and stopped.
    # The third position holds nothing of it: any other bookie that answered fills it.
    only_header = _held(BOOKIES[:3], 2, 0, lac=-1)
    assert len(only_header) == 2
    other = [BookieLedger(bookie_id=BOOKIES[2], ledger_id=8, ranges=((0, 5),))]
    given_ = RebuildInput(held={7: only_header, 8: other},
                          headers={7: _header("a", 1, 8, 6), 8: _header("a", 0, -1, 0)})
    plan = plan_rebuild(given_)
    p7 = next(p for p in plan.ledgers if p.ledger_id == 7)
    assert p7.metadata is not None and p7.end == 0, p7.problems
    ((first, ensemble),) = p7.metadata.ensembles
    assert first == 0 and sorted(ensemble) == sorted(BOOKIES[:3])
    assert ensemble[:2] == BOOKIES[:2]  # the holders where the striping puts entry 0
    assert [lg.ledgers for lg in plan.logs] == [(8, 7)]
    # With no third bookie to name it stays out, and so does it from its log.
    plan = plan_rebuild(RebuildInput(held={7: only_header},
                                     headers={7: _header("a", 0, -1, 0)}))
    assert plan.ledgers[0].metadata is None and plan.logs == ()
