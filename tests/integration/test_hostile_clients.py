"""Hostile clients against a real bookie process: what one connection does must stay on
that connection, in bounded memory, while an honest client is served."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import trio

from ledgerd.bookie_client import open_bookie_client
from tests.appliance.harness import KEY, D
from tests.cluster import metadata_store, wait_registered
from tools.bookieprocess import BookieProcess
from wire.entry import encode_entry
from wire.frames import encode_request
from wire.messages import AddRequest, ReadRangeRequest, ReadRequest
from wire.status import Status

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
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        data = b""
        while chunk := await stream.receive_some(65536):
            data += chunk
    out = {}
    for line in data.partition(b"\r\n\r\n")[2].decode().splitlines():
        if line and not line.startswith("#") and "{" not in line:
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out
