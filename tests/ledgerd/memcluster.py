"""The in-memory cluster the client tests use: ``ledgerd.testing.memory``."""

from __future__ import annotations

from ledgerd.testing.memory import (
    FAST_JOURNAL,
    ROOT,
    Gate,
    MemoryBookie,
    MemoryCluster,
    client_settings,
    memory_cluster,
)

__all__ = ["FAST_JOURNAL", "ROOT", "Gate", "MemoryBookie", "MemoryCluster", "client_settings",
           "memory_cluster"]
