"""GC and compaction killed at every step, on a real bookie process (issue #20).

One bookie lives through a sequence of kill -9s, each at a named step of a GC pass
(``LEDGERD_CRASH_AT``, ledgerd/base/crashpoints.py): deleting ledgers, deleting dead logs,
copying live entries, after the copies are durable but before the index points at them,
while the index flushes, and before the old log is unlinked. The seed picks which
occurrence of each step dies and the payload sizes. After every restart: every entry of
every ledger the metadata still has reads back with its bytes (so nothing it has was
deleted, and nothing is served from a deleted log). At the end an uninterrupted pass
(through ``ledgerd shell gc --wait``) finishes the job: the deleted ledgers are gone,
no dead log is left, and the offline consistency check passes.

GC deletes a ledger only when two passes in a row find it missing (appliance/gc.py),
and a restarted bookie has suspected nothing yet, so each step gets up to two passes
to reach its crash point, and the end gets one more.
"""

from __future__ import annotations

import json
import os
import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from ledgerd.bookie_client import BookieClient, BookieConnectionError, open_bookie_client
from ledgerd.metadata.ledger import LedgerMetadata
from ledgerd.metadata.ledgers import LedgerManager
from ledgerd.tools.bookieprocess import BookieProcess
from ledgerd.wire.messages import (
    AddRequest,
    AdminKind,
    AdminStatusRequest,
    AdminTriggerRequest,
    ReadRequest,
)
from ledgerd.wire.status import Status
from tests.appliance.harness import KEY, entry
from tests.cluster import EVENT_BOUND_S, metadata_store, wait_registered

SEED = int(os.environ.get("LEDGERD_CRASH_SEED", "1"))
# step -> how many times it can be reached in one pass (the seed picks which one dies)
STEPS = {"gc.deleting_ledgers": 3, "gc.deleting_logs": 1, "compaction.copying": 3,
         "compaction.copied": 3, "compaction.index_flush": 3, "compaction.deleting": 3}


async def _shell(*args: str, conf: Path | None = None) -> tuple[int, str, str]:
    cmd = [sys.executable, "-m", "ledgerd.tools.cli", "shell", *args]
    done = await trio.run_process(cmd, capture_stdout=True, capture_stderr=True, check=False)
    return done.returncode, done.stdout.decode(), done.stderr.decode()


async def _gc_status(c: BookieClient) -> dict[str, Any]:
    st, resp = await c.call(AdminStatusRequest())
    assert st == Status.OK, Status(st).name
    return dict(json.loads(resp.status_json)["gc"])  # type: ignore[union-attr]


async def gc_pass(bookie: BookieProcess, kind: AdminKind) -> dict[str, Any] | None:
    """Trigger one GC pass and wait until it is done: its summary, or None when the
    bookie died during it (a crash point). In-process rather than ``ledgerd shell gc
    --wait``, which spends half a second starting Python; the same admin requests."""
    try:
        async with open_bookie_client(bookie.address) as c:
            before = await _gc_status(c)
            st, resp = await c.call(AdminTriggerRequest(kind=int(kind)))
            assert st == Status.OK, Status(st).name
            # A pass already running finishes first; then ours runs.
            target = before["passes"] + (1 if resp.started else 2)  # type: ignore[union-attr]
            with trio.fail_after(EVENT_BOUND_S):
                while (now := await _gc_status(c))["passes"] < target:
                    await trio.sleep(0.02)
            return dict(now["last"])
    except* (BookieConnectionError, trio.BrokenResourceError):
        pass
    return None


def _payload(rng_seed: int, lid: int, eid: int) -> bytes:
    r = random.Random(rng_seed * 1_000_003 + lid * 10_007 + eid)
    return bytes([lid % 251]) * r.randint(200, 900)


async def _check_ledgers(bookie: BookieProcess, written: dict[int, int], step: str) -> None:
    async with open_bookie_client(bookie.address) as c:
        for lid, n in written.items():
            for eid in range(n):
                st, resp = await c.call(ReadRequest(ledger_id=lid, entry_id=eid))
                assert st == Status.OK, (f"after a kill at {step}: ledger {lid} entry {eid} "
                                         f"answered {Status(st).name}\n{bookie.log_tail()}")
                want = entry(lid, eid, payload=_payload(SEED, lid, eid))
                assert resp.entry == want, (  # type: ignore[union-attr]
                    f"after a kill at {step}: ledger {lid} entry {eid} has other bytes")


async def test_gc_and_compaction_survive_kill9_at_every_step(
        bookie_factory: Callable[..., BookieProcess], zk_chroot: str) -> None:
    rng = random.Random(SEED)
    bookie = bookie_factory(
        log_size_limit=64 * 1024, write_buffer_size_bytes=4096, gc_wait_time_ms=3_600_000,
        minor_compaction_interval_s=0, major_compaction_interval_s=0,
        major_compaction_threshold=0.9, compaction_rate=1_000_000,
        compaction_max_outstanding_requests=rng.choice([20, 40, 60]))
    async with metadata_store(zk_chroot) as store:
        ledgers = LedgerManager(store, "/ledgers")
        md = LedgerMetadata(ensemble_size=1, write_quorum=1, ack_quorum=1,
                            ensembles=((0, (bookie.bookie_id,)),))
        ids = [(await ledgers.create(md))[0] for _ in range(5)]
        alone, kept, dropped = ids[0], ids[1:3], ids[3:]
        steps = [f"{step}:{rng.randint(1, n)}" for step, n in STEPS.items()]
        bookie.start(env={"LEDGERD_CRASH_AT": steps[0]})
        await wait_registered(store, bookie)
        written: dict[int, int] = {}
        async with open_bookie_client(bookie.address) as c:
            # One ledger alone first (its logs die whole), then four interleaved (their
            # logs are 2/4 live once two are deleted: compacted at the 0.9 threshold).
            order = [alone] * 120 + [lid for _ in range(240) for lid in (*kept, *dropped)]
            for lid in order:
                eid = written.get(lid, 0)
                st, _ = await c.call(AddRequest(
                    ledger_id=lid, first_entry_id=eid, master_key=KEY,
                    entries=(entry(lid, eid, payload=_payload(SEED, lid, eid)),)))
                assert st == Status.OK
                written[lid] = eid + 1
        for lid in (alone, *dropped):
            await ledgers.delete(lid)
            del written[lid]

        for i, step in enumerate(steps):
            code = 0
            # The first pass after a (re)start only suspects the deleted ledgers still
            # here; the second deletes them and compacts what that frees.
            for _ in range(2):
                if await gc_pass(bookie, AdminKind.MAJOR_COMPACTION) is None:
                    break
            with trio.move_on_after(EVENT_BOUND_S):
                code = await bookie.exited()
            assert code == -9, f"the bookie did not die at {step}:\n{bookie.log_tail()}"
            bookie.wait()
            nxt = {"LEDGERD_CRASH_AT": steps[i + 1]} if i + 1 < len(steps) else {}
            bookie.start(env=nxt)
            await wait_registered(store, bookie)
            await _check_ledgers(bookie, written, step)

        # A deleted ledger that no step's pass confirmed is a suspect after this one.
        assert await gc_pass(bookie, AdminKind.GC) is not None
        code, out, err = await _shell("gc", "--bookie", bookie.address, "--major", "--wait",
                                      "--json")
        assert code == 0, err
        summary = json.loads(out)
        assert summary["error"] == "" and summary["stopped"] == ""
        await _check_ledgers(bookie, written, "the end")
        async with open_bookie_client(bookie.address) as c:
            for lid in (alone, *dropped):
                st, _ = await c.call(ReadRequest(ledger_id=lid, entry_id=0))
                assert st == Status.NO_SUCH_LEDGER, (lid, Status(st).name)
        conf = str(bookie.config_path)
        code, out, err = await _shell("listentrylogs", "--conf", conf, "--json")
        assert code == 0, err
        logs = json.loads(out)["logs"]
        dead = [g["log"] for g in logs if g["rolled"] and g["live"] == 0]
        assert not dead, f"dead entry logs left after a full pass: {dead}"
        assert all(g["live"] >= 0.9 for g in logs if g["rolled"]), logs
        assert await trio.to_thread.run_sync(bookie.terminate) == 0
        code, out, err = await _shell("localconsistencycheck", "--conf", conf)
        assert code == 0, out + err
        assert "consistent" in out
