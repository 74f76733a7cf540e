"""`ledgerd shell decommissionbookie` beside a live, slow writer, with real bookies and the
real ZooKeeper and no autorecovery daemons (the shipped default).

The writer's ledger lists the bookie in its open last fragment. Decommissioning must not
fence it: with ``--live`` the bookie first turns read-only, so the writer's next add
answers READ_ONLY and the writer changes ensemble itself; with the bookie stopped, the
writer's next add fails to connect and it does the same. Either way the command waits
the open-ledger grace period for that before fencing anything, as the workers do.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import trio

import ledgerd
from ledgerd.tools.bookieprocess import BookieProcess
from tests.cluster import metadata_store, start_bookies, wait_registered
from tests.tools.test_shell import _ok, _run

Factory = Callable[..., BookieProcess]
PACE_S = 4.0  # the slow writer: one add every PACE_S seconds, well inside the grace


@pytest.mark.parametrize("mode", ["live", "stopped"])
async def test_decommission_leaves_a_slow_writer_writing(
        bookie_factory: Factory, zk_chroot: str, tmp_path: Path, mode: str) -> None:
    secret = tmp_path / "cluster.secret"
    _ok(await _run("gensecret", str(secret)))
    bookies = await start_bookies(lambda: bookie_factory(cluster_secret_file=str(secret)),
                                  zk_chroot, 4)
    by_id = {b.bookie_id: b for b in bookies}
    async with ledgerd.open_client(zk_chroot, throttle=0) as client:
        lh = await client.create_ledger(3, 2, 2, password=b"pw")
        written = [b"entry %d" % i for i in range(20)]
        for data in written:
            await lh.append(data)
        victim = lh.metadata.last_ensemble[1][0]
        if mode == "stopped":
            assert by_id[victim].terminate() == 0
            async with metadata_store(zk_chroot, init=False) as store:
                await wait_registered(store, by_id[victim], present=False)

        args = ["decommissionbookie", victim, "--secret-file", str(secret), "--grace", "60"]
        if mode == "live":
            args.append("--live")
        outcome: list[str] = []
        errors: list[BaseException] = []

        async def decommission() -> None:
            outcome.append(_ok(await _run(*args, zk=zk_chroot)))

        async def write_slowly() -> None:
            while not outcome:
                await trio.sleep(PACE_S)
                data = b"entry %d" % len(written)
                try:
                    await lh.append(data)
                except ledgerd.LedgerdError as exc:
                    errors.append(exc)
                    return
                written.append(data)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(decommission)
            nursery.start_soon(write_slowly)
        assert not errors, errors  # LedgerFencedError before: the writer was fenced
        assert f"decommissioned {victim}" in outcome[0]
        for i in range(3):  # and it writes on
            written.append(b"after %d" % i)
            await lh.append(written[-1])
        await lh.close()
        md = await client.ledger_metadata(lh.ledger_id)
        assert all(victim not in ensemble for _, ensemble in md.ensembles)
        assert md.last_entry_id == len(written) - 1
        rh = await client.open_ledger(lh.ledger_id, b"pw")
        assert [e.payload async for e in rh.read()] == written
    if mode == "live":
        async with metadata_store(zk_chroot, init=False) as store:
            await wait_registered(store, by_id[victim], read_only=True)


async def test_decommission_without_a_spare_bookie_says_so_at_once(
        bookie_factory: Factory, zk_chroot: str) -> None:
    """Three bookies, an E3 ledger, one stopped: no bookie is left outside the ensemble to
    copy to. The command says that, at once, instead of waiting for the workers."""
    bookies = await start_bookies(bookie_factory, zk_chroot, 3)
    async with ledgerd.open_client(zk_chroot) as client:
        async with await client.create_ledger(3, 2, 2, password=b"pw") as lh:
            await lh.append_many([b"a", b"b", b"c"])
    victim = bookies[1]
    assert victim.terminate() == 0
    async with metadata_store(zk_chroot, init=False) as store:
        await wait_registered(store, victim, present=False)
    began = trio.current_time()
    r = await _run("decommissionbookie", victim.bookie_id, "--password", "pw", zk=zk_chroot)
    assert trio.current_time() - began < 30
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert f"cannot drain {victim.bookie_id}: ledger {lh.ledger_id}'s ensemble" in r.stderr
    assert "no bookie to copy its entries to: add a bookie first" in r.stderr, r.stderr
