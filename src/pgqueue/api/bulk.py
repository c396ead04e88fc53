"""POST /jobs/bulk/{cancel,retry,delete}: a bulk action on the jobs a filter
matches, in batches (pgqueue.bulk). A write, so admin tokens only (a read
token gets 403 from the middleware). ``dry_run`` answers how many jobs match
now and changes nothing: ask it first."""

# No "from __future__ import annotations": FastAPI reads the route signature
# at run time.

from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field, create_model

from ..core.bulk import BULK_BATCH, FILTER_FIELDS, BulkAction, JobFilter
from ..queue import AsyncQueue
from .http_errors import documented_errors
from .models import field_schema

__all__ = ["BulkRequest", "BulkResult", "router"]

router = APIRouter()


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")

    dry_run: bool = Field(
        default=False,
        strict=True,
        description="Only count the jobs that match now; change nothing.",
    )
    all: bool = Field(
        default=False,
        strict=True,
        description="Without any filter, act on every job the action applies to. Without "
        "a filter and without this, an action is refused (422) and changes nothing.",
    )

    def filters(self) -> dict[str, Any]:
        """The filter's fields the request gave and ``all``, for ``JobFilter.from_fields``."""
        return self.model_dump(exclude_unset=True, exclude={"dry_run"})


def _request_model() -> type[_Request]:
    # Any: the values are judged by JobFilter's rules, as a job's are by JobSpec's.
    fields: dict[str, Any] = {f.name: (Any, field_schema(f)) for f in FILTER_FIELDS}
    return create_model(
        "BulkRequest",
        __base__=_Request,
        __doc__="Which jobs: every filter given must match (none: every job the action "
        'applies to, which an action takes only with "all": true).',
        **fields,
    )


if TYPE_CHECKING:  # the model is made at import time; checkers see its base
    BulkRequest = _Request
else:
    BulkRequest = _request_model()


class BulkResult(BaseModel):
    action: BulkAction
    dry_run: bool
    count: int = Field(description="dry_run: the jobs that match now; else the jobs changed.")


@router.post(
    "/jobs/bulk/{action}",
    tags=["jobs"],
    response_model=BulkResult,
    responses=documented_errors(403),
    summary="Cancel, retry or delete every job a filter matches",
    description="cancel: queued and running jobs (a running job's lease is revoked and its "
    "handler stopped); "
    "retry: dead and cancelled jobs (one whose key another job holds now is left as it "
    "is); delete: finished jobs. In batches of "
    f"{BULK_BATCH} jobs, each its own transaction. Admin tokens only.",
)
async def bulk_action(action: BulkAction, body: BulkRequest, request: Request) -> BulkResult:
    queue: AsyncQueue = request.app.state.queue
    where = JobFilter.from_fields(body.filters())
    count = await queue.bulk(action, where, dry_run=body.dry_run)
    return BulkResult(action=action, dry_run=body.dry_run, count=count)
