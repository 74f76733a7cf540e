"""bench/ab.py on a fake bench script in two temporary trees: each tree runs its own
code, rounds alternate, and the medians, the ratios and the below-0.95 flag are right
in both directions (a throughput that drops, a latency that grows)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

AB = Path(__file__).resolve().parents[2] / "bench" / "ab.py"

# The fake script: its numbers come from ``fakemod`` (found only through the tree's
# PYTHONPATH), the n-th run of a tree takes the n-th value.
FAKE = '''
import argparse, json
from pathlib import Path
import fakemod
p = argparse.ArgumentParser()
p.add_argument("--rounds", type=int, default=3)
p.add_argument("--scale", type=float, default=1.0)
p.add_argument("--json", action="store_true")
a = p.parse_args()
assert a.rounds == 1 and a.json, a
count = Path(__file__).with_name("count")
n = int(count.read_text()) if count.exists() else 0
count.write_text(str(n + 1))
print(f"round 1 of tree {fakemod.NAME}")
print(json.dumps({"rounds": [{name: {key: v[n] * a.scale}
                              for name, (key, v) in fakemod.CASES.items()}],
                  "note": "ignored", "count_s": 5}))
'''

OLD = {"drop": ("entries_per_s", [100, 110, 90]),      # median 100
       "gain": ("entries_per_s", [100, 100, 100]),     # median 100
       "slower": ("p99_ms", [10, 12, 11]),             # median 11
       "faster": ("p99_ms", [10, 10, 10])}             # median 10
NEW = {"drop": ("entries_per_s", [80, 200, 85]),       # 85: 0.85x, below
       "gain": ("entries_per_s", [120, 125, 119]),     # 120: 1.2x
       "slower": ("p99_ms", [13, 12, 11.5]),           # 12: 11/12 = 0.917x, below
       "faster": ("p99_ms", [8, 9, 7])}                # 8: 10/8 = 1.25x


def _tree(root: Path, name: str, cases: dict[str, Any]) -> Path:
    (root / "bench").mkdir(parents=True)
    (root / "bench" / "fake.py").write_text(FAKE)
    (root / "fakemod.py").write_text(f"NAME = {name!r}\nCASES = {cases!r}\n")
    return root


def _ab(old: Path, new: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    done = subprocess.run([sys.executable, str(AB), "--old", str(old), "--new", str(new),
                           *args], capture_output=True, text=True, timeout=120)
    lines = done.stdout.strip().splitlines()
    return done.returncode, json.loads(lines[-1]) if lines else {}, done.stderr


def test_medians_ratios_and_flags(tmp_path: Path) -> None:
    old = _tree(tmp_path / "old", "old", OLD)
    new = _tree(tmp_path / "new", "new", NEW)
    code, out, err = _ab(old, new, "--rounds", "3", "--json", "bench/fake.py", "--scale", "2")
    assert code == 1, err
    # Alternating rounds, each tree's own code (its fakemod), the script's output passed on.
    assert [(r["round"], r["tree"]) for r in out["runs"]] == [
        (1, "old"), (1, "new"), (2, "old"), (2, "new"), (3, "old"), (3, "new")]
    assert err.count("[old] round 1 of tree old") == 3
    assert err.count("[new] round 1 of tree new") == 3
    cases = out["cases"]
    assert set(cases) == {f"rounds.{c}.{k}" for c, (k, _) in OLD.items()}
    drop = cases["rounds.drop.entries_per_s"]
    assert drop["better"] == "higher"
    assert drop["old"] == [200, 220, 180] and drop["new"] == [160, 400, 170]
    assert (drop["old_median"], drop["new_median"]) == (200, 170)
    assert abs(drop["ratio"] - 0.85) < 1e-9 and drop["below"]
    assert abs(drop["spread"]["old"] - 0.1) < 1e-9          # (220 - 180) / 2 / 200
    assert abs(drop["spread"]["new"] - 120 / 170) < 1e-9    # (400 - 160) / 2 / 170
    gain = cases["rounds.gain.entries_per_s"]
    assert abs(gain["ratio"] - 1.2) < 1e-9 and not gain["below"]
    slower = cases["rounds.slower.p99_ms"]
    assert slower["better"] == "lower"
    assert (slower["old_median"], slower["new_median"]) == (22, 24)
    assert abs(slower["ratio"] - 11 / 12) < 1e-9 and slower["below"]
    faster = cases["rounds.faster.p99_ms"]
    assert abs(faster["ratio"] - 1.25) < 1e-9 and not faster["below"]
    assert sorted(out["below"]) == ["rounds.drop.entries_per_s", "rounds.slower.p99_ms"]
    assert len(out["load"]) == 2


def test_a_tree_against_itself_and_abba(tmp_path: Path) -> None:
    same = {"t": ("entries_per_s", [100, 100, 100, 100]), "l": ("p50_ms", [2, 2, 2, 2])}
    old = _tree(tmp_path / "old", "old", same)
    new = _tree(tmp_path / "new", "new", same)
    code, out, err = _ab(old, new, "--rounds", "2", "--abba", "--json", "bench/fake.py")
    assert code == 0, err
    assert [r["tree"] for r in out["runs"]] == ["old", "new", "new", "old"]
    assert {c["ratio"] for c in out["cases"].values()} == {1.0}
    assert out["below"] == []


def test_table_and_missing_native_helper(tmp_path: Path) -> None:
    old = _tree(tmp_path / "old", "old", OLD)
    new = _tree(tmp_path / "new", "new", NEW)
    done = subprocess.run([sys.executable, str(AB), "--old", str(old), "--new", str(new),
                           "--rounds", "3", "--quiet", "bench/fake.py"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "| rounds.drop.entries_per_s | higher | 100, 110, 90 | 80, 200, 85 | 100 | 85 | " \
           "0.850x | BELOW 0.95 | ±10%, ±71% |" in done.stdout
    assert "| rounds.faster.p99_ms | lower | 10, 10, 10 | 8, 9, 7 | 10 | 8 | 1.250x | ok |" \
        in done.stdout
    assert "2 of 4 cases below 0.95" in done.stdout
    assert "load average" in done.stdout
    (new / "native").mkdir()  # a ledgerd tree without its built helper
    code, _, err = _ab(old, new, "--rounds", "1", "--json", "bench/fake.py")
    assert code != 0 and "_native" in err


def test_a_saved_json_result_renders_as_the_same_table(tmp_path: Path) -> None:
    def ab(where: str, *extra: str) -> subprocess.CompletedProcess[str]:
        # Fresh trees per run: the fake script steps through its values run by run.
        old = _tree(tmp_path / where / "old", "old", OLD)
        new = _tree(tmp_path / where / "new", "new", NEW)
        return subprocess.run([sys.executable, str(AB), "--old", str(old), "--new", str(new),
                               "--rounds", "3", "--quiet", *extra, "bench/fake.py"],
                              capture_output=True, text=True, timeout=120)

    table = ab("a").stdout
    (tmp_path / "result.json").write_text(ab("b", "--json").stdout)
    done = subprocess.run([sys.executable, str(AB), "--table", str(tmp_path / "result.json")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr  # a case below, as the run said
    rows = [line for line in table.splitlines() if line.startswith("| rounds.")]
    assert len(rows) == 4
    assert [line for line in done.stdout.splitlines() if line.startswith("| rounds.")] == rows


def test_the_four_scripts_cases() -> None:
    """Each bench script's --json shape gives its cases, Redis's left out."""
    from bench.ab import metrics_of

    latency = {"rounds": [{"round": 1, "variant": "default", "load": 1.0,
                           "max": {"entries_per_s": 9e4, "p99_ms": 9.0},
                           "open0.1": {"rate": 9e3, "p50_ms": 1.5, "p99_ms": 4.0},
                           "redis_open0.1": {"rate": 9e3, "p50_ms": 1.0, "p99_ms": 3.0},
                           "c64x1": {"entries_per_s": 3e4}, "redis64x1": {"entries_per_s": 1}}],
               "load": [1.0, 1.0]}
    assert metrics_of("bench/latency.py", latency) == {
        "max entries_per_s": (9e4, "higher"), "open0.1 p50_ms": (1.5, "lower"),
        "open0.1 p99_ms": (4.0, "lower"), "c64x1 entries_per_s": (3e4, "higher")}
    bookie = {"runs": {"redis": [{"entries_per_s": 1}], "b1": [{"entries_per_s": 5e4}],
                       "b64": [{"entries_per_s": 2e5}]}, "load": [1.0, 1.0]}
    assert metrics_of("bench/bookie.py", bookie) == {
        "b1 entries_per_s": (5e4, "higher"), "b64 entries_per_s": (2e5, "higher")}
    client = {"appends": {}, "rounds": {"e1": [{"appends_per_s": 3e4, "p99_ms": 5}],
                                        "raw": [{"entries_per_s": 4e4}],
                                        "read_e1": [{"entries_per_s": 2e4, "mb_per_s": 20}]},
              "tail": {"p50_ms": 2.0, "p99_ms": 7.0}}
    assert metrics_of("bench/client.py", client) == {
        "e1 appends_per_s": (3e4, "higher"), "raw entries_per_s": (4e4, "higher"),
        "read_e1 entries_per_s": (2e4, "higher"), "tail p50_ms": (2.0, "lower"),
        "tail p99_ms": (7.0, "lower")}
    scale = {"results": [
        {"round": 1, "case": "adds", "storage": "db", "ledgers": 10, "adds_s": 100,
         "p99_ms": 3, "reads_warm_s": 50, "reads_cold_s": 20, "restart_to_first_read_s": 0.2},
        {"case": "restart", "storage": "db", "ledgers": 10, "write_s": 1.0,
         "first_checkpoint_s": 0.1, "restart_s": 0.2, "checkpoint_all_touched_s": 0.3,
         "gc_ledgers_s": 500}], "load": [1.0, 1.0]}
    got = metrics_of("bench/ledgers_scale.py", scale)
    assert got["adds db 10 adds_s"] == (100, "higher")
    assert got["adds db 10 restart_to_first_read_s"] == (0.2, "lower")
    assert got["restart db 10 restart_s"] == (0.2, "lower")
    assert got["restart db 10 gc_ledgers_s"] == (500, "higher")
    assert len(got) == 9


def test_ab_live_runs_both_bookies_and_summarises(tmp_path: Path) -> None:
    """bench/ab_live.py with this tree on both sides, one short round of each kind."""
    root = AB.parents[1]
    done = subprocess.run([sys.executable, str(root / "bench" / "ab_live.py"), "--old",
                           str(root), "--new", str(root), "--rounds", "2", "--seconds", "0.3",
                           "--cases", "c1x1,open500", "--json"],
                          capture_output=True, text=True, timeout=300, cwd=root)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])["cases"]
    assert set(out) == {"c1x1", "open500"}
    for case in out.values():
        assert len(case["old"]) == len(case["new"]) == 2
        assert all(v > 0 for v in case["old"] + case["new"])
        assert case["ratio"] > 0 and 0 <= case["new_better_rounds"] <= 2
    assert "round 2:" in done.stderr


def test_ab_live_summary_orients_each_case() -> None:
    from bench.ab_live import summary

    out = summary({"max": {"old": [100, 100, 100], "new": [90, 120, 110]},
                   "open4000": {"old": [1.0, 1.0, 1.0], "new": [0.5, 0.5, 2.0]}})
    assert out["max"]["ratio"] == 1.1 and out["max"]["new_better_rounds"] == 2
    assert out["open4000"]["ratio"] == 2.0 and out["open4000"]["new_better_rounds"] == 2
