"""Ledgers a Spark write left behind: tagged by the write, listed by no log.

A task writes into a ledger tagged ``spark_write`` (the batch job's write id, or the
streaming query's id, with ``spark_batch``); the commit lists it in the log. A task
killed between creating its ledger and the cleanup (a failed job's abort, a driver
crash) leaves a tagged ledger nobody lists. Such a ledger is an orphan when its write is
over: for a streaming query, its batch is at or below the last batch the log recorded
for that query (a replay appended another copy, or the batch committed without it); for
anything, when it is older than the age asked for (``ledgerd shell sweepspark``).

This module imports no pyspark: the shell command uses it too.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from ledgerd.base.logs import fields
from ledgerd.errors import NoSuchLedgerError
from ledgerd.ledgerlog import NoSuchLogError
from ledgerd.sync import SyncClient

__all__ = ["Orphan", "delete_quietly", "find_orphans", "sweep_stream_orphans"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Orphan:
    ledger_id: int
    log: str
    write: str
    batch: int | None
    age_s: float
    why: str


def delete_quietly(client: SyncClient, ledger_id: int) -> None:
    try:
        client.delete_ledger(ledger_id)
    except NoSuchLedgerError:
        pass
    except Exception as exc:  # the caller's own error matters more
        log.warning("ledger_delete_failed", extra=fields(ledger=ledger_id, error=str(exc)))


def _batch(tags: dict[str, str]) -> int | None:
    try:
        return int(tags["spark_batch"])
    except (KeyError, ValueError):
        return None


def find_orphans(client: SyncClient, *, older_than_s: float | None = None,
                 log_name: str | None = None, write: str | None = None,
                 batch: int | None = None) -> list[Orphan]:
    """Tagged, unlisted ledgers whose write is over (see the module docstring). Filters:
    one log, one write (query) id, one batch (then any such ledger of that batch)."""
    logs = [log_name] if log_name is not None else client.logs.names()
    listed: set[int] = set()
    last: dict[str, dict[str, int]] = {}  # log -> query -> last batch recorded
    for name in logs:
        try:
            listed.update(client.logs.ledgers(name))
            record, _ = client.call(client.client.logs.store.get, name)
        except NoSuchLogError:
            continue
        last[name] = dict(record.commits)
    now_ms = time.time() * 1000
    out = []
    for lid in client.list_ledgers():
        if lid in listed:
            continue
        try:
            md = client.ledger_metadata(lid)
        except NoSuchLedgerError:
            continue
        tags = dict(md.custom_metadata)
        tag = tags.get("spark_write")
        owner = tags.get("log", "")
        if tag is None or (write is not None and tag != write):
            continue
        if log_name is not None and owner != log_name:
            continue
        age = max(0.0, (now_ms - md.ctime_ms) / 1000) if md.ctime_ms else 0.0
        b = _batch(tags)
        committed = last.get(owner, {}).get(tag, -1)
        if batch is not None:
            why = f"batch {b} aborted" if b == batch else ""
        elif b is not None and b <= committed:
            why = f"batch {b} <= {committed}, the last the log recorded for this query"
        elif older_than_s is not None and age >= older_than_s:
            why = f"unlisted for {age:.0f}s"
        else:
            why = ""
        if why:
            out.append(Orphan(lid, owner, tag, b, age, why))
    return out


def sweep_stream_orphans(client: SyncClient, log_name: str, query_id: str, *,
                         batch: int | None = None) -> list[int]:
    """Delete a streaming query's orphans in ``log_name`` (all whose batch is at or
    below the last committed one; or, with ``batch``, that batch's unlisted ledgers)."""
    gone = []
    for orphan in find_orphans(client, log_name=log_name, write=query_id, batch=batch):
        delete_quietly(client, orphan.ledger_id)
        gone.append(orphan.ledger_id)
    if gone:
        log.info("spark_orphans_deleted", extra=fields(
            log=log_name, query=query_id, ledgers=",".join(map(str, gone))))
    return gone
