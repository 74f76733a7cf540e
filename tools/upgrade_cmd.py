"""``ledgerd upgrade``: a stopped bookie's directories to this ledgerd's layout version.

BookKeeper's ``bookie upgrade / rollback / finalize`` (disk/layout.py does the files):
``upgrade`` keeps each directory's ``current/`` as ``previous/`` and stamps cookies of
this layout version, on disk and in ZooKeeper; ``--rollback`` puts ``previous/`` back
(and the old cookie in ZooKeeper); ``--finalize`` drops ``previous/``, after which the
upgrade cannot be undone. The bookie must be stopped. A bookie whose cookie holds
another layout version refuses to start with "upgrade needed: run ledgerd upgrade".
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import click
import trio

from ledgerd.appliance.config import BookieConfig
from ledgerd.base.settings import load_config

__all__ = ["upgrade_cmd"]


def _dirs(cfg: BookieConfig) -> list[Path]:
    seen: list[Path] = []
    for d in (cfg.journal_directory, *cfg.ledger_directories,
              *cfg.effective_index_directories):
        if Path(d) not in seen:
            seen.append(Path(d))
    return seen


async def _zk_cookie(cfg: BookieConfig, bookie_id: str, data: bytes | None) -> str:
    """Write ``data`` as the bookie's cookie in ZooKeeper (compare-and-set on the version
    read; None: leave it); what was done, for the output."""
    from ledgerd.metadata.cookies import CookieStore
    from ledgerd.metadata.zookeeper import ZooKeeperStore

    if not cfg.zk_servers or data is None:
        return "no ZooKeeper cookie (zk_servers is empty)" if not cfg.zk_servers else ""
    store = await ZooKeeperStore.connect(cfg.zk_servers, credentials=cfg.zk_credentials(),
                                         secure=cfg.zk_enable_security)
    try:
        cookies = CookieStore(store, cfg.zk_ledgers_root_path)
        got = await cookies.get(bookie_id)
        if got is None:
            await cookies.create(bookie_id, data)
        else:
            await cookies.update(bookie_id, data, got[1])
    finally:
        await store.close()
    return f"ZooKeeper cookie of {bookie_id} rewritten"


@click.command("upgrade")
@click.option("--conf", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="The bookie's TOML configuration (its directories and zk_servers).")
@click.option("--rollback", "action", flag_value="rollback",
              help="Put the previous layout back (until --finalize).")
@click.option("--finalize", "action", flag_value="finalize",
              help="Drop the previous layout: the upgrade can no longer be rolled back.")
@click.option("--upgrade", "action", flag_value="upgrade", default=True, hidden=True)
def upgrade_cmd(conf: Path, action: str) -> None:
    """Upgrade a stopped bookie's directories to this ledgerd's layout version (or roll
    the upgrade back, or finalize it), after BookKeeper's `bookie upgrade`."""
    from ledgerd.disk.cookie import LAYOUT_VERSION, Cookie
    from ledgerd.disk.errors import CookieMismatchError
    from ledgerd.disk.layout import finalize, rollback, upgrade
    from ledgerd.tools.shell import ShellError, _accepts_connections

    cfg = load_config(BookieConfig, path=conf)
    bookie_id = cfg.effective_bookie_id
    if _accepts_connections(bookie_id):
        raise ShellError(f"bookie {bookie_id} is running (its port accepts connections): "
                         "stop it first")
    dirs = _dirs(cfg)
    cookies = [Cookie.from_bytes(v.read_bytes(), str(v)) for d in dirs
               if (v := d / "current" / "VERSION").exists()]
    try:
        if action == "finalize":
            finalize(dirs)
            click.echo(f"finalized: {len(dirs)} directories keep layout_version "
                       f"{cookies[0].layout_version if cookies else '?'}; no rollback now")
            return
        if action == "rollback":
            previous = [d / "previous" / "VERSION" for d in dirs]
            old = (Cookie.from_bytes(previous[0].read_bytes(), str(previous[0]))
                   if previous[0].exists() else None)
            rollback(dirs)
            note = trio.run(_zk_cookie, cfg, bookie_id, old.to_bytes() if old else None)
            click.echo(f"rolled back: {len(dirs)} directories hold layout_version "
                       f"{old.layout_version if old else '?'} again" + (f"; {note}" if note else ""))
            return
        if not cookies:
            raise ShellError(f"no cookie in {dirs[0]}/current: a new bookie, nothing to "
                             "upgrade (it starts with this layout)")
        if cookies[0].layout_version == LAYOUT_VERSION:
            click.echo(f"nothing to do: layout_version is {LAYOUT_VERSION} already")
            return
        new = replace(cookies[0], layout_version=LAYOUT_VERSION)
        upgrade(dirs, new)
        note = trio.run(_zk_cookie, cfg, bookie_id, new.to_bytes())
    except CookieMismatchError as exc:
        raise ShellError(str(exc)) from None
    click.echo(f"upgraded {len(dirs)} directories from layout_version "
               f"{cookies[0].layout_version} to {LAYOUT_VERSION} (the old one kept as "
               f"previous/: `--rollback` undoes it, `--finalize` drops it)"
               + (f"; {note}" if note else ""))
