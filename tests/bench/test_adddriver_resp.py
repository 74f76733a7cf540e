"""The C add driver's Redis mode against a scripted RESP server (no redis-server needed:
``bench/latency.py selfcheck`` checks the same against a real one): the exact XADD bytes
it sends, replies split across reads, and error and null replies counted as errors."""

from __future__ import annotations

import fcntl
import socket
import struct
import termios
import threading
from pathlib import Path

from bench import cdriver

VALUE = b"x" * 1024


def _wait_delivered(conn: socket.socket) -> None:
    """Until the kernel holds nothing of ours unsent or unacknowledged (loopback: at once)."""
    for _ in range(100_000):
        if struct.unpack("i", fcntl.ioctl(conn.fileno(), termios.TIOCOUTQ, b"\0" * 4))[0] == 0:
            return


def _xadd(stream: bytes) -> bytes:
    return (b"*5\r\n$4\r\nXADD\r\n$%d\r\n%s\r\n$1\r\n*\r\n$1\r\nf\r\n$1024\r\n%s\r\n"
            % (len(stream), stream, VALUE))


def _serve(listener: socket.socket, conns: int, reply: bytes, seen: list[bytes]) -> None:
    """Accept ``conns`` connections; answer every whole XADD with ``reply``, sent in two
    parts a moment apart (the driver must wait for the rest)."""

    def one(conn: socket.socket) -> None:
        buf = b""
        with conn:
            while True:
                try:
                    data = conn.recv(65536)
                except ConnectionResetError:
                    return
                if not data:
                    return
                buf += data
                while len(buf) >= len(_xadd(b"")) and b"\r\n" in buf:
                    stream_len = int(buf.split(b"\r\n")[3][1:])
                    n = len(_xadd(b"s" * stream_len))
                    if len(buf) < n:
                        break
                    seen.append(buf[:n])
                    buf = buf[n:]
                    try:
                        conn.sendall(reply[:3])
                        _wait_delivered(conn)  # the reply reaches the driver in two parts
                        conn.sendall(reply[3:])
                    except (BrokenPipeError, ConnectionResetError):
                        return  # a closed loop leaves with commands unanswered

    threads = []
    for _ in range(conns):
        conn, _addr = listener.accept()
        t = threading.Thread(target=one, args=(conn,), daemon=True)
        t.start()
        threads.append(t)
    for t in threads:
        t.join(10)


def _drive(tmp_path: Path, reply: bytes, stream: str, conns: int) -> tuple[dict, list[bytes]]:
    seen: list[bytes] = []
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        server = threading.Thread(target=_serve, args=(listener, conns, reply, seen),
                                  daemon=True)
        server.start()
        result = cdriver.redis_open_loop(port, 200.0, conns, 0.05, stream=stream)
        server.join(10)
    return result, seen


def test_xadd_bytes_and_bulk_replies(tmp_path: Path) -> None:
    result, seen = _drive(tmp_path, b"$15\r\n1700000000000-0\r\n", "bench", 2)
    assert seen == [_xadd(b"bench")] * 10
    assert (result["entries"], result["errors"], result["rate"]) == (10, 0, 200.0)
    assert result["p50_ms"] > 0


def test_errors_and_nulls_count_as_errors(tmp_path: Path) -> None:
    result, seen = _drive(tmp_path, b"-WRONGTYPE Operation against a key\r\n", "a-key", 1)
    assert seen == [_xadd(b"a-key")] * 10
    assert (result["entries"], result["errors"]) == (0, 10)
    result, _ = _drive(tmp_path, b"$-1\r\n", "a-key", 1)
    assert (result["entries"], result["errors"]) == (0, 10)


def test_closed_loop_keeps_its_window_in_order() -> None:
    seen: list[bytes] = []
    reply = b"$3\r\n1-0\r\n"
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        server = threading.Thread(target=_serve, args=(listener, 2, reply, seen), daemon=True)
        server.start()
        result = cdriver.redis_closed_loop(port, 2, 4, 0.3, warmup=0.1, stream="s")
        server.join(10)
    assert result["errors"] == 0
    assert 0 < result["entries"] <= len(seen)
    assert set(seen) == {_xadd(b"s")}


def _serve_stalling(listener: socket.socket, stall_after: int, stall_s: float) -> None:
    """One connection; "+OK" to every XADD, but once, after ``stall_after`` of them,
    nothing for ``stall_s``."""
    import time

    conn, _addr = listener.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    n = len(_xadd(b"closed"))
    buf, answered = b"", 0
    with conn:
        while True:
            try:
                data = conn.recv(65536)
            except ConnectionResetError:
                return
            if not data:
                return
            buf += data
            while len(buf) >= n:
                buf = buf[n:]
                if answered == stall_after:
                    time.sleep(stall_s)
                answered += 1
                try:
                    conn.sendall(b"$3\r\n1-0\r\n")
                except (BrokenPipeError, ConnectionResetError):
                    return


def test_the_closed_loop_reports_its_longest_silence_and_what_was_in_flight() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        server = threading.Thread(target=_serve_stalling, args=(listener, 50, 0.4), daemon=True)
        server.start()
        result = cdriver.redis_closed_loop(port, 1, 4, 1.0, warmup=0.0, stream="closed")
        server.join(10)
    assert result["errors"] == 0 and result["entries"] > 50
    assert 380 <= result["max_gap_ms"] < 1000, result
    assert 1 <= result["gap_inflight"] <= 4, result  # the window refills at half
