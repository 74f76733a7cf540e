"""`ledgerd shell` and `ledgerd bench` on a real cluster, and the inspection commands on
real bookie files made torn and corrupt. Every command runs as a user would run it: a
`python -m ledgerd.tools.cli` process, its output and exit status checked."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import trio

import ledgerd
from ledgerd.tools.bookieprocess import BookieProcess
from tests.cluster import metadata_store, start_bookies, wait_registered

Factory = Callable[..., BookieProcess]


def ledgerd_cli(*args: str, zk: str | None = None) -> subprocess.CompletedProcess[str]:
    env_args = ["shell", "--zk", zk] if zk is not None else ["shell"]
    return subprocess.run([sys.executable, "-m", "ledgerd.tools.cli", *env_args, *args],
                          capture_output=True, text=True, timeout=120)


def _ok(r: subprocess.CompletedProcess[str]) -> str:
    assert r.returncode == 0, r.stderr
    return r.stdout


def _one_line_error(r: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    for n in needles:
        assert n in lines[0], lines[0]


async def _cluster(factory: Factory, zk: str, n: int) -> list[BookieProcess]:
    return await start_bookies(factory, zk, n)


async def _run(*args: str, zk: str | None = None) -> subprocess.CompletedProcess[str]:
    return await trio.to_thread.run_sync(lambda: ledgerd_cli(*args, zk=zk))


async def test_shell_commands_on_a_real_cluster(bookie_factory: Factory, zk_chroot: str) -> None:
    bookies = await _cluster(bookie_factory, zk_chroot, 3)
    ids = sorted(b.bookie_id for b in bookies)
    zk = zk_chroot

    assert "already exists" in _ok(await _run("initnewcluster", zk=zk))
    iid = _ok(await _run("whatisinstanceid", zk=zk)).strip()
    assert len(iid) == 36
    out = _ok(await _run("listbookies", zk=zk))
    assert out.splitlines()[0].split() == ["BOOKIE", "STATE", "PID", "VERSION"]
    assert "3 bookie(s)" in out
    listed = json.loads(_ok(await _run("listbookies", "--json", zk=zk)))
    assert sorted(r["bookie"] for r in listed) == ids
    assert json.loads(_ok(await _run("listbookies", "--readonly", "--json", zk=zk))) == []
    info = json.loads(_ok(await _run("clusterinfo", "--json", zk=zk)))
    assert info["writable"] == ids and info["read_only"] == [] and info["health"] == "OK"
    assert info["layout"] == "hierarchical" and info["autorecovery_enabled"] is True
    assert "3 writable, 0 read-only" in _ok(await _run("clusterinfo", zk=zk))
    info = json.loads(_ok(await _run("bookieinfo", "--json", zk=zk)))
    assert len(info) == 3 and all(r["total_bytes"] > r["free_bytes"] > 0 for r in info)
    assert "wrote and read back 40 entries" in _ok(await _run("simpletest", "-n", "40", zk=zk))
    assert "wrote and read back" in _ok(await _run("bookiesanity", "--bookie", ids[0], zk=zk))

    async with ledgerd.open_client(zk) as client:
        async with await client.create_ledger(3, 2, 2, password=b"pw") as lh:
            await lh.append_many(b"payload %d" % i for i in range(12))
    lid = lh.ledger_id
    ledgers = json.loads(_ok(await _run("listledgers", "--meta", "--json", zk=zk)))
    assert {"ledger_id": lid, "state": "CLOSED", "last_entry_id": 11,
            "length": sum(len(b"payload %d" % i) for i in range(12)),
            "ensemble": "3/2/2"} in ledgers
    md = _ok(await _run("ledgermetadata", str(lid), zk=zk))
    assert "state            CLOSED" in md and "from entry 0:" in md
    assert "compression      none" in md and "None" not in md  # no Python reprs
    created = next(ln.split()[1] for ln in md.splitlines() if ln.startswith("created "))
    assert created.endswith("+00:00") and created[:4].isdigit()  # ISO 8601, UTC
    # readledger clamps to the last confirmed entry, as BookKeeper's does, and says so.
    clamped = await _run("readledger", str(lid), "--password", "pw", "--from", "10",
                         "--to", "99", "--json", zk=zk)
    assert [e["entry_id"] for e in json.loads(_ok(clamped))] == [10, 11]
    assert "reading to entry 11, its last confirmed entry (--to 99 is past it)" in clamped.stderr
    _one_line_error(await _run("readledger", str(lid), "--password", "pw", "--from", "5",
                               "--to", "2", zk=zk), "--from 5 is past --to 2")
    _one_line_error(await _run("readledger", str(lid), "--password", "pw", "--from", "20",
                               zk=zk), "past its last confirmed entry 11")
    entries = json.loads(_ok(await _run("readledger", str(lid), "--password", "pw",
                                        "--from", "2", "--to", "4", "--json", zk=zk)))
    assert [(e["entry_id"], e["payload"]) for e in entries] == [
        (2, "payload 2"), (3, "payload 3"), (4, "payload 4")]
    _one_line_error(await _run("readledger", str(lid), "--password", "nope", zk=zk),
                    "wrong password")
    _one_line_error(await _run("deleteledger", str(lid), zk=zk), "--force")
    assert f"deleted ledger {lid}" in _ok(await _run("deleteledger", str(lid), "--force", zk=zk))
    _one_line_error(await _run("ledgermetadata", str(lid), zk=zk), f"ledger {lid} does not exist")

    cookie = _ok(await _run("cookie", "get", ids[0], zk=zk))
    assert iid in cookie and ids[0] in cookie
    as_json = json.loads(_ok(await _run("cookie", "get", ids[0], "--json", zk=zk)))
    assert as_json["bookie_id"] == ids[0] and as_json["version"] == 0
    assert as_json["cookie"]["cookie"]["instance_id"] == iid
    _one_line_error(await _run("cookie", "get", "127.0.0.1:1", zk=zk), "no cookie")

    # The bookie's own files: a checkpoint happens at SIGTERM.
    b = bookies[0]
    b.terminate()
    conf = str(b.config_path)
    assert "journal file" in _ok(await _run("lastmark", "--conf", conf, zk=zk))
    held = json.loads(_ok(await _run("listledgers", "--json", zk=zk)))
    assert lid not in [r["ledger_id"] for r in held]  # deleted above
    _one_line_error(await _run("readindex", "999999", "--conf", conf, zk=zk), "no index file")


async def test_cluster_errors_are_one_line(zk_chroot: str, tmp_path: Path) -> None:
    r = await _run("listbookies", zk="127.0.0.1:1")
    _one_line_error(r, "127.0.0.1:1")
    empty = zk_chroot + "/nothing_here"
    _one_line_error(await _run("listledgers", zk=empty), "initnewcluster")
    _one_line_error(await _run("lastmark", "--conf", str(tmp_path / "missing.toml")),
                    "missing.toml")


async def test_bench_writes_and_reads(bookie_factory: Factory, zk_chroot: str) -> None:
    await _cluster(bookie_factory, zk_chroot, 3)
    w = json.loads(_ok(await trio.to_thread.run_sync(lambda: subprocess.run(
        [sys.executable, "-m", "ledgerd.tools.cli", "bench", "writes", "--zk", zk_chroot,
         "--duration", "2", "--outstanding", "100", "--ledgers", "2", "--json"],
        capture_output=True, text=True, timeout=120))))
    assert w["appends"] > 0 and w["p99_ms"] >= w["p50_ms"] > 0
    assert "interrupted" not in w
    # Its ledgers are gone afterwards (unless --keep), and progress went to stderr.
    assert json.loads(_ok(await _run("listledgers", "--json", zk=zk_chroot))) == []
    # Ctrl-C ends it early: the ledger is closed and the partial result printed.
    proc = subprocess.Popen([sys.executable, "-m", "ledgerd.tools.cli", "bench", "writes", "--zk",
                             zk_chroot, "--duration", "60", "--outstanding", "50", "--keep",
                             "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    assert proc.stderr is not None
    line = await trio.to_thread.run_sync(proc.stderr.readline)  # the first progress line
    assert "appends" in line, line
    proc.send_signal(signal.SIGINT)
    out, _ = await trio.to_thread.run_sync(lambda: proc.communicate(timeout=120))
    assert proc.returncode == 0
    partial = json.loads(out)
    assert partial["interrupted"] is True and partial["seconds"] < 60
    kept = int(partial["ledger_ids"])
    async with ledgerd.open_client(zk_chroot) as client:
        assert (await client.ledger_metadata(kept)).is_closed
    r = json.loads(_ok(await trio.to_thread.run_sync(lambda: subprocess.run(
        [sys.executable, "-m", "ledgerd.tools.cli", "bench", "reads", "--zk", zk_chroot,
         "--entries", "600", "--passes", "1", "--json"],
        capture_output=True, text=True, timeout=120))))
    assert r["entries_read"] == 600


async def test_simpletest_interrupted_deletes_its_ledger(bookie_factory: Factory,
                                                         zk_chroot: str) -> None:
    await _cluster(bookie_factory, zk_chroot, 3)
    proc = subprocess.Popen([sys.executable, "-m", "ledgerd.tools.cli", "shell", "--zk",
                             zk_chroot, "simpletest", "-n", "10000000"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    first = await trio.to_thread.run_sync(proc.stderr.readline)
    assert first.startswith("ledger ") and "writing 10000000 entries" in first, first
    ids = [int(first.split()[1].rstrip(":"))]
    async with ledgerd.open_client(zk_chroot) as client:
        handle = await client.open_ledger(ids[0], b"simpletest", recovery=False)
        with trio.fail_after(60):  # wait until it is writing (a long poll on the LAC)
            while await handle.wait_lac_beyond(100, timeout=30) <= 100:
                pass
        proc.send_signal(signal.SIGINT)
        out, err = await trio.to_thread.run_sync(lambda: proc.communicate(timeout=120))
        assert proc.returncode == 130, err
        assert out.startswith(f"interrupted: ledger {ids[0]}: wrote "), out
        assert out.rstrip().endswith(" of 10000000 entries, deleted"), out
        assert [lid async for lid in client.list_ledgers()] == []


async def test_inspection_of_torn_and_corrupt_files(bookie_factory: Factory, zk_chroot: str,
                                                    tmp_path: Path) -> None:
    bookies = await _cluster(bookie_factory, zk_chroot, 1)
    async with ledgerd.open_client(zk_chroot) as client:
        async with await client.create_ledger(1, 1, 1) as lh:
            await lh.append_many(b"x" * 100 for _ in range(50))
    b = bookies[0]
    b.terminate()  # checkpoint: index files and entry log written
    journal = max((b.base / "journal" / "current").glob("*.txn"), key=lambda p: p.stat().st_size)
    log = next((b.base / "ledgers" / "current").glob("*.log"))
    conf = str(b.config_path)

    good = json.loads(_ok(await _run("readjournal", str(journal), "--json")))
    entries = [r for r in good["records"] if r["type"] == "ENTRY" and r["ledger"] == lh.ledger_id]
    assert [r["entry"] for r in entries] == list(range(50))
    assert all(r["crc"] == "ok" for r in good["records"]) and good["torn_tail_offset"] is None

    data = journal.read_bytes()
    last = entries[-1]
    torn = tmp_path / "torn.txn"
    torn.write_bytes(data[: last["offset"] + 20])  # the last record cut in half
    out = json.loads(_ok(await _run("readjournal", str(torn), "--json")))
    assert out["torn_tail_offset"] == last["offset"]
    human = _ok(await _run("readjournal", str(torn)))
    assert f"torn tail starts at offset {last['offset']}" in human

    corrupt = tmp_path / "corrupt.txn"
    flipped = bytearray(data)
    flipped[entries[10]["offset"] + 30] ^= 0xFF
    corrupt.write_bytes(bytes(flipped))
    out = json.loads(_ok(await _run("readjournal", str(corrupt), "--json")))
    bad = [r for r in out["records"] if r["crc"] == "BAD"]
    assert bad and bad[0]["offset"] == entries[10]["offset"]

    logged = json.loads(_ok(await _run("readlog", str(log), "--json")))
    ours = [r for r in logged["records"] if r["ledger"] == lh.ledger_id]
    assert [r["entry"] for r in ours] == list(range(50))
    truncated = tmp_path / "trunc.log"
    truncated.write_bytes(log.read_bytes()[: ours[-1]["offset"] + 30])
    out = json.loads(_ok(await _run("readlog", str(truncated), "--json")))
    assert out["records"][-1]["problem"].startswith("truncated")

    index = json.loads(_ok(await _run("readindex", str(lh.ledger_id), "--conf", conf, "--json")))
    assert index["entries"] == 50 and not index["fenced"]

    junk = tmp_path / "junk.txn"
    junk.write_bytes(b"this is not a journal" * 300)
    _one_line_error(await _run("readjournal", str(junk)), "not a ledgerd journal", str(junk))
    _one_line_error(await _run("readlog", str(junk)), "not a ledgerd entry log")
    shutil.rmtree(tmp_path / "nothing", ignore_errors=True)


async def test_readjournal_shows_every_legacy_gap_and_the_end_of_data(tmp_path: Path) -> None:
    """A journal written before the padding rule (zero gaps at group ends): every
    record and every gap is listed, and where the data ends."""
    from ledgerd.disk.journal_format import (
        HEADER_SIZE,
        PREFIX_SIZE,
        RecordType,
        encode_header,
        entry_body,
    )
    from tests.disk.test_journal_format import _legacy_group

    groups = [[(RecordType.ENTRY, entry_body(3, n, b"p" * (4096 - 8 - PREFIX_SIZE - 16)))]
              for n in range(5)]
    path = tmp_path / "legacy.txn"
    path.write_bytes(encode_header(1) + b"".join(_legacy_group(1, g, 4096) for g in groups)
                     + bytes(4096))
    out = json.loads(_ok(await _run("readjournal", str(path), "--json")))
    assert [(r["type"], r["entry"]) for r in out["records"]] == [
        (t, e) for n in range(5) for t, e in (("ENTRY", n), ("GAP", None))]
    assert [r["offset"] for r in out["records"] if r["type"] == "GAP"] == [
        HEADER_SIZE + 4096 * (n + 1) - 8 for n in range(5)]
    assert out["gaps"] == 5 and out["end_offset"] == HEADER_SIZE + 5 * 4096
    human = _ok(await _run("readjournal", str(path)))
    assert human.rstrip().endswith(
        f"5 record(s), 5 legacy gap(s) (zero bytes at a group's end, skipped); "
        f"data ends at offset {HEADER_SIZE + 5 * 4096}"), human


async def test_bookie_on_a_port_in_use_is_a_one_line_error(tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        conf = tmp_path / "b.toml"
        conf.write_text(f'bookie_port = {port}\nlisten_address = "127.0.0.1"\nzk_servers = ""\n'
                        f'journal_directory = "{tmp_path}/j"\n'
                        f'ledger_directories = ["{tmp_path}/l"]\nadmin_port = 0\n'
                        "journal_prealloc_mb = 4\n")
        r = await trio.to_thread.run_sync(lambda: subprocess.run(
            [sys.executable, "-m", "ledgerd.tools.cli", "bookie", "--conf", str(conf)],
            capture_output=True, text=True, timeout=120))
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().splitlines()[-1] == (
        f"ledgerd: error: bookie did not start: [Errno 98] cannot listen on 127.0.0.1:{port}: "
        "Address already in use")


async def test_cookie_update_bookieformat_and_metaformat(bookie_factory: Factory,
                                                         zk_chroot: str) -> None:
    b, stale = await _cluster(bookie_factory, zk_chroot, 2)
    zk = zk_chroot
    old_iid = _ok(await _run("whatisinstanceid", zk=zk)).strip()
    conf = str(b.config_path)
    # Destructive commands check for a live target.
    _one_line_error(await _run("bookieformat", "--conf", conf, "--force", zk=zk),
                    f"bookie {b.bookie_id} is running")
    _one_line_error(await _run("metaformat", "--force", zk=zk), "2 bookie(s) are registered")
    b.terminate()
    stale.terminate()
    out = _ok(await _run("cookie", "update", "--conf", conf, zk=zk))
    assert f"cookie of {b.bookie_id} updated" in out
    assert "(znode version 1)" in _ok(await _run("cookie", "get", b.bookie_id, zk=zk))

    _one_line_error(await _run("bookieformat", "--conf", conf, zk=zk), "--force")
    out = _ok(await _run("bookieformat", "--conf", conf, "--force", zk=zk))
    assert f"formatted bookie {b.bookie_id}" in out
    assert not any((b.base / "journal").iterdir()) and not any((b.base / "ledgers").iterdir())
    _one_line_error(await _run("cookie", "get", b.bookie_id, zk=zk), "no cookie")

    _one_line_error(await _run("metaformat", zk=zk), "--force")
    assert "new instance id" in _ok(await _run("metaformat", "--force", zk=zk))
    new_iid = _ok(await _run("whatisinstanceid", zk=zk)).strip()
    assert new_iid != old_iid
    # The formatted bookie joins the new cluster with fresh cookies.
    async with metadata_store(zk, init=False) as store:
        b.start()
        await wait_registered(store, b)
    # The other still holds the old cluster's data: it must not be told to `cookie update`.
    r = await trio.to_thread.run_sync(lambda: subprocess.run(
        [sys.executable, "-m", "ledgerd.tools.cli", "bookie", "--conf", str(stale.config_path)],
        capture_output=True, text=True, timeout=120))
    err = r.stderr.strip().splitlines()[-1]
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert f"belongs to cluster instance {old_iid}" in err and new_iid in err, err
    assert "bookieformat" in err and "cookie update" not in err, err


async def test_log_commands(bookie_factory: Factory, zk_chroot: str) -> None:
    """listlogs, logstat, readlogentries and truncatelog, as a user runs them."""
    await _cluster(bookie_factory, zk_chroot, 3)
    zk = zk_chroot
    async with ledgerd.open_client(zk) as client:
        async with await client.logs.open_writer("orders", 3, 2, 2, roll_entries=10) as w:
            await w.append_many(b"order %d" % i for i in range(25))
        cur = await client.logs.open_cursor("orders", "billing")
        async for e in client.logs.follow("orders", start=4):
            await cur.commit(e)
            break
    assert json.loads(_ok(await _run("listlogs", "--json", zk=zk))) == [
        {"log": "orders", "kind": "ledgers", "ledgers": 3}]
    stat = json.loads(_ok(await _run("logstat", "orders", "--json", zk=zk)))
    assert (stat["start_offset"], stat["end_offset"]) == (0, 25)
    assert [r["entries"] for r in stat["ledgers"]] == [10, 10, 5]
    assert stat["cursors"] == {"billing": 5}
    assert "offsets 0..25 (25 entries)" in _ok(await _run("logstat", "orders", zk=zk))
    lines = _ok(await _run("readlogentries", "orders", "--from", "8", "--count", "3",
                           "--json", zk=zk)).splitlines()
    assert [json.loads(x)["payload"] for x in lines] == ["order 8", "order 9", "order 10"]
    rest = _ok(await _run("readlogentries", "orders", "--from", "20", zk=zk)).splitlines()
    assert len(rest) == 5 and rest[0].startswith("20\t") and rest[0].endswith("order 20")
    _one_line_error(await _run("truncatelog", "orders", "--before", "15", zk=zk), "--force")
    done = json.loads(_ok(await _run("truncatelog", "orders", "--before", "15", "--force",
                                     "--json", zk=zk)))
    assert done == {"ledgers": 1, "start": 10}
    _one_line_error(await _run("readlogentries", "orders", "--from", "3", zk=zk),
                    "offset 3 was truncated")
    _one_line_error(await _run("logstat", "nosuch", zk=zk), "log 'nosuch' does not exist")
