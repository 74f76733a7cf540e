"""The connection hub's own rules, over real socket pairs (autojump clock).

The bookie semantics are checked under both transports in test_handlers.py; these are
the parts that differ with real sockets: backpressure by reply bytes once the kernel's
buffers are full, idle close, drain, a half-closed peer, and many connections sharing
one journal group.
"""

from __future__ import annotations

import socket
import struct
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from ledgerd.appliance.server import ConnectionOptions
from ledgerd.wire.frames import encode_request
from ledgerd.wire.messages import AddRequest, ApiKey, ReadRequest
from ledgerd.wire.status import Status
from tests.appliance import harness
from tests.appliance.harness import KEY, entry, gate_collection, running_bookie

pytestmark = pytest.mark.usefixtures("autojump_clock")


@pytest.fixture(autouse=True)
def hub_transport(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(harness, "TRANSPORT", "hub")


def add_frame(ledger: int, eid: int, cid: int, payload: bytes = b"") -> bytes:
    req = AddRequest(ledger_id=ledger, first_entry_id=eid, master_key=KEY,
                     entries=(entry(ledger, eid, payload=payload),))
    return encode_request(req, cid, 0)


def read_frame(ledger: int, eid: int, cid: int) -> bytes:
    return encode_request(ReadRequest(ledger_id=ledger, entry_id=eid), cid, 0)


def replies(data: bytes) -> list[tuple[int, int]]:
    """(correlation id, status) of each whole reply frame in ``data``."""
    out, pos = [], 0
    while pos + 4 <= len(data):
        (size,) = struct.unpack_from(">i", data, pos)
        if pos + 4 + size > len(data):
            break
        out.append(struct.unpack_from(">ih", data, pos + 4))
        pos += 4 + size
    return out


async def read_replies(stream: trio.abc.ReceiveStream, n: int) -> list[tuple[int, int]]:
    got = b""
    while len(replies(got)) < n:
        data = await stream.receive_some(1 << 20)
        assert data, f"connection closed after {len(replies(got))} of {n} replies"
        got += data
    return replies(got)


async def test_replies_of_many_connections_share_journal_groups(tmp_path: Path) -> None:
    async with running_bookie(tmp_path) as b:
        groups: list[int] = []
        b.storage.journal.on_group = lambda records, nbytes, secs: groups.append(records)
        streams = [b.raw_pair() for _ in range(32)]
        for i, s in enumerate(streams):
            await s.send_all(add_frame(100 + i, 0, cid=i))
        for i, s in enumerate(streams):
            assert await read_replies(s, 1) == [(i, Status.OK)]
        # One wake-up read every connection: far fewer groups than connections.
        assert sum(groups) >= 32 and len(groups) < 32
        await b.settled()  # every group's connections settled: each reply counted once
        assert b.metrics.add_latency.count == 32
        assert b.metrics.requests[ApiKey.ADD, Status.OK] == 32


async def test_adds_of_one_pass_are_decided_in_the_order_they_came(tmp_path: Path) -> None:
    """Runs of one-entry adds wait for the end of the hub's pass to be stored with the
    other connections' runs, but never past a request behind them: an add with a lower
    term behind a run that raised the term is refused, as one request at a time would
    be."""
    def frame(first: int, n: int, term: int, cid: int) -> bytes:
        return encode_request(AddRequest(
            ledger_id=7, first_entry_id=first, master_key=KEY, term=term,
            entries=tuple(entry(7, first + i) for i in range(n))), cid, 0)

    async with running_bookie(tmp_path) as b:
        s = b.raw_pair()
        await s.send_all(frame(0, 1, 5, 0) + frame(1, 1, 5, 1) + frame(2, 2, 4, 2)
                         + frame(2, 2, 5, 3) + read_frame(7, 3, 4))
        got = await read_replies(s, 5)
        assert got == [(0, Status.OK), (1, Status.OK), (2, Status.INVALID_TERM),
                       (3, Status.OK), (4, Status.OK)]
        assert b.storage.term(7) == 5


async def test_a_read_sees_the_adds_another_connection_sent_in_the_same_pass(
        tmp_path: Path) -> None:
    """Runs of one connection wait for the end of the pass, but not past a request of
    another connection read after them in that pass: its read sees the add."""
    async with running_bookie(tmp_path) as b:
        a, reader = b.raw_pair(), b.raw_pair()
        await a.send_all(add_frame(7, 0, cid=0))
        assert await read_replies(a, 1) == [(0, Status.OK)]
        for _ in range(5):  # both connections become readable before the hub's next pass
            eid = b.storage.last_entry_id(7) + 1
            a.socket._sock.send(add_frame(7, eid, cid=eid))  # type: ignore[attr-defined]
            reader.socket._sock.send(read_frame(7, eid, cid=eid))  # type: ignore[attr-defined]
            assert await read_replies(a, 1) == [(eid, Status.OK)]
            assert await read_replies(reader, 1) == [(eid, Status.OK)]


async def test_a_peer_that_does_not_read_is_paused_at_its_reply_bytes(tmp_path: Path) -> None:
    cap = 256 * 1024
    async with running_bookie(tmp_path, options=ConnectionOptions(max_reply_bytes=cap)) as b:
        s = b.raw_pair()
        await s.send_all(add_frame(1, 0, cid=0, payload=b"x" * 60_000))
        assert await read_replies(s, 1) == [(0, Status.OK)]
        n = 400  # 400 replies of 60 KB: 24 MB if nothing held the server back
        reads = b"".join(encode_request(ReadRequest(ledger_id=1, entry_id=0), cid, 0)
                         for cid in range(1, n + 1))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(s.send_all, reads)
            await trio.testing.wait_all_tasks_blocked(cushion=0.05)
            assert b.hub is not None
            (c,) = b.hub._conns.values()
            assert c.paused
            assert c.session.queued_bytes + len(c.wbuf) < cap + 61_000
            got = await read_replies(s, n)
        assert [cid for cid, _ in got] == list(range(1, n + 1))
        assert {status for _, status in got} == {Status.OK}
        await s.aclose()


async def test_idle_connection_is_closed(tmp_path: Path) -> None:
    async with running_bookie(tmp_path, options=ConnectionOptions(idle_timeout=2.0)) as b:
        s, done = b.raw_connection()
        await s.send_all(add_frame(1, 0, cid=7))
        assert await read_replies(s, 1) == [(7, Status.OK)]
        with trio.fail_after(5):
            await done.wait()
        assert await s.receive_some(10) == b""
        assert b.metrics.connections_idle_closed == 1


async def test_half_closed_peer_gets_every_reply_then_eof(tmp_path: Path) -> None:
    async with running_bookie(tmp_path) as b:
        assert b.hub is not None
        mine, theirs = socket.socketpair()
        b.nursery.start_soon(lambda: b.hub.serve_socket(theirs, trusted=True))  # type: ignore[union-attr]
        s = trio.SocketStream(trio.socket.from_stdlib_socket(mine))
        await s.send_all(b"".join(add_frame(1, e, cid=e) for e in range(50)))
        await s.send_eof()
        got = await read_replies(s, 50)
        assert got == [(e, Status.OK) for e in range(50)]
        assert await s.receive_some(10) == b""
        assert b.storage.last_entry_id(1) == 49


async def test_drain_answers_what_was_read_then_closes(tmp_path: Path) -> None:
    async with running_bookie(tmp_path) as b:
        assert b.hub is not None
        hub = b.hub
        mine, theirs = socket.socketpair()
        scope = trio.CancelScope()
        b.nursery.start_soon(lambda: hub.serve_socket(theirs, trusted=True, reader_scope=scope))
        s = trio.SocketStream(trio.socket.from_stdlib_socket(mine))
        await s.send_all(b"".join(add_frame(1, e, cid=e) for e in range(20)))
        await trio.testing.wait_all_tasks_blocked()
        scope.cancel()
        got = await read_replies(s, 20)
        assert got == [(e, Status.OK) for e in range(20)]
        assert await s.receive_some(10) == b""
        # What arrives after the drain began is not read.
        assert hub.connections == 0


async def test_garbage_on_one_socket_leaves_the_others_served(tmp_path: Path) -> None:
    async with running_bookie(tmp_path) as b:
        good = b.raw_pair()
        bad, bad_done = b.raw_connection()
        await bad.send_all(b"\xff" * 64)  # a negative size: closed without an answer
        with trio.fail_after(5):
            await bad_done.wait()
        await good.send_all(add_frame(1, 0, cid=3))
        assert await read_replies(good, 1) == [(3, Status.OK)]


def spy_sends(journal: Any) -> list[Any]:
    """Record every ``SendAfterSync`` the hub hands the journal."""
    made: list[Any] = []
    real = journal.after_sync

    def after_sync(action: Any) -> Any:
        made.append(action)
        return real(action)

    journal.after_sync = after_sync
    return made


async def test_add_replies_leave_from_the_syncer(tmp_path: Path) -> None:
    async with running_bookie(tmp_path) as b:
        made = spy_sends(b.storage.journal)
        streams = [b.raw_pair() for _ in range(4)]
        for round_ in range(5):
            for i, s in enumerate(streams):
                await s.send_all(b"".join(add_frame(10 + i, round_ * 3 + k, cid=round_ * 3 + k)
                                          for k in range(3)))
            for s in streams:
                assert await read_replies(s, 3) == [(round_ * 3 + k, Status.OK)
                                                    for k in range(3)]
        # Replies went out from a syncer (a group written on the slow path, while the
        # journal is still zeroing its first file, leaves them to the hub); the metrics
        # count every reply however it went.
        assert any(m.sent == len(m.data) > 0 for m in made)
        await b.settled()  # counted when the loop collects the group
        assert b.metrics.add_latency.count == 4 * 15
        # Each reply counted once by (api, status), whichever way it went.
        assert b.metrics.requests[(ApiKey.ADD, Status.OK)] == 4 * 15
        assert b.metrics.syncer_replies == sum(
            len(replies(bytes(m.data))) for m in made if m.sent == len(m.data))


async def test_replies_keep_their_order_when_a_full_socket_stops_the_syncer(
        tmp_path: Path) -> None:
    async with running_bookie(tmp_path) as b:
        assert b.hub is not None
        made = spy_sends(b.storage.journal)
        mine, theirs = socket.socketpair()
        theirs.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        b.nursery.start_soon(lambda: b.hub.serve_socket(theirs, trusted=True))  # type: ignore[union-attr]
        s = trio.SocketStream(trio.socket.from_stdlib_socket(mine))
        await s.send_all(add_frame(1, 0, cid=0, payload=b"r" * 3000))
        assert await read_replies(s, 1) == [(0, Status.OK)]
        # 400 adds at once, the peer not reading: their replies (~12 KB) do not fit the
        # socket, the syncer's send comes back short. Then reads (3 KB replies) and adds
        # interleaved: every later reply waits behind the rest.
        frames = [add_frame(1, e, cid=e) for e in range(1, 401)]
        cid = 401
        for e in range(401, 601):
            frames.append(add_frame(1, e, cid=cid))
            frames.append(encode_request(ReadRequest(ledger_id=1, entry_id=0), cid + 1, 0))
            cid += 2
        async with trio.open_nursery() as nursery:
            nursery.start_soon(s.send_all, b"".join(frames))
            await trio.testing.wait_all_tasks_blocked(cushion=0.2)
            got = await read_replies(s, cid - 1)
        assert [c for c, _ in got] == list(range(1, cid))
        assert {status for _, status in got} == {Status.OK}
        assert any(m.sent < len(m.data) for m in made)  # the short-send path ran
        assert b.metrics.syncer_short_sends >= 1
        assert b.storage.last_entry_id(1) == 600
        await s.aclose()


async def test_a_closed_connection_keeps_its_descriptor_until_the_group_is_collected(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async with running_bookie(tmp_path) as b:
        assert b.hub is not None
        gate = gate_collection(b.storage.journal, monkeypatch)
        s, done = b.raw_connection()
        await s.send_all(b"".join(add_frame(1, e, cid=e) for e in range(3)))
        # The syncer answers once the group is durable, whether or not it is collected.
        assert await read_replies(s, 3) == [(e, Status.OK) for e in range(3)]
        # A frame whose size cannot hold a header: the hub closes the connection, but
        # the socket stays open until the group is collected (a syncer could still be
        # sending to it; a new connection must not get its number meanwhile).
        await s.send_all(b"\x00\x00\x00\x01x")
        with trio.fail_after(5):
            await done.wait()
        with trio.move_on_after(1) as waited:
            await s.receive_some(10)
        assert waited.cancelled_caught
        gate.set()
        with trio.fail_after(5):
            assert await s.receive_some(10) == b""


async def test_replies_in_a_syncers_hands_count_as_unanswered(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``max_inflight`` holds adds whose replies a syncer has (or has sent) until their
    group is collected; then the connection reads again."""
    async with running_bookie(tmp_path, options=ConnectionOptions(max_inflight=8)) as b:
        gate = gate_collection(b.storage.journal, monkeypatch)
        s = b.raw_pair()
        await s.send_all(b"".join(add_frame(1, e, cid=e) for e in range(200)))
        assert await read_replies(s, 8) == [(e, Status.OK) for e in range(8)]
        await trio.testing.wait_all_tasks_blocked(cushion=0.1)
        assert b.storage.last_entry_id(1) == 7  # paused: eight unanswered
        gate.set()
        got = await read_replies(s, 192)
        assert got == [(e, Status.OK) for e in range(8, 200)]
        assert b.storage.last_entry_id(1) == 199


async def test_a_failed_group_answers_each_frame_of_a_syncer_run_with_io_error(
        tmp_path: Path) -> None:
    """A run of one-entry adds is one reply item handed to the syncer; when its group's
    fdatasync fails the syncer sends nothing, and the hub answers every frame of the run
    with IO_ERROR under its own correlation id, and forgets them (none stays in flight)."""
    from ledgerd.native import faults
    from ledgerd.native.faults import FaultRule

    async with running_bookie(tmp_path, storage_may_fail=True) as b:
        assert b.hub is not None
        made = spy_sends(b.storage.journal)
        s = b.raw_pair()
        # Until a group goes out on the fast path (the syncer sends its replies).
        e = 0
        while not any(m.sent == len(m.data) > 0 for m in made):
            await s.send_all(add_frame(1, e, cid=e))
            assert await read_replies(s, 1) == [(e, Status.OK)]
            e += 1
        made.clear()
        faults.arm([FaultRule("fsync", "journal", "EIO", times=1)])
        try:
            await s.send_all(b"".join(add_frame(1, e + k, cid=100 + k) for k in range(5)))
            with trio.fail_after(10):
                got = await read_replies(s, 5)
        finally:
            faults.disarm()
        assert got == [(100 + k, Status.IO_ERROR) for k in range(5)]
        assert made and all(m.sent == 0 for m in made)  # handed over, never sent
        (conn,) = b.hub._conns.values()
        assert not conn.session.conn.inflight and not conn.session.items
