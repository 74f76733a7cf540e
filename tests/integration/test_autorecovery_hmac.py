"""Autorecovery closes an open bounded HMAC ledger without its password (issue 45, part
5), with real bookie processes and the real ZooKeeper.

Five bookies run autorecovery in-process with only the cluster secret (grace period
5 s). A writer process makes an HMAC ledger, appends, and is killed -9; then a bookie of
its ensemble is killed for good. Nobody holds the password but the test's own checks.

- The worker fences the ledger, recovers its tail with the checks that need no key and
  replicas that must agree, closes it where a recovery with the password closes it
  (every acknowledged entry, the exact length), and copies the lost bookie's entries:
  every acknowledged entry is back at Qw.
- A survivor holding other bytes for a tail entry makes the close refuse: the ledger
  stays IN_RECOVERY naming the lost bookie, nothing is copied, and only a recovery with
  the password closes it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import trio

import ledgerd
from ledgerd.client import Client
from ledgerd.metadata.ledger import LedgerState
from ledgerd.metadata.underreplication import UnderreplicationManager
from ledgerd.replication import Credentials, Outcome, rereplicate_ledger
from ledgerd.tools.bookieprocess import BookieProcess
from ledgerd.wire.entry import peek_entry_header, recovery_key
from ledgerd.wire.messages import AddFlags, AddRequest, ReadRequest, ReadResponse
from ledgerd.wire.status import Status
from tests.cluster import start_bookies
from tests.integration.hmac_writer_proc import payload
from tests.integration.test_autorecovery_unbounded import (
    HEAL_BOUND_S,
    SECRET,
    _settings,
    below_qw,
    wait_healed,
)

Factory = Callable[..., BookieProcess]


def _run_writer(zk: str, count: int, quorums: str, in_flight: int) -> int:
    """Start the writer, wait until every entry is acknowledged, kill it -9: its id."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.integration.hmac_writer_proc", zk, str(count),
         *quorums.split(","), str(in_flight)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
        start_new_session=True)
    try:
        assert proc.stdout is not None and proc.stderr is not None
        first = proc.stdout.readline().decode()
        assert first.startswith("ledger "), first + proc.stderr.read().decode()
        done = proc.stdout.readline()
        assert done == b"done\n", done + proc.stderr.read()
        os.kill(proc.pid, signal.SIGKILL)  # the writer is dead; its ledger stays OPEN
        proc.wait(30)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(30)
    return int(first.split()[1])


async def test_killed_writer_and_lost_bookie_open_hmac_ledger_is_closed_without_the_password(
        bookie_factory: Factory, zk_chroot: str, tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    bookies = await start_bookies(lambda: bookie_factory(**settings), zk_chroot, 5)
    by_id = {b.bookie_id: b for b in bookies}
    count = 300
    lid = await trio.to_thread.run_sync(_run_writer, zk_chroot, count, "3,2,2", 3)
    acked = {i: payload(i) for i in range(count)}
    async with ledgerd.open_client(zk_chroot, throttle=0) as client:
        md = await client.ledger_metadata(lid)
        assert md.state is LedgerState.OPEN and md.digest_type == "hmac"
        victim = md.ensembles[0][1][0]
        by_id[victim].kill9()  # for good
        before = len(await below_qw(client, lid, acked))
        assert before == 200  # E3/Qw2: 2 of 3 write sets name it
        took = await wait_healed(client, {lid: acked}, HEAL_BOUND_S, never_unmarked=lid)
        print(f"open HMAC ledger closed and healed without the password in {took:.1f} s; "
              f"below Qw before: {before}, after: 0")
        md = await client.ledger_metadata(lid)
        # Where a recovery with the password closes it: the last acknowledged entry,
        # the exact length of every acknowledged payload.
        assert md.is_closed and md.last_entry_id == count - 1
        assert md.length == sum(len(p) for p in acked.values())
        assert all(victim not in ens for _, ens in md.ensembles)
        rh = await client.open_ledger(lid, b"pw")
        got = [e.payload async for e in rh.read()]
        assert got == [acked[i] for i in range(count)]


async def _forge(client: Client, lid: int, bookie: str, entry_id: int) -> None:
    """Make ``bookie`` hold other bytes for ``entry_id`` (a flipped payload byte, which
    only the digest could catch), written as a recovery would write them."""
    status, resp, _ = await client.pool.call(
        bookie, ReadRequest(ledger_id=lid, entry_id=entry_id), 10.0)
    assert status == Status.OK and isinstance(resp, ReadResponse)
    good = bytes(resp.entry)
    status, _, error = await client.pool.call(bookie, AddRequest(
        ledger_id=lid, first_entry_id=entry_id,
        flags=AddFlags.RECOVERY_ADD | AddFlags.HIGH_PRIORITY,
        master_key=recovery_key(SECRET, lid),
        entries=(good[:-1] + bytes([good[-1] ^ 1]),)), 10.0)
    assert status == Status.OK, (status, error)
    status, resp, _ = await client.pool.call(
        bookie, ReadRequest(ledger_id=lid, entry_id=entry_id), 10.0)
    assert isinstance(resp, ReadResponse) and bytes(resp.entry) != good


async def test_a_corrupted_replica_makes_autorecovery_refuse_to_close_an_hmac_ledger(
        bookie_factory: Factory, zk_chroot: str, tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    bookies = await start_bookies(lambda: bookie_factory(**settings), zk_chroot, 5)
    by_id = {b.bookie_id: b for b in bookies}
    count = 50
    # E3/Qw3/Qa2: two survivors of every entry; the last three were in flight together
    # (LAC 46), so the close reads entries 47 on.
    lid = await trio.to_thread.run_sync(_run_writer, zk_chroot, count, "3,3,2", 3)
    acked = {i: payload(i) for i in range(count)}
    async with ledgerd.open_client(zk_chroot, throttle=0) as client:
        md = await client.ledger_metadata(lid)
        ensemble = md.ensembles[0][1]
        victim, forged = ensemble[0], ensemble[1]
        status, resp, _ = await client.pool.call(
            forged, ReadRequest(ledger_id=lid, entry_id=count - 1), 10.0)
        assert isinstance(resp, ReadResponse)
        assert peek_entry_header(resp.entry).lac < count - 2
        await _forge(client, lid, forged, count - 2)
        by_id[victim].kill9()  # for good
        others = [b.bookie_id for b in bookies if b.bookie_id not in ensemble]

        def refusals() -> int:
            return sum(b.log_path.read_text(errors="replace").count(
                "rereplication_close_refused") for b in bookies if b.bookie_id != victim)

        with trio.fail_after(HEAL_BOUND_S):
            while refusals() < 2:  # the first close and a worker's retry
                md = await client.ledger_metadata(lid)
                assert not md.is_closed, "closed on bytes no second replica vouched for"
                await trio.sleep(0.5)
        md = await client.ledger_metadata(lid)
        assert md.state is LedgerState.IN_RECOVERY, md  # fenced, kept for the password
        assert md.ensembles == ((0, ensemble),)  # nothing re-pointed
        assert await UnderreplicationManager(client.store, "/ledgers").get(lid) is not None
        for bookie in others:  # nothing copied anywhere
            status, _, _ = await client.pool.call(
                bookie, ReadRequest(ledger_id=lid, entry_id=count - 2), 10.0)
            assert status in (Status.NO_SUCH_LEDGER, Status.NO_SUCH_ENTRY), (bookie, status)

        # The operator closes it with the password: the replica whose digest fails is
        # passed over, and every acknowledged entry is back at Qw with its own bytes.
        result = await rereplicate_ledger(client, lid, Credentials(password=b"pw"),
                                          close_open=True)
        assert result.outcome in (Outcome.REPLICATED, Outcome.DEFERRED), result.detail
        await wait_healed(client, {lid: acked}, HEAL_BOUND_S)
        md = await client.ledger_metadata(lid)
        assert md.is_closed and md.last_entry_id == count - 1
        assert md.length == sum(len(p) for p in acked.values())
