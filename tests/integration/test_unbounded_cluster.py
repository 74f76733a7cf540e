"""Unbounded ledgers with terms on real bookie processes and the real ZooKeeper: a
leader taken over while it writes, fragments rolled by the cap and trimmed."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable

import pytest
import trio

import ledgerd
from ledgerd.errors import LeadershipLostError, LedgerdError
from ledgerd.tools.bookieprocess import BookieProcess
from tests.cluster import start_bookies

Factory = Callable[..., BookieProcess]


async def test_takeover_while_the_leader_writes_loses_nothing(bookie_factory: Factory,
                                                              zk_chroot: str) -> None:
    """Leader A writes; B raises the term while A still writes. A gets the leadership
    error, nothing A had acknowledged is lost, and no reader ever sees an entry that
    later disappears."""
    await start_bookies(bookie_factory, zk_chroot, 4)
    acked_a: dict[int, bytes] = {}
    seen: dict[int, bytes] = {}
    async with ledgerd.open_client(zk_chroot, throttle=0) as a, \
            ledgerd.open_client(zk_chroot, throttle=0) as b, \
            ledgerd.open_client(zk_chroot) as reader:
        wa = await a.create_unbounded_ledger(3, 3, 2, password=b"pw")
        lid = wa.ledger_id
        lost = trio.Event()
        enough = trio.Event()
        want: dict[str, int] = {}  # "last": the id the tail reader must reach
        caught_up = trio.Event()

        async def write_a() -> None:
            n = 0
            pending = []
            try:
                while True:
                    data = b"a-%d" % n
                    p = await wa.submit(data)
                    pending.append((p, data))
                    n += 1
                    while pending and pending[0][0].done:
                        p0, d0 = pending.pop(0)
                        acked_a[await p0] = d0
                    if len(acked_a) >= 500:
                        # B takes over once A has 500 acknowledged (not merely sent:
                        # under CI load B's takeover once won the race against A's
                        # first acks, and there was nothing of A's left to check).
                        enough.set()
                    if n % 50 == 0:
                        await trio.lowlevel.checkpoint()  # let the takeover in
            except LeadershipLostError:
                for p0, d0 in pending:  # completed before the loss still count
                    if p0.done:
                        try:
                            acked_a[await p0] = d0
                        except LeadershipLostError:
                            pass
                lost.set()

        async def tail() -> None:
            rh = await reader.open_ledger(lid, b"pw", recovery=False)
            nxt = 0
            while True:
                lac = await rh.wait_lac_beyond(nxt - 1, timeout=1.0)
                if lac >= nxt:
                    async for e in rh.read(nxt, lac):
                        seen[e.entry_id] = e.payload
                    nxt = lac + 1
                    if want.get("last", lac + 1) <= lac:
                        caught_up.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(write_a)
            nursery.start_soon(tail)
            await enough.wait()
            wb = await b.take_over_ledger(lid, b"pw")
            with trio.fail_after(30):
                await lost.wait()
            with pytest.raises(LeadershipLostError, match=r"took the ledger over|term"):
                await wa.append(b"too late")
            ids_b = await wb.append_many([b"b-%d" % i for i in range(100)])
            want["last"] = ids_b[-1]
            if max(seen, default=-1) >= ids_b[-1]:
                caught_up.set()  # it got there first
            with trio.fail_after(30):
                await caught_up.wait()
            nursery.cancel_scope.cancel()
        assert len(acked_a) >= 500 and wb.metadata.term == 3
        rh = await reader.open_ledger(lid, b"pw", recovery=False)
        await rh.read_lac()
        final = {e.entry_id: e.payload async for e in rh.read(0, ids_b[-1])}
    noop = ids_b[0] - 1
    assert noop not in final and rh.metadata.noops == (noop,)
    for eid, data in acked_a.items():
        assert final.get(eid) == data, (eid, data, final.get(eid))
    assert [final[i] for i in ids_b] == [b"b-%d" % i for i in range(100)]
    assert all(final.get(eid) == data for eid, data in seen.items()), "a seen entry changed"
    assert sorted(final) == [i for i in range(ids_b[-1] + 1) if i != noop]


async def test_fragments_roll_at_the_cap_and_trim_from_the_front(bookie_factory: Factory,
                                                                 zk_chroot: str) -> None:
    bookies = await start_bookies(bookie_factory, zk_chroot, 4)
    async with ledgerd.open_client(zk_chroot, throttle=0, unbounded_fragment_entries=50) as c:
        w = await c.create_unbounded_ledger(3, 2, 2)
        ids = await w.append_many([b"e-%d" % i for i in range(260)])
        assert ids == list(range(260))
        md = await c.ledger_metadata(w.ledger_id)
        assert [f for f, _ in md.ensembles] == [0, 50, 100, 150, 200, 250]
        md = await c.trim_ledger(w.ledger_id, 120)
        assert md.start_entry == 100 and len(md.ensembles) == 4
        rh = await c.open_ledger(w.ledger_id, recovery=False)
        # The batch's entries carry the LAC of when they were sent; the idle writer's
        # explicit LAC (explicit_lac_interval_ms) makes the last ones visible.
        assert await rh.wait_lac_beyond(258, timeout=10) == 259
        with pytest.raises(ValueError, match="trimmed"):
            await rh.read_entry(10)
        assert await rh.read_entry(100) == b"e-100"
        with pytest.raises(LedgerdError, match="unbounded"):
            await c.open_ledger(w.ledger_id)
        await w.append(b"after trim")
        # Each bookie's GC drops the trimmed entries it held: ids 0..99 at Qw = 2.
        trimmed = 0
        for b in bookies:
            done = await trio.run_process(
                [sys.executable, "-m", "ledgerd.tools.cli", "shell", "gc", "--bookie", b.address,
                 "--wait", "--json"], capture_stdout=True, capture_stderr=True)
            trimmed += json.loads(done.stdout)["entries_trimmed"]
        assert trimmed == 100 * 2
        assert await rh.read_entry(100) == b"e-100"
        assert await rh.read_entry(259) == b"e-259"
