"""`ledgerd shell` storage verbs on real bookie files: rebuildindex, localconsistencycheck
and listentrylogs, run as a user runs them (a `python -m ledgerd.tools.cli` process)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import trio

from ledgerd.disk.index import index_path
from ledgerd.disk.storage import LedgerStorage
from ledgerd.tools.bookieprocess import BookieProcess
from tests.appliance.harness import KEY, entry
from tests.tools.test_shell import _ok, _one_line_error, ledgerd_cli


async def _bookie_files(tmp_path: Path, *, unbounded: int = 0) -> tuple[BookieProcess, Path]:
    """A real bookie (no ZooKeeper) given ledgers 1..3, interleaved over several entry
    logs (``unbounded``: that ledger's adds carry term 1), then stopped; returns it and
    its ledger directory."""
    from ledgerd.bookie_client import open_bookie_client
    from ledgerd.wire.messages import AddRequest
    from ledgerd.wire.status import Status

    b = BookieProcess(tmp_path / "b", "", settings={"log_size_limit": 64 * 1024})
    await _start_ready(b)
    async with open_bookie_client(b.address) as c:
        for e in range(200):
            for lid in (1, 2, 3):
                st, _ = await c.call(AddRequest(
                    ledger_id=lid, first_entry_id=e, master_key=KEY,
                    term=1 if lid == unbounded else 0,
                    entries=(entry(lid, e, payload=b"%d" % lid * 300),)))
                assert st == Status.OK
    assert await trio.to_thread.run_sync(b.terminate) == 0
    return b, tmp_path / "b" / "ledgers"


async def _entries(conf: Path, lid: int) -> list[bytes]:
    from ledgerd.appliance.config import BookieConfig
    from ledgerd.base.settings import load_config

    s = LedgerStorage(load_config(BookieConfig, path=conf).storage_options())
    await s.open()
    try:
        return [s.read_entry(lid, e) for e in range(s.last_entry_id(lid) + 1)]
    finally:
        await s.close()


async def test_rebuildindex_regenerates_a_lost_index_from_the_entry_logs(tmp_path: Path) -> None:
    b, ledgers = await _bookie_files(tmp_path)
    conf = b.config_path
    before = await _entries(conf, 2)
    idx = index_path(ledgers, 2)
    header = idx.read_bytes()[:1024]

    # Corrupt: the check names each broken location and exits 1.
    data = bytearray(idx.read_bytes())
    data[1024 + 8 * 5: 1024 + 8 * 6] = (77 << 32 | 1024).to_bytes(8, "big")  # no log 0x4d
    idx.write_bytes(bytes(data))
    r = ledgerd_cli("localconsistencycheck", "--conf", str(conf))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "entry log missing" in r.stdout and "1 problem(s)" in r.stdout

    dry = json.loads(_ok(ledgerd_cli("rebuildindex", "2", "--conf", str(conf), "--dry-run",
                                     "--json")))
    assert dry["entries"] == 200 and not dry["written"] and dry["kept_header"]
    out = _ok(ledgerd_cli("rebuildindex", "2", "--conf", str(conf)))
    assert "wrote" in out and "200 entries (0..199)" in out
    assert idx.read_bytes()[:1024] == header  # key and state kept
    assert await _entries(conf, 2) == before
    out = _ok(ledgerd_cli("localconsistencycheck", "--conf", str(conf)))
    assert "3 ledger(s), 600 entries checked: consistent" in out
    assert "not verifiable" not in out  # every entry's CRC32C digest was checked

    # Lost entirely: the key must come from the password (and a wrong id says so).
    idx.unlink()
    _one_line_error(ledgerd_cli("rebuildindex", "2", "--conf", str(conf)), "--password")
    _ok(ledgerd_cli("rebuildindex", "2", "--conf", str(conf), "--password", "secret"))
    assert await _entries(conf, 2) == before
    _one_line_error(ledgerd_cli("rebuildindex", "9", "--conf", str(conf), "--password", "x"),
                    "no entry of ledger 9")


async def test_rebuildindex_refuses_an_unbounded_ledger_and_a_running_bookie(
        tmp_path: Path) -> None:
    b, _ = await _bookie_files(tmp_path, unbounded=3)
    conf = b.config_path
    _one_line_error(ledgerd_cli("rebuildindex", "3", "--conf", str(conf)),
                    "unbounded (term 1)", "recover")
    await _start_ready(b)
    try:
        _one_line_error(ledgerd_cli("rebuildindex", "1", "--conf", str(conf)),
                        "is running: stop it first")
    finally:
        b.terminate()


async def _start_ready(b: BookieProcess) -> None:
    """Start the bookie and wait for its READY=1 (sd_notify, to a socket of ours): it
    listens then, after replay and checkpoint."""
    import socket
    import tempfile

    path = tempfile.mktemp(prefix="ledgerd-notify-", dir="/tmp")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(path)
        try:
            b.start(env={"NOTIFY_SOCKET": path})

            async def died() -> None:
                code = await b.exited()
                raise AssertionError(f"bookie exited {code} before READY:\n{b.log_tail()}")

            with trio.fail_after(60):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(died)
                    while True:
                        got = await trio.to_thread.run_sync(sock.recv, 4096,
                                                            abandon_on_cancel=True)
                        if b"READY=1" in got.split(b"\n"):
                            nursery.cancel_scope.cancel()
                            break
        finally:
            os.unlink(path)


async def test_localconsistencycheck_finds_a_corrupt_record_and_listentrylogs_lists(
        tmp_path: Path) -> None:
    b, ledgers = await _bookie_files(tmp_path)
    conf = b.config_path
    logs = json.loads(_ok(ledgerd_cli("listentrylogs", "--conf", str(conf), "--json")))
    rolled = [g for g in logs["logs"] if g["rolled"]]
    assert len(rolled) >= 3 and all(g["live"] == 1.0 for g in rolled)
    assert all(set(g["ledgers"]) <= {1, 2, 3} for g in logs["logs"])
    index_path(ledgers, 3).unlink()  # ledger 3 "deleted": its bytes are dead now
    logs = json.loads(_ok(ledgerd_cli("listentrylogs", "--conf", str(conf), "--json")))
    assert all(0.6 <= g["live"] <= 0.7 for g in logs["logs"] if g["rolled"]), logs
    path = Path(rolled[0]["path"])
    with open(path, "r+b") as f:  # flip a payload byte of the first record
        f.seek(1024 + 8 + 40)
        byte = f.read(1)
        f.seek(1024 + 8 + 40)
        f.write(bytes([byte[0] ^ 0xFF]))
        os.fsync(f.fileno())
    r = ledgerd_cli("localconsistencycheck", "--conf", str(conf), "--json")
    assert r.returncode == 1
    report = json.loads(r.stdout)
    assert not report["ok"] and len(report["problems"]) == 1
    assert report["problems"][0]["problem"] == "record checksum mismatch"


async def test_convertstorage_both_ways_keeps_every_entry(tmp_path: Path) -> None:
    """interleaved -> db -> interleaved on a real bookie's files: the same entries read
    back each time, localconsistencycheck covers the db store, the old form is gone,
    and a bookie process serves the converted data (and refuses to convert meanwhile)."""
    b, ledgers = await _bookie_files(tmp_path)
    conf = b.config_path
    before = {lid: await _entries(conf, lid) for lid in (1, 2, 3)}
    out = json.loads(_ok(ledgerd_cli("convertstorage", "--conf", str(conf), "--to", "db",
                                     "--json")))
    assert out == {"to": "db", "ledgers": 3, "entries": 600, "removed": 3}
    assert not list(ledgers.glob("current/*/*/*.idx"))
    b.settings["ledger_storage_class"] = "db"
    b.write_config()
    assert {lid: await _entries(conf, lid) for lid in (1, 2, 3)} == before
    report = _ok(ledgerd_cli("localconsistencycheck", "--conf", str(conf)))
    assert "3 ledger(s), 600 entries checked: consistent" in report
    one = json.loads(_ok(ledgerd_cli("readindex", "2", "--conf", str(conf), "--json")))
    assert one["entries"] == 200 and one["has_master_key"] and one["file"].endswith(".lmdb")
    _one_line_error(ledgerd_cli("rebuildindex", "2", "--conf", str(conf)), "convertstorage")
    await _start_ready(b)  # a real bookie process on the db storage
    try:
        _one_line_error(ledgerd_cli("convertstorage", "--conf", str(conf), "--to",
                                    "interleaved"), "is running: stop it first")
        await _reads_and_db_metrics(b, before)
    finally:
        assert await trio.to_thread.run_sync(b.terminate) == 0
    back = json.loads(_ok(ledgerd_cli("convertstorage", "--conf", str(conf), "--to",
                                      "interleaved", "--json")))
    assert back["ledgers"] == 3 and back["entries"] == 600
    b.settings["ledger_storage_class"] = "interleaved"
    b.write_config()
    assert {lid: await _entries(conf, lid) for lid in (1, 2, 3)} == before


async def _reads_and_db_metrics(b: BookieProcess, before: dict[int, list[bytes]]) -> None:
    """Over the wire from the db bookie: ledger 2 read in order equals the files'
    entries (all but the first from the read-ahead cache), and /metrics says so."""
    import urllib.request

    from ledgerd.bookie_client import open_bookie_client
    from ledgerd.wire.messages import ReadRequest
    from ledgerd.wire.status import Status

    async with open_bookie_client(b.address) as c:
        for e, want in enumerate(before[2]):
            st, resp = await c.call(ReadRequest(ledger_id=2, entry_id=e))
            assert st == Status.OK and resp.entry == want  # type: ignore[union-attr]

    def scrape() -> dict[str, float]:
        url = f"http://127.0.0.1:{b.admin_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as r:
            text = r.read().decode()
        return {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
                if line.startswith("ledgerd_db_") or line.startswith("ledgerd_storage_")}

    m = await trio.to_thread.run_sync(scrape)
    assert m["ledgerd_db_read_ahead_hits_total"] >= 190, m
    assert m["ledgerd_db_read_ahead_entries_total"] >= 190
    assert m["ledgerd_db_index_store_bytes"] > 0
    assert m["ledgerd_db_write_cache_bytes"] == 0  # nothing added since the start
    assert m["ledgerd_storage_checkpoint_seconds_count"] >= 1
