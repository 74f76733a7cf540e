"""Which metadata snapshots to delete from a directory of them (pure: no I/O).

The snapshot timer writes one file an hour (``metadata-<UTC time>.snap``) and prunes
the directory after each. Age alone must not decide: a week in which every snapshot
failed its write (a full disk, a ZooKeeper that kept refusing) would leave only bad
files, and deleting the good ones by age would leave nothing to restore. The rules:

- Files are verified newest first (their checksum: ``SnapshotFile.is_valid``) until
  ``keep`` valid ones are found; older files need not be read (``is_valid`` None: a
  week of hourly snapshots of a large cluster is gigabytes to parse). A file's time
  is the ``taken_ms`` it records, or its mtime when not verified or not valid.
- The newest ``keep`` valid snapshots are never deleted, however old (``keep >= 1``:
  the only valid snapshot is never deleted).
- Any other file, valid or not, is deleted once older than ``max_age_ms``; a newer one
  is kept (an invalid one too, for inspection, until it ages out). A file not verified
  is deleted only when ``keep`` valid snapshots are kept: it might be a valid one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["PruneDecision", "SnapshotFile", "plan_prune"]


@dataclass(frozen=True, slots=True, kw_only=True)
class SnapshotFile:
    """One snapshot file as read: its name, its time and whether its checksum verified."""

    name: str
    taken_ms: int
    is_valid: bool | None  # None: not verified
    problem: str = ""  # why it is not valid

    def __post_init__(self) -> None:
        if self.problem and self.is_valid is not False:
            raise ValueError(f"{self.name}: only an invalid snapshot has a problem")


@dataclass(frozen=True, slots=True, kw_only=True)
class PruneDecision:
    """What to delete and what is kept on purpose (names, newest first)."""

    delete: tuple[str, ...]
    kept_newest: tuple[str, ...]  # the newest ``keep`` valid snapshots
    kept_recent: tuple[str, ...]  # younger than the age limit


def plan_prune(files: Sequence[SnapshotFile], *, keep: int, max_age_ms: int,
               now_ms: int) -> PruneDecision:
    """The files to delete (see the module doc). Raises ValueError for ``keep < 1`` or
    a negative ``max_age_ms``."""
    if keep < 1:
        raise ValueError(f"keep must be at least 1 (never delete the only valid snapshot), "
                         f"got {keep}")
    if max_age_ms < 0:
        raise ValueError(f"max_age_ms must be >= 0, got {max_age_ms}")
    newest_first = sorted(files, key=lambda f: (f.taken_ms, f.name), reverse=True)
    protected = [f.name for f in newest_first if f.is_valid][:keep]
    delete: list[str] = []
    recent: list[str] = []
    for f in newest_first:
        if f.name in protected:
            continue
        if f.is_valid is None and len(protected) < keep:
            recent.append(f.name)  # perhaps one of the valid snapshots to keep
        elif now_ms - f.taken_ms > max_age_ms:
            delete.append(f.name)
        else:
            recent.append(f.name)
    return PruneDecision(delete=tuple(delete), kept_newest=tuple(protected),
                         kept_recent=tuple(recent))
