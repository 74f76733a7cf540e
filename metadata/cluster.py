"""Cluster-wide operations: init a new cluster, metaformat, and the layout check.

``<root>/LAYOUT`` holds ``"ledgerd-layout\\t1\\n<flat|hierarchical>"``; a process that
expects another layout refuses to run. ``<root>/INSTANCEID`` is a UUID that cookies
record, so a bookie cannot join a cluster it was not formatted for.
"""

from __future__ import annotations

import contextlib
import uuid

from ledgerd.metadata.errors import LayoutMismatchError, NodeExistsError, NoNodeError
from ledgerd.metadata.paths import LedgerLayout
from ledgerd.metadata.store import MetadataStore

__all__ = ["FIXED_NODES", "check_layout", "delete_root", "init_new_cluster", "instance_id",
           "metaformat", "read_layout"]

FIXED_NODES = ("available", "available/readonly", "idgen", "idgen-long", "cookies",
               "underreplication", "underreplication/ledgers", "underreplication/locks",
               "underreplication/auditorelection")
_LAYOUT_MAGIC = "ledgerd-layout\t1\n"


def _layout_bytes(layout: str) -> bytes:
    return (_LAYOUT_MAGIC + layout).encode()


async def read_layout(store: MetadataStore, root: str) -> str | None:
    """The layout recorded under ``root``, or None if the cluster is not initialised."""
    if await store.exists(f"{root}/LAYOUT") is None:
        return None
    raw, _ = await store.get(f"{root}/LAYOUT")
    text = raw.decode("utf-8", "replace")
    if not text.startswith(_LAYOUT_MAGIC) or text[len(_LAYOUT_MAGIC):] not in LedgerLayout.ALL:
        raise LayoutMismatchError(f"{root}/LAYOUT holds {text!r}, not a ledgerd layout; "
                                  "is this root used by another system?")
    return text[len(_LAYOUT_MAGIC):]


async def check_layout(store: MetadataStore, root: str, expected: str | None = None) -> str:
    """The cluster's layout; raises if uninitialised or different from ``expected``."""
    found = await read_layout(store, root)
    if found is None:
        raise LayoutMismatchError(f"no cluster at {root} on {store.servers}; "
                                  "run `ledgerd shell initnewcluster` first")
    if expected is not None and found != expected:
        raise LayoutMismatchError(f"cluster at {root} uses the {found} layout, "
                                  f"configured for {expected}")
    return found


async def init_new_cluster(store: MetadataStore, root: str,
                           layout: str = LedgerLayout.HIERARCHICAL) -> str | None:
    """Create a new cluster under ``root``; returns its instance id, or None if one exists.

    Idempotent for the same layout; an existing root with another layout raises.
    """
    if layout not in LedgerLayout.ALL:
        raise ValueError(f"unknown layout {layout!r}")
    found = await read_layout(store, root)
    if found is not None:
        if found != layout:
            raise LayoutMismatchError(f"{root} already holds a {found} cluster")
        return None
    if await store.exists(root) is None:
        await store.create(root, make_parents=True)
    for name in FIXED_NODES:
        try:
            await store.create(f"{root}/{name}")
        except NodeExistsError:
            pass
    iid = str(uuid.uuid4())
    try:
        await store.create(f"{root}/INSTANCEID", iid.encode())
    except NodeExistsError:
        raw, _ = await store.get(f"{root}/INSTANCEID")
        iid = raw.decode()
    # LAYOUT last: its presence means the rest exists.
    try:
        await store.create(f"{root}/LAYOUT", _layout_bytes(layout))
    except NodeExistsError:
        return None
    return iid


async def instance_id(store: MetadataStore, root: str) -> str:
    raw, _ = await store.get(f"{root}/INSTANCEID")
    return raw.decode()


async def metaformat(store: MetadataStore, root: str,
                     layout: str = LedgerLayout.HIERARCHICAL) -> str:
    """Wipe everything under ``root`` and initialise a new cluster; returns the instance id."""
    if await store.exists(root) is not None:
        await delete_root(store, root)
    iid = await init_new_cluster(store, root, layout)
    assert iid is not None
    return iid


async def delete_root(store: MetadataStore, root: str) -> None:
    """Delete a cluster's whole ``root``, its LAYOUT first.

    A recursive delete removes children in no fixed order, so the ledgers' znodes may go
    before LAYOUT, and a bookie's GC pass running meanwhile would see live ledgers gone
    from a cluster that still looks whole (issue #49). With LAYOUT gone first every
    bookie's GC deletes nothing (``GarbageCollector.metadata_guard``) before any ledger
    disappears. If cancelled, part of the root may remain, LAYOUT already gone."""
    with contextlib.suppress(NoNodeError):
        await store.delete(f"{root}/LAYOUT")
    await store.delete(root, recursive=True)
