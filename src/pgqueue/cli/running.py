"""Running the stack: ``migrate``, ``api``, ``worker`` and ``up`` (all of them at once)."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.text import Text

from ..core.settings import Settings
from ..db.connections import resolve_url
from ..db.embedded import EmbeddedPostgres
from ..db.migrate import migrate
from ..logs import ENV_LOG_FORMAT
from ..processes import Child, ProcessSupervisor
from ..worker import load_handlers
from ..worker.handlers import find_target
from ..worker.processes import run_processes
from . import output
from .app import app, configure_logging, first_line, state_of, wants_json
from .options import JsonFlag, redact, split

__all__ = ["DEFAULT_HANDLERS"]

DEFAULT_HANDLERS = "pgqueue.demo:HANDLERS"

QueuesOption = Annotated[
    list[str] | None,
    typer.Option(
        "--queues",
        "--queue",
        "-q",
        help="Queues to work on (repeat or comma-separate); default: all.",
    ),
]


@app.command("migrate")
def migrate_cmd(ctx: typer.Context, json_out: JsonFlag = False) -> None:
    """Create or upgrade the schema (safe to run any number of times)."""
    state = state_of(ctx)
    applied = migrate(resolve_url(state.settings()))
    if wants_json(ctx, json_out):
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
    # Imported here, not at the top: importing FastAPI would slow the start
    # of every other command.
    from ..api import serve

    state = state_of(ctx)
    settings = state.settings(api_host=host, api_port=port)
    configure_logging(state.debug, logging.INFO)
    serve(
        settings,
        host=settings.api_host,
        port=settings.api_port,
        allow_public=allow_public,
        access_log=access_log,
        own_logging=os.environ.get(ENV_LOG_FORMAT) == "json",
    )


@app.command("worker")
def worker_cmd(
    ctx: typer.Context,
    handlers: Annotated[
        str, typer.Option(help="Where the handlers are: 'module:MAPPING' (task name -> function).")
    ],
    queues: QueuesOption = None,
    concurrency: Annotated[
        int | None, typer.Option(min=1, help="Jobs in flight per process (default: 100).")
    ] = None,
    processes: Annotated[int, typer.Option(min=1, help="Worker processes.")] = 1,
) -> None:
    """Run jobs: claim, execute the handler, ack or fail, until SIGINT/SIGTERM."""
    state = state_of(ctx)
    settings = state.settings(concurrency=concurrency)
    configure_logging(state.debug, logging.INFO)
    # Only what needs none of the handlers' module's code: run_processes
    # imports it when it may (before one worker in this process starts, or
    # once the worker processes are forked: they must not share what it opens).
    _check_handlers(handlers, import_module=False)
    code = run_processes(
        handlers,
        queues=split(queues),
        concurrency=settings.concurrency,
        processes=processes,
        settings=settings,
        check_handlers=_check_handlers,
    )
    raise typer.Exit(code)


def _check_handlers(handlers: str, import_module: bool = True) -> None:
    """A bad --handlers is a usage error, said before anything starts (what
    needs the module imported, with ``import_module`` False: once the worker
    processes have started, which then stop)."""
    _importable_cwd()
    try:
        if import_module:
            load_handlers(handlers)
        else:
            find_target(handlers)
    except (ImportError, ValueError, TypeError) as exc:
        raise typer.BadParameter(first_line(exc), param_hint="'--handlers'") from None


def _importable_cwd() -> None:
    """Let '--handlers mymodule:HANDLERS' find modules of the current folder, as
    'python -m' would (the console script's path starts at its own folder)."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if cwd not in paths:  # for worker processes it spawns
        os.environ["PYTHONPATH"] = os.pathsep.join([cwd, *[p for p in paths if p]])


# -- up ---------------------------------------------------------------------------------


@app.command("up")
def up_cmd(
    ctx: typer.Context,
    workers: Annotated[int, typer.Option(min=0, help="Worker processes.")] = 2,
    concurrency: Annotated[
        int | None, typer.Option(min=1, help="Jobs in flight per worker.")
    ] = None,
    handlers: Annotated[str, typer.Option(help="Handlers the workers run.")] = DEFAULT_HANDLERS,
    queues: QueuesOption = None,
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

    The workers run the demo tasks (pgqueue.demo) unless --handlers says
    otherwise; the logs of every process come out in one stream, each line
    prefixed with the process's name.
    """
    state = state_of(ctx)
    settings = state.settings(api_host=host, api_port=port, concurrency=concurrency)
    if workers:
        _check_handlers(handlers)
    printer = _Printer(state.out)
    server: EmbeddedPostgres | None = None
    if not settings.database_url:
        server = EmbeddedPostgres(settings.data_dir)
    started_server = server is not None and not server.is_running()
    try:
        url = _database(settings, server, printer)
        children = _children(
            url, settings, workers, handlers, split(queues), allow_public, state.debug
        )
        supervisor = ProcessSupervisor(
            children,
            stop_timeout=settings.shutdown_timeout_seconds + 5.0
            if stop_timeout is None
            else stop_timeout,
            on_event=printer.event,
            on_output=printer.say,
        )
        if server is not None:
            printer.tail("postgres", server.log_file)
        ready = _banner(printer, settings, f"{workers} worker(s) on {handlers}", url)
        try:
            code = supervisor.run(on_ready=ready)
        except BaseException:
            supervisor.stop(signal.SIGTERM)
            raise
    finally:
        printer.close()
        if started_server and server is not None and not keep_db:
            server.stop("fast")
            printer.say("up", "stopped the embedded PostgreSQL")
    raise typer.Exit(code)


def _database(settings: Settings, server: EmbeddedPostgres | None, printer: _Printer) -> str:
    """The database's URL, started and migrated."""
    if server is None:
        url = settings.database_url
    else:
        verb = "using" if server.is_running() else "starting"
        printer.say("up", f"{verb} the embedded PostgreSQL in {server.data_dir}")
        url = server.ensure_running()
    applied = migrate(url)
    printer.say("up", "schema " + ("migrated: " + ", ".join(applied) if applied else "up to date"))
    return url


def _children(
    url: str,
    settings: Settings,
    workers: int,
    handlers: str,
    queues: list[str] | None,
    allow_public: bool,
    debug: bool,
) -> list[Child]:
    env = _child_env(url, settings)
    python = [sys.executable, "-m", "pgqueue", *(["--debug"] if debug else [])]
    api = [*python, "api", "--host", settings.api_host, "--port", str(settings.api_port)]
    if allow_public:
        api.append("--allow-public")
    work = [*python, "worker", "--handlers", handlers, "--concurrency", str(settings.concurrency)]
    for name in queues or []:
        work += ["--queues", name]
    return [
        Child("api", api, env),
        *(Child(f"worker-{n}", work, env, restart=True) for n in range(1, workers + 1)),
    ]


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


def _banner(printer: _Printer, settings: Settings, workers: str, url: str) -> Callable[[], bool]:
    """A probe for the supervisor to poll: says "ready" once the API answers."""
    probe_host = "127.0.0.1" if settings.api_host in ("0.0.0.0", "::", "") else settings.api_host

    def ready() -> bool:
        try:
            with socket.create_connection((probe_host, settings.api_port), timeout=0.2):
                pass
        except OSError:
            return False
        printer.say(
            "up",
            f"ready: API on http://{settings.api_host}:{settings.api_port}, {workers}, "
            f"database {redact(url)}. Ctrl-C stops everything.",
            "bold green",
        )
        return True

    return ready


_COLOURS = ("cyan", "magenta", "green", "yellow", "blue", "bright_cyan", "bright_magenta")


class _Printer:
    """One stream for every process: each line whole, its source's name in front."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self._lock = threading.Lock()
        self._colours: dict[str, str] = {"up": "bold"}
        self._closed = threading.Event()

    def say(self, name: str, line: str, colour: str | None = None) -> None:
        if colour is None:
            colour = self._colours.setdefault(
                name, _COLOURS[(len(self._colours) - 1) % len(_COLOURS)]
            )
        text = Text.assemble((f"{name:>9} | ", colour), line)
        with self._lock:
            self.console.print(text, soft_wrap=True, highlight=False, markup=False)

    def event(self, action: str, message: str, level: int) -> None:
        self.say("up", message, "bold red" if level >= logging.WARNING else "bold")

    def tail(self, name: str, path: Path) -> None:
        """Follow a log file from its current end (the server's log)."""

        def follow() -> None:
            with contextlib.suppress(OSError), open(path, "rb") as handle:
                handle.seek(0, os.SEEK_END)
                while not self._closed.is_set():
                    line = handle.readline()
                    if line:
                        self.say(name, line.decode("utf-8", "replace").rstrip("\r\n"))
                    else:
                        self._closed.wait(0.25)

        threading.Thread(target=follow, name=f"tail-{name}", daemon=True).start()

    def close(self) -> None:
        self._closed.set()
