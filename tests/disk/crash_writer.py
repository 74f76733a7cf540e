"""A storage writer for the crash-safety test; killed with SIGKILL at random moments.

Usage: ``python -m tests.disk.crash_writer BASE ROUND SIDEFILE [STORAGE [FLUSH_MS [SEED]]]``.
It fences a ledger of the previous round, then adds entries to four ledgers of this round
from 16 concurrent tasks, with payload sizes from ``payload_size`` (1 B to 64 KiB, half of
them ending a journal record near a 4096-byte boundary). ``FLUSH_MS`` is the checkpoint
interval: a long one leaves every entry of the round to journal replay.
Only after an add (or fence) completes does it append a line to SIDEFILE, so every line
there is a promise the storage must keep. Every 8 acknowledged adds it prints ``ACK`` on
stdout, which the test counts to pick its moment to kill.
"""

from __future__ import annotations

import hashlib
import os
import random
import sys
from pathlib import Path

import trio

from ledgerd.disk.storage import LedgerStorage, StorageOptions
from ledgerd.tools.faults.payloads import payload_size
from ledgerd.wire.entry import Digester, DigestType, encode_entry

KEY = b"c" * 20


def options(base: Path, storage_class: str = "interleaved",
            flush_interval_ms: int = 200) -> StorageOptions:
    from ledgerd.disk.journal import JournalOptions

    return StorageOptions(journal_dir=base / "journal", ledger_dirs=(base / "ledgers",),
                          index_dirs=(base / "index",), flush_interval_ms=flush_interval_ms,
                          ledger_storage_class=storage_class,
                          log_size_limit=256 * 1024,
                          journal=JournalOptions(max_size_mb=1, prealloc_mb=1, max_backups=1))


async def main(base: Path, round_no: int, side: Path, storage_class: str,
               flush_interval_ms: int, seed: int) -> None:
    storage = LedgerStorage(options(base, storage_class, flush_interval_ms))
    rng = random.Random(seed)
    await storage.open()
    out = open(side, "a", buffering=1)
    digester = Digester(DigestType.CRC32C)
    async with trio.open_nursery() as nursery:
        await nursery.start(storage.run)
        if round_no > 0:
            victim = (round_no - 1) * 10
            await storage.fence(victim, bind_key=KEY)
            out.write(f"F {victim}\n")
        print("READY", flush=True)
        acked = [0]

        async def writer(task: int) -> None:
            ledger = round_no * 10 + task % 4
            entry = task // 4
            while True:
                payload = os.urandom(payload_size(rng))
                data = encode_entry(digester, ledger, entry, entry - 1, 0, payload)
                await storage.add_entries(ledger, entry, [data], bind_key=KEY)
                out.write(f"E {ledger} {entry} {hashlib.sha256(data).hexdigest()}\n")
                acked[0] += 1
                if acked[0] % 8 == 0:
                    print("ACK", flush=True)
                entry += 4  # 16 tasks, 4 ledgers: each task owns every 4th entry

        for task in range(16):
            nursery.start_soon(writer, task)


if __name__ == "__main__":
    args = sys.argv[1:] + ["interleaved", "200", "0"][len(sys.argv) - 4:]
    trio.run(main, Path(args[0]), int(args[1]), Path(args[2]), args[3], int(args[4]),
             int(args[5]))
