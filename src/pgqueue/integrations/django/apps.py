"""The Django app of pgqueue's integration."""

from __future__ import annotations

from django.apps import AppConfig


class PgQueueConfig(AppConfig):  # type: ignore[misc]  # django has no type hints
    name = "pgqueue.integrations.django"
    label = "pgqueue"
    verbose_name = "pgqueue"
