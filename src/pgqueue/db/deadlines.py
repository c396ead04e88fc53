"""Bounding one attempt on one connection, whatever the server does.

A statement can wait far past its caller's deadline: a COMMIT waits for a
synchronous standby that is gone (PostgreSQL waits, it does not refuse:
Patroni's strict synchronous mode leaves a primary so), a statement waits
for a lock another session holds, a server accepts TCP and never answers.
``statement_timeout`` bounds only the second: a COMMIT's wait for its
standby is not a statement's, and a silent server runs no timer. So a
``Cutoff`` watches one attempt: at its deadline it sends the server a cancel
request (a lock wait then ends in an error, and a wait for the standby in a
WARNING, the transaction having committed locally); if the attempt has not
ended ``CUT_GRACE_SECONDS`` later, it shuts the connection's socket, so that
libpq reports the connection lost at once instead of waiting for a server
that does not answer. A connection it acted on is closed after the attempt
and never used again: a cancel request that arrives late would cancel
whatever the connection ran next.

What that means for the attempt's outcome is its caller's to say
(retrying.py): an error from the server means the statement did not commit;
a lost connection during a COMMIT, or a WARNING after the cancel, means it
may have (or did, locally).

Sync attempts are watched by one daemon thread for the whole process (a
heap of deadlines: no thread per call); async ones by their event loop's
timers.

Between two attempts, a caller waits ``backoff_delay``: growing, capped
and jittered, so that callers that failed together do not come back
together.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import math
import os
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import psycopg
from psycopg.errors import Diagnostic

from ..core.randomness import chance

__all__ = [
    "CANCEL_SECONDS",
    "CUT_GRACE_SECONDS",
    "Cutoff",
    "backoff_delay",
    "watched",
    "watched_async",
]

# How long after the cancel request the attempt may take to end before its
# socket is shut: a server that is alive answers a cancel in milliseconds.
CUT_GRACE_SECONDS = 0.5
# How long the cancel request itself may take (its own connection, which a
# server that accepts TCP and never answers holds open).
CANCEL_SECONDS = 2.0

# Back-off after a failure: base * 2^n, capped, jittered down to half.
BACKOFF_BASE_SECONDS = 0.05
BACKOFF_CAP_SECONDS = 5.0

log = logging.getLogger("pgqueue.queue")


def backoff_delay(
    attempt: int, base: float = BACKOFF_BASE_SECONDS, cap: float = BACKOFF_CAP_SECONDS
) -> float:
    """Seconds to wait after ``attempt`` consecutive failures (0-based):
    ``base · 2^attempt``, capped, jittered down to half."""
    ceiling = min(cap, base * 2.0 ** min(attempt, 30))
    return ceiling * (0.5 + chance.random() / 2)


class Cutoff:
    """The watch over one attempt on ``conn`` (see the module's docstring).
    ``cancelled``: the deadline passed and a cancel request went out;
    ``cut``: its socket was shut too; ``warned``: the server sent a WARNING
    after the cancel (a wait for a synchronous standby cancelled: the
    transaction committed locally, its replication not confirmed)."""

    def __init__(self, conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> None:
        self.conn = conn
        self.cancelled = False
        self.cut = False
        self.warned = False
        self.ended = False
        self._lock = threading.Lock()
        self._restart: Callable[[], None] = lambda: None

    def restart(self) -> None:
        """Give the watch its whole time again, from now: a call bounded per
        statement (``Settings.call_timeout_seconds``) before each one."""
        if not self.cancelled:
            self._restart()

    def _notice(self, diag: Diagnostic) -> None:
        if self.cancelled and diag.severity_nonlocalized == "WARNING":
            self.warned = True

    def _begin(self) -> bool:
        """Whether the attempt is still running; if so it counts as cancelled."""
        with self._lock:
            if self.ended or self.cancelled:
                return False
            self.cancelled = True
            return True

    def cut_socket(self) -> None:
        """Shut the connection's socket (not close its descriptor, which
        libpq owns): the read libpq waits in ends at once."""
        with self._lock:
            if self.ended:
                return
            self.cut = True
            with contextlib.suppress(Exception):  # already closed: nothing to cut
                dup = socket.socket(fileno=os.dup(self.conn.pgconn.socket))
                try:
                    dup.shutdown(socket.SHUT_RDWR)
                finally:
                    dup.close()
        log.warning(
            "a statement did not end after its cancel request: connection shut",
            extra={"action": "deadline_cut"},
        )

    def end(self) -> None:
        with self._lock:
            self.ended = True


# -- sync: one watchdog thread ------------------------------------------------------


# The watchdog's times are rounded up to this step, so that it wakes at most
# this often however many calls are watched: at 10,000 calls a second, one
# wake-up per call would cost the calls' own thread the interpreter's lock.
TICK_SECONDS = 0.02


class _Timer:
    """One entry of the watchdog: its callback, None once withdrawn."""

    __slots__ = ("callback",)

    def __init__(self, callback: Callable[[], None]) -> None:
        self.callback: Callable[[], None] | None = callback


class _Watchdog:
    """Calls each callback at its monotonic time (rounded up to a tick), on
    one daemon thread, unless it was withdrawn first."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, _Timer]] = []
        self._withdrawn = 0
        self._order = itertools.count()
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None

    def at(self, when: float, callback: Callable[[], None]) -> _Timer:
        when = math.ceil(when / TICK_SECONDS) * TICK_SECONDS
        timer = _Timer(callback)
        with self._wake:
            earliest = self._heap[0][0] if self._heap else None
            heapq.heappush(self._heap, (when, next(self._order), timer))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="pgqueue-deadlines", daemon=True
                )
                self._thread.start()
            elif earliest is None or when < earliest:
                self._wake.notify()
        return timer

    def withdraw(self, timer: _Timer) -> None:
        """Forget ``timer`` (its attempt ended in time). The heap drops the
        withdrawn entries once they are half of it, so that a producer's
        calls, which nearly all end in time, hold no memory until their
        deadlines (5 s of calls by default)."""
        with self._wake:
            if timer.callback is None:
                return
            timer.callback = None
            self._withdrawn += 1
            if self._withdrawn * 2 > len(self._heap):
                self._heap = [entry for entry in self._heap if entry[2].callback is not None]
                heapq.heapify(self._heap)
                self._withdrawn = 0

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._heap or self._heap[0][0] > time.monotonic():
                    self._wake.wait(self._heap[0][0] - time.monotonic() if self._heap else None)
                now = time.monotonic()
                due = []
                while self._heap and self._heap[0][0] <= now:
                    timer = heapq.heappop(self._heap)[2]
                    if timer.callback is None:
                        self._withdrawn -= 1
                    else:
                        due.append(timer.callback)
                        timer.callback = None
            for callback in due:
                try:
                    callback()
                except Exception:  # a callback's bug must not stop every deadline
                    log.exception("deadline callback failed", extra={"action": "deadline_failed"})


_WATCHDOG = _Watchdog()


def _cancel(conn: psycopg.Connection[Any]) -> None:
    with contextlib.suppress(Exception):  # nothing to cancel, or no answer: the cut follows
        conn.cancel_safe(timeout=CANCEL_SECONDS)


def _fire(cutoff: Cutoff) -> None:
    if not cutoff._begin():
        return
    conn = cutoff.conn
    assert isinstance(conn, psycopg.Connection)
    # In a thread of its own: the request may wait CANCEL_SECONDS on a
    # silent server, and the watchdog serves every other deadline.
    threading.Thread(target=_cancel, args=(conn,), daemon=True).start()
    _WATCHDOG.at(time.monotonic() + CUT_GRACE_SECONDS, cutoff.cut_socket)


@contextlib.contextmanager
def watched(conn: psycopg.Connection[Any], seconds: float) -> Iterator[Cutoff]:
    """Watch the block's statements on ``conn`` for ``seconds``; a
    connection the watch acted on is closed at the block's end."""
    cutoff = Cutoff(conn)
    conn.add_notice_handler(cutoff._notice)
    timers = [_WATCHDOG.at(time.monotonic() + seconds, lambda: _fire(cutoff))]

    def restart() -> None:
        _WATCHDOG.withdraw(timers[0])
        timers[0] = _WATCHDOG.at(time.monotonic() + seconds, lambda: _fire(cutoff))

    cutoff._restart = restart
    try:
        yield cutoff
    finally:
        cutoff.end()
        _WATCHDOG.withdraw(timers[0])
        conn.remove_notice_handler(cutoff._notice)
        if cutoff.cancelled:
            conn.close()


# -- async: the event loop's timers ---------------------------------------------------


@contextlib.asynccontextmanager
async def watched_async(
    conn: psycopg.AsyncConnection[Any], seconds: float
) -> AsyncIterator[Cutoff]:
    """``watched`` for an async connection."""
    loop = asyncio.get_running_loop()
    cutoff = Cutoff(conn)
    cancels: list[asyncio.Task[None]] = []

    def fire() -> None:
        if cutoff._begin():
            cancels.append(loop.create_task(_cancel_async(conn)))
            handles.append(loop.call_later(CUT_GRACE_SECONDS, cutoff.cut_socket))

    handles = [loop.call_later(max(0.0, seconds), fire)]

    def restart() -> None:
        handles[0].cancel()
        handles[0] = loop.call_later(max(0.0, seconds), fire)

    cutoff._restart = restart
    conn.add_notice_handler(cutoff._notice)
    try:
        yield cutoff
    finally:
        cutoff.end()
        for handle in handles:
            handle.cancel()
        conn.remove_notice_handler(cutoff._notice)
        if cutoff.cancelled:
            for task in cancels:  # (not awaited: it may wait on a silent server)
                task.add_done_callback(lambda t: t.cancelled() or t.exception())
            await conn.close()


async def _cancel_async(conn: psycopg.AsyncConnection[Any]) -> None:
    with contextlib.suppress(Exception):
        await conn.cancel_safe(timeout=CANCEL_SECONDS)
