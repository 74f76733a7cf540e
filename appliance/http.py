"""The admin endpoint: a small HTTP/1.1 server for Prometheus and operators.

    GET  /metrics                Prometheus text format
    GET  /status                 JSON: state, bookie id, journal, storage, services
    GET  /health                 200 "ok" when writable, 503 with the reason otherwise
    POST /admin/gc               start a GC pass (also /admin/compaction/minor|major)
    POST /admin/readonly         refuse new adds until /admin/writable or a restart

It binds to ``admin_address`` (127.0.0.1 by default). The GETs are open (metrics for
Prometheus); a POST changes state and must carry the admin token when one is configured
(``Authorization: Bearer <token>`` or ``X-Ledgerd-Secret: <token>``), from any peer;
without a token only loopback peers may POST. The token is never logged. One request per
connection; requests are bounded (16 KiB of head, no body read).
"""

from __future__ import annotations

import json
import logging
from typing import Protocol

import trio

from ledgerd.appliance.handlers import AdminHooks, ServingState, admin_allowed
from ledgerd.appliance.server import is_loopback
from ledgerd.base.logs import fields
from ledgerd.wire.messages import AdminKind

__all__ = ["AdminHttp"]

log = logging.getLogger(__name__)
_MAX_HEAD = 16 * 1024
_TRIGGERS = {"/admin/gc": AdminKind.GC, "/admin/compaction/minor": AdminKind.MINOR_COMPACTION,
             "/admin/compaction/major": AdminKind.MAJOR_COMPACTION,
             "/admin/readonly": AdminKind.READ_ONLY, "/admin/writable": AdminKind.WRITABLE}
_REASONS = {200: "OK", 202: "Accepted", 400: "Bad Request", 403: "Forbidden",
            404: "Not Found", 405: "Method Not Allowed", 503: "Service Unavailable"}


class Exposes(Protocol):
    def exposition(self) -> bytes: ...


class AdminHttp:
    def __init__(self, metrics: Exposes, state: ServingState, admin: AdminHooks, *,
                 host: str, port: int, metrics_enabled: bool = True) -> None:
        self.metrics = metrics
        self.state = state
        self.admin = admin
        self.host = host
        self.port = port
        self.metrics_enabled = metrics_enabled
        self.bound_port = 0

    async def run(self, *, task_status: trio.TaskStatus[list[trio.SocketListener]] = (
            trio.TASK_STATUS_IGNORED)) -> None:
        try:
            listeners = await trio.open_tcp_listeners(self.port, host=self.host)
        except OSError as exc:
            raise OSError(exc.errno, f"cannot listen on {self.host}:{self.port} (the admin "
                                     f"endpoint's port): {exc.strerror}") from exc
        self.bound_port = listeners[0].socket.getsockname()[1]
        log.info("admin_listening", extra=fields(address=f"{self.host}:{self.bound_port}"))
        await trio.serve_listeners(self._serve, listeners, task_status=task_status)

    async def _serve(self, stream: trio.SocketStream) -> None:
        try:
            with trio.move_on_after(10):
                head = await _read_head(stream)
                if head is None:
                    code, ctype, body = 400, "text/plain", b"bad request\n"
                else:
                    code, ctype, body = self.respond(head, trusted=is_loopback(stream))
                await stream.send_all(
                    f"HTTP/1.1 {code} {_REASONS.get(code, '')}\r\nContent-Type: {ctype}\r\n"
                    f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            await stream.aclose()

    def respond(self, head: bytes, *, trusted: bool) -> tuple[int, str, bytes]:
        """Status, content type and body for one request head."""
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3:
            return 400, "text/plain", b"bad request line\n"
        method, target, _version = parts
        path = target.split("?", 1)[0]
        headers = {}
        for line in lines[1:]:
            if ":" in line:
                k, v = line.split(":", 1)
                headers[k.strip().lower()] = v.strip()
        if method == "GET" and path == "/metrics" and self.metrics_enabled:
            return 200, "text/plain; version=0.0.4; charset=utf-8", self.metrics.exposition()
        if method == "GET" and path == "/status":
            return 200, "application/json", json.dumps(self.admin.status(),
                                                       sort_keys=True).encode() + b"\n"
        if method == "GET" and path == "/health":
            if self.state.read_only:
                return 503, "text/plain", f"read-only: {self.state.reason}\n".encode()
            return 200, "text/plain", b"ok\n"
        if path in _TRIGGERS:
            if method != "POST":
                return 405, "text/plain", b"use POST\n"
            presented = headers.get("x-ledgerd-secret", "")
            auth = headers.get("authorization", "")
            if auth[:7].lower() == "bearer ":
                presented = auth[7:].strip()
            if not admin_allowed(self.admin.secret, presented, trusted):
                why = ("a valid admin token (Authorization: Bearer)" if self.admin.secret
                       else "a loopback peer, or an admin_secret_file on the bookie")
                return 403, "text/plain", f"admin requests need {why}\n".encode()
            started = self.admin.trigger(_TRIGGERS[path])
            return 202, "application/json", json.dumps({"started": started}).encode() + b"\n"
        return 404, "text/plain", b"not found\n"


async def _read_head(stream: trio.abc.ReceiveStream) -> bytes | None:
    buf = bytearray()
    while b"\r\n\r\n" not in buf:
        if len(buf) > _MAX_HEAD:
            return None
        data = await stream.receive_some(4096)
        if not data:
            return None
        buf += data
    return bytes(buf[: buf.index(b"\r\n\r\n")])
