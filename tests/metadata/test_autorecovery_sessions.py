"""The auditor and the workers survive a ZooKeeper session expiry, on the in-memory twin
and on the real ZooKeeper: their votes and locks vanish with the session, and they stand
again and resume instead of silently stopping (BookKeeper's most common complaint)."""

from __future__ import annotations

import os
from pathlib import Path

import trio

from ledgerd.appliance.autorecovery import AutoRecoveryStats, run_autorecovery
from ledgerd.appliance.config import BookieConfig
from ledgerd.metadata.cluster import init_new_cluster
from ledgerd.metadata.paths import underreplicated_path
from ledgerd.metadata.store import WatchKind
from ledgerd.metadata.underreplication import UnderreplicationManager
from tests.cluster import wait_auditor
from tests.metadata.conftest import StoreFactory

ROOT = "/ledgers"


async def test_auditor_and_workers_resume_after_session_expiry(stores: StoreFactory,
                                                               tmp_path: Path) -> None:
    admin = await stores.open()
    await init_new_cluster(admin, ROOT)
    secret = tmp_path / "secret"
    secret.write_bytes(b"s" * 32)
    os.chmod(secret, 0o600)
    cfg = BookieConfig(ledger_directories=(str(tmp_path),), cluster_secret_file=str(secret),
                       auditor_periodic_check_interval_s=0,
                       auditor_periodic_bookie_check_interval_s=0,
                       rw_rereplicate_backoff_ms=200)
    urm = UnderreplicationManager(admin, ROOT)
    store = await stores.open()
    stats = AutoRecoveryStats()

    async def queue_drains(ledger_id: int) -> None:
        # A mark for a ledger that does not exist: a worker picks it, finds it deleted
        # and drops it, so the record vanishing proves a worker is alive.
        await urm.mark_underreplicated(ledger_id, ["gone:3181"])
        record = underreplicated_path(ROOT, ledger_id)
        with trio.fail_after(30):
            async with admin.watch(record, WatchKind.DATA) as events:
                async for _ in events:
                    if await admin.exists(record) is None:
                        return

    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: run_autorecovery(
            store, cfg, "ar", stats=stats, task_status=task_status))
        vote = await wait_auditor(admin, "ar")
        await queue_drains(1001)
        await stores.expire(store)
        # The old vote went with the session; the auditor stands again (a new vote).
        await wait_auditor(admin, "ar", not_vote=vote)
        await queue_drains(1002)
        assert stats.session_restarts >= 2  # the auditor and the workers, each
        nursery.cancel_scope.cancel()
