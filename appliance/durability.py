"""The auditor's durability gauges: the debt recomputed every
``auditor_durability_interval_s`` and exported as Prometheus metrics.

Only the elected auditor computes (``track_durability`` runs inside its term); every
other autorecovery process exports zeros and -1, so ``max()`` over the cluster's
scrapes gives the auditor's figures. Each report is also published in ZooKeeper for
``ledgerd shell durability`` / ``clusterinfo`` (``ledgerd.durability``). The repair
rate is measured by the same auditor across its reports (``RepairRate``), so the time
to full redundancy needs two reports with a falling debt before it has an estimate.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

import trio

from ledgerd.appliance.metrics import BookieMetrics
from ledgerd.base.logs import fields
from ledgerd.durability import durability_report, publish_report
from ledgerd.machines.durability import DurabilityReport, RepairRate

if TYPE_CHECKING:
    from ledgerd.client import Client

__all__ = ["DurabilityGauges", "register_durability_metrics", "track_durability"]

log = logging.getLogger(__name__)


@dataclass
class DurabilityGauges:
    """The auditor's last report (None: not the auditor, or nothing computed yet)."""

    report: DurabilityReport | None = None
    oldest_mark_ms: int | None = None
    reports: int = 0
    rate: RepairRate = field(default_factory=RepairRate)

    def value(self, attr: str) -> float:
        """A number of the last report (a list's length), 0 without one."""
        r = self.report
        if r is None:
            return 0.0
        v = getattr(r, attr)
        return float(len(v) if isinstance(v, tuple) else v)

    def oldest_age_s(self) -> float:
        if self.report is None or self.oldest_mark_ms is None:
            return 0.0
        return max(0.0, time.time() - self.oldest_mark_ms / 1000)

    def eta_s(self) -> float:
        r = self.report
        return -1.0 if r is None or r.eta_s is None else float(r.eta_s)


async def track_durability(client: Client, gauges: DurabilityGauges, interval_s: float,
                           metadata_reads_per_s: float) -> None:
    """Recompute, export and publish the debt every ``interval_s`` until cancelled
    (0: never). A failed round is logged and retried at the next interval; the gauges
    are cleared when this stops (the auditor lost its election or its session)."""
    if interval_s <= 0:
        return
    root = client.config.zk_ledgers_root_path
    try:
        while True:
            now_ms = int(time.time() * 1000)
            try:
                report, _ = await durability_report(
                    client, rate=gauges.rate, metadata_reads_per_s=metadata_reads_per_s,
                    now_ms=now_ms)
            except Exception as exc:  # one failed round must not depose the auditor
                log.warning("durability_report_failed", extra=fields(
                    error=repr(exc), retry_in_s=interval_s))
            else:
                gauges.report = report
                gauges.reports += 1
                age = report.oldest_underreplicated_age_s
                gauges.oldest_mark_ms = None if age is None else int(now_ms - age * 1000)
                await publish_report(client.store, root, report, now_ms)
                if report.entries_below_qw or not report.agrees:
                    log.info("durability_debt", extra=fields(
                        short_ledgers=report.short_ledgers,
                        entries_below_qw=report.entries_below_qw,
                        bytes_below_qw=round(report.bytes_below_qw),
                        single_copy=report.entries_single_copy,
                        unmarked=",".join(map(str, report.unmarked[:10])),
                        stale_marks=",".join(map(str, report.stale_marks[:10])),
                        eta_s=report.eta_s))
            await trio.sleep(interval_s)
    finally:
        gauges.report = None
        gauges.oldest_mark_ms = None


def register_durability_metrics(m: BookieMetrics, gauges: DurabilityGauges) -> None:
    """The auditor's durability gauges on a metrics registry."""
    for name, doc, attr in (
            ("entries_below_qw", "Entries with fewer than Qw copies (auditor).",
             "entries_below_qw"),
            ("bytes_below_qw", "Estimated entry bytes with fewer than Qw copies (auditor).",
             "bytes_below_qw"),
            ("entries_single_copy", "Entries held by one bookie only (auditor).",
             "entries_single_copy"),
            ("bytes_single_copy", "Estimated entry bytes held by one bookie only (auditor).",
             "bytes_single_copy"),
            ("entries_no_copy", "Entries no registered bookie holds (auditor).",
             "entries_no_copy"),
            ("short_ledgers", "Ledgers with an entry below Qw (auditor).", "short_ledgers"),
            ("unmarked_ledgers", "Ledgers short of Qw (or naming a lost bookie) that are "
             "not queued for re-replication (auditor).", "unmarked"),
            ("stale_marks", "Queued ledgers that are not short (auditor).", "stale_marks")):
        m.gauge(f"ledgerd_durability_{name}", doc, partial(gauges.value, attr))
    m.gauge("ledgerd_durability_oldest_underreplicated_age_seconds",
            "Age of the oldest queued under-replicated ledger (auditor; 0 when none).",
            gauges.oldest_age_s)
    m.gauge("ledgerd_durability_time_to_full_redundancy_seconds",
            "Estimated seconds until every entry has Qw copies, at the rate the debt fell "
            "recently (auditor; -1: no estimate, the debt is not falling).", gauges.eta_s)
