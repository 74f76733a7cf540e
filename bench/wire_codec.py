"""Frames/s for encode+decode of Add and Read: derived struct codecs vs plain construct.

Run: ``python bench/wire_codec.py [--seconds 1.0] [--json]``. Both codecs run side by side
in the same process, interleaved per message type, so the ratio is what matters (this
machine's speed drifts by up to 2x between runs).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable

from ledgerd.wire.codec import construct_decode
from ledgerd.wire.entry import Digester, DigestType, encode_entry
from ledgerd.wire.frames import (
    construct_decode_request,
    construct_encode_request,
    construct_encode_response,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
)
from ledgerd.wire.messages import AddRequest, ApiKey, ReadRequest, ReadResponse
from ledgerd.wire.status import Status


def _rate(fn: Callable[[], None], seconds: float) -> float:
    # Calibrate a batch size so the clock is read rarely.
    n = 1
    while True:
        start = time.perf_counter()
        for _ in range(n):
            fn()
        took = time.perf_counter() - start
        if took > 0.05:
            break
        n *= 2
    total = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(n):
            fn()
        total += n
    return total / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    d = Digester(DigestType.CRC32C)
    payload = os.urandom(1024)
    key = bytes(20)

    def add(n: int) -> AddRequest:
        return AddRequest(ledger_id=7, first_entry_id=100, master_key=key, term=0,
                          entries=tuple(encode_entry(d, 7, 100 + i, 99 + i, 1024 * (i + 1), payload)
                                        for i in range(n)))

    add1, add64 = add(1), add(64)
    read_req = ReadRequest(ledger_id=7, entry_id=100)
    read_resp = ReadResponse(ledger_id=7, entry_id=100, max_lac=99, entry=add1.entries[0])

    def fast_req(m: AddRequest | ReadRequest) -> Callable[[], None]:
        def run() -> None:
            decode_request(encode_request(m, 1)[4:])
        return run

    def slow_req(m: AddRequest | ReadRequest) -> Callable[[], None]:
        def run() -> None:
            construct_decode_request(construct_encode_request(m, 1)[4:])
        return run

    def fast_resp() -> None:
        decode_response(encode_response(1, Status.OK, read_resp)[4:], ApiKey.READ)

    def slow_resp() -> None:
        construct_decode(ReadResponse, construct_encode_response(1, Status.OK, read_resp)[10:])

    cases = [
        ("Add, 1 x 1 KiB entry", fast_req(add1), slow_req(add1)),
        ("Add, 64 x 1 KiB entries", fast_req(add64), slow_req(add64)),
        ("Read request", fast_req(read_req), slow_req(read_req)),
        ("Read response, 1 KiB entry", fast_resp, slow_resp),
    ]
    results = []
    for name, fast, slow in cases:
        f = _rate(fast, args.seconds)
        s = _rate(slow, args.seconds / 2)
        results.append({"case": name, "fast_frames_per_s": round(f), "construct_frames_per_s": round(s),
                        "ratio": round(f / s, 1)})
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"{'encode+decode':<30} {'fast frames/s':>14} {'construct/s':>12} {'ratio':>7}")
    for r in results:
        print(f"{r['case']:<30} {r['fast_frames_per_s']:>14,} {r['construct_frames_per_s']:>12,} "
              f"{r['ratio']:>6}x")


if __name__ == "__main__":
    main()
