"""The fault harness's history and its checker: the one checker, ``ledgerd.testing.history``."""

from __future__ import annotations

from ledgerd.testing.history import Event, History, LedgerFacts, Violation, check, report

__all__ = ["Event", "History", "LedgerFacts", "Violation", "check", "report"]
