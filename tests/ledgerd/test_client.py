"""The trio client against real bookies (in this process) and the real ZooKeeper."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

import ledgerd
from ledgerd import (
    BadPasswordError,
    LedgerClosedError,
    LedgerFencedError,
    NoSuchLedgerError,
    NotEnoughBookiesError,
    ReadBeyondLacError,
)
from ledgerd.metadata.ledger import LedgerState
from ledgerd.wire.messages import ApiKey
from ledgerd.wire.status import Status
from tests.ledgerd.inproc import inprocess_cluster


async def test_create_append_close_read(zk_chroot: str, tmp_path: Path) -> None:
    async with inprocess_cluster(zk_chroot, tmp_path, 3) as cluster, \
            ledgerd.open_client(zk_chroot) as client:
        lh = await client.create_ledger(3, 2, 2, password=b"pw", custom_metadata={"app": "t"})
        assert await lh.append(b"first") == 0
        ids = await lh.append_many(f"entry {i}".encode() for i in range(1, 300))
        assert ids == list(range(1, 300))
        # Striped E3/Qw2: each bookie holds runs of two with gaps; SPARSE adds carry
        # its ~200 entries in a request or two, not one request per run of two.
        adds = [b.metrics.requests.get((ApiKey.ADD, Status.OK), 0) for b in cluster.bookies]
        assert sum(adds) <= 10, adds
        assert lh.last_add_confirmed == 299
        await lh.close()
        md = await client.ledger_metadata(lh.ledger_id)
        assert md.state is LedgerState.CLOSED and md.last_entry_id == 299
        assert md.custom_metadata == {"app": "t"}
        assert md.length == len(b"first") + sum(len(f"entry {i}") for i in range(1, 300))
        rh = await client.open_ledger(lh.ledger_id, password=b"pw")
        got = [e async for e in rh.read()]
        assert [e.entry_id for e in got] == list(range(300))
        assert got[0].payload == b"first" and got[299].payload == b"entry 299"
        with pytest.raises(ReadBeyondLacError):
            async for _ in rh.read(0, 300):
                pass


async def test_quorum_validation_and_not_enough_bookies(zk_chroot: str, tmp_path: Path) -> None:
    async with inprocess_cluster(zk_chroot, tmp_path, 2), \
            ledgerd.open_client(zk_chroot) as client:
        with pytest.raises(ValueError, match="ensemble_size >= write_quorum"):
            await client.create_ledger(2, 3, 2)
        with pytest.raises(NotEnoughBookiesError, match="needed 3, found 2"):
            await client.create_ledger(3, 2, 2)


async def test_zstd_and_digests(zk_chroot: str, tmp_path: Path) -> None:
    async with inprocess_cluster(zk_chroot, tmp_path, 2), \
            ledgerd.open_client(zk_chroot) as client:
        for digest in ("crc32c", "crc32", "hmac", "dummy"):
            lh = await client.create_ledger(2, 2, 1, digest=digest, password="s",
                                            compression="zstd")
            data = [bytes([i]) * 5000 for i in range(20)]
            await lh.append_many(data)
            await lh.close()
            rh = await client.open_ledger(lh.ledger_id, password="s")
            assert [e.payload async for e in rh.read()] == data, digest
            assert rh.length < sum(map(len, data))  # stored compressed


async def test_wrong_password_and_missing_ledger(zk_chroot: str, tmp_path: Path) -> None:
    async with inprocess_cluster(zk_chroot, tmp_path, 1), \
            ledgerd.open_client(zk_chroot) as client:
        lh = await client.create_ledger(1, 1, 1, password=b"right")
        await lh.append(b"x")
        with pytest.raises(BadPasswordError, match="wrong password"):
            await client.open_ledger(lh.ledger_id, password=b"wrong")
        with pytest.raises(NoSuchLedgerError, match="ledger 999999 does not exist"):
            await client.open_ledger(999999)
        await client.delete_ledger(lh.ledger_id)
        with pytest.raises(NoSuchLedgerError):
            await client.delete_ledger(lh.ledger_id)


async def test_recovery_fences_the_writer(zk_chroot: str, tmp_path: Path) -> None:
    async with inprocess_cluster(zk_chroot, tmp_path, 3), \
            ledgerd.open_client(zk_chroot) as writer, ledgerd.open_client(zk_chroot) as reader:
        lh = await writer.create_ledger(3, 2, 2)
        await lh.append_many(b"e%d" % i for i in range(50))
        rh = await reader.open_ledger(lh.ledger_id)  # recovery
        assert rh.is_closed and rh.last_add_confirmed == 49
        with pytest.raises(LedgerFencedError):
            await lh.append(b"late")
        with pytest.raises(LedgerFencedError):
            await lh.append(b"later still")
        await lh.close()  # CLOSED at the end this writer acknowledged: close succeeds
        assert [e.payload async for e in rh.read()] == [b"e%d" % i for i in range(50)]


async def test_close_conflict_rules(zk_chroot: str, tmp_path: Path) -> None:
    async with inprocess_cluster(zk_chroot, tmp_path, 2), \
            ledgerd.open_client(zk_chroot) as client:
        lh = await client.create_ledger(2, 2, 2)
        await lh.append_many([b"a", b"b"])
        # Someone else closed it at the same end: the writer's close succeeds.
        await client.ledgers.update(lh.ledger_id, lambda md: md.closed(1, 2))
        await lh.close()
        lh2 = await client.create_ledger(2, 2, 2)
        await lh2.append_many([b"a", b"b"])
        await client.ledgers.update(lh2.ledger_id, lambda md: md.closed(0, 1))
        with pytest.raises(LedgerClosedError, match="closed at entry 0"):
            await lh2.close()


async def test_ensemble_change_when_a_bookie_stops(zk_chroot: str, tmp_path: Path) -> None:
    async with inprocess_cluster(zk_chroot, tmp_path, 4) as cluster, \
            ledgerd.open_client(zk_chroot, add_entry_timeout_ms=2000) as client:
        lh = await client.create_ledger(3, 2, 2)
        await lh.append_many(b"before %d" % i for i in range(100))
        victim = lh.ensemble[0]
        await cluster.stop([b.bookie_id for b in cluster.bookies].index(victim))
        await lh.append_many(b"after %d" % i for i in range(100))
        assert victim not in lh.ensemble and lh.ensemble_changes >= 1
        await lh.close()
        md = await client.ledger_metadata(lh.ledger_id)
        assert len(md.ensembles) >= 2 and victim in md.ensembles[0][1]
        rh = await client.open_ledger(lh.ledger_id)
        payloads = [e.payload async for e in rh.read()]
        assert payloads == [b"before %d" % i for i in range(100)] + [b"after %d" % i
                                                                      for i in range(100)]


async def test_tailing_reader_follows_the_writer(zk_chroot: str, tmp_path: Path) -> None:
    async with inprocess_cluster(zk_chroot, tmp_path, 3), \
            ledgerd.open_client(zk_chroot, explicit_lac_interval_ms=50,
                                add_entry_timeout_ms=120_000) as client:
        lh = await client.create_ledger(3, 2, 2)
        rh = await client.open_ledger(lh.ledger_id, recovery=False)
        assert rh.last_add_confirmed == -1 and not rh.is_closed
        seen: list[bytes] = []
        for i in range(5):
            await lh.append(b"t%d" % i)
            # The explicit LAC goes out 50 ms after the writer idles; nothing else tells
            # the reader within the bound: the writer's add timeout, whose wake-up once
            # hid a lost explicit LAC, is far beyond it (the bound only stops a hang).
            with trio.fail_after(30):
                lac = await rh.wait_lac_beyond(i - 1, timeout=60)
            assert lac >= i
            seen += [e.payload async for e in rh.read(len(seen), lac)]
        assert seen == [b"t%d" % i for i in range(5)]
        assert await rh.read_lac() == 4
        await lh.close()
        await rh.refresh()
        assert rh.is_closed and await rh.wait_lac_beyond(4, timeout=1) == 4


@pytest.mark.parametrize(("e", "qw"), [(3, 3), (3, 2)])
async def test_range_reads_fail_over_past_missing_and_wrong_entries(
        zk_chroot: str, tmp_path: Path, e: int, qw: int) -> None:
    async with inprocess_cluster(zk_chroot, tmp_path, 3) as cluster, \
            ledgerd.open_client(zk_chroot) as client:
        lh = await client.create_ledger(e, qw, 2, password=b"pw")
        await lh.append_many(f"entry {i}".encode() for i in range(600))
        await lh.close()
        lid = lh.ledger_id
        by_id = {b.bookie_id: b for b in cluster.bookies}
        first, second = (by_id[a] for a in lh.ensemble[:2])
        # The first bookie loses entries 100..149 it holds; the second answers entry
        # 301 with the bytes of another entry (ids and digest do not match).
        for eid in range(100, 150):
            if first.storage.cache.location(lid, eid):
                first.storage.cache.set_location(lid, eid, 0)
        held = [eid for eid in range(290, 320) if second.storage.cache.location(lid, eid)]
        second.storage.cache.set_location(lid, held[1], second.storage.cache.location(
            lid, held[0]))
        rh = await client.open_ledger(lid, password=b"pw")
        got = await rh.read_batch(0, 599)
        assert [x.payload for x in got] == [f"entry {i}".encode() for i in range(600)]
        assert [x.entry_id async for x in rh.read(95, 160)] == list(range(95, 161))
