"""ZooKeeper digest authentication and ACLs (zk_enable_security), and the migration.

A secured cluster's znodes admit only the digest user: a ZooKeeper client without the
credentials can neither read the metadata (ledger passwords are in it) nor change it,
and `ledgerd shell` without them fails in one line saying what to set. `zkacl --apply`
moves an open cluster over.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import ledgerd
from ledgerd.metadata.errors import NotAuthorizedError
from ledgerd.metadata.paths import ledger_path
from ledgerd.metadata.zookeeper import ZooKeeperStore
from ledgerd.tools.bookieprocess import BookieProcess
from tests.cluster import metadata_store, wait_registered

Factory = Callable[..., BookieProcess]


def _shell(zk: str, *args: str, env: dict[str, str] | None = None
           ) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LEDGERD_ZK_")}
    return subprocess.run([sys.executable, "-m", "ledgerd.tools.cli", "shell", "--zk", zk,
                           *args], capture_output=True, text=True, timeout=120,
                          env={**clean, **(env or {})})


@pytest.fixture
def auth(tmp_path: Path) -> dict[str, Any]:
    path = tmp_path / "zk.auth"
    path.write_text("ledgerd:s3cret-zk\n")
    return {"zk_enable_security": True, "zk_digest_auth_file": str(path)}


def _env(auth: dict[str, Any]) -> dict[str, str]:
    return {f"LEDGERD_{k.upper()}": str(v).lower() if isinstance(v, bool) else str(v)
            for k, v in auth.items()}


@pytest.fixture
def reopened(zk_chroot: str, auth: dict[str, Any]) -> Iterator[str]:
    """The test's chroot, its ACLs opened again afterwards (so its teardown, which has no
    credentials, can delete it)."""
    yield zk_chroot
    _shell(zk_chroot, "zkacl", "--open", env=_env(auth))


async def _secured(zk: str, auth: dict[str, Any]) -> ZooKeeperStore:
    return await ZooKeeperStore.connect(zk, credentials=("ledgerd", "s3cret-zk"), secure=True)


async def test_a_secured_cluster_admits_only_its_user(bookie_factory: Factory, reopened: str,
                                                      auth: dict[str, Any]) -> None:
    zk_chroot = reopened
    made = _shell(zk_chroot, "initnewcluster", env=_env(auth))
    assert made.returncode == 0, made.stderr
    b = bookie_factory(**auth)
    b.start()
    store = await _secured(zk_chroot, auth)
    try:
        await wait_registered(store, b)
        async with ledgerd.open_client(zk_chroot, **auth) as client:
            lh = await client.create_ledger(1, 1, 1, password=b"secret-ledger-pw")
            await lh.append(b"guarded")
            await lh.close()
        path = ledger_path("/ledgers", "hierarchical", lh.ledger_id)
        assert await store.get_acl(path) == [f"digest:ledgerd:{_digest()}:31"]
    finally:
        await store.close()

    async with metadata_store(zk_chroot, init=False) as anonymous:
        with pytest.raises(NotAuthorizedError, match="set zk_digest_auth_file"):
            await anonymous.get(path)  # the ledger's metadata holds its password
        with pytest.raises(NotAuthorizedError):
            await anonymous.set(path, b"{}", -1)
        with pytest.raises(NotAuthorizedError):
            await anonymous.create("/ledgers/intruder", b"x")
    denied = _shell(zk_chroot, "listledgers")
    assert denied.returncode == 1 and denied.stderr.splitlines() == [
        "ledgerd: error: ZooKeeper refused access to /ledgers/LAYOUT (its ACL): set "
        "zk_digest_auth_file (LEDGERD_ZK_DIGEST_AUTH_FILE) to the cluster's ZooKeeper "
        "credentials"], denied.stderr
    listed = _shell(zk_chroot, "listledgers", "--json", env=_env(auth))
    assert listed.returncode == 0 and str(lh.ledger_id) in listed.stdout, listed.stderr
    assert b.terminate() == 0


def _digest() -> str:
    from kazoo.security import make_digest_acl_credential

    return make_digest_acl_credential("ledgerd", "s3cret-zk").split(":", 1)[1]


async def test_zkacl_moves_an_open_cluster_over(bookie_factory: Factory, reopened: str,
                                                auth: dict[str, Any]) -> None:
    zk_chroot = reopened
    async with metadata_store(zk_chroot) as store:  # an open cluster, as before security
        b = bookie_factory()
        b.start()
        await wait_registered(store, b)
        async with ledgerd.open_client(zk_chroot) as client:
            lh = await client.create_ledger(1, 1, 1, password=b"pw")
            await lh.close()
        shown = _shell(zk_chroot, "zkacl", "--json", env=_env(auth))
        assert shown.returncode == 0, shown.stderr
        assert set(ledgerd_json(shown.stdout)["acls"]) == {"open"}
        applied = _shell(zk_chroot, "zkacl", "--apply", env=_env(auth))
        assert applied.returncode == 0, applied.stderr
        assert "now " in applied.stdout and " digest" in applied.stdout and "open" not in \
            applied.stdout, applied.stdout
        with pytest.raises(NotAuthorizedError):
            await store.children("/ledgers")
    assert b.terminate() == 0  # its ZooKeeper session had the open cluster's rights
    back = _shell(zk_chroot, "zkacl", "--open", env=_env(auth))
    assert back.returncode == 0 and "digest" not in back.stdout, back.stdout


def ledgerd_json(text: str) -> dict[str, object]:
    import json

    return dict(json.loads(text))
