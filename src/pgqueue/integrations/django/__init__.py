"""pgqueue in a Django project (psycopg 3 backend).

    INSTALLED_APPS = [..., "pgqueue.integrations.django"]
    PGQUEUE = {"HANDLERS": "myapp.tasks:tasks", "QUEUES": ["default"], "CONCURRENCY": 20}

* ``enqueue(task, payload, **fields)`` / ``enqueue_many(jobs)`` write on
  Django's own connection, so inside ``transaction.atomic()`` the job
  commits or rolls back with the rest (outside it, Django autocommits, and
  so does the job).
* ``python manage.py pgqueue_migrate`` creates or updates pgqueue's tables;
  ``python manage.py pgqueue_worker`` runs the worker on ``HANDLERS``.
* ``settings()`` is pgqueue's Settings for the project: the database of
  ``DATABASES["default"]`` (or ``PGQUEUE["DATABASE"]``), and every other key
  of ``PGQUEUE`` as a setting of the same name in lower case
  (``"LEASE_SECONDS": 60``); ``HANDLERS``, ``QUEUES`` and ``CONCURRENCY``
  are the worker command's defaults.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from typing import Any

from ...core.jobs import Job
from ...core.settings import Settings
from ...db.connections import url_from_params
from ...queue import Queue

__all__ = ["database_url", "enqueue", "enqueue_many", "queue", "settings"]

# Keys of PGQUEUE that are the worker command's, not Settings fields.
WORKER_KEYS = ("HANDLERS", "QUEUES", "CONCURRENCY", "DATABASE")

_lock = threading.Lock()
_queue: Queue | None = None


def _config() -> Mapping[str, Any]:
    from django.conf import settings as django_settings

    return getattr(django_settings, "PGQUEUE", {})


def database_url(alias: str = "default") -> str:
    """A libpq URL for one of Django's DATABASES."""
    from django.db import connections

    params = connections[alias].get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    params.pop("prepare_threshold", None)
    params.pop("server_side_binding", None)
    return url_from_params(params)


def settings() -> Settings:
    """pgqueue's Settings for this project (see the module docstring)."""
    config = _config()
    fields = {k.lower(): v for k, v in config.items() if k not in WORKER_KEYS}
    return Settings(database_url=database_url(config.get("DATABASE", "default")), **fields)


def queue() -> Queue:
    """The project's Queue (one per process), for reads and for enqueues
    outside Django's transactions."""
    global _queue
    with _lock:
        if _queue is None:
            _queue = Queue(settings=settings())
        return _queue


def _django_connection() -> Any:
    from django.db import connection

    connection.ensure_connection()
    return connection.connection


def enqueue(task: str, payload: Any = None, **fields: Any) -> Job:
    """``Queue.enqueue`` on Django's connection: in its transaction."""
    return queue().enqueue(task, payload, connection=_django_connection(), **fields)


def enqueue_many(jobs: Iterable[Mapping[str, Any]]) -> list[Any]:
    """``Queue.enqueue_many`` on Django's connection: in its transaction."""
    return queue().enqueue_many(jobs, connection=_django_connection())
