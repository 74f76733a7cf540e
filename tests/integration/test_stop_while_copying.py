"""A bookie stopped with SIGTERM while its replication worker copies a ledger: it stops
as any bookie does (exit 0, its log ends with ``bookie_stopped``), with no traceback.

Two bookies hold a closed ledger; a third, running autorecovery, joins; one holder is
killed -9, and the third's worker copies the ledger from the survivor to itself, one
entry per batch with 256 batches in flight. SIGTERM then closes the worker's
connections to its own bookie (copies fail) while it stops the worker (copies are
cancelled): both at once left an exception group of copy failures that no cancel scope
absorbs, and the bookie died with a nested traceback and exit 1 (6 runs of 6).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import trio

import ledgerd
from ledgerd.metadata.store import WatchKind
from ledgerd.tools.bookieprocess import BookieProcess
from tests.cluster import EVENT_BOUND_S, admin_get, metadata_store, start_bookies

Factory = Callable[..., BookieProcess]
SECRET = b"integration-cluster-secret-0123456789"


async def _entries_copied(bookie: BookieProcess) -> float:
    _, metrics = await admin_get(bookie.admin_port, "/metrics")
    for line in metrics.splitlines():
        if line.startswith("ledgerd_autorecovery_entries_copied_total"):
            return float(line.split()[-1])
    return 0.0


async def _wait_copying(zk: str, ledger_id: int, copier: BookieProcess) -> None:
    """Until a worker holds the ledger's replication lock (on a watch of its node), then
    until the copier's metrics count copied entries (no event says so: sampled)."""
    async with metadata_store(zk, init=False) as store:
        lock = f"/ledgers/underreplication/locks/urL{ledger_id:010d}"
        with trio.fail_after(EVENT_BOUND_S):
            async with store.watch(lock, WatchKind.DATA) as events:
                async for _ in events:
                    if await store.exists(lock) is not None:
                        break
            while not await _entries_copied(copier):
                await trio.sleep(0.05)


async def test_sigterm_while_the_worker_copies_exits_cleanly(
        bookie_factory: Factory, zk_chroot: str, tmp_path: Path) -> None:
    secret = tmp_path / "cluster.secret"
    secret.write_bytes(SECRET)
    os.chmod(secret, 0o600)
    plain = {"cluster_secret_file": str(secret)}
    holders = await start_bookies(lambda: bookie_factory(**plain), zk_chroot, 2)
    async with ledgerd.open_client(zk_chroot, throttle=0) as client:
        lh = await client.create_ledger(2, 2, 2, password=b"pw")
        await lh.append_many(b"%d " % i + bytes(4000) for i in range(2000))
        await lh.close()
    (copier,) = await start_bookies(lambda: bookie_factory(
        **plain, auto_recovery_daemon_enabled=True, lost_bookie_recovery_delay_s=0,
        rereplication_entry_batch_size=1, rereplication_outstanding_batches=256,
        auditor_periodic_check_interval_s=0, auditor_periodic_bookie_check_interval_s=0),
        zk_chroot, 1)
    holders[0].kill9()
    await _wait_copying(zk_chroot, lh.ledger_id, copier)

    code = copier.terminate()
    log = copier.log_path.read_text(errors="replace")
    assert code == 0, copier.log_tail(80)
    assert "Traceback" not in log and "ExceptionGroup" not in log, copier.log_tail(80)
    tail = log[log.index("event=bookie_stopping"):].splitlines()
    assert "event=bookie_stopped" in tail[-1] and "exit_code=0" in tail[-1]
    # What the stop cut short is one line, not a traceback.
    assert sum("level=ERROR" in line or "level=WARNING" in line for line in tail) <= 1, tail
