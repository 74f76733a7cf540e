"""CPU per entry on the bookie's add fast path (handler -> core -> storage), no fsync wait.

    PYTHONPATH=<checkout> python bench/bookie_cpu.py FRAMES ENTRIES_PER_FRAME

Builds FRAMES decoded Add frames of ENTRIES_PER_FRAME 1 KiB entries, calls
``RequestHandler.add`` on each against a real LedgerStorage (the journal queues; nothing
waits for fdatasync), and prints the best of 5 passes in ns per entry and whether the
checkout has the bookie core. Run it alternately against two checkouts to compare a
change's CPU cost without the disk's noise (bench/RESULTS.md, "Bookie core").
"""

from __future__ import annotations

import dataclasses
import sys
import tempfile
import time
from pathlib import Path

import trio

from ledgerd.appliance.handlers import RequestHandler, ServingState
from ledgerd.appliance.metrics import BookieMetrics
from ledgerd.disk.journal import JournalOptions
from ledgerd.disk.storage import LedgerStorage, StorageOptions
from ledgerd.wire.connection import AddRun
from ledgerd.wire.entry import Digester, DigestType, encode_entry, master_key
from ledgerd.wire.frames import decode_request, encode_request
from ledgerd.wire.messages import AddRequest, Message


def _frames(ledger_id: int, frames: int, batch: int) -> list[Message]:
    digester = Digester(DigestType.CRC32C)
    key = master_key(b"bench")
    out = []
    for f in range(frames):
        first = f * batch
        entries = tuple(encode_entry(digester, ledger_id, first + i, first + i - 1, 0,
                                     b"x" * 1024) for i in range(batch))
        req = AddRequest(ledger_id=ledger_id, first_entry_id=first, flags=0, master_key=key,
                         entries=entries)
        out.append(decode_request(encode_request(req, 1, 0)[4:]).message)
    return out


async def _main(frames: int, batch: int) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="ledgerd-bookie-cpu-"))
    journal = dataclasses.replace(JournalOptions(), max_memory_bytes=1 << 40)
    storage = LedgerStorage(StorageOptions(journal_dir=tmp / "j", ledger_dirs=(tmp / "l",),
                                           journal=journal))
    await storage.open()
    handler = RequestHandler(storage, ServingState(), BookieMetrics())
    best = float("inf")
    for rep in range(5):
        requests = _frames(rep + 1, frames, batch)
        t0 = time.perf_counter()
        for req in requests:
            [(status, _group)] = handler.store([AddRun.of_request(0, req)])[0]  # type: ignore[arg-type]
            assert status == 0, status
        best = min(best, time.perf_counter() - t0)
    kind = "core" if hasattr(handler, "core") else "no-core"
    print(f"{best / (frames * batch) * 1e9:.0f} ns/entry ({kind})")


if __name__ == "__main__":
    trio.run(_main, int(sys.argv[1]), int(sys.argv[2]))
