"""Every fault kind, one round each, over real ZooKeeper and bookie processes behind the
fault proxy (tools/faults): the checker must find no violation, and every ledger a round
created must be readable whole at its end.

Seeded: the seed is printed and shown on failure; ``LEDGERD_FAULTS_SEED=<n>`` replays the
same faults in the same order with the same aims. ``bench/soak.py`` runs the same rounds
for as long as asked.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from ledgerd.tools.faults.cluster import FaultCluster
from ledgerd.tools.faults.nemesis import KINDS
from ledgerd.tools.faults.rounds import RoundResult, run_round


async def _rounds(base: Path, label: str, pick: Callable[[random.Random], list[str]],
                  **cluster: Any) -> None:
    """Run the rounds ``pick`` chooses on one fault cluster; assert none found a
    violation and every one did work (writes acknowledged and read back)."""
    seed = int(os.environ.get("LEDGERD_FAULTS_SEED") or random.randrange(1 << 31))
    print(f"{label}: LEDGERD_FAULTS_SEED={seed}")
    rng = random.Random(seed)
    results: list[RoundResult] = []
    async with trio.open_nursery() as nursery:
        fc = FaultCluster(base / "cluster", nursery, **cluster)
        try:
            await fc.start()
            for kind in pick(rng):
                result = await run_round(fc, kind, rng.randrange(1 << 31), warmup_s=1.0,
                                         hold_s=2.5, settle_s=1.0,
                                         dump=base / f"history-{kind}.jsonl")
                print(result.summary())
                results.append(result)
        finally:
            fc.stop()
            nursery.cancel_scope.cancel()
    failed = [r for r in results if not r.ok]
    assert not failed, (f"LEDGERD_FAULTS_SEED={seed} replays this run\n" + "\n\n".join(
        f"{r.summary()}\n{r.explain()}" for r in failed))
    for r in results:
        assert r.history.count("ok", "add") > 0 and r.history.count("ok", "read") > 0, \
            r.summary()


def _every_kind(rng: random.Random) -> list[str]:
    kinds = list(KINDS)
    rng.shuffle(kinds)
    return kinds


async def test_every_fault_kind_loses_nothing(tmp_path: Path) -> None:
    await _rounds(tmp_path, "fault rounds", _every_kind)


async def test_fault_rounds_over_tls(tmp_path: Path) -> None:
    """The same rounds against TLS-only bookies (START_TLS through the fault proxy,
    certificates from a trustme CA), three fault kinds a run, chosen by the seed."""
    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", common_name="fault-bookie",
                         organization_unit_name="0:bookie,recovery")
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    (tmp_path / "bookie.pem").write_bytes(b"".join(b.bytes() for b in cert.cert_chain_pems))
    cert.private_key_pem.write_to_path(str(tmp_path / "bookie.key"))
    tls = {"tls_certificate_path": str(tmp_path / "bookie.pem"),
           "tls_key_path": str(tmp_path / "bookie.key"),
           "tls_trust_path": str(tmp_path / "ca.pem"), "tls_required": True}
    await _rounds(tmp_path, "fault rounds over TLS", lambda rng: rng.sample(list(KINDS), 3),
                  bookie_settings=tls, client_settings={"tls_trust_path": str(tmp_path / "ca.pem")})
