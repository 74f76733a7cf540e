"""The scrubber with real bookie processes and the real ZooKeeper (issue 45, section 5).

Four bookies run autorecovery in-process. One bookie is stopped and loses data behind
its back: ten entries from the middle of one ledger's index (its first and last entry
stay, so the auditor's probes would see nothing) and another ledger's index file
whole. It restarts and registers normally; its scrubber's start-up pass finds every
missing entry and marks both ledgers with the ranges. While autorecovery is disabled
the marks stay, and ``ledgerd shell durability`` counts exactly those entries below
Qw, the queue agreeing with it; enabled, the workers copy the fragments back to Qw
copies on other bookies, and the debt is zero.

The same loss in the last fragment of two open ledgers whose writers are alive and
idle (a bounded and an unbounded one): the marks stay until every acknowledged entry
is back at Qw, the bounded ledger closed after the grace period and copied, the
unbounded one's fragment split at its LAC with its writer writing on.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import trio

import ledgerd
from ledgerd.disk.index import INDEX_HEADER_SIZE, index_path
from ledgerd.machines.holdings import expected_count, expected_runs
from ledgerd.metadata.underreplication import UnderreplicationManager
from ledgerd.tools.bookieprocess import BookieProcess
from tests.cluster import (
    EVENT_BOUND_S,
    admin_get,
    start_bookies,
    wait_lac_everywhere,
    wait_registered,
    wait_unreferenced,
)
from tests.integration.test_autorecovery_cluster import _copies
from tests.integration.test_autorecovery_unbounded import below_qw

Factory = Callable[..., BookieProcess]
SECRET = b"scrubber-cluster-secret-0123456789"


def _settings(tmp: Path) -> dict[str, object]:
    secret = tmp / "cluster.secret"
    secret.write_bytes(SECRET)
    os.chmod(secret, 0o600)
    return {"cluster_secret_file": str(secret), "auto_recovery_daemon_enabled": True,
            # A restart is not a loss: only the scrubber may mark here.
            "lost_bookie_recovery_delay_s": 600, "rw_rereplicate_backoff_ms": 500,
            "auditor_periodic_check_interval_s": 0,
            "auditor_periodic_bookie_check_interval_s": 0,
            "local_scrub_period_s": 3600, "local_scrub_rate_limit": 100000,
            "auditor_durability_interval_s": 1}


def _shell(zk: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ledgerd.tools.cli", "shell", "--zk", zk,
                           *args], capture_output=True, text=True, timeout=120)


async def _scrub_status(bookie: BookieProcess) -> dict[str, object]:
    """The bookie's scrubber status once its first pass is done."""
    with trio.fail_after(EVENT_BOUND_S):
        while True:
            code, body = await admin_get(bookie.admin_port, "/status")
            if code in (200, 503):
                scrub = json.loads(body)["scrub"]
                if scrub["passes"] >= 1:
                    return dict(scrub)
            await trio.sleep(0.2)


async def test_scrubber_finds_lost_entries_and_autorecovery_brings_the_copies_back(
        bookie_factory: Factory, zk_chroot: str, tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    bookies = await start_bookies(lambda: bookie_factory(**settings), zk_chroot, 4)
    by_id = {b.bookie_id: b for b in bookies}
    async with ledgerd.open_client(zk_chroot, throttle=0) as client:
        acked: dict[int, dict[int, bytes]] = {}
        handles = []
        for quorums, n in (((3, 3, 2), 100), ((3, 2, 2), 60)):
            lh = await client.create_ledger(*quorums, password=b"pw")
            acked[lh.ledger_id] = {}
            for i in range(n):
                data = b"ledger %d entry %d " % (lh.ledger_id, i) + bytes(100)
                acked[lh.ledger_id][await lh.append(data)] = data
            await lh.close()
            handles.append(lh)
        holed, lost = (h.ledger_id for h in handles)
        victim = by_id[sorted(set(handles[0].ensemble) & set(handles[1].ensemble))[0]]
        urm = UnderreplicationManager(client.store, "/ledgers")
        await urm.set_enabled(False)  # keep the marks for a look

        victim.terminate()
        ledger_dir = Path(str(victim.settings["ledger_directories"][0]))  # type: ignore[index]
        with open(index_path(ledger_dir, holed), "r+b") as f:
            for e in range(40, 50):
                f.seek(INDEX_HEADER_SIZE + 8 * e)
                f.write(struct.pack(">q", 0))
        index_path(ledger_dir, lost).unlink()
        victim.restart()
        await wait_registered(client.store, victim)  # type: ignore[arg-type]

        scrub = await _scrub_status(victim)
        md_lost = await client.ledger_metadata(lost)
        held_lost = expected_count(expected_runs(md_lost, victim.bookie_id))
        assert held_lost > 0
        assert scrub["entries_missing"] == 10 + held_lost, scrub
        assert scrub["ledgers_marked"] == 2
        rec = await urm.get(holed)
        assert rec is not None and dict(rec.missing_entries) == {victim.bookie_id: ((40, 49),)}
        assert await urm.get(lost) is not None
        _, metrics = await admin_get(victim.admin_port, "/metrics")
        assert f"ledgerd_scrub_entries_missing_total {10 + held_lost}.0" in metrics

        # The debt, from outside: exactly the entries the scrubber found, queued.
        ran = await trio.to_thread.run_sync(_shell, zk_chroot, "durability", "--json")
        assert ran.returncode == 3, ran.stderr
        debt = json.loads(ran.stdout)
        assert debt["entries_below_qw"] == 10 + held_lost
        assert debt["short"] == sorted([holed, lost]) and debt["agrees"] is True
        assert debt["entries_single_copy"] == held_lost  # Qw 2: one copy left
        info = json.loads((await trio.to_thread.run_sync(
            _shell, zk_chroot, "clusterinfo", "--json")).stdout)
        assert info["health"] == "DEGRADED" and info["durability"]["short_ledgers"] == 2

        await urm.set_enabled(True)
        await wait_unreferenced(client.store, victim.bookie_id)
        for lid, entries in acked.items():
            assert await _copies(client, lid, entries) == [], lid
        ran = await trio.to_thread.run_sync(_shell, zk_chroot, "durability", "--json")
        assert ran.returncode == 0, ran.stdout + ran.stderr
        debt = json.loads(ran.stdout)
        assert debt["entries_below_qw"] == 0 and debt["agrees"] and debt["eta_s"] == 0
        human = (await trio.to_thread.run_sync(_shell, zk_chroot, "clusterinfo")).stdout
        assert "durability       every entry at Qw copies" in human


async def test_a_scrubber_report_in_open_ledgers_is_healed_and_never_unmarked_below_qw(
        bookie_factory: Factory, zk_chroot: str, tmp_path: Path) -> None:
    """Entries lost by a bookie in the last fragment of open ledgers whose writers are
    alive and idle: a bounded ledger (fenced and closed after the grace period, then
    copied) and an unbounded one (its fragment split off at the LAC onto a replacement,
    its writer untouched). Each mark stays until every acknowledged entry is back at Qw
    (it used to be deleted at once, with nothing copied)."""
    settings = _settings(tmp_path) | {"open_ledger_rereplication_grace_period_ms": 3000}
    bookies = await start_bookies(lambda: bookie_factory(**settings), zk_chroot, 4)
    by_id = {b.bookie_id: b for b in bookies}
    async with ledgerd.open_client(zk_chroot, throttle=0) as client:
        acked: dict[int, dict[int, bytes]] = {}
        bounded = await client.create_ledger(3, 2, 2, password=b"pw")
        unbounded = await client.create_unbounded_ledger(3, 2, 2, password=b"pw")
        for lh in (bounded, unbounded):
            acked[lh.ledger_id] = {}
            for i in range(60):
                data = b"ledger %d entry %d " % (lh.ledger_id, i) + bytes(100)
                acked[lh.ledger_id][await lh.append(data)] = data
        for lh in (bounded, unbounded):  # idle: each writer's explicit LAC is out
            await wait_lac_everywhere(lh, 59)
        victim = by_id[sorted(set(bounded.ensemble) & set(unbounded.ensemble))[0]]
        term = unbounded.metadata.term
        urm = UnderreplicationManager(client.store, "/ledgers")
        await urm.set_enabled(False)  # until both marks are there to be watched

        victim.terminate()
        ledger_dir = Path(str(victim.settings["ledger_directories"][0]))  # type: ignore[index]
        for lid in acked:
            with open(index_path(ledger_dir, lid), "r+b") as f:
                for e in range(10, 30):
                    f.seek(INDEX_HEADER_SIZE + 8 * e)
                    f.write(struct.pack(">q", 0))
        victim.restart()
        await wait_registered(client.store, victim)  # type: ignore[arg-type]
        scrub = await _scrub_status(victim)
        assert scrub["ledgers_marked"] == 2, scrub
        for lid in acked:
            rec = await urm.get(lid)
            assert rec is not None and rec.missing_entries.keys() == {victim.bookie_id}
            assert await below_qw(client, lid, acked[lid])  # the loss is real

        await urm.set_enabled(True)
        seen: set[int] = set()
        with trio.fail_after(EVENT_BOUND_S):
            while True:
                marked = {lid for lid in acked if await urm.get(lid) is not None}
                short = {lid: await below_qw(client, lid, entries)
                         for lid, entries in acked.items()}
                for lid in seen - marked:
                    assert short[lid] == [], (
                        f"ledger {lid}'s mark was deleted with {len(short[lid])} "
                        "entries below Qw")
                seen |= marked
                if seen == set(acked) and not marked and not any(short.values()):
                    break
                await trio.sleep(0.3)

        md = await client.ledger_metadata(bounded.ledger_id)
        assert md.is_closed and md.last_entry_id == 59
        assert victim.bookie_id not in md.ensembles[0][1]
        with pytest.raises((ledgerd.LedgerFencedError, ledgerd.LedgerClosedError)):
            await bounded.append(b"late")
        md = await client.ledger_metadata(unbounded.ledger_id)
        assert md.term == term and [f for f, _ in md.ensembles] == [0, 60]
        assert victim.bookie_id not in md.ensembles[0][1]
        assert md.ensembles[1][1] == unbounded.ensemble  # the writer's, the victim in it
        assert await unbounded.append(b"after") == 60  # the live writer goes on
        ran = await trio.to_thread.run_sync(_shell, zk_chroot, "durability", "--json")
        assert ran.returncode == 0, ran.stdout + ran.stderr
        assert json.loads(ran.stdout)["entries_below_qw"] == 0
