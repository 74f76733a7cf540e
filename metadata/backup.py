"""Taking a snapshot of a live tree and restoring one (see :mod:`metadata.snapshot`).

**Consistency while the cluster runs.** ZooKeeper has no multi-node read, so the tree is
read in passes (every persistent node's data, version and children). A pass that finds
exactly what the pass before it found (the same paths, each at the same version: a
version only grows, so an unchanged version means an unchanged node) proves that every
node held its recorded value at the moment between the two passes, a consistent cut.
Passes repeat until two agree, at most ``max_passes``; nodes that kept changing (a
consumer committing every second) are listed in ``unstable`` with their latest value.

**Restore** writes into an empty root (or, asked to ``replace``, one it deletes first):
parents before children, each node created and then rewritten until it has its
snapshot version (so a client holding a cached version cannot compare-and-set over a
newer value), the id counters advanced past the snapshot's, the GC freeze flag created,
and ``LAYOUT`` last (its presence means the cluster exists). Bookies delete nothing
while the flag is there: ledgers created after the snapshot exist on bookies but not
in the restored tree until ``metadata rebuild`` adds them and an operator clears it.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Sequence
from typing import Any

import trio

from ledgerd.metadata.errors import MetadataError, NodeExistsError, NoNodeError, NotEmptyError
from ledgerd.metadata.kafka_gateways import ProducerIdStore
from ledgerd.metadata.paths import (
    KAFKA_OFFSET_INDEX_COMPLETE,
    KAFKA_PENDING_OFFSETS,
    KAFKA_TRANSACTIONS,
    KAFKA_TXN_PARTITIONS,
    kafka_root,
)
from ledgerd.metadata.snapshot import FREEZE_NODE, Node, Snapshot, SnapshotError
from ledgerd.metadata.store import MetadataStore

__all__ = ["advance_counter", "clear_freeze", "create_nodes", "freeze_state", "raise_versions",
           "read_counter", "read_tree", "restore_snapshot", "set_freeze", "settled_nodes",
           "take_snapshot"]

_PARALLEL = 16  # operations in flight (the ZooKeeper store's own limit)
_COUNTER_PARENTS = ("idgen",)


def _abs(root: str, rel: str) -> str:
    return f"{root}/{rel}" if rel else root


async def read_tree(store: MetadataStore, root: str) -> dict[str, Node]:
    """Every persistent node under ``root`` (itself included), by relative path; one
    pass, ``_PARALLEL`` reads at a time. Nodes deleted meanwhile are left out. Raises
    NoNodeError if ``root`` itself does not exist."""
    out: dict[str, Node] = {}
    limit = trio.Semaphore(_PARALLEL)
    level = [""]
    await store.get(root)  # NoNodeError for a missing root, before anything else
    bulk: Callable[..., Any] | None = getattr(store, "read_many", None)
    while level and bulk is not None:
        # The ZooKeeper store reads a whole depth pipelined (a thread per node read
        # was most of a 100,000-ledger snapshot's time).
        deeper: list[str] = []
        for rel, got in zip(level, await bulk([_abs(root, r) for r in level]), strict=True):
            if got is None or got[1].ephemeral_owner:
                continue
            data, stat, names = got
            if rel != FREEZE_NODE:
                out[rel] = Node(rel, data, stat.version)
            deeper.extend(f"{rel}/{c}" if rel else c for c in names)
        level = sorted(deeper)
    while level:
        following: list[str] = []

        async def visit(rel: str, following: list[str] = following) -> None:
            path = _abs(root, rel)
            async with limit:
                try:
                    data, stat = await store.get(path)
                except NoNodeError:
                    return
                if stat.ephemeral_owner:
                    return
                names = await _children(store, path) if stat.num_children else []
            if rel != FREEZE_NODE:
                out[rel] = Node(rel, data, stat.version)
            following.extend(f"{rel}/{c}" if rel else c for c in names)

        async with trio.open_nursery() as nursery:
            for rel in level:
                nursery.start_soon(visit, rel)
        level = sorted(following)
    return dict(sorted(out.items()))


async def _children(store: MetadataStore, path: str) -> list[str]:
    try:
        return await store.children(path)
    except NoNodeError:
        return []


async def read_counter(store: MetadataStore, parent: str) -> int:
    """The next sequence number ``parent`` hands out (probed with a sequential node,
    deleted at once: this consumes a number, as taking an id does)."""
    node = await store.create(f"{parent}/ID-", ephemeral=True, sequential=True)
    await store.delete(node)
    return int(node.rsplit("-", 1)[1]) + 1


async def advance_counter(store: MetadataStore, parent: str, at_least: int) -> int:
    """Move ``parent``'s sequence counter to ``at_least`` or beyond; returns where it is.

    The ZooKeeper store does it in transactions (``advance_sequence``); any other store
    one sequential node at a time."""
    fast: Callable[[str, int], object] | None = getattr(store, "advance_sequence", None)
    if fast is not None:
        result = await fast(parent, at_least)  # type: ignore[misc]
        assert isinstance(result, int)
        return result
    current = await read_counter(store, parent)
    while current < at_least:
        current = await read_counter(store, parent)
    return current


async def take_snapshot(store: MetadataStore, root: str, *, max_passes: int = 5,
                        now_ms: Callable[[], int] = lambda: int(time.time() * 1000)
                        ) -> Snapshot:
    """A snapshot of ``root`` (see the module doc for what consistent means here).

    Raises SnapshotError when ``root`` holds no cluster. If cancelled, nothing was
    written anywhere (the probe of each id counter consumed one id)."""
    if await store.exists(f"{root}/LAYOUT") is None:
        raise SnapshotError(f"no cluster at {root} on {store.servers} (no LAYOUT node): "
                            "nothing to snapshot")
    counters: dict[str, int] = {}
    taken = now_ms()
    previous = await read_tree(store, root)
    passes = 1
    unstable: list[str] = []
    while True:
        current = await read_tree(store, root)
        passes += 1
        unstable = sorted(p for p in previous.keys() | current.keys()
                          if (previous.get(p) is None) != (current.get(p) is None)
                          or (p in previous and p in current
                              and previous[p].version != current[p].version))
        if not unstable or passes >= max_passes:
            break
        previous = current
        taken = now_ms()
    for parent in _counter_parents(current):
        counters[parent] = await read_counter(store, _abs(root, parent))
    return Snapshot(root=root, nodes=tuple(current.values()), counters=counters,
                    taken_ms=taken, passes=passes, unstable=tuple(unstable))


def _counter_parents(nodes: dict[str, Node]) -> list[str]:
    out = [p for p in _COUNTER_PARENTS if p in nodes]
    out += sorted(p for p in nodes if p.startswith("idgen-long/HOB-") and p.count("/") == 1)
    return out


ID_GAP = 10_000  # ledger ids skipped after a restore (see restore_snapshot)


async def _empty_root(store: MetadataStore, root: str, reason: str) -> None:
    """Delete everything under ``root`` but the GC freeze flag, which is set first, and
    LAYOUT first of the rest: no bookie's GC sees a cluster with some ledgers already
    gone (it deletes nothing while the flag is set or LAYOUT is missing). Children that
    reappear meanwhile (a live bookie's registration) are deleted again."""
    await set_freeze(store, root, reason)
    for attempt in range(10):
        try:
            with contextlib.suppress(NoNodeError):
                await store.delete(f"{root}/LAYOUT")
            for child in sorted(await _children(store, root)):
                if child != FREEZE_NODE:
                    with contextlib.suppress(NoNodeError):
                        await store.delete(f"{root}/{child}", recursive=True)
            return
        except NotEmptyError:
            if attempt == 9:
                raise


async def restore_snapshot(store: MetadataStore, root: str, snap: Snapshot, *,
                           replace: bool = False, versions: bool = True,
                           reason: str = "", id_gap: int = ID_GAP) -> int:
    """Write ``snap`` under ``root``; returns the number of nodes written.

    Refuses (SnapshotError, saying what is there) a root that holds anything unless
    ``replace``, which deletes it first. With ``versions`` each node gets its snapshot
    version back. Sets the GC freeze flag (``reason`` in it). If cancelled, the root
    is partly written and has no LAYOUT: run the restore again with ``replace``."""
    existing = await store.exists(root)
    if existing is not None and existing.num_children:
        if not replace:
            raise SnapshotError(f"{root} is not empty ({existing.num_children} children): "
                                "`metadata diff` shows what a restore would replace; "
                                "pass --replace to delete it and restore")
        await _empty_root(store, root, reason or "a restore with --replace is emptying it")
    nodes = sorted(settled_nodes(snap.nodes),
                   key=lambda n: (n.path.count("/") if n.path else -1, n.path))
    layout = next((n for n in nodes if n.path == "LAYOUT"), None)
    if layout is None:
        raise SnapshotError("the snapshot has no LAYOUT node: not a cluster's snapshot")
    root_node = next((n for n in nodes if n.path == ""), None)
    if existing is None:
        await store.create(root, root_node.data if root_node else b"", make_parents=True)
    elif root_node is not None:
        await store.set(root, root_node.data)
    await set_freeze(store, root, reason or f"restored from a snapshot taken at "
                                          f"{snap.taken_ms} ms")
    limit = trio.Semaphore(_PARALLEL)

    async def put(node: Node) -> None:
        """One node the slow way (the bulk path's leftovers, and LAYOUT)."""
        path = _abs(root, node.path)
        async with limit:
            try:
                await store.create(path, node.data)
            except NodeExistsError:
                await store.set(path, node.data)
            if versions:
                stat = await store.exists(path)
                have = stat.version if stat is not None else 0
                while have < node.version:
                    have = (await store.set(path, node.data, have)).version

    # One depth at a time: every parent exists before its children are created. The
    # nodes of a depth are created pipelined; versions are raised afterwards, many
    # compare-and-set writes per transaction (a busy cursor's version can be in the
    # millions: one round trip per version took hours).
    by_depth: dict[int, list[Node]] = {}
    for n in nodes:
        if n.path and n.path != "LAYOUT":
            by_depth.setdefault(n.path.count("/"), []).append(n)
    created: list[Node] = []
    written = 0
    for depth in sorted(by_depth):
        level = by_depth[depth]
        errors = await create_nodes(store, [(_abs(root, n.path), n.data) for n in level])
        created += [n for n, err in zip(level, errors, strict=True) if err is None]
        async with trio.open_nursery() as nursery:
            for n, err in zip(level, errors, strict=True):
                if err is not None:
                    nursery.start_soon(put, n)
        written += len(level)
    if versions:
        behind = [n for n in created if n.version > 0]
        errors = await raise_versions(store, [(_abs(root, n.path), n.data, 0, n.version)
                                              for n in behind])
        async with trio.open_nursery() as nursery:
            for n, err in zip(behind, errors, strict=True):
                if err is not None:
                    nursery.start_soon(put, n)
    for parent, value in sorted(snap.counters.items()):
        await advance_counter(store, _abs(root, parent), value + id_gap)
    await _advance_producer_ids(store, root, nodes)
    await put(layout)
    return written + 1 + (1 if root_node else 0)


async def create_nodes(store: MetadataStore, nodes: Sequence[tuple[str, bytes]]
                       ) -> list[MetadataError | None]:
    """Create persistent nodes whose parents exist; per node None or the error. The
    ZooKeeper store pipelines them (``create_many``); any other store takes
    ``_PARALLEL`` at a time. If cancelled, some nodes may exist."""
    bulk: Callable[..., Any] | None = getattr(store, "create_many", None)
    if bulk is not None:
        return list(await bulk(nodes))
    out: list[MetadataError | None] = [None] * len(nodes)
    limit = trio.Semaphore(_PARALLEL)

    async def one(i: int, path: str, data: bytes) -> None:
        async with limit:
            try:
                await store.create(path, data)
            except MetadataError as exc:
                out[i] = exc

    async with trio.open_nursery() as nursery:
        for i, (path, data) in enumerate(nodes):
            nursery.start_soon(one, i, path, data)
    return out


async def raise_versions(store: MetadataStore, nodes: Sequence[tuple[str, bytes, int, int]]
                         ) -> list[MetadataError | None]:
    """Bring each ``(path, data, version_now, version_wanted)`` to its version by
    compare-and-set writes, ending with ``data``; per node None or the error. The
    ZooKeeper store writes many versions per transaction (``raise_versions``). If
    cancelled, a node may stand between its two versions."""
    bulk: Callable[..., Any] | None = getattr(store, "raise_versions", None)
    if bulk is not None:
        return list(await bulk(nodes))
    out: list[MetadataError | None] = [None] * len(nodes)
    for i, (path, data, have, want) in enumerate(nodes):
        try:
            while have < want:
                have = (await store.set(path, data, have)).version
        except MetadataError as exc:
            out[i] = exc
    return out


_TXNS = f"kafka/{KAFKA_TRANSACTIONS}/"  # relative to the root, as snapshot paths are
_TXN_FLAGS = f"kafka/{KAFKA_TXN_PARTITIONS}/"
_OFFSET_INDEX_DONE = f"kafka/{KAFKA_OFFSET_INDEX_COMPLETE}"
_PENDING = f"kafka/{KAFKA_PENDING_OFFSETS}/"


def settled_nodes(nodes: Sequence[Node]) -> list[Node]:
    """``nodes`` without ``kafka/offset_index_complete`` (the gateways index again), and
    with the Kafka transaction records a restore writes instead of the snapshot's (``kafka_txns.settle_after_restore``: every transaction that may have
    begun since is aborted by the coordinator), each one version past the snapshot's so
    a coordinator holding the old version cannot compare-and-set over it, and with the
    pending-offsets entries of the PREPARE_COMMIT records it keeps. Pure."""
    from ledgerd.metadata.kafka_groups import group_znode
    from ledgerd.metadata.kafka_txns import TxnRecord, TxnState, settle_after_restore

    flagged = [(parts[2], int(parts[3])) for n in nodes
               if n.path.startswith(_TXN_FLAGS)
               and len(parts := n.path.split("/")) == 4 and parts[3].isdigit()]
    records: dict[str, tuple[Node, TxnRecord]] = {}
    for n in nodes:
        if n.path.startswith(_TXNS) and n.path.count("/") == 2:
            try:
                records[n.path] = (n, TxnRecord.from_json(n.data, n.path))
            except MetadataError:
                continue  # restored as it is; the coordinator reports it
    by_id = {r.transactional_id: path for path, (_, r) in records.items()}
    changed = {by_id[r.transactional_id]: r for r in
               settle_after_restore([r for _, r in records.values()], flagged)}
    # Left out: the mark that every group offset is in its group's offset index. A
    # snapshot read while offsets were committed may hold a cursor without its entry;
    # gateways started on the restored root index what is there again.
    out = [Node(n.path, changed[n.path].to_json(), n.version + 1) if n.path in changed
           else n for n in nodes if n.path != _OFFSET_INDEX_DONE]
    # A kept PREPARE_COMMIT record's offsets stay pending until its coordinator
    # completes it: its groups' pending-offsets entries are made if the snapshot (read
    # a depth at a time, records before entries) missed them (KIP-447's index)
    have = {n.path for n in out}
    for path, (_, record) in records.items():
        if path in changed or record.state is not TxnState.PREPARE_COMMIT:
            continue
        for group in sorted({o.group for o in record.offsets}):
            entry = f"{_PENDING}{group_znode(group)}/{path.rsplit('/', 1)[1]}"
            for node in (_PENDING.rstrip("/"), entry.rsplit("/", 1)[0], entry):
                if node not in have:
                    have.add(node)
                    out.append(Node(node, b"", 0))
    return out


PRODUCER_ID_GAP = 1_000_000  # Kafka producer ids skipped after a restore


async def _advance_producer_ids(store: MetadataStore, root: str, nodes: list[Node]) -> None:
    """Move the Kafka gateway's producer id counter (``kafka/producer_ids``, a number)
    past what producers may have been given since the snapshot: a producer id handed out
    twice would make a gateway take a new producer's first batch for a duplicate of an
    old one's (acknowledged, never written)."""
    node = next((n for n in nodes if n.path == "kafka/producer_ids"), None)
    if node is None:
        return
    try:
        value = int(node.data or b"0")
    except ValueError:
        return
    await ProducerIdStore(store, kafka_root(root)).advance(value + PRODUCER_ID_GAP)


# -- the GC freeze flag -----------------------------------------------------------------


async def set_freeze(store: MetadataStore, root: str, reason: str) -> None:
    """Create (or rewrite) ``<root>/gcfreeze``: bookies' GC deletes nothing while it is
    there."""
    body = json.dumps({"reason": reason, "ctime_ms": int(time.time() * 1000)}).encode()
    try:
        await store.create(f"{root}/{FREEZE_NODE}", body)
    except NodeExistsError:
        await store.set(f"{root}/{FREEZE_NODE}", body)


async def freeze_state(store: MetadataStore, root: str) -> dict[str, object] | None:
    """The freeze flag's content, or None when GC may run."""
    try:
        raw, _ = await store.get(f"{root}/{FREEZE_NODE}")
    except NoNodeError:
        return None
    try:
        doc = json.loads(raw or b"{}")
    except ValueError:
        doc = {"reason": raw.decode("utf-8", "replace")}
    return doc if isinstance(doc, dict) else {"reason": str(doc)}


async def clear_freeze(store: MetadataStore, root: str) -> bool:
    """Remove the freeze flag; False if it was not set."""
    try:
        await store.delete(f"{root}/{FREEZE_NODE}")
    except NoNodeError:
        return False
    return True
