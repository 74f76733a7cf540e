"""Add latency under open-loop load, and how a bookie scales with light clients.

    python bench/latency.py [--rounds 3] [--seconds 5] [--json]
    python bench/latency.py selfcheck      # the C driver's RESP against redis-server

One bookie process (no ZooKeeper), 1 KiB single-entry Add frames from a driver process:
by default ``bench/adddriver.c`` (C over epoll, like redis-benchmark; ``bench/cdriver.py``
builds it), or ``--driver python`` (``bench/drivers.py``, which costs the machine most of
a core at many connections and adds to light-load latencies: its waits round up to the
millisecond).

- **Open loop**: entries are due on a fixed schedule (4 connections, the rate split
  between them) and latency counts from the *scheduled* time, so a stall delays every
  entry due during it instead of pausing the clock (no coordinated omission). Loads are
  10% and 50% of the closed-loop maximum measured in the same round (4 connections x
  200 in flight). Beside it, the raw disk: the same driver process appends 1 KiB +
  fdatasync in a loop on the bookie's disk at the same time ("raw fdatasync p99 of the
  same run"). Goal (#22): add p99 <= 3x that p99.
- **Redis at the same rates**: in the same round, a fresh ``redis-server --appendonly
  yes --appendfsync always`` on the same disk is driven by the same C driver with the
  same schedule, connections and clock, each operation ``XADD bench * f <1 KiB>``
  (``adddriver redis-open``), at the same absolute rates as the bookie's open loop and
  with the same raw fdatasync loop beside it; the bookie and Redis alternate which goes
  first. Before any round a self-check sends a handful of XADDs and reads them back
  (``XLEN``, ``XRANGE``), and checks that error replies count as errors (``selfcheck``
  runs it alone). ``--no-redis`` skips Redis. ``--rates`` sets absolute rates instead
  of fractions of the round's maximum (two trees compared at the same rates).
- **Scaling**: 1, 4, 16, 64 connections x 1 outstanding, and 4 connections x 1, 4, 16,
  64, 200 outstanding (closed loop); beside them Redis (appendfsync always) driven by
  ``redis-benchmark -c 64 -P 1`` and ``-c 50 -P 16`` in the same round. Goals (#22):
  64 x 1 >= 0.5x Redis 64 x 1; 4 x 200 >= 0.75x Redis 50 x 16.

Rounds interleave every case; every round is printed, then the medians and the load.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


from bench import cdriver
from bench.bookie import _run_redis, redis_server
from bench.drivers import closed_loop, open_loop, percentiles
from ledgerd.tools.bookieprocess import BookieProcess


def _raw_syncs(path: Path, stop: threading.Event, out: list[float]) -> None:
    """1 KiB appends, each followed by fdatasync, timed (the disk's own latency)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    block = b"x" * 1024
    try:
        while not stop.is_set():
            os.write(fd, block)
            t0 = time.perf_counter()
            os.fdatasync(fd)
            out.append(time.perf_counter() - t0)
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)


def _beside_raw_syncs(sync_path: Path, run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``run()``'s result, with the raw disk's fdatasync p50/p99 timed by a thread of this
    process meanwhile (the same 1 KiB appends the bookie and Redis are held to)."""
    syncs: list[float] = []
    stop = threading.Event()
    raw = threading.Thread(target=_raw_syncs, args=(sync_path, stop, syncs), daemon=True)
    raw.start()
    try:
        result = run()
    finally:
        stop.set()
        raw.join()
    fs = percentiles(syncs)
    result.update({"fsync_p50_ms": fs["p50_ms"], "fsync_p99_ms": fs["p99_ms"],
                   "fsyncs": len(syncs)})
    return result


def _drive_open(port: int, rate: float, conns: int, seconds: float,
                sync_path: Path, driver: str) -> dict[str, Any]:
    """The open loop beside the raw disk (with the C driver, the loop itself runs in a
    process of its own)."""
    if driver == "c":
        return _beside_raw_syncs(sync_path, lambda: cdriver.open_loop(port, rate, conns, seconds))
    return _beside_raw_syncs(sync_path, lambda: open_loop(port, rate, conns, seconds))


# -- the orchestrator --------------------------------------------------------------------

def _driver(*args: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True,
                          check=True)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


DRIVER = "c"  # the orchestrator's --driver


def _closed(port: int, conns: int, window: int, seconds: float) -> dict[str, Any]:
    if DRIVER == "c":
        return cdriver.closed_loop(port, conns, window, seconds)
    return _driver("closed", "--port", str(port), "--conns", str(conns), "--window",
                   str(window), "--seconds", str(seconds))


def _open(port: int, rate: float, seconds: float, sync_path: Path) -> dict[str, Any]:
    return _driver("open", "--port", str(port), "--rate", str(rate), "--seconds", str(seconds),
                   "--sync-path", str(sync_path), "--driver", DRIVER)


def _redis(base: Path, seconds: float, conns: int, pipeline: int) -> dict[str, Any]:
    return dict(_run_redis(base, seconds, conns=conns, pipeline=pipeline))


# -- Redis driven by the C driver ----------------------------------------------------------

def _resp(sock: socket.socket, *args: str | bytes) -> Any:
    """One command to Redis and its reply (bulk strings as bytes, errors as
    ``RuntimeError``): enough of RESP for the self-check's reads."""
    parts = [a.encode() if isinstance(a, str) else a for a in args]
    sock.sendall(b"*%d\r\n" % len(parts)
                 + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in parts))
    f = sock.makefile("rb")
    try:
        return _resp_read(f)
    finally:
        f.close()


def _resp_read(f: Any) -> Any:
    line = f.readline()[:-2]
    kind, rest = line[:1], line[1:]
    if kind == b"+":
        return rest.decode()
    if kind == b"-":
        raise RuntimeError(rest.decode())
    if kind == b":":
        return int(rest)
    if kind == b"$":
        n = int(rest)
        return None if n < 0 else f.read(n + 2)[:-2]
    if kind == b"*":
        n = int(rest)
        return None if n < 0 else [_resp_read(f) for _ in range(n)]
    raise RuntimeError(f"unexpected RESP reply {line!r}")


def redis_selfcheck(base: Path) -> None:
    """The C driver's RESP against a real redis-server: five XADDs land as five 1 KiB
    entries of field ``f``, a closed loop's count matches the stream's, and error
    replies (XADD to a key that is not a stream) count as errors, not as done."""
    with redis_server(base) as port:
        r = cdriver.redis_open_loop(port, 100.0, 1, 0.05, stream="check")
        if (r["entries"], r["errors"]) != (5, 0):
            raise AssertionError(f"redis-open: 5 XADDs expected to succeed, got {r}")
        with socket.create_connection(("127.0.0.1", port), 5) as s:
            if _resp(s, "XLEN", "check") != 5:
                raise AssertionError("redis-open: the stream does not hold 5 entries")
            for _id, fields in _resp(s, "XRANGE", "check", "-", "+"):
                if fields != [b"f", b"x" * 1024]:
                    raise AssertionError(f"redis-open: entry fields {fields[:1]!r}...")
            _resp(s, "SET", "wrong", "a string")
        r = cdriver.redis_open_loop(port, 100.0, 2, 0.05, stream="wrong")
        if (r["entries"], r["errors"]) != (0, 5):
            raise AssertionError(f"redis-open: 5 errors expected, got {r}")
        r = cdriver.redis_closed_loop(port, 2, 8, 0.3, warmup=0.1, stream="closed")
        with socket.create_connection(("127.0.0.1", port), 5) as s:
            xlen = _resp(s, "XLEN", "closed")
        if r["errors"] or not 0 < r["entries"] <= xlen:
            raise AssertionError(f"redis-closed: {r} with {xlen} entries in the stream")


def _open_redis(base: Path, rate: float, seconds: float) -> dict[str, Any]:
    """Redis at ``rate`` XADDs/s over 4 connections: the bookie open loop's schedule,
    with the same raw fdatasync loop beside it on the same disk."""
    with redis_server(base) as port:
        os.sync()
        return _beside_raw_syncs(base / "rawsync-redis",
                                 lambda: cdriver.redis_open_loop(port, rate, 4, seconds))


SCALING = [(1, 1), (4, 1), (16, 1), (64, 1), (4, 4), (4, 16), (4, 64), (4, 200)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd")
    closed = sub.add_parser("closed")
    closed.add_argument("--port", type=int, required=True)
    closed.add_argument("--conns", type=int, default=4)
    closed.add_argument("--window", type=int, default=200)
    closed.add_argument("--seconds", type=float, default=5.0)
    opened = sub.add_parser("open")
    opened.add_argument("--port", type=int, required=True)
    opened.add_argument("--rate", type=float, required=True)
    opened.add_argument("--conns", type=int, default=4)
    opened.add_argument("--seconds", type=float, default=5.0)
    opened.add_argument("--sync-path", type=Path, required=True)
    opened.add_argument("--driver", choices=("c", "python"), default="c")
    sub.add_parser("selfcheck", help="the C driver's Redis mode against redis-server")
    parser.add_argument("--driver", choices=("c", "python"), default="c",
                        help="c: bench/adddriver.c (like redis-benchmark); python: "
                             "bench/drivers.py")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--loads", default="0.1,0.5", help="open-loop loads, fractions of max")
    parser.add_argument("--rates", default="",
                        help="open-loop rates in adds/s instead of --loads (the same "
                             "absolute rates for two trees in an A/B)")
    parser.add_argument("--no-scaling", action="store_true", help="open-loop cases only")
    parser.add_argument("--no-redis", action="store_true",
                        help="no Redis cases (open loop at the same rates, scaling anchors)")
    parser.add_argument("--variant", action="append", default=[],
                        help="NAME:key=value,... a bookie with these settings; several run "
                             "side by side, rounds interleaved")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.cmd == "closed":
        print(json.dumps(closed_loop(args.port, args.conns, args.window, args.seconds)))
        return
    if args.cmd == "open":
        print(json.dumps(_drive_open(args.port, args.rate, args.conns, args.seconds,
                                     args.sync_path, args.driver)))
        return
    global DRIVER
    DRIVER = args.driver
    cdriver.build()  # a missing compiler says so before any bookie starts
    needed = [] if args.no_redis else ["redis-server"] if args.no_scaling else [
        "redis-server", "redis-benchmark"]
    if args.cmd == "selfcheck":
        needed = ["redis-server"]
    for tool in needed:
        if shutil.which(tool) is None:
            sys.exit(f"{tool} is missing: `make bench-deps` installs redis-server and "
                     "redis-tools (or pass --no-redis)")
    base = Path(tempfile.mkdtemp(prefix="ledgerd-latency-bench-",
                                 dir=os.environ.get("BENCH_DIR")))
    if needed:
        try:
            redis_selfcheck(base)
        except BaseException:
            shutil.rmtree(base, ignore_errors=True)
            raise
        print("redis self-check: XADD encoding and reply parsing ok", flush=True)
        if args.cmd == "selfcheck":
            shutil.rmtree(base, ignore_errors=True)
            return
    variants = _variants(args.variant)
    bookies = {}
    for name, settings in variants.items():
        bookies[name] = BookieProcess(base / f"bookie-{name}", "",
                                      settings={"log_level": "WARNING", **settings})
        bookies[name].start_ready()  # a lone bookie, up at its READY=1
    loads = [float(x) for x in (args.rates or args.loads).split(",")]
    rounds: list[dict[str, Any]] = []
    load_start = os.getloadavg()[0]
    try:
        for n in range(args.rounds * len(bookies)):
            name = list(bookies)[n % len(bookies)]
            bookie = bookies[name]
            r: dict[str, Any] = {"round": n // len(bookies) + 1, "variant": name,
                                 "load": os.getloadavg()[0]}
            os.sync()
            r["max"] = _closed(bookie.port, 4, 200, args.seconds)
            peak = r["max"]["entries_per_s"]
            for load in loads:
                rate = load if args.rates else peak * load
                # Redis at the same absolute rate, alternating which goes first.
                redis_first = not args.no_redis and n % 2 == 1
                if redis_first:
                    r[f"redis_open{load}"] = _open_redis(base, rate, args.seconds)
                os.sync()
                r[f"open{load}"] = _open(bookie.port, rate, args.seconds, base / "rawsync")
                if not args.no_redis and not redis_first:
                    r[f"redis_open{load}"] = _open_redis(base, rate, args.seconds)
            if not args.no_scaling:
                cases = SCALING if n % 2 == 0 else list(reversed(SCALING))
                for conns, window in cases:
                    os.sync()
                    r[f"c{conns}x{window}"] = _closed(bookie.port, conns, window, args.seconds)
                if not args.no_redis:
                    os.sync()
                    r["redis64x1"] = _redis(base, args.seconds, 64, 1)
                    os.sync()
                    r["redis50x16"] = _redis(base, args.seconds, 50, 16)
            rounds.append(r)
            line = [f"round {r['round']} {name} (load {r['load']:.2f}): max {peak:,.0f}/s"]
            for load in loads:
                o = r[f"open{load}"]
                line.append(f"open {_label(load, args)} ({o['rate']:,.0f}/s) p50 {o['p50_ms']:.2f} "
                            f"p99 {o['p99_ms']:.1f} ms max {o['max_ms']:.1f} "
                            f"(fsync p99 {o['fsync_p99_ms']:.1f})")
                if not args.no_redis:
                    x = r[f"redis_open{load}"]
                    line.append(f"redis p50 {x['p50_ms']:.2f} p99 {x['p99_ms']:.1f} ms "
                                f"max {x['max_ms']:.1f}")
            if not args.no_scaling:
                line.append(", ".join(f"{c}x{w} {r[f'c{c}x{w}']['entries_per_s']:,.0f}/s"
                                      for c, w in SCALING))
                if not args.no_redis:
                    line.append(f"redis 64x1 {r['redis64x1']['entries_per_s']:,.0f}/s, "
                                f"50x16 {r['redis50x16']['entries_per_s']:,.0f}/s")
            print("; ".join(line), flush=True)
    finally:
        for b in bookies.values():
            b.terminate()
        shutil.rmtree(base, ignore_errors=True)
    load_end = os.getloadavg()[0]
    if args.json:
        print(json.dumps({"rounds": rounds, "load": [load_start, load_end]}))
        return
    for name in variants:
        if len(variants) > 1:
            print(f"\n## {name}: {variants[name] or 'defaults'}")
        _report([r for r in rounds if r["variant"] == name], loads, args, load_start, load_end)


def _variants(specs: list[str]) -> dict[str, dict[str, Any]]:
    """``NAME:key=value,key=value`` bookie settings per variant (none: the defaults)."""
    out: dict[str, dict[str, Any]] = {}
    for spec in specs or ["default:"]:
        name, _, rest = spec.partition(":")
        settings: dict[str, Any] = {}
        for item in filter(None, rest.split(",")):
            key, _, value = item.partition("=")
            settings[key] = json.loads(value) if value[:1] in "0123456789-[{tf" else value
        out[name] = settings
    return out


def _med(rounds: list[dict[str, Any]], key: str, field: str) -> float:
    return float(statistics.median(r[key][field] for r in rounds))


def _label(load: float, args: argparse.Namespace) -> str:
    return f"{load:,.0f}/s" if args.rates else f"{load:.0%} of max"


def _report_redis_open(rounds: list[dict[str, Any]], loads: list[float],
                       args: argparse.Namespace) -> None:
    """The bookie's open loop beside Redis's at the same absolute rates."""
    print("\n| open loop, 4 conns, same rates | rate /s | bookie p50 ms | bookie p99 ms | "
          "Redis p50 ms | Redis p99 ms | Redis errors | bookie p99 / Redis p99 (rounds) |")
    print("|---|---|---|---|---|---|---|---|")
    for load in loads:
        ours, theirs = f"open{load}", f"redis_open{load}"
        ratios = [r[ours]["p99_ms"] / max(r[theirs]["p99_ms"], 1e-9) for r in rounds]
        print(f"| {_label(load, args)} | {_med(rounds, ours, 'rate'):,.0f} | "
              f"{_med(rounds, ours, 'p50_ms'):.2f} | {_med(rounds, ours, 'p99_ms'):.2f} | "
              f"{_med(rounds, theirs, 'p50_ms'):.2f} | {_med(rounds, theirs, 'p99_ms'):.2f} | "
              f"{sum(r[theirs]['errors'] for r in rounds)} | {statistics.median(ratios):.2f}x "
              f"({', '.join(f'{x:.2f}' for x in ratios)}) |")


def _report(rounds: list[dict[str, Any]], loads: list[float], args: argparse.Namespace,
            load_start: float, load_end: float) -> None:
    print(f"\nload average (1 min): {load_start:.2f} at start, {load_end:.2f} at end")
    print("\n| open loop, 4 conns | rate /s | p50 ms | p99 ms | p99.9 ms | max ms | "
          "raw fdatasync p99 ms | p99 / fsync p99 (rounds) |")
    print("|---|---|---|---|---|---|---|---|")
    for load in loads:
        key = f"open{load}"
        ratios = [r[key]["p99_ms"] / max(r[key]["fsync_p99_ms"], 1e-9) for r in rounds]
        print(f"| {_label(load, args)} | {_med(rounds, key, 'rate'):,.0f} | "
              f"{_med(rounds, key, 'p50_ms'):.2f} | {_med(rounds, key, 'p99_ms'):.2f} | "
              f"{_med(rounds, key, 'p999_ms'):.2f} | {_med(rounds, key, 'max_ms'):.1f} | "
              f"{_med(rounds, key, 'fsync_p99_ms'):.2f} | {statistics.median(ratios):.2f}x "
              f"({', '.join(f'{x:.2f}' for x in ratios)}) |")
    if not args.no_redis:
        _report_redis_open(rounds, loads, args)
    if args.no_scaling:
        return
    print("\n| closed loop, 1 KiB, 1 entry/frame | entries/s (median) | rounds | p99 ms |")
    print("|---|---|---|---|")
    for conns, window in SCALING:
        key = f"c{conns}x{window}"
        vals = [r[key]["entries_per_s"] for r in rounds]
        print(f"| {conns} conns x {window} | {statistics.median(vals):,.0f} | "
              f"{', '.join(f'{v:,.0f}' for v in vals)} | {_med(rounds, key, 'p99_ms'):.2f} |")
    if args.no_redis:
        return
    for key, label in (("redis64x1", "Redis 64 x 1"), ("redis50x16", "Redis 50 x 16")):
        vals = [r[key]["entries_per_s"] for r in rounds]
        print(f"| {label} | {statistics.median(vals):,.0f} | "
              f"{', '.join(f'{v:,.0f}' for v in vals)} | {_med(rounds, key, 'p99_ms'):.2f} |")
    for ours, theirs in (("c64x1", "redis64x1"), ("c4x200", "redis50x16")):
        ratios = [r[ours]["entries_per_s"] / r[theirs]["entries_per_s"] for r in rounds]
        print(f"\n{ours} / {theirs} per round: {', '.join(f'{x:.2f}' for x in ratios)}; "
              f"median {statistics.median(ratios):.2f}")


if __name__ == "__main__":
    main()
