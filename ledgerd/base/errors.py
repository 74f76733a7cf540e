"""The root of every error ledgerd raises.

Each package keeps its own root under it (``WireError``, ``StorageError``,
``MetadataError``; the client's errors derive from it directly), with leaves named for
what happened. A caller that wants "anything ledgerd refused or failed at" catches
``LedgerdError`` once; ``ledgerd.LedgerdError`` is this class.
"""

from __future__ import annotations

__all__ = ["LedgerdError"]


class LedgerdError(Exception):
    """Root of every ledgerd error: client, wire, storage and metadata."""
