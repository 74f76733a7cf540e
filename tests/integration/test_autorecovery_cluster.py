"""Autorecovery with real bookie processes and the real ZooKeeper.

Six bookies, each running autorecovery in-process (one is elected auditor). A bookie
holding closed and open ledgers is killed with -9 while writers append; every ledger
must return to Qw copies, checked by reading every entry from every bookie that should
hold it, and no acknowledged entry may be lost. Then a second bookie dies, and the same
holds. Last, ``ledgerd shell decommissionbookie --live`` drains a running bookie.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import trio

import ledgerd
from ledgerd.client import Client
from ledgerd.handles import WriteHandle
from ledgerd.machines.checker import fragments, stored_runs
from ledgerd.metadata.cookies import CookieStore
from ledgerd.tools.bookieprocess import BookieProcess
from ledgerd.wire.entry import Digester, DigestType, decode_entry
from ledgerd.wire.messages import ReadRequest, ReadResponse
from ledgerd.wire.status import Status
from tests.cluster import metadata_store, start_bookies, wait_unreferenced

Factory = Callable[..., BookieProcess]
SECRET = b"integration-cluster-secret-0123456789"


def _settings(tmp: Path) -> dict[str, object]:
    secret = tmp / "cluster.secret"
    if not secret.exists():
        secret.write_bytes(SECRET)
        os.chmod(secret, 0o600)
    return {"cluster_secret_file": str(secret), "auto_recovery_daemon_enabled": True,
            "lost_bookie_recovery_delay_s": 0, "open_ledger_rereplication_grace_period_ms": 3000,
            "rw_rereplicate_backoff_ms": 1000, "auditor_periodic_check_interval_s": 0,
            "auditor_periodic_bookie_check_interval_s": 0}


async def _copies(client: Client, lid: int, acked: dict[int, bytes]) -> list[str]:
    """Problems: an entry missing from, or different on, a bookie that should hold it."""
    md = await client.ledger_metadata(lid)
    d = Digester(DigestType(md.digest_type))
    problems = []
    for frag in fragments(md):
        for index, bookie in enumerate(frag.ensemble):
            for a, b in stored_runs(frag.first, frag.last, md.ensemble_size, md.write_quorum,
                                    index):
                for e in range(a, b + 1):
                    status, resp, err = await client.pool.call(
                        bookie, ReadRequest(ledger_id=lid, entry_id=e), 10)
                    if status != Status.OK or not isinstance(resp, ReadResponse):
                        problems.append(f"ledger {lid} entry {e}: {bookie} answers "
                                        f"{err or Status(status).name}")
                        continue
                    entry = decode_entry(d, resp.entry, ledger_id=lid, entry_id=e)
                    if e in acked and entry.payload != acked[e]:
                        problems.append(f"ledger {lid} entry {e}: wrong bytes on {bookie}")
    return problems


class Writer:
    """Appends as fast as acknowledgements come, remembering what was acknowledged."""

    def __init__(self, lh: WriteHandle) -> None:
        self.lh = lh
        self.acked: dict[int, bytes] = {}
        self.stop = trio.Event()
        self.under_way = trio.Event()  # set after the first 20 acknowledgements

    async def run(self) -> None:
        i = 0
        while not self.stop.is_set():
            data = b"ledger %d entry %d " % (self.lh.ledger_id, i) + bytes(200)
            eid = await self.lh.append(data)
            self.acked[eid] = data
            i += 1
            if i == 20:
                self.under_way.set()


async def test_killed_bookies_are_rereplicated_under_load_and_decommission_drains(
        bookie_factory: Factory, zk_chroot: str, tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    bookies = await start_bookies(lambda: bookie_factory(**settings), zk_chroot, 6)
    by_id = {b.bookie_id: b for b in bookies}
    async with ledgerd.open_client(zk_chroot, throttle=0) as client:
        acked: dict[int, dict[int, bytes]] = {}
        for k in range(6):  # closed ledgers
            lh = await client.create_ledger(3, 2, 2, password=b"pw")
            acked[lh.ledger_id] = {}
            for i in range(100):
                data = b"closed %d %d " % (k, i) + bytes(300)
                acked[lh.ledger_id][await lh.append(data)] = data
            await lh.close()
        writers = [Writer(await client.create_ledger(3, 2, 2, password=b"pw"))
                   for _ in range(2)]
        idle = await client.create_ledger(3, 3, 2, password=b"pw")  # open, nobody writes
        acked[idle.ledger_id] = {}
        for i in range(20):
            acked[idle.ledger_id][await idle.append(b"idle %d" % i)] = b"idle %d" % i
        # The victim: a bookie in the idle ledger and in some closed ledger.
        counts: dict[str, int] = {}
        for lid in acked:
            for b in (await client.ledger_metadata(lid)).ensembles[0][1]:
                counts[b] = counts.get(b, 0) + 1
        victim = max(idle.ensemble, key=lambda b: counts.get(b, 0))
        async with trio.open_nursery() as nursery:
            for w in writers:
                nursery.start_soon(w.run)
            for w in writers:
                await w.under_way.wait()
            by_id[victim].kill9()
            await wait_unreferenced(client.store, victim)
            for w in writers:
                w.stop.set()
        for w in writers:
            await w.lh.close()
            acked[w.lh.ledger_id] = w.acked
            assert len(w.acked) > 50
        for lid, entries in acked.items():
            assert await _copies(client, lid, entries) == [], lid
        # The idle open ledger was fenced and closed with every acknowledged entry.
        md = await client.ledger_metadata(idle.ledger_id)
        assert md.is_closed and md.last_entry_id >= 19

        # A second bookie dies after re-replication: still nothing lost.
        second = next(b for b in by_id if b != victim and by_id[b].running)
        by_id[second].kill9()
        await wait_unreferenced(client.store, second)
        for lid, entries in acked.items():
            assert await _copies(client, lid, entries) == [], lid
            rh = await client.open_ledger(lid, b"pw")
            got = {e.entry_id: e.payload async for e in rh.read()}
            assert all(got.get(e) == data for e, data in entries.items()), lid

        # Decommission drains a live bookie: nothing references it, its cookie is gone.
        live = next(b for b in by_id if by_id[b].running)
        cli = subprocess.run(
            [sys.executable, "-m", "ledgerd.tools.cli", "shell", "--zk", zk_chroot,
             "decommissionbookie", live, "--live", "--conf", str(by_id[live].config_path),
             "--timeout", "120"], capture_output=True, text=True, timeout=180)
        assert cli.returncode == 0, cli.stderr
        assert f"decommissioned {live}" in cli.stdout
        async for lid in client.list_ledgers():
            md = await client.ledger_metadata(lid)
            assert all(live not in ens for _, ens in md.ensembles)
            assert await _copies(client, lid, acked.get(lid, {})) == [], lid
    async with metadata_store(zk_chroot, init=False) as store:
        assert await CookieStore(store, "/ledgers").get(live) is None
