"""The fault proxy forwards bytes both ways, holds them while partitioned (and delivers
them on heal), delays them, and cuts connections mid-frame with a reset."""

from __future__ import annotations

import trio

from ledgerd.tools.faults.proxy import FaultProxy


async def _echo(stream: trio.SocketStream) -> None:
    try:
        while data := await stream.receive_some(65536):
            await stream.send_all(data)
    except trio.BrokenResourceError:
        pass


async def test_forward_partition_heal_latency_and_reset() -> None:
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(trio.serve_tcp, _echo, 0)
        port = listeners[0].socket.getsockname()[1]
        proxy = FaultProxy(nursery)
        link = await proxy.link("c-echo", f"127.0.0.1:{port}")
        stream = await trio.open_tcp_stream("127.0.0.1", link.port)
        await stream.send_all(b"hello")
        assert await stream.receive_some(100) == b"hello"

        link.partition()
        await stream.send_all(b"held")
        with trio.move_on_after(0.3) as waited:
            await stream.receive_some(100)
        assert waited.cancelled_caught  # nothing came through
        link.heal()
        assert await stream.receive_some(100) == b"held"

        link.slow(latency_s=0.2)
        start = trio.current_time()
        await stream.send_all(b"slow")
        assert await stream.receive_some(100) == b"slow"
        assert trio.current_time() - start >= 0.4  # 0.2 s each way
        link.heal()

        assert link.reset_connections() == 1
        await stream.send_all(b"0123456789")
        got = b""
        try:
            while chunk := await stream.receive_some(100):
                got += chunk
        except trio.BrokenResourceError:
            pass  # the RST
        assert got != b"0123456789" and b"0123456789".startswith(got)
        assert link.resets == 1
        # New connections work again after a reset.
        again = await trio.open_tcp_stream("127.0.0.1", link.port)
        await again.send_all(b"x")
        assert await again.receive_some(10) == b"x"
        await again.aclose()
        nursery.cancel_scope.cancel()
