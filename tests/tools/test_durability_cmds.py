"""`ledgerd shell durability`'s human output and clusterinfo's line, from reports."""

from __future__ import annotations

from typing import Any

from ledgerd.machines.durability import DurabilityReport
from ledgerd.tools.durability_cmds import _human, summary_line


def _doc(**kw: Any) -> dict[str, Any]:
    d = DurabilityReport(**kw).to_json()
    d.update(auditor_report_age_s=3.0)
    return d


def test_whole_cluster_reads_ok() -> None:
    d = _doc(ledgers=4)
    d["eta_s"] = 0.0
    assert _human(d).splitlines()[0] == "durability        OK: 0 of 4 ledgers short of Qw"
    assert "full redundancy   now" in _human(d)
    assert summary_line(d) == "every entry at Qw copies"


def test_debt_the_queue_disagreeing_and_an_estimate_are_shown() -> None:
    d = _doc(ledgers=9, short_ledgers=2, entries_below_qw=50, bytes_below_qw=6000.0,
             entries_single_copy=40, bytes_single_copy=4096.0, marked_ledgers=1,
             oldest_underreplicated_age_s=12.0, unmarked=(7,), short=(3, 7),
             repair_rate_bytes_per_s=2048.0, eta_s=3.0)
    text = _human(d)
    assert "DEGRADED: 2 of 9 ledgers short of Qw" in text
    assert "below Qw          50 entries, ~5.9 KiB" in text
    assert "one bookie only   40 entries, ~4.0 KiB" in text
    assert "queued            1 ledgers, the oldest for 12 s" in text
    assert "DISAGREE: not queued [7]" in text
    assert "repair rate       2.0 KiB/s (auditor, 3.0 s ago)" in text
    assert "full redundancy   in ~3 s" in text
    assert summary_line(d) == ("50 entries (5.9 KiB) below Qw in 2 ledgers, 40 on one "
                               "bookie only, full redundancy in ~3 s; queue disagrees: 1 "
                               "not queued, 0 stale")
    lost = _doc(ledgers=1, short_ledgers=1, entries_below_qw=5, entries_no_copy=5)
    assert _human(lost).startswith("durability        DATA AT RISK")
    assert "full redundancy   no estimate" in _human(lost)
