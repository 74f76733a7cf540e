"""A writer of one bounded HMAC ledger, in a process of its own, to be killed -9 by a
test (issue 45, part 5: HMAC ledgers closed by autorecovery without the password).

    python -m tests.integration.hmac_writer_proc ZK COUNT E QW QA IN_FLIGHT

Creates an E/QW/QA ledger with HMAC digests (password ``pw``), prints ``ledger <id>``,
appends ``payload(i)`` for i in 0..COUNT-1 (one after another, except the last
IN_FLIGHT, submitted together so they carry the LAC before them), prints ``done`` once
every one is acknowledged and waits to be killed.
"""

from __future__ import annotations

import sys

import trio

import ledgerd


def payload(i: int) -> bytes:
    return (b"hmac-writer-entry-%08d;" % i) * (1 + i % 5)


async def main(zk: str, count: int, quorums: tuple[int, int, int], in_flight: int) -> None:
    async with ledgerd.open_client(zk, throttle=0) as client:
        lh = await client.create_ledger(*quorums, digest="hmac", password=b"pw")
        print(f"ledger {lh.ledger_id}", flush=True)
        for i in range(count - in_flight):
            await lh.append(payload(i))
        for p in [await lh.submit(payload(i)) for i in range(count - in_flight, count)]:
            await p
        print("done", flush=True)
        await trio.sleep_forever()


if __name__ == "__main__":
    e, qw, qa = (int(x) for x in sys.argv[3:6])
    trio.run(main, sys.argv[1], int(sys.argv[2]), (e, qw, qa), int(sys.argv[6]))
