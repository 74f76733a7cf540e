"""``BookieSession``: the connection's rules, bytes in, events out (no I/O, no trio)."""

from __future__ import annotations

import struct

from ledgerd.appliance.metrics import BookieMetrics
from ledgerd.appliance.session import (
    NEED_DATA,
    PAUSE,
    STORE,
    BookieSession,
    Close,
    ConnectionOptions,
)
from ledgerd.wire.connection import AddRun
from ledgerd.wire.frames import DecodedRequest, encode_request
from ledgerd.wire.messages import AddFlags, AddRequest, ApiKey, ReadRequest
from ledgerd.wire.status import Status
from tests.appliance.harness import KEY, entry


def add_frame(ledger: int, eid: int, cid: int, n: int = 1, flags: int = 0) -> bytes:
    req = AddRequest(ledger_id=ledger, first_entry_id=eid, master_key=KEY, flags=flags,
                     entries=tuple(entry(ledger, eid + i) for i in range(n)))
    return encode_request(req, cid, 0)


def read_frame(ledger: int, eid: int, cid: int) -> bytes:
    return encode_request(ReadRequest(ledger_id=ledger, entry_id=eid), cid, 0)


def events(session: BookieSession) -> list[object]:
    """Take events until NEED_DATA, PAUSE or a close; store runs as OK at once."""
    out: list[object] = []
    while True:
        ev = session.next_event()
        if type(ev) is AddRun:
            out.append(("run", ev.ledger_id, ev.first_entry_id, list(ev.correlation_ids),
                        ev.frame_counts()))
            session.put_adds(ev, [(Status.OK, None)] * len(ev.correlation_ids), 1.0)
            continue
        if type(ev) is DecodedRequest:
            out.append(("request", ev.correlation_id))
            session.put(ev.correlation_id, ev.api_key, Status.OK, None, 1.0)
            continue
        out.append(ev)
        if ev is NEED_DATA or ev is PAUSE or type(ev) is Close:
            return out


def replies(data: bytes) -> list[tuple[int, int]]:
    out, pos = [], 0
    while pos + 4 <= len(data):
        (size,) = struct.unpack_from(">i", data, pos)
        out.append(struct.unpack_from(">ih", data, pos + 4))
        pos += 4 + size
    return out


STREAM = (add_frame(1, 0, 0) + add_frame(1, 1, 1) + add_frame(2, 0, 2, n=2)
          + add_frame(2, 2, 3) + add_frame(1, 2, 4, flags=AddFlags.TRUNCATE)
          + read_frame(1, 0, 5) + add_frame(1, 3, 6))


def test_adds_come_out_as_runs_in_order_before_the_request_after_them() -> None:
    session = BookieSession(ConnectionOptions(), trusted=True)
    session.receive_data(STREAM, 1.0)
    assert events(session) == [
        ("run", 1, 0, [0, 1], [1, 1]),        # cut from the buffer
        ("run", 2, 0, [2, 3], [2, 1]),        # Add requests merged
        ("run", 1, 2, [4], [1]),              # TRUNCATE: alone
        ("request", 5),
        ("run", 1, 3, [6], [1]),
        NEED_DATA]
    data, _ = session.encode(BookieMetrics(), session.items)
    assert [cid for cid, _ in replies(data)] == list(range(7))  # in request order


def test_fed_one_byte_at_a_time_the_session_decides_the_same() -> None:
    session = BookieSession(ConnectionOptions(), trusted=True)
    got: list[object] = []
    for i in range(len(STREAM)):
        session.receive_data(STREAM[i:i + 1], 1.0)
        got += [e for e in events(session) if e is not NEED_DATA]
    handed_out = [cid for e in got if isinstance(e, tuple)
                  for cid in (e[3] if e[0] == "run" else [e[1]])]
    assert handed_out == list(range(7))  # each frame alone, in request order
    data, _ = session.encode(BookieMetrics(), session.items)
    assert [cid for cid, _ in replies(data)] == list(range(7))


def test_a_request_waits_until_the_runs_before_it_are_stored() -> None:
    session = BookieSession(ConnectionOptions(), trusted=True)
    session.receive_data(add_frame(1, 0, 0) + read_frame(1, 0, 1), 1.0)
    run = session.next_event()
    assert type(run) is AddRun
    assert session.next_event() is STORE  # the hub stores the pass's runs now
    assert session.next_event() is STORE
    session.put_adds(run, [(Status.OK, None)], 1.0)
    ev = session.next_event()
    assert type(ev) is DecodedRequest and ev.correlation_id == 1


def test_a_full_session_pauses_until_replies_go_out() -> None:
    session = BookieSession(ConnectionOptions(max_inflight=2), trusted=True)
    session.receive_data(read_frame(1, 0, 0) + read_frame(1, 0, 1) + read_frame(1, 0, 2), 1.0)
    assert events(session) == [("request", 0), ("request", 1), PAUSE]
    assert session.next_event(unsent_replies=0) is PAUSE
    session.encode(BookieMetrics(), session.items[:1])  # one answered
    session.items = session.items[1:]
    assert session.next_event(unsent_replies=1) is PAUSE  # still in the peer's way
    assert events(session) == [("request", 2), PAUSE]  # full again
    small = BookieSession(ConnectionOptions(max_reply_bytes=100), trusted=True)
    small.receive_data(read_frame(1, 0, 0) + read_frame(1, 0, 1), 1.0)
    assert small.next_event(unsent_bytes=36) is not PAUSE
    small.put(0, 1, Status.OK, None, 1.0)  # 64 bytes owed, 36 in the socket's buffer
    assert small.next_event(unsent_bytes=36) is PAUSE
    small.replies_sent(64)
    assert small.next_event(unsent_bytes=36) is not PAUSE


def test_bad_input_closes_only_after_the_adds_before_it() -> None:
    session = BookieSession(ConnectionOptions(), trusted=True)
    session.receive_data(add_frame(1, 0, 0) + struct.pack(">i", -5) + b"\0" * 8, 1.0)
    assert events(session) == [("run", 1, 0, [0], [1]), Close("bad frame")]
    huge = BookieSession(ConnectionOptions(max_frame_bytes=64), trusted=True)
    huge.receive_data(add_frame(1, 0, 7, n=3), 1.0)
    assert events(huge) == [Close("rejected")]
    assert [(i.correlation_id, i.status) for i in huge.items] == [(7, Status.BAD_REQUEST)]
    unknown = BookieSession(ConnectionOptions(), trusted=True)
    frame = bytearray(read_frame(1, 0, 3))
    struct.pack_into(">h", frame, 4, 99)  # an api no bookie knows
    unknown.receive_data(bytes(frame) + read_frame(1, 0, 4), 1.0)
    assert events(unknown) == [("request", 4), NEED_DATA]
    assert [(i.correlation_id, i.status) for i in unknown.items] == [
        (3, Status.UNSUPPORTED_VERSION), (4, Status.OK)]
    ended = BookieSession(ConnectionOptions(), trusted=True)
    ended.receive_data(read_frame(1, 0, 0) + b"", 1.0)
    ended.receive_data(b"", 1.0)
    assert events(ended) == [("request", 0), Close("ended")]


def test_idle_only_with_nothing_owed() -> None:
    session = BookieSession(ConnectionOptions(), trusted=True)
    session.last_active = 10.0
    assert not session.is_idle(100.0, 0.0)
    assert session.is_idle(100.0, 5.0) and not session.is_idle(14.0, 5.0)
    session.receive_data(read_frame(1, 0, 0), 1.0)
    session.next_event()
    assert not session.is_idle(100.0, 5.0)  # a request in flight


def _add_replies(data: bytes) -> list[tuple[int, int, int, int]]:
    """(correlation id, status, ledger, entry) of each AddResponse in ``data``."""
    out, pos = [], 0
    while pos + 4 <= len(data):
        (size,) = struct.unpack_from(">i", data, pos)
        cid, status, lid, eid = struct.unpack_from(">ihqq", data, pos + 4)
        out.append((cid, status, lid, eid))
        pos += 4 + size
    return out


def test_a_run_with_one_outcome_is_one_item_answering_every_frame() -> None:
    session = BookieSession(ConnectionOptions(), trusted=True)
    session.receive_data(b"".join(add_frame(3, i, 10 + i) for i in range(4)), 1.0)
    run = session.next_event()
    assert type(run) is AddRun and run.correlation_ids == [10, 11, 12, 13]
    session.put_adds(run, [(Status.OK, None)] * 4, 1.0)
    assert len(session.items) == 1 and session.items[0].replies == 4
    metrics = BookieMetrics()
    data, _ = session.encode(metrics, session.items)
    assert _add_replies(data) == [(10 + i, 0, 3, i) for i in range(4)]
    assert metrics.requests[(int(ApiKey.ADD), 0)] == 4
    assert not session.conn.inflight


def test_a_run_with_mixed_outcomes_answers_each_frame_with_its_own() -> None:
    session = BookieSession(ConnectionOptions(), trusted=True)
    session.receive_data(b"".join(add_frame(3, i, 10 + i) for i in range(3)), 1.0)
    run = session.next_event()
    assert type(run) is AddRun
    session.put_adds(run, [(Status.OK, None), (Status.FENCED, None), (Status.OK, None)], 1.0)
    assert len(session.items) == 3
    metrics = BookieMetrics()
    data, _ = session.encode(metrics, session.items)
    assert [(cid, status) for cid, status, _, _ in _add_replies(data)] == [
        (10, 0), (11, int(Status.FENCED)), (12, 0)]
    assert metrics.requests[(int(ApiKey.ADD), 0)] == 2


def test_a_refused_run_item_answers_every_frame_with_the_error() -> None:
    session = BookieSession(ConnectionOptions(), trusted=True)
    session.receive_data(b"".join(add_frame(3, i, 10 + i) for i in range(3)), 1.0)
    run = session.next_event()
    assert type(run) is AddRun
    session.put_adds(run, [(Status.NO_SUCH_LEDGER, None)] * 3, 1.0)
    metrics = BookieMetrics()
    data, _ = session.encode(metrics, session.items)
    assert [(cid, status) for cid, status in replies(data)] == [
        (c, int(Status.NO_SUCH_LEDGER)) for c in (10, 11, 12)]
    assert metrics.requests[(int(ApiKey.ADD), int(Status.NO_SUCH_LEDGER))] == 3
    assert not session.conn.inflight
