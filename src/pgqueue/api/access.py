"""GET /access: what the caller's token may do, so that a page can leave out
the buttons it may not use (the dashboard shows no action to a read token).
Without tokens configured, the answer is admin: the API then takes writes
from its own pages (middleware.py ``SameOrigin``)."""

# No "from __future__ import annotations": FastAPI reads the signatures at run time.

from typing import Literal

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field

from ..core.redaction import Redaction
from .http_errors import documented_errors

__all__ = ["router", "shown_to"]

router = APIRouter(tags=["monitoring"])


class AccessOut(BaseModel):
    access: Literal["admin", "read"] = Field(
        description="admin: every request; read: GET and HEAD only."
    )
    tokens: bool = Field(description="Whether the API needs a token at all.")


@router.get(
    "/access",
    response_model=AccessOut,
    responses=documented_errors(),
    summary="What the caller's token may do",
)
async def access(request: Request) -> AccessOut:
    granted = getattr(request.state, "access", None)
    return AccessOut(access=granted or "admin", tokens=granted is not None)


def shown_to(request: Request) -> Redaction:
    """What of a job the caller may see: the redacted fields hidden from
    all; errors' tracebacks from read tokens too (api_read_tracebacks off)."""
    if getattr(request.state, "access", None) == "read":
        read: Redaction = request.app.state.read_redaction
        return read
    redaction: Redaction = request.app.state.redaction
    return redaction
