"""Payload encryption keys: ``keys generate ID`` (a new key to put in
``encryption_keys``) and ``keys rotate`` (seal every stored payload again
with the first key). See docs/howto/encryption.md."""

from __future__ import annotations

from typing import Annotated

import typer

from ..core.sealing import generate_key
from . import output
from .app import app, state_of, wants_json
from .options import JsonFlag

__all__: list[str] = []

keys_app = typer.Typer(
    help="Payload encryption keys: generate one, rotate to the first.", no_args_is_help=True
)
app.add_typer(keys_app, name="keys")


@keys_app.command("generate")
def generate(
    ctx: typer.Context,
    key_id: Annotated[
        str,
        typer.Argument(
            metavar="ID", help="The key's id, e.g. 2026-12 (1-32 of A-Z a-z 0-9 _ . -)."
        ),
    ],
    json_out: JsonFlag = False,
) -> None:
    """Print a new key as ID:KEY, for encryption_keys (PGQUEUE_ENCRYPTION_KEYS). Writes nothing."""
    entry = generate_key(key_id)
    if wants_json(ctx, json_out):
        output.emit_json({"key": entry})
    else:
        # Plain print: a key is a secret to copy, not text to wrap or colour.
        typer.echo(entry)


@keys_app.command("rotate")
def rotate(ctx: typer.Context, json_out: JsonFlag = False) -> None:
    """Seal again, with the first of encryption_keys, every stored payload sealed with another.

    List the new key first and keep the old ones after it until this is done.
    """
    state = state_of(ctx)
    settings = state.settings()
    with state.queue(settings) as q:
        count = q.reseal_payloads()
    primary = settings.sealing.primary
    if wants_json(ctx, json_out):
        output.emit_json({"resealed": count, "key": primary})
    else:
        state.out.print(f"sealed {count} payload(s) again with the key {primary!r}")
