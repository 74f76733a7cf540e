"""The Spark sources' option parsing and partition planning (pure; no Spark needed)."""

from __future__ import annotations

import pytest

from ledgerd.spark.options import (
    LedgerRange,
    Offset,
    ReadOptions,
    SourceOptionError,
    WriteOptions,
    client_config,
    plan_ranges,
)


def test_plan_ranges_cut_at_fragments_then_by_size() -> None:
    assert plan_ranges(5, [0, 50, 120], 0, 130, 40, closed=True) == [
        LedgerRange(5, 0, 39, True), LedgerRange(5, 40, 49, True),
        LedgerRange(5, 50, 89, True), LedgerRange(5, 90, 119, True),
        LedgerRange(5, 120, 130, True)]
    assert plan_ranges(5, [0, 50], 45, 55, 100, closed=False) == [
        LedgerRange(5, 45, 49, False), LedgerRange(5, 50, 55, False)]
    assert plan_ranges(5, [0], 10, 9, 100, closed=True) == []
    covered = [e for r in plan_ranges(1, [0, 7, 300, 301], 3, 999, 64, closed=True)
               for e in range(r.first, r.last + 1)]
    assert covered == list(range(3, 1000))


def test_read_options() -> None:
    opts = ReadOptions.parse({"zk": "h:1/x", "ledgers": "3, 4", "ledger": "9",
                              "startingOffsets": '{"ledger": 3, "entry": 7}',
                              "maxEntriesPerTrigger": "10", "client.read_timeout_ms": "900"})
    assert opts.ledgers == (9, 3, 4) and opts.max_entries_per_trigger == 10
    assert client_config(opts.client).read_timeout_ms == 900
    assert client_config(opts.client).zk_servers == "h:1/x"
    bad = [
        ({}, "exactly one of ledger, ledgers or log"),
        ({"log": "a", "ledger": "1"}, "exactly one"),
        ({"ledgers": "1,x"}, "comma-separated ledger ids"),
        ({"ledger": "-1"}, "non-negative"),
        ({"log": "a", "first_entry": "3"}, "an entry range only with ledger ids"),
        ({"ledger": "1", "first_entry": "9", "last_entry": "3"}, "at least first_entry"),
        ({"ledger": "1", "decode": "avro"}, "binary, utf8, json"),
        ({"ledger": "1", "entries_per_partition": "0"}, "integer >= 1"),
        ({"ledger": "1", "startingOffsets": "[1]"}, "ledger"),
        ({"ledger": "1", "client.nope": "1"}, "client.<a ClientConfig key>"),
    ]
    for options, message in bad:
        with pytest.raises(SourceOptionError, match=message):
            ReadOptions.parse(options)
    with pytest.raises(SourceOptionError, match="one ledger"):
        ReadOptions.parse({"ledgers": "1,2"}, streaming=True)


def test_offsets_and_write_options() -> None:
    assert Offset.parse('{"ledger": 4, "entry": -1}') == Offset(4, -1)
    assert Offset.from_dict(Offset(4, 2).to_dict()) == Offset(4, 2)
    for text in ('{"ledger": 4}', '{"ledger": "4", "entry": 1}', '{"ledger": -2, "entry": 0}',
                 "nope"):
        with pytest.raises(SourceOptionError):
            Offset.parse(text)
    w = WriteOptions.parse({"log": "x", "ensemble_size": "3", "batch": "10"})
    assert (w.ensemble_size, w.write_quorum, w.batch) == (3, None, 10)
    with pytest.raises(SourceOptionError, match="name of the log"):
        WriteOptions.parse({})
    with pytest.raises(SourceOptionError, match="ack_quorum"):
        WriteOptions.parse({"log": "x", "ack_quorum": "0"})
