"""bench/gateway.py's cases run end to end on a tiny scale (its own ZooKeeper, bookies
and gateway process): the produce pair, the transactional producer against the
idempotent one, and the end-to-end latency beside the native client's paced appends.
What is checked is that every case ran and counted what it sent; no figure is judged
(timings belong in bench/RESULTS.md, not in tests)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

GATEWAY = Path(__file__).resolve().parents[2] / "bench" / "gateway.py"


def test_every_gateway_case_runs_and_counts_what_it_sent(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(GATEWAY), "--rounds", "2", "--cases", "produce,txn,e2e",
         "--messages", "300", "--txn-messages", "250", "--txn-records", "100",
         "--e2e-seconds", "1", "--e2e-rate", "200", "--native-window", "50", "--json"],
        capture_output=True, text=True, timeout=600,
        env={**os.environ, "BENCH_DIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    rounds = result["rounds"]
    assert [r["round"] for r in rounds] == [1, 2]
    for r in rounds:
        assert min(r["kafka_msgs_s"], r["native_appends_s"], r["txn_msgs_per_s"],
                   r["idem_msgs_per_s"]) > 0
        assert r["txn_ratio"] > 0
        assert r["e2e"]["messages"] == 200 and r["e2e"]["rate"] == 200  # all consumed
        assert r["e2e"]["p50_ms"] <= r["e2e"]["p99_ms"] <= r["e2e"]["max_ms"]
        assert r["native_paced"]["rate"] == 200 and r["native_paced"]["appends_per_s"] > 0
    assert result["median"]["txn_ratio"] > 0 and "e2e_p99_ms" in result["median"]
    assert list(tmp_path.iterdir()) == []  # the bench's cluster directory is gone
