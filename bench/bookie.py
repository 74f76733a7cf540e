"""Bookie throughput beside Redis, measured side by side in one run.

    python bench/bookie.py [--seconds 8] [--rounds 2] [--baseline DIR] [--json]

With ``--baseline DIR`` (another checkout, e.g. ``git worktree add /tmp/before HEAD~3``
with its ``native/_native*.so`` copied in) a second bookie runs that checkout's code, and
every round drives both on the 1-entry and 64-entry cases, alternating which goes first,
so a change is measured against its parent side by side in one run.

Starts one bookie process (journal and entry logs under a temp directory on the work
disk, no ZooKeeper needed) and drives it over TCP from a separate driver process with
4 connections of pipelined 1 KiB adds: frames of 1 entry (200 in flight per
connection) and frames of 64 entries (8 frames in flight per connection; more only lengthens the queue). Every reply
counts only after the bookie's journal fdatasync. Then ``redis-server --appendonly yes
--appendfsync always`` on the same disk, driven by ``redis-benchmark -t xadd -d 1024
-P 16 -c 50`` (given as a literal ``XADD`` command with a 1 KiB value: the Debian
redis-benchmark 7.0 has no built-in xadd test). Rounds interleave the three runs; medians are reported with the ratios.

The driver pre-encodes one frame and patches ids into copies (bookies do not verify
digests), so its own CPU use stays small next to the bookie's.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import trio

from ledgerd.tools.bookieprocess import BookieProcess
from ledgerd.tools.zkserver import find_free_port
from ledgerd.wire.entry import Digester, DigestType, encode_entry, master_key
from ledgerd.wire.frames import encode_request
from ledgerd.wire.messages import AddRequest

KEY = master_key(b"bench")
_I32 = struct.Struct(">i")
_Q = struct.Struct(">q")
_REPLY = struct.Struct(">ih")


# -- the driver (its own process) --------------------------------------------------------

class _Template:
    """One encoded Add frame and where its ids live, to patch copies cheaply."""

    def __init__(self, batch: int, size: int) -> None:
        d = Digester(DigestType.CRC32C)
        entries = tuple(encode_entry(d, 1, i, i - 1, 0, bytes([i % 251]) * size)
                        for i in range(batch))
        self.frame = encode_request(AddRequest(ledger_id=1, first_entry_id=0, master_key=KEY,
                                               entries=entries), 0, 0)
        self.entry_offsets = []
        pos = 0
        for e in entries:
            pos = self.frame.index(e, pos)
            self.entry_offsets.append(pos)
            pos += len(e)
        self.batch = batch

    def make(self, cid: int, ledger: int, first: int) -> bytearray:
        buf = bytearray(self.frame)
        _I32.pack_into(buf, 8, cid)
        _Q.pack_into(buf, 12, ledger)
        _Q.pack_into(buf, 20, first)
        for i, off in enumerate(self.entry_offsets):
            _Q.pack_into(buf, off, ledger)
            _Q.pack_into(buf, off + 8, first + i)
        return buf


def take_replies(buf: bytearray) -> list[tuple[int, int]]:
    """(correlation id, status) of every whole reply frame in ``buf``, removed from it."""
    out = []
    pos = 0
    while pos + 4 <= len(buf):
        (size,) = _I32.unpack_from(buf, pos)
        if pos + 4 + size > len(buf):
            break
        out.append(_REPLY.unpack_from(buf, pos + 4))
        pos += 4 + size
    del buf[:pos]
    return out


async def _drive_connection(port: int, index: int, template: _Template, window: int,
                            warmup: float, seconds: float, out: dict[str, list[float]]) -> None:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    ledger = 1000 + index
    sent_at: dict[int, float] = {}
    space = trio.Event()
    state = {"cid": 0, "entry": 0, "acked": 0, "errors": 0}
    t_start = time.perf_counter() + warmup
    t_end = t_start + seconds
    latencies: list[float] = []
    finished = trio.Event()  # the sender is done and every reply is in
    sending = [True]

    async def sender() -> None:
        nonlocal space
        while time.perf_counter() < t_end:
            n = window - len(sent_at)
            if n <= 0:
                space = trio.Event()
                await space.wait()
                continue
            chunks = []
            now = time.perf_counter()
            for _ in range(n):
                cid = state["cid"]
                chunks.append(template.make(cid, ledger, state["entry"]))
                sent_at[cid] = now
                state["cid"] += 1
                state["entry"] += template.batch
            await stream.send_all(b"".join(chunks))
        sending[0] = False
        if not sent_at:
            finished.set()

    async def receiver() -> None:
        buf = bytearray()
        while True:
            data = await stream.receive_some(1 << 20)
            if not data:
                return
            buf += data
            now = time.perf_counter()
            for cid, status in take_replies(buf):
                t0 = sent_at.pop(cid)
                if status:
                    state["errors"] += 1
                elif t_start <= now < t_end:
                    state["acked"] += template.batch
                    latencies.append(now - t0)
            if len(sent_at) <= window // 2:
                space.set()
            if not sending[0] and not sent_at:
                finished.set()

    async with stream, trio.open_nursery() as nursery:
        nursery.start_soon(sender)
        nursery.start_soon(receiver)
        await finished.wait()
        nursery.cancel_scope.cancel()
    out["acked"].append(state["acked"])
    out["errors"].append(state["errors"])
    out["latencies"].extend(latencies)


async def _drive(port: int, batch: int, conns: int, window: int, seconds: float) -> dict[str, float]:
    template = _Template(batch, 1024)
    out: dict[str, list[float]] = {"acked": [], "errors": [], "latencies": []}
    async with trio.open_nursery() as nursery:
        for i in range(conns):
            nursery.start_soon(_drive_connection, port, i, template, window, 1.0, seconds, out)
    lat = sorted(out["latencies"])
    return {
        "entries_per_s": sum(out["acked"]) / seconds,
        "errors": sum(out["errors"]),
        "p50_ms": 1000 * lat[len(lat) // 2] if lat else 0.0,
        "p99_ms": 1000 * lat[int(len(lat) * 0.99)] if lat else 0.0,
    }


# -- the orchestrator --------------------------------------------------------------------

def _run_ledgerd(port: int, batch: int, window: int, seconds: float) -> dict[str, float]:
    cmd = [sys.executable, __file__, "drive", "--port", str(port), "--batch", str(batch),
           "--conns", "4", "--window", str(window), "--seconds", str(seconds)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@contextmanager
def redis_server(base: Path) -> Iterator[int]:
    """A fresh ``redis-server`` (append-only file, fsync per write) with its data under
    ``base``; yields its port once it answers PING. The one way the bench scripts start
    Redis."""
    port = find_free_port()
    data = base / f"redis-{port}"
    data.mkdir()
    server = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--appendonly", "yes",
         "--appendfsync", "always", "--dir", str(data), "--save", ""],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):
            try:
                with socket.create_connection(("127.0.0.1", port), 0.5) as s:
                    s.sendall(b"*1\r\n$4\r\nPING\r\n")
                    if s.recv(64).startswith(b"+PONG"):
                        break
            except OSError:  # not listening yet
                if server.poll() is not None:
                    raise RuntimeError(f"redis-server exited ({server.returncode})") from None
            time.sleep(0.05)
        else:
            raise RuntimeError("redis-server did not answer PING in 10 s")
        yield port
    finally:
        server.terminate()
        server.wait(30)
        shutil.rmtree(data, ignore_errors=True)


def _run_redis(base: Path, seconds: float, conns: int = 50, pipeline: int = 16
               ) -> dict[str, float]:
    with redis_server(base) as port:
        n = int((160_000 if pipeline > 1 else 40_000) * seconds)
        # redis-benchmark 7.0 has no built-in xadd test: the command is given literally,
        # with a 1 KiB field value (what `-t xadd -d 1024` does in later versions).
        done = subprocess.run(["redis-benchmark", "-p", str(port), "-P", str(pipeline),
                               "-c", str(conns),
                               "-n", str(n), "--csv", "XADD", "bench", "*", "f", "x" * 1024],
                              capture_output=True, text=True, check=True)
    rows = list(csv.DictReader(io.StringIO(done.stdout)))
    row = rows[-1]
    return {"entries_per_s": float(row["rps"]), "p50_ms": float(row["p50_latency_ms"]),
            "p99_ms": float(row["p99_latency_ms"]), "errors": 0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd")
    drive = sub.add_parser("drive")
    drive.add_argument("--port", type=int, required=True)
    drive.add_argument("--batch", type=int, default=1)
    drive.add_argument("--conns", type=int, default=4)
    drive.add_argument("--window", type=int, default=200)
    drive.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--baseline", type=Path, default=None,
                        help="another checkout to run a second bookie from, side by side")
    parser.add_argument("--json", action="store_true",
                        help="every round's results as one JSON line instead of the table")
    args = parser.parse_args()
    if args.cmd == "drive":
        print(json.dumps(trio.run(_drive, args.port, args.batch, args.conns, args.window,
                                  args.seconds)))
        return
    for tool in ("redis-server", "redis-benchmark", "redis-cli"):
        if shutil.which(tool) is None:
            sys.exit(f"{tool} is missing: `make bench-deps` installs redis-server and redis-tools")
    base = Path(tempfile.mkdtemp(prefix="ledgerd-bench-", dir=os.environ.get("BENCH_DIR")))
    load_start = os.getloadavg()[0]
    # Lone bookies, no ZooKeeper: each is up at its READY=1.
    bookie = BookieProcess(base / "bookie", "", settings={"log_level": "WARNING"})
    before: BookieProcess | None = None
    if args.baseline is not None:
        before = BookieProcess(base / "before", "", settings={"log_level": "WARNING"})
    try:
        bookie.start_ready()
        if before is not None:
            before.start_ready(cwd=args.baseline.resolve())
        runs: dict[str, list[dict[str, float]]] = {"redis": [], "b1": [], "b64": []}
        if before is not None:
            runs.update({"b1-before": [], "b64-before": []})
        for rnd in range(args.rounds):
            cases = [("b1", bookie, 1, 200), ("b64", bookie, 64, 8)]
            if before is not None:
                cases += [("b1-before", before, 1, 200), ("b64-before", before, 64, 8)]
                # Alternate which tree goes first, so neither always runs warmer.
                cases.sort(key=lambda c: (c[2], c[0].endswith("before") == (rnd % 2 == 0)))
            # os.sync() first: the previous run's page-cache writeback (the bookie's
            # entry logs are gigabytes) must not slow the next run's fdatasyncs.
            os.sync()
            runs["redis"].append(_run_redis(base, args.seconds))
            for key, proc, batch, window in cases:
                os.sync()
                runs[key].append(_run_ledgerd(proc.port, batch, window, args.seconds))
            print(f"round {rnd + 1} (load {os.getloadavg()[0]:.2f}): " + ", ".join(
                f"{k} {v[-1]['entries_per_s']:,.0f}/s" for k, v in runs.items()), flush=True)
    finally:
        for b in (bookie, before):
            if b is not None and b.running:
                b.terminate()
    if args.json:
        shutil.rmtree(base, ignore_errors=True)
        print(json.dumps({"runs": runs, "load": [load_start, os.getloadavg()[0]]}))
        return
    med = {k: {m: statistics.median(r[m] for r in v) for m in v[0]} for k, v in runs.items()}
    redis = med["redis"]["entries_per_s"]
    print()
    print("| run | durable entries/s | p50 ms | p99 ms | vs Redis |")
    print("|---|---|---|---|---|")
    names = {"redis": "Redis 7 XADD, appendfsync always, 50 conns x 16 pipelined",
             "b1": "ledgerd, 1 entry/frame, 4 conns x 200 in flight",
             "b64": "ledgerd, 64 entries/frame, 4 conns x 8 frames in flight"}
    if before is not None:
        names["b1-before"] = f"baseline {args.baseline}, 1 entry/frame"
        names["b64-before"] = f"baseline {args.baseline}, 64 entries/frame"
    for key in names:
        m = med[key]
        print(f"| {names[key]} | {m['entries_per_s']:,.0f} | {m['p50_ms']:.2f} | "
              f"{m['p99_ms']:.2f} | {m['entries_per_s'] / redis:.2f}x |")
    if before is not None:
        for case in ("b1", "b64"):
            ratios = [a["entries_per_s"] / b["entries_per_s"]
                      for a, b in zip(runs[case], runs[case + "-before"], strict=True)]
            print(f"\n{case} current / baseline per round: "
                  + ", ".join(f"{r:.2f}" for r in ratios)
                  + f"; median {statistics.median(ratios):.2f}")
    errors = sum(r["errors"] for v in runs.values() for r in v)
    print(f"\n{args.rounds} rounds of {args.seconds:.0f} s, medians; errors: {errors}")
    shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
