"""The C add driver (``bench/adddriver.c``): built on first use, run as a process.

redis-benchmark drives Redis from C and costs it little CPU; the Python drivers of
``bench/drivers.py`` cost most of a core at many connections of one add each, CPU the
bookie then does not have. The C driver does the same work (patched copies of one
template frame made by the real codec, replies parsed by header) for a like-for-like
comparison. ``closed_loop`` and ``open_loop`` return what their Python namesakes return;
``redis_closed_loop`` and ``redis_open_loop`` drive a Redis server the same way with
``XADD <stream> * f <1 KiB value>`` (in RESP), so both sides of a comparison have the
same schedule, connections and latency clock.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from bench.bookie import _Template

__all__ = ["build", "closed_loop", "open_loop", "redis_closed_loop", "redis_open_loop"]

_SOURCE = Path(__file__).with_name("adddriver.c")


def build() -> Path:
    """The driver binary, compiled once per source version into the temp directory."""
    source = _SOURCE.read_bytes()
    digest = hashlib.sha256(source).hexdigest()[:12]
    binary = Path(tempfile.gettempdir()) / f"ledgerd-adddriver-{digest}"
    if not binary.exists():
        cc = shutil.which("cc") or shutil.which("gcc")
        if cc is None:
            raise RuntimeError("no C compiler (cc/gcc) to build bench/adddriver.c: "
                               "`make bench-deps` installs gcc")
        tmp = binary.with_name(f"{binary.name}.{os.getpid()}.building")
        subprocess.run([cc, "-O2", "-Wall", "-o", str(tmp), str(_SOURCE)], check=True)
        tmp.replace(binary)
    return binary


def _template() -> tuple[str, str]:
    t = _Template(1, 1024)
    return bytes(t.frame).hex(), str(t.entry_offsets[0])


def _run(*args: str, timeout: float) -> dict[str, Any]:
    done = subprocess.run([str(build()), *args], capture_output=True, text=True,
                          timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"adddriver failed ({done.returncode}): {done.stderr.strip()}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def closed_loop(port: int, conns: int, window: int, seconds: float, *, warmup: float = 1.0,
                ledger_base: int = 1000) -> dict[str, Any]:
    """``conns`` connections each keeping ``window`` one-entry adds in flight."""
    hexed, offset = _template()
    result = _run("closed", str(port), str(conns), str(window), str(seconds), str(warmup),
                  str(ledger_base), hexed, offset, timeout=seconds + warmup + 60)
    result["entries_written"] = 0  # as drivers.closed_loop without shared ledgers
    return result


def open_loop(port: int, rate: float, conns: int, seconds: float, *,
              ledger_base: int = 2000) -> dict[str, Any]:
    """One-entry adds due every ``1 / rate`` s; latency from the due time."""
    hexed, offset = _template()
    result = _run("open", str(port), str(conns), str(rate), str(seconds), str(ledger_base),
                  hexed, offset, timeout=seconds + 60)
    del result["entries_per_s"]
    return {"rate": rate, **result}


def redis_closed_loop(port: int, conns: int, window: int, seconds: float, *,
                      warmup: float = 1.0, stream: str = "bench") -> dict[str, Any]:
    """``conns`` connections to Redis each keeping ``window`` XADDs in flight."""
    return _run("redis-closed", str(port), str(conns), str(window), str(seconds), str(warmup),
                stream, timeout=seconds + warmup + 60)


def redis_open_loop(port: int, rate: float, conns: int, seconds: float, *,
                    stream: str = "bench") -> dict[str, Any]:
    """XADDs to Redis due every ``1 / rate`` s; latency from the due time."""
    result = _run("redis-open", str(port), str(conns), str(rate), str(seconds), stream,
                  timeout=seconds + 60)
    del result["entries_per_s"]
    return {"rate": rate, **result}
