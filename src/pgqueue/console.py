"""The ``pgqueue`` console script, and ``python -m pgqueue``.

The command line is an extra (``pip install 'pgqueue[cli]'``): without Typer
and Rich this says how to get it, in one line, instead of a traceback.
"""

from __future__ import annotations

import sys

__all__ = ["main"]

# What each extra brings, by the top-level module a missing import names.
EXTRA_OF = {
    "typer": "cli",
    "rich": "cli",
    "click": "cli",
    "fastapi": "api",
    "starlette": "api",
    "uvicorn": "api",
    "pydantic": "api",
    "fastapi_offline": "api",
    "prometheus_client": "api",
}


def missing_extra(exc: ModuleNotFoundError) -> str | None:
    """The extra that would have installed the missing module, if any."""
    return EXTRA_OF.get((exc.name or "").split(".", 1)[0])


# The console script's arguments, set before it imports the command line,
# which then loads only the commands they name (pgqueue.cli.topics_for).
# None when the command line is imported by anything else.
command_line: list[str] | None = None


def main() -> None:
    global command_line
    command_line = sys.argv[1:]
    try:
        from .cli import main as cli_main
    except ModuleNotFoundError as exc:
        extra = missing_extra(exc)
        if extra is None:
            raise
        sys.exit(f"pgqueue: the command line needs its extra: pip install 'pgqueue[{extra}]'")
    cli_main()
