"""The blocking face of the worker: ``Worker(handlers).run()``.

It runs an ``AsyncWorker`` on a loop of its own, turns SIGTERM/SIGINT into a
graceful stop (a second signal exits at once), and turns the outcome into an
exit code: 0 after a clean stop, 1 when a part of the worker failed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from ..core.errors import WorkerFailed
from ..core.settings import Settings
from .handlers import TaskRegistry
from .runtime import AsyncWorker

__all__ = ["Worker"]

log = logging.getLogger("pgqueue.worker")


class Worker:
    """The blocking face: ``Worker(handlers).run()`` works until SIGTERM or
    SIGINT, then shuts down gracefully; a second signal exits at once."""

    def __init__(
        self,
        handlers: Mapping[str, Any] | TaskRegistry,
        *,
        settings: Settings | None = None,
        url: str | None = None,
        queues: Sequence[str] | None = None,
        concurrency: int | None = None,
        name: str | None = None,
        listen: bool = True,
    ) -> None:
        self._args: dict[str, Any] = dict(
            handlers=handlers,
            settings=settings,
            url=url,
            queues=queues,
            concurrency=concurrency,
            name=name,
            listen=listen,
        )
        self.worker: AsyncWorker | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._signals = 0

    def run(self) -> int:
        """Run until signalled; return the exit code: 0 after a clean stop,
        1 when a part of the worker failed (logged with its traceback)."""
        return asyncio.run(self._main())

    async def _main(self) -> int:
        worker = self.worker = AsyncWorker(**self._args)
        loop = self._loop = asyncio.get_running_loop()
        installed = []
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self._on_signal, sig)
                installed.append(sig)
        try:
            await worker.run()
        except WorkerFailed as exc:
            log.error("%s; exiting with status 1", exc, extra={"action": "exit"})
            return 1
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)
        return 0

    def _on_signal(self, sig: signal.Signals) -> None:
        self._signals += 1
        assert self.worker is not None
        if self._signals == 1:
            log.info(
                "received %s: stopping (send it again to exit at once)",
                sig.name,
                extra={"action": "shutdown", "worker_id": self.worker.name},
            )
            self.worker.request_stop()
            return
        log.warning(
            "received %s again: exiting now; unwritten outcomes return to the "
            "queue when their leases expire",
            sig.name,
            extra={"action": "shutdown", "worker_id": self.worker.name},
        )
        logging.shutdown()
        os._exit(128 + sig)

    def request_stop(self) -> None:
        """Stop gracefully, as on SIGTERM; safe to call from any thread."""
        if self.worker is not None and self._loop is not None:
            self._loop.call_soon_threadsafe(self.worker.request_stop)
