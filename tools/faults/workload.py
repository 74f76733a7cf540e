"""Workload processes of a fault round; each records every operation in the history.

- writers create ledgers and append to them with adds pipelined, then close them;
- tail readers follow ledgers being written (LAC, then the entries up to it);
- recoverers open ledgers being written with recovery, fencing their writers;
- a log writer appends to a log (rolling ledgers), a log reader reads it from the start.

An add's invoke and its outcome carry the same ``detail`` (process-local sequence), so
the checker can tell when it was started. Every outcome is recorded, including errors
(``fail`` with the exception); only ``ok`` outcomes are promises the checker holds.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

import trio

from ledgerd.client import Client
from ledgerd.handles import PendingAppend
from ledgerd.ledgerlog import LogPosition
from ledgerd.tools.faults.history import History
from ledgerd.tools.faults.payloads import payload_size

__all__ = ["PASSWORD", "Workload"]

PASSWORD = b"fault-harness"
QUORUMS = ((3, 2, 2), (3, 3, 2), (2, 2, 2))


@dataclass
class Workload:
    history: History
    now: Callable[[], float]
    rng: random.Random
    stop: trio.Event = field(default_factory=trio.Event)
    active: list[int] = field(default_factory=list)   # ledgers being written
    ledgers: set[int] = field(default_factory=set)    # every ledger created
    log_name: str = ""
    started: trio.Event = field(default_factory=trio.Event)  # set when a ledger is added

    def _activate(self, lid: int) -> None:
        self.active.append(lid)
        self.started.set()
        self.started = trio.Event()

    def _rec(self, process: str, kind: str, op: str, **kw: object) -> None:
        self.history.record(self.now(), process, kind, op, **kw)  # type: ignore[arg-type]

    async def writer(self, name: str, client: Client, inflight: int = 16) -> None:
        seq = 0
        while not self.stop.is_set():
            q = self.rng.choice(QUORUMS)
            self._rec(name, "invoke", "create", detail=str(q))
            try:
                lh = await client.create_ledger(*q, password=PASSWORD)
            except Exception as exc:
                self._rec(name, "fail", "create", detail=repr(exc)[:200])
                await trio.sleep(0.2)
                continue
            lid = lh.ledger_id
            self.ledgers.add(lid)
            self._activate(lid)
            self._rec(name, "ok", "create", ledger=lid)
            limit = trio.Semaphore(inflight)
            failed = trio.Event()
            async with trio.open_nursery() as adds:
                for _ in range(self.rng.randint(30, 300)):
                    if self.stop.is_set() or failed.is_set():
                        break
                    await limit.acquire()
                    seq += 1
                    head = b"%s L%d s%d " % (name.encode(), lid, seq)
                    payload = head + bytes(max(0, payload_size(self.rng) - len(head)))
                    tag = str(seq)
                    self._rec(name, "invoke", "add", ledger=lid, value=payload, detail=tag)
                    try:
                        pending = await lh.submit(payload)
                    except Exception:
                        self._rec(name, "fail", "add", ledger=lid, detail=tag)
                        limit.release()
                        break
                    adds.start_soon(self._finish_add, name, lid, pending, payload, tag, limit,
                                    failed)
            self.active.remove(lid)
            self._rec(name, "invoke", "close", ledger=lid)
            try:
                await lh.close()
            except Exception as exc:
                self._rec(name, "fail", "close", ledger=lid, detail=repr(exc)[:200])
            else:
                self._rec(name, "ok", "close", ledger=lid, entry=lh.last_add_confirmed)

    async def _finish_add(self, name: str, lid: int, pending: PendingAppend, payload: bytes,
                          tag: str, limit: trio.Semaphore, failed: trio.Event) -> None:
        try:
            eid = await pending.wait()
        except Exception:
            self._rec(name, "fail", "add", ledger=lid, detail=tag)
            failed.set()
        else:
            self._rec(name, "ok", "add", ledger=lid, entry=eid, value=payload, detail=tag)
        finally:
            limit.release()

    async def tail_reader(self, name: str, client: Client) -> None:
        while not self.stop.is_set():
            if not self.active:
                await self.started.wait()   # cancelled at the round's end
                continue
            lid = self.rng.choice(self.active)
            try:
                rh = await client.open_ledger(lid, PASSWORD, recovery=False)
                read_to = -1
                with trio.move_on_after(3):
                    while not self.stop.is_set():
                        lac = await rh.wait_lac_beyond(read_to, timeout=1.0)
                        self._rec(name, "ok", "lac", ledger=lid, entry=lac)
                        if lac > read_to:
                            async for entry in rh.read(read_to + 1, lac):
                                self._rec(name, "ok", "read", ledger=lid, entry=entry.entry_id,
                                          value=bytes(entry.payload))
                            read_to = lac
                        if rh.is_closed:
                            break
            except Exception as exc:
                self._rec(name, "fail", "read", ledger=lid, detail=repr(exc)[:200])
                await trio.sleep(0.2)

    async def recoverer(self, name: str, client: Client, every_s: float = 2.0) -> None:
        while not self.stop.is_set():
            await trio.sleep(self.rng.uniform(0.5, every_s))
            if not self.active or self.stop.is_set():
                continue
            lid = self.rng.choice(self.active)
            self._rec(name, "invoke", "recover", ledger=lid)
            try:
                rh = await client.open_ledger(lid, PASSWORD, recovery=True)
            except Exception as exc:
                self._rec(name, "fail", "recover", ledger=lid, detail=repr(exc)[:200])
            else:
                self._rec(name, "ok", "recover", ledger=lid, entry=rh.last_add_confirmed)

    async def log_writer(self, name: str, client: Client) -> None:
        seq = 0
        while not self.stop.is_set():
            try:
                writer = await client.logs.open_writer(self.log_name, 3, 2, 2, password=PASSWORD,
                                                       roll_entries=40)
            except Exception as exc:
                self._rec(name, "fail", "open-log", detail=repr(exc)[:200])
                await trio.sleep(0.3)
                continue
            self.ledgers.add(writer.ledger_id)
            try:
                while not self.stop.is_set():
                    seq += 1
                    head = b"%s s%d " % (name.encode(), seq)
                    payload = head + bytes(max(0, payload_size(self.rng) - len(head)))
                    tag = str(seq)
                    self._rec(name, "invoke", "add", value=payload, detail=tag)
                    try:
                        pos: LogPosition = await writer.append(payload)
                    except Exception as exc:
                        self._rec(name, "fail", "add", detail=f"{tag} {exc!r}"[:200])
                        break
                    self.ledgers.add(pos.ledger_id)
                    self._rec(name, "ok", "add", ledger=pos.ledger_id, entry=pos.entry_id,
                              value=payload, detail=tag)
            finally:
                self.ledgers.add(writer.ledger_id)

    async def log_reader(self, name: str, client: Client) -> None:
        while not self.stop.is_set():
            await trio.sleep(1.0)
            try:
                async for entry in client.logs.read(self.log_name, PASSWORD):
                    self._rec(name, "ok", "read", ledger=entry.ledger_id, entry=entry.entry_id,
                              value=bytes(entry.payload))
                    if self.stop.is_set():
                        break
            except Exception as exc:
                self._rec(name, "fail", "read", detail=repr(exc)[:200])
