"""A small supervisor for the bookie's root nursery.

Each service is an ``async def service(*, task_status)`` started with ``nursery.start``,
so start-up order is explicit and a service that fails before it is ready fails the
start. Once running:
- a non-critical service that raises is logged and restarted after a backoff that
  doubles up to ``max_backoff`` (and resets once it has run for ``healthy_after``);
- a critical service that raises calls ``on_critical(name, error)`` and is not restarted;
  the bookie decides (read-only, or stop).
A service that returns normally is done and is not restarted.

Stopping a service cancels it. A non-critical service may then raise errors besides the
cancellation (the bookie's own shutdown closes the connections its replication worker
copies through, so those copies fail while they are being cancelled): whatever is left
once the cancellation is absorbed is what the stop cut short, logged as one line
(``service_stopped_with_error``), never a traceback out of the bookie.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import trio

from ledgerd.base.logs import fields
from ledgerd.errors import single_exception

__all__ = ["Service", "Supervisor", "leaves"]

log = logging.getLogger(__name__)


def leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside nested exception groups, in order (``exc`` if none)."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in leaves(inner)]
    return [exc]


class Service(Protocol):
    def __call__(self, *, task_status: Any = ...) -> Awaitable[None]:
        """Run until cancelled; call ``task_status.started()`` once ready."""


class _OnceStatus:
    """Forwards the first ``started()`` to the nursery; later restarts call it again."""

    def __init__(self, outer: Any) -> None:
        self.outer = outer
        self.done = False

    def started(self, value: Any = None) -> None:
        if not self.done:
            self.done = True
            self.outer.started(value)


@dataclass
class _Spec:
    name: str
    fn: Service
    critical: bool
    restarts: int = 0
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    finished: trio.Event = field(default_factory=trio.Event)


class Supervisor:
    def __init__(self, nursery: trio.Nursery, *,
                 on_critical: Callable[[str, BaseException], None],
                 on_restart: Callable[[str], None] | None = None,
                 min_backoff: float = 0.5, max_backoff: float = 30.0,
                 healthy_after: float = 60.0) -> None:
        self.nursery = nursery
        self.on_critical = on_critical
        self.on_restart = on_restart
        self.min_backoff = min_backoff
        self.max_backoff = max_backoff
        self.healthy_after = healthy_after
        self.services: dict[str, _Spec] = {}

    async def start(self, name: str, fn: Service, *, critical: bool = False) -> None:
        """Start a service and return once it is ready (raises if it fails first)."""
        spec = _Spec(name, fn, critical)
        self.services[name] = spec
        await self.nursery.start(self._supervise, spec)

    async def stop(self, name: str) -> None:
        """Cancel one service and wait until it has finished."""
        spec = self.services[name]
        spec.scope.cancel()
        await spec.finished.wait()

    async def _supervise(self, spec: _Spec, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            with spec.scope:
                await self._loop(spec, task_status)
        except Exception as raised:
            # Errors the stop itself caused (see the module docstring); Cancelled was
            # absorbed by the scope. A critical service's, or any raised while no stop
            # was asked, go on up.
            if spec.critical or not spec.scope.cancel_called:
                raise
            errors = leaves(raised)
            log.warning("service_stopped_with_error", extra=fields(
                service=spec.name, error=repr(errors[0]), errors=len(errors)))
        finally:
            spec.finished.set()

    async def _loop(self, spec: _Spec, task_status: Any) -> None:
        status = _OnceStatus(task_status)
        backoff = self.min_backoff
        while True:
            began = trio.current_time()
            try:
                await spec.fn(task_status=status)
                log.info("service_finished", extra=fields(service=spec.name))
                return
            except Exception as raised:
                if not status.done:
                    raise  # failed during start-up: the caller's start raises
                # A service's own error, not the nursery group trio wraps it in: the
                # reason an operator reads must name the file and errno.
                exc = single_exception(raised)
                if spec.critical:
                    log.error("critical_service_failed", extra=fields(
                        service=spec.name, error=repr(exc)))
                    self.on_critical(spec.name, exc)
                    return
                if trio.current_time() - began >= self.healthy_after:
                    backoff = self.min_backoff
                spec.restarts += 1
                if self.on_restart is not None:
                    self.on_restart(spec.name)
                log.warning("service_restarting", extra=fields(
                    service=spec.name, error=repr(exc), backoff_s=backoff,
                    restarts=spec.restarts))
                await trio.sleep(backoff)
                backoff = min(self.max_backoff, backoff * 2)
