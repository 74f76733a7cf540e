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
        # Two logs: "events" rolled over four ledgers, its first truncated away (offsets
        # 10.. stay); "audit" left by a writer that stopped, its last ledger open.
        writer = await client.logs.open_writer("events", 3, 2, 2, password=b"pw",
                                               roll_entries=10)
        await writer.append_many([b"e-%d" % i for i in range(35)])
        await writer.close()
        events = await client.logs.ledgers("events")
        assert len(events) == 4
        assert await client.logs.truncate("events", events[1]) == [events[0]]
        cursor = await client.logs.open_cursor("events", "reader")
        await cursor.commit(LogEntry(LogPosition(events[1], 3), 12, b"e-12"))
        audit = await client.logs.open_writer("audit", 3, 3, 2, password=b"pw",
                                              roll_entries=4)
        await audit.append_many([b"a-%d" % i for i in range(9)])
        audit_ledgers = await client.logs.ledgers("audit")
        assert len(audit_ledgers) == 3
        # The truncated ledger is deleted: bookies' GC drops it (so it cannot come back).
        with trio.fail_after(EVENT_BOUND_S):
            for b in bookies:
                while any(h.ledger_id == events[0] for page in await _holdings(b.address)
                          for h in page.ledgers):
                    await trio.sleep(0.2)
        deleted = {b.address: (await _gc_status(b))["ledgers_deleted"] for b in bookies}
        async with metadata_store(zk_chroot, init=False) as store:
            iid = (await store.get("/ledgers/INSTANCEID"))[0].decode()
            await store.delete("/ledgers", recursive=True)

    named = ",".join(b.address for b in bookies)
    code, out = await _shell(zk_chroot, "rebuild", "--bookies", named)
    assert code == 0 and "dry run" in out and "lost: cursors" in out, out
    assert f"log events: ledgers {' '.join(map(str, events[1:]))} (from position 1, " \
           "offset 10); cursors lost" in out, out
    code, out = await _shell(zk_chroot, "rebuild", "--bookies", named, "--json")
    doc = json.loads(out)
    ends = {p["ledger_id"]: p["end"] for p in doc["ledgers"]}
    assert ends == {striped.ledger_id: 29, full.ledger_id: 4, dangling.ledger_id: 11,
                    # a log's ledger: its header, then its entries
                    events[1]: 10, events[2]: 10, events[3]: 5,
                    audit_ledgers[0]: 4, audit_ledgers[1]: 4, audit_ledgers[2]: 1}, out
    assert {lg["name"]: (lg["ledgers"], lg["base"]) for lg in doc["logs"]} == {
        "events": (list(events[1:]), 10), "audit": (list(audit_ledgers), 0)}, out
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
    assert doc["written"] == 9, out
    closed = {int(k): v for k, v in doc["closed"].items()}
    assert closed == {lid: f"closed at {end}" for lid, end in ends.items()}, closed
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
        # The logs: same ledgers in order, same truncation point and offsets, every
        # acknowledged entry through the log reader; the cursor is lost (no snapshot).
        assert await reader.logs.ledgers("events") == events[1:]
        assert [e.payload async for e in reader.logs.read("events", b"pw")] == [
            b"e-%d" % i for i in range(10, 35)]
        assert await _follow(reader, "events", "start", 25) == [
            (i, b"e-%d" % i) for i in range(10, 35)]
        assert await _follow(reader, "events", 30, 5) == [(i, b"e-%d" % i)
                                                          for i in range(30, 35)]
        assert (await reader.logs.open_cursor("events", "reader")).offset is None
        assert await reader.logs.ledgers("audit") == audit_ledgers
        assert [e.payload async for e in reader.logs.read("audit", b"pw")] == [
            b"a-%d" % i for i in range(9)]
    for b in bookies:  # none since the metadata went
        assert (await _gc_status(b))["ledgers_deleted"] == deleted[b.address]


async def _follow(client: ledgerd.Client, name: str, start: int | str,
                  n: int) -> list[tuple[int, bytes]]:
    """The first ``n`` entries a log follower returns from ``start``: (offset, payload)."""
    out: list[tuple[int, bytes]] = []
    with trio.fail_after(EVENT_BOUND_S):
        async for e in client.logs.follow(name, b"pw", start=start, poll_s=0.2):  # type: ignore[arg-type]
            out.append((e.offset, e.payload))
            if len(out) == n:
                break
    return out


async def test_a_bookie_replaced_mid_ledger_is_a_fragment_with_or_without_the_snapshot(
        bookie_factory: Factory, zk_chroot: str, tmp_path: Path) -> None:
    bookies = await start_bookies(lambda: bookie_factory(gc_wait_time_ms=1000), zk_chroot, 4)
    snap = tmp_path / "meta.snap"
    async with ledgerd.open_client(zk_chroot, throttle=0) as client:
        lh = await client.create_ledger(3, 2, 2, password=b"pw")
        for i in range(20):
            await lh.append(b"x-%d" % i)
        code, out = await _shell(zk_chroot, "snapshot", str(snap))
        assert code == 0, out
        # A bookie of its ensemble dies mid-write: the writer replaces it (a fragment).
        victim = next(b for b in bookies if b.address == lh.metadata.ensembles[0][1][1])
        victim.kill9()
        for i in range(20, 40):
            await lh.append(b"x-%d" % i)
        md = await client.ledger_metadata(lh.ledger_id)
        assert len(md.ensembles) == 2 and victim.address not in md.ensembles[1][1], md
        # It comes back, holding the entries it got before: four holders for an
        # ensemble of three.
        async with metadata_store(zk_chroot, init=False) as store:
            victim.start()
            await wait_registered(store, victim)
            iid = (await store.get("/ledgers/INSTANCEID"))[0].decode()
            assert iid
            await store.delete("/ledgers", recursive=True)

    named = ",".join(b.address for b in bookies)
    code, out = await _shell(zk_chroot, "rebuild", "--bookies", named, "--json")
    assert code == 0, out
    (plan,) = [p for p in json.loads(out)["ledgers"] if p["ledger_id"] == lh.ledger_id]
    got = plan["metadata"]
    assert (got["ensemble_size"], got["write_quorum"]) == (3, 2), plan
    assert plan["end"] == 39 and len(got["ensembles"]) == 2, plan
    # The replacement starts the second fragment (the split may come a few entries
    # after the change: entries before it fit both ensembles' write sets), and every
    # entry's copies are on bookies of its write set under the rebuilt fragments (where
    # reads and recovery look), bar a copy left on the victim past its fragment.
    replacement = (set(md.ensembles[1][1]) - set(md.ensembles[0][1])).pop()
    assert replacement in got["ensembles"][1][1], plan
    assert md.ensembles[1][0] <= got["ensembles"][1][0] < md.ensembles[1][0] + 3, plan
    held: dict[str, set[int]] = {}
    for b in bookies:
        for page in await _holdings(b.address):
            for r in page.ranges:
                if r.ledger_id == lh.ledger_id:
                    held.setdefault(b.address, set()).update(
                        range(r.first_entry_id, r.last_entry_id + 1))
    for e in range(40):
        ens = [bs for first, bs in got["ensembles"] if first <= e][-1]
        holders = {b for b, ids in held.items() if e in ids}
        write_set = {ens[(e + i) % 3] for i in range(2)}
        assert holders - {victim.address} <= write_set and holders & write_set, (e, plan)

    # Restored from the snapshot the ledger is OPEN with one fragment; rebuild --snapshot
    # gives it the fragment the bookies show since.
    code, out = await _shell(zk_chroot, "restore", str(snap))
    assert code == 0, out
    code, out = await _shell(zk_chroot, "rebuild", "--snapshot", str(snap), "--bookies",
                             named, "--apply", "--json")
    assert code == 0, out
    doc = json.loads(out)
    assert [(p["ledger_id"], p.get("update")) for p in doc["ledgers"]] == [
        (lh.ledger_id, True)], doc
    async with ledgerd.open_client(zk_chroot) as reader:
        rebuilt = await reader.ledger_metadata(lh.ledger_id)
        assert [set(ens) for _, ens in rebuilt.ensembles] == [set(ens) for _, ens in
                                                              md.ensembles]
        rh = await reader.open_ledger(lh.ledger_id, password=b"pw")
        assert rh.is_closed and rh.last_add_confirmed == 39
        assert [e.payload async for e in rh.read()] == [b"x-%d" % i for i in range(40)]


def _bookie_run(conf: Path) -> tuple[int, str]:
    done = subprocess.run([sys.executable, "-m", "ledgerd.tools.cli", "bookie", "--conf",
                           str(conf)], capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)
    return done.returncode, done.stderr


async def test_a_bookie_with_data_refuses_a_lost_or_new_cluster_and_names_restore(
        bookie_factory: Factory, zk_chroot: str, tmp_path: Path) -> None:
    """A bookie restarted while its cluster's metadata is gone starts without it: it
    serves its holdings (for a rebuild), writes nothing to ZooKeeper (the root stays
    gone for the restore) and says what brings the metadata back. Under a root
    re-initialised as another cluster it refuses to start. After the restore it joins."""
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
    b.start_ready(timeout=EVENT_BOUND_S)
    log = b.log_tail(200)
    assert "cluster_metadata_missing" in log and "metadata restore" in log, log
    assert "do not run initnewcluster or format" in log, log
    [held] = await _holdings(b.address)
    assert [h.ledger_id for h in held.ledgers] == [lh.ledger_id], held
    async with metadata_store(zk_chroot, init=False) as store:
        assert await store.exists("/ledgers") is None  # nothing written back
    code, out = await _shell(zk_chroot, "restore", str(snap))
    assert code == 0, out
    async with metadata_store(zk_chroot, init=False) as store:
        await wait_registered(store, b)  # the running bookie joined
    async with ledgerd.open_client(zk_chroot) as client:
        rh = await client.open_ledger(lh.ledger_id, password=b"pw")
        assert [e.payload async for e in rh.read()] == [b"kept"]
    assert b.terminate() == 0
    async with metadata_store(zk_chroot, init=False) as store:
        await store.delete("/ledgers", recursive=True)
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
