"""Which cluster a tool acts on, and whether it may write there.

A tool (``ledgerd shell``, ``ledgerd bookie``) reaches a cluster named one of four ways,
strongest first:

- ``FLAG``: ``--zk HOSTS`` on its command line (or a bookie's ``zk_servers`` in its own
  file);
- ``ENV``: ``LEDGERD_ZK_SERVERS`` exported in the shell;
- ``LOCAL``: the one ``ledgerd local`` running on this machine (found by its control
  socket under the temp directory, as ``ledgerd local ctl`` finds it);
- ``DEFAULT``: 127.0.0.1:2181, named by nobody.

Reading is fine from any of them. Writing cookies or cluster metadata (initialising,
formatting, stamping a cookie) happens only in a cluster the user named (``FLAG`` or
``ENV``): a tool must never create a cluster, or join one, because of a guess. And a
bookie whose file names one cluster while ``LEDGERD_ZK_SERVERS`` names another does not
write its first cookie into the environment's: an exported variable meant for the shell
must not move a new bookie into another cluster (issue 48: a second ``ledgerd local``
registered its bookies in the first one's ZooKeeper).

The decisions here are pure; the callers do the I/O.
"""

from __future__ import annotations

import enum
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DEFAULT_ZK", "Source", "Target", "env_override_problem", "find_local_clusters",
           "resolve", "unnamed_write_problem"]

DEFAULT_ZK = "127.0.0.1:2181"
CTL_SOCKET = "ctl.sock"  # tools/localcluster.py's control socket


class Source(enum.Enum):
    FLAG = "--zk"
    ENV = "LEDGERD_ZK_SERVERS"
    LOCAL = "a running `ledgerd local`"
    DEFAULT = "the default"


@dataclass(frozen=True, slots=True, kw_only=True)
class Target:
    """A cluster to act on: its ZooKeeper, its root (None: the tool's own default), how
    it was named, and (``LOCAL``) the data directory of the ``ledgerd local`` found."""

    zk: str
    source: Source
    root: str | None = None
    local_data: Path | None = None

    @property
    def is_named(self) -> bool:
        """Named by the user (flag or environment): a tool may write cookies and cluster
        metadata here."""
        return self.source in (Source.FLAG, Source.ENV)

    def describe(self) -> str:
        """How the cluster was found, for a notice on stderr."""
        if self.source is Source.LOCAL:
            return (f"using the `ledgerd local` in {self.local_data} (ZooKeeper {self.zk}); "
                    "--zk or LEDGERD_ZK_SERVERS names another cluster")
        return f"ZooKeeper {self.zk} ({self.source.value})"


def find_local_clusters(tmpdir: Path | None = None) -> list[Path]:
    """The data directories of this user's ``ledgerd local`` clusters running without
    ``--data`` (their control socket is under the temp directory), oldest first. A
    directory another user owns is not one (anyone can create one in /tmp)."""
    base = Path(tmpdir or tempfile.gettempdir())
    socks = []
    me = os.getuid()
    for sock in base.glob(f"ledgerd-local-*/{CTL_SOCKET}"):
        try:
            if sock.parent.stat().st_uid != me or sock.stat().st_uid != me:
                continue
            socks.append((sock.stat().st_mtime, sock.parent))
        except OSError:  # it stopped meanwhile
            continue
    return [p for _, p in sorted(socks)]


def resolve(*, flag: str | None, env: str | None, local: list[tuple[Path, str, str]]
            ) -> Target:
    """The cluster a shell acts on: ``--zk``, else ``LEDGERD_ZK_SERVERS``, else the one
    running ``ledgerd local`` (``local``: (data directory, ZooKeeper, root) of each that
    answered), else the default. Several running local clusters and no name: ValueError
    saying which to name."""
    if flag:
        return Target(zk=flag, source=Source.FLAG)
    if env:
        return Target(zk=env, source=Source.ENV)
    if len(local) == 1:
        data, zk, root = local[0]
        return Target(zk=zk, source=Source.LOCAL, root=root, local_data=data)
    if len(local) > 1:
        raise ValueError("several `ledgerd local` clusters run ("
                         + ", ".join(f"{d}: --zk {zk}" for d, zk, _ in local)
                         + "): name one with --zk or LEDGERD_ZK_SERVERS")
    return Target(zk=DEFAULT_ZK, source=Source.DEFAULT)


def unnamed_write_problem(target: Target, verb: str) -> str:
    """Why ``verb`` (which writes cookies or cluster metadata) must not run against
    ``target``, or "" when it may."""
    if target.is_named:
        return ""
    found = (f"found {target.describe()}" if target.source is Source.LOCAL
             else f"ZooKeeper {target.zk} is only the default")
    return (f"{verb} writes cluster metadata and names no cluster ({found}): give it "
            f"--zk {target.zk} (or export LEDGERD_ZK_SERVERS) to write there")


def env_override_problem(*, file_zk: str, env_zk: str | None, has_cookie: bool,
                         conf: str) -> str:
    """Why a bookie must not start, or "": a new bookie (no cookie in its directories
    yet) whose file names ZooKeeper ``file_zk`` would write its first cookie into the
    other cluster ``env_zk`` that ``LEDGERD_ZK_SERVERS`` names."""
    if has_cookie or not file_zk or env_zk is None or env_zk == file_zk:
        return ""
    return (f"LEDGERD_ZK_SERVERS={env_zk} overrides zk_servers = {file_zk!r} of {conf}, and "
            "this bookie is new (no cookie yet): it would join the environment's cluster, "
            "not its file's. Unset LEDGERD_ZK_SERVERS, or set zk_servers in the file")
