"""``ledgerd shell durability``: the cluster's durability debt as numbers.

Counted now from ZooKeeper (every ledger's metadata, the registered bookies, the
underreplication queue with the entry ranges scrubbers reported) and, for open ledgers
that lack a copy, the LAC read from their bookies (``ledgerd.durability``). The repair
rate needs a history, so it comes from the auditor's last published report; the time to
full redundancy is today's debt over that rate. ``clusterinfo`` shows the same summary.

Exit status: 0 when every entry has Qw copies and the queue agrees with the metadata,
3 otherwise (for scripts and cron).
"""

from __future__ import annotations

import sys
import time
from typing import Any

import click

from ledgerd.tools.output import emit, table
from ledgerd.tools.shell import _client_run, shell

__all__ = ["collect", "register", "summary_line"]


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _duration(s: float) -> str:
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


def collect(ctx: click.Context, *, per_ledger: bool = False) -> dict[str, Any]:
    """The report as a dict (``DurabilityReport.to_json`` plus the auditor's rate)."""
    from ledgerd.durability import durability_report, published_report

    async def run(client: Any) -> dict[str, Any]:
        now_ms = int(time.time() * 1000)
        report, debts = await durability_report(client, now_ms=now_ms)
        out = report.to_json()
        root = client.config.zk_ledgers_root_path
        published = await published_report(client.store, root)
        rate = published.get("repair_rate_bytes_per_s") if published else None
        out["auditor_report_age_s"] = (round((now_ms - published["computed_ms"]) / 1000, 1)
                                       if published and "computed_ms" in published else None)
        out["repair_rate_bytes_per_s"] = rate
        if report.entries_below_qw == 0 and not report.unknown_extent_ledgers:
            out["eta_s"] = 0.0
        elif rate and report.bytes_below_qw > 0:
            out["eta_s"] = round(report.bytes_below_qw / rate, 1)
        else:
            out["eta_s"] = None
        if per_ledger:
            out["per_ledger"] = [
                {"ledger_id": d.ledger_id, "entries_below_qw": d.entries_below_qw,
                 "entries_single_copy": d.entries_single_copy,
                 "entries_no_copy": d.entries_no_copy, "bytes_below_qw": round(d.bytes_below_qw),
                 "unknown_extent": d.unknown_extent, "lost_bookies": list(d.lost_bookies),
                 "marked": d.ledger_id not in report.unmarked}
                for d in debts if d.needs_mark]
        return out

    return _client_run(ctx, run)


def summary_line(d: dict[str, Any]) -> str:
    """One line for clusterinfo."""
    if d["entries_below_qw"] == 0 and not d["unknown_extent_ledgers"]:
        text = "every entry at Qw copies"
    else:
        text = (f"{d['entries_below_qw']} entries ({_bytes(d['bytes_below_qw'])}) below Qw "
                f"in {d['short_ledgers']} ledgers, {d['entries_single_copy']} on one bookie "
                f"only")
        if d.get("eta_s") is not None:
            text += f", full redundancy in ~{_duration(d['eta_s'])}"
    if not d["agrees"]:
        text += (f"; queue disagrees: {len(d['unmarked'])} not queued, "
                 f"{len(d['stale_marks'])} stale")
    return text


def _human(d: dict[str, Any]) -> str:
    healthy = d["entries_below_qw"] == 0 and not d["unknown_extent_ledgers"]
    verdict = "OK" if healthy and d["agrees"] else (
        "DEGRADED" if healthy or d["entries_no_copy"] == 0 else "DATA AT RISK")
    oldest = d["oldest_underreplicated_age_s"]
    rate = d["repair_rate_bytes_per_s"]
    age = d.get("auditor_report_age_s")
    lines = [
        f"durability        {verdict}: {d['short_ledgers']} of {d['ledgers']} ledgers short of Qw"
        + (f" ({d['unknown_extent_ledgers']} by an amount not known)"
           if d["unknown_extent_ledgers"] else ""),
        f"below Qw          {d['entries_below_qw']} entries, ~{_bytes(d['bytes_below_qw'])}",
        f"one bookie only   {d['entries_single_copy']} entries, "
        f"~{_bytes(d['bytes_single_copy'])}",
        f"no copy           {d['entries_no_copy']} entries",
        f"queued            {d['marked_ledgers']} ledgers"
        + (f", the oldest for {_duration(oldest)}" if oldest is not None else ""),
        "queue vs metadata " + ("agree" if d["agrees"] else
                                f"DISAGREE: not queued {d['unmarked'][:10]}, "
                                f"stale {d['stale_marks'][:10]}"),
        "repair rate       " + (f"{_bytes(rate)}/s (auditor, {age} s ago)" if rate else
                                "none measured (no auditor report, or the debt is not "
                                "falling)"),
        "full redundancy   " + ("now" if d["eta_s"] == 0 else
                                f"in ~{_duration(d['eta_s'])}" if d["eta_s"] is not None
                                else "no estimate"),
    ]
    rows = d.get("per_ledger")
    if rows:
        lines += ["", table(["LEDGER", "BELOW QW", "ONE COPY", "NO COPY", "LOST BOOKIES",
                             "QUEUED"],
                            [[r["ledger_id"], "?" if r["unknown_extent"] else
                              r["entries_below_qw"], r["entries_single_copy"],
                              r["entries_no_copy"], ",".join(r["lost_bookies"]),
                              "yes" if r["marked"] else "NO"] for r in rows])]
    return "\n".join(lines)


@shell.command("durability")
@click.option("--json", "as_json", is_flag=True)
@click.option("--ledgers", "per_ledger", is_flag=True,
              help="Also list each ledger short of Qw or naming a lost bookie.")
@click.pass_context
def durability(ctx: click.Context, as_json: bool, per_ledger: bool) -> None:
    """Durability debt: entries and bytes below Qw, held by one bookie only, with no
    copy; the oldest under-replicated ledger; the repair rate and the time to full
    redundancy; whether the re-replication queue agrees with the metadata. Exits 3
    unless every entry has Qw copies and the queue agrees."""
    d = collect(ctx, per_ledger=per_ledger)
    emit(as_json, d, _human(d))
    if d["entries_below_qw"] or d["unknown_extent_ledgers"] or not d["agrees"]:
        sys.exit(3)


def register() -> None:
    """The command is declared on ``shell`` at import; this makes the import explicit."""
