"""The offset index's decisions, without I/O (``metadata.kafka_offsets`` stores it).

OffsetFetch of all topics reads a group's index (a node per topic it committed to),
then only the cursors the index lists, of partitions that still exist: a topic that no
longer exists is skipped and its entries are dropped. The one-time migration indexes
the cursors found on every partition (each partition's cursor names, read once).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from ledgerd.metadata.kafka_offsets import CURSOR_PREFIX

__all__ = ["cursor_groups", "indexed_reads"]

# what ``kafka_groups.group_znode`` gives (a plain id, or ``x-`` and hex)
_GROUP_ZNODE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")


def indexed_reads(entries: Mapping[str, Iterable[int]], counts: Mapping[str, int | None],
                  ) -> tuple[dict[str, list[int]], list[str]]:
    """From a group's index (topic -> partitions listed) and the topics' partition
    counts (None: no such topic): the partitions whose cursors to read, per topic in
    name order, and the topics gone (their entries to drop)."""
    reads: dict[str, list[int]] = {}
    gone: list[str] = []
    for topic in sorted(entries):
        count = counts.get(topic)
        if count is None:
            gone.append(topic)
            continue
        parts = sorted({p for p in entries[topic] if 0 <= p < count})
        if parts:
            reads[topic] = parts
    return reads, gone


def cursor_groups(cursors: Mapping[tuple[str, int], Iterable[str]],
                  ) -> dict[str, dict[str, set[int]]]:
    """The migration's plan: from each partition's cursor names, group znode name ->
    topic -> the partitions it has a cursor on (cursors not a Kafka group's are not
    the index's business)."""
    plan: dict[str, dict[str, set[int]]] = {}
    for (topic, p), names in cursors.items():
        for name in names:
            group = name[len(CURSOR_PREFIX):]
            if name.startswith(CURSOR_PREFIX) and _GROUP_ZNODE.match(group):
                plan.setdefault(group, {}).setdefault(topic, set()).add(p)
    return plan
