"""A follower of an unbounded ledger over real bookies (memory streams): it never returns
a value other than the one acknowledged at an id (issue 45 §3).

The schedule, as the simulator's ``run_recovery_change_scenario``: E2/Qw2/Qa2 on bookies
A, B and a spare. The first leader acknowledges ids 0..4; its adds of ids 5 and 6 reach
A only (written here as the bytes it would have sent). A follower opens the ledger
without recovery, holding the fragment list (0: A, B). A second leader takes over while
A is down: its recovery finds id 5 absent on B, and its TRUNCATE no-op at 5 cannot reach
A, so the recovery moves the fragment to the spare; it then acknowledges its own ids
6..8. B, in both fragments, tells the follower a LAC of 8. Read with the metadata it
opened with, ids 5 and 6 are A's (a range read goes to the first bookie), where the
deposed leader's values still are.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
import trio.testing

import ledgerd
from ledgerd.wire.entry import Digester, DigestType, encode_entry, master_key
from ledgerd.wire.messages import AddRequest
from ledgerd.wire.status import Status
from tests.ledgerd.memcluster import MemoryCluster, client_settings, memory_cluster

PW = b"pw"


@pytest.fixture
def clock(mock_clock: trio.testing.MockClock) -> trio.testing.MockClock:
    mock_clock.autojump_threshold = 0.05
    return mock_clock


async def _deposed_adds_on(client: ledgerd.Client, bookie: str, lid: int) -> None:
    """The first leader's adds of ids 5 and 6, which reached ``bookie`` only."""
    md = await client.ledger_metadata(lid)
    digester = Digester(DigestType(md.digest_type), PW)
    length = md.length
    for eid in (5, 6):
        payload = b"c1-%d" % eid
        length += len(payload)
        req = AddRequest(ledger_id=lid, first_entry_id=eid, master_key=master_key(PW),
                         term=md.term, entries=(encode_entry(digester, lid, eid, 4, length,
                                                             payload),))
        status, _, why = await client.pool.call(bookie, req, 5)
        assert status == Status.OK, why


@asynccontextmanager
async def _down(cluster: MemoryCluster, bookie: str) -> AsyncIterator[None]:
    """``bookie`` refuses connections (and drops the open ones), so nothing sent while
    it is down reaches it later."""
    cluster[bookie].gate.refuse_connects = True
    await cluster[bookie].gate.reset()
    try:
        yield
    finally:
        cluster[bookie].gate.refuse_connects = False


async def _take_over_and_write(client: ledgerd.Client, lid: int, spare: str) -> None:
    w2 = await client.take_over_ledger(lid, PW)
    for i in range(3):
        await w2.append(b"c2-%d" % i)
    assert w2.last_add_confirmed == 8
    await w2.abandon()
    now = await client.ledger_metadata(lid)
    assert now.ensembles[-1][0] <= 5 and spare in now.ensembles[-1][1], now.ensembles


@pytest.mark.parametrize("how", ["read_lac", "wait_lac_beyond"])
async def test_a_follower_reads_past_a_takeover_only_acknowledged_values(
        tmp_path: Path, clock: trio.testing.MockClock, how: str) -> None:
    async with memory_cluster(tmp_path, 3) as cluster, \
            ledgerd.open_client(store=cluster.store, connect=cluster.connect,
                                **client_settings()) as client:
        w1 = await client.create_unbounded_ledger(2, 2, 2, password=PW)
        lid = w1.ledger_id
        for i in range(5):
            await w1.append(b"c1-%d" % i)
        a, b = w1.ensemble
        spare = next(x for x in cluster.bookies if x not in (a, b))
        await w1.abandon()  # the LAC (4) written out; then the writer is gone
        await _deposed_adds_on(client, a, lid)

        # The follower opens now: its fragment list is (0: A, B).
        rh = await client.open_ledger(lid, PW, recovery=False)
        assert await rh.read_lac() == 4
        assert rh.metadata.ensembles == ((0, (a, b)),)

        async with _down(cluster, a):
            await _take_over_and_write(client, lid, spare)

        if how == "read_lac":
            assert await rh.read_lac() == 8
        else:
            assert await rh.wait_lac_beyond(4, timeout=5) == 8
        cluster[b].gate.freeze()  # entry reads go to A (old list) or the spare (new one)
        got = [(e.entry_id, e.payload) async for e in rh.read(5, 6)]
        # Read with the metadata it opened with, this was [(5, b"c1-5"), (6, b"c1-6")]:
        # the deposed leader's values, never acknowledged (5 is the no-op, skipped).
        assert got == [(6, b"c2-0")]
        got += [(e.entry_id, e.payload) async for e in rh.read(7)]
        cluster[b].gate.thaw()
        assert got == [(6, b"c2-0"), (7, b"c2-1"), (8, b"c2-2")]
        # The follower moved to the metadata of after the takeover.
        assert rh.metadata.term == (await client.ledger_metadata(lid)).term


async def test_follow_log_of_an_unbounded_log_returns_only_acknowledged_entries(
        tmp_path: Path, clock: trio.testing.MockClock) -> None:
    async with memory_cluster(tmp_path, 3) as cluster, \
            ledgerd.open_client(store=cluster.store, connect=cluster.connect,
                                **client_settings()) as client:
        w1 = await client.logs.open_writer("ub", 2, 2, 2, unbounded=True, password=PW)
        for i in range(5):
            await w1.append(b"c1-%d" % i)
        lid = w1.ledger_id
        a, b = w1.handle.ensemble
        spare = next(x for x in cluster.bookies if x not in (a, b))
        await w1.handle.abandon()
        await _deposed_adds_on(client, a, lid)

        follower = client.logs.follow("ub", PW, poll_s=0.5)
        got = [(await anext(follower)).payload for _ in range(5)]  # opened: (0: A, B)
        assert got == [b"c1-%d" % i for i in range(5)]
        async with _down(cluster, a):
            await _take_over_and_write(client, lid, spare)
        await trio.sleep(40)  # A's refusals forgotten (failure_memory): reads may go to A
        with trio.fail_after(30):
            # Its old list sent a range read from id 5 to A: b"c1-5", b"c1-6".
            got += [(await anext(follower)).payload for _ in range(3)]
        assert got[5:] == [b"c2-0", b"c2-1", b"c2-2"]
        await follower.aclose()  # type: ignore[attr-defined]
