"""``ServerConnection.take_add_run``: the bookie's fast cut of one-entry Add frames must
see exactly the requests ``next_event`` would decode, in order, whatever the stream."""

from __future__ import annotations

import itertools
import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from ledgerd.wire.connection import (
    NEED_DATA,
    AddRun,
    ConnectionEnded,
    RequestRejected,
    ServerConnection,
)
from ledgerd.wire.frames import DecodedRequest, encode_request
from ledgerd.wire.messages import AddFlags, AddRequest, ApiKey, ReadLacRequest

_UNMERGED = int(AddFlags.SPARSE | AddFlags.TRUNCATE)
_KEYS = (b"k" * 20, b"j" * 20)


def _add(cid: int, ledger: int, entry: int, *, flags: int = 0, key: bytes = _KEYS[0],
         term: int = 0, entries: tuple[bytes, ...] = (b"e" * 30,), version: int = 0) -> bytes:
    req = AddRequest(ledger_id=ledger, first_entry_id=entry, flags=flags, master_key=key,
                     term=term, entries=entries)
    return bytes(encode_request(req, cid, api_version=version))


def _normalized(ev: object) -> list[tuple[object, ...]]:
    """Per-frame records that compare a run's frames with decoded requests."""
    if isinstance(ev, AddRun):
        assert all(type(e) is bytes for e in ev.entries)
        return [(cid, int(ApiKey.ADD), ev.ledger_id, ev.first_entry_id + i, ev.flags,
                 ev.master_key, ev.term, (entry,))
                for i, (cid, entry) in enumerate(zip(ev.correlation_ids, ev.entries,
                                                     strict=True))]
    if isinstance(ev, DecodedRequest):
        m = ev.message
        if isinstance(m, AddRequest):
            return [(ev.correlation_id, int(ApiKey.ADD), m.ledger_id, m.first_entry_id,
                     int(m.flags), m.master_key, m.term, tuple(bytes(e) for e in m.entries))]
        return [(ev.correlation_id, int(ev.api_key), m)]
    if isinstance(ev, RequestRejected):
        return [("rejected", ev.correlation_id, ev.status, ev.close)]
    assert isinstance(ev, ConnectionEnded)
    return [("ended", ev.partial_frame)]


def _reference(chunks: list[bytes]) -> tuple[list[tuple[object, ...]], set[int]]:
    conn = ServerConnection(max_inflight=1 << 20, max_frame_bytes=_MAX_FRAME)
    out: list[tuple[object, ...]] = []
    for chunk in chunks:
        if conn.closed:
            break
        conn.receive_data(chunk)
        while not conn.closed:
            ev = conn.next_event()
            if ev is NEED_DATA:
                break
            out += _normalized(ev)
    return out, set(conn.inflight)


def _with_runs(chunks: list[bytes]) -> tuple[list[tuple[object, ...]], set[int], int]:
    conn = ServerConnection(max_inflight=1 << 20, max_frame_bytes=_MAX_FRAME)
    out: list[tuple[object, ...]] = []
    runs = 0
    for chunk in chunks:
        if conn.closed:
            break
        conn.receive_data(chunk)
        while not conn.closed:
            run = conn.take_add_run(_UNMERGED)
            if run is not None:
                runs += 1
                out += _normalized(run)
                continue
            ev = conn.next_event()
            if ev is NEED_DATA:
                break
            out += _normalized(ev)
    return out, set(conn.inflight), runs


_ONE_ENTRY = st.binary(max_size=60).map(lambda e: (e,))
# Mostly what runs are made of, with what must end one: another ledger, a gap, other
# flags, key or term, more or fewer entries, an unsupported version, a frame over the
# size limit (entries of up to 60 bytes against a 100-byte limit).
_add_spec = st.tuples(
    st.just("add"), st.integers(1, 2), st.sampled_from([0, 0, 0, 0, -1, 6]),
    st.sampled_from([0, 0, 0, 0, int(AddFlags.RECOVERY_ADD), int(AddFlags.SPARSE),
                     int(AddFlags.TRUNCATE)]),
    st.sampled_from(_KEYS[:1] * 3 + _KEYS[1:]), st.sampled_from([0, 0, 0, 1]),
    st.one_of(_ONE_ENTRY, _ONE_ENTRY, _ONE_ENTRY,
              st.lists(st.binary(max_size=20), max_size=2).map(tuple)),
    st.sampled_from([0, 1, 1, 7]))
_frame = st.one_of(
    _add_spec, _add_spec, _add_spec, _add_spec,
    st.tuples(st.just("lac"), st.integers(1, 2)),
    st.tuples(st.just("api"), st.integers(90, 99)),     # unknown api key: answered
)
# A malformed frame closes the connection: at most one, last.
_last = st.one_of(
    st.none(),
    st.tuples(st.just("extra"), st.integers(0, 3)),     # trailing bytes
    st.tuples(st.just("short"), st.integers(1, 3)),     # a body cut short
)
_MAX_FRAME = 100


def _encode(cid: int, spec: tuple[object, ...], next_entry: dict[int, int]) -> bytes:
    kind = spec[0]
    if kind == "add":
        _, ledger, jump, flags, key, term, entries, version = spec
        assert isinstance(ledger, int) and isinstance(jump, int)
        entry = next_entry.get(ledger, 0) + (jump if jump in (-1, 6) else 0)
        next_entry[ledger] = entry + max(1, len(entries))  # type: ignore[arg-type]
        return _add(cid, ledger, entry, flags=flags, key=key, term=term,  # type: ignore[arg-type]
                    entries=entries, version=version)  # type: ignore[arg-type]
    if kind == "lac":
        return bytes(encode_request(ReadLacRequest(ledger_id=spec[1]), cid))  # type: ignore[arg-type]
    frame = bytearray(_add(cid, 1, 0))
    if kind == "extra":
        frame += b"x" * (1 + spec[1])  # type: ignore[operator]
    elif kind == "short":
        del frame[-spec[1]:]  # type: ignore[index]
    else:
        struct.pack_into(">h", frame, 4, spec[1])  # type: ignore[arg-type]
    struct.pack_into(">i", frame, 0, len(frame) - 4)
    return bytes(frame)


@settings(max_examples=300, deadline=None)
@given(specs=st.lists(_frame, min_size=1, max_size=25), last=_last,
       cuts=st.lists(st.integers(0, 4000)), eof=st.booleans())
def test_runs_see_what_next_event_decodes(specs: list[tuple[object, ...]],
                                          last: tuple[object, ...] | None, cuts: list[int],
                                          eof: bool) -> None:
    if last is not None:
        specs = [*specs, last]
    next_entry: dict[int, int] = {}
    stream = b"".join(_encode(cid, spec, next_entry) for cid, spec in enumerate(specs))
    points = sorted({c % (len(stream) + 1) for c in cuts} | {0, len(stream)})
    chunks = [stream[a:b] for a, b in itertools.pairwise(points) if b > a]
    if eof:
        chunks.append(b"")
    expected, expected_inflight = _reference(chunks)
    got, inflight, runs = _with_runs(chunks)
    assert got == expected
    assert inflight == expected_inflight
    _RUNS_SEEN.append(runs)


_RUNS_SEEN: list[int] = []


def test_the_examples_had_runs() -> None:
    """The property above ran on streams with runs in them (not only fallbacks)."""
    if _RUNS_SEEN:  # run after it (file order), unless it was deselected
        assert sum(1 for r in _RUNS_SEEN if r) > len(_RUNS_SEEN) // 4


def test_a_run_spans_consecutive_frames_and_stops_at_anything_else() -> None:
    conn = ServerConnection()
    conn.receive_data(_add(1, 5, 0) + _add(2, 5, 1) + _add(3, 5, 2) + _add(4, 6, 3)
                      + _add(5, 6, 4, entries=(b"a", b"b")) + _add(6, 6, 6)[:-1])
    run = conn.take_add_run()
    assert run is not None
    assert (run.ledger_id, run.first_entry_id, run.correlation_ids) == (5, 0, [1, 2, 3])
    run = conn.take_add_run()
    assert run is not None and run.correlation_ids == [4]  # another ledger
    assert conn.take_add_run() is None  # two entries: next_event's
    ev = conn.next_event()
    assert isinstance(ev, DecodedRequest) and ev.correlation_id == 5
    assert conn.take_add_run() is None  # incomplete
    assert conn.next_event() is NEED_DATA
    assert conn.inflight == {1, 2, 3, 4, 5}


def test_a_run_ends_where_the_ledger_ids_flags_key_or_term_change() -> None:
    j = _KEYS[1]
    for breaker in (_add(2, 6, 1), _add(2, 5, 2), _add(2, 5, 1, flags=1),
                    _add(2, 5, 1, key=j), _add(2, 5, 1, term=3), _add(2, 5, 1, version=7),
                    _add(2, 5, 1, entries=(b"x" * 200,))):
        conn = ServerConnection(max_frame_bytes=200)
        conn.receive_data(_add(1, 5, 0) + breaker)
        run = conn.take_add_run()
        assert run is not None and run.correlation_ids == [1]
        assert _normalized(conn.take_add_run() or conn.next_event()) == \
            _reference([breaker])[0]


def test_a_run_stops_at_the_inflight_cap_and_at_unmerged_flags() -> None:
    conn = ServerConnection(max_inflight=2)
    conn.receive_data(b"".join(_add(i, 5, i) for i in range(4)))
    run = conn.take_add_run()
    assert run is not None and run.correlation_ids == [0, 1]
    assert conn.is_at_capacity and conn.take_add_run() is None
    conn.inflight.clear()
    run = conn.take_add_run()
    assert run is not None and run.correlation_ids == [2, 3]

    conn = ServerConnection()
    conn.receive_data(_add(1, 5, 0) + _add(2, 5, 1, flags=int(AddFlags.TRUNCATE)))
    run = conn.take_add_run(_UNMERGED)
    assert run is not None and run.correlation_ids == [1]
    assert conn.take_add_run(_UNMERGED) is None
    ev = conn.next_event()
    assert isinstance(ev, DecodedRequest) and ev.message.flags == AddFlags.TRUNCATE
