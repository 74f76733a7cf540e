"""A/B: one bench script from two trees, in alternating rounds of one run.

    python bench/ab.py --old DIR --new DIR [--rounds 3] [--abba] [--json] SCRIPT [ARGS...]
    python bench/ab.py --table RESULT.json     # the table of a saved --json result

    # e.g. a branch against main; latency.py's open loop at the same absolute rates
    # for both trees (--rates; its default --loads are fractions of each run's own max):
    python bench/ab.py --old /work/main --new . --rounds 5 bench/latency.py --seconds 3 \
        --rates 8000,40000
    python bench/ab.py --old /work/main --new . bench/bookie.py --seconds 5
    python bench/ab.py --old /work/main --new . bench/client.py --seconds 5 --read-entries 20000
    python bench/ab.py --old /work/main --new . bench/ledgers_scale.py --counts 1,10000 \\
        --restart-ledgers 20000

SCRIPT is a path inside each tree (``bench/latency.py``); ARGS go to it unchanged (the
options of ab.py come before SCRIPT). Every round runs the script once from the old
tree, then once from the new one (``--abba``: the order flips every round, old new, new
old, ..., which cancels a steady drift), each run in one-round mode with ``--json``
(``--rounds 1 --json`` appended: the last ``--rounds`` wins). Each run's own round
lines are passed through, prefixed with the tree.

**Each tree runs its own code**: the script runs with the tree's interpreter
(``DIR/.venv/bin/python``, its editable install of that tree; without one, this
interpreter), ``PYTHONPATH=DIR`` and ``cwd=DIR`` (the bench scripts also put their tree
first on ``sys.path``, and bookie processes start as ``python -m ledgerd...`` from the
cwd). Before the first round ab.py checks, in each tree's environment, that
``import ledgerd`` resolves inside that tree and that ``native/_native*.so`` exists there
(``make setup`` builds it; a tree whose ``native/`` sources match another's can copy it
from there). A tree without a venv (``git archive`` of a commit, say) runs on this
interpreter, its code found through ``PYTHONPATH`` first.

**Cases and their metric** (one number per case and run), from each script's ``--json``:

- ``bench/latency.py``: ``max`` (4 x 200 closed loop) and every ``c{conns}x{window}``
  scaling case, entries/s, higher is better; every open-loop load, its p50 and p99 ms,
  lower is better. Redis's cases are left out (the same binary in both trees).
- ``bench/bookie.py``: ``b1`` and ``b64`` entries/s, higher is better (Redis left out).
- ``bench/client.py``: appends/s of ``e1``, ``e3``, ``e1_batch``, ``e3_batch``, the raw
  bookie's entries/s, reads' entries/s of ``read_e1`` and ``read_e3``, higher is better;
  the tail read's p50 and p99 ms, lower is better.
- ``bench/ledgers_scale.py``: per storage and ledger count, adds/s and warm and cold
  reads/s, higher is better, restart-to-first-read seconds, lower is better; the
  restart part's write, checkpoint and restart seconds, lower is better, and deleted
  ledgers/s, higher is better.
- any other script: every number in its JSON whose key ends in ``_per_s`` (higher is
  better) or ``_ms`` (lower is better), named by its path (one-element lists skipped).

Closed-loop latencies are not cases: at a fixed window they are the throughput's
inverse, counted once.

**The verdict**: per case the median of each tree's rounds, and the ratio new vs old
oriented so that above 1 means the new tree is better: new/old for a throughput, old/new
for a latency. A case is flagged when that ratio is below 0.95, i.e. a throughput when
new < 0.95 x old, a latency when new > old / 0.95. Beside it each tree's spread, half
the range of its rounds over their median: a verdict at 0.95 needs spreads well under
5% (a quiet machine, enough rounds, long enough runs). Every round, the medians, the
ratios, the flags and the 1-minute load average (at the start and end of every run)
are printed; ``--json`` prints all of it as one JSON line instead of the table, with each
run's own JSON under ``raw``. The
exit status is 1 when a case is flagged (2 on a failed run). Running a tree against
itself shows the noise: its ratios should sit around 1.

ab.py uses the standard library only, so it runs against any two trees.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

Better = Literal["higher", "lower"]
Metrics = dict[str, tuple[float, Better]]
THRESHOLD = 0.95


# -- each script's cases -------------------------------------------------------------------

def _latency(data: dict[str, Any]) -> Metrics:
    out: Metrics = {}
    for r in data["rounds"]:
        prefix = "" if r.get("variant", "default") == "default" else f"{r['variant']} "
        for key, value in r.items():
            if not isinstance(value, dict) or key.startswith("redis"):
                continue
            if key.startswith("open"):
                out[f"{prefix}{key} p50_ms"] = (float(value["p50_ms"]), "lower")
                out[f"{prefix}{key} p99_ms"] = (float(value["p99_ms"]), "lower")
            else:
                out[f"{prefix}{key} entries_per_s"] = (float(value["entries_per_s"]), "higher")
    return out


def _bookie(data: dict[str, Any]) -> Metrics:
    return {f"{key} entries_per_s": (float(runs[-1]["entries_per_s"]), "higher")
            for key, runs in data["runs"].items()
            if key != "redis" and not key.endswith("-before")}


def _client(data: dict[str, Any]) -> Metrics:
    out: Metrics = {}
    for key, runs in data["rounds"].items():
        r = runs[-1]
        metric = "appends_per_s" if "appends_per_s" in r else "entries_per_s"
        out[f"{key} {metric}"] = (float(r[metric]), "higher")
    out["tail p50_ms"] = (float(data["tail"]["p50_ms"]), "lower")
    out["tail p99_ms"] = (float(data["tail"]["p99_ms"]), "lower")
    return out


_SCALE: dict[str, dict[str, Better]] = {
    "adds": {"adds_s": "higher", "reads_warm_s": "higher", "reads_cold_s": "higher",
             "restart_to_first_read_s": "lower"},
    "restart": {"write_s": "lower", "first_checkpoint_s": "lower", "restart_s": "lower",
                "checkpoint_all_touched_s": "lower", "gc_ledgers_s": "higher"},
}


def _ledgers_scale(data: dict[str, Any]) -> Metrics:
    out: Metrics = {}
    for r in data["results"]:
        name = f"{r['case']} {r['storage']} {r['ledgers']}"
        if r.get("round", 1) != 1:
            name += f" round {r['round']}"
        for metric, better in _SCALE[r["case"]].items():
            out[f"{name} {metric}"] = (float(r[metric]), better)
    return out


def generic(data: Any, path: str = "") -> Metrics:
    """Every number under a key ending in ``_per_s`` (higher is better) or ``_ms`` (lower
    is better), named by its path; one-element lists add nothing to the path."""
    out: Metrics = {}
    if isinstance(data, list):
        for i, item in enumerate(data):
            out.update(generic(item, path if len(data) == 1 else f"{path}{i}."))
    elif isinstance(data, dict):
        for key, value in data.items():
            name = f"{path}{key}"
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                if key.endswith("_per_s"):
                    out[name] = (float(value), "higher")
                elif key.endswith("_ms"):
                    out[name] = (float(value), "lower")
            else:
                out.update(generic(value, f"{name}."))
    return out


EXTRACT: dict[str, Callable[[Any], Metrics]] = {"latency.py": _latency, "bookie.py": _bookie, "client.py": _client,
                                                 "ledgers_scale.py": _ledgers_scale}
# Appended to every run: one round (the four scripts' --rounds; any other script must
# take it too), and its results as JSON on the last line of its output.
ONE_ROUND = ["--rounds", "1", "--json"]


def metrics_of(script: str, data: Any) -> Metrics:
    return EXTRACT.get(Path(script).name, generic)(data)


# -- running a tree ------------------------------------------------------------------------

@dataclass
class Tree:
    label: str
    root: Path
    python: str = field(init=False)

    def __post_init__(self) -> None:
        venv = self.root / ".venv" / "bin" / "python"
        self.python = str(venv) if venv.exists() else sys.executable

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env["PYTHONPATH"] = str(self.root)
        if self.python == str(self.root / ".venv" / "bin" / "python"):
            env["VIRTUAL_ENV"] = str(self.root / ".venv")
        return env

    def check(self, script: str) -> None:
        """The script exists here, and a ledgerd tree imports its own code and has its
        native helper."""
        if Path(script).is_absolute():
            raise SystemExit(f"SCRIPT must be a path inside each tree, not {script}")
        if not (self.root / script).is_file():
            raise SystemExit(f"{self.label}: no {script} in {self.root}")
        if (self.root / "native").is_dir() and not any(
                (self.root / "native").glob("_native*.so")):
            raise SystemExit(f"{self.label}: {self.root}/native/_native*.so is missing "
                             "(`make setup` there, or copy it from another checkout)")
        if (self.root / "ledgerd").is_dir():
            done = subprocess.run(
                [self.python, "-c", "import ledgerd; print(ledgerd.__file__)"],
                capture_output=True, text=True, cwd=self.root, env=self.env())
            where = Path(done.stdout.strip() or "/nonexistent").resolve()
            if done.returncode != 0 or not where.is_relative_to(self.root):
                raise SystemExit(f"{self.label}: `import ledgerd` with {self.python} does "
                                 f"not resolve inside {self.root}: {where} "
                                 f"{done.stderr.strip()[-300:]}")

    def run(self, script: str, args: list[str], echo: bool) -> Any:
        """One run of ``script`` in one-round mode; its JSON (the last stdout line)."""
        cmd = [self.python, str(self.root / script), *args, *ONE_ROUND]
        proc = subprocess.Popen(cmd, cwd=self.root, env=self.env(), stdout=subprocess.PIPE,
                                text=True)
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if echo and len(lines) > 1:
                print(f"  [{self.label}] {lines[-2]}", file=sys.stderr, flush=True)
        if proc.wait() != 0 or not lines:
            print(f"ab: {' '.join(cmd)} failed with status {proc.returncode}",
                  file=sys.stderr)
            sys.exit(2)
        return json.loads(lines[-1])


# -- the comparison ------------------------------------------------------------------------

def ratio(old: float, new: float, better: Better) -> float:
    """Above 1: the new tree is better (new/old for a throughput, old/new for a latency)."""
    if better == "higher":
        return new / old if old else float("inf") if new else 1.0
    return old / new if new else float("inf") if old else 1.0


def compare(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per case: each tree's values by round, their medians, the ratio, the flag."""
    cases: dict[str, dict[str, Any]] = {}
    for run in runs:
        for name, (value, better) in run["metrics"].items():
            case = cases.setdefault(name, {"better": better, "old": [], "new": []})
            case[run["tree"]].append(value)
    for case in cases.values():
        if not case["old"] or not case["new"]:
            case.update(old_median=None, new_median=None, ratio=None, below=False)
            continue
        old, new = statistics.median(case["old"]), statistics.median(case["new"])
        r = ratio(old, new, case["better"])
        case.update(old_median=old, new_median=new, ratio=r, below=r < THRESHOLD,
                    spread={t: spread(case[t]) for t in ("old", "new")})
    return cases


def spread(values: list[float]) -> float:
    """Half the range of a tree's rounds over their median: the noise a ratio sits in
    (a 0.95 verdict means little when this is not well under 0.05)."""
    med = statistics.median(values)
    return (max(values) - min(values)) / 2 / abs(med) if med else 0.0


def _fmt(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["--table"]:
        if len(argv) != 2:
            raise SystemExit("usage: ab.py --table FILE (a saved --json result)")
        lines = Path(argv[1]).read_text().strip().splitlines()
        if not lines:
            raise SystemExit(f"ab.py --table: {argv[1]} is empty (no saved --json result)")
        return print_table(json.loads(lines[-1]))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     usage="%(prog)s --old DIR --new DIR [--rounds N] "
                                           "[--abba] [--json] SCRIPT [ARGS...]")
    parser.add_argument("--old", type=Path, required=True, help="the baseline tree")
    parser.add_argument("--new", type=Path, required=True, help="the tree under test")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--abba", action="store_true",
                        help="flip the order every round (old new, new old, ...)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--quiet", action="store_true", help="no pass-through of the runs")
    parser.add_argument("script", help="the bench script, a path inside each tree")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")
    a = parser.parse_args(argv)
    trees = {"old": Tree("old", a.old.resolve()), "new": Tree("new", a.new.resolve())}
    for tree in trees.values():
        tree.check(a.script)
    load_start = os.getloadavg()[0]
    runs: list[dict[str, Any]] = []
    for rnd in range(1, a.rounds + 1):
        order = ["old", "new"] if not a.abba or rnd % 2 else ["new", "old"]
        for label in order:
            before = os.getloadavg()[0]
            data = trees[label].run(a.script, a.args, echo=not a.quiet)
            run: dict[str, Any] = {"round": rnd, "tree": label, "load": [before, os.getloadavg()[0]],
                                   "metrics": metrics_of(a.script, data), "raw": data}
            runs.append(run)
            print(f"round {rnd} {label} (load {before:.2f}-{run['load'][1]:.2f}): "
                  + ", ".join(f"{k} {_fmt(v)}" for k, (v, _) in run["metrics"].items()),
                  file=sys.stderr if a.json else sys.stdout, flush=True)
    load_end = os.getloadavg()[0]
    cases = compare(runs)
    below = [name for name, c in cases.items() if c["below"]]
    if a.json:
        print(json.dumps({"script": a.script, "args": a.args, "old": str(trees["old"].root),
                          "new": str(trees["new"].root), "rounds": a.rounds,
                          "runs": [{**r, "metrics": {k: v for k, (v, _) in
                                                     r["metrics"].items()}} for r in runs],
                          "cases": cases, "below": below, "threshold": THRESHOLD,
                          "load": [load_start, load_end]}))
        return 1 if below else 0
    return print_table({"script": a.script, "args": a.args, "old": str(trees["old"].root),
                        "new": str(trees["new"].root), "rounds": a.rounds, "abba": a.abba,
                        "cases": cases, "below": below, "load": [load_start, load_end]})


def print_table(result: dict[str, Any]) -> int:
    """The table of one A/B (``--json``'s object, or a file of it with ``--table``); 1
    when a case is below the threshold."""
    cases, below = result["cases"], result["below"]
    print(f"\n{result['script']} {' '.join(result['args'])}: old {result['old']}, new "
          f"{result['new']}, {result['rounds']} rounds{' (abba)' if result.get('abba') else ''}")
    load_start, load_end = result["load"]
    print(f"load average (1 min): {load_start:.2f} at start, {load_end:.2f} at end\n")
    print("| case | better | old (rounds) | new (rounds) | old median | new median | "
          "new vs old |  | spread old, new |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, c in cases.items():
        if c["ratio"] is None:
            print(f"| {name} | {c['better']} | only in one tree |  |  |  |  |  |  |")
            continue
        print(f"| {name} | {c['better']} | {', '.join(_fmt(v) for v in c['old'])} | "
              f"{', '.join(_fmt(v) for v in c['new'])} | {_fmt(c['old_median'])} | "
              f"{_fmt(c['new_median'])} | {c['ratio']:.3f}x | "
              f"{'BELOW 0.95' if c['below'] else 'ok'} | ±{c['spread']['old']:.0%}, "
              f"±{c['spread']['new']:.0%} |")
    print(f"\nnew vs old: new/old for a throughput, old/new for a latency (above 1: new "
          f"is better); {len(below)} of {len(cases)} cases below {THRESHOLD}"
          + (": " + ", ".join(below) if below else ""))
    return 1 if below else 0

if __name__ == "__main__":
    sys.exit(main())
