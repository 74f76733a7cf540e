"""The connection hub: every plain TCP connection of a bookie served from one task.

With a task pair per connection (``appliance.server``), each request costs a reader
wake-up, a writer wake-up, an epoll re-registration and a checkpoint per socket call,
and trio's scheduling dominates the event loop's time. The hub keeps the connections'
sockets in an epoll set of its own and waits, as one trio task, for that set's
descriptor to become readable. One wake-up then serves every connection that has data:
each socket is read once (``recv`` without a retry on EAGAIN) and fed to its
``BookieSession`` (``appliance.session``), which holds every rule of the connection:
framing limits, backpressure, in-order replies, closing. The hub is only the transport:
it reads, stores what the sessions hand out, answers, writes and closes.

The runs of adds the sessions hand out (consecutive one-entry adds of one ledger cut
from the buffer, or Add requests merged) wait for the pass's end and are stored
together (``RequestHandler.store``: one storage call and one journal submission for
those the core accepts as they are), except that any other request, of any connection,
first stores the runs read before it (the session's ``STORE``), so requests are still
decided in the order they were read. The pass's adds join one journal group
(``Journal.batch``). Replies to adds are encoded as the pass handles them and handed to
the journal as an after-sync action (``native.SendAfterSync``, built here for the
connection's socket): the syncer thread sends them the moment the group is durable,
without the GIL and without waiting for the event loop, which under load is busy with
the next pass. The group's completion callback (in the task that collected the group)
then only counts them and keeps what a full socket did not take in a buffer that waits
for EPOLLOUT; replies that could not ride along (a group already in flight, a failed
group) are sent from that callback, in order. No task wakes for any of them. Only
requests that wait (long polls, fencing reads that must be journaled, admin calls) get a
task of their own.

What the transport adds to the session's rules:

- Replies go out in request order up to the first add whose journal group is not yet
  durable; what follows waits for that group (groups complete in order). Replies
  handed to a syncer are the first ones owed on their connection; nothing else is sent
  there until the group is collected, and a short send stops the syncers' sends to
  that socket until the rest went out (``native.SendAfterSync``). A connection closed
  meanwhile keeps its descriptor open until the group is collected, so a syncer never
  writes to a reused one.
- A paused connection (the session's ``PAUSE``: replies owed, queued or in its send
  buffer, over the limits) is taken out of the read set until replies go out; frames
  already received wait in its session. A peer that does not read stalls only itself.
- A peer's end of stream stops reading; replies already owed still go out, slow ones
  for at most ``CLOSE_GRACE_S``. Draining (bookie stop): reading stops, owed replies go
  out, then the connection closes.

Linux only (epoll), like the rest of the appliance; connections that are not plain
sockets (tests' memory streams, TLS) use ``serve_connection``.
"""

from __future__ import annotations

import errno
import logging
import os
import select
import socket
import time
from collections import deque
from functools import partial

import trio

from ledgerd.appliance.handlers import RequestHandler
from ledgerd.appliance.replies import ReplyItem, count_sent_adds, encode_ok_adds
from ledgerd.appliance.session import (
    CLOSE_GRACE_S,
    NEED_DATA,
    PAUSE,
    STORE,
    BookieSession,
    Close,
    ConnectionOptions,
)
from ledgerd.base.logs import fields
from ledgerd.disk.journal import JournalGroup
from ledgerd.native import SendAfterSync, resume_sends
from ledgerd.wire.connection import AddRun
from ledgerd.wire.frames import DecodedRequest

__all__ = ["ConnectionHub"]

log = logging.getLogger(__name__)
# The hub reads every socket into one buffer of this size (``recv_into``): a fresh
# 256 KiB bytes object per ``recv`` costs an mmap and its page faults even with a few KB
# waiting (``base.tls.RECEIVE_BYTES``), and the frames are copied out anyway.
_RECEIVE = 256 * 1024
_IN = select.EPOLLIN
_OUT = select.EPOLLOUT
_GONE = select.EPOLLHUP | select.EPOLLERR
_SWEEP_S = 0.5


class _Ahead:
    """Replies to the first ``count`` of a connection's items, handed to a syncer."""

    __slots__ = ("count", "group", "replies", "send")

    def __init__(self, group: JournalGroup, send: SendAfterSync, count: int) -> None:
        self.group = group
        self.send = send
        self.count = count    # items
        self.replies = 0      # the replies they stand for


class _Connection:
    """One connection's state in the hub."""

    __slots__ = ("ahead", "attached", "closed", "closing", "closing_since", "deferred",
                 "done", "fd", "mask", "paused", "released", "sends_stopped",
                 "session", "sock", "waiting_on", "wbuf")

    def __init__(self, sock: socket.socket, session: BookieSession) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.session = session      # the connection's rules; its replies owed (``items``)
        self.wbuf = bytearray()     # encoded replies the socket has not taken yet
        self.mask = _IN
        self.paused = False         # out of the read set for backpressure
        self.closing = False        # no more requests will be read
        self.closing_since = 0.0
        self.closed = False
        self.waiting_on: JournalGroup | None = None
        # Replies handed to syncers, oldest first: they answer the first ``attached``
        # items owed, which stay in ``session.items`` until their group is collected.
        self.ahead: deque[_Ahead] = deque()
        self.attached = 0
        self.sends_stopped = False  # a syncer may have stopped sending here: resume
        self.deferred = False       # add runs of this pass wait in ``ConnectionHub._deferred``
        self.released = False       # the socket is closed (``_release``)
        self.done = trio.Event()


class ConnectionHub:
    """Serves plain TCP connections from one task; see the module docstring."""

    def __init__(self, handler: RequestHandler, options: ConnectionOptions) -> None:
        self.handler = handler
        self.options = options
        self._epoll = select.epoll()
        self._wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._epoll.register(self._wake_fd, _IN)
        self._conns: dict[int, _Connection] = {}
        self._resume: list[_Connection] = []
        # This pass's runs of one-entry adds, stored together at its end (``_store_deferred``).
        self._deferred: list[tuple[_Connection, AddRun, float]] = []
        # The connections waiting on each journal group (``_wait``), and while a group's
        # connections are settled, the add replies its syncer sent (counted once).
        self._waiting: dict[JournalGroup, list[_Connection]] = {}
        self._sent_adds: list[ReplyItem] | None = None
        self._received = memoryview(bytearray(_RECEIVE))
        self._nursery: trio.Nursery | None = None

    @property
    def connections(self) -> int:
        return len(self._conns)

    # -- the service -------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """Serve until cancelled; then close every connection the hub still holds."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._sweeper)
                task_status.started()
                await self._poll_loop()
        finally:
            for c in list(self._conns.values()):
                self._close(c)
            self._epoll.close()
            os.close(self._wake_fd)

    async def serve(self, stream: trio.SocketStream, *, trusted: bool,
                    reader_scope: trio.CancelScope | None = None) -> None:
        """Hand ``stream``'s socket to the hub; return once the connection is closed.

        Cancelling ``reader_scope`` stops reading requests; replies to those already read
        still go out (for at most the close grace), then the connection closes. The
        stream object is spent: the hub owns its descriptor.
        """
        sock = socket.socket(fileno=stream.socket.detach())
        await self.serve_socket(sock, trusted=trusted, reader_scope=reader_scope)

    async def serve_socket(self, sock: socket.socket, *, trusted: bool,
                           reader_scope: trio.CancelScope | None = None) -> None:
        """``serve`` for a connected stdlib socket, which the hub now owns."""
        sock.setblocking(False)
        c = _Connection(sock, BookieSession(self.options, trusted=trusted))
        c.session.last_active = time.monotonic()
        self._conns[c.fd] = c
        self._epoll.register(c.fd, _IN)
        self.handler.metrics.connections_opened += 1
        try:
            with reader_scope or trio.CancelScope():
                await c.done.wait()
            if not c.closed:
                self._stop_reading(c)
                with trio.move_on_after(CLOSE_GRACE_S):
                    await c.done.wait()
        finally:
            self._close(c)

    async def _poll_loop(self) -> None:
        epoll = self._epoll
        conns = self._conns
        wake_fd = self._wake_fd
        efd = epoll.fileno()
        journal = self.handler.storage.journal
        while True:
            await trio.lowlevel.wait_readable(efd)
            with journal.batch():  # this pass's adds: one journal group, started at its end
                self._pass(epoll, conns, wake_fd)

    def _pass(self, epoll: select.epoll, conns: dict[int, _Connection], wake_fd: int) -> None:
        """Serve every connection the hub's epoll set reports ready, once."""
        now = time.perf_counter()
        for fd, mask in epoll.poll(0):
            if fd == wake_fd:
                try:
                    os.eventfd_read(wake_fd)
                except BlockingIOError:
                    pass
                continue
            c = conns.get(fd)
            if c is None:
                continue
            if mask & _GONE and (c.paused or c.closing):
                self._close(c)  # hung up or reset while not reading: nobody to answer
                continue
            if mask & _OUT:
                self._send_buffered(c)
            if mask & ~_OUT and not c.closed:
                self._receive(c, now)
        if self._deferred:
            self._store_deferred()
        while self._resume:
            resume, self._resume = self._resume, []
            for c in resume:
                if not c.closed:
                    self._take_requests(c, time.perf_counter())
            if self._deferred:
                self._store_deferred()

    async def _sweeper(self) -> None:
        """Idle timeouts and the close grace of connections whose peer has gone."""
        idle_timeout = self.options.idle_timeout
        while True:
            await trio.sleep(min(_SWEEP_S, idle_timeout / 2) if idle_timeout else _SWEEP_S)
            now = time.monotonic()
            for c in list(self._conns.values()):
                if c.closing:
                    if now - c.closing_since > CLOSE_GRACE_S:
                        self._close(c)
                elif not c.wbuf and c.session.is_idle(now, idle_timeout):
                    self.handler.metrics.connections_idle_closed += 1
                    log.info("connection_idle_closed", extra=fields(idle_s=idle_timeout))
                    self._close(c)

    # -- reading -----------------------------------------------------------------------

    def _receive(self, c: _Connection, now: float) -> None:
        try:
            n = c.sock.recv_into(self._received)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(c)  # reset by the peer: what it sent is stored all the same
            return
        c.session.receive_data(self._received[:n], now)  # copied into its frame buffer
        c.session.last_active = time.monotonic()
        self._take_requests(c, now)

    def _take_requests(self, c: _Connection, now: float) -> None:
        """Do what the connection's session says about the frames received."""
        session = c.session
        session.started = now
        handler = self.handler
        while True:
            ev = session.next_event(0, len(c.wbuf))
            if type(ev) is AddRun:
                # Stored with the other connections' runs at the end of the pass.
                self._deferred.append((c, ev, now))
                c.deferred = True
                continue
            if ev is NEED_DATA:
                if c.paused:
                    self._unpause(c)
                break
            if ev is PAUSE:
                self._pause(c)
                break
            if ev is STORE:
                # Requests are handled in the order they came, runs of any connection
                # before them included: a read sees the adds sent before it.
                self._store_deferred(c)
                continue
            if self._deferred:
                # Any other request (or the end) comes after the runs read before it,
                # of any connection in this pass: a read sees the adds sent before it.
                self._store_deferred(c)
            if type(ev) is DecodedRequest:
                reply = handler.read_now(ev.message)
                if reply is not None:
                    session.put(ev.correlation_id, ev.api_key, reply[0], reply[1], now)
                    continue
                assert self._nursery is not None
                self._nursery.start_soon(self._slow, c, ev)
                continue
            assert type(ev) is Close, ev
            if ev.reason == "bad frame":
                self._close(c)
                return
            self._stop_reading(c)
            break
        if c.deferred:
            return  # ``_store_deferred`` sends the replies owed, with the runs'
        if session.items:
            self._flush(c)
        elif c.closing:
            self._close_if_done(c)

    def _store_deferred(self, taking: _Connection | None = None) -> None:
        """Store the pass's deferred runs, in the order they came (one journal
        submission for the runs accepted as they are), then send what each of their
        connections is owed, as ``_take_requests`` would have; except ``taking``, whose
        requests are being taken (it sends at the end of that)."""
        deferred, self._deferred = self._deferred, []
        results = self.handler.store([run for _, run, _ in deferred])
        touched: list[_Connection] = []
        for (c, run, now), res in zip(deferred, results, strict=True):
            if c.deferred:
                c.deferred = False
                touched.append(c)
            if c.closed:
                continue  # stored all the same; nobody to answer
            c.session.put_adds(run, res, now)
        for c in touched:
            if c.closed or c is taking:
                continue
            if c.session.items:
                self._flush(c)
            elif c.closing:
                self._close_if_done(c)

    async def _slow(self, c: _Connection, ev: DecodedRequest) -> None:
        status, resp = await self.handler.handle(ev.message, trusted=c.session.trusted)
        if c.closed:
            return
        c.session.put(ev.correlation_id, ev.api_key, status, resp, 0.0)
        self._flush(c)

    def _pause(self, c: _Connection) -> None:
        if not c.paused and not c.closing:
            c.paused = True
            self._set_mask(c, c.mask & ~_IN)

    def _unpause(self, c: _Connection) -> None:
        if c.paused:
            c.paused = False
            if not c.closing:
                self._set_mask(c, c.mask | _IN)

    def _stop_reading(self, c: _Connection) -> None:
        if not c.closing:
            c.closing = True
            c.closing_since = time.monotonic()
            if not c.closed:
                self._set_mask(c, c.mask & ~_IN)
        self._close_if_done(c)

    # -- writing -----------------------------------------------------------------------

    def _flush(self, c: _Connection) -> None:
        """Send every reply that can go: in order, up to the first add whose group is
        not durable yet. Adds of the journal's next group from there on go to its
        syncer; the oldest group waited for calls back here once done."""
        if c.closed:
            return
        if c.attached:
            # Replies in a syncer's hands come first: only more of them can be added.
            self._attach(c)
            self._wait(c, c.ahead[0].group)
            return
        session = c.session
        items = session.items
        ready = len(items)
        for i, item in enumerate(items):
            group = item.group
            if group is not None and not group.done.is_set():
                ready = i
                break
        if ready:
            if ready == len(items):
                batch, session.items = items, []
            else:
                batch, session.items = items[:ready], items[ready:]
            data, sent_bytes = session.encode(self.handler.metrics, batch)
            session.replies_sent(sent_bytes)  # the socket's buffer holds them now
            del batch
            self._send(c, data)
            if c.closed:
                return
        if session.items:
            self._attach(c)
            self._wait(c, c.ahead[0].group if c.attached else session.items[0].group)
        if ready:
            self._after_send(c)

    def _attach(self, c: _Connection) -> None:
        """Hand the replies to the unattached items that are OK adds of the journal's
        next group to that group's syncer: an after-sync action that sends them to the
        connection's socket (``Journal.after_sync``)."""
        if c.wbuf or c.sends_stopped:
            return  # bytes are waiting here: the syncer's would overtake them
        items = c.session.items
        start = k = c.attached
        journal = self.handler.storage.journal
        group = journal.next_group
        n = len(items)
        while k < n and items[k].group is group and items[k].status == 0:
            k += 1
        if k == start:
            return
        ahead = c.ahead
        if ahead and ahead[-1].group is group:
            last = ahead[-1]
        else:
            if not SendAfterSync.fits(c.fd):
                return  # not this descriptor: the usual path sends them
            send = SendAfterSync(c.fd, bytearray())
            journal.after_sync(send)
            last = _Ahead(group, send, 0)
            ahead.append(last)
        # Still unanswered (``max_inflight`` counts them) until their group is collected.
        data, replies = encode_ok_adds(items[start:k])
        last.send.data += data
        last.count += k - start
        last.replies += replies
        c.attached = k

    def _wait(self, c: _Connection, group: JournalGroup | None) -> None:
        if group is None or c.waiting_on is group:
            return
        c.waiting_on = group
        if group.done.is_set():
            self._on_group_done(c)
            return
        # One callback per group, for every connection waiting on it (at 64 connections
        # with one add each, ~40 share each group).
        waiting = self._waiting.get(group)
        if waiting is None:
            self._waiting[group] = waiting = []
            group.call_when_done(partial(self._on_group_finished, group))
        waiting.append(c)

    def _on_group_finished(self, group: JournalGroup) -> None:
        """``group`` is done: settle each connection that waited on it; the OK add
        replies its syncer sent are counted once for all of them."""
        outer = self._sent_adds
        sent: list[ReplyItem] = []
        self._sent_adds = sent
        try:
            for c in self._waiting.pop(group, ()):
                self._on_group_done(c)
        finally:
            self._sent_adds = outer
            if sent:
                count_sent_adds(self.handler.metrics, sent)

    def _on_group_done(self, c: _Connection) -> None:
        c.waiting_on = None
        try:
            if c.ahead:
                self._collect_sent(c)
            if c.closed:
                if c.ahead:
                    self._wait(c, c.ahead[0].group)
                else:
                    self._release(c)
                return
            self._flush(c)
        except Exception as exc:  # never fail the journal task for one connection
            log.exception("connection_failed", extra=fields(error=repr(exc)))
            self._close(c)

    def _collect_sent(self, c: _Connection) -> None:
        """Settle the replies syncers sent for groups now done: count them, send what a
        socket did not take (and failed groups' replies) in order."""
        metrics = self.handler.metrics
        session = c.session
        inflight = session.conn.inflight
        settled = False
        while c.ahead and c.ahead[0].group.done.is_set():
            a = c.ahead.popleft()
            if c.closed:
                continue
            settled = True
            batch, session.items = session.items[:a.count], session.items[a.count:]
            c.attached -= a.count
            if a.group.error is not None:
                data, _ = session.encode(metrics, batch)  # IO_ERROR, as usual
                self._send(c, data)
                continue
            for item in batch:
                if item.cids is None:
                    inflight.discard(item.correlation_id)
                else:
                    inflight.difference_update(item.cids)
            if self._sent_adds is not None:
                self._sent_adds += batch
            else:
                count_sent_adds(metrics, batch)
            sent = a.send.sent
            if sent < len(a.send.data):
                metrics.syncer_short_sends += 1
                c.sends_stopped = True
                self._send(c, memoryview(a.send.data)[sent:])
            else:
                metrics.syncer_replies += a.replies
        if c.sends_stopped and not c.ahead and not c.wbuf and not c.closed:
            self._resume_sends(c)
        if settled and not c.closed:
            self._after_send(c)  # answered: a paused connection may read again

    def _resume_sends(self, c: _Connection) -> None:
        c.sends_stopped = False
        resume_sends(c.fd)

    def _send(self, c: _Connection, data: bytes | memoryview) -> None:
        """Send ``data`` after whatever is buffered; keep what the socket does not take."""
        if c.wbuf:
            c.wbuf += data
            return
        try:
            n = c.sock.send(data)
        except (BlockingIOError, InterruptedError):
            n = 0
        except OSError:
            self._close(c)  # the peer is gone; what it sent is stored all the same
            return
        if n < len(data):
            c.wbuf += memoryview(data)[n:]
            self._set_mask(c, c.mask | _OUT)

    def _send_buffered(self, c: _Connection) -> None:
        if c.closed or not c.wbuf:
            return
        try:
            n = c.sock.send(c.wbuf)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(c)
            return
        del c.wbuf[:n]
        if not c.wbuf:
            self._set_mask(c, c.mask & ~_OUT)
            if c.sends_stopped and not c.ahead:
                self._resume_sends(c)
        self._after_send(c)

    def _after_send(self, c: _Connection) -> None:
        if c.closing:
            self._close_if_done(c)
        elif c.paused and not c.session.is_full(0, len(c.wbuf)):
            # Room again: take the frames already received (in the hub's task, not in
            # a journal callback), then read the socket again.
            self._resume.append(c)
            os.eventfd_write(self._wake_fd, 1)

    # -- closing -----------------------------------------------------------------------

    def _close_if_done(self, c: _Connection) -> None:
        if c.closing and c.session.owes_nothing and not c.wbuf:
            self._close(c)

    def _set_mask(self, c: _Connection, mask: int) -> None:
        if mask != c.mask and not c.closed:
            c.mask = mask
            self._epoll.modify(c.fd, mask)

    def _close(self, c: _Connection) -> None:
        if c.closed:
            return
        c.closed = True
        c.session.items = []
        c.attached = 0
        self._conns.pop(c.fd, None)
        try:
            self._epoll.unregister(c.fd)
        except (OSError, ValueError) as exc:
            if getattr(exc, "errno", errno.ENOENT) not in (errno.ENOENT, errno.EBADF, None):
                raise
        if c.ahead:
            # A syncer may still send here: the descriptor stays ours until collected.
            self._wait(c, c.ahead[0].group)
        else:
            self._release(c)
        c.done.set()

    def _release(self, c: _Connection) -> None:
        if not c.released:
            c.released = True
            self._resume_sends(c)  # a syncer may have stopped it; the next accept may reuse it
            c.sock.close()
