"""Metadata snapshots: the whole persistent tree under a cluster's root, as one file.

Everything a cluster keeps in ZooKeeper lives under its root (``zk_ledgers_root_path``):
the ledgers (``LAYOUT`` decides their paths), ``INSTANCEID``, ``cookies/<bookie>``,
``logs/<name>`` with ``cursors/<cursor>``, ``underreplication/`` (its ``disable`` node is
the autorecovery switch, ``ledgers/.../urL<id>`` the marks), and the Kafka gateway's
``kafka/topics``, ``kafka/groups`` and ``kafka/producer_ids``. A snapshot holds every
persistent node there with its data and version; ephemeral nodes (bookie
registrations, replication locks, auditor candidates, gateway registrations) belong to
live sessions and are left out, as is the GC freeze flag.

Two things are not nodes: the counters of sequential children, which hand out ledger
ids (``idgen`` and each ``idgen-long/HOB-*``). A snapshot records their values, and a
restore advances the fresh tree's counters past them, so a new ledger never reuses the
id of a ledger that bookies may still hold.

The file is JSON::

    {"format": "ledgerd-metadata-snapshot", "version": 1, "root": "/ledgers",
     "taken_ms": ..., "passes": 2, "unstable": [], "counters": {"idgen": 12},
     "nodes": [{"path": "LAYOUT", "version": 0, "data": "<base64>"}, ...],
     "summary": {...}, "checksum": "sha256:<hex of the canonical document without it>"}

Paths are relative to the root ("" is the root itself), so a snapshot can be restored
under another root. This module is pure: the model, its serde, the categories of nodes
and the diff. Reading and writing a live tree is :mod:`metadata.backup`.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from ledgerd.metadata.errors import CorruptMetadataError, MetadataError
from ledgerd.metadata.paths import LedgerLayout, ledger_id_from_path

__all__ = [
    "CATEGORIES",
    "FORMAT",
    "FREEZE_NODE",
    "Node",
    "Snapshot",
    "SnapshotDiff",
    "category",
    "diff_nodes",
]

FORMAT = "ledgerd-metadata-snapshot"
VERSION = 1
# Present under the root: bookies' GC deletes nothing (metadata restored or rebuilt and
# not yet confirmed by an operator). Never part of a snapshot.
FREEZE_NODE = "gcfreeze"
CATEGORIES = ("cluster", "ledgers", "logs", "cursors", "cookies", "underreplicated",
              "autorecovery", "kafka_topics", "kafka_groups", "kafka", "tree")


@dataclass(frozen=True, slots=True)
class Node:
    """One persistent node: its path relative to the root, data and version."""

    path: str
    data: bytes
    version: int

    def __post_init__(self) -> None:
        if self.path.startswith("/") or self.path.endswith("/") or "//" in self.path:
            raise ValueError(f"snapshot node path {self.path!r} is not relative to the root")
        if self.version < 0:
            raise ValueError(f"snapshot node {self.path!r} has version {self.version}")


def category(path: str, layout: str) -> str:
    """Which kind of metadata a relative path holds (one of CATEGORIES)."""
    parts = path.split("/") if path else []
    if path in ("LAYOUT", "INSTANCEID"):
        return "cluster"
    if len(parts) == 2 and parts[0] == "cookies":
        return "cookies"
    if len(parts) == 2 and parts[0] == "logs":
        return "logs"
    if len(parts) == 4 and parts[0] == "logs" and parts[2] == "cursors":
        return "cursors"
    if parts[:2] == ["underreplication", "disable"]:
        return "autorecovery"
    if parts[:2] == ["underreplication", "ledgers"] and parts[-1].startswith("urL"):
        return "underreplicated"
    if len(parts) == 3 and parts[:2] == ["kafka", "topics"]:
        return "kafka_topics"
    if len(parts) == 3 and parts[:2] == ["kafka", "groups"]:
        return "kafka_groups"
    if parts and parts[0] == "kafka" and len(parts) > 1 and parts[1] not in ("topics",
                                                                              "groups"):
        return "kafka"
    if parts and parts[0] not in ("cookies", "logs", "underreplication", "kafka", "idgen",
                                  "idgen-long", "available"):
        try:
            ledger_id_from_path("", layout, "/" + path)
            return "ledgers"
        except ValueError:
            pass
    return "tree"


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A cluster's persistent metadata at one moment (see the module doc)."""

    root: str
    nodes: tuple[Node, ...]
    counters: Mapping[str, int] = field(default_factory=dict)
    taken_ms: int = 0
    passes: int = 1
    unstable: tuple[str, ...] = ()  # nodes still changing when the read ended

    def by_path(self) -> dict[str, Node]:
        return {n.path: n for n in self.nodes}

    def data(self, path: str) -> bytes | None:
        for n in self.nodes:
            if n.path == path:
                return n.data
        return None

    @property
    def layout(self) -> str:
        raw = self.data("LAYOUT") or b""
        text = raw.decode("utf-8", "replace")
        for layout in LedgerLayout.ALL:
            if text.endswith("\n" + layout):
                return layout
        return LedgerLayout.HIERARCHICAL

    @property
    def instance_id(self) -> str:
        return (self.data("INSTANCEID") or b"").decode("utf-8", "replace")

    def summary(self) -> dict[str, int | bool | str]:
        """Counts per category, the autorecovery switch and the instance id."""
        counts = dict.fromkeys(CATEGORIES, 0)
        layout = self.layout
        for n in self.nodes:
            counts[category(n.path, layout)] += 1
        out: dict[str, int | bool | str] = {k: v for k, v in counts.items()
                                            if k not in ("tree", "cluster", "autorecovery")}
        out["autorecovery_enabled"] = counts["autorecovery"] == 0
        out["instance_id"] = self.instance_id
        out["layout"] = layout
        out["nodes"] = len(self.nodes)
        return out

    def ledger_ids(self) -> list[int]:
        layout = self.layout
        out = []
        for n in self.nodes:
            if category(n.path, layout) == "ledgers":
                out.append(ledger_id_from_path("", layout, "/" + n.path))
        return sorted(out)

    # -- serde -------------------------------------------------------------------------

    def _document(self) -> dict[str, object]:
        return {
            "format": FORMAT, "version": VERSION, "root": self.root,
            "taken_ms": self.taken_ms, "passes": self.passes,
            "unstable": list(self.unstable),
            "counters": dict(sorted(self.counters.items())),
            "nodes": [{"path": n.path, "version": n.version,
                       "data": base64.b64encode(n.data).decode()} for n in self.nodes],
            "summary": self.summary(),
        }

    def to_bytes(self) -> bytes:
        doc = self._document()
        doc["checksum"] = _checksum(doc)
        return json.dumps(doc, separators=(",", ":")).encode() + b"\n"

    @classmethod
    def from_bytes(cls, raw: bytes, where: str) -> Snapshot:
        """Parse and verify; raises CorruptMetadataError naming ``where`` and the reason."""
        try:
            doc = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise CorruptMetadataError(where, f"not a metadata snapshot (not JSON: {exc})"
                                       ) from None
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise CorruptMetadataError(where, "not a ledgerd metadata snapshot (no "
                                       f"format {FORMAT!r})")
        if doc.get("version") != VERSION:
            raise CorruptMetadataError(where, f"snapshot version {doc.get('version')!r}, "
                                       f"this build reads {VERSION}")
        stored = doc.pop("checksum", None)
        if stored != _checksum(doc):
            raise CorruptMetadataError(where, "checksum mismatch: the file was changed or "
                                       "truncated after it was written")
        try:
            nodes = tuple(Node(str(n["path"]), base64.b64decode(n["data"], validate=True),
                               _nonneg(n["version"])) for n in doc["nodes"])
            counters = {str(k): _nonneg(v) for k, v in doc["counters"].items()}
            snap = cls(root=str(doc["root"]), nodes=nodes, counters=counters,
                       taken_ms=_nonneg(doc["taken_ms"]), passes=_nonneg(doc["passes"]),
                       unstable=tuple(str(p) for p in doc["unstable"]))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise CorruptMetadataError(where, f"malformed snapshot: {exc}") from None
        if len({n.path for n in nodes}) != len(nodes):
            raise CorruptMetadataError(where, "malformed snapshot: a path appears twice")
        return snap


def _nonneg(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"expected an integer >= 0, got {value!r}")
    return value


def _checksum(doc: Mapping[str, object]) -> str:
    canonical = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    return "sha256:" + hashlib.sha256(canonical).hexdigest()


@dataclass(frozen=True, slots=True)
class SnapshotDiff:
    """What differs between a snapshot (``a``) and another tree (``b``, often live)."""

    only_a: tuple[str, ...]
    only_b: tuple[str, ...]
    changed: tuple[str, ...]  # data differs
    version_only: tuple[str, ...]  # same data, another version

    @property
    def is_empty(self) -> bool:
        return not (self.only_a or self.only_b or self.changed)

    def by_category(self, layout: str) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for kind, paths in (("only_snapshot", self.only_a), ("only_live", self.only_b),
                            ("changed", self.changed)):
            for p in paths:
                row = out.setdefault(category(p, layout),
                                     {"only_snapshot": 0, "only_live": 0, "changed": 0})
                row[kind] += 1
        return dict(sorted(out.items()))


def diff_nodes(a: Iterable[Node], b: Iterable[Node]) -> SnapshotDiff:
    """Compare two sets of nodes by path, data and version."""
    left = {n.path: n for n in a}
    right = {n.path: n for n in b}
    changed, version_only = [], []
    for p in sorted(left.keys() & right.keys()):
        if left[p].data != right[p].data:
            changed.append(p)
        elif left[p].version != right[p].version:
            version_only.append(p)
    return SnapshotDiff(tuple(sorted(left.keys() - right.keys())),
                        tuple(sorted(right.keys() - left.keys())), tuple(changed),
                        tuple(version_only))


class SnapshotError(MetadataError):
    """A snapshot cannot be taken or restored as asked (the reason says what to do)."""


__all__ += ["SnapshotError"]


ID_MARGIN = 10_000  # ids skipped past the highest a bookie holds (see restore_id_gap)


@dataclass(frozen=True, slots=True)
class IdGap:
    """How far a restore moves the ledger id counter past the snapshot's, and why."""

    gap: int
    reason: str


def restore_id_gap(counter: int, *, held_max: int | None, all_answered: bool,
                   default_gap: int, margin: int = ID_MARGIN) -> IdGap:
    """The id gap for a restore of a snapshot whose ``idgen`` counter is ``counter``.

    Ledgers created after the snapshot hold ids from ``counter`` on; a new ledger must
    not reuse one (bookies would hand its writer another ledger's entries). With the
    highest ledger id the bookies hold (``held_max``, from LedgerHoldings) the counter
    goes ``margin`` past it (the margin covers ledgers created with no entry on any
    bookie yet). When some bookie did not answer, or none did (``held_max`` None), it
    goes at least ``default_gap`` past the snapshot's counter too."""
    if default_gap < 0 or margin < 0:
        raise ValueError(f"id gaps must be >= 0, got {default_gap} and {margin}")
    if held_max is None:
        return IdGap(default_gap, f"the default {default_gap} (no bookie answered)")
    derived = max(0, held_max + 1 - counter) + margin
    if all_answered:
        return IdGap(derived, f"highest ledger id on the bookies {held_max} + margin "
                              f"{margin}")
    if derived >= default_gap:
        return IdGap(derived, f"highest ledger id on the bookies that answered {held_max} "
                              f"+ margin {margin} (not every bookie answered)")
    return IdGap(default_gap, f"the default {default_gap} (not every bookie answered; the "
                              f"highest ledger id on those that did, {held_max}, is below)")


__all__ += ["ID_MARGIN", "IdGap", "restore_id_gap"]
