"""What the Spark sources are asked for, and how reads split into partitions (no pyspark).

Options are strings (Spark's); every one is checked here, and a bad one raises
``SourceOptionError`` naming the option, the value and what is allowed.

Partition planning is pure: a ledger's readable range is cut at its fragment
boundaries, then into pieces of ``entries_per_partition``, so every partition is read
from one ensemble.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields

from ledgerd.base.settings import ENV_PREFIX, load_config
from ledgerd.config import ClientConfig

__all__ = ["DECODES", "LedgerRange", "Offset", "ReadOptions", "SourceOptionError",
           "WriteOptions", "client_config", "plan_ranges"]

DECODES = ("binary", "utf8", "json")
ID_COLUMNS = ("ledger_id", "entry_id")


class SourceOptionError(ValueError):
    def __init__(self, key: str, value: object, allowed: str) -> None:
        super().__init__(f"ledgerd option {key!r}: got {value!r}; allowed: {allowed}")
        self.key = key


def _int(options: Mapping[str, str], key: str, default: int, minimum: int) -> int:
    raw = options.get(key)
    if raw is None:
        return default
    try:
        value = int(str(raw), 10)
    except ValueError:
        raise SourceOptionError(key, raw, f"an integer >= {minimum}") from None
    if value < minimum:
        raise SourceOptionError(key, raw, f"an integer >= {minimum}")
    return value


def _ids(key: str, raw: str) -> tuple[int, ...]:
    try:
        ids = tuple(int(x) for x in raw.replace(" ", "").split(",") if x)
    except ValueError:
        raise SourceOptionError(key, raw, "comma-separated ledger ids") from None
    if not ids or any(i < 0 for i in ids):
        raise SourceOptionError(key, raw, "comma-separated non-negative ledger ids")
    return ids


def client_config(options: Mapping[str, str]) -> ClientConfig:
    """The client's settings: ``zk`` (or ``zk_servers``), then any ``client.<key>``
    ClientConfig key, over the ``LEDGERD_*`` environment."""
    known = {f.name for f in fields(ClientConfig)}
    env = {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIX)}
    zk = options.get("zk") or options.get("zk_servers")
    if zk:
        env[f"{ENV_PREFIX}ZK_SERVERS"] = zk
    for key, value in options.items():
        if key.startswith("client."):
            name = key[len("client."):]
            if name not in known:
                raise SourceOptionError(key, value, "client.<a ClientConfig key>: "
                                        + ", ".join(sorted(known)))
            env[f"{ENV_PREFIX}{name.upper()}"] = str(value)
    return load_config(ClientConfig, env=env)


@dataclass(frozen=True)
class ReadOptions:
    ledgers: tuple[int, ...] = ()
    log: str | None = None
    first_entry: int = 0
    last_entry: int | None = None
    entries_per_partition: int = 50_000
    read_window: int = 2048
    decode: str = "binary"
    password: str = ""
    starting: str = "earliest"
    max_entries_per_trigger: int | None = None
    client: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, options: Mapping[str, str], *, streaming: bool = False) -> ReadOptions:
        opts = {k.lower(): str(v) for k, v in options.items()}  # Spark's are case-blind
        ledgers: tuple[int, ...] = ()
        for key in ("ledger", "ledgers"):
            if key in opts:
                ledgers += _ids(key, opts[key])
        log = opts.get("log")
        if bool(ledgers) == bool(log):
            raise SourceOptionError("ledgers/log", {"ledgers": opts.get("ledgers"),
                                                    "ledger": opts.get("ledger"), "log": log},
                                    "exactly one of ledger, ledgers or log")
        if streaming and len(ledgers) > 1:
            raise SourceOptionError("ledgers", opts.get("ledgers"),
                                    "one ledger (or a log) for a streaming read")
        first = _int(opts, "first_entry", 0, 0)
        last = _int(opts, "last_entry", -1, 0) if "last_entry" in opts else None
        if (first or last is not None) and (log or streaming):
            raise SourceOptionError("first_entry/last_entry", (first, last),
                                    "an entry range only with ledger ids, in a batch read")
        if last is not None and last < first:
            raise SourceOptionError("last_entry", last, f"at least first_entry ({first})")
        decode = opts.get("decode", "binary").lower()
        if decode not in DECODES:
            raise SourceOptionError("decode", decode, ", ".join(DECODES))
        starting = opts.get("startingoffsets", opts.get("starting_offsets", "earliest"))
        if starting not in ("earliest", "latest"):
            Offset.parse(starting, "startingOffsets")
        max_rows = (_int(opts, "maxentriespertrigger", 1, 1)
                    if "maxentriespertrigger" in opts else None)
        client_config(opts)  # check the client options now, on the driver
        return cls(ledgers=ledgers, log=log, first_entry=first, last_entry=last,
                   entries_per_partition=_int(opts, "entries_per_partition", 50_000, 1),
                   read_window=_int(opts, "read_window", 2048, 1), decode=decode,
                   password=opts.get("password", ""), starting=starting,
                   max_entries_per_trigger=max_rows,
                   client={k: v for k, v in opts.items()
                           if k in ("zk", "zk_servers") or k.startswith("client.")})


@dataclass(frozen=True)
class WriteOptions:
    log: str
    ensemble_size: int | None
    write_quorum: int | None
    ack_quorum: int | None
    password: str
    batch: int
    client: Mapping[str, str]

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> WriteOptions:
        opts = {k.lower(): str(v) for k, v in options.items()}
        log = opts.get("log")
        if not log:
            raise SourceOptionError("log", log, "the name of the log to append to")
        quorums = [(_int(opts, k, 0, 1) if k in opts else None)
                   for k in ("ensemble_size", "write_quorum", "ack_quorum")]
        client_config(opts)
        client = {k: v for k, v in opts.items()
                  if k in ("zk", "zk_servers") or k.startswith("client.")}
        # A writer task is a bulk loader: the client's per-handle default of 5000
        # adds/s would make it one. `client.throttle` asks for a limit.
        client.setdefault("client.throttle", "0")
        return cls(log, quorums[0], quorums[1], quorums[2], opts.get("password", ""),
                   _int(opts, "batch", 1000, 1), client)


@dataclass(frozen=True, slots=True)
class Offset:
    """A stream position: the last entry read (``entry = -1``: none of ``ledger`` yet;
    ``ledger = -1``: nothing at all)."""

    ledger: int
    entry: int

    def to_dict(self) -> dict[str, int]:
        return {"ledger": self.ledger, "entry": self.entry}

    @classmethod
    def from_dict(cls, doc: Mapping[str, object], what: str = "offset") -> Offset:
        try:
            ledger, entry = doc["ledger"], doc["entry"]
            if not isinstance(ledger, int) or not isinstance(entry, int):
                raise TypeError("ledger and entry must be integers")
            if ledger < -1 or entry < -1:
                raise ValueError("ledger and entry must be >= -1")
        except (KeyError, TypeError, ValueError) as exc:
            raise SourceOptionError(what, dict(doc), '{"ledger": id, "entry": id} '
                                    f"({exc})") from None
        return cls(ledger, entry)

    @classmethod
    def parse(cls, text: str, what: str = "offset") -> Offset:
        try:
            doc = json.loads(text)
        except ValueError:
            raise SourceOptionError(what, text, 'earliest, latest or {"ledger": id, '
                                    '"entry": id}') from None
        if not isinstance(doc, dict):
            raise SourceOptionError(what, text, '{"ledger": id, "entry": id}')
        return cls.from_dict(doc, what)


@dataclass(frozen=True, slots=True)
class LedgerRange:
    """One partition: entries ``first..last`` of a ledger, all in one fragment."""

    ledger_id: int
    first: int
    last: int
    closed: bool  # read to a fixed end (a closed ledger) or to a LAC seen when planned


def plan_ranges(ledger_id: int, fragment_starts: list[int], first: int, last: int,
                per_partition: int, *, closed: bool) -> list[LedgerRange]:
    """Cut ``first..last`` at each fragment start, then into ``per_partition`` pieces."""
    if first > last:
        return []
    bounds = sorted({s for s in fragment_starts if first < s <= last})
    out = []
    lo = first
    for hi_next in [*bounds, last + 1]:
        for a in range(lo, hi_next, per_partition):
            out.append(LedgerRange(ledger_id, a, min(hi_next - 1, a + per_partition - 1),
                                   closed))
        lo = hi_next
    return out
