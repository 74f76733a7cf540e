"""A follower of an unbounded ledger over real bookies (memory streams): it never returns
a value other than the one acknowledged at an id (issue 45 §3).

The schedule, as the simulator's ``run_recovery_change_scenario``: E2/Qw2/Qa2 on bookies
A, B and a spare. The first leader acknowledges ids 0..4; its adds of ids 5 and 6 reach
A only (written here as the bytes it would have sent). A follower opens the ledger
without recovery, holding the fragment list (0: A, B). A second leader takes over while
A is down: its recovery finds id 5 absent on B, and its TRUNCATE no-op at 5 cannot reach
A, so the recovery moves the fragment to the spare; it then acknowledges its own ids
6..8. B, in both fragments, tells the follower a LAC of 8. Read with the metadata it
opened with, id 6 is A's, where the deposed leader's value still is.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing

import ledgerd
from ledgerd.handles import ReadHandle
from ledgerd.wire.entry import Digester, DigestType, encode_entry, master_key
from ledgerd.wire.messages import AddRequest
from ledgerd.wire.status import Status
from tests.ledgerd.memcluster import client_settings, memory_cluster

PW = b"pw"


@pytest.fixture
def clock(mock_clock: trio.testing.MockClock) -> trio.testing.MockClock:
    mock_clock.autojump_threshold = 0.05
    return mock_clock


async def _learn_lac(rh: ReadHandle, how: str) -> int:
    if how == "read_lac":
        return await rh.read_lac()
    return await rh.wait_lac_beyond(4, timeout=5)


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

        # The deposed leader's adds of ids 5 and 6, which reached A only.
        md = await client.ledger_metadata(lid)
        digester = Digester(DigestType(md.digest_type), PW)
        length = md.length
        for eid in (5, 6):
            payload = b"c1-%d" % eid
            length += len(payload)
            req = AddRequest(ledger_id=lid, first_entry_id=eid, master_key=master_key(PW),
                             term=md.term, entries=(encode_entry(digester, lid, eid, 4,
                                                                 length, payload),))
            status, _, why = await client.pool.call(a, req, 5)
            assert status == Status.OK, why

        # The follower opens now: its fragment list is (0: A, B).
        rh = await client.open_ledger(lid, PW, recovery=False)
        assert await rh.read_lac() == 4
        assert rh.metadata.ensembles == ((0, (a, b)),)

        # A is down while the second leader takes over (connections refused, so nothing
        # of the takeover reaches A later).
        cluster[a].gate.refuse_connects = True
        await cluster[a].gate.reset()
        w2 = await client.take_over_ledger(lid, PW)
        for i in range(3):
            await w2.append(b"c2-%d" % i)
        assert w2.last_add_confirmed == 8
        await w2.abandon()
        now = await client.ledger_metadata(lid)
        assert now.ensembles[-1][0] <= 5 and spare in now.ensembles[-1][1], now.ensembles
        cluster[a].gate.refuse_connects = False

        lac = await _learn_lac(rh, how)
        assert lac == 8
        cluster[b].gate.freeze()  # the reads go to A (old list) or the spare (new one)
        got = [(e.entry_id, e.payload) async for e in rh.read(5, 6)]
        # Read with the metadata it opened with, this was [(5, b"c1-5"), (6, b"c1-6")]:
        # the deposed leader's values, never acknowledged (5 is the no-op, skipped).
        assert got == [(6, b"c2-0")]
        got += [(e.entry_id, e.payload) async for e in rh.read(7)]
        cluster[b].gate.thaw()
        assert got == [(6, b"c2-0"), (7, b"c2-1"), (8, b"c2-2")]
        # The follower moved to the metadata of after the takeover.
        assert rh.metadata.term == now.term
