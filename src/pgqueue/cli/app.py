"""The root of the ``pgqueue`` command: global options, per-invocation state,
and the one place where every error becomes one line.

Every command builds the same Settings object (``Settings.load``: flags >
PGQUEUE_* environment > [tool.pgqueue] in the project's pyproject.toml >
defaults; the project: cli/project.py, which also says which commands may
start the embedded server). Read commands print Rich tables, or one JSON
document with ``--json``. Errors are one red line on stderr: exit code 2 for
usage (bad flags, unreadable input, bad configuration), 1 for everything that
went wrong at run time. ``--debug`` shows the traceback instead.

The commands live in the topic modules (running, producing, jobs, queues,
watching, server, maintenance), which add themselves to ``app``, ``jobs_app`` and
``db_app``; importing ``pgqueue.cli`` imports them all.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from typer.core import TyperGroup

from ..console import missing_extra
from ..core.errors import (
    DatabaseUnavailable,
    EnqueueOutcomeUnknown,
    InvalidJob,
    InvalidQueueControl,
    InvalidSettings,
    OutcomeUnknown,
    PgQueueError,
)
from ..core.settings import Settings
from ..db.connections import check_reachable
from ..db.driver import DRIVER_ERRORS, UNREACHABLE_ERRORS
from ..logs import ENV_LOG_FORMAT, stderr_handler
from . import output
from .options import JsonFlag, LogFormatChoice
from .project import Project, existing_database

if TYPE_CHECKING:
    from ..queue import Queue

__all__ = [
    "State",
    "app",
    "configure_logging",
    "db_app",
    "describe",
    "first_line",
    "jobs_app",
    "main",
    "state_of",
    "wants_json",
]


# -- the root group: where every error becomes one line ---------------------------

# Typer carries its own copy of click; its exception classes are reached
# through the one Typer exports, so that this works with either.
_CLICK_EXCEPTION: type[Exception] = next(
    c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException"
)
_USAGE_ERROR: type[Exception] = next(
    c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError"
)


class _Root(TyperGroup):
    """Runs the command without click's standalone handling and turns every
    exception into one red line and an exit code (2 usage, 1 runtime)."""

    def main(  # type: ignore[override]
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        argv = list(sys.argv[1:] if args is None else args)
        debug = "--debug" in (argv[: argv.index("--")] if "--" in argv else argv)
        try:
            code = super().main(
                args=argv,
                prog_name=prog_name or "pgqueue",
                complete_var=complete_var,
                standalone_mode=False,
                **extra,
            )
            code = code if isinstance(code, int) else 0
        except _USAGE_ERROR as exc:  # bad flags, bad values, missing arguments
            ctx: Any = getattr(exc, "ctx", None)
            if type(exc).__name__ == "NoArgsIsHelpError" and ctx is not None:
                text = ctx.get_help()  # Typer's Rich help prints itself, returns ""
                if text:
                    typer.echo(text)
            else:
                hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
                output.error_line(exc.format_message() + hint)  # type: ignore[attr-defined]
            code = 2
        except _CLICK_EXCEPTION as exc:
            output.error_line(exc.format_message())  # type: ignore[attr-defined]
            code = int(getattr(exc, "exit_code", 1))
        except typer.Abort:
            output.error_line("aborted")
            code = 1
        except Exception as exc:
            if debug:
                raise
            message, code = describe(exc)
            output.error_line(message)
        if standalone_mode:
            sys.exit(code)
        return code


def describe(exc: BaseException) -> tuple[str, int]:
    """The one line and the exit code for an exception."""
    if isinstance(exc, InvalidSettings):
        return f"configuration: {exc}", 2
    if isinstance(exc, InvalidJob):
        return f"invalid job: {exc.field}: {exc.problem}", 1
    if isinstance(exc, InvalidQueueControl):
        return f"invalid queue control: {exc.field}: {exc.problem}", 1
    if isinstance(exc, EnqueueOutcomeUnknown):  # not "unavailable": the job may exist
        show = " or ".join(f"`pgqueue jobs show {job_id}`" for job_id in exc.job_ids[:3])
        return f"{first_line(exc)} ({show})", 1
    if isinstance(exc, OutcomeUnknown):  # the change may have been made
        return first_line(exc), 1
    if isinstance(exc, DatabaseUnavailable):
        return f"database unavailable: {first_line(exc)}", 1
    if isinstance(exc, PgQueueError):  # JobNotFound, JobStateConflict, SchemaNotMigrated...
        return str(exc), 1
    if isinstance(exc, UNREACHABLE_ERRORS):
        return f"database unavailable: {first_line(exc)}", 1
    if isinstance(exc, DRIVER_ERRORS):
        return f"database error: {first_line(exc)}", 1
    if isinstance(exc, OSError):
        return f"{exc.strerror or exc}{f': {exc.filename}' if exc.filename else ''}", 1
    if isinstance(exc, ModuleNotFoundError) and (extra := missing_extra(exc)):
        return f"this command needs an extra: pip install 'pgqueue[{extra}]'", 1
    return f"unexpected {type(exc).__name__}: {first_line(exc)} (--debug shows the traceback)", 1


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


app = typer.Typer(
    cls=_Root,
    name="pgqueue",
    help="pgqueue: a durable job queue on PostgreSQL.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
)
jobs_app = typer.Typer(help="Inspect and act on jobs.", no_args_is_help=True)
db_app = typer.Typer(help="The embedded PostgreSQL server (in --data-dir).", no_args_is_help=True)
app.add_typer(jobs_app, name="jobs")
app.add_typer(db_app, name="db")


# -- per-invocation state -------------------------------------------------------------


@dataclass
class State:
    """What the global options said, and the project the current folder is
    in (cli/project.py); builds the settings and the queue."""

    database_url: str | None = None
    data_dir: str | None = None
    json: bool = False
    debug: bool = False
    out: Console = field(default_factory=output.stdout_console)
    err: Console = field(default_factory=output.stderr_console)
    project: Project = field(default_factory=Project.find)

    def settings(self, **flags: Any) -> Settings:
        return Settings.load(
            root=self.project.folder,
            database_url=self.database_url,
            data_dir=self.data_dir,
            **flags,
        )

    @contextlib.contextmanager
    def queue(self, settings: Settings | None = None) -> Iterator[Queue]:
        """A queue on the database named, or on the project's running embedded
        server: the commands that use this one start no server."""
        # Imported here: the commands that need no Queue (worker, up, db)
        # start without it (about 0.04 s).
        from ..queue import Queue

        settings = settings or self.settings()
        url = existing_database(settings, self.project)
        check_reachable(url, settings.pool_timeout_seconds)
        with Queue(url, settings=settings) as q:
            yield q


def state_of(ctx: typer.Context) -> State:
    state = ctx.find_root().obj
    if not isinstance(state, State):  # a command invoked without the root callback
        state = State()
        ctx.find_root().obj = state
    return state


def wants_json(ctx: typer.Context, flag: bool) -> bool:
    """``--json`` after the command, or before it (the global option)."""
    return flag or state_of(ctx).json


_log_handler: logging.Handler | None = None


def configure_logging(debug: bool, level: int = logging.WARNING, log_format: str = "text") -> None:
    """Log to stderr, unless the host program (or pytest) set up logging
    already; the first call chooses the format."""
    global _log_handler
    root = logging.getLogger()
    if _log_handler is None:
        if root.handlers:
            return
        _log_handler = stderr_handler(log_format)
        root.addHandler(_log_handler)
    root.setLevel(logging.DEBUG if debug else level)
    # The pool logs every failed connection attempt; the error line says it once.
    logging.getLogger("psycopg").setLevel(logging.DEBUG if debug else logging.ERROR)


def _version(value: bool) -> None:
    if value:
        from .. import __version__

        typer.echo(f"pgqueue {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    ctx: typer.Context,
    database_url: Annotated[
        str | None,
        typer.Option(
            "--database-url",
            "--url",
            metavar="URL",
            help="PostgreSQL to use (else DATABASE_URL, PGQUEUE_DATABASE_URL, or the project's "
            "embedded server: the nearest folder up from here holding .pgqueue/ or a "
            "pyproject.toml with [tool.pgqueue]).",
        ),
    ] = None,
    data_dir: Annotated[
        str | None,
        typer.Option(
            "--data-dir",
            metavar="DIR",
            help="Folder of the embedded server (default: .pgqueue in the project's folder).",
        ),
    ] = None,
    json_out: JsonFlag = False,
    debug: Annotated[
        bool, typer.Option("--debug", help="Debug logs, and tracebacks on errors.")
    ] = False,
    log_format: Annotated[
        LogFormatChoice,
        typer.Option(
            "--log-format",
            envvar=ENV_LOG_FORMAT,
            help="Logs as plain text, or as one JSON object per line (with job_id, task, "
            "queue, attempt and worker_id on every job line).",
        ),
    ] = LogFormatChoice.text,
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """pgqueue: a durable job queue on PostgreSQL.

    Settings come from flags, then PGQUEUE_* environment variables, then a
    [tool.pgqueue] table in the project's pyproject.toml, then defaults. The
    project is the nearest folder, from here up, holding .pgqueue/ or a
    pyproject.toml with [tool.pgqueue]. Only up, worker, api, migrate and db
    start start its embedded server.
    """
    ctx.obj = State(database_url=database_url, data_dir=data_dir, json=json_out, debug=debug)
    configure_logging(debug, log_format=log_format.value)
    os.environ[ENV_LOG_FORMAT] = log_format.value  # for the processes it starts


def main() -> None:
    """The console script."""
    app(prog_name="pgqueue")
