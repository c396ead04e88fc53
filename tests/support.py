"""Helpers shared by several test modules."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import uvicorn

from pgqueue.worker import AsyncWorker


@contextlib.asynccontextmanager
async def running(worker: AsyncWorker) -> AsyncIterator[AsyncWorker]:
    """The worker runs on the test's loop for the block; stopped after it."""
    task = asyncio.create_task(worker.run())
    try:
        yield worker
    finally:
        await worker.stop()
        await task


async def until(predicate: Callable[[], Any], timeout: float = 10.0) -> None:  # noqa: ASYNC109
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)


class LiveServer:
    """uvicorn serving an app in a thread, on a socket bound beforehand."""

    def __init__(self, app: object) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        config = uvicorn.Config(app, lifespan="on", log_level="warning", access_log=False)  # type: ignore[arg-type]
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]})

    def __enter__(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "uvicorn did not start"
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()
