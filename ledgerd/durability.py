"""Durability debt of a whole cluster, read from ZooKeeper and (for open ledgers) bookies.

The decisions are ``ledgerd.machines.durability``; this module gathers their inputs
for the auditor (``appliance.durability``) and ``ledgerd shell durability`` /
``clusterinfo`` alike:

- every ledger's metadata (paced by ``metadata_reads_per_s``), the registered bookies
  (writable and read-only), and the underreplication queue (its records' ctime and the
  entry ranges scrubbers reported);
- for an open ledger whose fragments lack a copy, the LAC and its entry's cumulative
  length, read (ReadLac) from the registered bookies of its last ensemble; an open
  fragment nobody answers for is counted as short of unknown extent.

The auditor publishes its last report at ``<root>/underreplication/durability`` (JSON,
``DurabilityReport.to_json`` plus ``computed_ms``), so the shell can show the repair
rate, which needs a history of samples, next to its own fresh count.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import trio

from ledgerd.machines.durability import (
    DurabilityReport,
    LedgerDebt,
    RepairRate,
    ledger_debt,
    mean_entry_bytes,
    summarize,
)
from ledgerd.machines.throttle import TokenBucket
from ledgerd.metadata.errors import NodeExistsError, NoNodeError
from ledgerd.metadata.ledger import LedgerMetadata
from ledgerd.metadata.store import MetadataStore
from ledgerd.metadata.underreplication import UnderreplicationManager
from ledgerd.wire.entry import peek_entry_header
from ledgerd.wire.errors import WireError
from ledgerd.wire.messages import ReadLacRequest, ReadLacResponse
from ledgerd.wire.status import Status

if TYPE_CHECKING:
    from ledgerd.client import Client

__all__ = ["collect_debts", "durability_report", "publish_report", "published_report"]

LAC_READ_TIMEOUT_S = 5.0


def published_path(root: str) -> str:
    return f"{root}/underreplication/durability"


async def _lac(client: Client, ledger_id: int, md: LedgerMetadata,
               available: set[str]) -> tuple[int, float] | None:
    """``(LAC, mean entry bytes)`` from the registered bookies of the last ensemble;
    None if none answered."""
    best: tuple[int, int, int] | None = None  # (lac, last entry id, its length)
    answered = False

    async def one(bookie: str) -> None:
        nonlocal best, answered
        status, resp, _ = await client.pool.call(bookie, ReadLacRequest(ledger_id=ledger_id),
                                                 LAC_READ_TIMEOUT_S)
        if status in (Status.NO_SUCH_LEDGER, Status.NO_SUCH_ENTRY):
            answered = True
            return
        if status != Status.OK or not isinstance(resp, ReadLacResponse) or not resp.last_entry:
            return
        try:
            h = peek_entry_header(resp.last_entry)
        except WireError:
            return
        answered = True
        got = (h.lac, h.entry_id, h.length)
        if best is None or got > best:
            best = got

    async with trio.open_nursery() as nursery:
        for b in md.last_ensemble[1]:
            if b in available:
                nursery.start_soon(one, b)
    if best is None:
        return (-1, 0.0) if answered else None
    lac, last, length = best
    return lac, (length / (last + 1) if last >= 0 else 0.0)


async def collect_debts(client: Client, *, metadata_reads_per_s: float = 0.0
                        ) -> tuple[list[LedgerDebt], dict[int, int]]:
    """Every ledger's debt and the queue's marks (ledger id to record ctime, ms)."""
    root = client.config.zk_ledgers_root_path
    members = await client.registry.list_bookies()
    available = set(members.all)
    urm = UnderreplicationManager(client.store, root)
    records = {r.ledger_id: r async for r in urm.list_underreplicated()}
    bucket = TokenBucket(metadata_reads_per_s, now=trio.current_time())
    debts: list[LedgerDebt] = []
    async for lid in client.ledgers.iter_ledger_ids():
        wait = bucket.take(trio.current_time())
        if wait:
            await trio.sleep(wait)
        try:
            md, _ = await client.ledgers.read(lid)
        except NoNodeError:
            continue
        rec = records.get(lid)
        reported = dict(rec.missing_entries) if rec else {}
        unknown = [b for b in rec.missing_replicas
                   if b in available and b not in reported] if rec else []
        named = {b for _, ens in md.ensembles for b in ens}
        lac: int | None = None
        size = mean_entry_bytes(md)
        if not md.is_closed and (named - available or named & (set(reported) | set(unknown))):
            got = await _lac(client, lid, md, available)
            if got is not None:
                lac, size = got
        debts.append(ledger_debt(lid, md, available, lac=lac, reported=reported,
                                 reported_unknown=unknown, entry_bytes=size))
    return debts, {lid: r.ctime_ms for lid, r in records.items()}


async def durability_report(client: Client, *, rate: RepairRate | None = None,
                            metadata_reads_per_s: float = 0.0,
                            now_ms: int) -> tuple[DurabilityReport, list[LedgerDebt]]:
    """The cluster's report now (``rate``: the auditor's samples, fed this report's
    debt before the estimate is made)."""
    debts, marks = await collect_debts(client, metadata_reads_per_s=metadata_reads_per_s)
    if rate is not None:
        rate.observe(trio.current_time(), sum(d.bytes_below_qw for d in debts),
                     sum(d.entries_below_qw for d in debts))
    return summarize(debts, marks, now_ms=now_ms, rate=rate), debts


async def publish_report(store: MetadataStore, root: str, report: DurabilityReport,
                         now_ms: int) -> None:
    """Write the auditor's report where the shell reads it (best effort)."""
    data = json.dumps({**report.to_json(), "computed_ms": now_ms}).encode()
    path = published_path(root)
    try:
        await store.set(path, data)
    except NoNodeError:
        try:
            await store.create(path, data, make_parents=True)
        except NodeExistsError:
            await store.set(path, data)


async def published_report(store: MetadataStore, root: str) -> dict[str, Any] | None:
    """The auditor's last published report, or None."""
    try:
        raw, _ = await store.get(published_path(root))
    except NoNodeError:
        return None
    try:
        doc = json.loads(raw)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None
