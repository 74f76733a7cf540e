"""A bookie on a small tmpfs: filling the disk makes it read-only, freeing space brings it back."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from ledgerd.bookie_client import open_bookie_client
from ledgerd.tools.bookieprocess import BookieProcess
from ledgerd.wire.messages import AddRequest, GetBookieInfoRequest, ReadRequest
from ledgerd.wire.status import Status
from tests.appliance.harness import KEY, entry
from tests.cluster import EVENT_BOUND_S, admin_get, metadata_store, wait_registered


def _tmpfs(mount: Path, size: str) -> Iterator[Path]:
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    assert done.returncode == 0, f"cannot mount a tmpfs (root needed): {done.stderr.strip()}"
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 48 MiB tmpfs mounted for this test (the tests run as root, in CI too)."""
    yield from _tmpfs(tmp_path / "disk", "48m")


@pytest.fixture
def journal_disk(tmp_path: Path) -> Iterator[Path]:
    """A roomy tmpfs for a journal that must stay writable: on the host's own disk the
    verdict would follow how full that disk happens to be (past the 80% low-water mark,
    the bookie rightly stayed read-only after the ledger disk had space again)."""
    yield from _tmpfs(tmp_path / "journal-disk", "256m")


def _fill_to(path: Path, fraction: float) -> Path:
    usage = shutil.disk_usage(path)
    want = int(usage.total * fraction) - (usage.total - usage.free)
    ballast = path / "ballast"
    with open(ballast, "wb") as f:
        chunk = b"\xab" * (1 << 20)
        while want > 0:
            f.write(chunk[: min(want, len(chunk))])
            want -= len(chunk)
        f.flush()
        os.fsync(f.fileno())
    return ballast


def add(first: int) -> AddRequest:
    return AddRequest(ledger_id=1, first_entry_id=first, master_key=KEY, entries=(entry(1, first),))


async def test_full_disk_goes_read_only_and_back(
        bookie_factory: Callable[..., BookieProcess], zk_chroot: str, small_disk: Path) -> None:
    async with metadata_store(zk_chroot) as store:
        bookie = bookie_factory(
            journal_directory=str(small_disk / "journal"),
            ledger_directories=[str(small_disk / "ledgers")],
            journal_prealloc_mb=1, journal_max_size_mb=4, disk_check_interval_ms=100,
            disk_usage_threshold=0.90, disk_usage_lwm_threshold=0.80)
        bookie.start()
        await wait_registered(store, bookie)
        async with open_bookie_client(bookie.address) as c:
            assert (await c.call(add(0)))[0] == Status.OK

            ballast = _fill_to(small_disk, 0.95)
            await wait_registered(store, bookie, read_only=True)
            assert (await c.call(add(1)))[0] == Status.READ_ONLY
            assert (await c.call(ReadRequest(ledger_id=1, entry_id=0)))[0] == Status.OK
            status, info = await c.call(GetBookieInfoRequest())
            assert status == Status.OK and info.is_read_only  # type: ignore[union-attr]

            ballast.unlink()
            await wait_registered(store, bookie, read_only=False)
            assert (await c.call(add(1)))[0] == Status.OK
        assert await trio.to_thread.run_sync(bookie.terminate) == 0


async def test_full_disk_stops_the_bookie_when_read_only_mode_is_off(
        bookie_factory: Callable[..., BookieProcess], zk_chroot: str, small_disk: Path) -> None:
    """read_only_mode_enabled = false (BookKeeper's readOnlyModeEnabled=false): a full
    disk shuts the bookie down, exit status 1, saying why, instead of going read-only;
    what it acknowledged is still there when it comes back with room."""
    async with metadata_store(zk_chroot) as store:
        bookie = bookie_factory(
            journal_directory=str(small_disk / "journal"),
            ledger_directories=[str(small_disk / "ledgers")], read_only_mode_enabled=False,
            journal_prealloc_mb=1, journal_max_size_mb=4, disk_check_interval_ms=100,
            disk_usage_threshold=0.90, disk_usage_lwm_threshold=0.80)
        bookie.start()
        await wait_registered(store, bookie)
        async with open_bookie_client(bookie.address) as c:
            assert (await c.call(add(0)))[0] == Status.OK
        ballast = _fill_to(small_disk, 0.95)
        with trio.fail_after(EVENT_BOUND_S):
            code = await bookie.exited()
        assert code == 1 and bookie.wait(1) == 1, bookie.log_tail()
        log = bookie.log_path.read_text()
        assert "event=disk_full_and_read_only_disabled" in log, bookie.log_tail()
        assert "event=bookie_read_only " not in log
        ballast.unlink()
        bookie.start()
        await wait_registered(store, bookie)
        async with open_bookie_client(bookie.address) as c:
            assert (await c.call(ReadRequest(ledger_id=1, entry_id=0)))[0] == Status.OK
        assert await trio.to_thread.run_sync(bookie.terminate) == 0


def _fill_completely(path: Path) -> Path:
    """Write until the filesystem says ENOSPC."""
    ballast = path / "ballast-all"
    with open(ballast, "wb") as f:
        chunk = b"\xcd" * (1 << 20)
        try:
            while True:
                f.write(chunk)
                f.flush()
        except OSError:
            pass
    return ballast


async def test_enospc_from_a_ledger_directory_goes_read_only_and_back(
        bookie_factory: Callable[..., BookieProcess], zk_chroot: str, small_disk: Path,
        journal_disk: Path) -> None:
    # The ledger directory fills faster than the checker samples (once a minute): the
    # entry log's writes meet ENOSPC first. The bookie must say so (directory, errno),
    # keep what it acknowledged, and be writable again once space is back.
    async with metadata_store(zk_chroot) as store:
        ledgers = small_disk / "ledgers"
        bookie = bookie_factory(
            journal_directory=str(journal_disk / "journal"), ledger_directories=[str(ledgers)],
            disk_check_interval_ms=60_000, flush_interval_ms=100,
            write_buffer_size_bytes=64 * 1024,
            disk_usage_threshold=0.95, disk_usage_lwm_threshold=0.80)
        bookie.start()
        await wait_registered(store, bookie)
        payload = b"p" * 4000

        def batch(first: int) -> AddRequest:
            return AddRequest(ledger_id=1, first_entry_id=first, master_key=KEY,
                              entries=tuple(entry(1, first + i, payload=payload)
                                            for i in range(20)))
        async with open_bookie_client(bookie.address) as c:
            # One batch before the disk fills: a checkpoint every 100 ms may meet ENOSPC
            # (and turn the bookie read-only) before any add sent after the fill.
            assert (await c.call(batch(0)))[0] == Status.OK
            acked = list(range(20))
            ballast = _fill_completely(small_disk)
            for first in range(20, 400, 20):
                status, _ = await c.call(batch(first))
                if status != Status.OK:
                    break
                acked.extend(range(first, first + 20))
            await wait_registered(store, bookie, read_only=True)
            status, body = await _health(bookie.admin_port)
            assert status == 503
            assert str(ledgers) in body and "No space left on device" in body, body
            assert "Errno 28" in body and "Trio nursery" not in body, body
            for eid in acked[::37]:
                assert (await c.call(ReadRequest(ledger_id=1, entry_id=eid)))[0] == Status.OK
            ballast.unlink()
            await wait_registered(store, bookie, read_only=False)
            status, _ = await c.call(add(10_000))
            assert status == Status.OK, (status, await _health(bookie.admin_port),
                                         bookie.log_tail())
        assert await trio.to_thread.run_sync(bookie.terminate) == 0
        # Every acknowledged entry survived, in the entry logs written after the space
        # came back or replayed from the journal.
        bookie.start()
        await wait_registered(store, bookie)
        async with open_bookie_client(bookie.address) as c:
            for eid in acked:
                status, _ = await c.call(ReadRequest(ledger_id=1, entry_id=eid))
                assert status == Status.OK, eid
        assert await trio.to_thread.run_sync(bookie.terminate) == 0
        assert "Traceback" not in bookie.log_path.read_text(), bookie.log_tail()


async def _health(port: int) -> tuple[int, str]:
    return await admin_get(port, "/health")


async def test_disk_filling_up_mid_compaction_stops_it_cleanly(
        bookie_factory: Callable[..., BookieProcess], zk_chroot: str, small_disk: Path,
        journal_disk: Path) -> None:
    """A compaction with no room to copy into: the pass stops and says why, the bookie
    stays up (read-only), every kept entry reads back; with room again the next pass
    finishes the job."""
    from ledgerd.metadata.ledger import LedgerMetadata
    from ledgerd.metadata.ledgers import LedgerManager
    from ledgerd.wire.messages import AdminKind
    from tests.integration.test_compaction_crash import _shell, gc_pass

    async with metadata_store(zk_chroot) as store:
        ledgers_dir = small_disk / "ledgers"
        bookie = bookie_factory(
            journal_directory=str(journal_disk / "journal"),
            ledger_directories=[str(ledgers_dir)],
            log_size_limit=256 * 1024, write_buffer_size_bytes=64 * 1024,
            disk_check_interval_ms=200, flush_interval_ms=60_000,
            gc_wait_time_ms=3_600_000, minor_compaction_interval_s=0,
            major_compaction_interval_s=0, major_compaction_threshold=0.9,
            minor_compaction_threshold=0.6,
            compaction_rate=1_000_000, compaction_max_outstanding_requests=200,
            disk_usage_threshold=0.99, disk_usage_lwm_threshold=0.98)
        manager = LedgerManager(store, "/ledgers")
        md = LedgerMetadata(ensemble_size=1, write_quorum=1, ack_quorum=1,
                            ensembles=((0, (bookie.bookie_id,)),))
        kept, dropped = [(await manager.create(md))[0] for _ in range(2)]
        bookie.start()
        await wait_registered(store, bookie)
        payload = b"q" * 3000
        async with open_bookie_client(bookie.address) as c:
            for first in range(0, 2000, 20):
                for lid in (kept, dropped):
                    status, _ = await c.call(AddRequest(
                        ledger_id=lid, first_entry_id=first, master_key=KEY,
                        entries=tuple(entry(lid, first + i, payload=payload) for i in range(20))))
                    assert status == Status.OK
        # A clean restart checkpoints: every log rolled so far is durable, a candidate.
        assert await trio.to_thread.run_sync(bookie.terminate) == 0
        bookie.start()
        await wait_registered(store, bookie)
        await manager.delete(dropped)
        # GC deletes a ledger that two passes in a row find missing: this one suspects it.
        first = await gc_pass(bookie, AdminKind.GC)
        assert first is not None and first["ledgers_deleted"] == 0, first
        ballast = _fill_completely(small_disk)
        await wait_registered(store, bookie, read_only=True)
        # A full disk suspends major compaction; a forced minor one still runs (as
        # BookKeeper's forced GC with no space) and meets ENOSPC copying.
        code, out, err = await _shell("gc", "--bookie", bookie.address, "--minor", "--wait",
                                      "--json")
        assert code == 0, err
        first_pass = json.loads(out)
        assert "full" in first_pass["stopped"], json.dumps(first_pass)
        assert first_pass["ledgers_deleted"] == 1
        assert bookie.running
        async with open_bookie_client(bookie.address) as c:
            for eid in range(0, 2000, 7):
                status, resp = await c.call(ReadRequest(ledger_id=kept, entry_id=eid))
                assert status == Status.OK, (eid, Status(status).name)
                assert resp.entry == entry(kept, eid, payload=payload)  # type: ignore[union-attr]
        ballast.unlink()
        await wait_registered(store, bookie, read_only=False)
        code, out, err = await _shell("gc", "--bookie", bookie.address, "--major", "--wait",
                                      "--json")
        assert code == 0, err
        second = json.loads(out)
        assert second["stopped"] == "" and second["logs_compacted"] > 0, json.dumps(second)
        async with open_bookie_client(bookie.address) as c:
            for eid in range(2000):
                status, resp = await c.call(ReadRequest(ledger_id=kept, entry_id=eid))
                assert status == Status.OK, (eid, Status(status).name)
                assert resp.entry == entry(kept, eid, payload=payload)  # type: ignore[union-attr]
        assert await trio.to_thread.run_sync(bookie.terminate) == 0
        assert "Traceback" not in bookie.log_path.read_text(), bookie.log_tail()


@pytest.fixture
def two_small_disks(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    mounts = []
    for name in ("d1", "d2"):
        m = tmp_path / name
        m.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(m)],
                              capture_output=True, text=True)
        assert done.returncode == 0, f"cannot mount a tmpfs (root needed): {done.stderr.strip()}"
        mounts.append(m)
    try:
        yield mounts[0], mounts[1]
    finally:
        for m in mounts:
            subprocess.run(["umount", "-l", str(m)], check=False)


async def _disk_status(bookie: BookieProcess, until: Callable[[dict[str, Any]], bool]) -> None:
    """Poll the bookie's /status until ``until(status["disk"])`` (bounded)."""
    with trio.fail_after(EVENT_BOUND_S):
        while True:
            code, body = await admin_get(bookie.admin_port, "/status")
            if code == 200 and until(json.loads(body)["disk"]):
                return
            await trio.sleep(0.05)


def _logs(d: Path) -> set[str]:
    return {p.name for p in (d / "ledgers" / "current").glob("*.log")}


async def test_several_ledger_directories_fill_and_fail_one_at_a_time(
        bookie_factory: Callable[..., BookieProcess], zk_chroot: str,
        two_small_disks: tuple[Path, Path], journal_disk: Path) -> None:
    """New entry logs skip a full directory; the bookie turns read-only only when every
    ledger directory is full, writable again when one has room; a directory whose disk
    fails (remounted read-only) is taken out of service: no new logs or index files go
    there, and what it holds still reads."""
    d1, d2 = two_small_disks
    async with metadata_store(zk_chroot) as store:
        bookie = bookie_factory(
            journal_directory=str(journal_disk / "journal"),
            ledger_directories=[str(d1 / "ledgers"), str(d2 / "ledgers")],
            log_size_limit=128 * 1024, write_buffer_size_bytes=16 * 1024, flush_interval_ms=200,
            disk_check_interval_ms=100, disk_usage_threshold=0.90, disk_usage_lwm_threshold=0.80)
        bookie.start()
        await wait_registered(store, bookie)
        payload = b"m" * 2000
        next_id = 0
        async with open_bookie_client(bookie.address) as c:

            async def write(n: int) -> None:
                nonlocal next_id
                for _ in range(n):
                    st, _ = await c.call(AddRequest(
                        ledger_id=2, first_entry_id=next_id, master_key=KEY,
                        entries=(entry(2, next_id, payload=payload),)))
                    assert st == Status.OK, Status(st).name
                    next_id += 1

            await write(200)
            ballast1 = _fill_to(d1, 0.95)
            await _disk_status(bookie, lambda d: any("d1" in p for p in d["full_dirs"]))
            before1, before2 = _logs(d1), _logs(d2)
            await write(400)  # several logs' worth, all of them on d2
            assert not _logs(d1) - before1 and len(_logs(d2) - before2) >= 3
            ballast2 = _fill_to(d2, 0.95)
            await wait_registered(store, bookie, read_only=True)
            st, _ = await c.call(add(10**6))
            assert st == Status.READ_ONLY
            ballast1.unlink()
            await wait_registered(store, bookie, read_only=False)
            before1 = _logs(d1)
            await write(200)
            assert len(_logs(d1) - before1) >= 1

            ballast2.unlink()
            # The remount succeeds once no log on d2 is open for writing (the next
            # checkpoint syncs and closes the last one).
            with trio.fail_after(EVENT_BOUND_S):
                while subprocess.run(["mount", "-o", "remount,ro", str(d2)],
                                     capture_output=True).returncode != 0:
                    await trio.sleep(0.05)
            try:
                await _disk_status(bookie, lambda d: any("d2" in p for p in d["failed_dirs"]))
                _code, body = await admin_get(bookie.admin_port, "/status")
                assert json.loads(body)["state"] == "writable"
                before1, before2 = _logs(d1), _logs(d2)
                await write(300)
                assert not _logs(d2) - before2 and len(_logs(d1) - before1) >= 2
                for eid in range(0, next_id, 13):  # the failed disk still reads
                    st, _ = await c.call(ReadRequest(ledger_id=2, entry_id=eid))
                    assert st == Status.OK, (eid, Status(st).name)
                # A new ledger whose index would go to d2 by its id goes to d1.
                st, _ = await c.call(AddRequest(ledger_id=3, first_entry_id=0, master_key=KEY,
                                                entries=(entry(3, 0),)))
                assert st == Status.OK
            finally:
                subprocess.run(["mount", "-o", "remount,rw", str(d2)], check=False)
            log = bookie.log_path.read_text()
            assert "directory_out_of_service" in log and "Read-only file system" in log
        assert await trio.to_thread.run_sync(bookie.terminate) == 0
        assert (d1 / "ledgers" / "current" / "00" / "03" / "3.idx").exists()
        assert "critical_service_failed" not in bookie.log_path.read_text()
