"""The process-cluster helpers the tests use: ``ledgerd.testing.cluster``."""

from __future__ import annotations

from ledgerd.testing.cluster import (
    EVENT_BOUND_S,
    BookieDied,
    admin_get,
    fresh_chroot,
    metadata_store,
    start_bookies,
    wait_auditor,
    wait_lac_everywhere,
    wait_registered,
    wait_unreferenced,
)

__all__ = [
    "EVENT_BOUND_S",
    "BookieDied",
    "admin_get",
    "fresh_chroot",
    "metadata_store",
    "start_bookies",
    "wait_auditor",
    "wait_lac_everywhere",
    "wait_registered",
    "wait_unreferenced",
]
