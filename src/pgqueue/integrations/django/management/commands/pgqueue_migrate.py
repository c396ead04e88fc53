"""``python manage.py pgqueue_migrate``: create or update pgqueue's tables."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from pgqueue.db.migrate import migrate
from pgqueue.integrations import django as integration


class Command(BaseCommand):  # type: ignore[misc]  # django has no type hints
    help = "Create or update pgqueue's tables in the project's database."

    def handle(self, *args: Any, **options: Any) -> None:
        applied = migrate(integration.settings().database_url)
        self.stdout.write(f"applied: {', '.join(applied)}" if applied else "up to date")
