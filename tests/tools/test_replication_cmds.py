"""The re-replication verbs as an operator runs them: `ledgerd shell ...` and a standalone
`ledgerd autorecovery` process against real bookies and the real ZooKeeper."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path

import ledgerd
from ledgerd.tools.bookieprocess import BookieProcess
from ledgerd.tools.zkserver import find_free_port
from tests.cluster import (
    metadata_store,
    start_bookies,
    wait_auditor,
    wait_registered,
    wait_unreferenced,
)
from tests.tools.test_shell import _ok, _one_line_error, _run

Factory = Callable[..., BookieProcess]


async def _references(zk: str, bookie: str) -> list[int]:
    async with ledgerd.open_client(zk) as client:
        return await client.ledgers.listing({bookie})


async def test_operator_verbs_and_a_standalone_autorecovery(
        bookie_factory: Factory, zk_chroot: str, tmp_path: Path) -> None:
    secret = tmp_path / "cluster.secret"
    out = _ok(await _run("gensecret", str(secret)))
    assert "wrote a new cluster secret" in out and secret.stat().st_mode & 0o077 == 0
    _one_line_error(await _run("gensecret", str(secret)), "is not overwritten")
    bookies = await start_bookies(lambda: bookie_factory(cluster_secret_file=str(secret)),
                                  zk_chroot, 4)
    by_id = {b.bookie_id: b for b in bookies}
    _one_line_error(await _run("whoisauditor", zk=zk_chroot), "no auditor is elected")
    _one_line_error(await _run("triggeraudit", zk=zk_chroot), "no auditor is elected")
    status = json.loads(_ok(await _run("autorecovery", "--status", "--json", zk=zk_chroot)))
    assert status["enabled"] and status["auditor"] is None

    # Standalone autorecovery without a secret: one line, exit 2 (a config error).
    noconf = tmp_path / "nosecret.toml"
    noconf.write_text(f'zk_servers = "{zk_chroot}"\nledger_directories = ["{tmp_path}"]\n')
    r = subprocess.run([sys.executable, "-m", "ledgerd.tools.cli", "autorecovery", "--conf",
                        str(noconf)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "cluster_secret_file" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr

    async with ledgerd.open_client(zk_chroot, throttle=0) as client:
        ledgers = []
        for k in range(4):
            lh = await client.create_ledger(2, 2, 2, password=b"pw")
            for i in range(50):
                await lh.append(b"%d:%d" % (k, i))
            await lh.close()
            ledgers.append(lh.ledger_id)

    # A standalone autorecovery process with its metrics endpoint.
    admin_port = find_free_port()
    arconf = tmp_path / "autorecovery.toml"
    arconf.write_text(bookies[0].config_path.read_text().replace(
        f"admin_port = {bookies[0].admin_port}", f"admin_port = {admin_port}"))
    log = open(tmp_path / "autorecovery.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "ledgerd.tools.cli", "autorecovery", "--conf",
                             str(arconf), "--id", "ar-test"], stdout=log,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        async with metadata_store(zk_chroot, init=False) as store:
            await wait_auditor(store, "ar-test")
        assert _ok(await _run("lostbookierecoverydelay", "--set", "3600", zk=zk_chroot)
                   ).strip() == "3600"
        assert _ok(await _run("lostbookierecoverydelay", "--get", zk=zk_chroot)).strip() == "3600"

        listing = {b: await _references(zk_chroot, b) for b in by_id}
        victim = max(listing, key=lambda b: len(listing[b]))
        assert listing[victim]
        by_id[victim].kill9()
        async with metadata_store(zk_chroot, init=False) as store:
            await wait_registered(store, by_id[victim], present=False)
        # Within the hour's delay nothing is queued; triggeraudit skips the wait.
        assert json.loads(_ok(await _run("listunderreplicated", "--json", zk=zk_chroot))) == []
        assert "audit triggered on ar-test" in _ok(await _run("triggeraudit", zk=zk_chroot))

        async with metadata_store(zk_chroot, init=False) as store:
            await wait_unreferenced(store, victim)
        assert json.loads(_ok(await _run("listunderreplicated", "--count", "--json",
                                         zk=zk_chroot)))["count"] == 0
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/metrics",
                                         timeout=10).read().decode()
        line = next(m for m in metrics.splitlines()
                    if m.startswith("ledgerd_autorecovery_ledgers_rereplicated_total"))
        assert float(line.split()[-1]) >= len(listing[victim])

        # The switch: off, seen by status; on again.
        _ok(await _run("autorecovery", "--disable", zk=zk_chroot))
        assert "DISABLED" in _ok(await _run("autorecovery", zk=zk_chroot))
        _one_line_error(await _run("triggeraudit", zk=zk_chroot), "disabled")
        _ok(await _run("autorecovery", "--enable", zk=zk_chroot))
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0
        log.close()

    # Manual recover: a dry run changes nothing; a real one moves every fragment. The
    # source is the live bookie most ledgers list (placement is random: the first one
    # in order was once listed by none).
    live = {b: await _references(zk_chroot, b) for b in by_id if b != victim}
    source = max(live, key=lambda b: len(live[b]))
    before = live[source]
    assert before
    dry = json.loads(_ok(await _run("recover", source, "--dry-run", "--json", zk=zk_chroot)))
    assert dry["dry_run"] and len(dry["ledgers"]) == len(before)
    assert await _references(zk_chroot, source) == before
    _one_line_error(await _run("recover", source, zk=zk_chroot), "--secret-file")
    # The bookie still runs: bookieformat refuses a live bookie (and, stopped, one
    # that ledgers still list: the next check below the liveness one).
    r = subprocess.run([sys.executable, "-m", "ledgerd.tools.cli", "shell", "--zk", zk_chroot,
                        "bookieformat", "--conf", str(by_id[source].config_path), "--force"],
                       capture_output=True, text=True, timeout=60)
    _one_line_error(r, f"bookie {source} is running", "stop it first")
    done = json.loads(_ok(await _run("recover", source, "--secret-file", str(secret),
                                     "--json", zk=zk_chroot)))
    assert {d["outcome"] for d in done["ledgers"]} == {"replicated"}
    assert await _references(zk_chroot, source) == []
    async with ledgerd.open_client(zk_chroot) as client:
        for k, lid in enumerate(ledgers):
            rh = await client.open_ledger(lid, b"pw")
            assert [e.payload async for e in rh.read()] == [b"%d:%d" % (k, i)
                                                             for i in range(50)]
