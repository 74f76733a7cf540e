"""The compare-and-set update loop used for every metadata change.

Read the node, apply a pure change function to the decoded value, write with the read
version; on a version conflict re-read and apply again. A change function that finds its
change no longer applies raises ChangeRejectedError (e.g. "ledger is CLOSED"), which
stops the loop. (A write whose reply was lost is the store's business: the ZooKeeper
store re-reads after an ambiguous retry; a conflict here always means someone else won.)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from ledgerd.metadata.errors import BadVersionError, MetadataError
from ledgerd.metadata.store import MetadataStore

__all__ = ["cas_update"]

T = TypeVar("T")


async def cas_update(
    store: MetadataStore,
    path: str,
    change: Callable[[T], T],
    *,
    decode: Callable[[bytes, str], T],
    encode: Callable[[T], bytes],
    max_attempts: int = 100,
) -> tuple[T, int]:
    """Apply ``change`` with compare-and-set; returns the new value and its version.

    Raises ChangeRejectedError from ``change``, NoNodeError if the node is gone, and
    MetadataError after ``max_attempts`` conflicts. A change that returns its input
    unchanged (the same object) writes nothing. If cancelled, the change may or may
    not have been written; re-read before trusting either.
    """
    for _ in range(max_attempts):
        raw, stat = await store.get(path)
        current = decode(raw, path)
        wanted = change(current)
        if wanted is current:
            return current, stat.version  # nothing to change (e.g. already closed so)
        data = encode(wanted)
        try:
            new_stat = await store.set(path, data, stat.version)
        except BadVersionError:
            continue
        return wanted, new_stat.version
    raise MetadataError(f"gave up on {path} after {max_attempts} version conflicts")
