"""A writer in a process of its own, to be killed -9 by a test.

    python -m tests.integration.writer_proc ZK

Creates an E=3 Qw=2 Qa=2 ledger (password ``pw``), prints ``ledger <id>``, then appends
``payload(i)`` pipelined and prints ``acked <id>`` for every entry once durable, until
killed. Entry ``i``'s payload is a function of ``i`` so readers can check the bytes.
"""

from __future__ import annotations

import sys

import trio

import ledgerd


def payload(i: int) -> bytes:
    return (b"writer-entry-%08d;" % i) * 16


async def main(zk: str) -> None:
    async with ledgerd.open_client(zk) as client:
        lh = await client.create_ledger(3, 2, 2, password=b"pw")
        print(f"ledger {lh.ledger_id}", flush=True)
        pending: list[ledgerd.PendingAppend] = []
        i = 0
        while True:
            pending.append(await lh.submit(payload(i)))
            i += 1
            while pending and pending[0].done:
                print(f"acked {await pending.pop(0)}", flush=True)
            if len(pending) >= 64:  # waits here: the only checkpoint the loop needs
                print(f"acked {await pending.pop(0)}", flush=True)


if __name__ == "__main__":
    trio.run(main, sys.argv[1])
