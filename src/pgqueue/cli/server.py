"""The embedded PostgreSQL server: ``db start``, ``db stop``, ``db status``, ``db url``."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.markup import escape

from ..core.errors import PgQueueError
from ..db.embedded import EmbeddedPostgres
from . import output
from .app import db_app, state_of, wants_json
from .options import JsonFlag, redact

__all__: list[str] = []


def _server(ctx: typer.Context) -> EmbeddedPostgres:
    return EmbeddedPostgres(state_of(ctx).settings().data_dir)


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
        "url": redact(server.url) if port is not None else None,
        "data_dir": str(server.data_dir),
        "initialised": (server.pgdata / "PG_VERSION").exists(),
    }


@db_app.command("start")
def db_start(ctx: typer.Context, json_out: JsonFlag = False) -> None:
    """Start the embedded server (creating it on first use); print its URL."""
    state = state_of(ctx)
    server = _server(ctx)
    was_running = server.is_running()
    url = server.ensure_running()
    if wants_json(ctx, json_out):
        output.emit_json(_server_status(server))
    else:
        verb = "already running" if was_running else "started"
        state.out.print(
            f"{verb}: {redact(url)} (pid {server.pid()}, data in {escape(str(server.data_dir))})"
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
    state = state_of(ctx)
    server = _server(ctx)
    if not server.is_running():
        state.out.print("not running")
        return
    server.stop(mode)  # type: ignore[arg-type]
    state.out.print(f"stopped ({mode})")


@db_app.command("status")
def db_status(ctx: typer.Context, json_out: JsonFlag = False) -> None:
    """Whether the embedded server runs, its pid, port and folder."""
    state = state_of(ctx)
    status = _server_status(_server(ctx))
    if wants_json(ctx, json_out):
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
        raise PgQueueError(
            f"no embedded server in {server.data_dir}; 'pgqueue db start' creates one"
        )
    typer.echo(server.url)
    if not status["running"]:
        state_of(ctx).err.print("[yellow]note:[/] the server is stopped ('pgqueue db start')")
