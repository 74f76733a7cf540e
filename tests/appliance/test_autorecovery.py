"""Autorecovery over real bookies on memory streams and a virtual clock: the auditor's
delays and triggers, workers competing, the grace period, the switch, session loss.

The upstream scenarios (AuditorLedgerCheckerTest, AuditorBookieTest,
TestReplicationWorker, BookieAutoRecoveryTest) in the small; the real-process version
is tests/integration/test_autorecovery_cluster.py.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import ledgerd
from ledgerd.appliance.autorecovery import (
    AutoRecoveryStats,
    final_fragments_missing,
    run_autorecovery,
)
from ledgerd.appliance.config import BookieConfig
from ledgerd.client import Client
from ledgerd.metadata.ledger import LedgerMetadata
from ledgerd.metadata.memory import InMemoryStore
from ledgerd.metadata.registry import BookieRegistry
from ledgerd.metadata.underreplication import AuditorElection, UnderreplicationManager
from tests.ledgerd.memcluster import MemoryCluster, client_settings, memory_cluster
from tests.ledgerd.test_replication import lose, whole

SECRET = b"cluster-secret-for-tests-0123456789"
ROOT = "/ledgers"


@pytest.fixture
def clock(mock_clock: trio.testing.MockClock) -> trio.testing.MockClock:
    mock_clock.autojump_threshold = 0.05
    return mock_clock


def config(tmp: Path, **overrides: Any) -> BookieConfig:
    secret = tmp / "secret"
    if not secret.exists():
        secret.write_bytes(SECRET)
        os.chmod(secret, 0o600)
    settings: dict[str, Any] = dict(
        ledger_directories=(str(tmp / "unused"),), cluster_secret_file=str(secret),
        lost_bookie_recovery_delay_s=0, auditor_periodic_check_interval_s=0,
        auditor_periodic_bookie_check_interval_s=0, open_ledger_rereplication_grace_period_ms=5000,
        rw_rereplicate_backoff_ms=5000, lock_release_of_failed_ledger_grace_period_ms=40000,
        rereplication_entry_batch_size=16)
    settings.update(overrides)
    return BookieConfig(**settings)


@asynccontextmanager
async def autorecovery(cluster: MemoryCluster, cfg: BookieConfig, name: str = "ar-1",
                       ) -> AsyncIterator[tuple[AutoRecoveryStats, InMemoryStore]]:
    """An autorecovery process with its own ZooKeeper session (so it can be expired)."""
    store = InMemoryStore(cluster.store.cluster)
    stats = AutoRecoveryStats()
    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: run_autorecovery(
            store, cfg, name, stats=stats, connect=cluster.connect, task_status=task_status))
        try:
            yield stats, store
        finally:
            nursery.cancel_scope.cancel()
    await store.close()


async def write_ledgers(client: Client, n: int, quorums: tuple[int, int, int] = (3, 2, 2),
                        entries: int = 20) -> dict[int, dict[int, bytes]]:
    out = {}
    for k in range(n):
        lh = await client.create_ledger(*quorums, password=b"pw%d" % k)
        payloads = {i: b"l%d e%d " % (k, i) + bytes(i) for i in range(entries)}
        for i in range(entries):
            await lh.append(payloads[i])
        await lh.close()
        out[lh.ledger_id] = payloads
    return out


async def until(predicate: Any, timeout: float = 300.0, step: float = 5.0) -> None:
    with trio.fail_after(timeout):
        while not await predicate():
            await trio.sleep(step)


async def references(client: Client, bookie: str) -> list[int]:
    return await client.ledgers.listing({bookie})


async def most_referenced(client: Client, ledgers: dict[int, dict[int, bytes]], k: int
                          ) -> list[str]:
    """The ``k`` bookies that hold the most of ``ledgers`` (placement is random, so a
    fixed name such as "b4" may hold none of them, and losing it would mark nothing)."""
    counts: dict[str, int] = {}
    for lid in ledgers:
        for _, ensemble in (await client.ledger_metadata(lid)).ensembles:
            for b in set(ensemble):
                counts[b] = counts.get(b, 0) + 1
    return sorted(counts, key=lambda b: (-counts[b], b))[:k]


async def assert_whole(cluster: MemoryCluster, client: Client,
                       ledgers: dict[int, dict[int, bytes]]) -> None:
    for lid, payloads in ledgers.items():
        md = await client.ledger_metadata(lid)
        assert whole(cluster, lid, md, payloads) == [], lid


async def test_a_bookie_back_within_the_delay_causes_no_copying_one_gone_for_good_does(
        tmp_path: Path, clock: trio.testing.MockClock) -> None:
    async with memory_cluster(tmp_path, 5, cluster_secret=SECRET) as cluster, \
            ledgerd.open_client(store=cluster.store, connect=cluster.connect,
                                **client_settings()) as client:
        ledgers = await write_ledgers(client, 6)
        [victim] = await most_referenced(client, ledgers, 1)
        urm = UnderreplicationManager(cluster.store, ROOT)
        registry = BookieRegistry(cluster.store, ROOT)
        async with autorecovery(cluster, config(tmp_path, lost_bookie_recovery_delay_s=30)
                                ) as (stats, _):
            await until(lambda: _true(stats.is_auditor))
            # Restarted within the delay: no mark, no copy.
            await registry.unregister(victim)
            await trio.sleep(10)
            await registry.register(victim, {"bookie_id": victim})
            await trio.sleep(60)
            assert await urm.count() == 0 and stats.fragments_copied == 0
            # Gone for good: marked after the delay, copied, the records deleted.
            start = trio.current_time()
            await lose(cluster, victim)
            await until(lambda: _true(stats.ledgers_marked > 0))
            assert trio.current_time() - start >= 30
            await until(lambda: _empty(urm))
            assert await references(client, victim) == []
            await assert_whole(cluster, client, ledgers)
            assert stats.entries_copied > 0 and stats.failures == 0


async def test_two_bookies_lost_are_audited_at_once_and_triggeraudit_skips_the_delay(
        tmp_path: Path, clock: trio.testing.MockClock) -> None:
    async with memory_cluster(tmp_path, 6, cluster_secret=SECRET) as cluster, \
            ledgerd.open_client(store=cluster.store, connect=cluster.connect,
                                **client_settings()) as client:
        ledgers = await write_ledgers(client, 6, (3, 3, 2))
        urm = UnderreplicationManager(cluster.store, ROOT)
        async with autorecovery(cluster, config(tmp_path, lost_bookie_recovery_delay_s=3600)
                                ) as (stats, _):
            await until(lambda: _true(stats.is_auditor))
            start = trio.current_time()
            first, second, third = await most_referenced(client, ledgers, 3)
            await lose(cluster, first)
            await lose(cluster, second)
            await until(lambda: _empty(urm) if stats.ledgers_marked else _false())
            assert trio.current_time() - start < 60
            for b in (first, second):
                assert await references(client, b) == []
            await assert_whole(cluster, client, ledgers)
            # One more lost bookie waits for the hour, unless an operator triggers.
            marked = stats.ledgers_marked
            await lose(cluster, third)
            await trio.sleep(120)
            assert stats.ledgers_marked == marked
            assert await AuditorElection(cluster.store, ROOT).current_auditor() == "ar-1"
            await urm.set_lost_bookie_delay(await urm.get_lost_bookie_delay() or 0)
            await until(lambda: _empty(urm) if stats.ledgers_marked > marked else _false())
            assert await references(client, third) == []
            await assert_whole(cluster, client, ledgers)


async def test_disabled_autorecovery_waits_and_resumes_after_session_loss(
        tmp_path: Path, clock: trio.testing.MockClock) -> None:
    async with memory_cluster(tmp_path, 5, cluster_secret=SECRET) as cluster, \
            ledgerd.open_client(store=cluster.store, connect=cluster.connect,
                                **client_settings()) as client:
        ledgers = await write_ledgers(client, 4)
        urm = UnderreplicationManager(cluster.store, ROOT)
        await urm.set_enabled(False)
        async with autorecovery(cluster, config(tmp_path)) as (stats, store):
            await until(lambda: _true(stats.is_auditor))
            # The session expires: the vote vanished; the auditor stands again.
            store.expire_session()
            await until(lambda: _true(stats.session_restarts >= 2 and stats.is_auditor))
            [victim] = await most_referenced(client, ledgers, 1)
            await lose(cluster, victim)
            await trio.sleep(60)
            assert stats.fragments_copied == 0  # disabled: nothing marked, nothing copied
            await urm.set_enabled(True)
            await until(lambda: _true(stats.ledgers_marked > 0))
            await until(lambda: _empty(urm))
            assert await references(client, victim) == []
            await assert_whole(cluster, client, ledgers)


async def test_competing_workers_share_the_queue(
        tmp_path: Path, clock: trio.testing.MockClock) -> None:
    async with memory_cluster(tmp_path, 5, cluster_secret=SECRET) as cluster, \
            ledgerd.open_client(store=cluster.store, connect=cluster.connect,
                                **client_settings()) as client:
        ledgers = await write_ledgers(client, 12, (2, 2, 1), entries=10)
        urm = UnderreplicationManager(cluster.store, ROOT)
        cfg = config(tmp_path)
        async with autorecovery(cluster, cfg, "ar-1") as (s1, _), \
                autorecovery(cluster, cfg, "ar-2") as (s2, _):
            await until(lambda: _true(s1.is_auditor or s2.is_auditor))
            [victim] = await most_referenced(client, ledgers, 1)
            await lose(cluster, victim)
            await until(lambda: _true(s1.ledgers_marked + s2.ledgers_marked > 0))
            await until(lambda: _empty(urm))
            assert s1.ledgers_replicated > 0 and s2.ledgers_replicated > 0
            assert await references(client, victim) == []
            await assert_whole(cluster, client, ledgers)


async def test_open_ledger_waits_the_grace_period_then_is_fenced_and_copied(
        tmp_path: Path, clock: trio.testing.MockClock) -> None:
    async with memory_cluster(tmp_path, 5, cluster_secret=SECRET) as cluster, \
            ledgerd.open_client(store=cluster.store, connect=cluster.connect,
                                **client_settings()) as writer_client, \
            ledgerd.open_client(store=cluster.store, connect=cluster.connect,
                                **client_settings()) as client:
        lh = await writer_client.create_ledger(3, 3, 3)
        payloads = {i: b"open %d" % i for i in range(15)}
        for i in range(15):
            await lh.append(payloads[i])
        urm = UnderreplicationManager(cluster.store, ROOT)
        async with autorecovery(cluster, config(tmp_path)) as (stats, _):
            await until(lambda: _true(stats.is_auditor))
            victim = lh.metadata.ensembles[0][1][0]
            start = trio.current_time()
            await lose(cluster, victim)  # the writer is idle: it does not notice
            await until(lambda: _true(stats.ledgers_marked > 0))
            await until(lambda: _empty(urm))
            assert trio.current_time() - start >= 5  # the grace period
            md = await client.ledger_metadata(lh.ledger_id)
            assert md.is_closed and md.last_entry_id == 14
            assert stats.open_ledgers_closed == 1
            assert await references(client, victim) == []
            await assert_whole(cluster, client, {lh.ledger_id: payloads})
        with pytest.raises((ledgerd.LedgerFencedError, ledgerd.LedgerClosedError)):
            await lh.append(b"late")  # fenced, or closed under its ensemble change


async def test_a_ledger_nobody_can_copy_backs_off(
        tmp_path: Path, clock: trio.testing.MockClock) -> None:
    async with memory_cluster(tmp_path, 4, cluster_secret=SECRET) as cluster, \
            ledgerd.open_client(store=cluster.store, connect=cluster.connect,
                                **client_settings()) as client:
        lh = await client.create_ledger(2, 2, 2)
        await lh.append(b"only copy")
        await lh.close()
        async with autorecovery(cluster, config(tmp_path)) as (stats, _):
            await until(lambda: _true(stats.is_auditor))
            for b in lh.metadata.ensembles[0][1]:
                await lose(cluster, b)
            await trio.sleep(300)
            # Backoff 5 s doubling to the 40 s cap: about 10 attempts in 5 minutes, not
            # the thousands a spinning worker would make.
            assert 5 <= stats.failures <= 14 and stats.unrecoverable == stats.failures


async def _true(value: bool) -> bool:
    return value


async def _false() -> bool:
    return False


async def _empty(urm: UnderreplicationManager) -> bool:
    return await urm.count() == 0


async def test_periodic_check_finds_a_bookie_that_lost_a_ledger(
        tmp_path: Path, clock: trio.testing.MockClock) -> None:
    async with memory_cluster(tmp_path, 4, cluster_secret=SECRET) as cluster, \
            ledgerd.open_client(store=cluster.store, connect=cluster.connect,
                                **client_settings()) as client:
        ledgers = await write_ledgers(client, 3, (3, 3, 2))
        lid = next(iter(ledgers))
        wiped = (await client.ledger_metadata(lid)).ensembles[0][1][0]
        await cluster[wiped].storage.delete_ledger(lid)  # its disk lost this ledger
        urm = UnderreplicationManager(cluster.store, ROOT)
        async with autorecovery(cluster, config(tmp_path, auditor_periodic_check_interval_s=3600)
                                ) as (stats, _):
            await until(lambda: _true(stats.checks >= 1))
            await until(lambda: _empty(urm))
            assert stats.ledgers_marked == 1 and stats.fragments_copied == 1
            md = await client.ledger_metadata(lid)
            assert wiped not in md.ensembles[0][1]  # registered, but it lacked the entries
            await assert_whole(cluster, client, ledgers)


async def test_a_stopped_worker_releases_the_locks_it_kept(
        tmp_path: Path, clock: trio.testing.MockClock) -> None:
    from ledgerd.appliance.autorecovery import AutoRecoveryOptions, ReplicationWorker
    from ledgerd.replication import Credentials

    async with memory_cluster(tmp_path, 3, cluster_secret=SECRET) as cluster, \
            ledgerd.open_client(store=cluster.store, connect=cluster.connect,
                                **client_settings()) as client:
        urm = UnderreplicationManager(cluster.store, ROOT)
        lost = ["b0:3181", "b1:3181"]
        ids = []
        for _ in range(2):
            lh = await client.create_ledger(2, 2, 2)
            await lh.append(b"only copy")
            await lh.close()
            ids.append(lh.ledger_id)
        for b in {b for lid in ids for b in (await client.ledger_metadata(lid)).ensembles[0][1]}:
            await lose(cluster, b)
        for lid in ids:
            await urm.mark_underreplicated(lid, lost)
        stats = AutoRecoveryStats()
        worker = ReplicationWorker(client, AutoRecoveryOptions(
            worker_id="w", backoff_s=1, failed_lock_cap_s=3600, max_held_locks=1),
            Credentials(cluster_secret=SECRET), stats)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(worker._work)
            await until(lambda: _true(stats.failures >= 1))
            await trio.sleep(30)  # virtual: long past the first backoffs
            holders = [await urm.lock_holder(lid) for lid in ids]
            assert holders.count("w") == 1  # kept through the backoff; no more than the cap
            nursery.cancel_scope.cancel()
        for lid in ids:
            assert await urm.lock_holder(lid) is None  # same session, lock released
            assert await urm.get(lid) is not None      # the task itself stays queued


async def test_unbounded_ledger_of_an_idle_writer_heals_after_the_grace_period_and_its_next_fragment_at_once(
        tmp_path: Path, clock: trio.testing.MockClock) -> None:
    async with memory_cluster(tmp_path, 5, cluster_secret=SECRET) as cluster, \
            ledgerd.open_client(store=cluster.store, connect=cluster.connect,
                                **client_settings()) as writer_client, \
            ledgerd.open_client(store=cluster.store, connect=cluster.connect,
                                **client_settings()) as client:
        lh = await writer_client.create_unbounded_ledger(3, 2, 2, password=b"pw")
        payloads = {i: b"unbounded %d" % i for i in range(40)}
        for i in range(20):
            await lh.append(payloads[i])
        urm = UnderreplicationManager(cluster.store, ROOT)
        async with autorecovery(cluster, config(tmp_path)) as (stats, _):
            await until(lambda: _true(stats.is_auditor))
            # Index 1 is not in entry 20's write set ([2, 0]) but is in entry 21's: the
            # writer's next adds end a fragment [20..20] that lists the lost bookie.
            victim = lh.metadata.ensembles[0][1][1]
            start = trio.current_time()
            await lose(cluster, victim)  # the writer is idle: it does not notice
            await until(lambda: _true(stats.ledgers_marked > 0), step=0.1)
            await until(lambda: _empty(urm), step=0.1)
            healed_in = trio.current_time() - start
            assert 5 <= healed_in < 8  # the grace period, then the copy
            md = await client.ledger_metadata(lh.ledger_id)
            assert [f for f, _ in md.ensembles] == [0, 20] and md.term == lh.metadata.term
            assert whole(cluster, lh.ledger_id, md, payloads) == []  # 0..19 at Qw
            assert stats.open_ledgers_closed == 0
            # The live writer goes on; the fragment it ends on the lost bookie is marked
            # by the auditor's watch and copied at once, not at a periodic check (off).
            for i in range(20, 40):
                assert await lh.append(payloads[i]) == i
            moved = trio.current_time()
            await until(lambda: _unreferenced(client, victim), step=0.1)
            await until(lambda: _empty(urm), step=0.1)
            assert trio.current_time() - moved < 3
            md = await client.ledger_metadata(lh.ledger_id)
            assert whole(cluster, lh.ledger_id, md, payloads) == []
        rh = await client.open_ledger(lh.ledger_id, b"pw", recovery=False)
        await trio.sleep(1)
        assert await rh.read_lac() == 39
        assert [e.payload async for e in rh.read(0, 39)] == [payloads[i] for i in range(40)]


async def _unreferenced(client: Client, bookie: str) -> bool:
    return await references(client, bookie) == []


def test_final_fragments_missing_names_lost_bookies_of_finished_fragments_only() -> None:
    a, b, c, d = (f"b{i}:1" for i in range(4))
    md = LedgerMetadata(ensemble_size=3, write_quorum=2, ack_quorum=2,
                        ensembles=((0, (a, b, c)),), unbounded=True, term=1)
    assert final_fragments_missing(md, {a, c, d}) == set()  # still the writer's
    moved = md.with_ensemble(20, (a, c, d))  # the writer ended it on the lost bookie
    assert final_fragments_missing(moved, {a, c, d}) == {b}
    assert final_fragments_missing(moved, {a, b, c, d}) == set()
