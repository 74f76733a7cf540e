"""Load drivers for one bookie: plain non-blocking sockets over one epoll, no trio.

redis-benchmark, the anchor the bookie benches compare with, is C over epoll. A trio
driver costs a task wake-up per connection and per reply, and with 64 connections of
one add each it was the driver, not the bookie, that set the pace (bench/RESULTS.md).
These drivers do the least Python per request: one ``recv`` per readable socket, replies
parsed by header only, the next frame a patched copy of a template. Both run in their
own process (bench/latency.py starts them), so their CPU is visible and separate.

- ``closed_loop``: ``conns`` connections each keeping ``window`` adds in flight.
- ``open_loop``: adds due on a fixed schedule, round-robin over the connections;
  latency counts from the *due* time, so a stall delays every entry due during it
  instead of pausing the clock (no coordinated omission).
"""

from __future__ import annotations

import select
import socket
import time
from collections.abc import Callable
from typing import Any

from bench.bookie import _Template, take_replies
from ledgerd.wire.frames import encode_request
from ledgerd.wire.messages import ReadRequest

__all__ = ["closed_loop", "open_loop", "percentiles", "read_loop"]


def percentiles(lat: list[float]) -> dict[str, float]:
    lat = sorted(lat)
    if not lat:
        return {"p50_ms": 0.0, "p99_ms": 0.0, "p999_ms": 0.0, "max_ms": 0.0}
    return {"p50_ms": 1000 * lat[len(lat) // 2], "p99_ms": 1000 * lat[int(len(lat) * 0.99)],
            "p999_ms": 1000 * lat[min(len(lat) - 1, int(len(lat) * 0.999))],
            "max_ms": 1000 * lat[-1]}


def _connect(port: int, conns: int) -> tuple[select.epoll, list[socket.socket]]:
    ep = select.epoll()
    socks = []
    for _ in range(conns):
        s = socket.create_connection(("127.0.0.1", port))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.setblocking(False)
        ep.register(s.fileno(), select.EPOLLIN)
        socks.append(s)
    return ep, socks


def _send(s: socket.socket, data: bytes) -> None:
    """Send all of ``data`` (small: it normally fits the socket buffer at once)."""
    view = memoryview(data)
    while view:
        try:
            n = s.send(view)
        except BlockingIOError:
            select.select([], [s], [], 1.0)
            continue
        view = view[n:]


def closed_loop(port: int, conns: int, window: int, seconds: float, *, batch: int = 1,
                warmup: float = 1.0, ledger_base: int = 1000, ledgers: int = 0,
                make_frame: Callable[[int], bytes] | None = None) -> dict[str, Any]:
    """Adds/s and latency with ``window`` adds of ``batch`` entries in flight per
    connection; counts the replies that arrive in the measured ``seconds``. With
    ``ledgers``, the adds go round-robin over that many ledgers (shared by the
    connections), else each connection writes a ledger of its own. ``make_frame(cid)``
    sends other requests instead (``read_loop``)."""
    template = _Template(batch, 1024)
    ep, socks = _connect(port, conns)
    by_fd = {s.fileno(): i for i, s in enumerate(socks)}
    sent_at: list[dict[int, float]] = [{} for _ in socks]
    bufs = [bytearray() for _ in socks]
    next_cid = [0] * conns
    next_entry = [0] * conns
    ledger_entry = [0] * ledgers  # next entry of each shared ledger
    rr = [0]
    # With shared ledgers the first round creates them (a key bind each): the warm-up
    # and the measured seconds start once every ledger has its first entry acked.
    created = ledgers == 0
    t_start = time.perf_counter() + warmup if created else float("inf")
    t_end = t_start + seconds
    acked_total = 0
    lat: list[float] = []
    acked = errors = 0

    def refill(i: int, now: float) -> None:
        pending = sent_at[i]
        n = window - len(pending)
        if n <= 0:
            return
        chunks: list[bytes | bytearray] = []
        ledger = ledger_base + i
        for _ in range(n):
            cid = next_cid[i]
            if make_frame is not None:
                chunks.append(make_frame(cid))
            elif ledgers:
                k = rr[0] % ledgers
                rr[0] += 1
                chunks.append(template.make(cid, ledger_base + k, ledger_entry[k]))
                ledger_entry[k] += batch
            else:
                chunks.append(template.make(cid, ledger, next_entry[i]))
                next_entry[i] += batch
            pending[cid] = now
            next_cid[i] = cid + 1
        _send(socks[i], b"".join(chunks))

    try:
        now = time.perf_counter()
        for i in range(conns):
            refill(i, now)
        while True:
            now = time.perf_counter()
            if now >= t_end:
                break
            if not created and acked_total >= ledgers:
                created = True
                t_start = now + warmup
                t_end = t_start + seconds
            for fd, _ in ep.poll(min(0.1, t_end - now)):
                i = by_fd[fd]
                data = socks[i].recv(1 << 20)
                if not data:
                    raise ConnectionError("the bookie closed a connection")
                buf = bufs[i]
                buf += data
                now = time.perf_counter()
                pending = sent_at[i]
                counted = t_start <= now < t_end
                for cid, status in take_replies(buf):
                    t0 = pending.pop(cid)
                    acked_total += 1
                    if status:
                        errors += 1
                    elif counted:
                        acked += batch
                        lat.append(now - t0)
                if now < t_end and len(pending) <= window // 2:
                    refill(i, now)
    finally:
        for s in socks:
            s.close()
        ep.close()
    return {"entries_per_s": acked / seconds, "errors": errors,
            "entries_written": min(ledger_entry) if ledgers else 0, **percentiles(lat)}


def read_loop(port: int, conns: int, window: int, seconds: float,
              pick: Callable[[], tuple[int, int]], *, warmup: float = 0.5) -> dict[str, Any]:
    """Reads/s and latency with ``window`` single-entry reads in flight per connection,
    each of the (ledger, entry) ``pick`` returns; counts OK replies in the measured
    ``seconds`` (any other status is an error)."""

    def frame(cid: int) -> bytes:
        lid, eid = pick()
        return encode_request(ReadRequest(ledger_id=lid, entry_id=eid), cid, 0)

    r = closed_loop(port, conns, window, seconds, warmup=warmup, make_frame=frame)
    r["reads_per_s"] = r.pop("entries_per_s")
    r.pop("entries_written")
    return r


def open_loop(port: int, rate: float, conns: int, seconds: float, *,
              ledger_base: int = 2000) -> dict[str, Any]:
    """Latency of single-entry adds due every ``1 / rate`` s, from their due time."""
    template = _Template(1, 1024)
    ep, socks = _connect(port, conns)
    by_fd = {s.fileno(): i for i, s in enumerate(socks)}
    bufs = [bytearray() for _ in socks]
    interval = 1.0 / rate
    total = int(rate * seconds)
    t0 = time.perf_counter() + 0.2
    due: dict[int, float] = {}
    lat: list[float] = []
    sent = got = errors = 0
    deadline = t0 + seconds + 30
    try:
        while got < total:
            now = time.perf_counter()
            if now > deadline:
                raise TimeoutError(f"{total - got} adds unanswered 30 s after the schedule")
            n = min(total, int((now - t0) / interval) + 1) if now >= t0 else 0
            if n > sent:
                frames: list[list[bytes | bytearray]] = [[] for _ in socks]
                for k in range(sent, n):
                    i = k % conns
                    due[k] = t0 + k * interval
                    frames[i].append(template.make(k, ledger_base + i, k // conns))
                sent = n
                for i, chunk in enumerate(frames):
                    if chunk:
                        _send(socks[i], b"".join(chunk))
            wait = max(0.0, t0 + sent * interval - time.perf_counter()) if sent < total else 0.1
            for fd, _ in ep.poll(wait):
                i = by_fd[fd]
                data = socks[i].recv(1 << 20)
                if not data:
                    raise ConnectionError("the bookie closed a connection")
                buf = bufs[i]
                buf += data
                now = time.perf_counter()
                for cid, status in take_replies(buf):
                    got += 1
                    if status:
                        errors += 1
                        due.pop(cid)
                    else:
                        lat.append(now - due.pop(cid))
    finally:
        for s in socks:
            s.close()
        ep.close()
    return {"rate": rate, "errors": errors, "entries": len(lat), **percentiles(lat)}
