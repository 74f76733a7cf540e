"""A/B of two trees' bookies alive at once: short add cases alternate between them.

    python bench/ab_live.py --old DIR --new DIR [--rounds 8] [--seconds 2] \\
        [--cases max,c4x16,c4x64,open4000] [--json]

``bench/ab.py`` runs a whole bench script per tree in turn, so a drift of the machine's
load over its minutes lands on one tree. Here both trees' bookies (each started from its
own tree: its interpreter, ``cwd``, code) run side by side, and every case runs on one,
then at once on the other (the order flips every round), for ``--seconds`` each, with
the C add driver (``bench/adddriver.c``). Cases: ``max`` (4 connections x 200 in
flight), ``cCONNSxWINDOW`` closed loops (entries/s, higher is better), ``openRATE``
(an open loop at RATE adds/s over 4 connections: p50 ms, lower is better). Prints every
round, then per case both medians, new vs old (above 1: the new tree is better) and in
how many rounds the new tree was better.
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import cdriver

_START = (
    "import os, sys; sys.path.insert(0, {root!r}); "
    "from pathlib import Path; from ledgerd.tools.bookieprocess import BookieProcess; "
    "b = BookieProcess(Path({base!r}), '', settings={{'log_level': 'WARNING'}}); "
    "b.write_config(); print(b.port, flush=True); "
    "os.execv(sys.executable, [sys.executable, '-m', 'ledgerd.tools.cli', 'bookie', "
    "'--conf', str(b.config_path)])")


def _python(root: Path) -> str:
    venv = root / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def _start(root: Path, base: Path) -> tuple[subprocess.Popen[str], int]:
    """A lone bookie from ``root``'s code; its port once it accepts connections."""
    proc = subprocess.Popen([_python(root), "-c", _START.format(root=str(root), base=str(base))],
                            cwd=root, stdout=subprocess.PIPE, text=True,
                            stderr=(base.parent / f"{base.name}.log").open("w"))
    assert proc.stdout is not None
    port = int(proc.stdout.readline() or 0)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None or not port:
            raise RuntimeError(f"the bookie of {root} exited; see {base}.log")
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return proc, port
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"the bookie of {root} did not listen in 120 s")


def run_case(case: str, port: int, seconds: float) -> float:
    if case.startswith("open"):
        return float(cdriver.open_loop(port, float(case[4:]), 4, seconds)["p50_ms"])
    conns, window = (4, 200) if case == "max" else map(int, case[1:].split("x"))
    return float(cdriver.closed_loop(port, conns, window, seconds, warmup=0.3)["entries_per_s"])


def summary(results: dict[str, dict[str, list[float]]]) -> dict[str, dict[str, Any]]:
    out = {}
    for case, d in results.items():
        lower = case.startswith("open")
        old, new = statistics.median(d["old"]), statistics.median(d["new"])
        ratio = (old / new if new else 1.0) if lower else (new / old if old else 1.0)
        better = sum((n < o) if lower else (n > o) for o, n in zip(d["old"], d["new"], strict=True))
        out[case] = {"old": d["old"], "new": d["new"], "old_median": old, "new_median": new,
                     "ratio": ratio, "new_better_rounds": better}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", type=Path, required=True)
    parser.add_argument("--new", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--cases", default="max,c4x16,c4x64,open4000")
    parser.add_argument("--json", action="store_true")
    a = parser.parse_args()
    cases = a.cases.split(",")
    base = Path(tempfile.mkdtemp(prefix="ledgerd-ab-live-"))
    procs: dict[str, subprocess.Popen[str]] = {}
    ports: dict[str, int] = {}
    results: dict[str, dict[str, list[float]]] = {c: {"old": [], "new": []} for c in cases}
    try:
        for label, root in (("old", a.old.resolve()), ("new", a.new.resolve())):
            procs[label], ports[label] = _start(root, base / label)
        for r in range(a.rounds):
            order = ["old", "new"] if r % 2 == 0 else ["new", "old"]
            for case in cases:
                for label in order:
                    results[case][label].append(run_case(case, ports[label], a.seconds))
            print(f"round {r + 1}: " + ", ".join(
                f"{c} old {v['old'][-1]:,.3f} new {v['new'][-1]:,.3f}" for c, v in results.items()),
                file=sys.stderr if a.json else sys.stdout, flush=True)
    finally:
        for proc in procs.values():
            proc.terminate()
        for proc in procs.values():
            proc.wait(60)
        shutil.rmtree(base, ignore_errors=True)
    out = summary(results)
    if a.json:
        print(json.dumps({"rounds": a.rounds, "seconds": a.seconds, "cases": out}))
        return
    for case, c in out.items():
        print(f"{case:10s} old {c['old_median']:12,.3f} new {c['new_median']:12,.3f} "
              f"new vs old {c['ratio']:.3f}x, new better in {c['new_better_rounds']}/{a.rounds}")


if __name__ == "__main__":
    main()
