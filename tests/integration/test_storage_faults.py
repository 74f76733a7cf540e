"""Storage faults injected under the native helper in a real bookie process.

EIO from the journal's fdatasync or from an entry log's write makes the bookie
read-only with a reason that names the file and the errno (it said "Exceptions from
Trio nursery" before); what it acknowledged survives a restart, and nothing whose
group failed was acknowledged. A short journal write is completed by the helper and
changes nothing a client can see.
"""

from __future__ import annotations

from collections.abc import Callable

import trio

from ledgerd.bookie_client import open_bookie_client
from ledgerd.native.faults import FaultRule
from ledgerd.tools.bookieprocess import BookieProcess
from ledgerd.tools.faults.cluster import arm_bookie, fault_env
from ledgerd.wire.messages import AddRequest, ReadRequest
from ledgerd.wire.status import Status
from tests.appliance.harness import KEY, entry
from tests.cluster import metadata_store, wait_registered
from tests.integration.test_disk_full import _health


def add(first: int, n: int = 1, size: int = 100) -> AddRequest:
    return AddRequest(ledger_id=1, first_entry_id=first, master_key=KEY,
                      entries=tuple(entry(1, first + i, payload=b"x" * size) for i in range(n)))


async def _read_all(bookie: BookieProcess, ids: list[int]) -> list[int]:
    """The ids of ``ids`` the bookie does not return."""
    missing = []
    async with open_bookie_client(bookie.address) as c:
        for eid in ids:
            if (await c.call(ReadRequest(ledger_id=1, entry_id=eid)))[0] != Status.OK:
                missing.append(eid)
    return missing


async def test_journal_fsync_eio_goes_read_only_naming_the_file_and_loses_nothing_acked(
        bookie_factory: Callable[..., BookieProcess], zk_chroot: str) -> None:
    async with metadata_store(zk_chroot) as store:
        bookie = bookie_factory()
        bookie.start(env=fault_env(bookie))
        await wait_registered(store, bookie)
        async with open_bookie_client(bookie.address) as c:
            # A short write of every journal group: invisible to clients.
            await arm_bookie(bookie, [FaultRule("write", "journal", None, short=True,
                                                times=50)], 1)
            for first in range(0, 200, 20):
                assert (await c.call(add(first, 20, 6000)))[0] == Status.OK
            acked = list(range(200))
            await arm_bookie(bookie, [FaultRule("fsync", "journal", "EIO", times=1000)], 2)
            status, _ = await c.call(add(200))
            assert status != Status.OK
            await wait_registered(store, bookie, read_only=True)
            code, body = await _health(bookie.admin_port)
            assert code == 503
            assert "Errno 5" in body and "fdatasync" in body and "journal" in body, body
            assert "Trio nursery" not in body, body
            # Reads go on; writes are refused.
            assert (await c.call(ReadRequest(ledger_id=1, entry_id=199)))[0] == Status.OK
            assert (await c.call(add(201)))[0] != Status.OK
        with trio.fail_after(30):
            assert await trio.to_thread.run_sync(bookie.terminate) == 0
        bookie.start()   # no fault plan: the disk is "replaced"
        await wait_registered(store, bookie)
        assert await _read_all(bookie, acked) == []


async def test_entry_log_write_eio_goes_read_only_naming_the_log(
        bookie_factory: Callable[..., BookieProcess], zk_chroot: str) -> None:
    async with metadata_store(zk_chroot) as store:
        bookie = bookie_factory(flush_interval_ms=100, write_buffer_size_bytes=64 * 1024)
        bookie.start(env=fault_env(bookie))
        await wait_registered(store, bookie)
        acked: list[int] = []
        async with open_bookie_client(bookie.address) as c:
            await arm_bookie(bookie, [FaultRule("write", "entrylog", "EIO", times=1000)], 1)
            with trio.fail_after(60):
                first = 0
                while True:
                    status, _ = await c.call(add(first, 20, 4000))
                    if status != Status.OK:
                        break
                    acked.extend(range(first, first + 20))
                    first += 20
                    code, body = await _health(bookie.admin_port)
                    if code == 503:
                        break
            await wait_registered(store, bookie, read_only=True)
            code, body = await _health(bookie.admin_port)
            assert code == 503
            assert "Errno 5" in body and ".log" in body and "Trio nursery" not in body, body
        with trio.fail_after(30):
            await trio.to_thread.run_sync(bookie.terminate)
        bookie.start()
        await wait_registered(store, bookie)
        assert acked and await _read_all(bookie, acked) == []
