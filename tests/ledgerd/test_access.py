"""Refused requests over real bookies on memory streams: the reason a client gives, and
what a refused recovery leaves behind.

A bookie answers UNAUTHORIZED for a key it does not accept and for a request the
connection's principal has no role for. A client whose password matches the ledger's
check hash knows the key is not the problem and must say so; a recovery the bookies
refuse must not leave the ledger IN_RECOVERY, where it would stop a live writer's next
ensemble change or close for a recovery that never had the right to run. An unbounded
ledger's refused takeover keeps its raised term (terms never go back) and stays
IN_RECOVERY, and the next leader or a replication worker takes it over from there.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing

import ledgerd
from ledgerd.appliance.security import ConnectionSecurity
from ledgerd.base.tls import Principal
from ledgerd.bookie_client import open_bookie_client
from ledgerd.errors import AccessDeniedError, LeadershipLostError
from ledgerd.machines.checker import entries_below_qw
from ledgerd.metadata.ledger import LedgerState
from ledgerd.metadata.registry import BookieRegistry
from ledgerd.recovery import recover_ledger, take_over
from ledgerd.replication import Credentials, Outcome, ReplicationOptions, rereplicate_ledger
from ledgerd.wire.entry import Digester, DigestType, encode_entry, recovery_key
from ledgerd.wire.messages import AddRequest
from ledgerd.wire.status import Status
from tests.ledgerd.memcluster import MemoryCluster, client_settings, memory_cluster

SECRET = b"cluster-secret-for-tests-0123456789"


@pytest.fixture
def clock(mock_clock: trio.testing.MockClock) -> trio.testing.MockClock:
    mock_clock.autojump_threshold = 0.05
    return mock_clock


def only_roles(cluster: MemoryCluster, *roles: str) -> None:
    """Connections opened from now on are the anonymous principal with ``roles``
    (``"*"``: authorization off again)."""
    for bookie in cluster.bookies.values():
        bookie.harness.security = None if roles == ("*",) else ConnectionSecurity(
            None, authorization=True, anonymous=Principal("anonymous", frozenset(roles)))


async def test_a_refused_role_is_not_reported_as_a_wrong_password(
        tmp_path: Path, clock: trio.testing.MockClock) -> None:
    async with memory_cluster(tmp_path, 3) as cluster:
        only_roles(cluster, "recovery")  # reads and recovery, no plain adds
        async with ledgerd.open_client(store=cluster.store, connect=cluster.connect,
                                       **client_settings()) as client:
            lh = await client.create_ledger(3, 2, 2, password=b"right")
            with pytest.raises(AccessDeniedError) as caught:
                await lh.append(b"x")
    message = str(caught.value)
    assert "wrong password" not in message
    assert "the password is right" in message and "'client'" in message


async def test_the_recovery_credential_cannot_lock_a_writer_out_of_a_new_ledger(
        tmp_path: Path, clock: trio.testing.MockClock) -> None:
    """Anyone holding the cluster secret sends a plain ADD with the recovery credential
    to a new ledger's bookies before its writer's first add: refused, so the writer's
    key binds there as it should (it used to bind the credential, and the writer's
    adds were then UNAUTHORIZED)."""
    async with memory_cluster(tmp_path, 3, cluster_secret=SECRET) as cluster, \
            ledgerd.open_client(store=cluster.store, connect=cluster.connect,
                                **client_settings()) as writer:
        lh = await writer.create_ledger(3, 2, 2, password=b"right")
        lid = lh.ledger_id
        forged = AddRequest(ledger_id=lid, first_entry_id=0, flags=0,
                            master_key=recovery_key(SECRET, lid),
                            entries=(encode_entry(Digester(DigestType.CRC32C), lid, 0, -1, 1,
                                                  b"x"),))
        for bookie in lh.metadata.last_ensemble[1]:
            async with open_bookie_client(bookie, connect=cluster.connect) as c:
                assert (await c.call(forged))[0] == Status.UNAUTHORIZED
        for i in range(4):
            await lh.append(b"%d" % i)
        await lh.close()
        rh = await writer.open_ledger(lid, b"right")
        assert [e.payload async for e in rh.read()] == [b"0", b"1", b"2", b"3"]


async def test_a_recovery_the_bookies_refuse_leaves_the_live_writer_writing(
        tmp_path: Path, clock: trio.testing.MockClock) -> None:
    async with memory_cluster(tmp_path, 4, cluster_secret=SECRET) as cluster, \
            ledgerd.open_client(store=cluster.store, connect=cluster.connect,
                                **client_settings()) as writer:
        lh = await writer.create_ledger(3, 2, 2, password=b"right")
        for i in range(5):
            await lh.append(b"%d" % i)
        lid = lh.ledger_id

        # A principal with no role for fencing reads, holding the right password.
        only_roles(cluster, "admin")
        async with ledgerd.open_client(store=cluster.store, connect=cluster.connect,
                                       **client_settings()) as reader:
            with pytest.raises(AccessDeniedError, match="the password is right"):
                await reader.open_ledger(lid, b"right")
        assert (await writer.ledger_metadata(lid)).state is LedgerState.OPEN

        # The recovery credential of another cluster secret (a worker misconfigured).
        only_roles(cluster, "recovery")
        async with ledgerd.open_client(store=cluster.store, connect=cluster.connect,
                                       **client_settings()) as worker:
            with pytest.raises(AccessDeniedError, match="recovery credential"):
                await recover_ledger(
                    worker.ledgers, worker.pool, lid,
                    recovery_key(b"another-secret-of-some-length", lid),
                    Digester(DigestType.CRC32C), read_timeout=1, add_timeout=1,
                    writable=worker.writable_bookies, rng=worker.rng)
        assert (await writer.ledger_metadata(lid)).state is LedgerState.OPEN

        # The writer never noticed: it writes on, changes ensemble, and closes.
        only_roles(cluster, "*")
        await lh.append(b"5")
        gone = cluster[lh.metadata.last_ensemble[1][0]]
        gone.gate.refuse_connects = True
        await gone.gate.reset()
        await lh.append(b"6")
        await lh.close()
        md = await writer.ledger_metadata(lid)
        assert md.state is LedgerState.CLOSED and md.last_entry_id == 6
        assert len(md.ensembles) == 2  # it replaced the bookie it lost


async def test_a_refused_takeover_leaves_an_unbounded_ledger_to_the_next_leader_or_worker(
        tmp_path: Path, clock: trio.testing.MockClock) -> None:
    """Seed 002: a takeover raises the term in the metadata first, and terms never go
    back, so a takeover the bookies refuse leaves the ledger IN_RECOVERY at the raised
    term, as a takeover that died would. From there the next leader takes it over
    again, and so does a replication worker that must heal it (it used to retry the
    split of its open fragment, which no IN_RECOVERY ledger accepts, and fail forever);
    nothing acknowledged is lost, and the deposed writer learns it at its next change."""
    async with memory_cluster(tmp_path, 5, cluster_secret=SECRET) as cluster, \
            ledgerd.open_client(store=cluster.store, connect=cluster.connect,
                                **client_settings()) as writer:
        lh = await writer.create_unbounded_ledger(3, 2, 2, password=b"pw")
        for i in range(10):
            await lh.append(b"%d" % i)
        await trio.sleep(1)  # idle: its explicit LAC is on the bookies
        lid, term = lh.ledger_id, lh.metadata.term

        only_roles(cluster, "recovery")
        async with ledgerd.open_client(store=cluster.store, connect=cluster.connect,
                                       **client_settings()) as worker:
            with pytest.raises(AccessDeniedError, match="recovery credential"):
                await take_over(worker.ledgers, worker.pool, lid,
                                recovery_key(b"another-secret-of-some-length", lid),
                                Digester(DigestType.CRC32C), read_timeout=1, add_timeout=1,
                                writable=worker.writable_bookies, rng=worker.rng)
        only_roles(cluster, "*")
        md = await writer.ledger_metadata(lid)
        assert (md.state, md.term) == (LedgerState.IN_RECOVERY, term + 1)

        # A bookie of its open fragment is lost: after the grace period the worker
        # takes the ledger over (the split could never land) and heals it.
        lost = md.last_ensemble[1][1]
        cluster[lost].gate.refuse_connects = True
        await cluster[lost].gate.reset()
        await BookieRegistry(cluster.store, "/ledgers").unregister(lost)
        async with ledgerd.open_client(store=cluster.store, connect=cluster.connect,
                                       **client_settings()) as worker:
            with trio.fail_after(120):
                result = await rereplicate_ledger(
                    worker, lid, Credentials(cluster_secret=SECRET),
                    ReplicationOptions(read_timeout=1, add_timeout=1), close_open=True)
        assert result.outcome is Outcome.REPLICATED, result.detail
        md = await writer.ledger_metadata(lid)
        assert md.state is LedgerState.OPEN and md.term > term + 1
        assert all(lost not in ens for _, ens in md.ensembles)
        assert entries_below_qw(md, set(cluster.bookies) - {lost}, max(md.noops)) == []

        # The deposed writer learns it; the next leader takes over and writes on.
        with pytest.raises(LeadershipLostError):
            for i in range(10, 20):
                await lh.append(b"%d" % i)
        async with ledgerd.open_client(store=cluster.store, connect=cluster.connect,
                                       **client_settings()) as leader:
            nh = await leader.take_over_ledger(lid, b"pw")
            assert (await leader.ledger_metadata(lid)).term > md.term
            await nh.append(b"next")
            await trio.sleep(1)
            rh = await leader.open_ledger(lid, b"pw", recovery=False)
            lac = await rh.read_lac()
            got = [e.payload async for e in rh.read(0, lac)]
        assert got[:10] == [b"%d" % i for i in range(10)] and got[-1] == b"next"
