"""Storage faults injected under the native helper, for the fault harness.

The C side (``native/_build.py``) checks armed rules before every ``pwrite``/``pwritev``
and ``fdatasync`` it makes: a matching write fails with an errno or comes back short
(the helper's own loop then writes the rest, as after a real short write), a matching
fdatasync fails. Files are tagged by what they hold, so a rule can aim at the journal
or at the entry logs. With no rule armed the check costs one load.

The rules and the named storage faults are declared in the one registry of fault
points, ``ledgerd.base.faultpoints``; this module applies them.

A bookie arms rules only when started with ``LEDGERD_FAULT_PLAN=<file>`` in its
environment (tests and ``bench/soak.py`` do this; nothing else should): on SIGUSR2 it
reads the JSON list of rules in that file, arms them, and writes ``<file>.applied``
(a FIFO the harness reads, or a file) with the plan's ``generation`` so the harness
knows the rules are live.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import signal
from pathlib import Path
from types import FrameType

from ledgerd.native._native import ffi, lib

from ledgerd.base.faultpoints import FAULT_PLAN_ENV, STORAGE_TAGS, FaultRule

__all__ = ["ENV_VAR", "TAGS", "FaultRule", "arm", "disarm", "injected", "install_from_env"]

log = logging.getLogger(__name__)

ENV_VAR = FAULT_PLAN_ENV
TAGS = dict(STORAGE_TAGS)
_OPS = {"write": lib.LDN_FAULT_WRITE, "fsync": lib.LDN_FAULT_SYNC}


def arm(rules: list[FaultRule]) -> None:
    """Replace the armed rules with ``rules`` (an empty list disarms)."""
    if len(rules) > lib.LDN_FAULT_MAX_RULES:
        raise ValueError(f"at most {lib.LDN_FAULT_MAX_RULES} fault rules, got {len(rules)}")
    table = ffi.new("struct ldn_fault_rule[]", max(1, len(rules)))
    for i, rule in enumerate(rules):
        table[i].op = _OPS[rule.op]
        table[i].tag = TAGS[rule.target]
        table[i].skip = rule.skip
        table[i].times = rule.times
        table[i].err = 0 if rule.short else getattr(errno, rule.error or "EIO")
        table[i].shorten = 1 if rule.short else 0
    rc = lib.ldn_faults_set(table, len(rules))
    if rc < 0:
        raise OSError(-rc, "arming fault rules failed")


def disarm() -> None:
    arm([])


def injected() -> int:
    """How many faults the helper has injected in this process."""
    return int(lib.ldn_faults_injected())


def _load_plan(path: Path) -> tuple[int, list[FaultRule]]:
    raw = json.loads(path.read_text())
    return int(raw["generation"]), [FaultRule.from_json(r) for r in raw["rules"]]


def install_from_env() -> bool:
    """If ``LEDGERD_FAULT_PLAN`` is set: arm its rules on SIGUSR2 (main thread only)."""
    plan = os.environ.get(ENV_VAR)
    if not plan:
        return False
    path = Path(plan)

    def reload(signum: int, frame: FrameType | None) -> None:
        try:
            generation, rules = _load_plan(path)
            arm(rules)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.error("fault_plan_unreadable path=%s error=%s", path, exc)
            return
        log.warning("fault_plan_armed generation=%d rules=%d", generation, len(rules))
        ack = path.with_name(path.name + ".applied")
        try:
            # The harness waits on a FIFO (without a reader: ENXIO, nobody waits).
            fd = os.open(ack, os.O_WRONLY | os.O_NONBLOCK | os.O_CREAT, 0o600)
        except OSError:
            return
        try:
            os.write(fd, f"{generation}\n".encode())
        except OSError:
            pass
        finally:
            os.close(fd)

    signal.signal(signal.SIGUSR2, reload)
    log.warning("fault_injection_enabled plan=%s", path)
    return True
