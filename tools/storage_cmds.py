"""``ledgerd shell`` verbs for storage maintenance, after BookKeeper's shell.

``gc`` (trigger and follow a GC or compaction pass on a live bookie, over its protocol
port), ``listentrylogs``, ``localconsistencycheck`` and ``rebuildindex`` (a bookie's
files, with ``--conf``); the file logic is ``disk.maintenance``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click
import trio

from ledgerd.tools.output import emit, progress, table
from ledgerd.tools.shell import (
    ShellError,
    _accepts_connections,
    _bookie_config,
    _run,
    bookie_connection_options,
    shell,
)

__all__ = ["register"]

_KINDS = {"gc": "GC", "minor": "MINOR_COMPACTION", "major": "MAJOR_COMPACTION"}


def _mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


def _summary(p: dict[str, Any]) -> str:
    lines = [
        f"pass {p['number']} ({p['kind']}) took {p['seconds']:.1f} s",
        f"  ledgers deleted   {p['ledgers_deleted']}",
        f"  entries trimmed   {p['entries_trimmed']}",
        f"  logs deleted      {p['logs_deleted']}",
        f"  logs compacted    {p['logs_compacted']} of {p['logs_to_compact']}",
        f"  entries moved     {p['entries_moved']} ({_mb(p['bytes_moved'])})",
        f"  bytes reclaimed   {_mb(p['bytes_reclaimed'])}",
    ]
    if p.get("stopped"):
        lines.append(f"  stopped early: {p['stopped']}")
    if p.get("error"):
        lines.append(f"  failed: {p['error']}")
    return "\n".join(lines)


@shell.command("gc")
@click.option("--bookie", required=True, help="The bookie's host:port.")
@click.option("--minor", "kind", flag_value="minor", help="Also run a minor compaction.")
@click.option("--major", "kind", flag_value="major", help="Also run a major compaction.")
@click.option("--wait", is_flag=True, help="Follow the pass and print its summary.")
@click.option("--secret", envvar="LEDGERD_ADMIN_SECRET", default="",
              help="The bookie's admin_secret (needed from other hosts).")
@click.option("--timeout", type=float, default=3600.0, show_default=True,
              help="With --wait: give up after this many seconds.")
@click.option("--json", "as_json", is_flag=True)
def gc_cmd(bookie: str, kind: str | None, wait: bool, secret: str, timeout: float,
           as_json: bool) -> None:
    """Start a garbage-collection pass on a live bookie (deleted ledgers, retention
    trims, dead entry logs; --minor/--major also compact sparse logs)."""
    from ledgerd.bookie_client import open_bookie_client
    from ledgerd.wire.messages import AdminKind, AdminStatusRequest, AdminTriggerRequest
    from ledgerd.wire.status import Status

    admin_kind = AdminKind[_KINDS[kind or "gc"]]
    key = secret.encode()

    async def status(c: Any) -> dict[str, Any]:
        st, resp = await c.call(AdminStatusRequest(secret=key))
        if st != Status.OK:
            raise ShellError(f"bookie {bookie} refused the status request: {Status(st).name}"
                             + (" (pass --secret)" if st == Status.UNAUTHORIZED else ""))
        return dict(json.loads(resp.status_json)["gc"])

    options = bookie_connection_options()

    async def run() -> dict[str, Any] | None:
        try:
            async with open_bookie_client(bookie, connect_timeout=5, **options) as c:
                before = await status(c)
                st, resp = await c.call(AdminTriggerRequest(kind=int(admin_kind), secret=key))
                if st != Status.OK:
                    raise ShellError(f"bookie {bookie} refused the GC request: "
                                     f"{Status(st).name}"
                                     + (" (pass --secret)" if st == Status.UNAUTHORIZED else ""))
                # A pass already running finishes first; then ours runs.
                started = bool(getattr(resp, "started", 1))
                target = before["passes"] + (1 if started else 2)
                if not wait:
                    return None
                with progress(f"gc on {bookie}") as bar, trio.fail_after(timeout):
                    while True:
                        now = await status(c)
                        if now["passes"] >= target and now["last"]:
                            return dict(now["last"])
                        cur = now.get("current") or {}
                        bar.done = cur.get("logs_compacted", 0)
                        bar.total = cur.get("logs_to_compact") or None
                        bar.advance(0, f"{cur.get('phase', 'waiting')}, "
                                       f"{cur.get('entries_moved', 0)} entries moved")
                        await trio.sleep(0.25)
        except (OSError, trio.BrokenResourceError) as exc:
            raise ShellError(f"cannot reach bookie {bookie}: {exc}") from None
        except trio.TooSlowError:
            raise ShellError(f"the pass on {bookie} did not finish within {timeout:.0f} s; "
                             "it goes on (see `ledgerd shell gc --bookie ... --wait`)") from None

    last = _run(run)
    if last is None:
        click.echo(f"{kind or 'gc'} pass started on {bookie}")
        return
    emit(as_json, last, _summary(last))
    if last.get("error"):
        sys.exit(1)


@shell.command("listentrylogs")
@click.option("--conf", type=click.Path(dir_okay=False, path_type=Path), required=True)
@click.option("--json", "as_json", is_flag=True)
def listentrylogs(conf: Path, as_json: bool) -> None:
    """Every entry log of a bookie: size, live fraction and ledgers."""
    from ledgerd.disk.maintenance import list_entry_logs

    cfg = _bookie_config(conf)
    infos = list_entry_logs([Path(d) for d in cfg.ledger_directories],
                            [Path(d) for d in cfg.effective_index_directories])
    rows: list[dict[str, Any]] = [
            {"log": f"{i.log_id:x}", "path": i.path, "size": i.size, "rolled": i.rolled,
             "live": round(i.live_fraction, 4), "live_bytes": i.live_bytes,
             "ledgers": sorted(i.ledgers), "problem": i.problem} for i in infos]
    total = sum(i.size for i in infos)
    live = sum(i.live_bytes for i in infos)
    human = table(["LOG", "SIZE", "ROLLED", "LIVE", "LEDGERS", "PROBLEM"], [
        [r["log"], r["size"], "yes" if r["rolled"] else "no (current)", f"{r['live']:.0%}",
         _ledgers(r["ledgers"]), r["problem"]] for r in rows])
    human += (f"\n{len(rows)} entry log(s), {_mb(total)} on disk, about {_mb(live)} live "
              "(ledgers with an index file; retention trims show after the bookie's GC)")
    emit(as_json, {"logs": rows, "bytes": total, "live_bytes": live}, human)


def _ledgers(ids: list[int]) -> str:
    return ", ".join(map(str, ids[:6])) + (f" (+{len(ids) - 6})" if len(ids) > 6 else "")


@shell.command("localconsistencycheck")
@click.option("--conf", type=click.Path(dir_okay=False, path_type=Path), required=True)
@click.option("--digest", type=click.Choice(["auto", "crc32c", "crc32", "dummy"]),
              default="auto", show_default=True,
              help="The ledgers' digest type (auto: try crc32c and crc32; others are "
                   "counted as unverified).")
@click.option("--json", "as_json", is_flag=True)
def localconsistencycheck(conf: Path, digest: str, as_json: bool) -> None:
    """Check that every index entry points at a readable entry with a valid checksum
    and digest. Exits 1 when anything is wrong."""
    from ledgerd.disk.maintenance import check_consistency, stored_ledgers

    cfg = _bookie_config(conf)
    index_dirs = [Path(d) for d in cfg.effective_index_directories]
    n = len(stored_ledgers(index_dirs))
    with progress("ledgers checked", n) as bar:
        report = check_consistency(
            [Path(d) for d in cfg.ledger_directories], index_dirs,
            verify=_digest_check(digest), digest_name="crc32c/crc32" if digest == "auto"
            else digest, progress=bar.advance)
    problems = [{"ledger": p.ledger_id, "entry": p.entry_id, "location": p.location,
                 "problem": p.what} for p in report.problems]
    human = ""
    if problems:
        human = table(["LEDGER", "ENTRY", "LOCATION", "PROBLEM"],
                      [list(p.values()) for p in problems[:200]]) + "\n"
        if len(problems) > 200:
            human += f"... and {len(problems) - 200} more (--json lists all)\n"
    human += (f"{report.ledgers} ledger(s), {report.entries} entries checked: "
              + ("consistent" if report.ok else f"{len(problems)} problem(s)")
              + (f"; {report.unverified_digests} digest(s) not verifiable (HMAC or other)"
                 if report.unverified_digests else ""))
    emit(as_json, {"ledgers": report.ledgers, "entries": report.entries,
                   "unverified_digests": report.unverified_digests, "ok": report.ok,
                   "problems": problems}, human)
    if not report.ok:
        sys.exit(1)


def _digest_check(name: str) -> Any:
    """The entry digest check for ``--digest``: "auto" tries the unkeyed CRCs and says
    None (not verifiable) when neither matches, since the entry may be HMAC'd."""
    import hmac

    from ledgerd.wire.entry import ENTRY_HEADER_SIZE, Digester, DigestType

    kinds = [DigestType.CRC32C, DigestType.CRC32] if name == "auto" else [DigestType(name)]
    digesters = [Digester(k) for k in kinds]

    def check(data: bytes) -> bool | None:
        for d in digesters:
            end = ENTRY_HEADER_SIZE + d.size
            if len(data) >= end and hmac.compare_digest(
                    d.compute(data[:ENTRY_HEADER_SIZE], data[end:]), data[ENTRY_HEADER_SIZE:end]):
                return True
        return None if name == "auto" else False
    return check


@shell.command("rebuildindex")
@click.argument("ledger_id", type=int)
@click.option("--conf", type=click.Path(dir_okay=False, path_type=Path), required=True)
@click.option("--password", default=None,
              help="The ledger's password, when its index header is lost (master key).")
@click.option("--dry-run", is_flag=True, help="Show what would be written; write nothing.")
@click.option("--json", "as_json", is_flag=True)
def rebuildindex(ledger_id: int, conf: Path, password: str | None, dry_run: bool,
                 as_json: bool) -> None:
    """Regenerate a ledger's lost or corrupt index file from the entry logs (the
    bookie must be stopped)."""
    from ledgerd.disk.maintenance import rebuild_index
    from ledgerd.wire.entry import master_key

    cfg = _bookie_config(conf)
    if cfg.ledger_storage_class == "db":
        raise ShellError("rebuildindex writes an index file, which the db storage does not "
                         "use: convert to interleaved, rebuild, convert back "
                         "(ledgerd shell convertstorage)")
    if not dry_run and _accepts_connections(cfg.effective_bookie_id):
        raise ShellError(f"bookie {cfg.effective_bookie_id} is running: stop it first (its "
                         "index cache would overwrite the rebuilt file)")
    try:
        r = rebuild_index([Path(d) for d in cfg.ledger_directories],
                          [Path(d) for d in cfg.effective_index_directories], ledger_id,
                          master_key=master_key(password.encode()) if password else None,
                          dry_run=dry_run)
    except ValueError as exc:
        raise ShellError(str(exc)) from None
    data = {"ledger_id": r.ledger_id, "path": str(r.path), "entries": r.entries,
            "first_entry": r.first_entry, "last_entry": r.last_entry,
            "logs_scanned": r.logs_scanned, "kept_header": r.kept_header,
            "written": r.written}
    gaps = r.last_entry - r.first_entry + 1 - r.entries
    human = (f"{'would write' if dry_run else 'wrote'} {r.path}: {r.entries} entries "
             f"({r.first_entry}..{r.last_entry}"
             + (f", {gaps} missing" if gaps else "") + f") from {r.logs_scanned} entry "
             f"log(s); header {'kept' if r.kept_header else 'new (key from --password)'}")
    emit(as_json, data, human)


@shell.command("convertstorage")
@click.option("--conf", type=click.Path(dir_okay=False, path_type=Path), required=True)
@click.option("--to", "to", type=click.Choice(["db", "interleaved"]), required=True,
              help="db: one LMDB index for every ledger; interleaved: an index file each.")
@click.option("--json", "as_json", is_flag=True)
def convertstorage(conf: Path, to: str, as_json: bool) -> None:
    """Convert a stopped bookie's index to the other ledger storage (BookKeeper's
    convert-to-db-storage); then set ledger_storage_class to match and start it."""
    from ledgerd.disk.maintenance import convert_storage

    cfg = _bookie_config(conf)
    if _accepts_connections(cfg.effective_bookie_id):
        raise ShellError(f"bookie {cfg.effective_bookie_id} is running: stop it first (it "
                         "writes the index being converted)")
    dirs = [Path(d) for d in cfg.effective_index_directories]
    try:
        with progress(f"ledgers converted to {to}") as bar:
            r = convert_storage(dirs, to, progress=bar.set)
    except ValueError as exc:
        raise ShellError(str(exc)) from None
    data = {"to": r.to, "ledgers": r.ledgers, "entries": r.entries, "removed": r.removed}
    human = (f"converted {r.ledgers} ledger(s), {r.entries} entries to {to}; now set "
             f"ledger_storage_class = \"{to}\" in {conf} and start the bookie")
    emit(as_json, data, human)


def register() -> None:
    """The commands attach to ``shell`` on import; this names the import's purpose."""
