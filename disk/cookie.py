"""Cookies: ``current/VERSION`` in every journal, ledger and index directory.

A cookie records the layout version, the bookie id, the directory set and the cluster's
instance id. At start-up every directory's cookie must equal the one built from the
configuration, and (when the cluster has one) the cookie stored in ZooKeeper. What can
go wrong, and what the error says to do:

- a directory was added or removed: the sets differ ("update the cookie with
  `ledgerd shell cookie update` if intended, or restore the directory");
- a directory was wiped (no cookie, while the others or ZooKeeper have one): refuse;
- a cookie from another cluster (foreign instance id) or another bookie: refuse;
- a non-empty directory with no cookie: refuse (someone else's data).

A brand-new bookie (all directories empty, no cookie in ZooKeeper) gets cookies stamped.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from ledgerd.disk.errors import CookieMismatchError
from ledgerd.disk.layouts import crc32c

__all__ = ["LAYOUT_VERSION", "Cookie", "CookieCheck", "check_cookies", "layout_problem",
           "stamp_cookies"]

LAYOUT_VERSION = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class Cookie:
    layout_version: int = LAYOUT_VERSION
    bookie_id: str
    journal_dir: str
    ledger_dirs: tuple[str, ...]
    index_dirs: tuple[str, ...]
    instance_id: str

    def to_bytes(self) -> bytes:
        doc = asdict(self)
        doc["ledger_dirs"] = list(self.ledger_dirs)
        doc["index_dirs"] = list(self.index_dirs)
        body = json.dumps(doc, sort_keys=True)
        return json.dumps({"cookie": doc, "crc32c": crc32c(body.encode())},
                          sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> Cookie:
        try:
            outer = json.loads(data)
            doc = outer["cookie"]
            body = json.dumps(doc, sort_keys=True)
            if crc32c(body.encode()) != outer["crc32c"]:
                raise ValueError("checksum mismatch")
            return cls(layout_version=int(doc["layout_version"]), bookie_id=doc["bookie_id"],
                       journal_dir=doc["journal_dir"], ledger_dirs=tuple(doc["ledger_dirs"]),
                       index_dirs=tuple(doc["index_dirs"]), instance_id=doc["instance_id"])
        except (ValueError, KeyError, TypeError) as exc:
            raise CookieMismatchError(f"cookie at {where} is unreadable ({exc}); "
                                      "if the directory is new, remove the file") from exc

    def differences(self, other: Cookie) -> list[str]:
        out = []
        for name in ("layout_version", "bookie_id", "journal_dir", "ledger_dirs", "index_dirs",
                     "instance_id"):
            a, b = getattr(self, name), getattr(other, name)
            if a != b:
                out.append(f"{name}: expected {a!r}, found {b!r}")
        return out


@dataclass(frozen=True, slots=True)
class CookieCheck:
    """What start-up must do: stamp these directories, then create the ZooKeeper cookie
    (a new bookie) or replace it (directories added under ``allow_storage_expansion``)."""

    stamp: tuple[Path, ...]
    create_remote: bool
    update_remote: bool = False
    added: tuple[Path, ...] = ()  # directories this start adds to the bookie


def _is_empty(current: Path) -> bool:
    if not current.exists():
        return True
    return not any(p.name not in ("VERSION",) for p in current.iterdir())


def _added_dirs(old: Cookie, new: Cookie) -> set[str] | None:
    """The directories ``new`` adds to ``old``, or None when it changes anything else
    (identity, journal, cluster, or a directory removed)."""
    if any(getattr(old, n) != getattr(new, n)
           for n in ("layout_version", "bookie_id", "journal_dir", "instance_id")):
        return None
    before = {str(d) for d in (*old.ledger_dirs, *old.index_dirs)}
    after = {str(d) for d in (*new.ledger_dirs, *new.index_dirs)}
    if not (set(map(str, old.ledger_dirs)) <= set(map(str, new.ledger_dirs))
            and set(map(str, old.index_dirs)) <= set(map(str, new.index_dirs))):
        return None
    return after - before


EXPANSION_HINT = (" Only directories were added: set allow_storage_expansion = true to "
                  "let the bookie take new empty ones.")


def layout_problem(found: Cookie, expected: Cookie, where: str) -> str:
    """Why a cookie's layout version stops the start, or "": an older layout needs
    ``ledgerd upgrade`` (BookKeeper's ``bookie upgrade``), a newer one was written by a
    newer ledgerd."""
    have, want = found.layout_version, expected.layout_version
    if have == want:
        return ""
    if have < want:
        return (f"upgrade needed: run ledgerd upgrade --conf FILE (the bookie stopped): "
                f"{where} holds layout_version {have}, this ledgerd uses {want}; "
                "`--rollback` undoes the upgrade until `--finalize`")
    return (f"{where} holds layout_version {have}, newer than this ledgerd's {want}: run "
            "the ledgerd that wrote it, or `ledgerd upgrade --rollback --conf FILE` if its "
            "upgrade kept the previous layout")


def check_cookies(expected: Cookie, dirs: list[Path], remote: bytes | None, *,
                  allow_expansion: bool = False) -> CookieCheck:
    """Validate every directory's cookie; raise CookieMismatchError saying what differs.

    With ``allow_expansion`` (BookKeeper's allowStorageExpansion) a configuration that
    only adds ledger or index directories to the cookie's is accepted when the added
    directories are empty: every directory is stamped with the new cookie and the
    ZooKeeper copy is replaced. A directory removed or swapped is refused as before.
    """
    remote_cookie = Cookie.from_bytes(remote, "ZooKeeper") if remote is not None else None
    # A layout version apart is an upgrade (or a downgrade) to run, not a configuration
    # that changed: say so before comparing anything else.
    for d in dirs:
        version = Path(d) / "current" / "VERSION"
        if version.exists():
            problem = layout_problem(Cookie.from_bytes(version.read_bytes(), str(version)),
                                     expected, str(d))
            if problem:
                raise CookieMismatchError(problem)
    if remote_cookie is not None and (problem := layout_problem(
            remote_cookie, expected, "the cookie in ZooKeeper")):
        raise CookieMismatchError(problem)
    added: set[str] | None = None  # set once an old cookie is found that expected expands
    if remote_cookie is not None:
        diff = expected.differences(remote_cookie)
        if diff:
            grows = _added_dirs(remote_cookie, expected)
            if grows and allow_expansion:
                added = grows
            else:
                raise CookieMismatchError(
                    "the cookie in ZooKeeper does not match this configuration: "
                    + "; ".join(diff)
                    + ". If the change is intended, run `ledgerd shell cookie update`; if this "
                    "bookie belongs to another cluster, fix zk_servers."
                    + (EXPANSION_HINT if grows else ""))
    missing: list[Path] = []
    restamp: list[Path] = []
    found_any = False
    for d in dirs:
        version = Path(d) / "current" / "VERSION"
        if version.exists():
            found_any = True
            cookie = Cookie.from_bytes(version.read_bytes(), str(version))
            diff = expected.differences(cookie)
            if expected.instance_id and cookie.instance_id \
                    and cookie.instance_id != expected.instance_id:
                # Not a configuration change: `cookie update` here would stamp another
                # cluster's data into this one.
                raise CookieMismatchError(
                    f"the data in {d} belongs to cluster instance {cookie.instance_id}, but "
                    f"ZooKeeper holds cluster {expected.instance_id} (it was formatted with "
                    "metaformat, or zk_servers names another cluster). Its ledgers are not "
                    "in this cluster's metadata, so it cannot join: point zk_servers at its "
                    "own cluster. If that cluster's metadata was lost and re-initialised, "
                    "do not format this bookie: bring the metadata back with `ledgerd shell "
                    "metadata restore FILE --replace` or `ledgerd shell metadata rebuild "
                    "--apply`. Only to start it new in this cluster, empty it with `ledgerd "
                    "shell bookieformat --conf FILE --force`.")
            if diff:
                grows = _added_dirs(cookie, expected)
                if grows and allow_expansion and (added is None or added == grows):
                    added = grows
                    restamp.append(Path(d))
                    continue
                raise CookieMismatchError(
                    f"cookie in {d} does not match the configuration: " + "; ".join(diff)
                    + ". A directory was added, removed or swapped: restore it, or run "
                    "`ledgerd shell cookie update` if the change is intended."
                    + (EXPANSION_HINT if grows else ""))
        else:
            if not _is_empty(Path(d) / "current"):
                raise CookieMismatchError(
                    f"{d} holds data but no cookie (current/VERSION); it is not this "
                    "bookie's directory, or its cookie was deleted")
            missing.append(Path(d))
    if added is not None and not (remote_cookie is None and expected.instance_id):
        strays = [m for m in missing if str(m) not in added]
        if strays:
            raise CookieMismatchError(
                "directories without a cookie that the old configuration already had: "
                + ", ".join(map(str, strays)) + ". Storage expansion adds empty "
                "directories; it does not replace wiped ones.")
        return CookieCheck((*missing, *restamp), create_remote=remote_cookie is None,
                           update_remote=remote_cookie is not None,
                           added=tuple(Path(a) for a in sorted(added)))
    if missing and (found_any or remote_cookie is not None):
        raise CookieMismatchError(
            "directories without a cookie while this bookie already has one: "
            + ", ".join(str(m) for m in missing)
            + ". A directory was wiped or replaced; its data is gone from this bookie. "
            "Restore the directory; or, with the bookie stopped, run `ledgerd shell "
            "recover <this bookie>` (its ledgers are copied from their other replicas), "
            "then `ledgerd shell bookieformat` to start it empty.")
    # (A bookie without ZooKeeper, instance id "", keeps its cookies on disk only.)
    if not missing and remote_cookie is None and found_any and expected.instance_id:
        raise CookieMismatchError(
            "every directory has a cookie but ZooKeeper has none for "
            f"{expected.bookie_id}: this bookie was formatted against another cluster "
            "or its ZooKeeper cookie was deleted; run `ledgerd shell cookie update`. If the "
            "cluster's metadata was lost, do not format this bookie: run `ledgerd shell "
            "metadata restore FILE` or `ledgerd shell metadata rebuild --apply`")
    return CookieCheck(tuple(missing), remote_cookie is None)


def stamp_cookies(cookie: Cookie, dirs: list[Path]) -> None:
    data = cookie.to_bytes()
    for d in dirs:
        cur = Path(d) / "current"
        cur.mkdir(parents=True, exist_ok=True)
        tmp = cur / "VERSION.tmp"
        tmp.write_bytes(data)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, cur / "VERSION")
