"""A ZooKeeper that cannot be reached gives a bounded wait and an error naming the servers."""

from __future__ import annotations

import pytest
import trio

from metadata.errors import MetadataUnavailableError
from metadata.zookeeper import ZooKeeperStore
from tools.zkserver import find_free_port


async def test_unreachable_servers_are_named() -> None:
    servers = f"127.0.0.1:{find_free_port()}"
    with trio.fail_after(30):
        with pytest.raises(MetadataUnavailableError) as info:
            await ZooKeeperStore.connect(servers, connect_timeout=2.0)
    assert servers in str(info.value)
