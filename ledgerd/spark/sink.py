"""Writing DataFrames into logs: the batch writer and the exactly-once streaming writer.

Both have each task write its rows into a ledger of its own and close it; the driver's
commit adds the task ledgers to the log's list in partition order with one
compare-and-set (after fencing the log's tail). The streaming writer's CAS also records
``(query id, batch id)`` in the log record (``LogRecord.commits``): a micro-batch that
Spark replays after a driver crash (its sink commit done, its commit log entry not yet
written) is recognised by that CAS, changes nothing, and its new ledgers are deleted.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage
from pyspark.sql.types import BinaryType, Row, StringType, StructType

from ledgerd.base.logs import fields
from ledgerd.errors import LedgerdError, NoSuchLedgerError
from ledgerd.ledgerlog import BatchAlreadyAppendedError
from ledgerd.spark.options import SourceOptionError, WriteOptions
from ledgerd.spark.orphans import delete_quietly, sweep_stream_orphans
from ledgerd.spark.worker import client_for
from ledgerd.sync import SyncClient

__all__ = ["LedgerdCommit", "LedgerdStreamCommit", "LedgerdStreamWriter", "LedgerdWriter"]

log = logging.getLogger(__name__)

# Test hook: seconds a streaming commit sleeps after its CAS, so a test can stop the
# driver inside the window that Spark replays a batch from.
PAUSE_ENV = "LEDGERD_TEST_SPARK_COMMIT_PAUSE_S"


@dataclass
class LedgerdCommit(WriterCommitMessage):
    partition: int
    ledger_id: int | None
    entries: int


@dataclass
class LedgerdStreamCommit(WriterCommitMessage):
    partition: int
    ledger_id: int | None
    entries: int
    query_id: str
    batch_id: int


def _payload_column(schema: StructType) -> int | None:
    names = [f.name for f in schema.fields]
    index = names.index("payload") if "payload" in names else None
    if index is not None:
        kind = schema.fields[index].dataType
        if not isinstance(kind, (BinaryType, StringType)):
            raise SourceOptionError("schema", f"payload {kind.simpleString()}",
                                    "a binary or string payload column (or no payload "
                                    "column: each row is written as a JSON object)")
    return index


def _encoder(log_name: str, payload: int | None) -> Any:
    def encode(row: Row) -> bytes:
        if payload is None:
            return json.dumps(row.asDict(recursive=True), default=str,
                              separators=(",", ":")).encode()
        value = row[payload]
        if value is None:
            raise LedgerdError(f"log {log_name!r}: a row has a null payload")
        return value.encode() if isinstance(value, str) else bytes(value)
    return encode


def _write_task(opts: WriteOptions, rows: Iterator[Row], encode: Any,
                tags: Mapping[str, str]) -> tuple[int | None, int]:
    """Write ``rows`` into a new ledger (created at the first row, tagged), close it;
    returns (ledger id or None for no rows, entries). A failed task deletes its ledger."""
    client = client_for(opts.client)
    lh = None
    count = 0
    try:
        batch: list[bytes] = []
        for row in rows:
            batch.append(encode(row))
            if len(batch) >= opts.batch:
                if lh is None:
                    lh = _create(client, opts, tags)
                count += len(lh.append_many(batch))
                batch = []
        if batch:
            if lh is None:
                lh = _create(client, opts, tags)
            count += len(lh.append_many(batch))
        if lh is not None:
            lh.close()
    except BaseException:
        if lh is not None:
            delete_quietly(client, lh.ledger_id)  # a failed task leaves no ledger
        raise
    return (lh.ledger_id if lh is not None else None), count


def _create(client: SyncClient, o: WriteOptions, tags: Mapping[str, str]) -> Any:
    return client.create_ledger(o.ensemble_size, o.write_quorum, o.ack_quorum,
                                password=o.password, custom_metadata=dict(tags))


def _ensure_log(client: SyncClient, name: str) -> None:
    if name not in client.logs.names():
        client.call(client.client.logs.store.create, name)


def _task_context() -> Any:
    from pyspark import TaskContext

    return TaskContext.get()


class LedgerdWriter(DataSourceWriter):
    """Each task writes its rows into a ledger of its own and closes it; the commit adds
    the ledgers to the log with one CAS, in partition order; abort deletes them."""

    def __init__(self, opts: WriteOptions, schema: StructType) -> None:
        self.opts = opts
        self.write_id = uuid.uuid4().hex  # tags this job's ledgers (the driver's abort scan)
        self.encode = _encoder(opts.log, _payload_column(schema))

    def write(self, iterator: Iterator[Row]) -> LedgerdCommit:
        ctx = _task_context()
        partition = ctx.partitionId() if ctx is not None else 0
        tags = {"log": self.opts.log, "spark_partition": str(partition),
                "spark_write": self.write_id}
        ledger_id, count = _write_task(self.opts, iterator, self.encode, tags)
        return LedgerdCommit(partition, ledger_id, count)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        done = sorted((m for m in messages if isinstance(m, LedgerdCommit)),
                      key=lambda m: m.partition)
        ids = [m.ledger_id for m in done if m.ledger_id is not None]
        client = client_for(self.opts.client)
        if ids:
            client.logs.append_ledgers(self.opts.log, ids, password=self.opts.password)
        else:
            _ensure_log(client, self.opts.log)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Delete the finished tasks' ledgers, then any other ledger tagged with this
        write: a task Spark killed when the job failed never ran its own cleanup."""
        client = client_for(self.opts.client)
        for m in messages:
            if isinstance(m, LedgerdCommit) and m.ledger_id is not None:
                delete_quietly(client, m.ledger_id)
        for lid in client.list_ledgers():
            try:
                tag = client.ledger_metadata(lid).custom_metadata.get("spark_write")
            except NoSuchLedgerError:
                continue
            if tag == self.write_id:
                delete_quietly(client, lid)


# Queries whose leftovers this process has swept (the first commit after a start does).
_swept: set[tuple[str, str]] = set()
_swept_lock = threading.Lock()


class LedgerdStreamWriter(DataSourceStreamWriter):
    """``writeStream.format("ledgerd")``: every micro-batch appended to the log exactly
    once (see the module docstring; docs/spark.md states the conditions).

    Tasks tag their ledgers with the query id and batch id Spark gives them
    (``sql.streaming.queryId``, stable across restarts from one checkpoint, and
    ``streaming.sql.batchId``); the commit appends them with ``batch=(query id, batch
    id)``."""

    def __init__(self, opts: WriteOptions, schema: StructType) -> None:
        self.opts = opts
        self.encode = _encoder(opts.log, _payload_column(schema))

    def write(self, iterator: Iterator[Row]) -> LedgerdStreamCommit:
        ctx = _task_context()
        query_id = ctx.getLocalProperty("sql.streaming.queryId") if ctx is not None else None
        batch = ctx.getLocalProperty("streaming.sql.batchId") if ctx is not None else None
        if not query_id or batch is None:
            raise LedgerdError("the ledgerd streaming writer runs inside a Spark streaming "
                               "query only (no query id or batch id in the task)")
        partition = ctx.partitionId()
        tags = {"log": self.opts.log, "spark_partition": str(partition),
                "spark_write": query_id, "spark_batch": str(batch)}
        ledger_id, count = _write_task(self.opts, iterator, self.encode, tags)
        return LedgerdStreamCommit(partition, ledger_id, count, query_id, int(batch))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        done = sorted((m for m in messages if isinstance(m, LedgerdStreamCommit)),
                      key=lambda m: m.partition)
        client = client_for(self.opts.client)
        if not done:  # no task reported: nothing was written
            _ensure_log(client, self.opts.log)
            return
        query_id = done[0].query_id
        ids = [m.ledger_id for m in done if m.ledger_id is not None]
        name, opts = self.opts.log, self.opts
        try:
            if ids:
                client.logs.append_ledgers(name, ids, password=opts.password,
                                           batch=(query_id, batchId))
                log.info("spark_batch_appended", extra=fields(
                    log=name, query=query_id, batch=batchId, ledgers=len(ids),
                    entries=sum(m.entries for m in done)))
            else:
                _ensure_log(client, name)
        except BatchAlreadyAppendedError as exc:
            # A replay: Spark lost its commit record after our CAS. The log holds this
            # batch already; these ledgers are a second copy of it.
            log.info("spark_batch_replayed", extra=fields(
                log=name, query=query_id, batch=batchId, last=exc.last, deleted=len(ids)))
            for lid in ids:
                delete_quietly(client, lid)
        pause = float(os.environ.get(PAUSE_ENV, "0") or 0)
        if pause > 0:
            time.sleep(pause)
        key = (name, query_id)
        with _swept_lock:
            first = key not in _swept
            _swept.add(key)
        if first:
            sweep_stream_orphans(client, name, query_id)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Delete the batch's ledgers: the finished tasks', then any other ledger tagged
        with this query and batch that the log does not list (a killed task's)."""
        client = client_for(self.opts.client)
        query_ids = set()
        for m in messages:
            if isinstance(m, LedgerdStreamCommit):
                query_ids.add(m.query_id)
                if m.ledger_id is not None:
                    delete_quietly(client, m.ledger_id)
        for query_id in query_ids:
            sweep_stream_orphans(client, self.opts.log, query_id, batch=batchId)
