"""`ledgerd upgrade` on a real bookie's directories and its ZooKeeper cookie: a bookie
whose cookies hold an older layout refuses to start with "upgrade needed: run ledgerd
upgrade"; the upgrade lets it start; rollback brings the old layout back; finalize
drops it."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import trio

from ledgerd.disk.cookie import LAYOUT_VERSION, Cookie, stamp_cookies
from ledgerd.metadata.cookies import CookieStore
from ledgerd.tools.bookieprocess import BookieProcess
from tests.cluster import metadata_store, start_bookies, wait_registered

Factory = Callable[..., BookieProcess]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ledgerd.tools.cli", *args],
                          capture_output=True, text=True, timeout=120)


async def test_an_older_layout_needs_ledgerd_upgrade(bookie_factory: Factory,
                                                     zk_chroot: str) -> None:
    (b,) = await start_bookies(bookie_factory, zk_chroot, 1)
    assert b.terminate() == 0
    dirs = [Path(b.settings["journal_directory"]), *map(Path, b.settings["ledger_directories"])]
    current = Cookie.from_bytes((dirs[0] / "current" / "VERSION").read_bytes(), "journal")
    old = replace(current, layout_version=LAYOUT_VERSION - 1)  # as an older ledgerd wrote it
    stamp_cookies(old, dirs)
    async with metadata_store(zk_chroot, init=False) as store:
        cookies = CookieStore(store, "/ledgers")
        got = await cookies.get(b.bookie_id)
        assert got is not None
        await cookies.update(b.bookie_id, old.to_bytes(), got[1])

        r = await trio.to_thread.run_sync(lambda: _cli("bookie", "--conf", str(b.config_path)))
        last = r.stderr.strip().splitlines()[-1]
        assert r.returncode == 1 and last.startswith(
            "ledgerd: error: bookie did not start: upgrade needed: run ledgerd upgrade"), r.stderr

        up = await trio.to_thread.run_sync(lambda: _cli("upgrade", "--conf", str(b.config_path)))
        assert up.returncode == 0, up.stderr
        assert up.stdout.startswith(f"upgraded 2 directories from layout_version "
                                    f"{LAYOUT_VERSION - 1} to {LAYOUT_VERSION}"), up.stdout
        assert all((d / "previous" / "VERSION").exists() for d in dirs)
        remote = await cookies.get(b.bookie_id)
        assert remote is not None
        assert Cookie.from_bytes(remote[0], "zk").layout_version == LAYOUT_VERSION
        b.start()
        await wait_registered(store, b)
        assert b.terminate() == 0

        back = await trio.to_thread.run_sync(
            lambda: _cli("upgrade", "--rollback", "--conf", str(b.config_path)))
        assert back.returncode == 0, back.stderr
        assert f"hold layout_version {LAYOUT_VERSION - 1} again" in back.stdout, back.stdout
        remote = await cookies.get(b.bookie_id)
        assert remote is not None
        assert Cookie.from_bytes(remote[0], "zk").layout_version == LAYOUT_VERSION - 1

        again = await trio.to_thread.run_sync(
            lambda: _cli("upgrade", "--conf", str(b.config_path)))
        assert again.returncode == 0, again.stderr
        done = await trio.to_thread.run_sync(
            lambda: _cli("upgrade", "--finalize", "--conf", str(b.config_path)))
        assert done.returncode == 0 and "finalized" in done.stdout, done.stderr
        assert not any((d / "previous").exists() for d in dirs)
        same = await trio.to_thread.run_sync(
            lambda: _cli("upgrade", "--conf", str(b.config_path)))
        assert same.returncode == 0 and "nothing to do" in same.stdout, same.stderr
