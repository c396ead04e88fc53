"""Claims of every queue by a ``Queue``/``AsyncQueue`` (no worker): which
queues to ask. I/O-free, like transitions.py."""

from __future__ import annotations

import math
import time

from . import reads
from . import transitions as t
from .flows import Flow
from .jobs import Job
from .settings import Settings

__all__ = ["EveryQueue"]


class EveryQueue:
    """Claims of every queue (``Queue.claim`` without queues) ask the
    queues that had jobs when last listed, so that a claim is one statement,
    not two. The list is read again when it is older than ``max_age``
    seconds, and when a claim from it comes back short: then the queues it
    did not have are asked at once."""

    def __init__(self, max_age: float) -> None:
        self.max_age = max_age
        self.names: list[str] = []
        self._listed_at = -math.inf  # (monotonic: the age of a list, not a time)

    def claim(self, settings: Settings, *, limit: int, worker: str) -> Flow[list[Job]]:
        fresh = time.monotonic() - self._listed_at > self.max_age
        if fresh:
            yield from self._list()
        jobs = yield from t.claim(settings, limit=limit, worker=worker, queues=self.names)
        if len(jobs) < limit and not fresh:
            known = set(self.names)
            yield from self._list()
            new = [name for name in self.names if name not in known]
            if new:
                more = t.claim(settings, limit=limit - len(jobs), worker=worker, queues=new)
                jobs += yield from more
        return jobs

    def _list(self) -> Flow[None]:
        self.names = yield from reads.queues_with_jobs()
        self._listed_at = time.monotonic()
