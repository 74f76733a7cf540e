"""Log records: ``<logs root>/<name>`` holds the ordered list of a log's ledgers.

A log built from ledgers is a name and a ledger list, changed only by compare-and-set:
a writer that opens the log appends a new ledger; truncation drops whole ledgers from
the front. JSON ``{"format": 1, "ledgers": [id, ...], "base": N}``: ``base`` is the
dense offset of the first listed ledger's entry 0 (the count of entries truncated
away), so offsets stay stable across truncation. A log backed by one unbounded ledger
lists just that ledger and says ``"unbounded": true``.

``"writers": N`` counts the writers that have opened the log (``open_writer``'s CAS
adds one with its ledger; a roll does not): durable and monotonic, it numbers the
writers' terms (the Kafka gateway's leader epoch). Absent: 0.

``"commits": {"<writer>": N}`` remembers, for writers that append ledgers in numbered
batches (a Spark streaming query, by its id), the last batch appended: the same CAS
that adds a batch's ledgers records its number, so a batch replayed after a crash is
recognised and not appended twice. The most recent ``MAX_COMMITS`` writers are kept.

``"first_seq": N`` is the position in the log of the first listed ledger, counted from the
log's creation (truncation adds the ledgers it drops): ledger ``i`` of the list is the
log's ledger ``first_seq + i``, the ``seq`` its log header records (``logheader``).

``"mark": N`` is a lower bound the application keeps of the log's next position, in its
own numbering, raised (never lowered) by the compare-and-set of a truncation that drops
the ledgers holding it: the Kafka gateway records there the next offset after the last
batch a drop takes, so a writer that finds no batch left listed still goes on after it.
Absent: 0 (as after ``metadata rebuild``, which makes log records anew from the ledgers).

Cursors (a consumer's durable position) live under ``<logs root>/<name>/cursors/<cursor>``
as ``{"format": 1, "offset": N, "ledger": L, "entry": E}`` (the next entry to read),
changed by compare-and-set. A Kafka consumer group's cursor (kept by the Kafka gateway)
also holds ``"kafka": {"offset": K, "metadata": M}``: the committed Kafka offset (which
counts records, not entries), the client's metadata string and, when the client sent
one, the leader epoch (``"leader_epoch"``); its entry fields point at
the batch holding K, so a ledgerd reader can resume there too.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass

from ledgerd.metadata.cas import cas_update
from ledgerd.metadata.errors import CorruptMetadataError, NodeExistsError, NoNodeError
from ledgerd.metadata.store import MetadataStore

__all__ = ["MAX_COMMITS", "CursorRecord", "LogRecord", "LogStore"]

MAX_COMMITS = 64  # writers whose last batch a log record remembers

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")


@dataclass(frozen=True, slots=True)
class LogRecord:
    ledgers: tuple[int, ...] = ()
    base: int = 0
    unbounded: bool = False
    commits: tuple[tuple[str, int], ...] = ()  # (writer, last batch), oldest first
    writers: int = 0  # writers that opened the log (each open_writer adds one)
    first_seq: int = 0  # the position in the log of ledgers[0] (truncated ones count)
    # ledgers dropped from the list whose deletion waits: (ledger id, due, wall-clock ms),
    # moved here by the compare-and-set that drops them, so none is lost to a crash
    deferred: tuple[tuple[int, int], ...] = ()
    mark: int = 0  # the application's lower bound of the log's next position

    @property
    def next_seq(self) -> int:
        """The position in the log the next ledger added gets."""
        return self.first_seq + len(self.ledgers)

    def to_json(self) -> bytes:
        doc: dict[str, object] = {"format": 1, "ledgers": list(self.ledgers)}
        if self.base:
            doc["base"] = self.base
        if self.unbounded:
            doc["unbounded"] = True
        if self.commits:
            doc["commits"] = dict(self.commits)
        if self.writers:
            doc["writers"] = self.writers
        if self.first_seq:
            doc["first_seq"] = self.first_seq
        if self.deferred:
            doc["deferred"] = [list(d) for d in self.deferred]
        if self.mark:
            doc["mark"] = self.mark
        return json.dumps(doc).encode()

    def all_ledgers(self) -> tuple[int, ...]:
        """The listed ledgers and those whose deletion is deferred: every ledger the
        log still owns."""
        return self.ledgers + tuple(lid for lid, _ in self.deferred)

    def last_batch(self, writer: str) -> int:
        """The last batch ``writer`` appended, or -1."""
        return dict(self.commits).get(writer, -1)

    def with_batch(self, writer: str, batch: int) -> tuple[tuple[str, int], ...]:
        """``commits`` with ``writer`` at ``batch`` (moved to the newest end, the oldest
        writers beyond MAX_COMMITS forgotten)."""
        kept = [(w, b) for w, b in self.commits if w != writer] + [(writer, batch)]
        return tuple(kept[-MAX_COMMITS:])

    @classmethod
    def from_json(cls, raw: bytes, path: str) -> LogRecord:
        try:
            doc = json.loads(raw)
            if doc.get("format") != 1:
                raise ValueError(f"unknown format {doc.get('format')!r}")
            ledgers = tuple(doc["ledgers"])
            if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0
                       for x in ledgers):
                raise ValueError("ledgers must be non-negative integers")
            base = doc.get("base", 0)
            if not isinstance(base, int) or isinstance(base, bool) or base < 0:
                raise ValueError(f"base must be a non-negative integer, got {base!r}")
            unbounded = doc.get("unbounded", False) is True
            if unbounded and len(ledgers) != 1:
                raise ValueError("an unbounded log lists exactly one ledger")
            commits = doc.get("commits", {})
            if not isinstance(commits, dict) or not all(
                    isinstance(w, str) and isinstance(b, int) and not isinstance(b, bool)
                    and b >= 0 for w, b in commits.items()):
                raise ValueError("commits must map writer names to batch numbers >= 0")
            writers = doc.get("writers", 0)
            if not isinstance(writers, int) or isinstance(writers, bool) or writers < 0:
                raise ValueError(f"writers must be a non-negative integer, got {writers!r}")
            first_seq = doc.get("first_seq", 0)
            if not isinstance(first_seq, int) or isinstance(first_seq, bool) or first_seq < 0:
                raise ValueError(f"first_seq must be a non-negative integer, got {first_seq!r}")
            deferred = doc.get("deferred", [])
            if not isinstance(deferred, list) or not all(
                    isinstance(d, list) and len(d) == 2
                    and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0
                            for x in d) for d in deferred):
                raise ValueError("deferred must be a list of [ledger id, due ms] pairs of "
                                 "non-negative integers")
            mark = doc.get("mark", 0)
            if not isinstance(mark, int) or isinstance(mark, bool) or mark < 0:
                raise ValueError(f"mark must be a non-negative integer, got {mark!r}")
            return cls(ledgers, base, unbounded, tuple(commits.items()), writers, first_seq,
                       tuple((d[0], d[1]) for d in deferred), mark)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CorruptMetadataError(path, f"not a log record: {exc}") from exc


@dataclass(frozen=True, slots=True)
class CursorRecord:
    """A consumer's durable position: the next entry it reads."""

    offset: int
    ledger_id: int
    entry_id: int
    kafka_offset: int | None = None  # a Kafka group's committed offset (gateway)
    kafka_metadata: str | None = None
    kafka_leader_epoch: int = -1  # the leader epoch committed with it (-1: none)

    def to_json(self) -> bytes:
        doc: dict[str, object] = {"format": 1, "offset": self.offset,
                                  "ledger": self.ledger_id, "entry": self.entry_id}
        if self.kafka_offset is not None:
            kafka: dict[str, object] = {"offset": self.kafka_offset,
                                        "metadata": self.kafka_metadata}
            if self.kafka_leader_epoch >= 0:
                kafka["leader_epoch"] = self.kafka_leader_epoch
            doc["kafka"] = kafka
        return json.dumps(doc).encode()

    @classmethod
    def from_json(cls, raw: bytes, path: str) -> CursorRecord:
        try:
            doc = json.loads(raw)
            if doc.get("format") != 1:
                raise ValueError(f"unknown format {doc.get('format')!r}")
            values: list[int] = [doc["offset"], doc["ledger"], doc["entry"]]
            if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                       for v in values):
                raise ValueError("offset, ledger and entry must be non-negative integers")
            kafka = doc.get("kafka")
            if kafka is None:
                return cls(values[0], values[1], values[2])
            k_offset, k_meta = kafka["offset"], kafka.get("metadata")
            if (not isinstance(k_offset, int) or isinstance(k_offset, bool) or k_offset < 0
                    or not (k_meta is None or isinstance(k_meta, str))):
                raise ValueError("kafka must hold an offset >= 0 and a metadata string")
            epoch = kafka.get("leader_epoch", -1)
            if not isinstance(epoch, int) or isinstance(epoch, bool):
                raise ValueError("kafka leader_epoch must be an integer")
            return cls(values[0], values[1], values[2], k_offset, k_meta, epoch)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CorruptMetadataError(path, f"not a cursor record: {exc}") from exc


class LogStore:
    def __init__(self, store: MetadataStore, root: str = "/logs") -> None:
        self.store = store
        self.root = root

    def path(self, name: str) -> str:
        if not _NAME.match(name):
            raise ValueError(f"invalid log name {name!r} (letters, digits, . _ -; up to 200)")
        return f"{self.root}/{name}"

    async def create(self, name: str, record: LogRecord = LogRecord()) -> int:
        await self.store.create(self.path(name), record.to_json(), make_parents=True)
        return 0

    async def get(self, name: str) -> tuple[LogRecord, int]:
        path = self.path(name)
        raw, stat = await self.store.get(path)
        return LogRecord.from_json(raw, path), stat.version

    async def write(self, name: str, record: LogRecord, version: int) -> int:
        return (await self.store.set(self.path(name), record.to_json(), version)).version

    async def update(self, name: str,
                     change: Callable[[LogRecord], LogRecord]) -> tuple[LogRecord, int]:
        return await cas_update(self.store, self.path(name), change,
                                decode=LogRecord.from_json, encode=LogRecord.to_json)

    async def delete(self, name: str, version: int = -1) -> None:
        """Delete the log record (its cursors first)."""
        for cursor in await self.cursors(name):
            try:
                await self.store.delete(self.cursor_path(name, cursor))
            except NoNodeError:
                pass
        cursors = f"{self.path(name)}/cursors"
        if await self.store.exists(cursors) is not None:
            try:
                await self.store.delete(cursors)
            except NoNodeError:
                pass
        await self.store.delete(self.path(name), version)

    # -- cursors -------------------------------------------------------------------------

    def cursor_path(self, name: str, cursor: str) -> str:
        if not _NAME.match(cursor):
            raise ValueError(f"invalid cursor name {cursor!r} (letters, digits, . _ -; up "
                             "to 200)")
        return f"{self.path(name)}/cursors/{cursor}"

    async def ensure_cursors(self, name: str) -> None:
        """Make the log's ``cursors`` node unless it exists (a multi that creates a
        cursor needs its parent); NoNodeError if the log has no record."""
        try:
            await self.store.create(f"{self.path(name)}/cursors")
        except NodeExistsError:
            pass

    async def cursors(self, name: str) -> list[str]:
        path = f"{self.path(name)}/cursors"
        if await self.store.exists(path) is None:
            return []
        return sorted(await self.store.children(path))

    async def get_cursor(self, name: str, cursor: str) -> tuple[CursorRecord, int] | None:
        """The cursor and its version, or None if it was never committed."""
        path = self.cursor_path(name, cursor)
        try:
            raw, stat = await self.store.get(path)
        except NoNodeError:
            return None
        return CursorRecord.from_json(raw, path), stat.version

    async def put_cursor(self, name: str, cursor: str, record: CursorRecord,
                         version: int | None) -> int:
        """Write the cursor by compare-and-set (``version`` None: create it); returns the
        new version. Raises BadVersionError / NodeExistsError when another committed."""
        path = self.cursor_path(name, cursor)
        if version is None:
            await self.store.create(path, record.to_json(), make_parents=True)
            return 0
        return (await self.store.set(path, record.to_json(), version)).version

    async def delete_cursor(self, name: str, cursor: str) -> bool:
        """Delete the cursor; False if it did not exist."""
        try:
            await self.store.delete(self.cursor_path(name, cursor))
        except NoNodeError:
            return False
        return True

    async def names(self) -> list[str]:
        if await self.store.exists(self.root) is None:
            return []
        return sorted(await self.store.children(self.root))
