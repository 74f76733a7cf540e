"""Real bookie processes with the real ZooKeeper: registration, TCP, kill -9, SIGTERM."""

from __future__ import annotations

import random
import struct
from collections.abc import Callable
from typing import Any

import trio

from ledgerd.bookie_client import BookieClient, open_bookie_client
from ledgerd.metadata.registry import BookieRegistry
from ledgerd.metadata.zookeeper import ZooKeeperStore
from ledgerd.tools.bookieprocess import BookieProcess
from ledgerd.tools.faults.payloads import payload_size
from ledgerd.wire.entry import decode_entry
from ledgerd.wire.messages import AddFlags, AddRequest, ReadFlags, ReadRequest
from ledgerd.wire.status import Status
from tests.appliance.harness import KEY, D, entry
from tests.cluster import EVENT_BOUND_S, metadata_store, wait_registered

Factory = Callable[..., BookieProcess]


def add(ledger: int, first: int, n: int = 1, flags: int = 0) -> AddRequest:
    return AddRequest(ledger_id=ledger, first_entry_id=first, master_key=KEY, flags=flags,
                      entries=tuple(entry(ledger, first + i, payload=_payload(ledger, first + i))
                                    for i in range(n)))


def _payload(ledger: int, eid: int) -> bytes:
    """Entry ``eid``'s payload: its ids, then filler to a size drawn (from the ids) from
    1 B to 64 KiB, half of them ending a journal record near a 4096-byte boundary."""
    size = payload_size(random.Random(ledger * 1_000_003 + eid))
    return (struct.pack(">qq", ledger, eid) * (size // 16 + 1))[:size]


async def _http_get(port: int, path: str) -> tuple[int, bytes]:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        data = b""
        while chunk := await stream.receive_some(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), body


async def _started(factory: Factory, store: ZooKeeperStore) -> BookieProcess:
    bookie = factory()
    bookie.start()
    await wait_registered(store, bookie)
    return bookie


async def test_registers_serves_tcp_and_sigterm_deregisters(
        bookie_factory: Factory, zk_chroot: str) -> None:
    async with metadata_store(zk_chroot) as store:
        bookie = await _started(bookie_factory, store)
        info = await BookieRegistry(store).bookie_info(bookie.bookie_id)
        assert info["port"] == bookie.port and info["pid"] == bookie.pid
        async with open_bookie_client(bookie.address) as c:
            replies = await c.call_many([add(1, e) for e in range(100)])
            assert {s for s, _ in replies} == {Status.OK}
            status, resp = await c.call(ReadRequest(ledger_id=1, entry_id=-1))
            assert status == Status.OK
            assert decode_entry(D, resp.entry).payload == _payload(1, 99)  # type: ignore[union-attr]
        # adds are counted when the bookie's event loop collects their journal group,
        # after their replies went out: wait for it (bounded only against a hang)
        with trio.fail_after(EVENT_BOUND_S):
            while True:
                code, body = await _http_get(bookie.admin_port, "/metrics")
                assert code == 200
                if b'ledgerd_bookie_requests_total{api="ADD",status="OK"} 100.0' in body:
                    break
                await trio.sleep(0.02)
        assert b"ledgerd_journal_sync_seconds_bucket" in body
        assert (await _http_get(bookie.admin_port, "/health"))[0] == 200
        exit_code = await trio.to_thread.run_sync(bookie.terminate)
        assert exit_code == 0, bookie.log_tail()
        bookies = await BookieRegistry(store).list_bookies()
        assert bookie.bookie_id not in bookies.writable | bookies.read_only
        assert "bookie_stopped" in bookie.log_tail()
        # Once serving, the start-up heap is frozen out of the collector's full passes.
        settled = [line for line in bookie.log_path.read_text().splitlines()
                   if "event=heap_settled" in line]
        assert len(settled) == 1 and "frozen=0 " not in settled[0], settled


class _Acks:
    """Acknowledged entry ids per ledger; ``reached`` fires at ``target`` in total."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.total = 0
        self.reached = trio.Event()


async def _add_until_killed(c: BookieClient, ledger: int, acked: set[int], counter: _Acks,
                            stop: trio.Event) -> None:
    eid = 0
    while not stop.is_set():
        batch = [add(ledger, eid + i) for i in range(16)]
        eid += 16
        try:
            replies = await c.call_many(batch)
        except ConnectionError:
            return
        for req, (status, _) in zip(batch, replies, strict=True):
            if status == Status.OK:
                acked.add(req.first_entry_id)
                counter.total += 1
        if counter.total >= counter.target:
            counter.reached.set()


async def test_kill9_mid_stream_loses_no_acknowledged_entry_and_fences_persist(
        bookie_factory: Factory, zk_chroot: str) -> None:
    rounds = 3
    async with metadata_store(zk_chroot) as store:
        bookie = bookie_factory(flush_interval_ms=200)
        acked: dict[int, set[int]] = {}
        for rnd in range(rounds):
            bookie.start()
            await wait_registered(store, bookie)
            async with open_bookie_client(bookie.address) as c:
                # Everything acknowledged in earlier rounds is still there.
                for ledger, ids in acked.items():
                    reqs = [ReadRequest(ledger_id=ledger, entry_id=e) for e in sorted(ids)]
                    for req, (status, resp) in zip(reqs, await c.call_many(reqs), strict=True):
                        assert status == Status.OK, (ledger, req.entry_id, status)
                        got = decode_entry(D, resp.entry)  # type: ignore[union-attr]
                        assert got.payload == _payload(ledger, req.entry_id)
                # Fences from earlier rounds hold.
                for ledger in range(100, 100 + rnd):
                    assert (await c.call(add(ledger, 1)))[0] == Status.FENCED
                # A ledger fenced now must stay fenced after the kill.
                assert (await c.call(add(100 + rnd, 0)))[0] == Status.OK
                fence = ReadRequest(ledger_id=100 + rnd, entry_id=-1, flags=ReadFlags.FENCE,
                                    master_key=KEY)
                assert (await c.call(fence))[0] == Status.OK
            # A stream of adds on two connections; kill -9 once enough are acknowledged.
            stop = trio.Event()
            target = 400 + random.Random(rnd).randrange(400)
            counter = _Acks(target)
            async with trio.open_nursery() as nursery, \
                    open_bookie_client(bookie.address) as c1, \
                    open_bookie_client(bookie.address) as c2:
                for ledger, conn in ((10 + 2 * rnd, c1), (11 + 2 * rnd, c2)):
                    acked[ledger] = set()
                    nursery.start_soon(_add_until_killed, conn, ledger, acked[ledger], counter,
                                       stop)
                await counter.reached.wait()
                await trio.to_thread.run_sync(bookie.kill9)
                stop.set()
            assert sum(len(v) for v in acked.values()) >= target
        bookie.start()
        await wait_registered(store, bookie)
        async with open_bookie_client(bookie.address) as c:
            for ledger, ids in acked.items():
                for e in ids:
                    status, _ = await c.call(ReadRequest(ledger_id=ledger, entry_id=e))
                    assert status == Status.OK, (ledger, e)
            for ledger in range(100, 100 + rounds):
                assert (await c.call(add(ledger, 1)))[0] == Status.FENCED
                rec = add(ledger, 1, flags=AddFlags.RECOVERY_ADD)
                assert (await c.call(rec))[0] == Status.OK
        assert await trio.to_thread.run_sync(bookie.terminate) == 0


async def _garbage_connection(address: str, seed: int) -> None:
    rnd = random.Random(seed)
    host, port = address.split(":")
    try:
        stream = await trio.open_tcp_stream(host, int(port))
    except OSError:
        return
    async with stream:
        kind = seed % 5
        try:
            if kind == 0:
                await stream.send_all(rnd.randbytes(4096))
            elif kind == 1:  # oversized frame header
                await stream.send_all(struct.pack(">ihhi", 1 << 30, 1, 0, seed))
            elif kind == 2:  # half a frame, then hang up
                await stream.send_all(struct.pack(">ihhi", 500, 1, 0, seed) + b"\0" * 100)
            elif kind == 3:  # unknown api keys, many
                await stream.send_all(b"".join(struct.pack(">ihhi", 8, 77, 0, i)
                                               for i in range(200)))
            else:  # valid adds, never read the replies
                await stream.send_all(b"".join(
                    _frame(add(5000 + seed, e)) for e in range(50)))
            with trio.move_on_after(0.2):
                while await stream.receive_some(65536):
                    pass
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass


def _frame(msg: Any) -> bytes:
    from ledgerd.wire.frames import encode_request
    return encode_request(msg, 1, 0)


async def test_fifty_garbage_connections_do_not_disturb_an_honest_client(
        bookie_factory: Factory, zk_chroot: str) -> None:
    async with metadata_store(zk_chroot) as store:
        bookie = await _started(bookie_factory, store)
        async with open_bookie_client(bookie.address) as honest:
            async with trio.open_nursery() as nursery:
                for i in range(50):
                    nursery.start_soon(_garbage_connection, bookie.address, i)
                for first in range(0, 2000, 20):
                    replies = await honest.call_many([add(1, first + i) for i in range(20)])
                    assert {s for s, _ in replies} == {Status.OK}
            status, resp = await honest.call(ReadRequest(ledger_id=1, entry_id=-1))
            assert status == Status.OK and resp.entry_id == 1999  # type: ignore[union-attr]
        assert bookie.running
        assert await trio.to_thread.run_sync(bookie.terminate) == 0
        log = bookie.log_path.read_text()
        assert "connection_failed" not in log and "Traceback" not in log, bookie.log_tail()
