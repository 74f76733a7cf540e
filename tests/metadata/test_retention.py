"""Pruning the snapshot directory: the newest valid snapshots survive any age, the only
valid one is never deleted, files not verified are deleted only once enough valid ones
are kept; and the CLI (what the systemd timer runs) does it on real files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ledgerd.metadata.retention import SnapshotFile, plan_prune
from ledgerd.metadata.snapshot import Node, Snapshot

DAY = 86_400_000
NOW = 100 * DAY


def _f(name: str, age_days: float, valid: bool | None = True) -> SnapshotFile:
    return SnapshotFile(name=name, taken_ms=int(NOW - age_days * DAY), is_valid=valid,
                        problem="" if valid is not False else "checksum mismatch")


def test_a_week_of_bad_snapshots_never_costs_the_last_good_one() -> None:
    files = [_f(f"bad{i}", i + 0.5, valid=False) for i in range(8)] + [_f("good", 9)]
    got = plan_prune(files, keep=1, max_age_ms=7 * DAY, now_ms=NOW)
    assert "good" not in got.delete
    assert got.kept_newest == ("good",)
    assert set(got.delete) == {"bad7"}  # invalid, and past the age limit


def test_the_newest_n_valid_survive_age_and_older_ones_go() -> None:
    files = [_f(f"s{i}", 8 + i) for i in range(5)]
    got = plan_prune(files, keep=2, max_age_ms=7 * DAY, now_ms=NOW)
    assert got.kept_newest == ("s0", "s1")
    assert set(got.delete) == {"s2", "s3", "s4"}


def test_recent_snapshots_are_kept_and_unverified_ones_wait_for_enough_valid() -> None:
    files = [_f("new", 1), _f("old-unverified", 10, valid=None)]
    assert plan_prune(files, keep=1, max_age_ms=7 * DAY, now_ms=NOW).delete == (
        "old-unverified",)
    # Only one valid found of the two to keep: the unverified file may be the second.
    assert plan_prune(files, keep=2, max_age_ms=7 * DAY, now_ms=NOW).delete == ()
    with pytest.raises(ValueError, match="never delete the only valid"):
        plan_prune(files, keep=0, max_age_ms=DAY, now_ms=NOW)


def _write(directory: Path, name: str, age_days: float, *, corrupt: bool = False) -> None:
    taken = int(time.time() * 1000 - age_days * DAY)
    snap = Snapshot(root="/ledgers", nodes=(Node("LAYOUT", b"ledgerd-layout\t1\nflat", 0),),
                    taken_ms=taken)
    raw = snap.to_bytes()
    if corrupt:
        doc = json.loads(raw)
        doc["passes"] = 9
        raw = json.dumps(doc).encode()
    path = directory / name
    path.write_bytes(raw)
    os.utime(path, (taken / 1000, taken / 1000))


def _prune(directory: Path, *args: str) -> dict[str, object]:
    done = subprocess.run([sys.executable, "-m", "ledgerd.tools.cli", "shell", "metadata",
                           "prune", str(directory), "--json", *args],
                          capture_output=True, check=True, timeout=60)
    doc = json.loads(done.stdout)
    assert isinstance(doc, dict)
    return doc


def test_prune_command_keeps_the_newest_valid_snapshots_whatever_their_age(
        tmp_path: Path) -> None:
    _write(tmp_path, "metadata-1.snap", 1, corrupt=True)
    _write(tmp_path, "metadata-2.snap", 9, corrupt=True)
    _write(tmp_path, "metadata-3.snap", 10)
    _write(tmp_path, "metadata-4.snap", 11)
    _write(tmp_path, "metadata-5.snap", 12)
    doc = _prune(tmp_path, "--keep", "2", "--max-age-days", "7")
    assert doc["kept_newest_valid"] == ["metadata-3.snap", "metadata-4.snap"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "metadata-1.snap", "metadata-3.snap", "metadata-4.snap"]
    assert set(doc["invalid"]) == {"metadata-1.snap", "metadata-2.snap"}  # type: ignore[arg-type]


def test_prune_reads_nothing_when_nothing_is_old_enough(tmp_path: Path) -> None:
    _write(tmp_path, "metadata-1.snap", 1, corrupt=True)
    _write(tmp_path, "metadata-2.snap", 2)
    doc = _prune(tmp_path, "--keep", "1", "--max-age-days", "7")
    assert doc["invalid"] == {} and doc["delete"] == [], doc  # not even verified
    assert len(list(tmp_path.iterdir())) == 2
