"""``python manage.py pgqueue_worker``: run the worker on the project's
handlers (``PGQUEUE["HANDLERS"]``, or ``--handlers``) until SIGTERM/SIGINT."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from pgqueue.integrations import django as integration
from pgqueue.worker.processes import run_processes


class Command(BaseCommand):  # type: ignore[misc]  # django has no type hints
    help = "Run pgqueue's worker on the project's handlers until SIGTERM or SIGINT."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--handlers", help="'module:ATTR' (default: PGQUEUE['HANDLERS'])")
        parser.add_argument("--queues", help="comma-separated (default: PGQUEUE['QUEUES'])")
        parser.add_argument("--concurrency", type=int)
        parser.add_argument("--processes", type=int, default=1)

    def handle(self, *args: Any, **options: Any) -> None:
        config = integration._config()
        handlers = options["handlers"] or config.get("HANDLERS")
        if not handlers:
            raise CommandError("say which handlers to run: PGQUEUE['HANDLERS'] or --handlers")
        queues = options["queues"].split(",") if options["queues"] else config.get("QUEUES")
        settings = integration.settings()
        code = run_processes(
            handlers,
            queues=queues,
            concurrency=options["concurrency"] or config.get("CONCURRENCY") or settings.concurrency,
            processes=options["processes"],
            settings=settings,
        )
        if code:
            raise CommandError(f"the worker stopped with exit status {code}", returncode=code)
