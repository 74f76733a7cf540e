"""A bookie on a small tmpfs: filling the disk makes it read-only, freeing space brings it back."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import trio

from ledgerd.bookie_client import open_bookie_client
from tests.appliance.harness import KEY, entry
from tests.cluster import admin_get, metadata_store, wait_registered
from tools.bookieprocess import BookieProcess
from wire.messages import AddRequest, GetBookieInfoRequest, ReadRequest
from wire.status import Status


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 48 MiB tmpfs mounted for this test (the tests run as root, in CI too)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    assert done.returncode == 0, f"cannot mount a tmpfs (root needed): {done.stderr.strip()}"
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


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
        tmp_path: Path) -> None:
    # The ledger directory fills faster than the checker samples (once a minute): the
    # entry log's writes meet ENOSPC first. The bookie must say so (directory, errno),
    # keep what it acknowledged, and be writable again once space is back.
    async with metadata_store(zk_chroot) as store:
        ledgers = small_disk / "ledgers"
        bookie = bookie_factory(
            journal_directory=str(tmp_path / "journal"), ledger_directories=[str(ledgers)],
            disk_check_interval_ms=60_000, flush_interval_ms=100,
            write_buffer_size_bytes=64 * 1024,
            disk_usage_threshold=0.95, disk_usage_lwm_threshold=0.80)
        bookie.start()
        await wait_registered(store, bookie)
        payload = b"p" * 4000
        acked = []
        async with open_bookie_client(bookie.address) as c:
            ballast = _fill_completely(small_disk)
            for first in range(0, 400, 20):
                status, _ = await c.call(AddRequest(
                    ledger_id=1, first_entry_id=first, master_key=KEY,
                    entries=tuple(entry(1, first + i, payload=payload) for i in range(20))))
                if status != Status.OK:
                    break
                acked.extend(range(first, first + 20))
            await wait_registered(store, bookie, read_only=True)
            status, body = await _health(bookie.admin_port)
            assert status == 503
            assert str(ledgers) in body and "No space left on device" in body, body
            assert "Errno 28" in body and "Trio nursery" not in body, body
            assert acked  # the journal (elsewhere) took them before the bookie said so
            for eid in acked[::37]:
                assert (await c.call(ReadRequest(ledger_id=1, entry_id=eid)))[0] == Status.OK
            ballast.unlink()
            await wait_registered(store, bookie, read_only=False)
            status, _ = await c.call(add(10_000))
            assert status == Status.OK
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
