"""Disaster recovery of the metadata on a real cluster (issue 49): a snapshot taken while
clients write, the whole root deleted, bookies' GC frozen meanwhile, the snapshot
restored, the same clients going on, and a ledger created after the snapshot brought
back by `metadata rebuild` from what the bookies hold."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path

import trio

import ledgerd
from ledgerd.bookie_client import open_bookie_client
from ledgerd.ledgerlog import LogEntry, LogPosition
from ledgerd.metadata.errors import SessionExpiredError
from ledgerd.metadata.ledgers import LedgerManager
from ledgerd.metadata.registry import BookieRegistry, BookieSet
from ledgerd.testing.cluster import ProcessCluster
from ledgerd.tools.bookieprocess import BookieProcess
from ledgerd.wire.messages import LedgerHoldingsRequest, LedgerHoldingsResponse
from ledgerd.wire.status import Status
from tests.cluster import EVENT_BOUND_S, admin_get, metadata_store, start_bookies, wait_registered

Factory = Callable[..., BookieProcess]


async def _shell(zk: str, *args: str) -> tuple[int, str]:
    done = await trio.run_process(
        [sys.executable, "-m", "ledgerd.tools.cli", "shell", "--zk", zk, "metadata", *args],
        capture_stdout=True, capture_stderr=True, check=False)
    return done.returncode, (done.stdout + done.stderr).decode()


async def _gc_status(b: BookieProcess) -> dict[str, object]:
    status, body = await admin_get(b.admin_port, "/status")
    assert status == 200, body
    gc = json.loads(body)["gc"]
    assert isinstance(gc, dict)
    return gc


async def _holdings(address: str, **page: int) -> list[LedgerHoldingsResponse]:
    pages = []
    first_ledger, first_entry = page.pop("first_ledger_id", 0), 0
    async with open_bookie_client(address, connect_timeout=5) as c:
        while True:
            st, resp = await c.call(LedgerHoldingsRequest(
                first_ledger_id=first_ledger, first_entry_id=first_entry, **page))
            assert st == Status.OK and isinstance(resp, LedgerHoldingsResponse)
            pages.append(resp)
            if resp.is_last:
                return pages
            first_ledger, first_entry = resp.next_ledger_id, resp.next_entry_id


async def test_snapshot_wipe_restore_rebuild_keeps_clients_working(
        bookie_factory: Factory, zk_chroot: str, tmp_path: Path) -> None:
    bookies = await start_bookies(lambda: bookie_factory(gc_wait_time_ms=1000), zk_chroot, 3)
    snap = tmp_path / "meta.snap"
    async with ledgerd.open_client(zk_chroot, throttle=0) as client:
        closed = await client.create_ledger(3, 2, 2, password=b"pw")
        for i in range(20):
            await closed.append(b"closed-%d" % i)
        await closed.close()
        open_ = await client.create_ledger(3, 3, 2, password=b"pw")
        for i in range(10):
            await open_.append(b"open-%d" % i)
        writer = await client.logs.open_writer("events", 3, 2, 2, password=b"pw")
        for i in range(5):
            await writer.append(b"event-%d" % i)
        cursor = await client.logs.open_cursor("events", "reader")
        await cursor.commit(LogEntry(LogPosition(writer.ledger_id, 2), 2, b"event-2"))

        code, out = await _shell(zk_chroot, "snapshot", str(snap))
        assert code == 0, out
        assert "ledgers           3" in out, out

        # Created after the snapshot: only the bookies know it from now on.
        late = await client.create_ledger(3, 2, 2, password=b"pw")
        for i in range(7):
            await late.append(b"late-%d" % i)
        await late.close()

        # The bookie answers the holdings request with the late ledger striped E3/Qw2.
        seen: dict[int, set[int]] = {}
        for b in bookies:
            for page in await _holdings(b.address, max_ledgers=1, max_ranges=1):
                for r in page.ranges:
                    if r.ledger_id == late.ledger_id:
                        seen.setdefault(r.ledger_id, set()).update(
                            range(r.first_entry_id, r.last_entry_id + 1))
        assert seen[late.ledger_id] == set(range(7))

        # Disaster: the whole root goes.
        async with metadata_store(zk_chroot, init=False) as store:
            await store.delete("/ledgers", recursive=True)
        # GC runs every second on every bookie; with the metadata gone it deletes nothing.
        with trio.fail_after(EVENT_BOUND_S):
            for b in bookies:
                passes = int((await _gc_status(b))["passes"])  # type: ignore[call-overload]
                while True:
                    gc = await _gc_status(b)
                    if int(gc["passes"]) >= passes + 2:  # type: ignore[call-overload]
                        break
                    await trio.sleep(0.2)
                assert "no cluster" in str(gc["frozen"]), gc
                assert gc["ledgers_deleted"] == 0, gc

        # No fixed gap: the ledger id counter goes past the highest id a bookie holds
        # (the late ledger's; with the old fixed gap of 0 a new ledger would take its id).
        code, out = await _shell(zk_chroot, "restore", str(snap), "--id-gap", "0",
                                 "--id-margin", "1", "--json")
        assert code == 0, out
        doc = json.loads(out)
        assert doc["bookies_max_ledger_id"] == late.ledger_id, doc
        assert doc["id_counter_at_least"] == late.ledger_id + 2, doc
        assert "highest ledger id on the bookies" in doc["id_gap_reason"], doc
        code, out = await _shell(zk_chroot, "restore", str(snap))
        assert code != 0 and "not empty" in out and "--replace" in out, out

        # The bookies register again on their own; GC stays frozen (the flag).
        async with metadata_store(zk_chroot, init=False) as store:
            registry = BookieRegistry(store, "/ledgers")
            wanted = {b.bookie_id for b in bookies}

            async def all_back(listed: BookieSet) -> bool:
                return wanted <= listed.writable

            with trio.fail_after(EVENT_BOUND_S):
                await registry.wait_for(all_back)
            assert not await LedgerManager(store, "/ledgers").exists(late.ledger_id)

        # The same client: reads the closed ledger, keeps writing the open one and the
        # log, commits the cursor, creates a new ledger.
        rh = await client.open_ledger(closed.ledger_id, password=b"pw")
        assert [e.payload async for e in rh.read()] == [b"closed-%d" % i for i in range(20)]
        for i in range(10, 15):
            await open_.append(b"open-%d" % i)
        await open_.close()
        rh = await client.open_ledger(open_.ledger_id, password=b"pw")
        assert rh.last_add_confirmed == 14
        await writer.append(b"event-5")
        await cursor.commit(LogEntry(LogPosition(writer.ledger_id, 4), 4, b"event-4"))
        fresh = await client.create_ledger(3, 2, 2, password=b"pw")
        await fresh.append(b"fresh")
        await fresh.close()
        assert fresh.ledger_id not in (closed.ledger_id, open_.ledger_id, late.ledger_id)

        # The late ledger: rebuilt from the bookies, closed at its last entry.
        code, out = await _shell(zk_chroot, "rebuild", "--snapshot", str(snap))
        assert code == 0 and str(late.ledger_id) in out and "dry run" in out, out
        code, out = await _shell(zk_chroot, "rebuild", "--snapshot", str(snap), "--apply",
                                 "--json")
        assert code == 0, out
        doc = json.loads(out)
        assert doc["written"] == 1, doc
        rh = await client.open_ledger(late.ledger_id, password=b"pw")
        assert rh.is_closed and rh.last_add_confirmed == 6
        assert [e.payload async for e in rh.read()] == [b"late-%d" % i for i in range(7)]
        md = rh.metadata
        assert (md.ensemble_size, md.write_quorum) == (3, 2)

        for b in bookies:
            assert (await _gc_status(b))["ledgers_deleted"] == 0
        code, out = await _shell(zk_chroot, "gc-freeze", "--clear")
        assert code == 0 and "not frozen" in out, out
        code, out = await _shell(zk_chroot, "diff", str(snap))
        assert code == 0 and "only live" in out, out
        await writer.close()



async def test_rebuild_without_a_snapshot_brings_back_every_ledger_closed_where_it_ended(
        bookie_factory: Factory, zk_chroot: str, tmp_path: Path) -> None:
    secret = tmp_path / "cluster.secret"
    secret.write_text("s" * 64)
    secret.chmod(0o600)
    bookies = await start_bookies(lambda: bookie_factory(
        gc_wait_time_ms=1000, cluster_secret_file=str(secret)), zk_chroot, 3)
    async with ledgerd.open_client(zk_chroot, throttle=0) as client:
        striped = await client.create_ledger(3, 2, 2, password=b"pw")
        for i in range(30):
            await striped.append(b"s-%d" % i)
        await striped.close()
        full = await client.create_ledger(3, 3, 2, password=b"pw", digest="crc32")
        for i in range(5):
            await full.append(b"f-%d" % i)
        # Its writer stops without closing: the ledger ends where the bookies say.
        dangling = await client.create_ledger(3, 2, 2, password=b"pw")
        for i in range(12):
            await dangling.append(b"d-%d" % i)
        async with metadata_store(zk_chroot, init=False) as store:
            iid = (await store.get("/ledgers/INSTANCEID"))[0].decode()
            await store.delete("/ledgers", recursive=True)

    named = ",".join(b.address for b in bookies)
    code, out = await _shell(zk_chroot, "rebuild", "--bookies", named)
    assert code == 0 and "dry run" in out and "lost: log names" in out, out
    code, out = await _shell(zk_chroot, "rebuild", "--bookies", named, "--json")
    ends = {p["ledger_id"]: p["end"] for p in json.loads(out)["ledgers"]}
    assert ends == {striped.ledger_id: 29, full.ledger_id: 4, dangling.ledger_id: 11}, out
    async with metadata_store(zk_chroot, init=False) as store:
        assert await store.exists("/ledgers/LAYOUT") is None  # a dry run writes nothing
    # A bookie that does not answer: its entries would be missing from the plan.
    code, out = await _shell(zk_chroot, "rebuild", "--bookies", named + ",127.0.0.1:1",
                             "--apply")
    assert code != 0 and "127.0.0.1:1 did not answer" in out, out
    async with metadata_store(zk_chroot, init=False) as store:
        assert await store.exists("/ledgers/LAYOUT") is None
    code, out = await _shell(zk_chroot, "rebuild", "--bookies", named, "--apply",
                             "--secret-file", str(secret), "--json")
    assert code == 0, out
    doc = json.loads(out)
    assert doc["written"] == 3, out
    assert sorted(doc["closed"].values()) == ["closed at 11", "closed at 29", "closed at 4"]
    async with metadata_store(zk_chroot, init=False) as store:
        assert (await store.get("/ledgers/INSTANCEID"))[0].decode() == iid
        assert await store.exists("/ledgers/gcfreeze") is not None
        md, _ = await LedgerManager(store, "/ledgers").read(dangling.ledger_id)
        assert md.is_closed and md.last_entry_id == 11
    async with ledgerd.open_client(zk_chroot) as reader:
        for lh, prefix, n in ((striped, b"s", 30), (full, b"f", 5), (dangling, b"d", 12)):
            rh = await reader.open_ledger(lh.ledger_id, password=b"pw")
            assert rh.is_closed and rh.last_add_confirmed == n - 1, lh.ledger_id
            assert [e.payload async for e in rh.read()] == [b"%s-%d" % (prefix, i)
                                                             for i in range(n)]
        assert (await reader.ledger_metadata(full.ledger_id)).digest_type == "crc32"
    for b in bookies:
        assert (await _gc_status(b))["ledgers_deleted"] == 0


def _bookie_run(conf: Path) -> tuple[int, str]:
    done = subprocess.run([sys.executable, "-m", "ledgerd.tools.cli", "bookie", "--conf",
                           str(conf)], capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)
    return done.returncode, done.stderr


async def test_a_bookie_with_data_refuses_a_lost_or_new_cluster_and_names_restore(
        bookie_factory: Factory, zk_chroot: str, tmp_path: Path) -> None:
    (b,) = await start_bookies(bookie_factory, zk_chroot, 1)
    async with ledgerd.open_client(zk_chroot, throttle=0) as client:
        lh = await client.create_ledger(1, 1, 1, password=b"pw")
        await lh.append(b"kept")
        await lh.close()
    snap = tmp_path / "meta.snap"
    code, out = await _shell(zk_chroot, "snapshot", str(snap))
    assert code == 0, out
    assert b.terminate() == 0
    async with metadata_store(zk_chroot, init=False) as store:
        await store.delete("/ledgers", recursive=True)
    code, stderr = _bookie_run(b.config_path)
    assert code == 1 and "metadata restore" in stderr and "do not" in stderr, stderr
    async with metadata_store(zk_chroot) as store:  # an operator's initnewcluster
        code, stderr = _bookie_run(b.config_path)
        assert code == 1 and "metadata restore" in stderr and "instance" in stderr, stderr
    code, out = await _shell(zk_chroot, "restore", "--replace", str(snap))
    assert code != 0 and "--force" in out and "restore would delete all" in out, out
    code, out = await _shell(zk_chroot, "restore", "--replace", "--force", str(snap))
    assert code == 0, out
    async with metadata_store(zk_chroot, init=False) as store:
        b.start()
        await wait_registered(store, b)
    async with ledgerd.open_client(zk_chroot) as client:
        rh = await client.open_ledger(lh.ledger_id, password=b"pw")
        assert [e.payload async for e in rh.read()] == [b"kept"]


async def test_a_snapshot_restored_into_a_fresh_zookeeper_keeps_the_same_clients_going(
        tmp_path: Path) -> None:
    cluster = ProcessCluster(tmp_path, bookies=0, settings={
        "zk_timeout_ms": 4000, "journal_prealloc_mb": 4, "gc_wait_time_ms": 1000})
    try:
        zk = await trio.to_thread.run_sync(cluster.start_zookeeper)
        bookies = await start_bookies(cluster.add_bookie, zk, 3)
        snap = tmp_path / "meta.snap"
        async with ledgerd.open_client(zk, throttle=0) as client:
            closed = await client.create_ledger(3, 2, 2, password=b"pw")
            for i in range(10):
                await closed.append(b"c-%d" % i)
            await closed.close()
            open_ = await client.create_ledger(3, 2, 2, password=b"pw")
            for i in range(5):
                await open_.append(b"o-%d" % i)
            code, out = await _shell(zk, "snapshot", str(snap))
            assert code == 0, out

            # ZooKeeper comes back on an empty data directory: every session is gone.
            server = cluster.server
            assert server is not None
            await trio.to_thread.run_sync(server.stop)
            shutil.rmtree(server.data_dir / "data")
            await trio.to_thread.run_sync(server.start)
            code, out = await _shell(zk, "restore", str(snap))
            assert code == 0, out
            async with metadata_store(zk, init=False) as store:
                for b in bookies:
                    await wait_registered(store, b)

            # The client's session expired with the old server: its first call says so,
            # once; kazoo has a new session by then.
            with trio.fail_after(EVENT_BOUND_S):
                while True:
                    try:
                        rh = await client.open_ledger(closed.ledger_id, password=b"pw")
                        break
                    except SessionExpiredError:
                        await trio.sleep(0.2)
            assert [e.payload async for e in rh.read()] == [b"c-%d" % i for i in range(10)]
            for i in range(5, 8):
                await open_.append(b"o-%d" % i)
            await open_.close()
            fresh = await client.create_ledger(3, 2, 2, password=b"pw")
            await fresh.append(b"fresh")
            await fresh.close()
        async with ledgerd.open_client(zk) as reader:
            rh = await reader.open_ledger(open_.ledger_id, password=b"pw")
            assert rh.last_add_confirmed == 7
            rh = await reader.open_ledger(fresh.ledger_id, password=b"pw")
            assert [e.payload async for e in rh.read()] == [b"fresh"]
        for b in bookies:
            assert (await _gc_status(b))["ledgers_deleted"] == 0
    finally:
        await trio.to_thread.run_sync(partial(cluster.stop, graceful=False))
