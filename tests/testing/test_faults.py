"""One registry names every fault point: the crash points the code reaches, the storage
faults and the harness's faults, each once."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ledgerd.base import crashpoints
from ledgerd.native import faults as native_faults
from ledgerd.testing import faults
from ledgerd.tools.faults.nemesis import KINDS

ROOT = Path(__file__).resolve().parent.parent.parent


def test_every_crash_point_the_code_reaches_is_registered() -> None:
    used = set()
    for folder in ("disk", "appliance", "ledgerd/kafka"):
        for path in (ROOT / folder).rglob("*.py"):
            used |= set(re.findall(r'crash_point\("([^"]+)"\)', path.read_text()))
    assert used, "no crash_point calls found"
    assert used == set(faults.CRASH_POINTS), used ^ set(faults.CRASH_POINTS)
    assert crashpoints.CRASH_POINTS is faults.CRASH_POINTS


def test_the_harness_injects_exactly_the_registered_harness_and_storage_faults() -> None:
    assert set(KINDS) == set(faults.HARNESS_FAULTS) | set(faults.STORAGE_FAULTS)
    assert {p.kind for p in faults.POINTS.values()} == {"crash", "storage", "harness"}
    assert len(faults.POINTS) == len(KINDS) + len(faults.CRASH_POINTS)


def test_the_native_hooks_apply_the_registry_s_rules() -> None:
    assert native_faults.FaultRule is faults.FaultRule
    assert native_faults.ENV_VAR == faults.FAULT_PLAN_ENV == "LEDGERD_FAULT_PLAN"
    rules = faults.STORAGE_FAULTS["journal-eio-fsync"]
    assert [faults.FaultRule.from_json(r.to_json()) for r in rules] == list(rules)


def test_crash_env_names_a_registered_crash_point_only() -> None:
    assert faults.crash_env("index.created") == {"LEDGERD_CRASH_AT": "index.created"}
    assert faults.crash_env("index.created", 2) == {"LEDGERD_CRASH_AT": "index.created:2"}
    with pytest.raises(KeyError, match="unknown fault point"):
        faults.crash_env("index.creatd")
    with pytest.raises(KeyError, match="not a crash point"):
        faults.crash_env("kill-bookie")
