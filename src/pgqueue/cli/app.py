"""The ``pgqueue`` command line: one command for each thing an operator does.

Every command builds the same Settings object (flags > PGQUEUE_* environment
> [tool.pgqueue] in ./pyproject.toml > defaults, see ``config``). Read
commands print Rich tables, or one JSON document with ``--json``. Errors are
one red line on stderr: exit code 2 for usage (bad flags, unreadable input,
bad configuration), 1 for everything that went wrong at run time. ``--debug``
shows the traceback instead.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import socket
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import IO, Annotated, Any, NoReturn

import psycopg
import typer
from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.panel import Panel
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn
from rich.syntax import Syntax
from rich.table import Table
from typer.core import TyperGroup

from ..embedded import EmbeddedPostgres
from ..errors import (
    DatabaseUnavailable,
    InvalidJob,
    InvalidSettings,
    PgQueueError,
)
from ..jobs import Job, JobSpec, JobState
from ..migrate import migrate
from ..queue import Queue, resolve_url
from ..settings import Settings
from . import output
from .config import load_settings
from .stats import THROUGHPUT_WINDOW_SECONDS, queue_rows

__all__ = ["app", "main"]

DEFAULT_HANDLERS = "examples.tasks:HANDLERS"
JSON_HELP = "Print machine-readable JSON instead of tables."


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
    if isinstance(exc, DatabaseUnavailable):
        return f"database unavailable: {_first_line(exc)}", 1
    if isinstance(exc, PgQueueError):  # JobNotFound, JobStateConflict, ...
        return str(exc), 1
    if isinstance(exc, psycopg.OperationalError):
        return f"database unavailable: {_first_line(exc)}", 1
    if isinstance(exc, psycopg.Error):
        return f"database error: {_first_line(exc)}", 1
    if isinstance(exc, OSError):
        return f"{exc.strerror or exc}{f': {exc.filename}' if exc.filename else ''}", 1
    return f"unexpected {type(exc).__name__}: {_first_line(exc)} (--debug shows the traceback)", 1


def _first_line(exc: BaseException) -> str:
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
jobs_app = typer.Typer(help="Inspect and act on single jobs.", no_args_is_help=True)
db_app = typer.Typer(help="The embedded PostgreSQL server (in --data-dir).", no_args_is_help=True)
app.add_typer(jobs_app, name="jobs")
app.add_typer(db_app, name="db")


# -- per-invocation state -------------------------------------------------------------


@dataclass
class State:
    """What the global options said; builds the settings and the queue."""

    database_url: str | None = None
    data_dir: str | None = None
    json: bool = False
    debug: bool = False
    out: Console = field(default_factory=output.stdout_console)
    err: Console = field(default_factory=output.stderr_console)

    def settings(self, **flags: Any) -> Settings:
        return load_settings(
            {"database_url": self.database_url, "data_dir": self.data_dir, **flags}
        )

    @contextlib.contextmanager
    def queue(self, settings: Settings | None = None) -> Iterator[Queue]:
        settings = settings or self.settings()
        url = resolve_url(settings)
        # One direct connection first: a down server fails at once with the
        # driver's reason, not after the pool's timeout with a generic one.
        timeout = max(1, round(settings.pool_timeout_seconds))
        with psycopg.connect(url, connect_timeout=timeout):
            pass
        with Queue(url, settings=settings) as q:
            yield q


def _state(ctx: typer.Context) -> State:
    state = ctx.find_root().obj
    if not isinstance(state, State):  # a command invoked without the root callback
        state = State()
        ctx.find_root().obj = state
    return state


def _wants_json(ctx: typer.Context, flag: bool) -> bool:
    return flag or _state(ctx).json


_log_handler: logging.Handler | None = None


def _configure_logging(debug: bool, level: int = logging.WARNING) -> None:
    """Log to stderr, unless the host program (or pytest) set up logging already."""
    global _log_handler
    root = logging.getLogger()
    if _log_handler is None:
        if root.handlers:
            return
        _log_handler = logging.StreamHandler(sys.stderr)
        _log_handler.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
        )
        root.addHandler(_log_handler)
    root.setLevel(logging.DEBUG if debug else level)
    # The pool logs every failed connection attempt; the error line says it once.
    logging.getLogger("psycopg").setLevel(logging.DEBUG if debug else logging.ERROR)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"pgqueue {version('pgqueue')}")
        raise typer.Exit()


@app.callback()
def root(
    ctx: typer.Context,
    database_url: Annotated[
        str | None,
        typer.Option(
            "--database-url",
            metavar="URL",
            help="PostgreSQL to use (else DATABASE_URL, PGQUEUE_DATABASE_URL, or the embedded "
            "server in --data-dir).",
        ),
    ] = None,
    data_dir: Annotated[
        str | None,
        typer.Option(
            "--data-dir", metavar="DIR", help="Folder of the embedded server (default: .pgqueue)."
        ),
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
    debug: Annotated[
        bool, typer.Option("--debug", help="Debug logs, and tracebacks on errors.")
    ] = False,
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """pgqueue: a durable job queue on PostgreSQL.

    Settings come from flags, then PGQUEUE_* environment variables, then a
    [tool.pgqueue] table in ./pyproject.toml, then defaults.
    """
    ctx.obj = State(database_url=database_url, data_dir=data_dir, json=json_out, debug=debug)
    _configure_logging(debug)


# -- helpers for options ------------------------------------------------------------------

_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h|d)?", re.IGNORECASE)
_UNIT = {"ms": 0.001, "s": 1.0, "": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> float:
    """Seconds from '90', '1.5s', '5m', '2h', '1h30m', '7d'."""
    cleaned = text.strip().replace(" ", "")
    if not cleaned:
        raise typer.BadParameter("empty duration")
    position, total = 0, 0.0
    for match in _DURATION.finditer(cleaned):
        if match.start() != position:
            break
        total += float(match.group(1)) * _UNIT[(match.group(2) or "").lower()]
        position = match.end()
    if position != len(cleaned):
        raise typer.BadParameter(f"{text!r} is not a duration (e.g. 30, 45s, 5m, 1h30m, 7d)")
    return total


def parse_time(text: str) -> datetime:
    """An ISO 8601 time with a zone (2030-01-01T09:00:00+01:00, ...Z)."""
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        raise typer.BadParameter(
            f"{text!r} is not an ISO 8601 time (e.g. 2030-01-01T09:00:00Z)"
        ) from None
    if value.tzinfo is None:
        raise typer.BadParameter(f"{text!r} has no time zone; add Z or +HH:MM")
    return value


def _split(values: list[str] | None) -> list[str] | None:
    """Repeated and comma-separated values, as one list (None when none)."""
    names = [part.strip() for value in values or [] for part in value.split(",") if part.strip()]
    return names or None


def _redact(url: str) -> str:
    """A URL without its password, for banners."""
    return re.sub(r"(://[^:/@]+:)[^@]*@", r"\1***@", url)


# -- running: migrate, api, worker, up ----------------------------------------------------


@app.command("migrate")
def migrate_cmd(
    ctx: typer.Context,
    json_out: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
) -> None:
    """Create or upgrade the schema (safe to run any number of times)."""
    state = _state(ctx)
    url = resolve_url(state.settings())
    applied = migrate(url)
    if _wants_json(ctx, json_out):
        output.emit_json({"applied": applied})
    elif applied:
        state.out.print(f"applied {len(applied)} migration(s): {', '.join(applied)}")
    else:
        state.out.print("the schema is up to date")


@app.command("api")
def api_cmd(
    ctx: typer.Context,
    host: Annotated[str | None, typer.Option(help="Address to bind (default: 127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option(help="Port to bind (default: 8000).")] = None,
    allow_public: Annotated[
        bool,
        typer.Option("--allow-public", help="Allow a non-loopback address without API tokens."),
    ] = False,
    access_log: Annotated[bool, typer.Option("--access-log", help="Log every request.")] = False,
) -> None:
    """Serve the HTTP API. Tokens come from PGQUEUE_API_TOKENS / PGQUEUE_API_READ_TOKENS."""
    state = _state(ctx)
    settings = state.settings(api_host=host, api_port=port)
    _configure_logging(state.debug, logging.INFO)
    serve = _entry_point("pgqueue.api", "serve", "the HTTP API")
    code = serve(
        settings,
        host=settings.api_host,
        port=settings.api_port,
        allow_public=allow_public,
        access_log=access_log,
    )
    raise typer.Exit(code if isinstance(code, int) else 0)


@app.command("worker")
def worker_cmd(
    ctx: typer.Context,
    handlers: Annotated[
        str, typer.Option(help="Where the handlers are: 'module:MAPPING' (task name -> function).")
    ],
    queues: Annotated[
        list[str] | None,
        typer.Option(
            "--queues",
            "--queue",
            "-q",
            help="Queues to work on (repeat or comma-separate); default: all.",
        ),
    ] = None,
    concurrency: Annotated[
        int | None, typer.Option(min=1, help="Jobs in flight per process (default: 100).")
    ] = None,
    processes: Annotated[int, typer.Option(min=1, help="Worker processes.")] = 1,
) -> None:
    """Run jobs: claim, execute the handler, ack or fail, until SIGINT/SIGTERM."""
    state = _state(ctx)
    settings = state.settings(concurrency=concurrency)
    _configure_logging(state.debug, logging.INFO)
    _check_handlers(handlers)
    run_from_cli = _entry_point("pgqueue.worker", "run_from_cli", "the worker")
    code = run_from_cli(
        handlers,
        queues=_split(queues),
        concurrency=settings.concurrency,
        processes=processes,
        settings=settings,
    )
    raise typer.Exit(int(code or 0))


def _check_handlers(handlers: str) -> None:
    """A bad --handlers is a usage error, said before anything starts."""
    _importable_cwd()
    load_handlers = _entry_point("pgqueue.worker", "load_handlers", "the worker")
    try:
        load_handlers(handlers)
    except (ImportError, ValueError, TypeError) as exc:
        hint = ""
        if handlers == DEFAULT_HANDLERS:
            hint = "; run from the repository root, where examples/ is, or pass --handlers"
        raise typer.BadParameter(_first_line(exc) + hint, param_hint="'--handlers'") from None


def _importable_cwd() -> None:
    """Let '--handlers mymodule:HANDLERS' find modules of the current folder, as
    'python -m' would (the console script's path starts at its own folder)."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if cwd not in paths:  # for worker processes it spawns
        os.environ["PYTHONPATH"] = os.pathsep.join([cwd, *[p for p in paths if p]])


def _entry_point(module: str, name: str, what: str) -> Any:
    import importlib

    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise PgQueueError(f"{what} is not available ({module}.{name}: {exc})") from exc


@app.command("up")
def up_cmd(
    ctx: typer.Context,
    workers: Annotated[int, typer.Option(min=0, help="Worker processes.")] = 2,
    concurrency: Annotated[
        int | None, typer.Option(min=1, help="Jobs in flight per worker.")
    ] = None,
    handlers: Annotated[str, typer.Option(help="Handlers the workers run.")] = DEFAULT_HANDLERS,
    queues: Annotated[
        list[str] | None,
        typer.Option("--queues", "--queue", "-q", help="Queues the workers take (default: all)."),
    ] = None,
    host: Annotated[str | None, typer.Option(help="API address (default: 127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option(help="API port (default: 8000).")] = None,
    allow_public: Annotated[bool, typer.Option("--allow-public")] = False,
    keep_db: Annotated[
        bool, typer.Option("--keep-db", help="Leave the embedded server running on exit.")
    ] = False,
    stop_timeout: Annotated[
        float | None,
        typer.Option(
            min=0.0,
            help="Seconds to wait for processes to stop before killing them "
            "(default: shutdown_timeout_seconds + 5).",
        ),
    ] = None,
) -> None:
    """Run it all: embedded PostgreSQL, migrations, the API and workers. Ctrl-C stops all.

    The workers run the example tasks (--handlers); the logs of every process
    come out in one stream, each line prefixed with the process's name.
    """
    import signal

    from .supervisor import Supervisor

    state = _state(ctx)
    settings = state.settings(api_host=host, api_port=port, concurrency=concurrency)
    if workers:
        _check_handlers(handlers)
    supervisor = Supervisor(
        state.out,
        stop_timeout=stop_timeout
        if stop_timeout is not None
        else settings.shutdown_timeout_seconds + 5.0,
    )
    server: EmbeddedPostgres | None = None
    started_server = False
    # Until the supervisor takes over, Ctrl-C is an ordinary interrupt.
    try:
        if settings.database_url:
            url = settings.database_url
        else:
            server = EmbeddedPostgres(settings.data_dir)
            started_server = not server.is_running()
            verb = "starting" if started_server else "using"
            supervisor.say("up", f"{verb} the embedded PostgreSQL in {server.data_dir}")
            url = server.ensure_running()
        applied = migrate(url)
        supervisor.say(
            "up", "schema " + ("migrated: " + ", ".join(applied) if applied else "up to date")
        )
        env = _child_env(url, settings)
        python = [sys.executable, "-m", "pgqueue", *(["--debug"] if state.debug else [])]
        if server is not None:
            supervisor.tail("postgres", server.log_file)
        supervisor.start(
            "api",
            [
                *python,
                "api",
                "--host",
                settings.api_host,
                "--port",
                str(settings.api_port),
                *(["--allow-public"] if allow_public else []),
            ],
            env,
        )
        worker_args = [
            "worker",
            "--handlers",
            handlers,
            "--concurrency",
            str(settings.concurrency),
            "--processes",
            "1",
        ]
        for name in _split(queues) or []:
            worker_args += ["--queues", name]
        for n in range(1, workers + 1):
            supervisor.start(f"worker-{n}", [*python, *worker_args], env)
    except BaseException:
        if started_server and server is not None and not keep_db:
            server.stop("fast")
        raise

    probe_host = "127.0.0.1" if settings.api_host in ("0.0.0.0", "::", "") else settings.api_host

    def ready() -> bool:
        try:
            with socket.create_connection((probe_host, settings.api_port), timeout=0.2):
                pass
        except OSError:
            return False
        supervisor.say(
            "up",
            f"ready: API on http://{settings.api_host}:{settings.api_port}, "
            f"{workers} worker(s) on {handlers}, database {_redact(url)}. "
            "Ctrl-C stops everything.",
            "bold green",
        )
        return True

    try:
        code = supervisor.run(on_ready=ready)
    except BaseException:
        supervisor.stop(signal.SIGTERM)
        raise
    finally:
        if started_server and server is not None and not keep_db:
            server.stop("fast")
            supervisor.say("up", "stopped the embedded PostgreSQL")
    raise typer.Exit(code)


def _child_env(url: str, settings: Settings) -> dict[str, str]:
    env = dict(os.environ)
    # The resolved URL goes through the environment, not argv (no password in ps).
    env["PGQUEUE_DATABASE_URL"] = url
    env["PGQUEUE_DATA_DIR"] = os.path.abspath(settings.data_dir)
    env["PYTHONUNBUFFERED"] = "1"
    cwd = os.getcwd()
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([cwd, *[p for p in paths if p != cwd]])
    return env


# -- producing ----------------------------------------------------------------------------


@app.command("enqueue")
def enqueue_cmd(
    ctx: typer.Context,
    task: Annotated[str, typer.Argument(help="Task name (the handler's key).")],
    payload: Annotated[str, typer.Option(help="The job's payload: a JSON object.")] = "{}",
    queue: Annotated[str, typer.Option(help="Queue name.")] = "default",
    priority: Annotated[int, typer.Option(help="Higher runs first (-32767..32767).")] = 0,
    delay: Annotated[str | None, typer.Option(help="Run after this long: 30, 45s, 5m, 2h.")] = None,
    run_at: Annotated[
        str | None, typer.Option("--run-at", help="Run at this ISO 8601 time (with a zone).")
    ] = None,
    idempotency_key: Annotated[
        str | None, typer.Option("--idempotency-key", help="Enqueue at most once per key.")
    ] = None,
    max_attempts: Annotated[
        int | None,
        typer.Option("--max-attempts", help="Attempts before the job is dead (default: 5)."),
    ] = None,
    timeout: Annotated[str | None, typer.Option(help="Time limit of one attempt: 30s, 5m.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
) -> None:
    """Add one job."""
    state = _state(ctx)
    try:
        body = json.loads(payload)
    except json.JSONDecodeError as exc:
        raise typer.BadParameter(f"not valid JSON: {exc}", param_hint="'--payload'") from None
    if not isinstance(body, dict):
        raise typer.BadParameter(
            f"must be a JSON object, got {type(body).__name__}", param_hint="'--payload'"
        )
    fields: dict[str, Any] = {
        "queue": queue,
        "priority": priority,
        "idempotency_key": idempotency_key,
        "max_attempts": max_attempts,
    }
    if delay is not None:
        fields["delay"] = _option(parse_duration, delay, "--delay")
    if run_at is not None:
        fields["run_at"] = _option(parse_time, run_at, "--run-at")
    if timeout is not None:
        fields["timeout"] = _option(parse_duration, timeout, "--timeout")
    with state.queue() as q:
        job = q.enqueue(task, body, **fields)
    if _wants_json(ctx, json_out):
        output.emit_json({**job.to_dict(), "duplicate": job.duplicate})
    elif job.duplicate:
        state.out.print(
            f"job [bold]{job.id}[/] already holds idempotency key "
            f"{escape(repr(job.idempotency_key))} (it is {output.state_text(job.state)});"
            " nothing new was written"
        )
    else:
        when = job.run_at.astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")
        state.out.print(
            f"enqueued job [bold]{job.id}[/]: {escape(job.task)} on queue "
            f"{escape(job.queue)}, runs {'at ' + when if delay or run_at else 'now'}"
        )


def _option(parse: Any, value: str, name: str) -> Any:
    try:
        return parse(value)
    except typer.BadParameter as exc:
        raise typer.BadParameter(str(exc), param_hint=f"'{name}'") from None


class _Rejected(Exception):
    pass


def parse_line(text: str, settings: Settings) -> JobSpec:
    """One line of a jobs file as a validated job, or _Rejected saying why."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _Rejected(f"not valid JSON: {exc.msg} (column {exc.colno})") from None
    if not isinstance(value, dict):
        raise _Rejected(f"must be a JSON object, got {type(value).__name__}")
    try:
        return JobSpec.from_fields(value, default_max_attempts=settings.default_max_attempts)
    except InvalidJob as exc:
        raise _Rejected(f"{exc.field}: {exc.problem}") from None


@dataclass
class _FileSummary:
    lines: int = 0
    created: int = 0
    existing: int = 0
    written_lines: int = 0
    rejected: list[tuple[int, str]] = field(default_factory=list)
    not_written: tuple[int, int] | None = None  # first and last line of a failed write
    stopped_at: int | None = None  # the line after which nothing was read
    failure: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "lines": self.lines,
            "created": self.created,
            "existing": self.existing,
            "written_lines": self.written_lines,
            "rejected": [{"line": n, "reason": r} for n, r in self.rejected],
            "not_written": (
                None
                if self.not_written is None
                else {"first_line": self.not_written[0], "last_line": self.not_written[1]}
            ),
            "unread_after_line": self.stopped_at,
            "error": self.failure,
        }


@app.command("enqueue-file")
def enqueue_file_cmd(
    ctx: typer.Context,
    path: Annotated[
        str,
        typer.Argument(
            metavar="JOBS.JSONL",
            help="One JSON job per line ('-' reads stdin): "
            '{"task": ..., "payload": {...}, "queue", "priority", "delay", "run_at", '
            '"max_attempts", "timeout", "idempotency_key"}.',
        ),
    ],
    chunk_size: Annotated[
        int, typer.Option("--chunk-size", min=1, max=5000, help="Jobs written per transaction.")
    ] = 1000,
    atomic: Annotated[
        bool,
        typer.Option(
            "--atomic",
            help="All or nothing: write no job if any line is rejected, and "
            "write all in one transaction.",
        ),
    ] = False,
    json_out: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
) -> None:
    """Add the jobs of a JSON-lines file, in chunks; bad lines are reported, not written.

    Each chunk of good lines is one transaction: it is written whole or not at
    all. Exit code 1 when any line was rejected or a chunk failed to write.
    """
    state = _state(ctx)
    as_json = _wants_json(ctx, json_out)
    settings = state.settings()
    try:
        handle: IO[bytes] = sys.stdin.buffer if path == "-" else open(path, "rb")  # noqa: SIM115
    except OSError as exc:
        raise typer.BadParameter(
            f"cannot open {path}: {exc.strerror}", param_hint="'JOBS.JSONL'"
        ) from None
    total = None if path == "-" else os.fstat(handle.fileno()).st_size
    summary = _FileSummary()
    pending: list[tuple[int, JobSpec]] = []
    progress = Progress(
        TextColumn("enqueue"),
        BarColumn(),
        TaskProgressColumn(),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
        console=state.err,
        transient=False,
        disable=as_json or not state.err.is_terminal,
    )

    def flush(q: Queue) -> bool:
        if not pending:
            return True
        try:
            results = q.enqueue_many([spec for _, spec in pending])
        except (PgQueueError, psycopg.Error) as exc:
            summary.not_written = (pending[0][0], pending[-1][0])
            summary.failure = describe(exc)[0]
            return False
        summary.created += sum(r.created for r in results)
        summary.existing += sum(not r.created for r in results)
        summary.written_lines += len(results)
        pending.clear()
        return True

    with handle, state.queue(settings) as q, progress:
        bar = progress.add_task("enqueue", total=total, info="")
        for number, raw in enumerate(handle, 1):
            summary.lines = number
            progress.update(
                bar,
                advance=len(raw),
                info=f"{summary.created + summary.existing} "
                f"written, {len(summary.rejected)} rejected",
            )
            text = raw.decode("utf-8", "replace").strip()
            if not text:
                continue
            try:
                pending.append((number, parse_line(text, settings)))
            except _Rejected as exc:
                summary.rejected.append((number, str(exc)))
                continue
            if not atomic and len(pending) >= chunk_size and not flush(q):
                summary.stopped_at = number
                break
        else:
            if not (atomic and summary.rejected):
                flush(q)
        progress.update(
            bar,
            info=f"{summary.written_lines} written, {len(summary.rejected)} rejected",
        )
    _report_file(state, summary, as_json, atomic, pending)
    if summary.failure or summary.rejected:
        raise typer.Exit(1)


def _report_file(
    state: State, s: _FileSummary, as_json: bool, atomic: bool, pending: list[tuple[int, JobSpec]]
) -> None:
    if as_json:
        output.emit_json({**s.to_dict(), "atomic": atomic, "written": s.written_lines > 0})
    else:
        _print_file_summary(state.out, s, atomic, pending)
    if s.failure:
        output.error_line(s.failure, console=state.err)
    elif s.rejected:
        output.error_line(f"{len(s.rejected)} line(s) rejected", console=state.err)


def _print_file_summary(
    out: Console, s: _FileSummary, atomic: bool, pending: list[tuple[int, JobSpec]]
) -> None:
    out.print(
        f"read {s.lines} line(s): [green]{s.created} created[/], "
        f"{s.existing} already existed (idempotency key), "
        f"[{'red' if s.rejected else 'green'}]{len(s.rejected)} rejected[/]"
    )
    if s.rejected:
        table = Table("line", "reason", box=None, header_style="bold", pad_edge=False)
        for number, reason in s.rejected[:50]:
            table.add_row(str(number), escape(reason))
        out.print(table)
        if len(s.rejected) > 50:
            out.print(f"... and {len(s.rejected) - 50} more rejected line(s) (--json lists all)")
    if atomic and s.rejected:
        out.print(
            f"[bold]nothing was written[/] (--atomic): {len(pending)} good line(s) were held back"
        )
    elif s.not_written is not None:
        first, last = s.not_written
        after = f"; lines after {s.stopped_at} were not read" if s.stopped_at else ""
        out.print(
            f"[bold red]lines {first}-{last} were not written[/] ({escape(s.failure or '')})"
            f"{after}; {s.written_lines} job(s) from earlier lines were written"
        )
    elif s.rejected:
        out.print(
            f"every other line was written ({s.written_lines} job(s)); fix the rejected "
            "lines and enqueue them again"
        )


# -- jobs -----------------------------------------------------------------------------------


@jobs_app.command("list")
def jobs_list(
    ctx: typer.Context,
    state_filter: Annotated[
        str | None, typer.Option("--state", help=f"One of {', '.join(JobState)}.")
    ] = None,
    queue: Annotated[str | None, typer.Option(help="Only this queue.")] = None,
    task: Annotated[str | None, typer.Option(help="Only this task.")] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000, help="At most this many.")] = 50,
    before: Annotated[
        int | None, typer.Option(help="Only ids below this one (the next page: the last id shown).")
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
) -> None:
    """Jobs, newest first."""
    state = _state(ctx)
    if state_filter is not None and state_filter not in set(JobState):
        raise typer.BadParameter(f"must be one of {', '.join(JobState)}", param_hint="'--state'")
    with state.queue() as q:
        jobs = q.list_jobs(
            state=state_filter, queue=queue, task=task, before_id=before, limit=limit
        )
    if _wants_json(ctx, json_out):
        output.emit_json([job.to_dict() for job in jobs])
        return
    if not jobs:
        state.out.print("no jobs")
        return
    state.out.print(output.jobs_table(jobs, datetime.now(UTC)))
    if len(jobs) == limit:
        state.err.print(f"[dim]more may follow: --before {jobs[-1].id}[/]")


@jobs_app.command("show")
def jobs_show(
    ctx: typer.Context,
    job_id: Annotated[int, typer.Argument(metavar="ID")],
    json_out: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
) -> None:
    """Everything about one job."""
    state = _state(ctx)
    with state.queue() as q:
        job = q.get(job_id)
    if _wants_json(ctx, json_out):
        output.emit_json(job.to_dict())
        return
    _print_job(state.out, job)


def _print_job(out: Console, job: Job) -> None:
    table = Table(box=None, show_header=False, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    for name, value in job.to_dict().items():
        if name in ("payload", "result"):
            continue
        if name == "state":
            shown = output.state_text(job.state)
        elif value is None:
            shown = "[dim]-[/]"
        else:
            shown = escape(str(value))
        table.add_row(name, shown)
    out.print(Panel(table, title=f"job {job.id}", title_align="left", expand=False))
    for name in ("payload", "result"):
        value = getattr(job, name)
        if value is not None:
            out.print(f"[bold]{name}[/]")
            out.print(
                Syntax(
                    json.dumps(value, indent=2, ensure_ascii=False),
                    "json",
                    background_color="default",
                )
            )


@jobs_app.command("cancel")
def jobs_cancel(
    ctx: typer.Context,
    job_id: Annotated[int, typer.Argument(metavar="ID")],
    json_out: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
) -> None:
    """Cancel a queued or running job (a running job's result will be dropped)."""
    state = _state(ctx)
    with state.queue() as q:
        job = q.cancel(job_id)
    if _wants_json(ctx, json_out):
        output.emit_json(job.to_dict())
    else:
        state.out.print(f"cancelled job [bold]{job.id}[/] ({escape(job.task)})")


@jobs_app.command("retry")
def jobs_retry(
    ctx: typer.Context,
    job_id: Annotated[int | None, typer.Argument(metavar="[ID]")] = None,
    all_dead: Annotated[
        bool,
        typer.Option("--all-dead", help="Retry every dead job (of --queue, or of all queues)."),
    ] = False,
    queue: Annotated[str | None, typer.Option(help="With --all-dead: only this queue.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
) -> None:
    """Put a dead or cancelled job back in its queue, or every dead job with --all-dead."""
    state = _state(ctx)
    if (job_id is None) == (not all_dead):
        raise typer.BadParameter(
            "give a job ID or --all-dead (not both)", param_hint="'ID' / '--all-dead'"
        )
    if queue is not None and not all_dead:
        raise typer.BadParameter("only goes with --all-dead", param_hint="'--queue'")
    as_json = _wants_json(ctx, json_out)
    with state.queue() as q:
        if job_id is not None:
            job = q.retry(job_id)
            if as_json:
                output.emit_json(job.to_dict())
            else:
                state.out.print(f"job [bold]{job.id}[/] ({escape(job.task)}) is queued again")
            return
        count = q.retry_dead(queue)
    if as_json:
        output.emit_json({"retried": count, "queue": queue})
    else:
        where = f" of queue {escape(queue)}" if queue else ""
        state.out.print(f"retried {count} dead job(s){where}")


# -- watching: queues and top ------------------------------------------------------------


@app.command("queues")
def queues_cmd(
    ctx: typer.Context,
    json_out: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
) -> None:
    """Per queue: jobs by state, age of the oldest runnable job, jobs done in the last minute.

    queued/scheduled/running are now; succeeded/failed/dead/cancelled are totals
    since the queue began (failed counts failed attempts); done/min counts jobs
    that succeeded or died in the last 60 s.
    """
    state = _state(ctx)
    with state.queue() as q:
        rows = queue_rows(q)
    if _wants_json(ctx, json_out):
        output.emit_json(_queues_json(rows))
    elif len(rows) == 1:
        state.out.print("no jobs yet")
    else:
        state.out.print(output.queues_table(rows))


def _queues_json(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "queues": rows[:-1],
        "total": {k: v for k, v in rows[-1].items() if k != "queue"},
        "window_seconds": THROUGHPUT_WINDOW_SECONDS,
    }


@app.command("top")
def top_cmd(
    ctx: typer.Context,
    interval: Annotated[float, typer.Option(min=0.1, help="Seconds between refreshes.")] = 2.0,
    iterations: Annotated[
        int | None,
        typer.Option(min=1, help="Stop after this many refreshes (default: until Ctrl-C)."),
    ] = None,
    json_out: Annotated[
        bool, typer.Option("--json", help="Print one JSON document per refresh (JSON lines).")
    ] = False,
) -> None:
    """The queues table, refreshing (like top). Ctrl-C leaves."""
    state = _state(ctx)
    as_json = _wants_json(ctx, json_out)
    previous: tuple[float, int] | None = None
    count = 0
    with contextlib.ExitStack() as stack:
        q = stack.enter_context(state.queue())
        live = (
            None
            if as_json
            else stack.enter_context(Live(console=state.out, auto_refresh=False, transient=False))
        )
        try:
            while True:
                rows = queue_rows(q)
                now = time.monotonic()
                done = rows[-1]["succeeded"] + rows[-1]["dead"]
                rate = None
                if previous is not None and now > previous[0]:
                    rate = (done - previous[1]) / (now - previous[0])
                previous = (now, done)
                count += 1
                if as_json:
                    output.emit_json(
                        {**_queues_json(rows), "at": datetime.now(UTC), "done_per_second": rate}
                    )
                else:
                    assert live is not None
                    stamp = datetime.now().strftime("%H:%M:%S")
                    title = (
                        f"pgqueue top  {stamp}  "
                        + (f"{rate:.1f} jobs/s" if rate is not None else "")
                        + f"  (every {interval:g}s, Ctrl-C leaves)"
                    )
                    live.update(output.queues_table(rows, title=title), refresh=True)
                if iterations is not None and count >= iterations:
                    break
                time.sleep(interval)
        except KeyboardInterrupt:
            pass


# -- the embedded server --------------------------------------------------------------------


def _server(ctx: typer.Context) -> EmbeddedPostgres:
    return EmbeddedPostgres(_state(ctx).settings().data_dir)


def _server_status(server: EmbeddedPostgres) -> dict[str, Any]:
    running = server.is_running()
    try:
        port: int | None = server.port
    except (OSError, ValueError):
        port = None
    return {
        "running": running,
        "pid": server.pid() if running else None,
        "port": port,
        # Redacted: `pgqueue db url` is the one command that prints the password.
        "url": _redact(server.url) if port is not None else None,
        "data_dir": str(server.data_dir),
        "initialised": (server.pgdata / "PG_VERSION").exists(),
    }


@db_app.command("start")
def db_start(
    ctx: typer.Context,
    json_out: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
) -> None:
    """Start the embedded server (creating it on first use); print its URL."""
    state = _state(ctx)
    server = _server(ctx)
    was_running = server.is_running()
    url = server.ensure_running()
    if _wants_json(ctx, json_out):
        output.emit_json(_server_status(server))
    else:
        verb = "already running" if was_running else "started"
        state.out.print(
            f"{verb}: {_redact(url)} (pid {server.pid()}, data in {escape(str(server.data_dir))})"
        )


@db_app.command("stop")
def db_stop(
    ctx: typer.Context,
    mode: Annotated[
        str, typer.Option(help="smart: wait for sessions; fast: end them; immediate: like a crash.")
    ] = "fast",
) -> None:
    """Stop the embedded server."""
    if mode not in ("smart", "fast", "immediate"):
        raise typer.BadParameter("must be smart, fast or immediate", param_hint="'--mode'")
    state = _state(ctx)
    server = _server(ctx)
    if not server.is_running():
        state.out.print("not running")
        return
    server.stop(mode)  # type: ignore[arg-type]
    state.out.print(f"stopped ({mode})")


@db_app.command("status")
def db_status(
    ctx: typer.Context,
    json_out: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
) -> None:
    """Whether the embedded server runs, its pid, port and folder."""
    state = _state(ctx)
    status = _server_status(_server(ctx))
    if _wants_json(ctx, json_out):
        output.emit_json(status)
        return
    if status["running"]:
        state.out.print(
            f"[green]running[/]  pid {status['pid']}  port {status['port']}  "
            f"{status['url']}  data {escape(status['data_dir'])}"
        )
    elif status["initialised"]:
        state.out.print(
            f"[yellow]stopped[/]  port {status['port']}  data {escape(status['data_dir'])}"
        )
    else:
        state.out.print(
            f"[yellow]stopped[/]  (no server created yet in "
            f"{escape(status['data_dir'])}; 'pgqueue db start' creates one)"
        )


@db_app.command("url")
def db_url(ctx: typer.Context) -> None:
    """Print the embedded server's URL, password included (for psql "$(pgqueue db url)")."""
    server = _server(ctx)
    status = _server_status(server)
    if status["url"] is None:
        _fail(f"no embedded server in {server.data_dir}; 'pgqueue db start' creates one")
    typer.echo(server.url)
    if not status["running"]:
        _state(ctx).err.print("[yellow]note:[/] the server is stopped ('pgqueue db start')")


def _fail(message: str) -> NoReturn:
    raise PgQueueError(message)


# -- maintenance ---------------------------------------------------------------------------------


@app.command("prune")
def prune_cmd(
    ctx: typer.Context,
    older_than: Annotated[
        str | None,
        typer.Option(
            "--older-than",
            help="Delete finished jobs older than this, e.g. 7d or 12h "
            "(default: the retention_seconds setting).",
        ),
    ] = None,
    batch: Annotated[int | None, typer.Option(min=1, help="Rows per delete.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
) -> None:
    """Delete succeeded, dead and cancelled jobs past retention, in batches, until none is left.

    Counters (queues, metrics) keep their totals.
    """
    state = _state(ctx)
    retention = _option(parse_duration, older_than, "--older-than") if older_than else None
    if retention is not None and retention <= 0:
        raise typer.BadParameter("must be more than 0", param_hint="'--older-than'")
    settings = state.settings(retention_seconds=retention, prune_batch=batch)
    total = 0
    with state.queue(settings) as q:
        while True:
            pruned = q.prune(settings.prune_batch)
            total += pruned
            if pruned < settings.prune_batch:
                break
    if _wants_json(ctx, json_out):
        output.emit_json({"pruned": total, "older_than_seconds": settings.retention_seconds})
    else:
        state.out.print(
            f"pruned {total} finished job(s) older than {output.age(settings.retention_seconds)}"
        )


def main() -> None:
    """The console script."""
    app(prog_name="pgqueue")
