"""TLS beside plaintext, in the same run, against the same bookies.

    python bench/tls.py [--seconds 5] [--rounds 3]

A real ZooKeeper and three bookie processes with TLS configured but not required, so
one bookie serves both kinds of connection with the same code (a TLS bookie serves
every connection with its own reader and writer; the plaintext epoll hub is off), and
certificates from a trustme CA. Cases, interleaved in every round:

- **bookie, batched**: one connection to one bookie, Add frames of 64 x 1 KiB entries,
  16 frames in flight (1,024 entries), for ``--seconds``: entries/s, plaintext vs TLS.
- **client, E3/Qw2/Qa2**: ``ledgerd bench writes`` style appends (1 KiB, 500 in flight,
  one ledger) through the client, plaintext vs TLS (``tls_trust_path``).

Every round is printed, then the medians, the ratios and the load.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import trio
import trustme

from ledgerd.base.tls import client_context
from ledgerd.bookie_client import open_bookie_client
from ledgerd.tools.benchcmd import run_writes
from ledgerd.tools.processcluster import process_cluster
from ledgerd.wire.entry import Digester, DigestType, encode_entry
from ledgerd.wire.messages import AddRequest

ENTRY = 1024
BATCH = 64
FRAMES = 16
KEY = b"b" * 20


def _pki(base: Path) -> dict[str, str]:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost", common_name="bench-bookie",
                         organization_unit_name="0:bookie,recovery")
    files = {"ca": base / "ca.pem", "cert": base / "bookie.pem", "key": base / "bookie.key"}
    ca.cert_pem.write_to_path(str(files["ca"]))
    files["cert"].write_bytes(b"".join(b.bytes() for b in cert.cert_chain_pems))
    cert.private_key_pem.write_to_path(str(files["key"]))
    return {k: str(v) for k, v in files.items()}


async def _batched(address: str, tls: Any, seconds: float, ledger: int) -> float:
    """Adds of BATCH entries per frame, FRAMES frames in flight (a semaphore refilled by
    the reply callbacks); entries acknowledged per second."""
    digest = Digester(DigestType.CRC32C)
    payload = os.urandom(ENTRY)
    slots = trio.Semaphore(FRAMES)
    done = failed = 0

    def acked(status: int, resp: Any, error: Any) -> None:
        nonlocal done, failed
        if error is None and status == 0:
            done += BATCH
        else:
            failed += 1
        slots.release()

    async with open_bookie_client(address, tls=tls, max_inflight=FRAMES * 2) as c:
        entry = 0
        t0 = time.perf_counter()
        deadline = trio.current_time() + seconds
        while trio.current_time() < deadline:
            await slots.acquire()
            entries = tuple(encode_entry(digest, ledger, e, e - 1, 0, payload)
                            for e in range(entry, entry + BATCH))
            c.send(AddRequest(ledger_id=ledger, first_entry_id=entry, master_key=KEY,
                              entries=entries), acked)
            entry += BATCH
        for _ in range(FRAMES):  # the last ones home
            await slots.acquire()
        took = time.perf_counter() - t0
    if failed:
        raise SystemExit(f"{failed} batched adds failed")
    return done / took


async def _client(zk: str, seconds: float, tls_trust: str | None) -> float:
    saved = os.environ.pop("LEDGERD_TLS_TRUST_PATH", None)
    if tls_trust:
        os.environ["LEDGERD_TLS_TRUST_PATH"] = tls_trust
    try:
        r = await run_writes(zk, 3, 2, 2, ENTRY, 1, 500, seconds, warmup=1.0)
    finally:
        os.environ.pop("LEDGERD_TLS_TRUST_PATH", None)
        if saved is not None:
            os.environ["LEDGERD_TLS_TRUST_PATH"] = saved
    return float(r["appends_per_s"])


async def _bench(args: argparse.Namespace, base: Path) -> dict[str, Any]:
    pki = _pki(base)
    settings = {"log_level": "WARNING", "zk_timeout_ms": 4000,
                "tls_certificate_path": pki["cert"], "tls_key_path": pki["key"],
                "tls_trust_path": pki["ca"]}
    async with process_cluster(base, bookies=3, settings=settings) as cluster:
        zk = cluster.zk
        tls = client_context(pki["ca"])
        address = cluster.bookies[0].bookie_id
        runs: dict[str, list[float]] = {"bookie_plain": [], "bookie_tls": [],
                                        "client_plain": [], "client_tls": []}
        ledger = 1000
        for rnd in range(args.rounds):
            order = ["plain", "tls"] if rnd % 2 == 0 else ["tls", "plain"]
            for kind in order:
                os.sync()
                ledger += 1
                runs[f"bookie_{kind}"].append(await _batched(
                    address, tls if kind == "tls" else None, args.seconds, ledger))
            for kind in order:
                os.sync()
                runs[f"client_{kind}"].append(await _client(
                    zk, args.seconds, pki["ca"] if kind == "tls" else None))
            print(f"round {rnd + 1} (load {os.getloadavg()[0]:.2f}): " + ", ".join(
                f"{k} {v[-1]:,.0f}/s" for k, v in runs.items()), flush=True)
        return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="ledgerd-tls-bench-", dir=os.environ.get("BENCH_DIR")))
    load_start = os.getloadavg()[0]
    try:
        runs = trio.run(_bench, args, base)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    load_end = os.getloadavg()[0]
    med = {k: statistics.median(v) for k, v in runs.items()}
    ratios = {"bookie": [t / p for t, p in zip(runs["bookie_tls"], runs["bookie_plain"],
                                               strict=True)],
              "client": [t / p for t, p in zip(runs["client_tls"], runs["client_plain"],
                                               strict=True)]}
    if args.json:
        print(json.dumps({"rounds": runs, "median": med, "ratios": ratios,
                          "load": [load_start, load_end]}))
        return
    print(f"\nload {load_start:.2f} at start, {load_end:.2f} at end\n")
    print("| case | plaintext, median (rounds) | TLS, median (rounds) | TLS / plaintext (rounds) |")
    print("|---|---|---|---|")
    for case, label in (("bookie", f"one bookie, {BATCH} x 1 KiB per frame, {FRAMES} frames "
                                    "in flight"),
                        ("client", "client appends, E3/Qw2/Qa2, 500 in flight")):
        plain, tls_ = runs[f"{case}_plain"], runs[f"{case}_tls"]
        print(f"| {label} | {med[f'{case}_plain']:,.0f} ({', '.join(f'{x:,.0f}' for x in plain)}) "
              f"| {med[f'{case}_tls']:,.0f} ({', '.join(f'{x:,.0f}' for x in tls_)}) | "
              f"{statistics.median(ratios[case]):.2f} "
              f"({', '.join(f'{x:.2f}' for x in ratios[case])}) |")


if __name__ == "__main__":
    main()
