"""The compare-and-set update loop used for every metadata change.

Read the node, apply a pure change function to the decoded value, write with the read
version; on a version conflict re-read and apply again. A change function that finds its
change no longer applies raises ChangeRejectedError (e.g. "ledger is CLOSED"), which
stops the loop. (A write whose reply was lost is the store's business: the ZooKeeper
store re-reads after an ambiguous retry; a conflict here always means someone else won.)

A caller that holds the value it last wrote, with its version, may pass it as ``known``
to skip the first read: the write's version check proves it was still current, and
anything else (a conflict, a change that refuses it or leaves it as it is) falls back
to reading, so the outcome is the plain loop's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from ledgerd.metadata.errors import BadVersionError, ChangeRejectedError, MetadataError
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
    known: tuple[T, int] | None = None,
) -> tuple[T, int]:
    """Apply ``change`` with compare-and-set; returns the new value and its version.

    Raises ChangeRejectedError from ``change``, NoNodeError if the node is gone, and
    MetadataError after ``max_attempts`` conflicts. A change that returns its input
    unchanged (the same object) writes nothing. ``known``: a value and version to try
    first instead of reading (see the module docstring). If cancelled, the change may
    or may not have been written; re-read before trusting either.
    """
    for attempt in range(max_attempts):
        guess = known is not None and attempt == 0
        if guess:
            assert known is not None
            current, version = known
        else:
            raw, stat = await store.get(path)
            current, version = decode(raw, path), stat.version
        try:
            wanted = change(current)
        except ChangeRejectedError:
            if guess:
                continue  # refused what may be stale: the stored value decides
            raise
        if wanted is current:
            if guess:
                continue  # as above: unchanged only if the stored value says so
            return current, version  # nothing to change (e.g. already closed so)
        data = encode(wanted)
        try:
            new_stat = await store.set(path, data, version)
        except BadVersionError:
            continue
        return wanted, new_stat.version
    raise MetadataError(f"gave up on {path} after {max_attempts} version conflicts")
