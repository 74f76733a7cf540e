"""A writer of an unbounded ledger and a plain one, in a process of its own, to be
killed -9 by a test (issue 45's reproduction).

    python -m tests.integration.unbounded_writer_proc ZK COUNT

Creates an unbounded E=3 Qw=2 Qa=2 ledger and a plain control ledger of the same
quorums (password ``pw``), prints ``ledgers <unbounded id> <control id>``, appends
``payload(i)`` for i in 0..COUNT-1 to each, one after another, prints ``done`` and waits
to be killed. Entry ``i``'s payload is a function of ``i`` so readers can check it.
"""

from __future__ import annotations

import sys

import trio

import ledgerd


def payload(i: int) -> bytes:
    return (b"unbounded-writer-entry-%08d;" % i) * 8


async def main(zk: str, count: int) -> None:
    async with ledgerd.open_client(zk, throttle=0) as client:
        unbounded = await client.create_unbounded_ledger(3, 2, 2, password=b"pw")
        control = await client.create_ledger(3, 2, 2, password=b"pw")
        print(f"ledgers {unbounded.ledger_id} {control.ledger_id}", flush=True)
        for i in range(count):
            await unbounded.append(payload(i))
            await control.append(payload(i))
        print("done", flush=True)
        await trio.sleep_forever()


if __name__ == "__main__":
    trio.run(main, sys.argv[1], int(sys.argv[2]))
