"""The client against real bookie processes and the real ZooKeeper: kill -9 of a bookie
mid-stream, kill -9 of a writer then racing recoverers, fencing of a live writer, wrong
passwords, and a tailing reader."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace

import pytest
import trio

import ledgerd
from ledgerd.metadata.ledgers import LedgerManager
from ledgerd.tools.bookieprocess import BookieProcess
from tests.cluster import EVENT_BOUND_S, metadata_store, start_bookies
from tests.integration.writer_proc import payload

Factory = Callable[..., BookieProcess]


async def _cluster(factory: Factory, zk: str, n: int) -> list[BookieProcess]:
    return await start_bookies(factory, zk, n)


async def test_10k_entries_with_a_bookie_killed_mid_stream(bookie_factory: Factory,
                                                           zk_chroot: str) -> None:
    bookies = await _cluster(bookie_factory, zk_chroot, 4)
    by_id = {b.bookie_id: b for b in bookies}
    async with ledgerd.open_client(zk_chroot, throttle=0) as client:
        lh = await client.create_ledger(3, 2, 2, password=b"pw")
        victim = by_id[lh.ensemble[1]]
        pending = []
        for i in range(10_000):
            pending.append(await lh.submit(payload(i)))
            if i == 3000:
                await pending[2000]  # some acknowledged, many in flight
                victim.kill9()
        assert [await p for p in pending] == list(range(10_000))
        assert victim.bookie_id not in lh.ensemble and lh.ensemble_changes >= 1
        await lh.close()
    async with ledgerd.open_client(zk_chroot) as reader:
        rh = await reader.open_ledger(lh.ledger_id, password=b"pw")
        assert rh.last_add_confirmed == 9999
        md = rh.metadata
        assert len(md.ensembles) >= 2 and victim.bookie_id in md.ensembles[0][1]
        n = 0
        async for e in rh.read():
            assert e.payload == payload(e.entry_id)
            n += 1
        assert n == 10_000


async def test_writer_killed_then_two_recoverers_converge(bookie_factory: Factory,
                                                          zk_chroot: str) -> None:
    await _cluster(bookie_factory, zk_chroot, 4)
    proc = subprocess.Popen([sys.executable, "-m", "tests.integration.writer_proc", zk_chroot],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    acked = -1
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline().decode()
        assert first.startswith("ledger "), first + proc.stderr.read().decode()  # type: ignore[union-attr]
        ledger_id = int(first.split()[1])
        while acked < 2000:
            line = proc.stdout.readline().decode()
            assert line.startswith("acked "), line
            acked = int(line.split()[1])
        os.kill(proc.pid, signal.SIGKILL)  # mid-stream: adds are in flight
        proc.wait(30)
        for line in proc.stdout.read().decode().splitlines():
            if line.startswith("acked "):
                acked = max(acked, int(line.split()[1]))  # printed before the kill landed
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(30)

    ends: dict[str, int] = {}
    contents: dict[str, list[bytes]] = {}

    async def recover(name: str) -> None:
        async with ledgerd.open_client(zk_chroot) as client:
            rh = await client.open_ledger(ledger_id, password=b"pw")
            ends[name] = rh.last_add_confirmed
            contents[name] = [e.payload async for e in rh.read()]

    with trio.fail_after(EVENT_BOUND_S):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(recover, "r1")
            nursery.start_soon(recover, "r2")
    assert ends["r1"] == ends["r2"] >= acked
    assert contents["r1"] == contents["r2"]
    assert contents["r1"] == [payload(i) for i in range(ends["r1"] + 1)]


async def test_live_writer_is_fenced_by_recovery(bookie_factory: Factory, zk_chroot: str) -> None:
    await _cluster(bookie_factory, zk_chroot, 3)
    async with ledgerd.open_client(zk_chroot) as writer, ledgerd.open_client(zk_chroot) as other:
        lh = await writer.create_ledger(3, 2, 2, password=b"pw")
        await lh.append_many(payload(i) for i in range(100))
        rh = await other.open_ledger(lh.ledger_id, password=b"pw")
        assert rh.last_add_confirmed == 99
        with pytest.raises(ledgerd.LedgerFencedError, match="fenced"):
            await lh.append(b"after recovery")


async def test_wrong_password_is_a_clear_unauthorized_error(bookie_factory: Factory,
                                                            zk_chroot: str) -> None:
    await _cluster(bookie_factory, zk_chroot, 3)
    async with ledgerd.open_client(zk_chroot) as client:
        lh = await client.create_ledger(3, 2, 2, password=b"right")
        await lh.append_many([b"a", b"b"])
        with pytest.raises(ledgerd.BadPasswordError, match=r"wrong password \(UNAUTHORIZED\)"):
            await client.open_ledger(lh.ledger_id, password=b"wrong")
        # Metadata without a password check (as a foreign client may write it): the
        # bookies refuse the fencing read's master key, and that surfaces the same way.
        async with metadata_store(zk_chroot, init=False) as store:
            await LedgerManager(store).update(lh.ledger_id,
                                              lambda md: replace(md, password_check=""))
        with pytest.raises(ledgerd.BadPasswordError, match="UNAUTHORIZED"):
            await client.open_ledger(lh.ledger_id, password=b"wrong")
        rh = await client.open_ledger(lh.ledger_id, password=b"right")
        assert [e.payload async for e in rh.read()] == [b"a", b"b"]


async def test_tailing_reader_sees_each_entry_within_one_long_poll(bookie_factory: Factory,
                                                                   zk_chroot: str) -> None:
    await _cluster(bookie_factory, zk_chroot, 3)
    poll_s = 60.0
    async with ledgerd.open_client(zk_chroot, explicit_lac_interval_ms=100,
                                   add_entry_timeout_ms=120_000) as client, \
            ledgerd.open_client(zk_chroot) as tail_client:
        lh = await client.create_ledger(3, 2, 2)
        rh = await tail_client.open_ledger(lh.ledger_id, recovery=False)
        got: list[bytes] = []
        seen_send, seen_recv = trio.open_memory_channel[int](100)

        async def tail() -> None:
            while len(got) < 20:
                # One long-poll round, answered by the writer's explicit LAC (100 ms after
                # it idles): nothing else tells the reader within the bound, the writer's
                # add timeout (whose wake-up once hid a lost explicit LAC) being far
                # beyond it. The bound only stops a hang on a slow host.
                with trio.fail_after(30):
                    lac = await rh.wait_lac_beyond(len(got) - 1, timeout=poll_s)
                got.extend([e.payload async for e in rh.read(len(got), lac)])
                await seen_send.send(len(got))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(tail)
            for i in range(20):
                # Lock-step: each entry is appended while the reader's long poll waits,
                # and the writer goes on only once the reader has it.
                await lh.append(b"tail %d" % i)
                while await seen_recv.receive() <= i:
                    pass
        assert got == [b"tail %d" % i for i in range(20)]
        await lh.close()
