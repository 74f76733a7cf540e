"""The client's trio layer over memory streams, a jumping mock clock, real bookies and an
in-memory metadata store (``memcluster``): the pool's backoff and reconnects, a reset
mid-batch, a silent bookie, BUSY retries, and recovery driven by deadlines."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing

import ledgerd
from ledgerd.bookie_client import BookieConnectionError
from ledgerd.bookies import BookiePool, PoolOptions
from ledgerd.disk.journal import JournalOptions
from ledgerd.wire.messages import ApiKey, Message, ReadLacRequest
from ledgerd.wire.status import FencedError, Status
from tests.ledgerd.memcluster import client_settings, memory_cluster


@pytest.fixture(autouse=True)
def clock(mock_clock: trio.testing.MockClock) -> trio.testing.MockClock:
    """Virtual time that jumps only after 50 ms of real idleness: the bookies' journals
    fsync in worker threads, and a clock that jumped while they worked would time out
    every add (the autojump clock jumps as soon as every task waits)."""
    mock_clock.autojump_threshold = 0.05
    return mock_clock


async def test_pool_backs_off_after_failed_connects_then_reconnects(
        tmp_path: Path, clock: trio.testing.MockClock) -> None:
    async with memory_cluster(tmp_path, 1) as cluster, trio.open_nursery() as nursery:
        attempts = []

        async def connect(address: str) -> trio.abc.Stream:
            attempts.append(trio.current_time())
            return await cluster.connect(address)

        pool = BookiePool(nursery, PoolOptions(backoff_initial=0.1, backoff_max=0.4),
                          connect=connect)
        cluster["b0:3181"].gate.refuse_connects = True
        status, _, reason = await pool.call("b0:3181", ReadLacRequest(ledger_id=1), 5)
        assert status == -1 and "connect failed" in (reason or "")
        # Within the backoff, sends fail at once without a new connect.
        status, _, _ = await pool.call("b0:3181", ReadLacRequest(ledger_id=1), 5)
        assert status == -1 and len(attempts) == 1
        assert "b0:3181" in pool.recent_failures()
        # Backoff is a rule about time: the test moves the virtual clock past each step.
        clock.jump(0.1)
        await pool.call("b0:3181", ReadLacRequest(ledger_id=1), 5)
        assert len(attempts) == 2  # retried after 0.1 s; the next backoff is 0.2 s
        clock.jump(0.1)
        await pool.call("b0:3181", ReadLacRequest(ledger_id=1), 5)
        assert len(attempts) == 2
        cluster["b0:3181"].gate.refuse_connects = False
        clock.jump(0.2)
        status, _, _ = await pool.call("b0:3181", ReadLacRequest(ledger_id=1), 5)
        assert status == Status.NO_SUCH_LEDGER and len(attempts) == 3  # a real answer
        pool.close()
        nursery.cancel_scope.cancel()


async def test_reset_mid_batch_fails_every_outstanding_request_then_reconnects(
        tmp_path: Path) -> None:
    async with memory_cluster(tmp_path, 1) as cluster, trio.open_nursery() as nursery:
        bookie = cluster["b0:3181"]
        pool = BookiePool(nursery, connect=cluster.connect)
        assert (await pool.call(bookie.address, ReadLacRequest(ledger_id=1), 5))[0] == \
            Status.NO_SUCH_LEDGER
        bookie.gate.freeze()
        replies: list[tuple[int, Message | None, BookieConnectionError | None]] = []
        all_failed = trio.Event()

        def on_reply(s: int, r: Message | None, e: BookieConnectionError | None) -> None:
            replies.append((s, r, e))
            if len(replies) == 5:
                all_failed.set()

        for i in range(5):
            pool.send(bookie.address, ReadLacRequest(ledger_id=i), on_reply)
        await trio.testing.wait_all_tasks_blocked()
        assert replies == []  # the batch is on the wire, unanswered
        await bookie.gate.reset()
        bookie.gate.thaw()
        with trio.fail_after(5):
            await all_failed.wait()
        assert all(s == -1 and isinstance(e, BookieConnectionError) for s, _, e in replies)
        await trio.testing.wait_all_tasks_blocked()  # the connection task has ended too
        assert bookie.address in pool.recent_failures()
        status, _, _ = await pool.call(bookie.address, ReadLacRequest(ledger_id=1), 5)
        assert status == Status.NO_SUCH_LEDGER and bookie.connects == 2
        pool.close()
        nursery.cancel_scope.cancel()


async def test_silent_bookie_is_replaced_when_its_add_timeout_fires(tmp_path: Path) -> None:
    # Qa = Qw: no entry completes without the silent bookie, and the connect timeout is
    # long, so what ends the wait is the writer machine's add deadline (1 s).
    settings = client_settings(connect_timeout_ms=60_000)
    async with memory_cluster(tmp_path, 4) as cluster, ledgerd.open_client(
            store=cluster.store, connect=cluster.connect, **settings) as client:
        lh = await client.create_ledger(3, 3, 3, password=b"pw")
        silent = lh.metadata.ensembles[0][1][0]
        cluster[silent].gate.freeze()
        start = trio.current_time()
        with trio.fail_after(30):
            pending = [await lh.submit(b"entry %d" % i) for i in range(10)]
            ids = [await p for p in pending]
        assert ids == list(range(10))
        assert 1.0 <= trio.current_time() - start < 5.0  # the add timeout, not the connect
        with trio.fail_after(30):
            assert [await lh.append(b"entry %d" % i) for i in range(10, 15)] == \
                list(range(10, 15))
            await lh.close()
        md = await client.ledger_metadata(lh.ledger_id)
        assert len(md.ensembles) == 1 and silent not in md.ensembles[0][1]  # from entry 0
        assert md.is_closed and md.last_entry_id == 14
        cluster[silent].gate.thaw()
        rh = await client.open_ledger(lh.ledger_id, b"pw")
        assert [e.payload async for e in rh.read()] == [b"entry %d" % i for i in range(15)]


async def test_busy_bookie_adds_are_retried_until_accepted(tmp_path: Path) -> None:
    # The bookie's journal holds about one 1 KiB entry: a second frame read in the same
    # pass is answered TOO_MANY_REQUESTS, and the client retries it.
    small = JournalOptions(max_memory_bytes=1600)
    async with memory_cluster(tmp_path, 1, journal=small) as cluster, ledgerd.open_client(
            store=cluster.store, connect=cluster.connect, **client_settings()) as client:
        handles = [await client.create_ledger(1, 1, 1) for _ in range(3)]
        with trio.fail_after(30):
            pending = [await lh.submit(bytes(1024)) for lh in handles]
            assert [await p for p in pending] == [0, 0, 0]
        assert cluster["b0:3181"].count(ApiKey.ADD, Status.TOO_MANY_REQUESTS) >= 1
        for lh in handles:
            await lh.close()
            assert (await client.ledger_metadata(lh.ledger_id)).last_entry_id == 0


async def test_recovery_with_a_silent_bookie_finishes_by_its_deadlines(tmp_path: Path) -> None:
    async with memory_cluster(tmp_path, 4) as cluster, ledgerd.open_client(
            store=cluster.store, connect=cluster.connect, **client_settings()) as writer, \
            ledgerd.open_client(store=cluster.store, connect=cluster.connect,
                                **client_settings()) as reader:
        lh = await writer.create_ledger(3, 2, 2, password=b"pw")
        for i in range(20):
            await lh.append(b"e%d" % i)
        silent = lh.metadata.ensembles[0][1][1]
        cluster[silent].gate.freeze()
        with trio.fail_after(60):
            rh = await reader.open_ledger(lh.ledger_id, b"pw")  # fence, read, rewrite, close
        assert rh.is_closed and rh.last_add_confirmed == 19
        assert [e.payload async for e in rh.read()] == [b"e%d" % i for i in range(20)]
        # The rewrites could not reach the silent bookie: recovery replaced it locally and
        # committed that with the close.
        md = await reader.ledger_metadata(lh.ledger_id)
        assert any(silent not in ensemble for _, ensemble in md.ensembles)
        with pytest.raises(FencedError):  # one fenced family: LedgerFencedError is one
            await lh.append(b"too late")


async def test_an_append_larger_than_a_frame_fails_alone(
        tmp_path: Path, clock: trio.testing.MockClock) -> None:
    from ledgerd.wire.errors import MessageTooLargeError

    settings = client_settings(max_frame_bytes=64 * 1024)
    async with memory_cluster(tmp_path, 3) as cluster, ledgerd.open_client(
            store=cluster.store, connect=cluster.connect, **settings) as client:
        lh = await client.create_ledger(3, 2, 2)
        assert await lh.append(b"before") == 0
        with pytest.raises(MessageTooLargeError, match="max_frame_bytes"):
            await lh.append(bytes(64 * 1024))
        with pytest.raises(MessageTooLargeError):
            await lh.submit(bytes(100 * 1024))
        # That call failed, nothing else: no id taken, no ensemble change, no fence.
        assert await lh.append(b"after") == 1
        assert await lh.append(bytes(60 * 1024)) == 2  # what fits still goes
        assert lh.ensemble_changes == 0
        await lh.close()
        rh = await client.open_ledger(lh.ledger_id)
        assert [len(e.payload) async for e in rh.read()] == [6, 5, 60 * 1024]


async def test_submit_many_sends_all_or_none_and_respects_the_outstanding_cap(
        tmp_path: Path) -> None:
    from ledgerd.wire.errors import MessageTooLargeError

    settings = client_settings(max_frame_bytes=64 * 1024, max_inflight_per_bookie=16,
                               throttle=0)
    async with memory_cluster(tmp_path, 3) as cluster, ledgerd.open_client(
            store=cluster.store, connect=cluster.connect, **settings) as client:
        lh = await client.create_ledger(3, 2, 2)
        with pytest.raises(MessageTooLargeError):
            await lh.submit_many([b"fits", bytes(100 * 1024)])
        assert lh.length == 0 and lh.outstanding == 0  # nothing of that batch went out
        # 100 entries through a cap of 8 outstanding: chunked by the cap, in order.
        assert lh.max_outstanding == 8
        seen: list[int] = []

        async def watch() -> None:
            while len(seen) < 100:
                seen.append(lh.outstanding)
                await trio.lowlevel.checkpoint()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch)
            ids = await lh.append_many(b"m%d" % i for i in range(100))
        assert ids == list(range(100)) and max(seen) <= 8
        assert lh.last_add_confirmed == 99 and lh.ensemble_changes == 0
        pending = await lh.submit_many([b"x", b"y"])
        assert [await p for p in pending] == [100, 101]
        await lh.close()
        rh = await client.open_ledger(lh.ledger_id)
        assert [e.payload async for e in rh.read()] == \
            [b"m%d" % i for i in range(100)] + [b"x", b"y"]


async def test_leaving_the_client_with_adds_in_flight_fails_them_and_raises_nothing(
        tmp_path: Path) -> None:
    # Closing the client fails every connection; each failure asks for an ensemble
    # change, which must not be started in the closing client's nursery (the fault
    # harness saw "Nursery is closed to new arrivals" raised out of the client's exit).
    pending = []
    async with memory_cluster(tmp_path, 4) as cluster:
        async with ledgerd.open_client(store=cluster.store, connect=cluster.connect,
                                       **client_settings()) as client:
            lh = await client.create_ledger(3, 2, 2)
            await lh.append(b"first")
            for b in lh.ensemble:
                cluster[b].gate.freeze()   # no replies: the adds stay in flight
            pending = [await lh.submit(b"late %d" % i) for i in range(10)]
        for p in pending:
            assert p.done
            with pytest.raises(ledgerd.LedgerdError, match=r"closed"):
                await p.wait()
        for b in cluster.bookies:
            cluster[b].gate.thaw()


async def test_entries_submitted_in_one_pass_share_add_requests(tmp_path: Path) -> None:
    async with memory_cluster(tmp_path, 3) as cluster, ledgerd.open_client(
            store=cluster.store, connect=cluster.connect, **client_settings()) as client:
        lh = await client.create_ledger(3, 3, 3)  # Qa = 3: every bookie has answered
        with trio.fail_after(30):
            # 64 submits without yielding: one flusher pass sends them as one frame each.
            pending = [await lh.submit(b"x" * 100) for _ in range(64)]
            assert [await p for p in pending] == list(range(64))
            await lh.close()
        for name in ("b0:3181", "b1:3181", "b2:3181"):
            bookie = cluster[name]
            assert bookie.harness.metrics.entries_added == 64
            assert bookie.count(ApiKey.ADD, Status.OK) == 1  # one AddRequest of 64 entries


async def test_reads_order_replicas_by_recent_failure_unless_turned_off() -> None:
    async with trio.open_nursery() as nursery:
        on = BookiePool(nursery, PoolOptions())
        off = BookiePool(nursery, PoolOptions(reorder_reads=False))
        for pool in (on, off):
            pool._failed_at["b:1"] = trio.current_time()
        assert on.order_replicas(["b:1", "b:2", "b:3"]) == ["b:2", "b:3", "b:1"]
        assert off.order_replicas(["b:1", "b:2", "b:3"]) == ["b:1", "b:2", "b:3"]
        on.close()
        off.close()
        nursery.cancel_scope.cancel()


async def test_client_metrics_when_asked(tmp_path: Path) -> None:
    """The client's collector: append and read latencies (only once asked), outcomes,
    outstanding appends, and the ensemble change that replaced a silent bookie."""
    from prometheus_client import CollectorRegistry, generate_latest

    settings = client_settings(connect_timeout_ms=60_000)
    async with memory_cluster(tmp_path, 4) as cluster, ledgerd.open_client(
            store=cluster.store, connect=cluster.connect, **settings) as client:
        lh = await client.create_ledger(3, 3, 3)
        await lh.append(b"before asking")
        assert client.metrics.add_latency.count == 0  # not asked yet: nothing observed
        registry = CollectorRegistry()
        registry.register(client.metrics_collector())
        silent = lh.metadata.ensembles[0][1][0]
        cluster[silent].gate.freeze()
        with trio.fail_after(30):
            pending = [await lh.submit(b"entry %d" % i) for i in range(10)]
            assert client.metrics.outstanding == 10
            for p in pending:
                await p
        async for _ in lh.read(0, 5):
            pass
        text = generate_latest(registry).decode()
        assert "ledgerd_client_add_latency_seconds_count 10.0" in text
        assert 'ledgerd_client_adds_total{outcome="ok"} 11.0' in text
        assert "ledgerd_client_outstanding_appends 0.0" in text
        assert "ledgerd_client_ensemble_changes_total 1.0" in text
        assert "ledgerd_client_read_latency_seconds_count 1.0" in text
        cluster[silent].gate.thaw()
