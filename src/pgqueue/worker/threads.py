"""A small thread pool for sync handlers.

Why not ``concurrent.futures.ThreadPoolExecutor``: its threads are joined at
interpreter exit, so one hung handler (past its timeout, which cannot kill a
thread) would keep a stopped worker from exiting. These threads are daemons.
They also hand results back in batches: one loop wake-up for every result
that finished since the last one, instead of one per job.

A handler given up on (its timeout passed, or its lease was lost) keeps its
thread until it returns: ``abandon`` counts it in ``hung`` until then, so
that the worker does not count its slot as free.
"""

from __future__ import annotations

import asyncio
import collections
import queue
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["ThreadPool"]

_Item = tuple[Callable[[Any], Any], Any, "asyncio.Future[Any]"]


class ThreadPool:
    """Run ``fn(arg)`` on up to ``size`` daemon threads; await the result."""

    def __init__(
        self,
        size: int,
        name: str = "pgqueue-handler",
        on_hung_return: Callable[[], None] = lambda: None,
    ) -> None:
        self.size = size
        self.hung = 0  # abandoned handlers still running; loop thread only
        self._name = name
        self._on_hung_return = on_hung_return
        self._work: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._outstanding = 0  # submitted and not yet returned; loop thread only
        self._done: collections.deque[tuple[asyncio.Future[Any], Any, BaseException | None]] = (
            collections.deque()
        )
        self._drain_scheduled = False
        self._loop: asyncio.AbstractEventLoop | None = None

    def submit(self, fn: Callable[[Any], Any], arg: Any) -> asyncio.Future[Any]:
        loop = self._loop = self._loop or asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._outstanding += 1
        if self._outstanding > len(self._threads) and len(self._threads) < self.size:
            thread = threading.Thread(
                target=self._run, name=f"{self._name}-{len(self._threads)}", daemon=True
            )
            self._threads.append(thread)
            thread.start()
        self._work.put((fn, arg, future))
        return future

    def abandon(self, future: asyncio.Future[Any]) -> None:
        """The caller gave up on ``future``; its thread runs on until the
        handler returns, and its late result or error is dropped."""
        if future.done():
            return
        self.hung += 1

        def returned(done: asyncio.Future[Any]) -> None:
            self.hung -= 1
            if not done.cancelled():
                done.exception()  # retrieved: nobody else will look at it
            self._on_hung_return()

        future.add_done_callback(returned)

    @property
    def busy(self) -> int:
        """Handlers still running, including ones whose caller gave up (timeout)."""
        return self._outstanding

    def shutdown(self) -> None:
        """Let idle threads end; busy ones end when their handler returns."""
        for _ in self._threads:
            self._work.put(None)
        self._threads.clear()

    def _run(self) -> None:
        while True:
            item = self._work.get()
            if item is None:
                return
            fn, arg, future = item
            try:
                result, error = fn(arg), None
            except BaseException as exc:  # handed to the awaiting task
                result, error = None, exc
            self._done.append((future, result, error))
            if not self._drain_scheduled:
                self._drain_scheduled = True
                assert self._loop is not None
                try:
                    self._loop.call_soon_threadsafe(self._drain)
                except RuntimeError:  # the loop is closed: nobody is waiting
                    return

    def _drain(self) -> None:
        # Clear the flag before reading, so that a result appended after this
        # point schedules another drain rather than being missed.
        self._drain_scheduled = False
        done = self._done
        while done:
            future, result, error = done.popleft()
            self._outstanding -= 1
            if future.cancelled():
                continue  # the caller timed out or was cancelled: late result dropped
            if error is None:
                future.set_result(result)
            else:
                future.set_exception(error)
