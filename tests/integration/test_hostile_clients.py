"""Hostile clients against a real bookie process: what one connection does must stay on
that connection, in bounded memory, while an honest client is served."""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from pathlib import Path

import trio

from ledgerd.bookie_client import open_bookie_client
from ledgerd.tools.bookieprocess import BookieProcess
from ledgerd.wire.entry import encode_entry
from ledgerd.wire.frames import encode_request
from ledgerd.wire.messages import AddRequest, ReadRangeRequest, ReadRequest
from ledgerd.wire.status import Status
from tests.appliance.harness import KEY, D
from tests.cluster import admin_get, metadata_store, wait_registered

Factory = Callable[..., BookieProcess]
MiB = 1 << 20


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


async def test_a_client_that_never_reads_range_replies_cannot_grow_the_bookie(
        bookie_factory: Factory, zk_chroot: str) -> None:
    async with metadata_store(zk_chroot) as store:
        bookie = bookie_factory()
        bookie.start()
        await wait_registered(store, bookie)
        assert bookie.pid is not None
        async with open_bookie_client(bookie.address) as honest:
            # 32 entries of 256 KiB: each range read below answers 8 MiB.
            big = bytes(256 * 1024)
            for first in range(0, 32, 4):
                status, _ = await honest.call(AddRequest(
                    ledger_id=1, first_entry_id=first, master_key=KEY,
                    entries=tuple(encode_entry(D, 1, first + i, -1, 0, big)
                                  for i in range(4))))
                assert status == Status.OK
            before = rss_bytes(bookie.pid)
            hostile = await trio.open_tcp_stream("127.0.0.1", int(bookie.address.split(":")[1]))
            async with hostile, trio.open_nursery() as nursery:
                request = b"".join(encode_request(ReadRangeRequest(
                    ledger_id=1, first_entry_id=0, max_count=32, max_bytes=8 * MiB), cid, 0)
                    for cid in range(400))  # 3.2 GB of replies if all were built

                async def flood() -> None:
                    await hostile.send_all(request)  # blocks once the bookie stops reading

                nursery.start_soon(flood)
                # The honest client is served meanwhile, on its own connection.
                for i in range(50):
                    status, _ = await honest.call(ReadRequest(ledger_id=1, entry_id=i % 32))
                    assert status == Status.OK
                grown = rss_bytes(bookie.pid) - before
                assert grown < 200 * MiB, f"bookie grew by {grown / MiB:.0f} MiB"
                nursery.cancel_scope.cancel()
        async with open_bookie_client(bookie.address) as after:
            status, _ = await after.call(ReadRequest(ledger_id=1, entry_id=31))
            assert status == Status.OK
        assert await trio.to_thread.run_sync(bookie.terminate) == 0
        assert "Traceback" not in bookie.log_path.read_text(), bookie.log_tail()


async def _closed_by_peer(stream: trio.SocketStream) -> None:
    """Returns once the bookie closes ``stream`` (EOF or reset)."""
    try:
        while await stream.receive_some(4096):
            pass
    except trio.BrokenResourceError:
        pass


async def test_connection_limit_and_idle_timeout(bookie_factory: Factory,
                                                 zk_chroot: str) -> None:
    async with metadata_store(zk_chroot) as store:
        bookie = bookie_factory(max_connections=10, connection_idle_timeout_s=2.0)
        bookie.start()
        await wait_registered(store, bookie)
        port = int(bookie.address.split(":")[1])
        async with open_bookie_client(bookie.address) as honest:
            idle = [await trio.open_tcp_stream("127.0.0.1", port) for _ in range(9)]
            # The honest client's round trip proves the nine are being served...
            status, _ = await honest.call(ReadRequest(ledger_id=9, entry_id=0))
            assert status == Status.NO_SUCH_LEDGER
            # ...so the eleventh is over the limit: closed at once.
            extra = await trio.open_tcp_stream("127.0.0.1", port)
            with trio.fail_after(10):
                await _closed_by_peer(extra)
            status, _ = await honest.call(ReadRequest(ledger_id=9, entry_id=0))
            assert status == Status.NO_SUCH_LEDGER
            # Idle ones are closed after the timeout (nothing in flight on them).
            with trio.fail_after(30):
                for s in idle:
                    await _closed_by_peer(s)
        async with open_bookie_client(bookie.address) as again:  # clients just reconnect
            status, _ = await again.call(ReadRequest(ledger_id=9, entry_id=0))
            assert status == Status.NO_SUCH_LEDGER
        metrics = await _metrics(bookie.admin_port)
        assert metrics["ledgerd_bookie_connections_refused_total"] >= 1
        assert metrics["ledgerd_bookie_connections_idle_closed_total"] >= 9
        assert await trio.to_thread.run_sync(bookie.terminate) == 0


async def _metrics(port: int) -> dict[str, float]:
    _, body = await admin_get(port, "/metrics")
    out = {}
    for line in body.splitlines():
        if line and not line.startswith("#") and "{" not in line:
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def _valid_frames(rnd: random.Random) -> list[bytes]:
    reqs = [AddRequest(ledger_id=7, first_entry_id=rnd.randrange(100), master_key=KEY,
                       entries=(encode_entry(D, 7, 0, -1, 0, b"x"),)),
            ReadRequest(ledger_id=rnd.randrange(10), entry_id=rnd.randrange(-1, 10)),
            ReadRangeRequest(ledger_id=1, first_entry_id=0, max_count=rnd.randrange(1, 50),
                             max_bytes=rnd.randrange(1, 1 << 20))]
    return [encode_request(r, rnd.randrange(1 << 31), rnd.randrange(2)) for r in reqs]


def _mutate(frame: bytes, rnd: random.Random) -> bytes:
    data = bytearray(frame)
    for _ in range(rnd.randrange(1, 6)):
        kind = rnd.randrange(4)
        if kind == 0 and data:
            data[rnd.randrange(len(data))] = rnd.randrange(256)
        elif kind == 1:  # api key / version / length fields
            pos = rnd.choice([0, 4, 6])
            data[pos:pos + 2] = rnd.randbytes(2)
        elif kind == 2 and len(data) > 8:
            del data[rnd.randrange(4, len(data)):]
        else:
            data += rnd.randbytes(rnd.randrange(1, 64))
    return bytes(data)


async def _hostile(port: int, rnd: random.Random, kind: str) -> None:
    try:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
    except OSError:
        return
    async with stream:
        try:
            if kind == "mutated":
                await stream.send_all(b"".join(_mutate(f, rnd) for f in _valid_frames(rnd)))
            elif kind == "random":
                await stream.send_all(rnd.randbytes(rnd.randrange(1, 8192)))
            elif kind == "huge":  # a declared length far past max_frame_bytes
                await stream.send_all(rnd.randrange(1 << 24, 1 << 31).to_bytes(4, "big")
                                      + rnd.randbytes(64))
            elif kind == "slowloris":  # one valid frame, a byte at a time
                for b in _valid_frames(rnd)[1]:
                    await stream.send_all(bytes([b]))
                    await trio.sleep(0.01)
            elif kind == "halfclosed":
                await stream.send_all(_valid_frames(rnd)[2][:10])
                await stream.send_eof()
            # "idle": say nothing
            with trio.move_on_after(0.5):
                while await stream.receive_some(65536):
                    pass
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass


async def test_fuzzing_clients_do_not_disturb_an_honest_one(bookie_factory: Factory,
                                                             zk_chroot: str) -> None:
    seed = int(os.environ.get("LEDGERD_FUZZ_SEED", random.randrange(1 << 32)))
    print(f"fuzz seed {seed} (replay: LEDGERD_FUZZ_SEED={seed})")
    rnd = random.Random(seed)
    async with metadata_store(zk_chroot) as store:
        bookie = bookie_factory()
        bookie.start()
        await wait_registered(store, bookie)
        assert bookie.pid is not None
        port = int(bookie.address.split(":")[1])
        kinds = ["mutated", "random", "huge", "slowloris", "halfclosed", "idle"]
        async with open_bookie_client(bookie.address) as honest:
            before = rss_bytes(bookie.pid)
            async with trio.open_nursery() as nursery:
                idle = [await trio.open_tcp_stream("127.0.0.1", port) for _ in range(2000)]
                for i in range(300):
                    nursery.start_soon(_hostile, port, random.Random(rnd.random()),
                                       kinds[i % len(kinds)])
                for first in range(0, 1000, 10):
                    replies = await honest.call_many([AddRequest(
                        ledger_id=1, first_entry_id=first + i, master_key=KEY,
                        entries=(encode_entry(D, 1, first + i, -1, 0, b"honest"),))
                        for i in range(10)])
                    assert {s for s, _ in replies} == {Status.OK}, seed
                status, _ = await honest.call(ReadRequest(ledger_id=1, entry_id=999))
                assert status == Status.OK, seed
            for s in idle:
                await s.aclose()
            grown = rss_bytes(bookie.pid) - before
            assert grown < 150 * MiB, f"seed {seed}: bookie grew by {grown / MiB:.0f} MiB"
        assert bookie.running, seed
        assert await trio.to_thread.run_sync(bookie.terminate) == 0
        log = bookie.log_path.read_text()
        assert "Traceback" not in log and "connection_failed" not in log, (seed, bookie.log_tail())
