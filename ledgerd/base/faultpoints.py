"""Every named fault point, in one registry: crash points, storage faults, harness faults.

A fault point is a place where a test makes the appliance fail on purpose, named so a
test states *where* instead of guessing *when*. Three kinds, one table:

- ``crash``: ``crash_point(name)`` in ``disk/``, the GC and the Kafka cleaner (``ledgerd/base/crashpoints.py``) sends
  SIGKILL to its own process when ``LEDGERD_CRASH_AT=name`` (or ``name:n``, the n-th time
  it is reached) is set: the death of ``kill -9`` or of a power cut that spares the disk.
- ``storage``: rules the native helper applies before a ``pwrite``/``fdatasync``
  (``native/faults.py``); a bookie started with ``LEDGERD_FAULT_PLAN=<file>`` arms the
  rules of that file on SIGUSR2. Each named storage fault is a list of ``FaultRule``.
- ``harness``: faults the fault harness makes from outside the process (links cut or
  slowed by its proxy, processes paused, killed or restarted, ZooKeeper restarted).

This module is on the ground floor, importing nothing of ours, so the low-level hooks in
``disk/`` and ``native/`` read it without importing anything above them;
``ledgerd.testing.faults`` is its public face for tests and applications.
"""

from __future__ import annotations

import errno
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "CRASH_ENV",
    "CRASH_POINTS",
    "FAULT_PLAN_ENV",
    "HARNESS_FAULTS",
    "POINTS",
    "STORAGE_FAULTS",
    "STORAGE_OPS",
    "STORAGE_TAGS",
    "FaultPoint",
    "FaultRule",
    "crash_env",
    "parse_crash_spec",
    "point",
]

CRASH_ENV = "LEDGERD_CRASH_AT"
FAULT_PLAN_ENV = "LEDGERD_FAULT_PLAN"

Kind = Literal["crash", "storage", "harness"]
Target = Literal["any", "journal", "entrylog"]
Op = Literal["write", "fsync"]

# What a file holds, as the native helper tags it (``native.tag_fd``).
STORAGE_TAGS: Mapping[str, int] = {"any": 0, "journal": 1, "entrylog": 2}
STORAGE_OPS = ("write", "fsync")


@dataclass(frozen=True, slots=True, kw_only=True)
class FaultPoint:
    name: str
    kind: Kind
    doc: str


@dataclass(frozen=True, slots=True)
class FaultRule:
    """Fail (or, for writes, shorten) the matching operations ``skip + 1`` to
    ``skip + times`` on files holding ``target``."""

    op: Op
    target: Target = "any"
    error: str | None = "EIO"   # an errno name; None with short=True
    short: bool = False
    skip: int = 0
    times: int = 1

    def __post_init__(self) -> None:
        if self.op not in STORAGE_OPS:
            raise ValueError(f"fault op must be one of {sorted(STORAGE_OPS)}, got {self.op!r}")
        if self.target not in STORAGE_TAGS:
            raise ValueError(f"fault target must be one of {sorted(STORAGE_TAGS)}, "
                             f"got {self.target!r}")
        if self.short and self.op != "write":
            raise ValueError("only a write can come back short")
        if not self.short and (self.error is None or not hasattr(errno, self.error)):
            raise ValueError(f"fault error must be an errno name, got {self.error!r}")
        if self.skip < 0 or self.times < 1:
            raise ValueError(f"skip must be >= 0 and times >= 1, got {self.skip}, {self.times}")

    def to_json(self) -> dict[str, Any]:
        return {"op": self.op, "target": self.target, "error": self.error, "short": self.short,
                "skip": self.skip, "times": self.times}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> FaultRule:
        return cls(op=raw["op"], target=raw.get("target", "any"), error=raw.get("error"),
                   short=bool(raw.get("short", False)), skip=int(raw.get("skip", 0)),
                   times=int(raw.get("times", 1)))


# The crash points (docs/storage-format.md, "Compaction and GC, crash-safe order").
CRASH_POINTS: Mapping[str, str] = {
    "compaction.copying": "after a first batch of live entries was re-appended",
    "compaction.copied": "the copies durable, the index not yet pointing at them",
    "compaction.index_flush": "the index written, not yet fsynced",
    "compaction.deleting": "the index durable, the old log not yet unlinked",
    "gc.deleting_ledgers": "a ledger's index unlinked, the others not yet",
    "gc.deleting_logs": "dead logs about to be unlinked",
    "index.created": "a checkpoint made a ledger's index file, its header not yet written",
    # the Kafka gateway's log cleaner (kafka/cleaner.py)
    "kafka_compaction.writing": "a replacement ledger created and partly written",
    "kafka_compaction.written": "every replacement closed, the ledger list not yet swapped",
    "kafka_compaction.swapped": "the list names the replacements, old ledgers not deleted",
}

# Storage faults by name: what the native helper fails, and on which files.
STORAGE_FAULTS: Mapping[str, tuple[FaultRule, ...]] = {
    "journal-eio-write": (FaultRule("write", "journal", "EIO", skip=5, times=1000),),
    "journal-eio-fsync": (FaultRule("fsync", "journal", "EIO", skip=5, times=1000),),
    "journal-short-write": (FaultRule("write", "journal", None, short=True, times=1000),),
    "entrylog-eio-write": (FaultRule("write", "entrylog", "EIO", skip=1, times=1000),),
    "entrylog-eio-fsync": (FaultRule("fsync", "entrylog", "EIO", times=1000),),
    "entrylog-short-write": (FaultRule("write", "entrylog", None, short=True, times=1000),),
}

# Faults the harness makes from outside the processes (tools/faults/nemesis.py).
HARNESS_FAULTS: Mapping[str, str] = {
    "partition-client-bookie": "every client cut from one bookie",
    "partition-bookie-zk": "one bookie cut from ZooKeeper",
    "bookie-session-expiry": "one bookie cut from ZooKeeper until its session expires",
    "partition-client-zk": "the writer cut from ZooKeeper briefly",
    "writer-session-expiry": "the writer cut from ZooKeeper until its session expires",
    "split-minority": "a minority of bookies cut from everyone",
    "slow-bookie": "every link to one bookie slowed (latency and bandwidth)",
    "reset-mid-frame": "connections to one bookie reset mid-frame",
    "pause-bookie": "one bookie stopped with SIGSTOP, then resumed",
    "kill-bookie": "one bookie killed with SIGKILL, then restarted",
    "zookeeper-restart": "ZooKeeper stopped, then started again",
}


def _points() -> dict[str, FaultPoint]:
    out: dict[str, FaultPoint] = {}
    for kind, table in (("crash", CRASH_POINTS), ("harness", HARNESS_FAULTS)):
        for name, doc in table.items():
            out[name] = FaultPoint(name=name, kind=kind, doc=doc)  # type: ignore[arg-type]
    for name, rules in STORAGE_FAULTS.items():
        doc = "; ".join(f"{r.op} on {r.target}: {'short' if r.short else r.error}"
                        for r in rules)
        out[name] = FaultPoint(name=name, kind="storage", doc=doc)
    return out


POINTS: Mapping[str, FaultPoint] = _points()
assert len(POINTS) == len(CRASH_POINTS) + len(STORAGE_FAULTS) + len(HARNESS_FAULTS), \
    "a fault point name is used twice"


def point(name: str) -> FaultPoint:
    """The registered point ``name``; KeyError naming the known ones otherwise."""
    try:
        return POINTS[name]
    except KeyError:
        raise KeyError(f"unknown fault point {name!r}; known: {', '.join(sorted(POINTS))}"
                       ) from None


def parse_crash_spec(spec: str) -> tuple[str, int]:
    """``name`` or ``name:n`` (the n-th time it is reached) -> (name, n); ("", 1) unset."""
    name, _, count = spec.partition(":")
    return name, int(count) if count else 1


def crash_env(name: str, count: int = 1) -> dict[str, str]:
    """The environment that makes a bookie process die at crash point ``name`` (the
    ``count``-th time it is reached). Raises KeyError for a name not registered."""
    if point(name).kind != "crash":
        raise KeyError(f"{name!r} is a {POINTS[name].kind} fault, not a crash point")
    return {CRASH_ENV: name if count == 1 else f"{name}:{count}"}
