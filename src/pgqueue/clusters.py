"""Queues spread over several PostgreSQL clusters (docs/scaling.md).

The ``clusters`` setting maps a queue's name to the database that holds it,
with ``"*"`` for every queue not named::

    [tool.pgqueue]
    clusters = { emails = "postgresql://db-2/app", "*" = "postgresql://db-1/app" }

``ClusterMap`` answers where a queue lives (no I/O). ``Clusters`` and
``AsyncClusters`` hold one ``Queue``/``AsyncQueue`` per database and send
each enqueue to its queue's: ``clusters.enqueue("send", queue="emails")``;
``clusters.queue("emails")`` is that database's queue object for everything
else (``get``, ``wait``, ``cancel``, ``pause``...: a job id means something
in one database only). A queue that is not in the map, with no ``"*"``,
raises ``ClusterNotMapped`` and nothing is written.

What stays per cluster: a transaction. ``enqueue(..., connection=conn)``
commits with the caller's transaction, and that connection is one cluster's:
give it only for queues of that cluster. ``enqueue_many`` over queues of
several clusters commits one transaction per cluster, in the order the
clusters first appear; if one fails, the clusters before it keep their jobs.
A workflow's jobs (depends_on) must share a cluster.

Each cluster runs its own workers (``pgqueue worker`` with ``clusters`` set
runs one set per cluster; worker/clusters.py), migrations and retention.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Self, TypeVar

from .core.enqueue import Enqueued
from .core.errors import InvalidJob, InvalidSettings
from .core.job_spec import JobSpec, build_specs
from .core.jobs import QUEUE_NAME, Job
from .core.rules import Name
from .core.settings import Settings
from .queue import AsyncQueue, Queue

__all__ = [
    "EVERY_QUEUE",
    "AsyncClusters",
    "ClusterMap",
    "ClusterNotMapped",
    "Clusters",
    "cluster_settings",
    "worker_groups",
]

EVERY_QUEUE = "*"
_QUEUE_NAME = Name(QUEUE_NAME)


class ClusterNotMapped(InvalidJob):
    """No cluster holds the queue: it is not in ``clusters``, which has no "*"."""

    def __init__(self, queue: str) -> None:
        super().__init__(
            "queue",
            f"{queue!r} is in no cluster: the clusters setting names neither it nor '*'",
        )
        self.queue = queue


@dataclass(frozen=True)
class ClusterMap:
    """Queue name (or EVERY_QUEUE) -> database URL, checked."""

    routes: Mapping[str, str]

    def __post_init__(self) -> None:
        if not self.routes:
            raise InvalidSettings("clusters: the map is empty")
        for queue in self.routes:
            if queue != EVERY_QUEUE:
                try:
                    _QUEUE_NAME.check("queue", queue)
                except InvalidJob as exc:
                    raise InvalidSettings(f"clusters: {exc.problem}") from None

    @classmethod
    def from_settings(cls, settings: Settings) -> Self:
        return cls(settings.clusters)

    def url_for(self, queue: str) -> str:
        """The database that holds ``queue``; ClusterNotMapped if none does."""
        url = self.routes.get(queue) or self.routes.get(EVERY_QUEUE)
        if url is None:
            raise ClusterNotMapped(queue)
        return url

    @property
    def urls(self) -> list[str]:
        """Each database once, in the map's order."""
        return list(dict.fromkeys(self.routes.values()))

    def queues_at(self, url: str, wanted: Sequence[str] | None = None) -> list[str] | None:
        """The queues a worker of ``url`` works on: of ``wanted`` (None: all),
        those the map sends there; None means every queue (``url`` holds "*"
        and nothing narrowed it)."""
        if wanted is not None:
            return [queue for queue in wanted if self.url_for(queue) == url]
        if self.routes.get(EVERY_QUEUE) == url:
            return None
        return [queue for queue, to in self.routes.items() if to == url]

    def split(self, specs: Sequence[JobSpec]) -> dict[str, list[int]]:
        """The positions of ``specs`` by the database each goes to."""
        by_url: dict[str, list[int]] = {}
        for index, spec in enumerate(specs):
            by_url.setdefault(self.url_for(spec.queue), []).append(index)
        return by_url


def cluster_settings(settings: Settings, url: str) -> Settings:
    """The settings of one cluster's queue object or worker: its URL, no
    map (it is one cluster), and direct_url only if it is database_url's."""
    direct = settings.direct_url if url == settings.database_url else ""
    return settings.replace(database_url=url, direct_url=direct, clusters={})


def worker_groups(
    settings: Settings, queues: Sequence[str] | None
) -> list[tuple[Settings, list[str] | None]]:
    """What ``pgqueue worker`` runs with ``clusters`` set: per database, its
    settings and the queues its workers take (of ``queues``, None: all);
    a database none of ``queues`` lives in gets no worker."""
    routes = ClusterMap.from_settings(settings)
    groups = []
    for url in routes.urls:
        wanted = routes.queues_at(url, queues)
        if wanted != []:
            groups.append((cluster_settings(settings, url), wanted))
    return groups


def in_order(by_url: Mapping[str, list[int]], done: Mapping[str, list[Enqueued]]) -> list[Enqueued]:
    """The results of each database's enqueue_many, back in the jobs' order."""
    placed = {
        position: result
        for url, positions in by_url.items()
        for position, result in zip(positions, done[url], strict=True)
    }
    return [placed[position] for position in range(len(placed))]


Q = TypeVar("Q", Queue, AsyncQueue)


class _Router(Generic[Q]):
    """The map, the settings, and one queue object per database."""

    def __init__(
        self, make: type[Q], settings: Settings | None, clusters: Mapping[str, str] | None
    ) -> None:
        self.settings = settings or Settings.load()
        self.map = ClusterMap(self.settings.clusters if clusters is None else clusters)
        self._queues: dict[str, Q] = {}
        for url in self.map.urls:
            self._queues[url] = make(url, settings=cluster_settings(self.settings, url))

    def queue(self, name: str = "default") -> Q:
        """The queue object of the database that holds queue ``name``."""
        return self._queues[self.map.url_for(name)]

    def _split(
        self, jobs: Iterable[JobSpec | Mapping[str, Any]]
    ) -> tuple[list[JobSpec], dict[str, list[int]]]:
        """Every job checked (one bad job writes nothing anywhere), then
        grouped by database."""
        specs = build_specs(jobs, default_max_attempts=self.settings.default_max_attempts)
        return specs, self.map.split(specs)


class Clusters(_Router[Queue]):
    """The blocking router: ``with Clusters() as c: c.enqueue("send", queue="emails")``."""

    def __init__(
        self, settings: Settings | None = None, *, clusters: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(Queue, settings, clusters)

    def enqueue(
        self, task: str, payload: Any = None, *, queue: str = "default", **fields: Any
    ) -> Job:
        """``Queue.enqueue`` on the database of ``queue``."""
        return self.queue(queue).enqueue(task, payload, queue=queue, **fields)

    def enqueue_many(self, jobs: Iterable[JobSpec | Mapping[str, Any]]) -> list[Enqueued]:
        """``Queue.enqueue_many``, one transaction per database; results in order."""
        specs, by_url = self._split(jobs)
        done = {
            url: self._queues[url].enqueue_many([specs[i] for i in positions])
            for url, positions in by_url.items()
        }
        return in_order(by_url, done)

    def close(self) -> None:
        for queue in self._queues.values():
            queue.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncClusters(_Router[AsyncQueue]):
    """The asyncio router: ``async with AsyncClusters() as c: await c.enqueue(...)``."""

    def __init__(
        self, settings: Settings | None = None, *, clusters: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(AsyncQueue, settings, clusters)

    async def enqueue(
        self, task: str, payload: Any = None, *, queue: str = "default", **fields: Any
    ) -> Job:
        """``AsyncQueue.enqueue`` on the database of ``queue``."""
        return await self.queue(queue).enqueue(task, payload, queue=queue, **fields)

    async def enqueue_many(self, jobs: Iterable[JobSpec | Mapping[str, Any]]) -> list[Enqueued]:
        """``AsyncQueue.enqueue_many``, one transaction per database; results in order."""
        specs, by_url = self._split(jobs)
        done = {
            url: await self._queues[url].enqueue_many([specs[i] for i in positions])
            for url, positions in by_url.items()
        }
        return in_order(by_url, done)

    async def open(self) -> Self:
        for queue in self._queues.values():
            await queue.open()
        return self

    async def close(self) -> None:
        for queue in self._queues.values():
            await queue.close()

    async def __aenter__(self) -> Self:
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
