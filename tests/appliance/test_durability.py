"""Durability debt and the scrubber over real bookies on memory streams and a virtual
clock: the debt counted from metadata and the queue matches a brute-force count of the
copies, a marked ledger and a short one agree, a bookie that lost a ledger finds it
with its scrubber and the workers bring the copies back; the auditor's gauges follow.

The real-process version is tests/integration/test_scrubber_cluster.py.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import trio
import trio.testing

import ledgerd
from ledgerd.appliance.autorecovery import register_autorecovery_metrics
from ledgerd.appliance.durability import DurabilityGauges
from ledgerd.appliance.metrics import BookieMetrics
from ledgerd.appliance.scrubber import Scrubber, ScrubOptions
from ledgerd.client import Client
from ledgerd.durability import durability_report, published_report
from ledgerd.machines.checker import fragments, stored_runs
from ledgerd.metadata.ledgers import LedgerManager
from ledgerd.metadata.registry import BookieRegistry
from ledgerd.metadata.underreplication import UnderreplicationManager
from tests.appliance.test_autorecovery import (
    ROOT,
    SECRET,
    _empty,
    _true,
    assert_whole,
    autorecovery,
    config,
    until,
    write_ledgers,
)
from tests.ledgerd.memcluster import MemoryCluster, client_settings, memory_cluster
from tests.ledgerd.test_replication import lose


@pytest.fixture
def clock(mock_clock: trio.testing.MockClock) -> trio.testing.MockClock:
    mock_clock.autojump_threshold = 0.05
    return mock_clock


async def below_qw_by_hand(client: Client, available: set[str], lac: dict[int, int],
                           missing: dict[str, dict[int, set[int]]]) -> int:
    """Entry by entry: copies on registered bookies of the write set, minus the
    entries ``missing`` says a bookie lacks (bookie -> ledger -> entry ids)."""
    below = 0
    async for lid in client.list_ledgers():
        md = await client.ledger_metadata(lid)
        for frag in fragments(md, lac.get(lid, -1)):
            last = min(frag.last, md.last_entry_id) if md.is_closed else frag.last
            for e in range(frag.first, last + 1):
                copies = 0
                for i, b in enumerate(frag.ensemble):
                    if b in available and any(a <= e <= z for a, z in stored_runs(
                            frag.first, last, md.ensemble_size, md.write_quorum, i)) \
                            and e not in missing.get(b, {}).get(lid, set()):
                        copies += 1
                below += copies < md.write_quorum
    return below


async def test_debt_matches_a_count_by_hand_and_marks_agree_with_short_ledgers(
        tmp_path: Path, clock: trio.testing.MockClock) -> None:
    async with memory_cluster(tmp_path, 5, cluster_secret=SECRET) as cluster, \
            ledgerd.open_client(store=cluster.store, connect=cluster.connect,
                                **client_settings()) as client:
        ledgers = await write_ledgers(client, 4, (3, 2, 2), entries=30)
        idle = await client.create_ledger(3, 2, 2, password=b"pw")
        for i in range(25):
            await idle.append(b"idle %d" % i + bytes(90))
        report, _ = await durability_report(client, now_ms=0)
        assert report.entries_below_qw == 0 and report.agrees and report.ledgers == 5
        victim = idle.ensemble[0]
        await lose(cluster, victim)
        urm = UnderreplicationManager(cluster.store, ROOT)
        report, debts = await durability_report(client, now_ms=0)
        available = set(cluster.bookies) - {victim}
        lac = {idle.ledger_id: max([_bookie_lac(cluster, idle.ledger_id, b)
                                    for b in available])}
        assert lac[idle.ledger_id] >= 23
        expected = await below_qw_by_hand(client, available, lac, {})
        assert report.entries_below_qw == expected > 0
        assert report.entries_single_copy == expected  # Qw 2: one copy left of each
        assert idle.ledger_id in report.short and not report.agrees
        referencing = {d.ledger_id for d in debts if d.references_lost}
        assert set(report.unmarked) == referencing and report.stale_marks == ()
        assert report.bytes_below_qw > 0
        for lid in referencing:  # what the auditor does
            await urm.mark_underreplicated(lid, [victim])
        report, _ = await durability_report(client, now_ms=10**13)
        assert report.agrees and report.marked_ledgers == len(referencing)
        assert report.oldest_underreplicated_age_s is not None
        # A mark for a ledger nothing is wrong with is stale.
        fine = next((lid for lid in ledgers if lid not in referencing), None)
        if fine is not None:
            await urm.mark_underreplicated(fine, [victim])
            report, _ = await durability_report(client, now_ms=0)
            assert report.stale_marks == (fine,)


def _bookie_lac(cluster: MemoryCluster, lid: int, bookie: str) -> int:
    storage = cluster[bookie].storage
    return storage.lac(lid) if storage.ledger_exists(lid) else -1


async def test_scrubber_finds_a_lost_ledger_and_autorecovery_copies_it_back(
        tmp_path: Path, clock: trio.testing.MockClock) -> None:
    async with memory_cluster(tmp_path, 4, cluster_secret=SECRET) as cluster, \
            ledgerd.open_client(store=cluster.store, connect=cluster.connect,
                                **client_settings()) as client:
        ledgers = await write_ledgers(client, 3, (3, 3, 2), entries=40)
        lid = next(iter(ledgers))
        md = await client.ledger_metadata(lid)
        victim = md.ensembles[0][1][0]
        storage = cluster[victim].storage
        # Entries 10..19 vanish from its index (the first and last it holds stay, so
        # the auditor's probes see nothing); it still registers.
        for e in range(10, 20):
            storage.cache.set_location(lid, e, 0)
        assert storage.read_entry(lid, 0) and storage.read_entry(lid, 39)
        urm = UnderreplicationManager(cluster.store, ROOT)
        report, _ = await durability_report(client, now_ms=0)
        assert report.entries_below_qw == 0  # nobody knows yet
        scrubber = Scrubber(storage, victim, ScrubOptions(rate_per_s=10000),
                            rng=random.Random(3))
        scrubber.ledgers = LedgerManager(cluster.store, ROOT)
        scrubber.marks = urm
        p = await scrubber.scrub_once()
        held = 0
        for x in ledgers:  # E3/Qw3: every entry on each bookie of the ensemble
            held += 40 * (victim in (await client.ledger_metadata(x)).ensembles[0][1])
        assert p.entries_checked == held and p.entries_missing == 10 and p.ledgers_marked == 1
        rec = await urm.get(lid)
        assert rec is not None and dict(rec.missing_entries) == {victim: ((10, 19),)}
        report, _ = await durability_report(client, now_ms=0)
        assert report.short == (lid,) and report.entries_below_qw == 10 and report.agrees
        assert report.entries_single_copy == 0  # Qw 3: two copies left
        # The auditor's gauges and the workers: the ledger comes back to Qw copies.
        metrics = BookieMetrics()
        async with autorecovery(cluster, config(tmp_path, auditor_durability_interval_s=5)
                                ) as (stats, _):
            register_autorecovery_metrics(metrics, stats)
            await until(lambda: _empty(urm))
            assert victim not in (await client.ledger_metadata(lid)).ensembles[0][1]
            await assert_whole(cluster, client, ledgers)
            gauges: DurabilityGauges = stats.durability
            await until(lambda: _true(gauges.report is not None
                                      and gauges.report.entries_below_qw == 0))
            assert gauges.report is not None and gauges.report.agrees
            assert gauges.eta_s() == 0.0
            text = metrics.exposition().decode()
            assert "ledgerd_durability_entries_below_qw 0.0" in text
            assert "ledgerd_durability_time_to_full_redundancy_seconds 0.0" in text
            published = await published_report(cluster.store, ROOT)
            assert published is not None and published["entries_below_qw"] == 0
        # A second pass finds nothing: the bookie no longer should hold it.
        assert (await scrubber.scrub_once()).entries_missing == 0
        assert await BookieRegistry(cluster.store, ROOT).list_bookies()
