"""Re-replication over real bookies on memory streams: copy, CAS, and what must not break.

Every check reads the bookies' storage directly: a ledger is whole when each bookie of
each fragment holds exactly the entries of its write set, byte for byte.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import trio
import trio.testing

import ledgerd
from ledgerd.disk.errors import EntryNotFoundError, LedgerNotFoundError
from ledgerd.errors import LeadershipLostError
from ledgerd.machines.changes import (
    FragmentChangedError,
    TermChangedError,
    abandon_recovery,
    begin_term,
    change_ensemble,
    open_term,
    split_open_fragment,
)
from ledgerd.machines.checker import (
    entries_below_qw,
    fragments,
    stored_runs,
    takeover_unfinished,
)
from ledgerd.metadata.errors import ChangeRejectedError
from ledgerd.metadata.ledger import LedgerMetadata, LedgerState
from ledgerd.metadata.registry import BookieRegistry
from ledgerd.replication import (
    Credentials,
    LedgerResult,
    Outcome,
    ReplicationOptions,
    rereplicate_ledger,
)
from ledgerd.wire.entry import Digester, DigestType, encode_entry, peek_entry_header
from ledgerd.wire.entry_check import unkeyed_entry
from ledgerd.wire.errors import EntryFormatError
from tests.ledgerd.memcluster import MemoryCluster, client_settings, memory_cluster

SECRET = b"cluster-secret-for-tests-0123456789"
CREDS = Credentials(cluster_secret=SECRET)
OPTS = ReplicationOptions(batch_entries=7, outstanding=3, read_timeout=1, add_timeout=1)


@pytest.fixture
def clock(mock_clock: trio.testing.MockClock) -> trio.testing.MockClock:
    mock_clock.autojump_threshold = 0.05
    return mock_clock


def whole(cluster: MemoryCluster, lid: int, md: LedgerMetadata,
          expected: dict[int, bytes]) -> list[str]:
    """What is missing or wrong: every entry on every bookie of its write set."""
    problems = []
    for frag in fragments(md):
        for index, bookie in enumerate(frag.ensemble):
            for a, b in stored_runs(frag.first, frag.last, md.ensemble_size, md.write_quorum,
                                    index):
                for e in range(a, b + 1):
                    try:
                        data = cluster[bookie].storage.read_entry(lid, e)
                    except (EntryNotFoundError, LedgerNotFoundError):
                        problems.append(f"{bookie} lacks entry {e}")
                        continue
                    if not data.endswith(expected[e]):
                        problems.append(f"{bookie} holds other bytes for entry {e}")
    return problems


async def wait_fragments(client: ledgerd.Client, ledger_id: int, n: int) -> LedgerMetadata:
    """The ledger's stored metadata once it has ``n`` fragments (woken by its watch)."""
    async with client.ledgers.watch(ledger_id) as changes:
        while len((md := await client.ledger_metadata(ledger_id)).ensembles) < n:
            await changes.__anext__()
    return md


async def lose(cluster: MemoryCluster, bookie: str) -> None:
    """The bookie is gone for good: deregistered and refusing connections."""
    cluster[bookie].gate.refuse_connects = True
    await cluster[bookie].gate.reset()
    await BookieRegistry(cluster.store, "/ledgers").unregister(bookie)


@pytest.mark.parametrize("quorums", [(3, 2, 2), (3, 3, 2), (2, 2, 1)])
async def test_a_lost_bookie_is_copied_back_to_qw_copies(
        tmp_path: Path, clock: trio.testing.MockClock, quorums: tuple[int, int, int]) -> None:
    async with memory_cluster(tmp_path, 4, cluster_secret=SECRET) as cluster, \
            ledgerd.open_client(store=cluster.store, connect=cluster.connect,
                                **client_settings()) as client:
        lh = await client.create_ledger(*quorums, password=b"secret pw")
        payloads = {i: b"entry %d " % i + bytes(i % 50) for i in range(40)}
        for i in range(40):
            await lh.append(payloads[i])
        await lh.close()
        lost = lh.metadata.ensembles[0][1][1]
        await lose(cluster, lost)
        with trio.fail_after(60):
            result = await rereplicate_ledger(client, lh.ledger_id, CREDS, OPTS)
        assert result.outcome is Outcome.REPLICATED, result.detail
        assert result.fragments == 1
        md = await client.ledger_metadata(lh.ledger_id)
        assert lost not in md.ensembles[0][1]
        assert md.is_closed and md.last_entry_id == 39
        assert whole(cluster, lh.ledger_id, md, payloads) == []
        e, qw = quorums[0], quorums[1]
        assert result.entries == sum(b - a + 1 for a, b in stored_runs(0, 39, e, qw, 1))
        # Nothing bad left: a second pass copies nothing; the password still reads it.
        again = await rereplicate_ledger(client, lh.ledger_id, CREDS, OPTS)
        assert (again.outcome, again.fragments) == (Outcome.REPLICATED, 0)
        rh = await client.open_ledger(lh.ledger_id, b"secret pw")
        assert [x.payload async for x in rh.read()] == [payloads[i] for i in range(40)]


async def test_only_the_lacking_fragment_changes_and_an_open_ledger_waits(
        tmp_path: Path, clock: trio.testing.MockClock) -> None:
    async with memory_cluster(tmp_path, 5, cluster_secret=SECRET) as cluster, \
            ledgerd.open_client(store=cluster.store, connect=cluster.connect,
                                **client_settings()) as client:
        lh = await client.create_ledger(3, 3, 2)
        for i in range(10):
            await lh.append(b"a%d" % i)
        first = lh.metadata.ensembles[0][1]
        # A bookie freezes: the appends complete at Qa = 2 without it, and its add
        # timeout after completion still replaces it (a writer must not keep writing
        # Qw - 1 copies), so the ledger has two fragments.
        cluster[first[0]].gate.freeze()
        for i in range(10, 20):
            await lh.append(b"a%d" % i)
        with trio.fail_after(10):
            md = await wait_fragments(client, lh.ledger_id, 2)
        cluster[first[0]].gate.thaw()
        assert len(md.ensembles) == 2
        second = md.ensembles[1][1]
        lost = next(b for b in first[1:] if b in second)
        await lose(cluster, lost)
        # The writer is alive and the last fragment holds the lost bookie: the first
        # fragment is copied, the last one waits for the writer (DEFERRED).
        result = await rereplicate_ledger(client, lh.ledger_id, CREDS, OPTS)
        assert result.outcome is Outcome.DEFERRED and result.fragments == 1
        md = await client.ledger_metadata(lh.ledger_id)
        assert lost not in md.ensembles[0][1] and md.ensembles[1][1] == second
        assert not md.is_closed
        # With close_open (the grace period ran out), recovery fences and closes it:
        # the writer learns it was fenced (or closed, if its own ensemble change for the
        # lost bookie met the closed metadata first).
        result = await rereplicate_ledger(client, lh.ledger_id, CREDS, OPTS, close_open=True)
        assert result.outcome is Outcome.REPLICATED and result.closed_by_recovery
        md = await client.ledger_metadata(lh.ledger_id)
        assert md.is_closed and md.last_entry_id == 19
        assert all(lost not in ens for _, ens in md.ensembles)
        payloads = {i: b"a%d" % i for i in range(20)}
        assert whole(cluster, lh.ledger_id, md, payloads) == []
        with pytest.raises((ledgerd.LedgerFencedError, ledgerd.LedgerClosedError)):
            await lh.append(b"late")


async def test_deleted_ledger_is_done_and_unreadable_entries_fail_clearly(
        tmp_path: Path, clock: trio.testing.MockClock) -> None:
    async with memory_cluster(tmp_path, 4, cluster_secret=SECRET) as cluster, \
            ledgerd.open_client(store=cluster.store, connect=cluster.connect,
                                **client_settings()) as client:
        lh = await client.create_ledger(2, 2, 2)
        await lh.append(b"x")
        await lh.close()
        await client.delete_ledger(lh.ledger_id)
        result = await rereplicate_ledger(client, lh.ledger_id, CREDS, OPTS)
        assert result.outcome is Outcome.DELETED
        lh = await client.create_ledger(2, 2, 2)
        await lh.append(b"y")
        await lh.close()
        for b in lh.metadata.ensembles[0][1]:
            await lose(cluster, b)
        result = await rereplicate_ledger(client, lh.ledger_id, CREDS, OPTS)
        assert result.outcome is Outcome.FAILED and result.unreadable
        assert "entry 0: no surviving replica could be read" in result.detail


async def test_without_the_secret_bookies_refuse_the_copy(
        tmp_path: Path, clock: trio.testing.MockClock) -> None:
    async with memory_cluster(tmp_path, 3, cluster_secret=SECRET) as cluster, \
            ledgerd.open_client(store=cluster.store, connect=cluster.connect,
                                **client_settings()) as client:
        lh = await client.create_ledger(2, 2, 2, password=b"pw")
        await lh.append(b"x")
        await lh.close()
        await lose(cluster, lh.metadata.ensembles[0][1][0])
        wrong = Credentials(cluster_secret=b"another-secret-of-some-length")
        result = await rereplicate_ledger(client, lh.ledger_id, wrong, OPTS)
        assert result.outcome is Outcome.FAILED
        assert "refused the recovery credential" in result.detail
        # The ledger's own password works without any secret (an operator's recover).
        result = await rereplicate_ledger(client, lh.ledger_id, Credentials(password=b"pw"),
                                          OPTS)
        assert result.outcome is Outcome.REPLICATED


async def test_racks_spread_replacements(tmp_path: Path, clock: trio.testing.MockClock) -> None:
    racks = {0: "/r1", 1: "/r1", 2: "/r2", 3: "/r2", 4: "/r3"}
    async with memory_cluster(tmp_path, 5, cluster_secret=SECRET, racks=racks) as cluster, \
            ledgerd.open_client(store=cluster.store, connect=cluster.connect,
                                **client_settings()) as client:
        for _ in range(10):
            lh = await client.create_ledger(3, 3, 2)
            rack_of = {f"b{i}:3181": r for i, r in racks.items()}
            assert len({rack_of[b] for b in lh.metadata.ensembles[0][1]}) == 3
            await lh.close()


async def test_copy_to_a_given_target_beside_a_live_writers_ensemble_change(
        tmp_path: Path, clock: trio.testing.MockClock) -> None:
    async with memory_cluster(tmp_path, 6, cluster_secret=SECRET) as cluster, \
            ledgerd.open_client(store=cluster.store, connect=cluster.connect,
                                **client_settings()) as client:
        lh = await client.create_ledger(3, 3, 2)
        payloads = {i: b"w%d" % i for i in range(60)}
        for i in range(30):
            await lh.append(payloads[i])
        first = lh.metadata.ensembles[0][1]
        cluster[first[0]].gate.freeze()  # the writer moves on: fragment 0 is final
        for i in range(30, 40):
            await lh.append(payloads[i])
        with trio.fail_after(10):
            md = await wait_fragments(client, lh.ledger_id, 2)
        cluster[first[0]].gate.thaw()
        lost = first[1]
        await lose(cluster, lost)
        spare = sorted(set(cluster.bookies) - set(first) - set(md.last_ensemble[1]))
        target = spare[0]
        # The copy and the writer's own reaction to the lost bookie (an ensemble change
        # of the last fragment) race on the same metadata node; both must land.
        async with trio.open_nursery() as nursery:
            box: list[object] = []

            async def copy() -> None:
                box.append(await rereplicate_ledger(client, lh.ledger_id, CREDS, OPTS,
                                                    target=target))

            nursery.start_soon(copy)
            for i in range(40, 60):
                await lh.append(payloads[i])
        result = box[0]
        assert isinstance(result, LedgerResult)
        # DEFERRED if it looked before the writer replaced the bookie in the last fragment.
        assert result.outcome in (Outcome.REPLICATED, Outcome.DEFERRED), result.detail
        assert result.fragments == 1
        await lh.close()
        md = await client.ledger_metadata(lh.ledger_id)
        assert md.ensembles[0][1] == tuple(target if b == lost else b for b in first)
        assert all(lost not in ens for _, ens in md.ensembles[1:])  # the writer replaced it
        assert md.last_entry_id == 59
        assert whole(cluster, lh.ledger_id, md, payloads) == []


# -- unbounded ledgers' open fragments ----------------------------------------------------

A, B, C, D = (f"b{i}:1" for i in range(4))


def unbounded_md(ensembles: tuple[tuple[int, tuple[str, ...]], ...], term: int = 3,
                 state: LedgerState = LedgerState.OPEN) -> LedgerMetadata:
    return LedgerMetadata(ensemble_size=3, write_quorum=2, ack_quorum=2, ensembles=ensembles,
                          unbounded=True, term=term, state=state)


def test_split_open_fragment_heals_up_to_the_lac_and_keeps_the_writers_ensemble() -> None:
    m = unbounded_md(((0, (A, B, C)), (10, (A, B, C))))
    out = split_open_fragment(m, 10, 29, {1: (B, D)}, term=3)
    assert out.ensembles == ((0, (A, B, C)), (10, (A, D, C)), (30, (A, B, C)))
    assert split_open_fragment(out, 10, 29, {1: (B, D)}, term=3) is out  # a retry
    # The writer's own ensemble change, from its LAC + 1 (never below a bookie's LAC),
    # lands on top of the split: its last ensemble is as it left it.
    moved = change_ensemble(out, (A, B, C), 35, (A, C, D), term=3)
    assert moved.ensembles[-2:] == ((30, (A, B, C)), (35, (A, C, D)))
    # Nothing acknowledged in the fragment yet: nothing to re-point.
    assert split_open_fragment(m, 10, 9, {1: (B, D)}, term=3) is m


def test_split_open_fragment_refuses_a_moved_writer_a_new_term_or_a_takeover() -> None:
    m = unbounded_md(((0, (A, B, C)),))
    with pytest.raises(FragmentChangedError):  # the writer ended that fragment itself
        split_open_fragment(m.with_ensemble(20, (A, C, D)), 0, 9, {1: (B, D)}, term=3)
    with pytest.raises(TermChangedError):  # another leader took over
        split_open_fragment(replace(m, term=4), 0, 9, {1: (B, D)}, term=3)
    with pytest.raises(FragmentChangedError):  # a takeover is recovering it
        split_open_fragment(replace(m, state=LedgerState.IN_RECOVERY), 0, 9, {1: (B, D)},
                            term=3)
    with pytest.raises(FragmentChangedError):  # someone replaced that bookie already
        split_open_fragment(m, 0, 9, {1: (C, D)}, term=3)


def test_only_an_unbounded_ledger_left_in_recovery_is_an_unfinished_takeover() -> None:
    m = unbounded_md(((0, (A, B, C)),))
    assert not takeover_unfinished(m)
    stuck = begin_term(m)  # a takeover raised the term; the bookies then refused it
    assert takeover_unfinished(stuck) and stuck.term == m.term + 1
    with pytest.raises(ChangeRejectedError):
        abandon_recovery(stuck)  # terms never go back: never OPEN again at that term
    with pytest.raises(FragmentChangedError):  # no split lands on it
        split_open_fragment(stuck, 0, 9, {1: (B, D)}, term=stuck.term)
    again = begin_term(stuck)  # the next takeover proceeds from there
    assert again.term == m.term + 2
    assert open_term(again, again.term, {}, [9]).state is LedgerState.OPEN
    bounded = LedgerMetadata(ensemble_size=3, write_quorum=2, ack_quorum=2,
                             ensembles=((0, (A, B, C)),), state=LedgerState.IN_RECOVERY)
    assert not takeover_unfinished(bounded)  # a bounded one's recovery closes it

def test_entries_below_qw_counts_final_fragments_and_the_open_one_up_to_the_lac() -> None:
    m = unbounded_md(((0, (A, B, C)), (10, (A, B, C))))
    # E3/Qw2: index 1 (B) holds the entries whose write set starts at index 0 or 1.
    assert entries_below_qw(m, {A, C, D}, lac=-1) == stored_runs(0, 9, 3, 2, 1)
    assert entries_below_qw(m, {A, C, D}, lac=15) == stored_runs(0, 15, 3, 2, 1)
    assert entries_below_qw(m, {A, B, C}, lac=15) == []
    healed = split_open_fragment(m, 10, 15, {1: (B, D)}, term=3)
    assert entries_below_qw(healed, {A, C, D}, lac=15) == stored_runs(0, 9, 3, 2, 1)


def test_unkeyed_checks_catch_what_needs_no_key() -> None:
    d = Digester(DigestType.HMAC, b"pw")
    e0 = encode_entry(d, 7, 0, -1, 5, b"hello")
    e1 = encode_entry(d, 7, 1, 0, 9, b"four")
    assert unkeyed_entry(e0, 20, 7, 0) == (-1, 5)
    assert unkeyed_entry(e1, 20, 7, 1, previous_length=5) == (0, 9)
    with pytest.raises(EntryFormatError):
        unkeyed_entry(e1, 20, 7, 2)  # another entry
    with pytest.raises(EntryFormatError):
        unkeyed_entry(e1 + b"x", 20, 7, 1, previous_length=5)  # a payload grown in place
    with pytest.raises(EntryFormatError):
        unkeyed_entry(e1[:40], 20, 7, 1)  # shorter than header + digest
    with pytest.raises(EntryFormatError):
        unkeyed_entry(encode_entry(d, 7, 1, 1, 9, b"four"), 20, 7, 1)  # LAC not below it


async def test_unbounded_idle_writers_open_fragment_is_healed_and_the_writer_goes_on(
        tmp_path: Path, clock: trio.testing.MockClock) -> None:
    async with memory_cluster(tmp_path, 5, cluster_secret=SECRET) as cluster, \
            ledgerd.open_client(store=cluster.store, connect=cluster.connect,
                                **client_settings()) as client:
        lh = await client.create_unbounded_ledger(3, 2, 2, password=b"pw")
        payloads = {i: b"u%d" % i for i in range(60)}
        for i in range(30):
            await lh.append(payloads[i])
        await trio.sleep(1)  # idle: the explicit LAC tells the bookies entry 29 is in
        ensemble = lh.metadata.ensembles[0][1]
        lost = ensemble[1]
        await lose(cluster, lost)
        # Before the grace period: not healed, and not reported so.
        result = await rereplicate_ledger(client, lh.ledger_id, CREDS, OPTS)
        assert result.outcome is Outcome.DEFERRED and result.fragments == 0
        # After it: entries 0..29 are split off onto a replacement; the writer's
        # ensemble goes on from 30, its term untouched.
        result = await rereplicate_ledger(client, lh.ledger_id, CREDS, OPTS, close_open=True)
        assert result.outcome is Outcome.REPLICATED, result.detail
        assert result.fragments == 1 and not result.closed_by_recovery
        md = await client.ledger_metadata(lh.ledger_id)
        assert [f for f, _ in md.ensembles] == [0, 30] and md.term == lh.metadata.term
        assert lost not in md.ensembles[0][1] and md.ensembles[1][1] == ensemble
        assert whole(cluster, lh.ledger_id, replace(md, ensembles=md.ensembles[:1]).closed(
            29, 0), payloads) == []
        for i in range(30, 60):  # the live writer: moves its own fragment, loses nothing
            assert await lh.append(payloads[i]) == i
        md = await client.ledger_metadata(lh.ledger_id)
        assert all(lost not in ens for _, ens in md.ensembles[1:][-1:])
        await trio.sleep(1)
        rh = await client.open_ledger(lh.ledger_id, b"pw", recovery=False)
        assert await rh.read_lac() == 59
        assert [e.payload async for e in rh.read(0, 59)] == [payloads[i] for i in range(60)]


async def test_unbounded_dead_writers_tail_above_the_lac_is_taken_over_at_qw(
        tmp_path: Path, clock: trio.testing.MockClock) -> None:
    # No explicit LAC: the last acknowledged entry is above every LAC a bookie holds,
    # as with a writer killed with adds in flight.
    async with memory_cluster(tmp_path, 5, cluster_secret=SECRET) as cluster, \
            ledgerd.open_client(store=cluster.store, connect=cluster.connect,
                                **client_settings(explicit_lac_interval_ms=0)) as client:
        lh = await client.create_unbounded_ledger(3, 2, 2, password=b"pw")
        payloads = {i: b"d%d" % i for i in range(30)}
        for i in range(30):
            await lh.append(payloads[i])
        term = lh.metadata.term
        lost = lh.metadata.ensembles[0][1][2]
        await lose(cluster, lost)
        result = await rereplicate_ledger(client, lh.ledger_id, CREDS, OPTS, close_open=True)
        assert result.outcome is Outcome.REPLICATED, result.detail
        assert result.closed_by_recovery
        md = await client.ledger_metadata(lh.ledger_id)
        assert md.term == term + 2 and md.state is LedgerState.OPEN
        assert all(lost not in ens for _, ens in md.ensembles)
        noops = set(md.noops)
        expected = {i: p for i, p in payloads.items()} | {n: b"" for n in noops}
        assert whole(cluster, lh.ledger_id, md.closed(max(noops), 0), expected) == []
        with pytest.raises(LeadershipLostError):
            await lh.append(b"late")  # the silent writer was deposed


def lose_entries(cluster: MemoryCluster, bookie: str, ledger_id: int, before: int,
                 md: LedgerMetadata) -> dict[str, list[tuple[int, int]]]:
    """The bookie forgets its entries below ``before`` (as a damaged index would) and
    its scrubber's report of them: the runs of its write sets there."""
    assert cluster[bookie].storage.trim_ledger(ledger_id, before) > 0
    index = md.ensembles[0][1].index(bookie)
    return {bookie: stored_runs(0, before - 1, md.ensemble_size, md.write_quorum, index)}


async def test_a_report_in_a_bounded_open_fragment_waits_then_closes_and_copies(
        tmp_path: Path, clock: trio.testing.MockClock) -> None:
    async with memory_cluster(tmp_path, 5, cluster_secret=SECRET) as cluster, \
            ledgerd.open_client(store=cluster.store, connect=cluster.connect,
                                **client_settings()) as client:
        lh = await client.create_ledger(3, 2, 2, password=b"pw")
        payloads = {i: b"o%d" % i for i in range(30)}
        for i in range(30):
            await lh.append(payloads[i])
        await trio.sleep(1)  # idle, alive, its bookies all registered
        ensemble = lh.metadata.ensembles[0][1]
        victim = ensemble[1]
        reported = lose_entries(cluster, victim, lh.ledger_id, 12, lh.metadata)
        # Within the grace period: nothing copied, and not reported whole (it used to
        # say REPLICATED, and the worker deleted the mark).
        result = await rereplicate_ledger(client, lh.ledger_id, CREDS, OPTS,
                                          reported=reported)
        assert result.outcome is Outcome.DEFERRED and result.fragments == 0
        assert (await client.ledger_metadata(lh.ledger_id)).state is LedgerState.OPEN
        # After it: fenced and closed as for a lost bookie, then the copy.
        result = await rereplicate_ledger(client, lh.ledger_id, CREDS, OPTS, close_open=True,
                                          reported=reported)
        assert result.outcome is Outcome.REPLICATED, result.detail
        assert result.closed_by_recovery and result.fragments == 1
        md = await client.ledger_metadata(lh.ledger_id)
        assert md.is_closed and md.last_entry_id == 29
        assert victim not in md.ensembles[0][1]
        assert whole(cluster, lh.ledger_id, md, payloads) == []
        with pytest.raises((ledgerd.LedgerFencedError, ledgerd.LedgerClosedError)):
            await lh.append(b"late")


async def test_a_report_in_an_unbounded_open_fragment_is_split_off_and_copied(
        tmp_path: Path, clock: trio.testing.MockClock) -> None:
    async with memory_cluster(tmp_path, 5, cluster_secret=SECRET) as cluster, \
            ledgerd.open_client(store=cluster.store, connect=cluster.connect,
                                **client_settings()) as client:
        lh = await client.create_unbounded_ledger(3, 2, 2, password=b"pw")
        payloads = {i: b"v%d" % i for i in range(50)}
        for i in range(30):
            await lh.append(payloads[i])
        await trio.sleep(1)  # idle: the explicit LAC tells the bookies entry 29 is in
        ensemble, term = lh.metadata.ensembles[0][1], lh.metadata.term
        victim = ensemble[2]
        reported = lose_entries(cluster, victim, lh.ledger_id, 20, lh.metadata)
        result = await rereplicate_ledger(client, lh.ledger_id, CREDS, OPTS,
                                          reported=reported)
        assert result.outcome is Outcome.DEFERRED and result.fragments == 0
        result = await rereplicate_ledger(client, lh.ledger_id, CREDS, OPTS, close_open=True,
                                          reported=reported)
        assert result.outcome is Outcome.REPLICATED, result.detail
        assert result.fragments == 1 and not result.closed_by_recovery
        md = await client.ledger_metadata(lh.ledger_id)
        # Entries 0..29 split off onto a replacement of the victim; the writer's
        # ensemble (the victim included: it is alive) goes on from 30, its term kept.
        assert [f for f, _ in md.ensembles] == [0, 30] and md.term == term
        assert victim not in md.ensembles[0][1] and md.ensembles[1][1] == ensemble
        assert whole(cluster, lh.ledger_id, replace(md, ensembles=md.ensembles[:1]).closed(
            29, 0), payloads) == []
        assert entries_below_qw(md, set(cluster.bookies), 29) == []
        for i in range(30, 50):  # the live writer never noticed
            assert await lh.append(payloads[i]) == i
        await trio.sleep(1)
        rh = await client.open_ledger(lh.ledger_id, b"pw", recovery=False)
        assert await rh.read_lac() == 49
        assert [e.payload async for e in rh.read(0, 49)] == [payloads[i] for i in range(50)]


async def test_a_heal_is_not_reported_whole_while_a_reported_copy_is_missing(
        tmp_path: Path, clock: trio.testing.MockClock) -> None:
    """The report reaches past the LAC the surviving bookies hold (the victim knew a
    later one): the split heals up to that LAC, and the rest stays below Qw, so the
    outcome is DEFERRED, never REPLICATED."""
    async with memory_cluster(tmp_path, 5, cluster_secret=SECRET) as cluster, \
            ledgerd.open_client(store=cluster.store, connect=cluster.connect,
                                **client_settings()) as client:
        lh = await client.create_unbounded_ledger(3, 3, 2, password=b"pw")
        for i in range(20):
            await lh.append(b"w%d" % i)
        await trio.sleep(1)
        victim = lh.metadata.ensembles[0][1][0]
        result = await rereplicate_ledger(client, lh.ledger_id, CREDS, OPTS, close_open=True,
                                          reported={victim: [(5, 40)]})
        assert result.outcome is Outcome.DEFERRED, result.detail
        assert "below Qw" in result.detail


async def test_a_report_in_a_dead_writers_unbounded_fragment_is_taken_over_then_split(
        tmp_path: Path, clock: trio.testing.MockClock) -> None:
    """No explicit LAC (a writer killed with adds in flight): the tail is in doubt, so
    the ledger is taken over; the reporting bookie is alive and takes the no-op, so the
    fragment stays open with it, and is then split at the no-op (settled by the
    takeover itself), never taken over again."""
    async with memory_cluster(tmp_path, 5, cluster_secret=SECRET) as cluster, \
            ledgerd.open_client(store=cluster.store, connect=cluster.connect,
                                **client_settings(explicit_lac_interval_ms=0)) as client:
        lh = await client.create_unbounded_ledger(3, 2, 2, password=b"pw")
        payloads = {i: b"t%d" % i for i in range(30)}
        for i in range(30):
            await lh.append(payloads[i])
        term, victim = lh.metadata.term, lh.metadata.ensembles[0][1][0]
        reported = lose_entries(cluster, victim, lh.ledger_id, 12, lh.metadata)
        result = await rereplicate_ledger(client, lh.ledger_id, CREDS, OPTS, close_open=True,
                                          reported=reported)
        assert result.outcome is Outcome.REPLICATED, result.detail
        assert result.closed_by_recovery and result.fragments == 1
        md = await client.ledger_metadata(lh.ledger_id)
        assert md.term == term + 2 and md.state is LedgerState.OPEN
        noop = max(md.noops)
        assert [f for f, _ in md.ensembles] == [0, noop + 1]
        assert victim not in md.ensembles[0][1]
        expected = payloads | {n: b"" for n in md.noops}
        assert whole(cluster, lh.ledger_id, replace(md, ensembles=md.ensembles[:1]).closed(
            noop, 0), expected) == []


async def test_hmac_ledgers_are_copied_without_the_password_never_with_bad_bytes(
        tmp_path: Path, clock: trio.testing.MockClock) -> None:
    async with memory_cluster(tmp_path, 5, cluster_secret=SECRET) as cluster, \
            ledgerd.open_client(store=cluster.store, connect=cluster.connect,
                                **client_settings()) as client:
        lh = await client.create_ledger(3, 2, 2, digest="hmac", password=b"pw")
        payloads = {i: b"h%d " % i + bytes(i) for i in range(40)}
        for i in range(40):
            await lh.append(payloads[i])
        await lh.close()
        await lose(cluster, lh.metadata.ensembles[0][1][0])
        result = await rereplicate_ledger(client, lh.ledger_id, CREDS, OPTS)
        assert result.outcome is Outcome.REPLICATED, result.detail
        md = await client.ledger_metadata(lh.ledger_id)
        assert whole(cluster, lh.ledger_id, md, payloads) == []
        rh = await client.open_ledger(lh.ledger_id, b"pw")
        assert [x.payload async for x in rh.read()] == [payloads[i] for i in range(40)]

        # Qw = 3: two survivors hold each entry. One holds a flipped payload byte that
        # only the digest could catch: without the password the replicas disagree and
        # nothing is copied; with it, the good replica is copied.
        lh = await client.create_ledger(3, 3, 2, digest="hmac", password=b"pw")
        for i in range(10):
            await lh.append(payloads[i])
        await lh.close()
        ensemble = lh.metadata.ensembles[0][1]
        storage = cluster[ensemble[1]].storage
        good = storage.read_entry(lh.ledger_id, 5)
        bad = good[:-1] + bytes([good[-1] ^ 1])
        await storage.add_entries(lh.ledger_id, 5, [bad])
        await lose(cluster, ensemble[0])
        result = await rereplicate_ledger(client, lh.ledger_id, CREDS, OPTS)
        assert result.outcome is Outcome.FAILED
        assert "hold different bytes" in result.detail
        md = await client.ledger_metadata(lh.ledger_id)
        assert md.ensembles[0][1] == ensemble  # nothing re-pointed
        result = await rereplicate_ledger(client, lh.ledger_id, Credentials(password=b"pw"),
                                          OPTS)
        assert result.outcome is Outcome.REPLICATED, result.detail
        md = await client.ledger_metadata(lh.ledger_id)
        target = next(b for b in md.ensembles[0][1] if b not in ensemble)
        assert cluster[target].storage.read_entry(lh.ledger_id, 5) == good


async def test_an_open_hmac_ledger_is_closed_without_its_password_where_the_password_would(
        tmp_path: Path, clock: trio.testing.MockClock) -> None:
    async with memory_cluster(tmp_path, 4, cluster_secret=SECRET) as cluster, \
            ledgerd.open_client(store=cluster.store, connect=cluster.connect,
                                **client_settings()) as client:
        payloads = {i: b"x%d " % i + bytes(i % 5) for i in range(10)}
        # Two writers append the same entries to twin ledgers; one ledger is closed by
        # a worker without the password, the other by a reader's recovery with it.
        lh = await client.create_ledger(3, 2, 2, digest="hmac", password=b"pw")
        twin = await client.create_ledger(3, 2, 2, digest="hmac", password=b"pw")
        for i in range(10):
            await lh.append(payloads[i])
            await twin.append(payloads[i])
        await lose(cluster, lh.metadata.ensembles[0][1][0])
        result = await rereplicate_ledger(client, lh.ledger_id, CREDS, OPTS, close_open=True)
        assert result.outcome is Outcome.REPLICATED, result.detail
        assert result.closed_by_recovery
        md_twin = (await client.open_ledger(twin.ledger_id, b"pw")).metadata
        md = await client.ledger_metadata(lh.ledger_id)
        assert md.is_closed and md.last_entry_id == 9
        assert md.length == sum(len(p) for p in payloads.values())
        assert (md.last_entry_id, md.length) == (md_twin.last_entry_id, md_twin.length)
        assert whole(cluster, lh.ledger_id, md, payloads) == []
        rh = await client.open_ledger(lh.ledger_id, b"pw")
        assert [x.payload async for x in rh.read()] == [payloads[i] for i in range(10)]
        with pytest.raises((ledgerd.LedgerFencedError, ledgerd.LedgerClosedError)):
            await lh.append(b"late")  # the silent writer was fenced


async def test_a_refused_hmac_close_still_copies_the_finished_fragments(
        tmp_path: Path, clock: trio.testing.MockClock) -> None:
    async with memory_cluster(tmp_path, 5, cluster_secret=SECRET) as cluster, \
            ledgerd.open_client(store=cluster.store, connect=cluster.connect,
                                **client_settings()) as client:
        lh = await client.create_ledger(3, 3, 2, digest="hmac", password=b"pw")
        payloads = {i: b"z%d " % i + bytes(i) for i in range(20)}
        for i in range(10):
            await lh.append(payloads[i])
        first = lh.metadata.ensembles[0][1]
        cluster[first[0]].gate.freeze()  # replaced after its add timeout: two fragments
        for i in range(10, 13):
            await lh.append(payloads[i])
        with trio.fail_after(10):
            md = await wait_fragments(client, lh.ledger_id, 2)
        cluster[first[0]].gate.thaw()
        for i in range(13, 17):
            await lh.append(payloads[i])
        for p in [await lh.submit(payloads[i]) for i in range(17, 20)]:
            await p  # in flight together: the close reads 17 on
        await trio.sleep(1)
        assert md.ensembles[1][0] <= 13
        second = md.ensembles[1][1]
        lost = next(b for b in first[1:] if b in second)
        forged = next(b for b in second if b != lost)
        storage = cluster[forged].storage
        good = storage.read_entry(lh.ledger_id, 18)
        await storage.add_entries(lh.ledger_id, 18, [good[:-1] + bytes([good[-1] ^ 1])])
        await lose(cluster, lost)
        result = await rereplicate_ledger(client, lh.ledger_id, CREDS, OPTS, close_open=True)
        assert result.outcome is Outcome.FAILED and "hold different bytes" in result.detail
        assert result.fragments == 1  # the finished one, copied while the close waits
        md = await client.ledger_metadata(lh.ledger_id)
        assert md.state is LedgerState.IN_RECOVERY
        assert lost not in md.ensembles[0][1] and md.ensembles[1][1] == second
        assert whole(cluster, lh.ledger_id, md.closed(md.ensembles[1][0] - 1, 0),
                     payloads) == []


async def test_a_corrupted_replica_makes_the_close_without_the_password_refuse(
        tmp_path: Path, clock: trio.testing.MockClock) -> None:
    async with memory_cluster(tmp_path, 5, cluster_secret=SECRET) as cluster, \
            ledgerd.open_client(store=cluster.store, connect=cluster.connect,
                                **client_settings()) as client:
        # Qw = 3: two survivors hold each entry of the tail the close must rewrite (the
        # last three were in flight together: they carry LAC 6, so the close reads 7 on).
        # One survivor holds entry 8 with a flipped payload byte that only the digest
        # could catch.
        lh = await client.create_ledger(3, 3, 2, digest="hmac", password=b"pw")
        payloads = {i: b"y%d " % i + bytes(i) for i in range(10)}
        for i in range(7):
            await lh.append(payloads[i])
        for p in [await lh.submit(payloads[i]) for i in range(7, 10)]:
            await p
        await trio.sleep(1)  # every replica's add has landed
        ensemble = lh.metadata.ensembles[0][1]
        storage = cluster[ensemble[1]].storage
        assert peek_entry_header(storage.read_entry(lh.ledger_id, 9)).lac < 8
        good = storage.read_entry(lh.ledger_id, 8)
        await storage.add_entries(lh.ledger_id, 8, [good[:-1] + bytes([good[-1] ^ 1])])
        await lose(cluster, ensemble[0])
        for _attempt in range(2):  # a worker's retry refuses the same way
            result = await rereplicate_ledger(client, lh.ledger_id, CREDS, OPTS,
                                              close_open=True)
            assert result.outcome is Outcome.FAILED
            assert "hold different bytes" in result.detail, result.detail
            assert "--password" in result.detail and "IN_RECOVERY" in result.detail
            md = await client.ledger_metadata(lh.ledger_id)
            assert md.state is LedgerState.IN_RECOVERY  # fenced, kept for the password
            assert md.ensembles == ((0, ensemble),)  # nothing re-pointed
            for name in set(cluster.bookies) - set(ensemble):
                with pytest.raises((EntryNotFoundError, LedgerNotFoundError)):
                    cluster[name].storage.read_entry(lh.ledger_id, 8)  # nothing copied
        result = await rereplicate_ledger(client, lh.ledger_id, Credentials(password=b"pw"),
                                          OPTS, close_open=True)
        assert result.outcome is Outcome.REPLICATED, result.detail
        md = await client.ledger_metadata(lh.ledger_id)
        assert md.is_closed and md.last_entry_id == 9
        rh = await client.open_ledger(lh.ledger_id, b"pw")
        assert [x.payload async for x in rh.read()] == [payloads[i] for i in range(10)]
