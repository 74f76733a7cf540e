"""The simulated world: a seeded event queue, a faulty network, and the fault schedule.

Time is a float in seconds that only the event queue advances. Every random choice comes
from one ``random.Random(seed)``, so a seed replays exactly. Messages between actors are
events: while faults are on, each may be lost, duplicated, or delayed (which reorders
them, with occasional long stalls that look like a dead peer). Metadata operations are
never lost, only delayed (ZooKeeper is the reliable part).
"""

from __future__ import annotations

import heapq
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, fields
from fnmatch import fnmatchcase
from typing import Any

__all__ = ["MUTATIONS", "TERM_MUTATIONS", "Mutations", "Violation", "World"]


@dataclass(frozen=True)
class Mutations:
    """Known protocol bugs, re-introduced on purpose; the checker must catch each."""

    unfenced_recovery_reads: bool = False      # recovery reads without the FENCE flag
    recovery_from_minus_one: bool = False      # start at the highest LAC seen (#2615)
    early_recovery_ensemble_commit: bool = False  # recovery CASes its ensemble change at once
    fenced_accepts_adds: bool = False          # the bookie core lets plain adds pass a fence
    out_of_order_completion: bool = False      # completions before earlier entries complete
    # Unbounded ledgers with terms (tests/sim/terms.py):
    recovery_writes_at_ack_quorum: bool = False  # a term's rewrites complete at Qa, not Qw
    no_truncate: bool = False                  # the no-op ending a term's recovery truncates nothing
    stale_term_accepted: bool = False          # the bookie core takes a lower term's requests
    stale_follower_reads: bool = False         # a follower reads up to a new LAC with old metadata

    def active(self) -> list[str]:
        return [f.name for f in fields(self) if getattr(self, f.name)]


MUTATIONS = [f.name for f in fields(Mutations)]
# Mutations only the term model exercises (the others run the bounded-ledger model).
TERM_MUTATIONS = ["recovery_writes_at_ack_quorum", "no_truncate", "stale_term_accepted",
                  "stale_follower_reads"]


class Violation(AssertionError):
    """An invariant broke."""


@dataclass(frozen=True)
class NetworkFaults:
    loss: float
    duplicate: float
    delay_mean: float
    stall_chance: float  # a message held for 0.5 .. 3 s


class World:
    def __init__(self, seed: int, mutations: Mutations | None = None) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.mutations = mutations or Mutations()
        self.now = 0.0
        self._queue: list[tuple[float, int, Callable[[], None], str]] = []
        self._seq = 0
        self._trace: deque[tuple[float, str]] = deque(maxlen=80)
        self.events = 0
        r = self.rng
        self.faults = NetworkFaults(loss=r.choice([0.0, 0.01, 0.03, 0.06]),
                                    duplicate=r.choice([0.0, 0.02, 0.05]),
                                    delay_mean=r.choice([0.002, 0.01, 0.03]),
                                    stall_chance=r.choice([0.0, 0.005, 0.02]))
        self.faulty = True
        self.checks: list[Callable[[], None]] = []
        # Set by a bookie that stored or dropped entries; an incremental checker clears
        # it once it has looked (most events change no bookie: it skips those at once).
        self.stored = False
        # Targeted scenarios: a message whose label starts with one of these prefixes (or
        # matches it, when it has a ``*``) is held that many seconds more (inf: lost),
        # faults on or off (a fault schedule written out instead of drawn from the seed).
        self.holds: dict[str, float] = {}

    # -- events ------------------------------------------------------------------------

    def at(self, delay: float, fn: Callable[[], None], label: str) -> None:
        self._seq += 1
        heapq.heappush(self._queue, (self.now + max(0.0, delay), self._seq, fn, label))

    def at_time(self, when: float, fn: Callable[[], None], label: str) -> None:
        """Run ``fn`` at the absolute time ``when`` (now, if that has passed)."""
        self._seq += 1
        heapq.heappush(self._queue, (max(self.now, when), self._seq, fn, label))

    def log(self, text: str) -> None:
        self._trace.append((self.now, text))

    @property
    def trace(self) -> list[str]:
        """The last events, formatted (formatting only when asked: most runs pass)."""
        return [f"{t:9.4f} {text}" for t, text in self._trace]

    def run(self, until: float) -> None:
        while self._queue and self._queue[0][0] <= until:
            t, _seq, fn, label = heapq.heappop(self._queue)
            self.now = t
            self.events += 1
            self._trace.append((t, label))
            fn()
            for check in self.checks:
                check()
        self.now = max(self.now, until)

    # -- the network -------------------------------------------------------------------

    def send(self, fn: Callable[[], None], label: str) -> None:
        """Deliver ``fn()`` after a network delay (maybe never, maybe twice)."""
        f = self.faults
        r = self.rng
        hold = 0.0
        if self.holds:
            hold = next((t for p, t in self.holds.items()
                         if label.startswith(p) or ("*" in p and fnmatchcase(label, p))), 0.0)
            if hold == float("inf"):
                self.log(f"DROPPED {label}")
                return
        if hold:
            self.at(hold, fn, label)
            return
        if not self.faulty:
            self.at(0.0005 + r.random() * 0.002, fn, label)
            return
        if r.random() < f.loss:
            self.log(f"LOST {label}")
            return
        copies = 2 if r.random() < f.duplicate else 1
        for _ in range(copies):
            delay = 0.0005 + r.expovariate(1 / f.delay_mean)
            if r.random() < f.stall_chance:
                delay += r.uniform(0.5, 3.0)
            self.at(delay, fn, label)

    def metadata_delay(self) -> float:
        return 0.001 + self.rng.random() * (0.01 if self.faulty else 0.002)

    def fail(self, what: str) -> None:
        raise Violation(what)

    def describe(self) -> dict[str, Any]:
        return {"seed": self.seed, "faults": self.faults, "mutations": self.mutations.active()}
