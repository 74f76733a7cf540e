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

import pytest
import trio
import trio.testing

from ledgerd.appliance.server import ConnectionOptions
from ledgerd.wire.frames import encode_request
from ledgerd.wire.messages import AddRequest, ReadRequest
from ledgerd.wire.status import Status
from tests.appliance import harness
from tests.appliance.harness import KEY, entry, running_bookie

pytestmark = pytest.mark.usefixtures("autojump_clock")


@pytest.fixture(autouse=True)
def hub_transport(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(harness, "TRANSPORT", "hub")


def add_frame(ledger: int, eid: int, cid: int, payload: bytes = b"") -> bytes:
    req = AddRequest(ledger_id=ledger, first_entry_id=eid, master_key=KEY,
                     entries=(entry(ledger, eid, payload=payload),))
    return encode_request(req, cid, 0)


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
            assert c.queued_bytes + len(c.wbuf) < cap + 61_000
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
