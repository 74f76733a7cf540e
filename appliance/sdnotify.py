"""systemd notification protocol (``sd_notify``) without libsystemd.

``NOTIFY_SOCKET`` names an AF_UNIX datagram socket (a leading ``@`` is the abstract
namespace). Without it every call is a no-op, so the bookie runs the same under systemd,
in tests and by hand. ``WATCHDOG_USEC`` (and ``WATCHDOG_PID``, if set, naming this
process) asks for ``WATCHDOG=1`` at least that often; we ping at half the interval.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
from collections.abc import Callable, Mapping

import trio

from ledgerd.base.logs import fields

__all__ = ["notify", "watchdog_interval", "watchdog_service"]

log = logging.getLogger(__name__)


def notify(state: str, env: Mapping[str, str] | None = None) -> bool:
    """Send ``state`` (e.g. ``READY=1``); False if there is no socket to send to."""
    env = os.environ if env is None else env
    address = env.get("NOTIFY_SOCKET", "")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.sendto(state.encode(), address)
        return True
    except OSError as exc:
        log.warning("sd_notify_failed", extra=fields(state=state, error=str(exc)))
        return False


def watchdog_interval(env: Mapping[str, str] | None = None) -> float | None:
    """Seconds between pings (half of ``WATCHDOG_USEC``), or None if not asked."""
    env = os.environ if env is None else env
    usec = env.get("WATCHDOG_USEC", "")
    pid = env.get("WATCHDOG_PID", "")
    if not usec:
        return None
    if pid and pid != str(os.getpid()):
        return None
    try:
        value = int(usec)
    except ValueError:
        log.warning("bad_watchdog_usec", extra=fields(value=usec))
        return None
    return value / 2e6 if value > 0 else None


async def watchdog_service(healthy: Callable[[], bool], *,
                           env: Mapping[str, str] | None = None,
                           task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Ping ``WATCHDOG=1`` at half the interval while ``healthy()`` holds.

    The pings come from the event loop itself, so a wedged loop stops them and systemd
    restarts the bookie.
    """
    interval = watchdog_interval(env)
    task_status.started()
    if interval is None:
        return
    while True:
        if healthy():
            notify("WATCHDOG=1", env)
        await trio.sleep(interval)


async def wait_stop_signal() -> None:
    """Return at the first SIGTERM (systemd's stop) or SIGINT, logged."""
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            log.info("signal", extra=fields(signal=signal.Signals(signum).name))
            return
