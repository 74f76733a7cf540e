"""The ledger metadata model: validation, transitions, serde, paths (pure)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ledgerd.metadata.errors import ChangeRejectedError, CorruptMetadataError
from ledgerd.metadata.ledger import TRANSITIONS, LedgerMetadata, LedgerState, password_check
from ledgerd.metadata.paths import (
    LedgerLayout,
    ledger_id_from_path,
    ledger_path,
    underreplicated_path,
)

ENS = ("a:1", "b:2", "c:3")


def test_quorum_validation() -> None:
    with pytest.raises(ValueError, match="ensemble_size >= write_quorum"):
        LedgerMetadata(ensemble_size=2, write_quorum=3, ack_quorum=1, ensembles=((0, ENS[:2]),))
    with pytest.raises(ValueError, match="has 2 bookies"):
        LedgerMetadata(ensemble_size=3, write_quorum=2, ack_quorum=2, ensembles=((0, ENS[:2]),))
    with pytest.raises(ValueError, match="repeats"):
        LedgerMetadata(ensemble_size=3, write_quorum=2, ack_quorum=2,
                       ensembles=((0, ("a:1", "a:1", "b:2")),))
    with pytest.raises(ValueError, match="strictly increase"):
        LedgerMetadata(ensemble_size=3, write_quorum=2, ack_quorum=2,
                       ensembles=((0, ENS), (0, ENS)))
    with pytest.raises(ValueError, match="start at entry 0"):
        LedgerMetadata(ensemble_size=3, write_quorum=2, ack_quorum=2, ensembles=((3, ENS),))
    with pytest.raises(ValueError, match="malformed bookie id"):
        LedgerMetadata(ensemble_size=3, write_quorum=2, ack_quorum=2,
                       ensembles=((0, ("a b", "b:2", "c:3")),))
    with pytest.raises(ValueError, match="port"):
        LedgerMetadata(ensemble_size=3, write_quorum=2, ack_quorum=2,
                       ensembles=((0, ("a:0", "b:2", "c:3")),))


def test_transition_table_is_enforced() -> None:
    meta = LedgerMetadata(ensemble_size=3, write_quorum=2, ack_quorum=2, ensembles=((0, ENS),))
    for src, allowed in TRANSITIONS.items():
        for dst in LedgerState:
            from dataclasses import replace
            start = replace(meta, state=src)
            if dst in allowed:
                assert start.with_state(dst).state is dst
            else:
                with pytest.raises(ChangeRejectedError):
                    start.with_state(dst)
    closed = meta.closed(9, 100)
    with pytest.raises(ChangeRejectedError):
        closed.closed(10, 200)
    with pytest.raises(ChangeRejectedError):
        closed.with_ensemble(10, ENS)


def test_ensemble_change_and_fragments() -> None:
    meta = LedgerMetadata(ensemble_size=3, write_quorum=2, ack_quorum=2, ensembles=((0, ENS),))
    m2 = meta.with_ensemble(5, ("a:1", "d:4", "c:3"))
    m3 = m2.with_ensemble(5, ("a:1", "e:5", "c:3"))  # replaces a fragment at the same entry
    assert m3.ensembles == ((0, ENS), (5, ("a:1", "e:5", "c:3")))
    assert m3.ensemble_for(4) == ENS and m3.ensemble_for(5)[1] == "e:5"
    with pytest.raises(ChangeRejectedError):
        m3.with_ensemble(3, ENS)
    assert m3.closed(7, 10).fragments() == [(0, 4, ENS), (5, 7, ("a:1", "e:5", "c:3"))]


ids = st.integers(0, 2**63 - 1)
metas = st.builds(
    LedgerMetadata,
    ensemble_size=st.just(3), write_quorum=st.just(2), ack_quorum=st.sampled_from([1, 2]),
    ensembles=st.lists(st.integers(1, 1000), max_size=3, unique=True).map(
        lambda firsts: ((0, ENS), *((f, ENS) for f in sorted(firsts)))),
    state=st.sampled_from(list(LedgerState)), last_entry_id=st.integers(-1, 10**6),
    length=st.integers(0, 10**9), digest_type=st.sampled_from(["crc32c", "hmac", "dummy"]),
    password_check=st.just(password_check(b"k" * 20)), compression=st.sampled_from([None, "zstd"]),
    ctime_ms=st.integers(0, 2**45), term=st.integers(0, 100),
    custom_metadata=st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3),
)


@given(metas)
def test_serde_round_trip(meta: LedgerMetadata) -> None:
    raw = meta.to_json()
    assert json.loads(raw)["format"] == 1
    assert "password\"" not in raw.decode()
    assert LedgerMetadata.from_json(raw, "/p") == meta


@pytest.mark.parametrize("raw,reason", [
    (b"\xff\xfe", "not JSON"), (b"[]", "no format field"), (b'{"format": 9}', "unknown metadata format"),
    (b'{"format": 1}', "KeyError"),
])
def test_corrupt_metadata_names_path(raw: bytes, reason: str) -> None:
    with pytest.raises(CorruptMetadataError, match=reason) as info:
        LedgerMetadata.from_json(raw, "/ledgers/00/0000/L0001")
    assert info.value.path == "/ledgers/00/0000/L0001"


@given(ids)
def test_hierarchical_paths_invert(lid: int) -> None:
    path = ledger_path("/r", LedgerLayout.HIERARCHICAL, lid)
    assert ledger_id_from_path("/r", LedgerLayout.HIERARCHICAL, path) == lid
    assert path.count("/") == (4 if lid < 2**31 - 1 else 6)


def test_known_paths() -> None:
    assert ledger_path("/ledgers", "hierarchical", 1) == "/ledgers/00/0000/L0001"
    assert ledger_path("/ledgers", "hierarchical", 2**31) == "/ledgers/000/0000/0021/4748/L3648"
    assert ledger_path("/ledgers", "flat", 12) == "/ledgers/L0000000012"
    assert underreplicated_path("/ledgers", 42).endswith("/0000/0000/0000/002a/urL0000000042")
    with pytest.raises(ValueError):
        ledger_path("/ledgers", "flat", 10**10)
    with pytest.raises(ValueError):
        ledger_id_from_path("/ledgers", "hierarchical", "/ledgers/available/x")


_NAT = st.integers(min_value=0, max_value=2**62)


@given(ledgers=st.lists(_NAT, max_size=8), base=_NAT, writers=_NAT, first_seq=_NAT,
       commits=st.dictionaries(st.text(min_size=1, max_size=8), _NAT, max_size=3),
       deferred=st.lists(st.tuples(_NAT, _NAT), max_size=5), mark=_NAT)
def test_log_record_round_trips_with_its_deferred_deletions(
        ledgers: list[int], base: int, writers: int, first_seq: int,
        commits: dict[str, int], deferred: list[tuple[int, int]], mark: int) -> None:
    from ledgerd.metadata.logs import LogRecord

    record = LogRecord(tuple(ledgers), base, False, tuple(commits.items()), writers,
                       first_seq, tuple(deferred), mark)
    assert LogRecord.from_json(record.to_json(), "/logs/x") == record
    assert record.all_ledgers() == tuple(ledgers) + tuple(lid for lid, _ in deferred)


@pytest.mark.parametrize("mark", [-1, True, "3", 1.5, None])
def test_a_log_record_with_a_malformed_mark_is_corrupt(mark: object) -> None:
    from ledgerd.metadata.logs import LogRecord

    raw = json.dumps({"format": 1, "ledgers": [1], "mark": mark}).encode()
    with pytest.raises(CorruptMetadataError, match="mark must be"):
        LogRecord.from_json(raw, "/logs/x")


@pytest.mark.parametrize("deferred", [[[1]], [[1, -2]], [[1, True]], {"1": 2}, [["1", 2]]])
def test_a_log_record_with_malformed_deferred_deletions_is_corrupt(deferred: object) -> None:
    from ledgerd.metadata.logs import LogRecord

    raw = json.dumps({"format": 1, "ledgers": [1], "deferred": deferred}).encode()
    with pytest.raises(CorruptMetadataError, match="deferred must be"):
        LogRecord.from_json(raw, "/logs/x")
