"""A real local cluster for tests: ZooKeeper and bookie processes, and waits on them.

``process_cluster(base, bookies=3)`` is the one process cluster (``ProcessCluster``,
shared with ``ledgerd local``, the fault harness and the bench scripts): a ZooKeeper of
its own (from the Debian ``zookeeper`` package) or a given one, the cluster's metadata,
and bookie processes registered writable, all stopped by PID at the end. An application
tests its own code against it as it would against a deployed cluster (docs/testing.md)::

    async with process_cluster(tmp_path, bookies=3) as cluster:
        async with ledgerd.open_client(cluster.zk) as client:
            ...

The rest waits on one thing each, on a ZooKeeper watch and never on the clock, bounded
by ``EVENT_BOUND_S`` (reaching it is a failure): ``wait_registered`` (one bookie; fails at
once with its log if the process exits first), ``wait_auditor``, ``wait_unreferenced``,
``wait_lac_everywhere``. ``fresh_chroot`` gives each test a ZooKeeper namespace of its
own on a shared server.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import trio
from kazoo.client import KazooClient

from ledgerd.base.errors import LedgerdError
from ledgerd.metadata.cluster import check_layout, init_new_cluster
from ledgerd.metadata.errors import NoNodeError
from ledgerd.metadata.ledgers import LedgerManager
from ledgerd.metadata.paths import underreplicated_path
from ledgerd.metadata.registry import BookieRegistry, BookieSet
from ledgerd.metadata.store import MetadataStore, WatchKind
from ledgerd.metadata.underreplication import AuditorElection
from ledgerd.metadata.zookeeper import ZooKeeperStore
from ledgerd.reads import lac_of_answer
from ledgerd.tools.bookieprocess import BookieProcess
from ledgerd.tools.processcluster import ClusterError, ProcessCluster, process_cluster
from ledgerd.tools.zkserver import ZooKeeperServer, find_free_port
from ledgerd.wire.messages import ReadLacRequest, ReadLacResponse
from ledgerd.wire.status import Status

__all__ = [
    "EVENT_BOUND_S",
    "BookieDied",
    "BookieProcess",
    "BookieReadOnly",
    "ClusterError",
    "ProcessCluster",
    "ZooKeeperServer",
    "admin_get",
    "find_free_port",
    "fresh_chroot",
    "metadata_store",
    "process_cluster",
    "start_bookies",
    "wait_auditor",
    "wait_lac_everywhere",
    "wait_registered",
    "wait_unreferenced",
]

# A bound for waits that end on an event; reaching it means the test failed.
EVENT_BOUND_S = 90


class BookieDied(LedgerdError, AssertionError):
    """A bookie process exited while a test waited for it (a test failure, so also an
    AssertionError)."""


class BookieReadOnly(LedgerdError, AssertionError):
    """A bookie a test waited for as writable registered read-only because its disks are
    over ``disk_usage_threshold`` (the machine's disk, not the code under test)."""


@asynccontextmanager
async def metadata_store(zk: str, *, init: bool = True) -> AsyncIterator[ZooKeeperStore]:
    store = await ZooKeeperStore.connect(zk)
    try:
        if init:
            await init_new_cluster(store, "/ledgers")
        yield store
    finally:
        await store.close()


async def wait_registered(store: ZooKeeperStore, bookie: BookieProcess, *,
                          read_only: bool | None = False, present: bool = True,
                          full_disk_fails: bool = False) -> None:
    """Wait until ``bookie`` is (or, with ``present=False``, is not) registered.

    ``read_only``: True = under available/readonly, False = writable, None = either.
    A wait for a writable bookie that ends at ``EVENT_BOUND_S`` with the bookie
    read-only for a full disk says so (``BookieReadOnly``, naming the disk); with
    ``full_disk_fails`` (a bring-up, where nobody will free space) it fails so at once.
    """
    registry = BookieRegistry(store, "/ledgers")

    async def done(snapshot: BookieSet) -> bool:
        w = bookie.bookie_id in snapshot.writable
        r = bookie.bookie_id in snapshot.read_only
        if not present:
            return not w and not r
        if full_disk_fails and read_only is False and r and not w:
            await _refuse_full_disk(registry, bookie)
        if read_only is not None:
            # Only the node of the process we started counts (a killed one's lingers
            # until its session expires), and only once its move between the lists is
            # done: ``register`` creates the new node before it removes the old one, and
            # a wait for "writable" that took the old writable node of a bookie just
            # turned read-only went on to adds refused READ_ONLY.
            return await registry.registered_as(snapshot, bookie.bookie_id, bookie.pid,
                                                read_only=read_only)
        if not (w or r):
            return False
        # A node left by a killed process lingers until its session expires: only the
        # node of the process we started counts.
        try:
            info = await registry.bookie_info(bookie.bookie_id)
        except NoNodeError:
            return False
        return bool(info.get("pid") == bookie.pid)

    async def died() -> None:
        if present and bookie.process is not None:
            # Its pidfd turns readable when it exits (no thread to outlive this wait).
            pidfd = os.pidfd_open(bookie.process.pid)
            try:
                await trio.lowlevel.wait_readable(pidfd)
            finally:
                os.close(pidfd)
            code = bookie.process.wait()
            raise BookieDied(f"{bookie.name} exited with {code} before registering:\n"
                             f"{bookie.log_tail()}")

    try:
        with trio.fail_after(EVENT_BOUND_S):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(died)
                await registry.wait_for(done)
                nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        # The verdict on the bookie, not the nursery's wrapping of it.
        matched, _ = group.split((BookieDied, BookieReadOnly))
        verdict: BaseException | None = matched
        while isinstance(verdict, BaseExceptionGroup):
            verdict = verdict.exceptions[0]
        if verdict is not None:
            raise verdict from None
        raise
    except trio.TooSlowError:
        if present and read_only is False:
            await _refuse_full_disk(registry, bookie)
        raise


async def _refuse_full_disk(registry: BookieRegistry, bookie: BookieProcess) -> None:
    listed = await registry.list_bookies()
    reason = await registry.full_disk_reason(listed, {bookie.bookie_id: bookie.pid})
    if reason is not None:
        raise BookieReadOnly(f"{bookie.name} registered read-only, not writable: {reason}. "
                             f"Free disk space on this machine (or raise "
                             f"disk_usage_threshold) and run again.")


async def start_bookies(factory: Callable[[], BookieProcess], zk: str,
                        n: int) -> list[BookieProcess]:
    """Start ``n`` bookie processes from ``factory`` and wait until all are registered."""
    bookies = [factory() for _ in range(n)]
    async with metadata_store(zk) as store:
        for b in bookies:
            b.start()
        for b in bookies:
            await wait_registered(store, b, full_disk_fails=True)
    return bookies


@contextmanager
def fresh_chroot(zookeeper: ZooKeeperServer, name: str) -> Iterator[str]:
    """Create a chroot node named after ``name``; yield ``host:port/chroot``; delete it
    with everything under it afterwards, so tests cannot see each other's nodes."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", name)[:60]
    chroot = f"/t_{name}_{uuid.uuid4().hex[:8]}"
    admin = KazooClient(hosts=zookeeper.connect_string, timeout=10)
    admin.start(timeout=30)
    try:
        admin.create(chroot)
        yield zookeeper.connect_string + chroot
        admin.delete(chroot, recursive=True)
    finally:
        admin.stop()
        admin.close()


async def wait_auditor(store: MetadataStore, auditor: str, *,
                       not_vote: str | None = None) -> str:
    """Wait, on a watch of the election, until ``auditor`` holds the winning vote (a
    vote other than ``not_vote``: re-elected); returns the vote's node name."""
    election = AuditorElection(store, "/ledgers")
    with trio.fail_after(EVENT_BOUND_S):
        async with store.watch(election.base, WatchKind.CHILDREN) as events:
            async for _ in events:
                vote = await election.current_vote()
                if vote is not None and vote[1] == auditor and vote[0] != not_vote:
                    return vote[0]
    raise AssertionError("election watch ended")


async def wait_unreferenced(store: MetadataStore, bookie: str,
                            bound: float = 2 * EVENT_BOUND_S) -> None:
    """Wait, on watches, until no ledger's metadata lists ``bookie`` and no ledger is
    queued for re-replication any more (the queue record goes after the metadata CAS)."""
    root = "/ledgers"
    ledgers = LedgerManager(store, root, await check_layout(store, root))
    ids = [lid async for lid in ledgers.iter_ledger_ids()]
    with trio.fail_after(bound):
        for lid in ids:
            async with ledgers.watch(lid) as events:
                async for _ in events:
                    try:
                        md, _ = await ledgers.read(lid)
                    except NoNodeError:
                        break
                    if all(bookie not in ens for _, ens in md.ensembles):
                        break
            record = underreplicated_path(root, lid)
            async with store.watch(record, WatchKind.DATA) as events:
                async for _ in events:
                    if await store.exists(record) is None:
                        break


async def admin_get(port: int, path: str) -> tuple[int, str]:
    """GET ``path`` from a bookie's admin HTTP port: (status, body)."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        data = b""
        while chunk := await stream.receive_some(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), body.decode()


async def wait_lac_everywhere(lh: Any, last: int) -> None:
    """Until every bookie of write handle ``lh``'s last ensemble holds a LAC of at least
    ``last`` (its explicit LAC, or the LAC inside its last entry): what a worker reads
    as an idle ledger's LAC. Each bookie is asked again after an answer below it."""
    view = lh._sync_view()  # the handle's digester and connection pool
    ensemble = view.metadata.last_ensemble[1]

    async def lac_of(bookie: str) -> int:
        status, response, _ = await view.pool.call(
            bookie, ReadLacRequest(ledger_id=lh.ledger_id), 10.0)
        if status == Status.OK and isinstance(response, ReadLacResponse):
            return lac_of_answer(view.digester, lh.ledger_id, response)
        return -1

    async def one(bookie: str) -> None:
        while await lac_of(bookie) < last:
            await trio.sleep(0.05)  # the writer's explicit LAC is due after its idle time

    with trio.fail_after(EVENT_BOUND_S):
        async with trio.open_nursery() as nursery:
            for bookie in ensemble:
                nursery.start_soon(one, bookie)
