"""``ledgerd shell metadata``: disaster recovery of the cluster's ZooKeeper metadata.

``snapshot FILE`` exports every persistent node under the root (ledgers, logs and
cursors, layout and instance id, cookies, the autorecovery switch and under-replication
marks, the Kafka gateway's topics and groups) with versions and a checksum, while the
cluster runs; ``restore FILE`` writes one into an empty root (``--replace`` for a
non-empty one, after saying what it replaces); ``diff FILE`` compares one with the
live tree; ``gc-freeze`` shows, sets or clears the flag that stops every bookie's GC
from deleting ledgers while restored or rebuilt metadata is unconfirmed. The logic is
``metadata.snapshot`` (pure) and ``metadata.backup`` (the live tree).
"""

from __future__ import annotations

import datetime
import json
import os
from pathlib import Path
from typing import Any

import click
import trio

from ledgerd.tools.output import emit, table
from ledgerd.tools.shell import (
    ShellError,
    _confirm_destruction,
    _refuse_unnamed,
    _root,
    _run,
    _store,
    _zk,
    shell,
)

__all__ = ["metadata_group", "register"]


def register() -> None:
    """The commands are declared on ``shell`` at import; this makes the import explicit."""


@shell.group("metadata")
def metadata_group() -> None:
    """Snapshots, restore, diff and rebuild of the cluster's metadata (disaster recovery)."""


def _when(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).strftime(
        "%Y-%m-%d %H:%M:%S UTC")


def _load(path: Path) -> Any:
    from ledgerd.metadata.snapshot import Snapshot

    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ShellError(f"cannot read snapshot {path}: {exc.strerror or exc}") from None
    return Snapshot.from_bytes(raw, str(path))


def _write_atomically(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def _summary_lines(summary: dict[str, Any]) -> list[str]:
    keys = ("ledgers", "logs", "cursors", "cookies", "underreplicated", "kafka_topics",
            "kafka_groups")
    return [f"  {k:<18}{summary.get(k, 0)}" for k in keys] + [
        f"  {'autorecovery':<18}{'enabled' if summary.get('autorecovery_enabled') else 'DISABLED'}",
        f"  {'instance id':<18}{summary.get('instance_id', '')}",
        f"  {'layout':<18}{summary.get('layout', '')}"]


@metadata_group.command("snapshot")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--max-passes", type=click.IntRange(2, 100), default=5, show_default=True,
              help="Read passes before settling for nodes that keep changing.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def snapshot_cmd(ctx: click.Context, file: Path, max_passes: int, as_json: bool) -> None:
    """Write a consistent export of the cluster's metadata to FILE (atomically)."""
    from ledgerd.metadata.backup import take_snapshot

    if file.parent and not file.parent.is_dir():
        raise ShellError(f"cannot write {file}: {file.parent} is not a directory")

    async def run() -> Any:
        store = await _store(ctx)
        try:
            return await take_snapshot(store, _root(ctx), max_passes=max_passes)
        finally:
            await store.close()

    snap = _run(run)
    data = snap.to_bytes()
    try:
        _write_atomically(file, data)
    except OSError as exc:
        raise ShellError(f"cannot write {file}: {exc.strerror or exc}") from None
    summary = snap.summary()
    doc = {"file": str(file), "bytes": len(data), "root": snap.root, "taken_ms": snap.taken_ms,
           "passes": snap.passes, "unstable": list(snap.unstable), "summary": summary,
           "counters": dict(snap.counters)}
    lines = [f"snapshot of {_zk(ctx)}{snap.root} at {_when(snap.taken_ms)} -> {file} "
             f"({len(data)} bytes, {len(snap.nodes)} nodes, {snap.passes} passes)",
             *_summary_lines(summary)]
    if snap.unstable:
        lines.append(f"warning: {len(snap.unstable)} node(s) kept changing during the read "
                     f"(their latest value is kept): {', '.join(snap.unstable[:5])}")
    emit(as_json, doc, "\n".join(lines))


def _read_snapshot_file(path: Path) -> Any:
    """``SnapshotFile`` for one file: verified (its checksum), or invalid with why."""
    from ledgerd.metadata.errors import CorruptMetadataError
    from ledgerd.metadata.retention import SnapshotFile
    from ledgerd.metadata.snapshot import Snapshot

    mtime_ms = int(path.stat().st_mtime * 1000)
    try:
        snap = Snapshot.from_bytes(path.read_bytes(), str(path))
    except (OSError, CorruptMetadataError) as exc:
        return SnapshotFile(name=path.name, taken_ms=mtime_ms, is_valid=False,
                            problem=str(exc) or type(exc).__name__)
    return SnapshotFile(name=path.name, taken_ms=snap.taken_ms or mtime_ms, is_valid=True)


@metadata_group.command("prune")
@click.argument("directory", type=click.Path(file_okay=False, exists=True, path_type=Path))
@click.option("--keep", type=click.IntRange(1, None), default=24, show_default=True,
              help="Valid snapshots always kept, the newest, however old.")
@click.option("--max-age-days", type=click.FloatRange(0, None), default=7.0,
              show_default=True,
              help="Other snapshots are deleted once older than this.")
@click.option("--pattern", default="metadata-*.snap", show_default=True)
@click.option("--dry-run", is_flag=True, help="Say what would be deleted; delete nothing.")
@click.option("--json", "as_json", is_flag=True)
def prune_cmd(directory: Path, keep: int, max_age_days: float, pattern: str, dry_run: bool,
              as_json: bool) -> None:
    """Delete old snapshots from DIRECTORY, never the newest --keep that verify.

    Files are verified (checksum) newest first until --keep valid ones are found; any
    other file older than --max-age-days is deleted. The only valid snapshot is never
    deleted, whatever its age. Needs no ZooKeeper."""
    import time

    from ledgerd.metadata.retention import SnapshotFile, plan_prune

    paths = sorted(directory.glob(pattern), key=lambda p: p.stat().st_mtime, reverse=True)
    now = time.time()
    # Nothing old enough to delete: nothing is read (a large cluster's snapshots are
    # tens of megabytes each, and the timer runs hourly).
    any_old = any(now - p.stat().st_mtime > max_age_days * 86_400 for p in paths)
    files: list[SnapshotFile] = []
    valid = 0
    for p in paths:
        if any_old and valid < keep:
            f = _read_snapshot_file(p)
            valid += bool(f.is_valid)
        else:
            f = SnapshotFile(name=p.name, taken_ms=int(p.stat().st_mtime * 1000),
                             is_valid=None)
        files.append(f)
    decision = plan_prune(files, keep=keep, max_age_ms=int(max_age_days * 86_400_000),
                          now_ms=int(now * 1000))
    deleted: list[str] = []
    if not dry_run:
        for name in decision.delete:
            try:
                (directory / name).unlink()
            except FileNotFoundError:
                continue
            deleted.append(name)
    invalid = {f.name: f.problem for f in files if f.is_valid is False}
    doc = {"directory": str(directory), "keep": keep, "max_age_days": max_age_days,
           "dry_run": dry_run, "delete": list(decision.delete), "deleted": deleted,
           "kept_newest_valid": list(decision.kept_newest),
           "kept_recent": list(decision.kept_recent), "invalid": invalid}
    lines = [f"{directory}: {len(files)} snapshot file(s); kept the newest "
             f"{len(decision.kept_newest)} valid (--keep {keep}) and "
             f"{len(decision.kept_recent)} younger than {max_age_days:g} days; "
             + (f"would delete {len(decision.delete)}" if dry_run
                else f"deleted {len(deleted)}")]
    if any_old and not decision.kept_newest:
        lines.append("warning: no snapshot here verifies: none can be restored")
    lines += [f"invalid: {name}: {why}" for name, why in sorted(invalid.items())]
    emit(as_json, doc, "\n".join(lines))


@metadata_group.command("diff")
@click.argument("file", type=click.Path(dir_okay=False, exists=True, path_type=Path))
@click.option("--paths", "show_paths", is_flag=True, help="List every differing path.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def diff_cmd(ctx: click.Context, file: Path, show_paths: bool, as_json: bool) -> None:
    """Compare a snapshot FILE with the live metadata (by category; exit 0 either way)."""
    from ledgerd.metadata.backup import read_tree
    from ledgerd.metadata.errors import NoNodeError
    from ledgerd.metadata.snapshot import diff_nodes

    snap = _load(file)

    async def run() -> Any:
        store = await _store(ctx, need_cluster=False)
        try:
            try:
                return await read_tree(store, _root(ctx))
            except NoNodeError:
                return {}
        finally:
            await store.close()

    live = _run(run)
    d = diff_nodes(snap.nodes, live.values())
    cats = d.by_category(snap.layout)
    doc = {"file": str(file), "root": _root(ctx), "same": d.is_empty, "by_category": cats,
           "only_snapshot": list(d.only_a), "only_live": list(d.only_b),
           "changed": list(d.changed), "version_only": list(d.version_only)}
    if d.is_empty:
        human = (f"live metadata under {_root(ctx)} matches {file}"
                 + (f" ({len(d.version_only)} node(s) at other versions)"
                    if d.version_only else ""))
    else:
        rows = [[c, r["only_snapshot"], r["only_live"], r["changed"]] for c, r in cats.items()]
        human = (f"{file} (taken {_when(snap.taken_ms)}) against {_zk(ctx)}{_root(ctx)}:\n"
                 + table(["category", "only in snapshot", "only live", "changed"], rows))
        if show_paths:
            human += "\n" + "\n".join(
                [f"- {p}" for p in d.only_a] + [f"+ {p}" for p in d.only_b]
                + [f"~ {p}" for p in d.changed])
    emit(as_json, doc, human)


@metadata_group.command("restore")
@click.argument("file", type=click.Path(dir_okay=False, exists=True, path_type=Path))
@click.option("--replace", is_flag=True,
              help="Delete whatever the root holds first (refused without it).")
@click.option("--force", is_flag=True,
              help="With --replace: do it without asking (required without a terminal).")
@click.option("--no-versions", "no_versions", is_flag=True,
              help="Create nodes at version 0 instead of their snapshot versions.")
@click.option("--id-gap", type=click.IntRange(0, 1 << 30), default=10_000, show_default=True,
              help="Ledger ids to skip past the snapshot's counter when the bookies cannot "
                   "say how far ledgers created after the snapshot went.")
@click.option("--id-margin", type=click.IntRange(0, 1 << 30), default=10_000,
              show_default=True,
              help="Ledger ids to skip past the highest one the bookies hold.")
@click.option("--bookies", default="", help="Bookies to ask for their highest ledger id "
              "(host:port,...), besides the registered ones and those with cookies in the "
              "snapshot.")
@click.option("--secret", envvar="LEDGERD_ADMIN_SECRET", default="",
              help="The bookies' admin_secret (needed from other hosts).")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def restore_cmd(ctx: click.Context, file: Path, replace: bool, force: bool,
                no_versions: bool, id_gap: int, id_margin: int, bookies: str, secret: str,
                as_json: bool) -> None:
    """Write snapshot FILE into the root: into an empty one, or with --replace over a
    non-empty one (says what it replaces). Sets the GC freeze flag; clear it with
    `metadata gc-freeze --clear` once `metadata rebuild` finds nothing missing.

    The ledger id counter goes --id-margin past the highest ledger id the bookies hold
    (asked by LedgerHoldings), or --id-gap past the snapshot's when they do not answer
    (at least that when some do not)."""
    from ledgerd.metadata.backup import read_tree, restore_snapshot
    from ledgerd.metadata.errors import NoNodeError
    from ledgerd.metadata.registry import BookieRegistry
    from ledgerd.metadata.snapshot import category, diff_nodes, restore_id_gap
    from ledgerd.tools.metadata_rebuild import max_held_ledger_id

    _refuse_unnamed(ctx, "metadata restore")
    snap = _load(file)
    root = _root(ctx)
    targets = {b.strip() for b in bookies.split(",") if b.strip()}
    snap_layout = snap.layout  # a scan of the nodes: once, not per node
    targets |= {n.path.split("/", 1)[1] for n in snap.nodes
                if category(n.path, snap_layout) == "cookies"}

    async def run() -> Any:
        store = await _store(ctx, need_cluster=False)
        try:
            if await store.exists(f"{root}/available") is not None:
                targets.update((await BookieRegistry(store, root).list_bookies()).all)
            held_max, unreachable = await max_held_ledger_id(targets, secret.encode())
            chosen = restore_id_gap(snap.counters.get("idgen", 0), held_max=held_max,
                                    all_answered=bool(targets) and not unreachable,
                                    default_gap=id_gap, margin=id_margin)
            try:
                live = await read_tree(store, root)
            except NoNodeError:
                live = {}
            live.pop("", None)
            replaced: dict[str, Any] = {}
            if live:
                d = diff_nodes(snap.nodes, live.values())
                replaced = {"nodes": len(live), "by_category": d.by_category(snap.layout)}
                if not replace:
                    rows = ", ".join(f"{c}: {r['only_live']} only live, {r['changed']} "
                                     f"changed" for c, r in d.by_category(snap.layout).items()
                                     if r["only_live"] or r["changed"])
                    raise ShellError(
                        f"{root} is not empty ({len(live)} nodes; {rows or 'same content'}); "
                        "a restore would replace all of it: pass --replace (see `metadata "
                        "diff FILE`)")
                facts = ", ".join(f"{c}: {r['only_live'] + r['changed']}" for c, r in
                                  replaced["by_category"].items()
                                  if r["only_live"] or r["changed"])
                await trio.to_thread.run_sync(lambda: _confirm_destruction(
                    f"restore would delete all {len(live)} nodes under {root} on {_zk(ctx)} "
                    f"(not in the snapshot or changed since: {facts or 'none'})", force,
                    json_out=as_json))
            written = await restore_snapshot(
                store, root, snap, replace=replace, versions=not no_versions,
                id_gap=chosen.gap,
                reason=f"restored from {file.name} (taken {_when(snap.taken_ms)})")
            return written, replaced, chosen, held_max, unreachable
        finally:
            await store.close()

    written, replaced, chosen, held_max, unreachable = _run(run)
    counter = snap.counters.get("idgen", 0)
    doc = {"file": str(file), "root": root, "nodes_written": written, "replaced": replaced,
           "gc_frozen": True, "id_gap": chosen.gap, "id_gap_reason": chosen.reason,
           "id_counter_at_least": counter + chosen.gap, "bookies_max_ledger_id": held_max,
           "unreachable": unreachable}
    human = (f"restored {written} nodes of {file} (taken {_when(snap.taken_ms)}) into "
             f"{_zk(ctx)}{root}" + (f", replacing {replaced['nodes']} nodes" if replaced
                                    else "")
             + f"\nledger ids start at {counter + chosen.gap} or beyond: the snapshot's "
               f"counter {counter} + gap {chosen.gap} ({chosen.reason})"
             + "".join(f"\nunreachable: {b}: {e}" for b, e in sorted(unreachable.items()))
             + f"\nGC is frozen on every bookie: run `ledgerd shell metadata rebuild --snapshot "
               f"{file}` to add ledgers created after the snapshot (and the fragments open "
               "ledgers gained since), then `ledgerd shell metadata gc-freeze --clear`")
    emit(as_json, doc, human)


@metadata_group.command("gc-freeze")
@click.option("--set", "set_", metavar="REASON", default=None,
              help="Freeze GC on every bookie, recording REASON.")
@click.option("--clear", is_flag=True, help="Let bookies' GC delete ledgers again.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def gc_freeze_cmd(ctx: click.Context, set_: str | None, clear: bool, as_json: bool) -> None:
    """Show, set or clear the GC freeze flag (<root>/gcfreeze)."""
    from ledgerd.metadata.backup import clear_freeze, freeze_state, set_freeze

    if set_ is not None and clear:
        raise click.BadParameter("give --set or --clear, not both", param_hint="--set")
    if set_ is not None or clear:
        _refuse_unnamed(ctx, "metadata gc-freeze")

    async def run() -> Any:
        store = await _store(ctx)
        try:
            if set_ is not None:
                await set_freeze(store, _root(ctx), set_)
            elif clear:
                await clear_freeze(store, _root(ctx))
            return await freeze_state(store, _root(ctx))
        finally:
            await store.close()

    state = _run(run)
    human = ("GC frozen: " + str(state.get("reason", "")) if state is not None
             else "GC not frozen: bookies delete ledgers the metadata no longer lists")
    emit(as_json, {"frozen": state is not None, "flag": state}, human)


async def _instance_at(store: Any, root: str) -> str:
    """The instance id the root holds now ("" if none)."""
    from ledgerd.metadata.errors import NoNodeError

    try:
        raw, _ = await store.get(f"{root}/INSTANCEID")
    except NoNodeError:
        return ""
    return bytes(raw or b"").decode().strip()


def _plan_rows(plans: Any) -> list[list[Any]]:
    rows = []
    for p in plans:
        md = p.metadata
        if md is None:
            rows.append([p.ledger_id, "-", "-", "-", ",".join(p.holders), p.source,
                         "; ".join(p.problems)])
            continue
        ens = " ".join(f"{first}:{'/'.join(b)}" for first, b in md.ensembles)
        state = "closed" if md.is_closed else "open"
        rows.append([p.ledger_id, f"{md.ensemble_size}/{md.write_quorum}/{md.ack_quorum}",
                     f"{state}, end {p.end}", md.digest_type, ens, p.source,
                     "; ".join([*p.problems, *(f"assumed {a}" for a in p.assumed)])])
    return rows


@metadata_group.command("rebuild")
@click.option("--snapshot", "snapshot_file", type=click.Path(dir_okay=False, exists=True,
                                                             path_type=Path),
              help="The latest snapshot: what bookies cannot know comes from it.")
@click.option("--bookies", default="", help="Bookies to ask (host:port,...), besides the "
              "registered ones and those with cookies in the snapshot.")
@click.option("--layout", type=click.Choice(["hierarchical", "flat"]), default=None,
              help="The ledger layout when neither ZooKeeper nor the snapshot says.")
@click.option("--secret", envvar="LEDGERD_ADMIN_SECRET", default="",
              help="The bookies' admin_secret (needed from other hosts).")
@click.option("--apply", "do_apply", is_flag=True,
              help="Write the plan (without it, nothing is written).")
@click.option("--secret-file", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="The cluster secret (cluster_secret_file): with --apply, fence and close "
                   "every rebuilt ledger now by recovery.")
@click.option("--allow-unreachable", is_flag=True,
              help="With --apply: write the plan although some bookies did not answer "
                   "(their entries are missing from it; without a snapshot their "
                   "ledgers' ensembles and ends can be wrong).")
@click.option("--rows", type=click.IntRange(0, None), default=200, show_default=True,
              help="Ledgers the printed plan shows, those with problems first (0: all).")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def rebuild_cmd(ctx: click.Context, snapshot_file: Path | None, bookies: str,
                layout: str | None, secret: str, do_apply: bool, secret_file: Path | None,
                allow_unreachable: bool, rows: int, as_json: bool) -> None:
    """Rebuild ledger metadata missing from ZooKeeper from what the bookies hold (a dry
    run prints the plan; --apply writes it and freezes GC until `gc-freeze --clear`).

    Rebuilt ledgers are written OPEN (bookies cannot tell a closed ledger from one still
    written): the first open with recovery fences and closes each at the end the plan
    shows, or --secret-file does it now."""
    from ledgerd.metadata.cluster import read_layout
    from ledgerd.metadata.registry import BookieRegistry
    from ledgerd.metadata.snapshot import category
    from ledgerd.tools import metadata_rebuild as rb

    if do_apply:
        _refuse_unnamed(ctx, "metadata rebuild --apply")
    snap = _load(snapshot_file) if snapshot_file is not None else None
    root = _root(ctx)
    named = {b.strip() for b in bookies.split(",") if b.strip()}

    async def run() -> Any:
        store = await _store(ctx, need_cluster=False)
        try:
            found_layout = await read_layout(store, root)
            use_layout = found_layout or (snap.layout if snap else None) or layout \
                or "hierarchical"
            targets = set(named)
            if await store.exists(f"{root}/available") is not None:
                listed = await BookieRegistry(store, root).list_bookies()
                targets |= set(listed.all)
            if snap is not None:
                snap_layout = snap.layout  # a scan of the nodes: once, not per node
                targets |= {n.path.split("/", 1)[1] for n in snap.nodes
                            if category(n.path, snap_layout) == "cookies"}
            if not targets:
                raise ShellError("no bookie to ask: none is registered and no snapshot names "
                                 "any; pass --bookies host:port,...")
            gathered = await rb.gather(targets, secret.encode())
            if not gathered.held and gathered.unreachable:
                raise ShellError("no bookie answered: " + "; ".join(
                    f"{b}: {e}" for b, e in sorted(gathered.unreachable.items())))
            ids = {i for i in gathered.instance_ids.values() if i}
            if len(ids) > 1:
                raise ShellError(f"bookies belong to different cluster instances: "
                                 f"{sorted(ids)}")
            the_plan = await rb.plan(store, root, use_layout, gathered, snap)
            written = None
            if do_apply:
                if gathered.unreachable and not allow_unreachable:
                    raise ShellError(
                        "not applied: " + ", ".join(sorted(gathered.unreachable)) +
                        " did not answer, so the plan lacks their entries (ensembles and "
                        "ends could be wrong and their ledgers missing); start them and "
                        "run again, or pass --allow-unreachable")
                instance = next(iter(ids), "") or (snap.instance_id if snap else "")
                if not instance:
                    raise ShellError("cannot tell the cluster's instance id (no bookie "
                                     "reported one, no snapshot)")
                live_instance = await _instance_at(store, root)
                if live_instance and live_instance != instance:
                    raise ShellError(
                        f"not applied: {root} holds cluster instance {live_instance}, the "
                        f"bookies' is {instance} (a re-initialised root): restore a "
                        f"snapshot of the bookies' cluster, or empty the root first")
                written = await rb.apply_plan(store, root, use_layout, instance, the_plan)
            return the_plan, gathered, written, use_layout
        finally:
            await store.close()

    async def close_all(the_plan: Any) -> dict[int, str]:
        from ledgerd.base.credentials import read_cluster_secret

        assert secret_file is not None
        return await rb.close_rebuilt(_zk(ctx), the_plan,
                                      read_cluster_secret(secret_file, "--secret-file"))

    the_plan, gathered, written, use_layout = _run(run)
    closing = _run(close_all, the_plan) if do_apply and secret_file is not None else {}
    doc = {"root": root, "layout": use_layout, "applied": do_apply, "written": written,
           "closed": {str(k): v for k, v in closing.items()},
           "skipped_live": the_plan.skipped_live, "lost": list(the_plan.lost),
           "unreachable": gathered.unreachable,
           # Built only for --json: 100,000 ledgers' metadata is seconds of encoding.
           "ledgers": [{"ledger_id": p.ledger_id, "source": p.source, "holders": p.holders,
                        "problems": list(p.problems), "assumed": list(p.assumed),
                        "end": p.end,
                        "metadata": (json.loads(p.metadata.to_json())
                                     if p.metadata is not None else None),
                        **({"update": True} if p.update else {})}
                       for p in the_plan.ledgers] if as_json else [],
           "logs": [{"name": lp.name, "ledgers": list(lp.ledgers), "base": lp.base,
                     "first_seq": lp.first_seq, "problems": list(lp.problems),
                     "left_out": list(lp.left_out)} for lp in the_plan.logs],
           "logs_live": list(the_plan.live_logs),
           "kafka_topics": [{"name": tp.name, "from_ledger": tp.ledger_id,
                             "record": json.loads(tp.record.to_json()),
                             "problems": list(tp.problems)} for tp in the_plan.topics],
           "kafka_topics_live": list(the_plan.live_topics),
           "corrupt_log_headers": {str(k): v for k, v in gathered.corrupt_headers.items()}}
    lines = [f"rebuild of {_zk(ctx)}{root}: {len(the_plan.writable)} ledger(s) to write, "
             f"{len(the_plan.ledgers) - len(the_plan.writable)} not rebuildable, "
             f"{the_plan.skipped_live} already in the live metadata, "
             f"{len(the_plan.logs)} log(s) and {len(the_plan.topics)} Kafka topic(s) from "
             f"their ledgers' headers"]
    if the_plan.ledgers:
        # Ledgers with problems first; at most --rows of them (--json lists every one).
        shown = sorted(the_plan.ledgers, key=lambda p: (not p.problems, p.ledger_id))
        if rows:
            shown = shown[:rows]
        lines.append(table(["ledger", "E/Qw/Qa", "state", "digest", "ensembles", "from",
                            "notes"], _plan_rows(shown)))
        if len(shown) < len(the_plan.ledgers):
            lines.append(f"... and {len(the_plan.ledgers) - len(shown)} more ledger(s) "
                         f"(--rows 0 or --json shows every one)")
    for lp in the_plan.logs:
        lines.append(f"log {lp.name}: ledgers {' '.join(map(str, lp.ledgers))} (from position "
                     f"{lp.first_seq}, offset {lp.base}); cursors lost"
                     + "".join(f"; {what}" for what in lp.problems))
    if the_plan.live_logs:
        lines.append(f"logs already in the live metadata (left alone): "
                     f"{', '.join(the_plan.live_logs)}")
    for tp in the_plan.topics:
        configs = ",".join(f"{k}={v}" for k, v in sorted(tp.record.configs.items())) or "-"
        lines.append(f"kafka topic {tp.name}: {tp.record.partitions} partition(s), id "
                     f"{tp.record.topic_id or '-'}, configs {configs} (from ledger "
                     f"{tp.ledger_id}'s header); group offsets lost"
                     + "".join(f"; {what}" for what in tp.problems))
    if the_plan.live_topics:
        lines.append(f"kafka topics live or in the snapshot (left alone): "
                     f"{', '.join(the_plan.live_topics)}")
    for lid, why in sorted(gathered.corrupt_headers.items()):
        lines.append(f"ledger {lid}: entry 0 is a corrupt log header ({why}): its log is "
                     "not rebuilt from it")
    for b, e in sorted(gathered.unreachable.items()):
        lines.append(f"unreachable: {b}: {e}")
    for what in the_plan.lost:
        lines.append(f"lost: {what}")
    for lid, what in sorted(closing.items()):
        lines.append(f"ledger {lid}: {what}")
    lines.append(f"wrote {written} ledger(s); GC is frozen until `ledgerd shell metadata "
                 "gc-freeze --clear`" if do_apply else "dry run: nothing written (--apply "
                                                         "writes)")
    emit(as_json, doc, "\n".join(lines))
