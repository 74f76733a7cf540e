"""The faults the harness injects, one kind per round, each chosen and aimed by the seed.

``KINDS`` names them (each a point of ``ledgerd.base.faultpoints``); ``inject`` starts
one, holds it for ``hold_s`` and undoes what can be undone in place (links heal, paused
processes resume, killed bookies restart).
Storage faults are left armed: ``FaultCluster.heal`` disarms them and restarts the
bookie, as an operator would after a disk error.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import trio

from ledgerd.base.faultpoints import HARNESS_FAULTS, STORAGE_FAULTS
from ledgerd.tools.faults.cluster import ZK_TIMEOUT_MS, FaultCluster
from ledgerd.tools.faults.history import History

__all__ = ["KINDS", "inject"]

# The kinds, in the one registry of fault points (ledgerd.base.faultpoints).
STORAGE = {name: list(rules) for name, rules in STORAGE_FAULTS.items()}
KINDS = (*HARNESS_FAULTS, *STORAGE_FAULTS)


async def inject(kind: str, cluster: FaultCluster, rng: random.Random, history: History,
                 now: Callable[[], float], hold_s: float, writer: str = "writer") -> None:
    """Inject ``kind`` aimed by ``rng``; record it (and its undoing) in ``history``."""
    n = len(cluster.bookies)
    i = rng.randrange(n)
    expire_s = ZK_TIMEOUT_MS / 1000 + 2.0

    def note(op: str, detail: str) -> None:
        history.record(now(), "nemesis", "info", op, detail=f"{kind}: {detail}")

    if kind == "partition-client-bookie":
        links = cluster.links_to_bookie(i)
        note("fault", f"clients cut from b{i}")
        for link in links:
            link.partition()
        await trio.sleep(hold_s)
        for link in links:
            link.heal()
    elif kind in ("partition-bookie-zk", "bookie-session-expiry"):
        hold = hold_s if kind == "partition-bookie-zk" else max(hold_s, expire_s)
        note("fault", f"b{i} cut from ZooKeeper for {hold:.1f}s")
        cluster.bookie_zk[i].partition()
        await trio.sleep(hold)
        cluster.bookie_zk[i].heal()
    elif kind in ("partition-client-zk", "writer-session-expiry"):
        hold = min(hold_s, 1.5) if kind == "partition-client-zk" else max(hold_s, expire_s)
        note("fault", f"{writer} cut from ZooKeeper for {hold:.1f}s")
        cluster.client_zk[writer].partition()
        await trio.sleep(hold)
        cluster.client_zk[writer].heal()
    elif kind == "split-minority":
        minority = rng.sample(range(n), (n - 1) // 2)
        links = [cluster.bookie_zk[j] for j in minority]
        links += [link for j in minority for link in cluster.links_to_bookie(j)]
        note("fault", f"minority {[f'b{j}' for j in minority]} cut from everyone")
        for link in links:
            link.partition()
        await trio.sleep(hold_s)
        for link in links:
            link.heal()
    elif kind == "slow-bookie":
        links = cluster.links_to_bookie(i)
        note("fault", f"b{i} slowed: 50 ms, 256 KiB/s")
        for link in links:
            link.slow(0.05, 256 * 1024)
        await trio.sleep(hold_s)
        for link in links:
            link.heal()
    elif kind == "reset-mid-frame":
        note("fault", f"connections to b{i} reset mid-frame, 3 times")
        for _ in range(3):
            for link in cluster.links_to_bookie(i):
                link.reset_connections()
            await trio.sleep(hold_s / 3)
    elif kind == "pause-bookie":
        note("fault", f"b{i} SIGSTOP for {hold_s:.1f}s")
        cluster.pause(i)
        await trio.sleep(hold_s)
        cluster.resume(i)
    elif kind == "kill-bookie":
        note("fault", f"b{i} SIGKILL, restarted after {hold_s:.1f}s")
        await cluster.kill(i)
        await trio.sleep(hold_s)
        await cluster.restart(i)
    elif kind == "zookeeper-restart":
        note("fault", f"ZooKeeper stopped for {hold_s:.1f}s")
        await cluster.restart_zookeeper(hold_s)
    elif kind in STORAGE:
        note("fault", f"b{i} storage: {[r.to_json() for r in STORAGE[kind]]}")
        await cluster.arm_storage(i, STORAGE[kind])
        await trio.sleep(hold_s)
    else:
        raise ValueError(f"unknown fault kind {kind!r}; known: {', '.join(KINDS)}")
    note("heal", "undone")
