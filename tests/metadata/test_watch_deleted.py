"""A children watch outlives its node (a wiped root): the deletion is notified, and so
is the node's re-creation and every child added after it. Both stores."""

from __future__ import annotations

import trio

from ledgerd.metadata.store import WatchKind
from tests.metadata.conftest import StoreFactory


async def test_children_watch_survives_its_node_deleted_and_created_again(
        stores: StoreFactory) -> None:
    s = await stores.open()
    writer = await stores.open()
    await s.create("/root/available", make_parents=True)
    with trio.fail_after(20):
        async with s.watch("/root/available", WatchKind.CHILDREN) as events:
            await events.__anext__()  # the first notification, at once
            await writer.delete("/root", recursive=True)
            await events.__anext__()  # the deletion
            assert await s.exists("/root/available") is None
            await writer.create("/root/available", make_parents=True)
            await events.__anext__()  # the re-creation
            await writer.create("/root/available/b1:3181")
            while await s.children("/root/available") != ["b1:3181"]:
                await events.__anext__()
            await writer.create("/root/available/b2:3181")
            await events.__anext__()  # a child added later: the watch is armed again
            assert await s.children("/root/available") == ["b1:3181", "b2:3181"]
