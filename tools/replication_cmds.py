"""``ledgerd shell`` verbs for re-replication and autorecovery, after BookKeeper's shell.

``recover``, ``decommissionbookie``, ``listunderreplicated``, ``whoisauditor``,
``triggeraudit``, ``autorecovery``, ``lostbookierecoverydelay`` and ``gensecret``. The
copying is ``ledgerd.replication``; credentials come from the cluster secret
(``--secret-file``, or ``cluster_secret_file`` in ``--conf``) or a ledger password.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click
import trio

from ledgerd.tools.output import emit, progress, table
from ledgerd.tools.shell import ShellError, _root, _run, _store, _zk, shell

__all__ = ["register"]


def _credentials(conf: Path | None, secret_file: Path | None, password: str | None) -> Any:
    from ledgerd.appliance.config import BookieConfig
    from ledgerd.base.credentials import read_cluster_secret
    from ledgerd.base.settings import load_config
    from ledgerd.replication import Credentials

    if password is not None:
        return Credentials(password=password.encode())
    if secret_file is not None:
        return Credentials(cluster_secret=read_cluster_secret(secret_file, "--secret-file"))
    if conf is not None:
        secret = load_config(BookieConfig, path=conf).cluster_secret()
        if secret:
            return Credentials(cluster_secret=secret)
    raise ShellError("copying needs the cluster secret: pass --secret-file FILE, or --conf "
                     "with cluster_secret_file set (or --password for one ledger)")


def _bookie_list(value: str) -> set[str]:
    from ledgerd.metadata.ledger import check_bookie_id

    out = set()
    for b in value.split(","):
        b = b.strip()
        if not b:
            continue
        try:
            out.add(check_bookie_id(b))
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="BOOKIE") from None
    if not out:
        raise click.BadParameter("name at least one bookie id (host:port)", param_hint="BOOKIE")
    return out


_CRED_OPTIONS = [
    click.option("--conf", type=click.Path(dir_okay=False, exists=True, path_type=Path),
                 help="A bookie's TOML file (its cluster_secret_file is used)."),
    click.option("--secret-file", type=click.Path(dir_okay=False, exists=True, path_type=Path),
                 help="The cluster secret file."),
    click.option("--password", default=None, help="The ledger's password instead of the "
                 "cluster secret (with --ledger)."),
]


def _cred_options(fn: Any) -> Any:
    for opt in reversed(_CRED_OPTIONS):
        fn = opt(fn)
    return fn


@shell.command("recover")
@click.argument("bookies")
@click.option("--target", default=None, help="Copy to this bookie (default: placement).")
@click.option("--ledger", "ledger_id", type=int, default=None, help="Only this ledger.")
@click.option("--dry-run", is_flag=True, help="Show what would be copied; change nothing.")
@click.option("--skip-open", is_flag=True,
              help="Leave open ledgers alone (default: fence and close them first).")
@click.option("--rate", type=click.IntRange(0, None), default=0,
              help="Bytes per second to copy per ledger (0 = unlimited).")
@_cred_options
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def recover_cmd(ctx: click.Context, bookies: str, target: str | None, ledger_id: int | None,
                dry_run: bool, skip_open: bool, rate: int, conf: Path | None,
                secret_file: Path | None, password: str | None, as_json: bool) -> None:
    """Copy every fragment that lists BOOKIE[,BOOKIE...] to other bookies and take it out
    of the ledgers' metadata. Exits 3 if some ledger could not be recovered."""
    import ledgerd
    from ledgerd.replication import Outcome, ReplicationOptions, rereplicate_ledger

    bad = _bookie_list(bookies)
    if password is not None and ledger_id is None:
        raise click.BadParameter("--password is one ledger's: pass --ledger too",
                                 param_hint="--password")
    creds = None if dry_run else _credentials(conf, secret_file, password)
    opts = ReplicationOptions(rate_bytes=rate)

    async def run() -> list[dict[str, Any]]:
        async with ledgerd.open_client(_zk(ctx), zk_ledgers_root_path=_root(ctx)) as client:
            if target is not None and target not in (await client.bookies()).writable:
                raise ShellError(f"target {target} is not a writable registered bookie")
            ids = [ledger_id] if ledger_id is not None else await client.ledgers.listing(bad)
            rows = []
            copied = [0, 0]

            def on_progress(entries: int, size: int) -> None:
                copied[0] += entries
                copied[1] += size

            from ledgerd.replication import Credentials
            with progress("recovering ledgers", len(ids)) as bar:
                for lid in ids:
                    result = await rereplicate_ledger(
                        client, lid, creds or Credentials(password=b""), opts,
                        bad_bookies=bad, check=False, close_open=not skip_open,
                        skip_open=skip_open, target=target, dry_run=dry_run,
                        progress=on_progress)
                    rows.append(result.as_dict())
                    bar.advance(1, f"{copied[0]} entries, {copied[1] / 1e6:.1f} MB")
            return rows

    rows = _run(run)
    failed = [r for r in rows if r["outcome"] == Outcome.FAILED.value]
    human = [table(["LEDGER", "OUTCOME", "FRAGMENTS", "ENTRIES", "BYTES", "DETAIL"],
                   [[r["ledger_id"], r["outcome"], r["fragments"], r["entries"], r["bytes"],
                     r["detail"] or ("; ".join(str(p) for p in r["plan"]) if dry_run else "")]
                    for r in rows]) if rows else f"no ledger lists {', '.join(sorted(bad))}"]
    if rows:
        human.append(f"{len(rows)} ledger(s): {len(rows) - len(failed)} done, "
                     f"{len(failed)} failed" + (" (dry run: nothing changed)" if dry_run else ""))
    emit(as_json, {"bookies": sorted(bad), "dry_run": dry_run, "ledgers": rows},
         "\n".join(human))
    if failed:
        sys.exit(3)


def _grace_s(grace: float | None, conf: Path | None) -> float:
    """The open-ledger grace period: --grace, else the --conf file's
    ``open_ledger_rereplication_grace_period_ms``, else its default (30 s)."""
    from ledgerd.appliance.config import BookieConfig
    from ledgerd.base.settings import load_config

    if grace is not None:
        return grace
    config = load_config(BookieConfig, path=conf) if conf is not None else BookieConfig()
    return config.open_ledger_rereplication_grace_period_ms / 1000


async def _drain(client: Any, bookie: str, admin_secret: str) -> None:
    """Make a running ``bookie`` refuse new adds (an admin READ_ONLY request) and wait
    until its registration says read-only: from then on its writers' adds answer
    READ_ONLY and they replace it in their ensembles themselves, so nothing of theirs
    needs fencing."""
    from ledgerd.metadata.registry import BookieSet
    from ledgerd.wire.messages import AdminKind, AdminTriggerRequest
    from ledgerd.wire.status import Status

    status, _, error = await client.pool.call(
        bookie, AdminTriggerRequest(kind=int(AdminKind.READ_ONLY),
                                    secret=admin_secret.encode()), 10.0)
    if error is not None or status != Status.OK:
        why = str(error) if error is not None else Status(status).name
        hint = {Status.UNAUTHORIZED: " (pass --admin-secret, or run this on its host)",
                Status.BAD_REQUEST: " (a bookie too old to drain: stop it, then "
                                    "decommission it without --live)"}.get(status, "")
        raise ShellError(f"{bookie} refused to turn read-only: {why}{hint}")

    async def read_only(members: BookieSet) -> bool:
        return bookie in members.read_only or bookie not in members.all

    with trio.fail_after(60):
        await client.registry.wait_for(read_only)


async def _refuse_without_spare(client: Any, bookie: str) -> None:
    """ShellError when a ledger that lists ``bookie`` has no writable bookie outside
    that ensemble: nothing can take its copies (not the workers, not this command)
    until a bookie is added, so waiting would only time out."""
    writable = set((await client.registry.list_bookies()).writable) - {bookie}
    for lid in (await client.ledgers.listing({bookie}))[:1000]:
        md = await client.ledger_metadata(lid)
        for _, ensemble in md.ensembles:
            if bookie in ensemble and not writable - set(ensemble):
                raise ShellError(
                    f"cannot drain {bookie}: ledger {lid}'s ensemble ({', '.join(ensemble)}) "
                    f"already holds every other writable bookie ({len(writable)}), so there "
                    "is no bookie to copy its entries to: add a bookie first")


@shell.command("decommissionbookie")
@click.argument("bookie")
@click.option("--live", is_flag=True,
              help="Drain a bookie that is still registered: it turns read-only first, "
                   "so its writers move off it themselves; stop it afterwards.")
@click.option("--timeout", type=float, default=3600.0, show_default=True,
              help="Give up after this many seconds.")
@click.option("--grace", type=click.FloatRange(0, None), default=None,
              help="Seconds an open ledger's writer gets to move off the bookie before "
                   "its ledger is fenced and closed (default: --conf's "
                   "open_ledger_rereplication_grace_period_ms, else 30).")
@click.option("--admin-secret", envvar="LEDGERD_ADMIN_SECRET", default="",
              help="With --live: the bookie's admin secret (needed from other hosts).")
@_cred_options
@click.pass_context
def decommission_cmd(ctx: click.Context, bookie: str, live: bool, timeout: float,
                     grace: float | None, admin_secret: str, conf: Path | None,
                     secret_file: Path | None, password: str | None) -> None:
    """Take BOOKIE out of the cluster for good: copy every fragment that lists it, wait
    until no ledger and no underreplication record references it, delete its cookie.

    Refuses while BOOKIE is registered (stop it first) unless --live, which first makes
    it refuse new adds (read-only) so that writers change ensemble themselves. With an
    auditor running and autorecovery enabled (and the bookie stopped), the workers do
    the copying (an audit is triggered); otherwise this command copies itself
    (credentials needed). Either way an open ledger's writer gets the grace period to
    move off the bookie before its ledger is fenced, as the workers give it."""
    import ledgerd
    from ledgerd.metadata.cookies import CookieStore
    from ledgerd.metadata.errors import NoNodeError
    from ledgerd.metadata.underreplication import AuditorElection, UnderreplicationManager
    from ledgerd.replication import Outcome, ReplicationOptions, rereplicate_ledger

    (b,) = _bookie_list(bookie)
    grace_s = _grace_s(grace, conf)

    async def run() -> tuple[int, str]:
        async with ledgerd.open_client(_zk(ctx), zk_ledgers_root_path=_root(ctx)) as client:
            members = await client.registry.list_bookies()
            if b in members.all and not live:
                raise ShellError(f"{b} is still registered (running); stop it first, or pass "
                                 "--live to drain it while it runs")
            urm = UnderreplicationManager(client.store, _root(ctx))
            auditor = await AuditorElection(client.store, _root(ctx)).current_auditor()
            by_workers = auditor is not None and await urm.is_enabled() and not live
            creds = None if by_workers else _credentials(conf, secret_file, password)
            assert by_workers or creds is not None
            if live and b in members.all:
                await _drain(client, b, admin_secret)
            await _refuse_without_spare(client, b)
            if by_workers:
                await urm.set_lost_bookie_delay(await urm.get_lost_bookie_delay() or 0)
            # Open ledgers whose last fragment lists the bookie, since when: each is
            # fenced only once its writer had the grace period to move off.
            waiting: dict[int, float] = {}
            with trio.fail_after(timeout), progress(f"draining {b}") as bar:
                while True:
                    left = await client.ledgers.listing({b})
                    pending = [r.ledger_id async for r in urm.list_underreplicated()
                               if b in r.missing_replicas]
                    if not left and not pending:
                        break
                    bar.advance(0, f"{len(left)} ledger(s) still list it, "
                                   f"{len(pending)} queued"
                                   + (f", {len(waiting)} open: their writers have "
                                      f"{grace_s:g}s to move" if waiting else ""))
                    if by_workers:
                        await trio.sleep(3)
                        continue
                    failures = []
                    assert creds is not None
                    for lid in left:
                        now = trio.current_time()
                        result = await rereplicate_ledger(
                            client, lid, creds, ReplicationOptions(), bad_bookies={b},
                            check=False,
                            close_open=now - waiting.get(lid, now) >= grace_s)
                        if result.outcome is Outcome.DEFERRED:
                            waiting.setdefault(lid, now)
                        elif result.outcome is Outcome.FAILED:
                            failures.append(f"ledger {lid}: {result.detail}")
                        else:
                            waiting.pop(lid, None)
                    if failures:
                        raise ShellError(f"could not drain {b}: " + "; ".join(failures[:3]))
                    for lid in pending:
                        await urm.mark_replicated(lid)
                    if waiting:
                        await trio.sleep(min(1.0, max(grace_s, 0.05)))
            try:
                await CookieStore(client.store, _root(ctx)).delete(b)
                cookie = "cookie removed"
            except NoNodeError:
                cookie = "no cookie"
            return len(left), cookie

    try:
        _, cookie = _run(run)
    except trio.TooSlowError:
        raise ShellError(f"{b} still referenced after {timeout:g}s; is autorecovery "
                         "running? (`ledgerd shell listunderreplicated`)") from None
    click.echo(f"decommissioned {b}: no ledger references it; {cookie}"
               + ("; it refuses adds until restarted: stop it now" if live else ""))


@shell.command("listunderreplicated")
@click.option("--missing-replica", default=None, help="Only ledgers missing this bookie.")
@click.option("--count", "count_only", is_flag=True, help="Only the number of ledgers.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def listunderreplicated(ctx: click.Context, missing_replica: str | None, count_only: bool,
                        as_json: bool) -> None:
    """Ledgers queued for re-replication, the bookies they miss, and the worker on each."""
    from ledgerd.metadata.underreplication import UnderreplicationManager

    async def run() -> list[dict[str, Any]]:
        store = await _store(ctx)
        try:
            urm = UnderreplicationManager(store, _root(ctx))
            rows = []
            async for rec in urm.list_underreplicated():
                if missing_replica and missing_replica not in rec.missing_replicas:
                    continue
                rows.append({"ledger_id": rec.ledger_id,
                             "missing_replicas": list(rec.missing_replicas),
                             "marked_ms": rec.ctime_ms,
                             "worker": await urm.lock_holder(rec.ledger_id)})
            return rows
        finally:
            await store.close()

    rows = _run(run)
    if count_only:
        emit(as_json, {"count": len(rows)}, str(len(rows)))
        return
    emit(as_json, rows, table(["LEDGER", "MISSING", "WORKER"],
                              [[r["ledger_id"], ",".join(r["missing_replicas"]) or "-",
                                r["worker"] or "-"] for r in rows])
         + f"\n{len(rows)} underreplicated ledger(s)")


@shell.command("whoisauditor")
@click.pass_context
def whoisauditor(ctx: click.Context) -> None:
    """The autorecovery process currently elected auditor."""
    from ledgerd.metadata.underreplication import AuditorElection

    async def run() -> str | None:
        store = await _store(ctx)
        try:
            return await AuditorElection(store, _root(ctx)).current_auditor()
        finally:
            await store.close()

    who = _run(run)
    if who is None:
        raise ShellError("no auditor is elected (is autorecovery running anywhere?)")
    click.echo(who)


@shell.command("triggeraudit")
@click.pass_context
def triggeraudit(ctx: click.Context) -> None:
    """Make the auditor audit lost bookies now (skipping lostbookierecoverydelay)."""
    from ledgerd.metadata.underreplication import AuditorElection, UnderreplicationManager

    async def run() -> str:
        store = await _store(ctx)
        try:
            urm = UnderreplicationManager(store, _root(ctx))
            if not await urm.is_enabled():
                raise ShellError("autorecovery is disabled (`ledgerd shell autorecovery "
                                 "--enable`)")
            who = await AuditorElection(store, _root(ctx)).current_auditor()
            if who is None:
                raise ShellError("no auditor is elected (is autorecovery running anywhere?)")
            await urm.set_lost_bookie_delay(await urm.get_lost_bookie_delay() or 0)
            return who
        finally:
            await store.close()

    click.echo(f"audit triggered on {_run(run)}")


@shell.command("autorecovery")
@click.option("--enable", "action", flag_value="enable", help="Turn autorecovery on.")
@click.option("--disable", "action", flag_value="disable", help="Turn it off cluster-wide.")
@click.option("--status", "action", flag_value="status", default=True, help="Show it.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def autorecovery_switch(ctx: click.Context, action: str, as_json: bool) -> None:
    """The cluster-wide autorecovery switch (every auditor and worker obeys it)."""
    from ledgerd.metadata.underreplication import AuditorElection, UnderreplicationManager

    async def run() -> dict[str, Any]:
        store = await _store(ctx)
        try:
            urm = UnderreplicationManager(store, _root(ctx))
            if action != "status":
                await urm.set_enabled(action == "enable")
            return {"enabled": await urm.is_enabled(),
                    "auditor": await AuditorElection(store, _root(ctx)).current_auditor(),
                    "underreplicated": await urm.count(),
                    "lost_bookie_recovery_delay_s": await urm.get_lost_bookie_delay()}
        finally:
            await store.close()

    d = _run(run)
    emit(as_json, d, f"autorecovery {'enabled' if d['enabled'] else 'DISABLED'}; auditor: "
                     f"{d['auditor'] or 'none'}; underreplicated ledgers: "
                     f"{d['underreplicated']}; lost bookie delay: "
                     f"{d['lost_bookie_recovery_delay_s'] if d['lost_bookie_recovery_delay_s'] is not None else 'unset'}")


@shell.command("lostbookierecoverydelay")
@click.option("--get", "get_", is_flag=True, help="Print the delay in seconds.")
@click.option("--set", "set_", type=click.IntRange(0, None), default=None,
              help="Set the delay in seconds (the auditor reschedules at once).")
@click.pass_context
def lostbookierecoverydelay(ctx: click.Context, get_: bool, set_: int | None) -> None:
    """How long the auditor waits before re-replicating a single lost bookie."""
    from ledgerd.metadata.underreplication import UnderreplicationManager

    if (set_ is None) == (not get_):
        raise click.UsageError("pass exactly one of --get and --set SECONDS")

    async def run() -> int | None:
        store = await _store(ctx)
        try:
            urm = UnderreplicationManager(store, _root(ctx))
            if set_ is not None:
                await urm.set_lost_bookie_delay(set_)
            return await urm.get_lost_bookie_delay()
        finally:
            await store.close()

    value = _run(run)
    click.echo("unset (the auditor creates it from its lost_bookie_recovery_delay_s)"
               if value is None else str(value))


@shell.command("gensecret")
@click.argument("path", type=click.Path(dir_okay=False, path_type=Path))
def gensecret(path: Path) -> None:
    """Write a new cluster secret to PATH (mode 600) for cluster_secret_file."""
    from ledgerd.base.credentials import generate_secret

    try:
        generate_secret(path)
    except FileExistsError:
        raise ShellError(f"{path} exists; the cluster secret is not overwritten (every "
                         "bookie and autorecovery process must hold the same one)") from None
    click.echo(f"wrote a new cluster secret to {path}; copy it to every bookie and "
               "autorecovery host and set cluster_secret_file")


def register() -> None:
    """The commands are declared on ``shell`` at import; this makes the import explicit."""


@shell.command("clusterinfo")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def clusterinfo(ctx: click.Context, as_json: bool) -> None:
    """One screen of cluster health: instance id, layout, bookies writable and read-only,
    ledger count, under-replicated ledgers, durability debt (`durability` for more), the
    auditor and the autorecovery switch."""
    from ledgerd.metadata.cluster import check_layout, instance_id
    from ledgerd.metadata.ledgers import LedgerManager
    from ledgerd.metadata.registry import BookieRegistry
    from ledgerd.metadata.underreplication import AuditorElection, UnderreplicationManager

    async def run() -> dict[str, Any]:
        store = await _store(ctx)
        try:
            layout = await check_layout(store, _root(ctx))
            listed = await BookieRegistry(store, _root(ctx)).list_bookies()
            urm = UnderreplicationManager(store, _root(ctx))
            ledgers = 0
            async for _ in LedgerManager(store, _root(ctx), layout).iter_ledger_ids():
                ledgers += 1
            return {"zk": _zk(ctx), "instance_id": await instance_id(store, _root(ctx)),
                    "layout": layout, "writable": sorted(listed.writable),
                    "read_only": sorted(listed.read_only), "ledgers": ledgers,
                    "underreplicated": await urm.count(),
                    "auditor": await AuditorElection(store, _root(ctx)).current_auditor(),
                    "autorecovery_enabled": await urm.is_enabled()}
        finally:
            await store.close()

    d = _run(run)
    from ledgerd.tools.durability_cmds import collect, summary_line

    d["durability"] = collect(ctx)
    health = "OK"
    if not d["writable"]:
        health = "NO WRITABLE BOOKIES"
    elif d["underreplicated"] or d["read_only"] or d["durability"]["short_ledgers"]:
        health = "DEGRADED"
    lines = [
        f"cluster          {d['zk']}{_root(ctx)}  ({health})",
        f"instance id      {d['instance_id']}",
        f"layout           {d['layout']}",
        f"bookies          {len(d['writable'])} writable, {len(d['read_only'])} read-only",
        *(f"  {b}  writable" for b in d["writable"]),
        *(f"  {b}  READ-ONLY" for b in d["read_only"]),
        f"ledgers          {d['ledgers']}",
        f"under-replicated {d['underreplicated']}",
        f"durability       {summary_line(d['durability'])}",
        f"auditor          {d['auditor'] or 'none'}",
        f"autorecovery     {'enabled' if d['autorecovery_enabled'] else 'DISABLED'}",
    ]
    emit(as_json, {**d, "health": health}, "\n".join(lines))
