"""Metadata snapshots (pure): the file round-trips, a changed byte is caught by the
checksum, nodes fall into the issue's categories, and the diff says what differs."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ledgerd.metadata.errors import CorruptMetadataError
from ledgerd.metadata.snapshot import Node, Snapshot, category, diff_nodes, restore_id_gap

LAYOUT = Node("LAYOUT", b"ledgerd-layout\t1\nhierarchical", 0)

_names = st.text("abcdefgh0123", min_size=1, max_size=6)
_nodes = st.lists(st.builds(Node, st.lists(_names, min_size=1, max_size=3).map("/".join),
                            st.binary(max_size=40), st.integers(0, 1000)),
                  max_size=20, unique_by=lambda n: n.path)


@given(_nodes, st.dictionaries(st.just("idgen"), st.integers(0, 1 << 31)))
def test_snapshot_file_round_trips(nodes: list[Node], counters: dict[str, int]) -> None:
    snap = Snapshot(root="/ledgers", nodes=(LAYOUT, *[n for n in nodes if n.path != "LAYOUT"]),
                    counters=counters, taken_ms=5, passes=2)
    assert Snapshot.from_bytes(snap.to_bytes(), "f") == snap


def test_a_changed_snapshot_fails_its_checksum() -> None:
    snap = Snapshot(root="/ledgers", nodes=(LAYOUT, Node("cookies/b1:3181", b"c", 2)))
    doc = json.loads(snap.to_bytes())
    doc["nodes"][1]["version"] = 3
    with pytest.raises(CorruptMetadataError, match="checksum mismatch"):
        Snapshot.from_bytes(json.dumps(doc).encode(), "meta.snap")
    with pytest.raises(CorruptMetadataError, match="not a ledgerd metadata snapshot"):
        Snapshot.from_bytes(b"{}", "meta.snap")
    with pytest.raises(CorruptMetadataError, match="not JSON"):
        Snapshot.from_bytes(snap.to_bytes()[:-20], "meta.snap")


def test_categories_cover_what_the_issue_lists() -> None:
    h = "hierarchical"
    assert category("00/0000/L0007", h) == "ledgers"
    assert category("L0000000007", "flat") == "ledgers"
    assert category("logs/events", h) == "logs"
    assert category("logs/events/cursors/reader", h) == "cursors"
    assert category("cookies/b1:3181", h) == "cookies"
    assert category("underreplication/disable", h) == "autorecovery"
    assert category("underreplication/ledgers/0000/0000/0000/0007/urL0000000007",
                    h) == "underreplicated"
    assert category("kafka/topics/t", h) == "kafka_topics"
    assert category("kafka/groups/g", h) == "kafka_groups"
    assert category("INSTANCEID", h) == "cluster"
    assert category("00/0000", h) == "tree"
    summary = Snapshot(root="/r", nodes=(LAYOUT, Node("underreplication/disable", b"", 0),
                                         Node("00/0000/L0007", b"{}", 1))).summary()
    assert summary["ledgers"] == 1 and summary["autorecovery_enabled"] is False


def test_diff_names_only_snapshot_only_live_and_changed() -> None:
    a = [Node("x", b"1", 0), Node("y", b"2", 1), Node("z", b"3", 0)]
    b = [Node("y", b"2", 4), Node("z", b"9", 1), Node("w", b"", 0)]
    d = diff_nodes(a, b)
    assert (d.only_a, d.only_b, d.changed, d.version_only) == (("x",), ("w",), ("z",), ("y",))
    assert not d.is_empty
    assert diff_nodes(a, a).is_empty


def test_the_restore_id_gap_comes_from_what_the_bookies_hold() -> None:
    # 25,000 ledgers created since the snapshot: a fixed gap of 10,000 reused ids.
    got = restore_id_gap(1000, held_max=26_000, all_answered=True, default_gap=10_000,
                         margin=100)
    assert got.gap == 25_101 and "26000 + margin 100" in got.reason
    # Nothing created since: the margin alone (not the default).
    assert restore_id_gap(1000, held_max=400, all_answered=True, default_gap=10_000,
                          margin=100).gap == 100
    # A bookie silent: never below the default.
    partial = restore_id_gap(1000, held_max=400, all_answered=False, default_gap=10_000,
                             margin=100)
    assert partial.gap == 10_000 and "not every bookie answered" in partial.reason
    none = restore_id_gap(1000, held_max=None, all_answered=False, default_gap=10_000)
    assert none.gap == 10_000 and "no bookie answered" in none.reason
