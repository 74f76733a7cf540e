"""``ledgerd shell``: cluster and file commands, after BookKeeper's BookieShell.

Cluster commands talk to ZooKeeper (``--zk``, default ``$LEDGERD_ZK_SERVERS`` or
127.0.0.1:2181) and to bookies; file commands read a bookie's directories with the
storage layer's own decoders (``--conf`` names the bookie's TOML file). Listings take
``--json``. Every failure is one line naming what and where, with a non-zero exit.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import shutil
import sys
from collections import deque
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import click
import trio

from ledgerd.appliance.config import BookieConfig
from ledgerd.base.settings import load_config
from ledgerd.tools.output import emit, progress, table

__all__ = ["shell"]

T = TypeVar("T")
ROOT = "/ledgers"


class ShellError(click.ClickException):
    pass


def _run(fn: Callable[..., Awaitable[T]], *args: Any) -> T:
    return trio.run(fn, *args)


async def _store(ctx: click.Context, *, need_cluster: bool = True) -> Any:
    """A session to the shell's ZooKeeper; with ``need_cluster``, one where a cluster
    exists under the root (else LayoutMismatchError, one line: "no cluster at /ledgers on
    ...; run `ledgerd shell initnewcluster` first", not a missing node deep in some
    command)."""
    from ledgerd.config import ClientConfig
    from ledgerd.metadata.cluster import check_layout
    from ledgerd.metadata.zookeeper import ZooKeeperStore

    # ZooKeeper credentials as a client has them (LEDGERD_ZK_DIGEST_AUTH_FILE,
    # LEDGERD_ZK_ENABLE_SECURITY): a secured cluster is read, and written, as its own.
    cfg = load_config(ClientConfig, overrides={"zk_servers": _zk(ctx)})
    store = await ZooKeeperStore.connect(_zk(ctx), connect_timeout=5.0, retries=2,
                                         credentials=cfg.zk_credentials(),
                                         secure=cfg.zk_enable_security)
    if need_cluster:
        try:
            await check_layout(store, _root(ctx))
        except BaseException:
            await store.close()
            raise
    return store


def bookie_connection_options() -> dict[str, Any]:
    """How the shell reaches a bookie directly, as a client would: TLS from
    LEDGERD_TLS_TRUST_PATH (and a client certificate), a token from
    LEDGERD_AUTH_TOKEN_FILE; for ``open_bookie_client``."""
    from ledgerd.config import ClientConfig

    cfg = load_config(ClientConfig)
    return {"tls": cfg.tls_context(), "auth_token": cfg.auth_token()}


def _bookie_config(conf: Path | None) -> BookieConfig:
    if conf is None:
        raise ShellError("this command reads a bookie's directories: pass --conf FILE "
                         "(the bookie's TOML configuration)")
    return load_config(BookieConfig, path=conf)


@click.group("shell")
@click.option("--zk", default=None,
              help="ZooKeeper connection string (host:port[,...][/chroot]); default "
                   "$LEDGERD_ZK_SERVERS, else the one running `ledgerd local`, else "
                   "127.0.0.1:2181.")
@click.option("--zk-root", "zk_root", envvar="LEDGERD_ZK_LEDGERS_ROOT_PATH", default=ROOT,
              show_default=True, show_envvar=True,
              help="The cluster's root znode (zk_ledgers_root_path).")
@click.pass_context
def shell(ctx: click.Context, zk: str | None, zk_root: str) -> None:
    """Cluster administration and file inspection."""
    if not zk_root.startswith("/") or zk_root.endswith("/"):
        raise click.BadParameter(f"{zk_root!r}: a znode path such as /ledgers",
                                 param_hint="--zk-root")
    root_given = ctx.get_parameter_source("zk_root") is not click.core.ParameterSource.DEFAULT
    ctx.obj = {**(ctx.obj or {}), "zk_flag": zk, "root": zk_root if root_given else None}
    if not ctx.obj.get("debug"):
        # The client's events (an ensemble change that failed, a handle that failed) are
        # noise before the one line that says why the command failed.
        logging.getLogger().setLevel(logging.ERROR)
        logging.getLogger("kazoo.client").setLevel(logging.CRITICAL)  # the error line says it


def _accepts_connections(address: str) -> bool:
    import socket

    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=1):
            return True
    except (OSError, ValueError):
        return False


def _target(ctx: click.Context) -> Any:
    """The cluster this command acts on (tools/target.py), found once per command:
    ``--zk``, $LEDGERD_ZK_SERVERS, the one running ``ledgerd local`` (said on stderr),
    else 127.0.0.1:2181, which must accept connections (else a one-line error at once
    saying how to name a cluster, not a ZooKeeper time-out)."""
    obj = ctx.find_root().obj if ctx.obj is None else ctx.obj
    if "target" not in obj:
        obj["target"] = find_cluster(obj.get("zk_flag"), "shell")
    return obj["target"]


def find_cluster(flag: str | None, who: str) -> Any:
    """``localcluster.locate`` for a command: a discovered ``ledgerd local`` is said on
    stderr (``who: using ...``); the default address that refuses connections, or
    several local clusters, is a one-line error at once, saying how to name one."""
    import tempfile

    from ledgerd.tools.localcluster import locate
    from ledgerd.tools.target import DEFAULT_ZK, Source

    try:
        target = locate(flag)
    except ValueError as exc:
        raise ShellError(str(exc)) from None
    if target.source is Source.LOCAL:
        click.echo(f"{who}: {target.describe()}", err=True)
    elif target.source is Source.DEFAULT and not _accepts_connections(DEFAULT_ZK):
        raise ShellError(
            f"no ZooKeeper at {DEFAULT_ZK} (the default) and no `ledgerd local` runs under "
            f"{tempfile.gettempdir()}: give --zk HOSTS or export LEDGERD_ZK_SERVERS (the "
            "`ZooKeeper:` line `ledgerd local` prints; or run "
            "eval \"$(ledgerd local ctl env --data DIR)\")")
    return target


def _zk(ctx: click.Context) -> str:
    return str(_target(ctx).zk)


def _root(ctx: click.Context) -> str:
    """The cluster's root znode: ``--zk-root`` (or its variable), else the discovered
    ``ledgerd local``'s, else /ledgers."""
    obj = ctx.find_root().obj if ctx.obj is None else ctx.obj
    if obj.get("root"):
        return str(obj["root"])
    return str(_target(ctx).root or ROOT)


def _refuse_unnamed(ctx: click.Context, verb: str) -> None:
    """ShellError when ``verb``, which writes cookies or cluster metadata, would write
    into a cluster the user did not name (tools/target.py)."""
    from ledgerd.tools.target import unnamed_write_problem

    problem = unnamed_write_problem(_target(ctx), verb)
    if problem:
        raise ShellError(problem)


def _confirm_destruction(what: str, force: bool, *, json_out: bool = False) -> None:
    """Say what is about to be destroyed (``what``, with the facts: cluster instance,
    counts), then: with ``force``, say it in the output (stderr under --json) and go on;
    on a terminal, ask; without one, refuse in one line that says it and names --force."""
    if force:
        click.echo(f"{what} (--force)", err=json_out)
        return
    if sys.stdin.isatty() and sys.stderr.isatty():
        if click.confirm(f"{what}. Go on?", default=False, err=True):
            return
        raise ShellError("nothing done")
    raise ShellError(f"{what}: pass --force to do it (no terminal to ask on)")


async def _cluster_facts(store: Any, zk: str, root: str) -> str:
    """One clause naming a cluster and what it holds: instance id, ledgers, logs,
    cookies (counted now)."""
    from ledgerd.metadata.cluster import instance_id, read_layout
    from ledgerd.metadata.ledgers import LedgerManager

    layout = await read_layout(store, root)
    if layout is None:
        return f"no cluster at {root} on {zk} (nothing to delete there)"
    ledgers = 0
    async for _ in LedgerManager(store, root, layout).iter_ledger_ids():
        ledgers += 1

    async def count(path: str) -> int:
        return len(await store.children(path)) if await store.exists(path) is not None else 0

    return (f"cluster instance {await instance_id(store, root)} at {root} on {zk}: "
            f"{ledgers} ledger(s), {await count(f'{root}/logs')} log(s), "
            f"{await count(f'{root}/cookies')} bookie cookie(s)")


# -- cluster ---------------------------------------------------------------------------


_LAYOUT_OPTION = click.option(
    "--layout", type=click.Choice(["hierarchical", "flat"]), default="hierarchical",
    show_default=True, help="How ledger znodes are laid out (ledger_manager_type).")


@shell.command("initnewcluster")
@_LAYOUT_OPTION
@click.pass_context
def initnewcluster(ctx: click.Context, layout: str) -> None:
    """Create the cluster's nodes under the root, /ledgers by default (no-op if they
    exist with the same layout)."""
    from ledgerd.metadata.cluster import init_new_cluster, instance_id

    _refuse_unnamed(ctx, "initnewcluster")

    async def run() -> str:
        store = await _store(ctx, need_cluster=False)
        try:
            iid = await init_new_cluster(store, _root(ctx), layout)
            return f"initialised a new cluster, instance id {iid}" if iid else \
                f"a cluster already exists, instance id {await instance_id(store, _root(ctx))}"
        finally:
            await store.close()
    click.echo(_run(run))


@shell.command("metaformat")
@click.option("--force", is_flag=True, help="Do it without asking (required without a terminal).")
@click.option("--allow-live-bookies", is_flag=True,
              help="Format even though bookies are registered (their data is orphaned).")
@_LAYOUT_OPTION
@click.pass_context
def metaformat_cmd(ctx: click.Context, force: bool, allow_live_bookies: bool,
                   layout: str) -> None:
    """Wipe the cluster metadata and initialise a new cluster."""
    from ledgerd.metadata.cluster import metaformat
    from ledgerd.metadata.registry import BookieRegistry

    _refuse_unnamed(ctx, "metaformat")

    async def facts() -> str:
        store = await _store(ctx, need_cluster=False)
        try:
            if not allow_live_bookies:
                from ledgerd.metadata.errors import NoNodeError

                try:
                    live = await BookieRegistry(store, _root(ctx)).list_bookies()
                except NoNodeError:  # no cluster yet: nothing registered
                    live = None
                names = sorted({*live.writable, *live.read_only}) if live else []
                if names:
                    raise ShellError(
                        f"{len(names)} bookie(s) are registered ({', '.join(names[:5])}): "
                        "stop them first; their data will not belong to the new cluster "
                        "(format each with `ledgerd shell bookieformat`), or pass "
                        "--allow-live-bookies")
            return await _cluster_facts(store, _zk(ctx), _root(ctx))
        finally:
            await store.close()
    _confirm_destruction(f"metaformat deletes all metadata of {_run(facts)}", force)

    async def run() -> str:
        store = await _store(ctx, need_cluster=False)
        try:
            return await metaformat(store, _root(ctx), layout)
        finally:
            await store.close()
    click.echo(f"formatted; new instance id {_run(run)}")


@shell.command("whatisinstanceid")
@click.pass_context
def whatisinstanceid(ctx: click.Context) -> None:
    """Print the cluster's instance id."""
    from ledgerd.metadata.cluster import check_layout, instance_id

    async def run() -> str:
        store = await _store(ctx)
        try:
            await check_layout(store, _root(ctx))
            return await instance_id(store, _root(ctx))
        finally:
            await store.close()
    click.echo(_run(run))


@shell.command("listbookies")
@click.option("--readonly", is_flag=True, help="List read-only bookies instead of writable.")
@click.option("--all", "all_", is_flag=True, help="List both.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def listbookies(ctx: click.Context, readonly: bool, all_: bool, as_json: bool) -> None:
    """Bookies registered in ZooKeeper."""
    from ledgerd.metadata.registry import BookieRegistry

    async def run() -> list[dict[str, Any]]:
        store = await _store(ctx)
        try:
            reg = BookieRegistry(store, _root(ctx))
            s = await reg.list_bookies()
            out = []
            for state, ids in (("writable", s.writable), ("read-only", s.read_only)):
                if all_ or (state == "read-only") == readonly:
                    for bid in sorted(ids):
                        try:
                            info = await reg.bookie_info(bid)
                        except Exception:
                            info = {}
                        out.append({"bookie": bid, "state": state, "pid": info.get("pid"),
                                    "version": info.get("version", "")})
            return out
        finally:
            await store.close()
    rows = _run(run)
    emit(as_json, rows, table(["BOOKIE", "STATE", "PID", "VERSION"],
                              [[r["bookie"], r["state"], r["pid"], r["version"]] for r in rows])
         + f"\n{len(rows)} bookie(s)")


@shell.command("bookieinfo")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def bookieinfo(ctx: click.Context, as_json: bool) -> None:
    """Disk use of every registered bookie (asked over the wire)."""
    from ledgerd.bookie_client import BookieConnectionError, open_bookie_client
    from ledgerd.metadata.registry import BookieRegistry
    from ledgerd.wire.messages import GetBookieInfoRequest, GetBookieInfoResponse

    async def run() -> list[dict[str, Any]]:
        store = await _store(ctx)
        try:
            s = await BookieRegistry(store, _root(ctx)).list_bookies()
        finally:
            await store.close()
        out = []
        options = bookie_connection_options()
        for bid in sorted(s.writable | s.read_only):
            row: dict[str, Any] = {"bookie": bid}
            try:
                async with open_bookie_client(bid, connect_timeout=5, **options) as c:
                    status, resp = await c.call(GetBookieInfoRequest())
                assert isinstance(resp, GetBookieInfoResponse), status
                row.update(total_bytes=resp.total_bytes, free_bytes=resp.free_bytes,
                           used_pct=round(100 * (1 - resp.free_bytes / resp.total_bytes), 1)
                           if resp.total_bytes else 0.0,
                           state="read-only" if resp.is_read_only else "writable")
            except (BookieConnectionError, AssertionError) as exc:
                row.update(error=str(exc))
            out.append(row)
        return out
    rows = _run(run)
    gib = 1 << 30
    emit(as_json, rows, table(
        ["BOOKIE", "STATE", "TOTAL GiB", "FREE GiB", "USED %"],
        [[r["bookie"], r.get("state", r.get("error", "")),
          round(r["total_bytes"] / gib, 2) if "total_bytes" in r else None,
          round(r["free_bytes"] / gib, 2) if "free_bytes" in r else None,
          r.get("used_pct")] for r in rows]))
    failed = [r for r in rows if "error" in r]
    if failed:
        raise ShellError(f"{len(failed)} of {len(rows)} bookie(s) did not answer: "
                         + "; ".join(f"{r['bookie']}: {r['error']}" for r in failed[:3]))


# -- ledgers -------------------------------------------------------------------------------


def _client_run(ctx: click.Context, fn: Callable[[Any], Awaitable[T]]) -> T:
    import ledgerd

    async def run() -> T:
        async with ledgerd.open_client(_zk(ctx), zk_ledgers_root_path=_root(ctx)) as client:
            return await fn(client)
    return _run(run)


def _md_dict(lid: int, md: Any) -> dict[str, Any]:
    d: dict[str, Any] = json.loads(md.to_json())
    d.pop("password_check", None)
    return {"ledger_id": lid, **d}


@shell.command("listledgers")
@click.option("--json", "as_json", is_flag=True)
@click.option("--meta", is_flag=True, help="Also show each ledger's state and size.")
@click.pass_context
def listledgers(ctx: click.Context, as_json: bool, meta: bool) -> None:
    """Every ledger id (with --meta: state, entries, length, ensemble)."""
    async def run(client: Any) -> list[dict[str, Any]]:
        out = []
        async for lid in client.list_ledgers():
            if meta:
                md = await client.ledger_metadata(lid)
                out.append({"ledger_id": lid, "state": md.state.value,
                            "last_entry_id": md.last_entry_id, "length": md.length,
                            "ensemble": f"{md.ensemble_size}/{md.write_quorum}/{md.ack_quorum}"})
            else:
                out.append({"ledger_id": lid})
        return out
    rows = _client_run(ctx, run)
    headers = ["LEDGER", "STATE", "LAST ENTRY", "LENGTH", "E/Qw/Qa"] if meta else ["LEDGER"]
    emit(as_json, rows, table(headers, [list(r.values()) for r in rows])
         + f"\n{len(rows)} ledger(s)")


@shell.command("ledgermetadata")
@click.argument("ledger_id", type=int)
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def ledgermetadata(ctx: click.Context, ledger_id: int, as_json: bool) -> None:
    """One ledger's metadata."""
    async def run(client: Any) -> dict[str, Any]:
        return _md_dict(ledger_id, await client.ledger_metadata(ledger_id))
    d = _client_run(ctx, run)
    if as_json:
        emit(True, d, "")
        return
    lines = [f"{k:16} {'none' if d[k] is None else d[k]}"
             for k in ("ledger_id", "state", "last_entry_id", "length", "ensemble_size",
                       "write_quorum", "ack_quorum", "digest_type", "compression", "term")
             if k in d]
    ctime = d.get("ctime_ms")
    if isinstance(ctime, int) and ctime > 0:
        iso = datetime.datetime.fromtimestamp(ctime / 1000, datetime.UTC)
        lines.append(f"{'created':16} {iso.isoformat(timespec='milliseconds')}")
    lines.append("ensembles:")
    lines += [f"  from entry {first}: {', '.join(bookies)}" for first, bookies in d["ensembles"]]
    for key, value in sorted((d.get("custom_metadata") or {}).items()):
        lines.append(f"custom {key:9} {value}")
    click.echo("\n".join(lines))


_PAYLOAD_OPTIONS = [
    click.option("--hex", "fmt", flag_value="hex", help="Payloads as hex (every byte)."),
    click.option("--base64", "fmt", flag_value="base64",
                 help="Payloads as base64 (every byte)."),
    click.option("--text", "fmt", flag_value="text", default=True,
                 help="Payloads as UTF-8 text, control characters escaped (the default)."),
]


def _payload_options(fn: Any) -> Any:
    for option in reversed(_PAYLOAD_OPTIONS):
        fn = option(fn)
    return fn


@shell.command("readledger")
@click.argument("ledger_id", type=int)
@click.option("--from", "first", type=int, default=0, show_default=True)
@click.option("--to", "last", type=int, default=None, help="Last entry (default: the LAC).")
@click.option("--password", default="", help="The ledger's password.")
@click.option("--json", "as_json", is_flag=True,
              help="Rows as JSON; payload_base64 holds each entry's exact bytes.")
@_payload_options
@click.pass_context
def readledger(ctx: click.Context, ledger_id: int, first: int, last: int | None, password: str,
               as_json: bool, fmt: str) -> None:
    """Entries of a ledger (read without recovery: a ledger being written stays open).
    Payloads never reach the terminal raw: text with control characters escaped, or
    --hex / --base64."""
    from ledgerd.tools.payloads import json_fields
    if last is not None and first > last:
        raise ShellError(f"--from {first} is past --to {last}: nothing to read")

    async def run(client: Any) -> list[dict[str, Any]]:
        rh = await client.open_ledger(ledger_id, password, recovery=False)
        if not rh.is_closed:
            await rh.read_lac()
        lac = rh.last_add_confirmed
        end = lac if last is None else min(last, lac)
        if last is not None and last > lac:
            # BookKeeper's reader clamps to the last confirmed entry too; say so.
            click.echo(f"ledger {ledger_id}: reading to entry {lac}, its last confirmed "
                       f"entry (--to {last} is past it)", err=True)
        if first > end:
            raise ShellError(f"ledger {ledger_id}: --from {first} is past its last confirmed "
                             f"entry {lac}: nothing to read" if lac >= 0 else
                             f"ledger {ledger_id} has no confirmed entries yet")
        out = []
        with progress(f"ledger {ledger_id}", max(0, end - first + 1)) as bar:
            async for e in rh.read(first, end):
                out.append({"entry_id": e.entry_id, "size": len(e.payload),
                            **json_fields(e.payload, fmt)})
                bar.advance()
        return out
    rows = _client_run(ctx, run)
    emit(as_json, rows, table(["ENTRY", "SIZE", "PAYLOAD"],
                              [[r["entry_id"], r["size"], r["payload"][:60]] for r in rows])
         + f"\n{len(rows)} entries")


@shell.command("deleteledger")
@click.argument("ledger_id", type=int)
@click.option("--force", is_flag=True,
              help="Do it without asking (required without a terminal); the data is gone "
                   "at the next GC.")
@click.pass_context
def deleteledger(ctx: click.Context, ledger_id: int, force: bool) -> None:
    """Delete a ledger (says which, and what it holds, before it asks)."""
    from ledgerd.metadata.cluster import instance_id

    async def facts(client: Any) -> str:
        md = await client.ledger_metadata(ledger_id)
        logs = [name for name in await client.logs.names()
                if ledger_id in await client.logs.ledgers(name)]
        entries = md.last_entry_id + 1 if md.is_closed else "an open ledger's"
        return (f"deleteledger deletes ledger {ledger_id} of cluster instance "
                f"{await instance_id(client.store, _root(ctx))}: {md.state.value}, "
                f"{entries} entries, {md.length} bytes"
                + (f", listed by log(s) {', '.join(logs)}" if logs else ""))
    _confirm_destruction(_client_run(ctx, facts), force)

    async def run(client: Any) -> None:
        await client.delete_ledger(ledger_id)
    _client_run(ctx, run)
    click.echo(f"deleted ledger {ledger_id}")


# -- logs ------------------------------------------------------------------------------


@shell.command("listlogs")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def listlogs(ctx: click.Context, as_json: bool) -> None:
    """Every log: its kind and how many ledgers it lists."""
    async def run(client: Any) -> list[dict[str, Any]]:
        out = []
        for name in await client.logs.names():
            record, _ = await client.logs.store.get(name)
            out.append({"log": name, "kind": "unbounded" if record.unbounded else "ledgers",
                        "ledgers": len(record.ledgers)})
        return out
    rows = _client_run(ctx, run)
    emit(as_json, rows, table(["LOG", "KIND", "LEDGERS"], [list(r.values()) for r in rows])
         + f"\n{len(rows)} log(s)")


@shell.command("logstat")
@click.argument("name")
@click.option("--password", default="", help="The log's ledgers' password.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def logstat(ctx: click.Context, name: str, password: str, as_json: bool) -> None:
    """A log's ledgers with their offsets, entries and bytes, and its cursors."""
    async def run(client: Any) -> dict[str, Any]:
        record, _ = await client.logs.store.get(name) if name in await client.logs.names() \
            else (None, None)
        if record is None:
            raise ShellError(f"log {name!r} does not exist (ledgerd shell listlogs)")
        rows = []
        end = record.base
        for seg in await client.logs.layout(name):
            md = await client.ledger_metadata(seg.ledger_id)
            count = seg.count
            if count is None:  # open: up to the LAC
                rh = await client.open_ledger(seg.ledger_id, password, recovery=False)
                lac = await rh.read_lac()
                count = (lac + 1 - md.noops_before(lac + 1) - seg.first_offset
                         if record.unbounded and seg.first_offset is not None
                         else max(0, lac + 1 - seg.first_entry))
            rows.append({"ledger_id": seg.ledger_id, "state": md.state.value,
                         "first_offset": seg.first_offset, "entries": count,
                         "bytes": md.length, "fragments": len(md.ensembles),
                         "term": md.term})
            if seg.first_offset is not None:
                end = seg.first_offset + count
        cursors = {}
        for c in await client.logs.store.cursors(name):
            got = await client.logs.store.get_cursor(name, c)
            cursors[c] = None if got is None else got[0].offset
        return {"log": name, "kind": "unbounded" if record.unbounded else "ledgers",
                "start_offset": rows[0]["first_offset"] if rows else record.base,
                "end_offset": end, "ledgers": rows, "cursors": cursors}
    d = _client_run(ctx, run)
    text = (f"log {d['log']} ({d['kind']}): offsets {d['start_offset']}..{d['end_offset']}"
            f" ({d['end_offset'] - (d['start_offset'] or 0)} entries)\n"
            + table(["LEDGER", "STATE", "FIRST OFFSET", "ENTRIES", "BYTES", "FRAGMENTS",
                     "TERM"], [list(r.values()) for r in d["ledgers"]])
            + "".join(f"\ncursor {c}: next offset {o}" for c, o in d["cursors"].items()))
    emit(as_json, d, text)


@shell.command("readlogentries")
@click.argument("name")
@click.option("--from", "first", default="start", show_default=True,
              help="An offset, or 'start' / 'end'.")
@click.option("--count", type=int, default=None, help="Stop after this many entries.")
@click.option("--follow", is_flag=True, help="Keep waiting for new entries (Ctrl-C ends).")
@click.option("--password", default="", help="The log's ledgers' password.")
@click.option("--json", "as_json", is_flag=True,
              help="One JSON object per line; payload_base64 holds the exact bytes.")
@_payload_options
@click.pass_context
def readlogentries(ctx: click.Context, name: str, first: str, count: int | None,
                   follow: bool, password: str, as_json: bool, fmt: str) -> None:
    """A log's entries by offset (without --follow: up to what is acknowledged now).
    Payloads never reach the terminal raw: text with control characters escaped, or
    --hex / --base64."""
    from ledgerd.tools.payloads import json_fields, render

    if first not in ("start", "end") and not first.lstrip("-").isdigit():
        raise ShellError(f"--from {first!r}: expected an offset, 'start' or 'end'")
    start: Any = first if first in ("start", "end") else int(first)

    async def run(client: Any) -> int:
        if name not in await client.logs.names():
            raise ShellError(f"log {name!r} does not exist (ledgerd shell listlogs)")
        layout = await client.logs.layout(name)
        end = None if follow else await _log_end(client, name, password, layout)
        begin = (layout[0].first_offset if layout else end) if start == "start" else start
        n = 0
        if end is not None and (begin == "end" or (isinstance(begin, int) and begin >= end)
                                or (count is not None and count <= 0)):
            return 0  # nothing acknowledged at or after the start yet
        async for e in client.logs.follow(name, password, start=start, poll_s=1.0):
            if as_json:
                click.echo(json.dumps({"offset": e.offset, "ledger_id": e.position.ledger_id,
                                       "entry_id": e.position.entry_id,
                                       "size": len(e.payload),
                                       **json_fields(e.payload, fmt)}))
            else:
                click.echo(f"{e.offset}\t{e.position.ledger_id}:{e.position.entry_id}\t"
                           f"{render(e.payload, fmt)[:200]}")
            n += 1
            if (count is not None and n >= count) or (end is not None and e.offset + 1 >= end):
                break
        return n
    try:
        _client_run(ctx, run)
    except KeyboardInterrupt:
        pass


async def _log_end(client: Any, name: str, password: str, layout: list[Any]) -> int:
    """The offset after the last acknowledged entry, now."""
    if not layout:
        record, _ = await client.logs.store.get(name)
        return int(record.base)
    last = layout[-1]
    if last.first_offset is None:
        raise ShellError(f"log {name!r}: a writer is taking over (an earlier ledger is still "
                         "open); try again")
    if last.count is not None:
        return int(last.first_offset + last.count)
    rh = await client.open_ledger(last.ledger_id, password, recovery=False)
    lac = await rh.read_lac()
    if rh.metadata.unbounded:
        return int(lac + 1 - rh.metadata.noops_before(lac + 1))
    return int(last.first_offset + lac + 1)


@shell.command("truncatelog")
@click.argument("name")
@click.option("--before", "before", type=int, required=True,
              help="Drop what holds only entries before this offset.")
@click.option("--force", is_flag=True,
              help="Do it without asking (required without a terminal); dropped entries are "
                   "gone at the next GC.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def truncatelog(ctx: click.Context, name: str, before: int, force: bool,
                as_json: bool) -> None:
    """Retention: drop a log's whole ledgers (or an unbounded log's whole fragments)
    before an offset; offsets of what stays do not change."""
    async def facts(client: Any) -> str:
        if name not in await client.logs.names():
            raise ShellError(f"log {name!r} does not exist (ledgerd shell listlogs)")
        gone = [seg for seg in await client.logs.layout(name)
                if seg.first_offset is not None and seg.count is not None
                and seg.first_offset + seg.count <= before]
        return (f"truncatelog drops log {name!r}'s entries before offset {before}: "
                f"{len(gone)} whole ledger(s), {sum(seg.count for seg in gone)} entries "
                "(an unbounded log: its whole fragments before the offset)")
    _confirm_destruction(_client_run(ctx, facts), force, json_out=as_json)

    async def run(client: Any) -> dict[str, int]:
        if name not in await client.logs.names():
            raise ShellError(f"log {name!r} does not exist (ledgerd shell listlogs)")
        result: dict[str, int] = await client.logs.truncate_before(name, before)
        return result
    d = _client_run(ctx, run)
    what = (f"{d['fragments']} fragment(s)" if "fragments" in d
            else f"{d['ledgers']} ledger(s)")
    emit(as_json, d, f"dropped {what}; log {name} now starts at offset {d['start']}")


_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str, option: str) -> float:
    """``90``, ``90s``, ``30m``, ``12h``, ``7d`` -> seconds (BadParameter naming the option)."""
    t = text.strip().lower()
    unit = _DURATION_UNITS.get(t[-1:], None) if t else None
    number = t[:-1] if unit is not None else t
    try:
        value = float(number) * (unit or 1)
    except ValueError:
        value = -1
    if value < 0:
        raise click.BadParameter(f"{text!r} is not a duration (90, 90s, 30m, 12h, 7d)",
                                 param_hint=option)
    return value


@shell.command("sweepspark")
@click.option("--older-than", "older_than", required=True,
              help="Delete unlisted Spark-written ledgers at least this old (90s, 30m, 12h, "
                   "7d); a streaming query's are deleted at any age once the log recorded "
                   "a later batch of that query.")
@click.option("--log", "log_name", default=None, help="Only ledgers written for this log.")
@click.option("--dry-run", is_flag=True, help="List them, delete nothing.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def sweepspark(ctx: click.Context, older_than: str, log_name: str | None, dry_run: bool,
               as_json: bool) -> None:
    """Delete ledgers a Spark write left behind: tagged by the write, listed by no log.

    A task killed between creating its ledger and its job's cleanup leaves such a
    ledger (docs/spark.md). Ledgers listed in any log are never touched."""
    from ledgerd.spark.orphans import delete_quietly, find_orphans
    from ledgerd.sync import SyncClient

    age = parse_duration(older_than, "--older-than")
    with SyncClient(_zk(ctx), zk_ledgers_root_path=_root(ctx)) as client:
        found = find_orphans(client, older_than_s=age, log_name=log_name)
        if not dry_run:
            for orphan in found:
                delete_quietly(client, orphan.ledger_id)
    rows = [{"ledger_id": o.ledger_id, "log": o.log, "write": o.write, "batch": o.batch,
             "age_s": round(o.age_s, 1), "why": o.why, "deleted": not dry_run}
            for o in found]
    verb = "would delete" if dry_run else "deleted"
    emit(as_json, rows, (table(["LEDGER", "LOG", "WRITE", "BATCH", "AGE_S", "WHY"],
                               [[r["ledger_id"], r["log"], r["write"], r["batch"], r["age_s"],
                                 r["why"]] for r in rows]) + "\n" if rows else "")
         + f"{verb} {len(rows)} orphaned ledger(s)")


@shell.command("zkacl")
@click.option("--apply", "mode", flag_value="secure",
              help="Give every node under the root the digest-only ACL of this session "
                   "(needs LEDGERD_ZK_DIGEST_AUTH_FILE and LEDGERD_ZK_ENABLE_SECURITY=true).")
@click.option("--open", "mode", flag_value="open",
              help="Give them the open ACL again (turning zk_enable_security off).")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def zkacl(ctx: click.Context, mode: str | None, as_json: bool) -> None:
    """Show, or change, the ACLs of the cluster's znodes (the migration to and from
    zk_enable_security; BookKeeper leaves this step to the operator)."""
    async def walk(store: Any, path: str, out: list[str]) -> None:
        out.append(path)
        for child in sorted(await store.children(path)):
            await walk(store, f"{path.rstrip('/')}/{child}", out)

    if mode is not None:
        _refuse_unnamed(ctx, f"zkacl --{'apply' if mode == 'secure' else 'open'}")

    async def run() -> dict[str, Any]:
        store = await _store(ctx)
        try:
            paths: list[str] = []
            await walk(store, _root(ctx), paths)
            kinds: dict[str, int] = {}
            for path in paths:
                if mode is not None:
                    await store.set_acl(path, secure=mode == "secure")
                acl = ",".join(sorted(await store.get_acl(path)))
                kind = "open" if acl.startswith("world:anyone") else "digest" \
                    if acl.startswith("digest:") else acl
                kinds[kind] = kinds.get(kind, 0) + 1
            return {"root": _root(ctx), "nodes": len(paths), "acls": kinds,
                    "changed": len(paths) if mode else 0}
        finally:
            await store.close()
    d = _run(run)
    summary = ", ".join(f"{n} {k}" for k, n in sorted(d["acls"].items()))
    verb = f"set {d['changed']} node(s); now " if mode else ""
    emit(as_json, d, f"{d['root']}: {d['nodes']} node(s): {verb}{summary}")


@shell.command("gentoken")
@click.argument("name")
@click.option("--roles", required=True,
              help="Comma-separated roles: client, recovery, admin, bookie.")
@click.option("--token-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the token here (mode 0600; the client's auth_token_file) instead "
                   "of printing it.")
def gentoken(name: str, roles: str, token_file: Path | None) -> None:
    """Make a token for a principal: the token for the client, and the entry (its
    SHA-256, never the token) to append to the bookies' principals_file."""
    import hashlib
    import re
    import secrets

    from ledgerd.appliance.authz import parse_roles

    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}", name):
        raise click.BadParameter(f"{name!r}: letters, digits, . _ - (a TOML key)",
                                 param_hint="NAME")
    try:
        chosen = sorted(parse_roles(roles.split(","), "--roles"))
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--roles") from None
    token = secrets.token_urlsafe(32)
    digest = hashlib.sha256(token.encode()).hexdigest()
    if token_file is not None:
        fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
        click.echo(f"token written to {token_file} (auth_token_file = \"{token_file}\")",
                   err=True)
    else:
        click.echo(f"token (give it to the client, once): {token}", err=True)
    click.echo(f"[principals.{name}]\ntoken_sha256 = \"{digest}\"\n"
               f"roles = [{', '.join(repr(r).replace(chr(39), chr(34)) for r in chosen)}]")


@shell.command("simpletest")
@click.option("--ensemble", "-e", default=3, show_default=True)
@click.option("--write-quorum", "-w", default=2, show_default=True)
@click.option("--ack-quorum", "-a", default=2, show_default=True)
@click.option("--entries", "-n", default=100, show_default=True, type=click.IntRange(1, None))
@click.pass_context
def simpletest(ctx: click.Context, ensemble: int, write_quorum: int, ack_quorum: int,
               entries: int) -> None:
    """Create a ledger, write N entries, read them back, delete it.

    Progress shows on a terminal; Ctrl-C stops early, still deletes the ledger, and says
    how far it got (exit 130)."""
    import signal

    window = 1000  # appends in flight
    stopped = False

    async def run(client: Any) -> str:
        nonlocal stopped
        lh = await client.create_ledger(ensemble, write_quorum, ack_quorum,
                                        password=b"simpletest")
        click.echo(f"ledger {lh.ledger_id}: writing {entries} entries "
                   f"(E{ensemble}/Qw{write_quorum}/Qa{ack_quorum})", err=True)
        async with trio.open_nursery() as nursery:
            async def on_sigint() -> None:
                nonlocal stopped
                with trio.open_signal_receiver(signal.SIGINT) as signals:
                    async for _ in signals:
                        stopped = True
                        return

            nursery.start_soon(on_sigint)
            written = n = 0
            try:
                with progress("writing", entries) as bar:
                    pending: deque[Any] = deque()
                    for i in range(entries):
                        if stopped:
                            break
                        pending.append(await lh.submit(b"simpletest entry %d" % i))
                        if len(pending) >= window:
                            await pending.popleft()
                            written += 1
                            bar.advance()
                    while pending:
                        await pending.popleft()
                        written += 1
                        bar.advance()
                await lh.close()
                rh = await client.open_ledger(lh.ledger_id, b"simpletest")
                with progress("reading", written) as bar:
                    if stopped:  # interrupted while writing: nothing to read back for
                        return (f"interrupted: ledger {lh.ledger_id}: wrote {written} of "
                                f"{entries} entries, deleted")
                    async for e in rh.read():
                        if e.payload != b"simpletest entry %d" % e.entry_id:
                            raise ShellError(f"entry {e.entry_id} read back different bytes")
                        n += 1
                        bar.advance()
                        if stopped:
                            break
            finally:
                with trio.CancelScope(shield=True):
                    await client.delete_ledger(lh.ledger_id)
            nursery.cancel_scope.cancel()
        where = f"ledger {lh.ledger_id} on {', '.join(lh.ensemble)}"
        if stopped:
            return (f"interrupted: {where}: wrote {entries} entries, read back {n} of "
                    f"them, deleted")
        if n != entries:
            raise ShellError(f"wrote {entries} entries, read back {n}")
        return f"ok: {where}: wrote and read back {entries} entries, deleted"
    click.echo(_client_run(ctx, run))
    if stopped:
        sys.exit(130)


@shell.command("bookiesanity")
@click.option("--bookie", default=None, help="host:port (default: from --conf).")
@click.option("--conf", type=click.Path(dir_okay=False, path_type=Path), default=None)
@click.option("--entries", default=10, show_default=True)
def bookiesanity(bookie: str | None, conf: Path | None, entries: int) -> None:
    """Write and read back entries on one bookie, directly (no metadata)."""
    import random

    from ledgerd.bookie_client import open_bookie_client
    from ledgerd.wire.entry import Digester, DigestType, decode_entry, encode_entry, master_key
    from ledgerd.wire.messages import AddRequest, ReadRequest
    from ledgerd.wire.status import Status

    if bookie is None:
        cfg = _bookie_config(conf)
        bookie = cfg.effective_bookie_id
    address = bookie
    d = Digester(DigestType.CRC32C)
    key = master_key(b"bookiesanity")
    lid = random.randrange(1 << 40, 1 << 50)  # a ledger id no client allocates soon

    options = bookie_connection_options()

    async def run() -> None:
        async with open_bookie_client(address, connect_timeout=5, **options) as c:
            batch = tuple(encode_entry(d, lid, i, i - 1, 0, b"sanity %d" % i)
                          for i in range(entries))
            status, _ = await c.call(AddRequest(ledger_id=lid, first_entry_id=0,
                                                master_key=key, entries=batch))
            if status != Status.OK:
                raise ShellError(f"bookie {address} refused the add: {Status(status).name}")
            for i in range(entries):
                status, resp = await c.call(ReadRequest(ledger_id=lid, entry_id=i))
                if status != Status.OK:
                    raise ShellError(f"bookie {address}: read of entry {i} answered "
                                     f"{Status(status).name}")
                e = decode_entry(d, resp.entry, ledger_id=lid, entry_id=i)  # type: ignore[union-attr]
                if e.payload != b"sanity %d" % i:
                    raise ShellError(f"bookie {address}: entry {i} came back different")
    _run(run)
    click.echo(f"ok: bookie {address} wrote and read back {entries} entries (ledger {lid}; "
               "the bookie's GC removes it, no metadata names it)")


# -- files -------------------------------------------------------------------------------


@shell.command("lastmark")
@click.option("--conf", type=click.Path(dir_okay=False, path_type=Path), required=True)
def lastmark(conf: Path) -> None:
    """The journal position the last checkpoint covers."""
    from ledgerd.disk.lastmark import read_last_mark

    cfg = _bookie_config(conf)
    mark = read_last_mark([Path(d) for d in cfg.ledger_directories])
    if mark is None:
        click.echo("no checkpoint yet (no lastMark file)")
    else:
        click.echo(f"journal file {mark[0]:x}.txn, offset {mark[1]}")


@shell.command("readjournal")
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True)
def readjournal(path: Path, as_json: bool) -> None:
    """Every record and gap of a journal file: offset, type, ledger, entry, size, CRC
    status; then where its data ends."""
    from ledgerd.disk.journal_format import RecordType
    from ledgerd.disk.journal_scan import ScanKind, inspect_journal

    rows = []
    torn_at = None
    end_at = None
    gaps = 0
    for item in inspect_journal(path):
        if item.kind is ScanKind.END:
            end_at = item.offset
            continue
        rec = item.record
        if item.kind is ScanKind.GAP:
            rtype = "GAP"
            gaps += 1
        else:
            try:
                rtype = RecordType(item.type).name
            except ValueError:
                rtype = f"?{item.type}"
        entry = rec.value if rec is not None and rec.type is RecordType.ENTRY else None
        rows.append({"offset": item.offset, "type": rtype,
                     "ledger": rec.ledger_id if rec is not None and rec.ledger_id >= 0 else None,
                     "entry": entry, "size": item.length,
                     "crc": ("-" if item.kind is ScanKind.GAP else
                             "ok" if item.crc_ok else "BAD"),
                     "problem": item.problem})
        if item.problem.startswith("torn tail") and torn_at is None:
            torn_at = item.offset
    records = len(rows) - gaps
    summary = f"{records} record(s)"
    if gaps:
        summary += f", {gaps} legacy gap(s) (zero bytes at a group's end, skipped)"
    if torn_at is not None:
        summary += f"; torn tail starts at offset {torn_at}"
    if end_at is not None:
        summary += f"; data ends at offset {end_at}"
    emit(as_json, {"records": rows, "gaps": gaps, "torn_tail_offset": torn_at,
                   "end_offset": end_at}, table(
        ["OFFSET", "TYPE", "LEDGER", "ENTRY", "SIZE", "CRC", "PROBLEM"],
        [list(r.values()) for r in rows]) + "\n" + summary)


@shell.command("readlog")
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True)
def readlog(path: Path, as_json: bool) -> None:
    """Every entry of an entry log and its ledgers map."""
    from ledgerd.disk.entrylog import inspect_entry_log

    ledgers, map_problem, records = inspect_entry_log(path)
    rows = [{"offset": r.offset, "ledger": r.ledger_id, "entry": r.entry_id, "size": r.size,
             "crc": "ok" if r.crc_ok else "BAD", "problem": r.problem} for r in records]
    lmap = None if ledgers is None else {str(k): v for k, v in sorted(ledgers.items())}
    bad = sum(1 for r in rows if r["problem"])
    human = table(["OFFSET", "LEDGER", "ENTRY", "SIZE", "CRC", "PROBLEM"],
                  [list(r.values()) for r in rows])
    human += f"\n{len(rows)} record(s), {bad} with problems\nledgers map: " + (
        f"unreadable: {map_problem}" if map_problem else
        "none (the log was not rolled)" if lmap is None else
        ", ".join(f"ledger {k}: {v} bytes" for k, v in lmap.items()) or "empty")
    emit(as_json, {"records": rows, "ledgers_map": lmap, "ledgers_map_problem": map_problem},
         human)


@shell.command("readindex")
@click.argument("ledger_id", type=int)
@click.option("--conf", type=click.Path(dir_okay=False, path_type=Path), required=True)
@click.option("--json", "as_json", is_flag=True)
def readindex(ledger_id: int, conf: Path, as_json: bool) -> None:
    """A ledger's index file: state and the location of every entry."""
    import struct

    from ledgerd.disk.index import index_path, read_index_file

    cfg = _bookie_config(conf)
    if cfg.ledger_storage_class == "db":
        _readindex_db(cfg, ledger_id, as_json)
        return
    found = [p for d in cfg.effective_index_directories
             if (p := index_path(Path(d), ledger_id)).exists()]
    if not found:
        raise ShellError(f"no index file for ledger {ledger_id} under "
                         f"{', '.join(cfg.effective_index_directories)} (a bookie writes "
                         "index files at its checkpoints; newer entries are in its journal)")
    idx, raw = read_index_file(found[0])
    locs = []
    for eid in range(len(raw) // 8):
        (loc,) = struct.unpack_from(">q", raw, eid * 8)
        if loc:
            log_id, offset = loc >> 32, loc & 0xFFFFFFFF
            locs.append({"entry": eid, "log": f"{log_id:x}.log", "offset": offset})
    head = {"ledger_id": idx.ledger_id, "file": str(found[0]), "fenced": idx.fenced,
            "term": idx.term, "has_master_key": bool(idx.master_key),
            "explicit_lac_bytes": len(idx.explicit_lac), "entries": len(locs)}
    human = "\n".join(f"{k:18} {v}" for k, v in head.items()) + "\n" + table(
        ["ENTRY", "LOG", "OFFSET"], [list(r.values()) for r in locs])
    emit(as_json, {**head, "locations": locs}, human)


def _readindex_db(cfg: Any, ledger_id: int, as_json: bool) -> None:
    """readindex on the db storage: the ledger's record in the LMDB store."""
    from ledgerd.disk.maintenance import open_db_index

    db = open_db_index([Path(d) for d in cfg.effective_index_directories])
    if db is None or ledger_id not in db.ledgers:
        if db is not None:
            db.close()
        raise ShellError(f"no ledger {ledger_id} in the db index under "
                         f"{cfg.effective_index_directories[0]} (a bookie writes it at its "
                         "checkpoints; newer entries are in its journal)")
    try:
        idx = db.ledgers[ledger_id]
        locs = [{"entry": eid, "log": f"{loc >> 32:x}.log", "offset": loc & 0xFFFFFFFF}
                for eid, loc in db.locations(ledger_id)]
    finally:
        db.close()
    head = {"ledger_id": ledger_id, "file": str(db.path), "fenced": idx.fenced,
            "term": idx.term, "has_master_key": bool(idx.master_key),
            "explicit_lac_bytes": len(idx.explicit_lac), "entries": len(locs)}
    human = "\n".join(f"{k:18} {v}" for k, v in head.items()) + "\n" + table(
        ["ENTRY", "LOG", "OFFSET"], [list(r.values()) for r in locs])
    emit(as_json, {**head, "locations": locs}, human)


@shell.group("cookie")
def cookie() -> None:
    """A bookie's cookie in ZooKeeper."""


@cookie.command("get")
@click.argument("bookie_id")
@click.option("--json", "as_json", is_flag=True, help="The cookie and its znode version as JSON.")
@click.pass_context
def cookie_get(ctx: click.Context, bookie_id: str, as_json: bool) -> None:
    """Print the cookie ZooKeeper holds for BOOKIE_ID."""
    from ledgerd.metadata.cookies import CookieStore

    async def run() -> tuple[bytes, int] | None:
        store = await _store(ctx)
        try:
            return await CookieStore(store, _root(ctx)).get(bookie_id)
        finally:
            await store.close()
    got = _run(run)
    if got is None:
        raise ShellError(f"no cookie for bookie {bookie_id} under {_root(ctx)}/cookies")
    try:
        doc: Any = json.loads(got[0])
    except ValueError:
        doc = got[0].decode("utf-8", "replace")  # not ours: shown as it is
    if as_json:
        emit(True, {"bookie_id": bookie_id, "cookie": doc, "version": got[1]}, "")
        return
    cookie = doc.get("cookie") if isinstance(doc, dict) else None
    if not isinstance(cookie, dict):
        click.echo(f"{doc}\n(version {got[1]})")
        return
    click.echo("\n".join(f"{k:16} {', '.join(v) if isinstance(v, list) else v}"
                         for k, v in sorted(cookie.items()))
               + f"\n(znode version {got[1]})")


@cookie.command("update")
@click.option("--conf", type=click.Path(dir_okay=False, path_type=Path), required=True)
@click.pass_context
def cookie_update(ctx: click.Context, conf: Path) -> None:
    """Rewrite the bookie's cookie (ZooKeeper and every directory) from its configuration,
    e.g. after moving a directory. The bookie must be stopped."""
    from ledgerd.disk.cookie import Cookie, stamp_cookies
    from ledgerd.metadata.cluster import instance_id
    from ledgerd.metadata.cookies import CookieStore

    cfg = _bookie_config(conf)
    bookie_id = cfg.effective_bookie_id
    _refuse_unnamed(ctx, "cookie update")

    async def run() -> Cookie:
        store = await _store(ctx)
        try:
            cookie = Cookie(bookie_id=bookie_id, journal_dir=cfg.journal_directory,
                            ledger_dirs=tuple(cfg.ledger_directories),
                            index_dirs=tuple(cfg.effective_index_directories),
                            instance_id=await instance_id(store, _root(ctx)))
            cookies = CookieStore(store, _root(ctx))
            got = await cookies.get(bookie_id)
            if got is None:
                await cookies.create(bookie_id, cookie.to_bytes())
            else:
                await cookies.update(bookie_id, cookie.to_bytes(), got[1])
            return cookie
        finally:
            await store.close()
    cookie = _run(run)
    stamp_cookies(cookie, [Path(cfg.journal_directory), *map(Path, cfg.ledger_directories)])
    click.echo(f"cookie of {bookie_id} updated in ZooKeeper and in "
               f"{1 + len(cfg.ledger_directories)} directories")


@shell.command("bookieformat")
@click.option("--conf", type=click.Path(dir_okay=False, path_type=Path), required=True)
@click.option("--force", is_flag=True, help="Do it without asking (required without a terminal).")
@click.option("--allow-underreplication", is_flag=True,
              help="Format even though ledgers still list this bookie (their entries on it "
                   "are lost until re-replicated).")
@click.pass_context
def bookieformat(ctx: click.Context, conf: Path, force: bool,
                 allow_underreplication: bool) -> None:
    """Delete a (stopped) bookie's journal, ledger and index data and its cookie, so it
    starts empty. Refuses while ledgers list it: run `ledgerd shell recover BOOKIE`
    first, so their copies are restored on other bookies."""
    from ledgerd.metadata.cookies import CookieStore
    from ledgerd.metadata.errors import NoNodeError

    cfg = _bookie_config(conf)
    dirs = [Path(cfg.journal_directory), *map(Path, cfg.ledger_directories),
            *map(Path, cfg.index_directories)]
    bookie_id = cfg.effective_bookie_id
    if _accepts_connections(bookie_id):
        raise ShellError(f"bookie {bookie_id} is running (its port accepts connections): "
                         "stop it first; formatting a live bookie loses what it acknowledges")
    if cfg.zk_servers:
        _refuse_unnamed(ctx, "bookieformat")
    files = [p for d in dirs if d.is_dir() for p in d.rglob("*") if p.is_file()]
    size = sum(p.stat().st_size for p in files)
    _confirm_destruction(
        f"bookieformat deletes bookie {bookie_id}'s data: {len(files)} file(s), "
        f"{size / (1 << 20):.1f} MiB in {', '.join(map(str, dirs))}"
        + (f", and its cookie in the cluster on {_zk(ctx)}" if cfg.zk_servers else ""), force)

    async def run() -> None:
        store = await _store(ctx, need_cluster=False)  # no cluster: nothing to check
        try:
            from ledgerd.metadata.registry import BookieRegistry

            live = await BookieRegistry(store, _root(ctx)).list_bookies()
            if bookie_id in live.writable or bookie_id in live.read_only:
                raise ShellError(f"bookie {bookie_id} is registered in ZooKeeper (running, "
                                 "or killed less than a session timeout ago): stop it first")
            if not allow_underreplication:
                from ledgerd.metadata.cluster import check_layout
                from ledgerd.metadata.ledgers import LedgerManager

                ledgers = LedgerManager(store, _root(ctx), await check_layout(store, _root(ctx)))
                listing = len(await ledgers.listing({bookie_id}))
                if listing:
                    raise ShellError(
                        f"{listing} ledger(s) still list {bookie_id}; formatting would leave "
                        f"them one copy short. With the bookie stopped, run `ledgerd shell "
                        f"recover {bookie_id}` first (or pass --allow-underreplication)")
            await CookieStore(store, _root(ctx)).delete(bookie_id)
        except NoNodeError:
            pass
        finally:
            await store.close()
    if cfg.zk_servers:
        _run(run)
    for d in dirs:
        if d.is_dir():
            for child in d.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                else:
                    os.unlink(child)
    click.echo(f"formatted bookie {bookie_id}: {len(dirs)} directories emptied, cookie removed")
