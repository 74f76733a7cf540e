"""ledgerd.testing: the test kit, public (as ``trio.testing`` and ``kazoo.testing`` are).

Applications test their own code with it as the project tests itself:

- ``memory_cluster`` (``ledgerd.testing.memory``): real bookies over memory streams and
  an in-memory metadata store, in one trio run under the mock clock;
- ``process_cluster`` (``ledgerd.testing.cluster``): the one process cluster, a real
  ZooKeeper and bookie processes on loopback (what ``ledgerd local``, the fault harness
  and the bench scripts start too); docs/testing.md has a worked example;
- ``check`` and ``LedgerFacts`` (``ledgerd.testing.history``): the one checker of the
  protocol invariants, fed by the simulator and by the fault harness's histories;
- ``faults`` (``ledgerd.testing.faults``): the one registry of named fault points.

It sits above everything it tests: nothing in the library imports it
(tests/test_layering.py). Names are imported lazily, so ``ledgerd.testing.history``
loads without trio.
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ledgerd.testing.cluster import ProcessCluster, process_cluster
    from ledgerd.testing.history import History, LedgerFacts, Violation, check, report
    from ledgerd.testing.memory import MemoryCluster, client_settings, memory_cluster

_EXPORTS = {
    "History": "ledgerd.testing.history",
    "LedgerFacts": "ledgerd.testing.history",
    "MemoryCluster": "ledgerd.testing.memory",
    "ProcessCluster": "ledgerd.testing.cluster",
    "Violation": "ledgerd.testing.history",
    "check": "ledgerd.testing.history",
    "client_settings": "ledgerd.testing.memory",
    "memory_cluster": "ledgerd.testing.memory",
    "process_cluster": "ledgerd.testing.cluster",
    "report": "ledgerd.testing.history",
}


def __getattr__(name: str) -> Any:
    if name == "faults":
        return importlib.import_module("ledgerd.testing.faults")
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'ledgerd.testing' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = ["History", "LedgerFacts", "MemoryCluster", "ProcessCluster", "Violation", "check",
           "client_settings", "memory_cluster", "process_cluster", "report"]
