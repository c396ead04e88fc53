"""pgqueue in a FastAPI app: the producer pool opened and closed with the
app, a dependency that hands it to routes, and (optional) a worker running
in the app's own process, for small apps that want one process::

    pgq = PgQueue(worker=tasks)          # worker=None: produce only
    app = FastAPI(lifespan=pgq.lifespan)

    @app.post("/signup")
    async def signup(queue: Annotated[AsyncQueue, Depends(pgq.queue)]) -> dict:
        job = await queue.enqueue("send_receipt", {"to": "ada@example.com"})
        return {"job": job.id}

The in-process worker is supervised: bad handlers stop the app's start; if
the worker fails (``WorkerFailed``: a part crashed; the traceback is
logged), it is started again after a growing delay
(1 s, doubling, at most 60 s), so that the app never goes on serving while
its jobs silently stop. It stops gracefully with the app (running jobs
finish, within ``shutdown_timeout_seconds``). Its concurrency is the
setting's, or ``worker_concurrency``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any

from ..core.settings import Settings
from ..queue import AsyncQueue
from ..worker import AsyncWorker, TaskRegistry

__all__ = ["PgQueue"]

log = logging.getLogger("pgqueue.integrations")

RESTART_MIN_SECONDS = 1.0
RESTART_MAX_SECONDS = 60.0


class PgQueue:
    """The queue (and optionally a worker) of one FastAPI app."""

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        worker: Mapping[str, Any] | TaskRegistry | None = None,
        queues: list[str] | None = None,
        worker_concurrency: int | None = None,
    ) -> None:
        self.settings = settings or Settings.load()
        self.handlers = worker
        self.queues = queues
        self.worker_concurrency = worker_concurrency
        self.restarts = 0  # how many times the in-process worker was started again
        self._queue: AsyncQueue | None = None
        self._worker: AsyncWorker | None = None
        self._stopping = False

    async def queue(self) -> AsyncQueue:
        """The app's AsyncQueue: a FastAPI dependency (``Depends(pgq.queue)``)."""
        if self._queue is None:
            raise RuntimeError("the app is not started: give FastAPI lifespan=pgq.lifespan")
        return self._queue

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Any) -> AsyncIterator[None]:
        """Open the queue (and start the worker) with the app; close them after."""
        async with AsyncQueue(settings=self.settings) as queue:
            self._queue = queue
            supervisor = None
            if self.handlers is not None:
                # Made here, so that bad handlers or settings stop the app's
                # start rather than a task nobody watches.
                self._worker = self._new_worker(self.handlers)
                supervisor = asyncio.create_task(
                    self._supervise(self.handlers), name="pgqueue-in-app-worker"
                )
            try:
                yield
            finally:
                if supervisor is not None:
                    await self._stop(supervisor)
                self._queue = None

    async def _stop(self, supervisor: asyncio.Task[None]) -> None:
        """Stop the worker gracefully (its run returns once running jobs
        finished), or the supervisor's wait before a restart."""
        self._stopping = True
        if self._worker is not None:
            await self._worker.stop()
        if not supervisor.done():
            supervisor.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await supervisor

    def _new_worker(self, handlers: Mapping[str, Any] | TaskRegistry) -> AsyncWorker:
        return AsyncWorker(
            handlers,
            settings=self.settings,
            queues=self.queues,
            concurrency=self.worker_concurrency,
        )

    async def _supervise(self, handlers: Mapping[str, Any] | TaskRegistry) -> None:
        """Run the worker; after a failure (logged with its traceback), a new
        one after a growing delay."""
        delay = RESTART_MIN_SECONDS
        while not self._stopping:
            assert self._worker is not None
            try:
                await self._worker.run()
                return  # stopped on purpose
            except Exception:  # WorkerFailed, or anything run() did not expect
                log.exception(
                    "the in-app worker failed; starting it again in %.0f s",
                    delay,
                    extra={"action": "restart"},
                )
            self.restarts += 1
            await asyncio.sleep(delay)
            delay = min(delay * 2, RESTART_MAX_SECONDS)
            self._worker = self._new_worker(handlers)
