"""Bookies in the test's own trio loop: ``ledgerd.testing.inprocess``."""

from __future__ import annotations

from ledgerd.testing.inprocess import InProcessCluster, inprocess_cluster

__all__ = ["InProcessCluster", "inprocess_cluster"]
