"""Layout-version upgrade, rollback and finalize of a bookie's directories.

The layout version lives in every directory's cookie (``current/VERSION``). An upgrade
keeps the old state in ``previous/`` beside ``current/`` until the operator either
finalizes (``previous/`` is deleted) or rolls back (``previous/`` becomes ``current/``
again). ``previous/`` is a full copy, not hard links: journals, index files and entry-log
headers are rewritten in place, so a linked copy would not be the old state any more.
Run these with the bookie stopped.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from ledgerd.disk.cookie import Cookie, stamp_cookies
from ledgerd.disk.errors import CookieMismatchError

__all__ = ["finalize", "rollback", "upgrade"]


def upgrade(dirs: list[Path], new_cookie: Cookie) -> None:
    """Keep ``current/`` as ``previous/`` and stamp ``new_cookie`` (its layout version)."""
    for d in dirs:
        if (d / "previous").exists():
            raise CookieMismatchError(
                f"{d} already holds a previous layout; finalize or roll back first")
        if not (d / "current" / "VERSION").exists():
            raise CookieMismatchError(f"{d} has no cookie; nothing to upgrade")
    for d in dirs:
        shutil.copytree(d / "current", d / "previous", symlinks=True)
    stamp_cookies(new_cookie, dirs)


def rollback(dirs: list[Path]) -> None:
    """Restore ``previous/`` as ``current/`` in every directory."""
    for d in dirs:
        if not (d / "previous").exists():
            raise CookieMismatchError(f"{d} has no previous layout to roll back to")
    for d in dirs:
        aside = d / "current.rolled-back"
        if aside.exists():
            shutil.rmtree(aside)
        (d / "current").rename(aside)
        (d / "previous").rename(d / "current")
        shutil.rmtree(aside)


def finalize(dirs: list[Path]) -> None:
    """Drop ``previous/``: the upgrade can no longer be rolled back."""
    for d in dirs:
        if (d / "previous").exists():
            shutil.rmtree(d / "previous")
