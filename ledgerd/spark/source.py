"""The ``ledgerd`` PySpark data source: batch reads, streaming reads, and the writer.

Register it once per session, then use it by name::

    import ledgerd.spark
    ledgerd.spark.register(spark)
    df = (spark.read.format("ledgerd").option("zk", "127.0.0.1:2181/ledgerd")
          .option("log", "events").option("password", "pw").load())

Reads never fence: a closed ledger is read to its end, an open one to the LAC seen when
the read was planned. Each partition is one ``LedgerRange`` inside one fragment; the
task reads it with ReadRange through the client (digests verified, failover to the next
replica) and yields Arrow record batches. See docs/spark.md for every option.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    BinaryType,
    LongType,
    StringType,
    StructType,
)

from ledgerd.errors import LedgerdError, NoSuchLedgerError
from ledgerd.metadata.logheader import first_log_entry
from ledgerd.spark.options import (
    ID_COLUMNS,
    LedgerRange,
    Offset,
    ReadOptions,
    SourceOptionError,
    WriteOptions,
    plan_ranges,
)
from ledgerd.spark.sink import LedgerdStreamWriter, LedgerdWriter
from ledgerd.spark.worker import client_for
from ledgerd.sync import SyncClient
from ledgerd.wire.entry import Entry

__all__ = ["LedgerdDataSource", "LedgerdReader", "LedgerdStreamReader", "LedgerdStreamWriter",
           "LedgerdWriter"]

log = logging.getLogger(__name__)

SCHEMA = "ledger_id long, entry_id long, payload binary"
SCHEMA_UTF8 = "ledger_id long, entry_id long, payload string"


class LedgerdDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "ledgerd"

    def schema(self) -> str:
        decode = str(self.options.get("decode", "binary")).lower()
        if decode == "json":
            raise SourceOptionError("decode", "json", "json only with a schema naming the "
                                    "columns, e.g. .schema('ledger_id long, entry_id long, "
                                    "user string, amount double')")
        return SCHEMA_UTF8 if decode == "utf8" else SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return LedgerdReader(ReadOptions.parse(self.options), schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return LedgerdStreamReader(ReadOptions.parse(self.options, streaming=True), schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if overwrite:
            raise SourceOptionError("mode", "overwrite", "append (a log is only appended to)")
        return LedgerdWriter(WriteOptions.parse(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        if overwrite:
            raise SourceOptionError("outputMode", "complete", "append (a log is only "
                                    "appended to)")
        return LedgerdStreamWriter(WriteOptions.parse(self.options), schema)


# -- reading ---------------------------------------------------------------------------

def _check_schema(schema: StructType, decode: str) -> None:
    for f in schema.fields:
        if f.name in ID_COLUMNS:
            if not isinstance(f.dataType, LongType):
                raise SourceOptionError("schema", f"{f.name} {f.dataType.simpleString()}",
                                        f"{f.name} long")
        elif decode == "binary" and f.name == "payload":
            if not isinstance(f.dataType, BinaryType):
                raise SourceOptionError("schema", f"payload {f.dataType.simpleString()}",
                                        "payload binary (or decode=utf8 for a string)")
        elif decode == "utf8" and f.name == "payload":
            if not isinstance(f.dataType, StringType):
                raise SourceOptionError("schema", f"payload {f.dataType.simpleString()}",
                                        "payload string with decode=utf8")
        elif decode != "json":
            raise SourceOptionError("schema", f.name, "ledger_id, entry_id and payload "
                                    "(decode=json maps other columns to JSON fields)")


def _readable_end(client: SyncClient, ledger_id: int, password: str
                  ) -> tuple[int, bool, list[int], int]:
    """(last readable entry, closed?, fragment starts, first data entry) without fencing;
    the first data entry is 1 when entry 0 is a log header (``metadata.logheader``)."""
    rh = client.open_ledger(ledger_id, password, recovery=False)
    md = rh.metadata
    last = md.last_entry_id if md.is_closed else rh.read_lac()
    return (last, md.is_closed, [first for first, _ in md.ensembles],
            first_log_entry(md.custom_metadata))


def _arrow_batch(schema: StructType, decode: str, entries: list[Entry]) -> pa.RecordBatch:
    arrays = []
    for f in schema.fields:
        if f.name == "ledger_id":
            arrays.append(pa.array([e.ledger_id for e in entries], pa.int64()))
        elif f.name == "entry_id":
            arrays.append(pa.array([e.entry_id for e in entries], pa.int64()))
        elif decode == "binary":
            arrays.append(pa.array([e.payload for e in entries], pa.binary()))
        else:
            texts = []
            for e in entries:
                try:
                    texts.append(e.payload.decode("utf-8"))
                except UnicodeDecodeError as exc:
                    raise LedgerdError(f"ledger {e.ledger_id} entry {e.entry_id}: payload is "
                                       f"not UTF-8 ({exc.reason} at byte {exc.start})") from None
            arrays.append(pa.array(texts, pa.string()))
    return pa.RecordBatch.from_arrays(arrays, names=[f.name for f in schema.fields])


def _json_rows(schema: StructType, entries: list[Entry]) -> Iterator[tuple[Any, ...]]:
    for e in entries:
        try:
            doc = json.loads(e.payload)
        except ValueError as exc:
            raise LedgerdError(f"ledger {e.ledger_id} entry {e.entry_id}: payload is not "
                               f"JSON ({exc})") from None
        if not isinstance(doc, dict):
            raise LedgerdError(f"ledger {e.ledger_id} entry {e.entry_id}: payload is JSON "
                               f"but not an object ({type(doc).__name__})")
        yield tuple(e.ledger_id if f.name == "ledger_id" else
                    e.entry_id if f.name == "entry_id" else doc.get(f.name)
                    for f in schema.fields)


def read_partition(opts: ReadOptions, schema: StructType,
                   r: LedgerRange) -> Iterator[pa.RecordBatch | tuple[Any, ...]]:
    """Read one partition on an executor; fails naming the ledger when it cannot."""
    client = client_for(opts.client)
    what = f"ledger {r.ledger_id} entries {r.first}..{r.last}"
    try:
        rh = client.open_ledger(r.ledger_id, opts.password, recovery=False)
    except NoSuchLedgerError:
        raise LedgerdError(f"{what}: the ledger was deleted before it was read") from None
    if r.last > rh.last_add_confirmed:
        rh.read_lac()  # planned against a LAC this fresh handle has not seen yet
    batch: list[Entry] = []
    for entry in rh.read(r.first, r.last, window=opts.read_window):
        batch.append(entry)
        if len(batch) >= opts.read_window:
            yield from _emit(schema, opts.decode, batch)
            batch = []
    if batch:
        yield from _emit(schema, opts.decode, batch)
    try:  # the rows must not outlive their ledger: a deletion mid-read fails the task
        client.ledger_metadata(r.ledger_id)
    except NoSuchLedgerError:
        raise LedgerdError(f"{what}: the ledger was deleted while it was read") from None


def _emit(schema: StructType, decode: str,
          entries: list[Entry]) -> Iterator[pa.RecordBatch | tuple[Any, ...]]:
    if decode == "json":
        yield from _json_rows(schema, entries)
    else:
        yield _arrow_batch(schema, decode, entries)


class LedgerdReader(DataSourceReader):
    def __init__(self, opts: ReadOptions, schema: StructType) -> None:
        _check_schema(schema, opts.decode)
        self.opts = opts
        self.schema = schema

    def partitions(self) -> Sequence[InputPartition]:
        opts = self.opts
        client = client_for(opts.client)
        ledgers = client.logs.ledgers(opts.log) if opts.log else opts.ledgers
        out: list[InputPartition] = []
        for lid in ledgers:
            end, closed, starts, head = _readable_end(client, lid, opts.password)
            last = end if opts.last_entry is None else opts.last_entry
            if last > end:
                raise LedgerdError(f"ledger {lid}: last_entry {last} is past its "
                                   f"{'last' if closed else 'last confirmed'} entry {end}")
            first = max(opts.first_entry, head)
            out += [InputPartition(r) for r in plan_ranges(
                lid, starts, first, last, opts.entries_per_partition, closed=closed)]
        return out

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch | tuple[Any, ...]]:
        return read_partition(self.opts, self.schema, partition.value)


# -- streaming -------------------------------------------------------------------------

class LedgerdStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Tails a log (or one open ledger). An offset is the last entry read; an end offset
    never passes a ledger that is still open, so a batch's rows are fixed once planned."""

    def __init__(self, opts: ReadOptions, schema: StructType) -> None:
        _check_schema(schema, opts.decode)
        self.opts = opts
        self.schema = schema
        self.target: Offset | None = None
        self.seen: Offset | None = None  # the furthest offset the last walk found

    @property
    def client(self) -> SyncClient:
        return client_for(self.opts.client)

    def _ledgers(self) -> tuple[int, ...]:
        if self.opts.log:
            return self.client.logs.ledgers(self.opts.log)
        return self.opts.ledgers

    def _index(self, ledgers: tuple[int, ...], offset: Offset) -> int:
        if offset.ledger == -1:
            return 0
        try:
            return ledgers.index(offset.ledger)
        except ValueError:
            raise LedgerdError(f"log {self.opts.log!r}: ledger {offset.ledger} of the stream's "
                               "offset is no longer in the log (truncated?)") from None

    def initialOffset(self) -> dict[str, int]:
        start = self.opts.starting
        if start == "latest":
            return self._walk(Offset(-1, -1), None).to_dict()
        if start != "earliest":
            return Offset.parse(start, "startingOffsets").to_dict()
        return Offset(-1, -1).to_dict()

    def _walk(self, start: Offset, max_rows: int | None) -> Offset:
        """The furthest readable offset from ``start`` (at most ``max_rows`` entries on)."""
        ledgers = self._ledgers()
        if not ledgers:
            return start
        i = self._index(ledgers, start)
        pos = start if start.ledger != -1 else Offset(ledgers[0], -1)
        budget = max_rows
        for lid in ledgers[i:]:
            end, closed, _, head = _readable_end(self.client, lid, self.opts.password)
            first = max(pos.entry + 1 if lid == pos.ledger else 0, head)
            available = max(0, end - first + 1)
            if budget is not None and available >= budget:
                return Offset(lid, first + budget - 1)
            if available:
                pos = Offset(lid, end)
            elif lid != pos.ledger:
                pos = Offset(lid, -1)
            if budget is not None:
                budget -= available
            if not closed:
                break  # never past an open ledger: its end is not fixed yet
        return pos

    def _before(self, a: Offset, b: Offset, ledgers: tuple[int, ...]) -> bool:
        return (self._index(ledgers, a), a.entry) < (self._index(ledgers, b), b.entry)

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = self._walk(Offset(-1, -1), None)

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.opts.max_entries_per_trigger
        return ReadAllAvailable() if n is None else ReadMaxRows(n)

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        begin = Offset.from_dict(start, "start offset")
        rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        end = self.seen = self._walk(begin, rows)
        if self.target is not None and self.target.ledger != -1:
            ledgers = self._ledgers()
            if self._before(self.target, end, ledgers):
                end = self.target
            if begin.ledger != -1 and not self._before(begin, end, ledgers):
                end = begin
        return end.to_dict()

    def reportLatestOffset(self) -> dict[str, int] | None:
        """For the query's progress: what ``latestOffset`` last found (no extra reads)."""
        return self.seen.to_dict() if self.seen is not None else None

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        s = Offset.from_dict(start, "start offset")
        e = Offset.from_dict(end, "end offset")
        if e.ledger == -1 or s == e:
            return []
        ledgers = self._ledgers()
        i, j = self._index(ledgers, s), self._index(ledgers, e)
        out: list[InputPartition] = []
        for lid in ledgers[i:j + 1]:
            md = self.client.ledger_metadata(lid)
            first = max(s.entry + 1 if lid == s.ledger else 0,
                        first_log_entry(md.custom_metadata))
            if lid == e.ledger:
                last = e.entry
            elif md.is_closed:
                last = md.last_entry_id
            else:
                raise LedgerdError(f"ledger {lid}: open, yet the stream's end offset is past "
                                   "it (the log's writer must close it before it is passed)")
            out += [InputPartition(r) for r in plan_ranges(
                lid, [f for f, _ in md.ensembles], first, last,
                self.opts.entries_per_partition, closed=True)]
        return out

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch | tuple[Any, ...]]:
        return read_partition(self.opts, self.schema, partition.value)

    def commit(self, end: dict[str, int]) -> None:
        """Nothing to release: offsets live in Spark's checkpoint, not in ledgerd."""

    def stop(self) -> None:
        """The process's client stays for the next query (see ledgerd.spark.worker)."""
