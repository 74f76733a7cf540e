"""Human and machine output for the CLI: aligned tables, JSON, progress on a terminal."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import click

__all__ = ["Progress", "emit", "progress", "table"]


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Left-aligned columns (numbers right-aligned), two spaces apart."""
    cells = [[str(h) for h in headers]] + [[_fmt(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    numeric = [all(isinstance(row[i], int | float) for row in rows) and bool(rows)
               for i in range(len(headers))]
    lines = []
    for r in cells:
        parts = [c.rjust(w) if num else c.ljust(w) for c, w, num in zip(r, widths, numeric,
                                                                        strict=True)]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:,.2f}"
    if isinstance(v, int) and not isinstance(v, bool):
        return str(v)
    return "" if v is None else str(v)


def emit(as_json: bool, data: Any, human: str) -> None:
    """``data`` as one JSON document, or the human text."""
    if as_json:
        click.echo(json.dumps(data, sort_keys=True, default=str))
    else:
        click.echo(human)


class Progress:
    """A one-line progress display on stderr when it is a terminal; silent otherwise."""

    def __init__(self, label: str, total: int | None) -> None:
        self.label = label
        self.total = total
        self.done = 0
        self.tty = sys.stderr.isatty()

    def advance(self, n: int = 1, note: str = "") -> None:
        self.done += n
        if self.tty:
            of = f"/{self.total}" if self.total else ""
            sys.stderr.write(f"\r{self.label}: {self.done}{of} {note}\x1b[K")
            sys.stderr.flush()

    def set(self, done: int, total: int | None = None) -> None:
        """Show ``done`` (of ``total``) as it is now."""
        if total is not None:
            self.total = total
        self.advance(done - self.done)

    def close(self) -> None:
        if self.tty:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()


@contextmanager
def progress(label: str, total: int | None = None) -> Iterator[Progress]:
    p = Progress(label, total)
    try:
        yield p
    finally:
        p.close()
