"""A bookie that cannot start says why in one line and exits non-zero (issue #19).

Each case runs the real `ledgerd bookie` and reads its whole stderr: the bookie's log
lines (``ts=...``) may precede the error, but no traceback, no kazoo chatter, and
exactly one other line, the error, naming the cause. A bookie that failed to bind has
registered nothing in ZooKeeper, its cookie included.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

import ledgerd
from ledgerd.disk.cookie import Cookie
from ledgerd.metadata.cookies import CookieStore
from ledgerd.tools.bookieprocess import BookieProcess
from ledgerd.tools.zkserver import ZooKeeperServer, find_free_port
from tests.cluster import metadata_store, wait_registered

if TYPE_CHECKING:
    from ledgerd.appliance.config import BookieConfig


def _run(conf: Path, timeout: float = 60) -> tuple[int, str, float]:
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "ledgerd.tools.cli", "bookie", "--conf", str(conf)],
                          capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)
    return done.returncode, done.stderr, time.monotonic() - t0


def _the_error(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    assert "kazoo.client" not in stderr and "Connection dropped" not in stderr, stderr
    others = [line for line in stderr.splitlines() if line and not line.startswith("ts=")]
    assert len(others) == 1, stderr
    return others[0]


def test_zookeeper_unreachable_within_zk_timeout(tmp_path: Path) -> None:
    b = BookieProcess(tmp_path / "b", f"127.0.0.1:{find_free_port()}",
                      settings={"zk_timeout_ms": 1500})
    code, stderr, took = _run(b.config_path)
    line = _the_error(stderr)
    assert code == 1 and took < 20, (code, took)
    assert line.startswith("ledgerd: error: bookie did not start: metadata service "
                           "unavailable"), line
    assert "no session within 1.5s" in line, line


def test_bad_config_and_unusable_directory(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('bookie_port = "three"\n')
    code, stderr, _ = _run(bad)
    line = _the_error(stderr)
    assert code == 2 and "bookie_port" in line and "three" in line, line

    (tmp_path / "afile").write_text("not a directory")
    b = BookieProcess(tmp_path / "b", "", settings={
        "ledger_directories": [str(tmp_path / "afile")]})
    code, stderr, _ = _run(b.config_path)
    line = _the_error(stderr)
    assert code == 1 and "afile" in line, line


async def test_cookie_mismatch_is_one_line_and_expansion_takes_a_new_dir(
        bookie_factory: Callable[..., BookieProcess], zk_chroot: str, tmp_path: Path) -> None:
    async with metadata_store(zk_chroot) as store:
        b = bookie_factory()
        b.start()
        await wait_registered(store, b)
        async with ledgerd.open_client(zk_chroot, throttle=0) as client:
            lh = await client.create_ledger(1, 1, 1, password=b"pw")
            for i in range(50):
                await lh.append(b"before %d" % i)
            await lh.close()
        assert b.terminate() == 0
        old_dir = b.settings["ledger_directories"][0]
        new_dir = str(tmp_path / "another")
        b.settings["ledger_directories"] = [old_dir, new_dir]
        b.write_config()
        code, stderr, _ = _run(b.config_path)
        line = _the_error(stderr)
        assert code == 1 and "cookie" in line and "ledger_dirs" in line, line
        assert "set allow_storage_expansion = true" in line, line
        assert "AssertionError" not in stderr

        # BookKeeper's allowStorageExpansion: the new empty directory is taken, the
        # cookies (disk and ZooKeeper) name both, and the old data is still served.
        b.settings["allow_storage_expansion"] = True
        b.write_config()
        b.start()
        await wait_registered(store, b)
        got = await CookieStore(store).get(b.bookie_id)
        assert got is not None
        assert Cookie.from_bytes(got[0], "zk").ledger_dirs == (old_dir, new_dir)
        assert Cookie.from_bytes((Path(new_dir) / "current/VERSION").read_bytes(),
                                 "new").ledger_dirs == (old_dir, new_dir)
        async with ledgerd.open_client(zk_chroot, throttle=0) as client:
            rh = await client.open_ledger(lh.ledger_id, password=b"pw")
            assert [e.payload async for e in rh.read()] == [b"before %d" % i for i in range(50)]
        assert b.terminate() == 0

        # Removing a directory is still refused, expansion or not.
        b.settings["ledger_directories"] = [new_dir]
        b.write_config()
        code, stderr, _ = _run(b.config_path)
        line = _the_error(stderr)
        assert code == 1 and "ledger_dirs" in line and "allow_storage_expansion" not in line


async def test_port_in_use_registers_nothing(bookie_factory: Callable[..., BookieProcess],
                                             zk_chroot: str) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        async with metadata_store(zk_chroot) as store:
            b = bookie_factory()
            b.settings["bookie_port"] = port
            b.write_config()
            code, stderr, _ = _run(b.config_path)
            line = _the_error(stderr)
            assert code == 1 and line == (f"ledgerd: error: bookie did not start: [Errno 98] "
                                          f"cannot listen on 127.0.0.1:{port}: Address already "
                                          "in use")
            assert await CookieStore(store, "/ledgers").get(f"127.0.0.1:{port}") is None
            assert not (Path(b.settings["journal_directory"]) / "current").exists()


async def test_json_logs_are_one_object_a_line(
        bookie_factory: Callable[..., BookieProcess], zk_chroot: str) -> None:
    """``log_format = "json"``: every log line of a real bookie, from start to a
    graceful stop, is one JSON object with ts, level, logger and event."""
    import json

    b = bookie_factory(log_format="json")
    async with metadata_store(zk_chroot) as store:
        b.start()
        await wait_registered(store, b)
    assert b.terminate() == 0
    lines = [line for line in b.log_path.read_text().splitlines() if line]
    records = [json.loads(line) for line in lines]
    assert all({"ts", "level", "logger", "event"} <= set(r) for r in records)
    events = [r["event"] for r in records]
    assert "listening" in events and "bookie_stopping" in events, events


def _timed_terminate(b: BookieProcess) -> tuple[int, float]:
    """SIGTERM; the exit status and the seconds it took (killed if it did not exit)."""
    t0 = time.monotonic()
    try:
        return b.terminate(timeout=60), time.monotonic() - t0
    finally:
        if b.running:
            b.kill9()


def test_sigterm_with_zookeeper_gone_stops_promptly(tmp_path: Path) -> None:
    """ZooKeeper down, then SIGTERM (systemctl stop): the bookie checkpoints and exits 0
    at once instead of waiting out the ZooKeeper client's retries to unregister (its
    registration is ephemeral: it goes when the session expires)."""
    zk = ZooKeeperServer(tmp_path / "zk")
    zk.start()
    b = BookieProcess(tmp_path / "b", zk.connect_string, settings={"zk_timeout_ms": 6000})
    try:
        done = subprocess.run([sys.executable, "-m", "ledgerd.tools.cli", "shell", "--zk",
                               zk.connect_string, "initnewcluster"], capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        # READY=1, not the registration: that is written part way through the start-up,
        # and a ZooKeeper gone before the rest is a stop during start-up (the next test).
        b.start_ready()
    finally:
        zk.stop()
    code, took = _timed_terminate(b)
    assert code == 0 and took < 5, (code, took, b.log_tail())
    log = (b.base / "bookie.log").read_text()
    assert "event=unregister_skipped" in log and "event=bookie_stopped" in log


def test_sigterm_during_start_up_stops_promptly(
        bookie_factory: Callable[..., BookieProcess], zk_chroot: str) -> None:
    """SIGTERM while the start-up waits on ZooKeeper (here: its id still registered by
    another live session, which it waits out for 30 s before giving up with exit 1):
    the start-up is cut short, what started is stopped as on any stop, exit 0."""
    b = bookie_factory()

    async def hold_the_id(held: trio.Event, done: trio.Event) -> None:
        async with metadata_store(zk_chroot) as store:
            await store.create(f"/ledgers/available/{b.bookie_id}", b"{}", ephemeral=True)
            held.set()
            await done.wait()

    async def main() -> tuple[int, float]:
        held, done = trio.Event(), trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(hold_the_id, held, done)
            await held.wait()
            b.start()
            with trio.fail_after(60):
                while "event=bookie_id_registered_elsewhere" not in b.log_path.read_text():
                    assert b.running, b.log_tail()
                    await trio.sleep(0.05)
            t0 = time.monotonic()
            code = await trio.to_thread.run_sync(b.terminate)
            took = time.monotonic() - t0
            done.set()
        return code, took

    code, took = trio.run(main)
    assert code == 0 and took < 10, (code, took, b.log_tail())
    log = b.log_path.read_text()
    assert "event=bookie_start_interrupted" in log and "event=bookie_stopped" in log, log
    assert "Traceback" not in log, log


async def _open_then_stop(opening: Any, bookie: Any, *args: Any, **kwargs: Any) -> Any:
    check = await opening(*args, **kwargs)
    bookie.request_stop()
    return check


def _inprocess_config(base: Path, zk: str) -> BookieConfig:
    from ledgerd.appliance.config import BookieConfig
    from ledgerd.base.settings import load_config

    return load_config(BookieConfig, env={}, overrides={
        "bookie_port": find_free_port(), "listen_address": "127.0.0.1",
        "admin_port": find_free_port(), "zk_servers": zk, "zk_timeout_ms": 4000,
        "journal_prealloc_mb": 4, "journal_directory": str(base / "journal"),
        "ledger_directories": [str(base / "ledgers")]})


async def test_a_stop_during_the_first_start_keeps_the_cookie_in_zookeeper_too(
        zk_chroot: str, tmp_path: Path) -> None:
    """A stop while storage opens on a first start: the cookie stamped on disk is also
    written to ZooKeeper (else the next start is refused: a cookie on disk, none in
    ZooKeeper), and a caller's ``nursery.start(bookie.run)`` returns; so does one
    for a bookie asked to stop before it ran."""
    from ledgerd.appliance.bookie import Bookie
    from ledgerd.appliance.main import connect_metadata
    from ledgerd.disk.storage import LedgerStorage

    async with metadata_store(zk_chroot):
        pass  # the cluster's metadata made (initnewcluster)
    config = _inprocess_config(tmp_path / "b", zk_chroot)
    for attempt in ("stop while opening", "stop before running", "start"):
        store = await connect_metadata(config)
        assert store is not None
        try:
            bookie = Bookie(config, LedgerStorage(config.storage_options()), store)
            if attempt == "stop while opening":
                bookie.storage.open = partial(  # type: ignore[method-assign]
                    _open_then_stop, bookie.storage.open, bookie)
            elif attempt == "stop before running":
                bookie.request_stop()
            async with trio.open_nursery() as nursery:
                with trio.fail_after(60):
                    await nursery.start(bookie.run)
                if attempt == "start":
                    assert bookie.ready.is_set()
                    bookie.request_stop()
                else:
                    assert not bookie.ready.is_set()
            assert bookie.exit_code == 0
            got = await CookieStore(store, "/ledgers").get(bookie.bookie_id)
            assert got is not None, attempt
        finally:
            await store.close()


def test_sigterm_while_zookeeper_is_being_reached_stops_at_once(tmp_path: Path) -> None:
    """ZooKeeper not there at start (nothing listens on its port): SIGTERM while the
    bookie waits for it ends the start with exit 0, not the default SIGTERM death."""
    b = BookieProcess(tmp_path / "b", f"127.0.0.1:{find_free_port()}",
                      settings={"zk_timeout_ms": 60_000})
    b.start()
    try:
        deadline = time.monotonic() + 60
        while "event=metadata_connecting" not in b.log_path.read_text():
            assert b.running and time.monotonic() < deadline, b.log_tail()
            time.sleep(0.05)
    except BaseException:
        b.kill9()
        raise
    code, took = _timed_terminate(b)
    assert code == 0 and took < 10, (code, took, b.log_tail())
    log = b.log_path.read_text()
    assert "event=bookie_start_interrupted" in log and "Traceback" not in log, log
