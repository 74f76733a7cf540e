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
from tests.cluster import metadata_store, wait_registered
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
