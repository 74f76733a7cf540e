"""Crash safety with real processes: SIGKILL a writer at random moments, 30+ rounds.

Every entry the writer acknowledged (its side file) must read back byte-exact after
restart, and every fence it acknowledged must survive. The kill comes after a random
number of the writer's ACK lines (0 to 30, i.e. 0 to 240 acknowledged adds), while its 16
writer tasks have further adds in flight. Payload sizes come from a distribution (1 B to
64 KiB, half of them ending a journal record within 16 bytes of a 4096-byte boundary:
``payload_size``), and half the rounds checkpoint so rarely that everything the round
wrote comes back through journal replay. Seeded: set CRASH_SEED=n to replay the choices.
"""

from __future__ import annotations

import hashlib
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ledgerd.disk.storage import LedgerStorage
from tests.disk.crash_writer import options

ROOT = Path(__file__).parents[2]


def _check(base: Path, side: Path, storage_class: str) -> tuple[int, int]:
    import trio

    async def verify() -> tuple[int, int]:
        storage = LedgerStorage(options(base, storage_class))
        await storage.open()
        entries = fences = 0
        try:
            for line in side.read_text().splitlines():
                parts = line.split()
                if parts[0] == "E" and len(parts) == 4:
                    ledger, entry, digest = int(parts[1]), int(parts[2]), parts[3]
                    data = storage.read_entry(ledger, entry)
                    assert hashlib.sha256(data).hexdigest() == digest, (ledger, entry)
                    entries += 1
                elif parts[0] == "F" and len(parts) == 2:
                    assert storage.is_fenced(int(parts[1])), parts[1]
                    fences += 1
        finally:
            await storage.close()
        return entries, fences

    return trio.run(verify)


@pytest.mark.parametrize("storage_class", ["interleaved", "db"])
def test_sigkill_rounds_lose_nothing_acknowledged(tmp_path: Path, storage_class: str) -> None:
    seed = int(os.environ.get("CRASH_SEED", random.randrange(1 << 30)))
    print(f"CRASH_SEED={seed}")
    rng = random.Random(seed)
    side = tmp_path / "acked.txt"
    side.touch()
    total_entries = 0
    for round_no in range(30):
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.disk.crash_writer", str(tmp_path / "data"),
             str(round_no), str(side), storage_class,
             str(rng.choice([200, 600_000])), str(rng.randrange(1 << 30))],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert line.strip() == "READY", (line, proc.stderr.read() if proc.stderr else "")
            for _ in range(rng.randint(0, 30)):  # the fault: a kill at a random point
                assert proc.stdout.readline().strip() == "ACK"
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        entries, fences = _check(tmp_path / "data", side, storage_class)
        assert fences == round_no
        assert entries >= total_entries
        total_entries = entries
    print(f"{storage_class}: {total_entries} acknowledged entries read back, "
          f"{round_no + 1} kill -9 rounds")
    assert total_entries > 100


def test_a_kill_between_creating_an_index_file_and_writing_its_header(tmp_path: Path) -> None:
    """The checkpoint creates a new ledger's index file on the event loop and its worker
    writes the header: a kill -9 between them left an empty .idx that refused start-up
    ("index file shorter than its header"), found by bench/soak.py. Start-up drops it
    and journal replay rebuilds the ledger."""
    side = tmp_path / "acked.txt"
    side.touch()
    env = {**os.environ, "LEDGERD_CRASH_AT": "index.created:2"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.disk.crash_writer", str(tmp_path / "data"), "0",
         str(side), "interleaved", "200", "1"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.wait(timeout=120) == -signal.SIGKILL, proc.stderr.read() if proc.stderr else ""
    finally:
        if proc.poll() is None:
            proc.kill()
    empty = [p for p in (tmp_path / "data" / "index").rglob("*.idx") if p.stat().st_size == 0]
    assert empty, "the crash point did not leave a header-less index file"
    entries, _ = _check(tmp_path / "data", side, "interleaved")
    assert entries > 0
    assert not [p for p in empty if p.exists() and p.stat().st_size == 0]
