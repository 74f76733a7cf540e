"""Named fault points, for tests: the public face of ``ledgerd.base.faultpoints``.

Every point a test can make the appliance fail at has one name in one registry
(``POINTS``): crash points (``crash_env(name)`` in a bookie process's environment kills
it there), storage faults (``STORAGE_FAULTS[name]``, armed in a running bookie started
with ``fault_env`` by ``arm_bookie``) and the faults the fault harness makes from outside
(``HARNESS_FAULTS``, injected by ``ledgerd.tools.faults.nemesis``)::

    bookie.start(env=crash_env("compaction.copied"))

    bookie.start(env=fault_env(bookie))
    await arm_bookie(bookie, list(STORAGE_FAULTS["journal-eio-fsync"]), generation=1)
"""

from __future__ import annotations

from ledgerd.base.faultpoints import (
    CRASH_ENV,
    CRASH_POINTS,
    FAULT_PLAN_ENV,
    HARNESS_FAULTS,
    POINTS,
    STORAGE_FAULTS,
    FaultPoint,
    FaultRule,
    crash_env,
    point,
)
from ledgerd.tools.faults.cluster import arm_bookie, fault_env

__all__ = [
    "CRASH_ENV",
    "CRASH_POINTS",
    "FAULT_PLAN_ENV",
    "HARNESS_FAULTS",
    "POINTS",
    "STORAGE_FAULTS",
    "FaultPoint",
    "FaultRule",
    "arm_bookie",
    "crash_env",
    "fault_env",
    "point",
]
