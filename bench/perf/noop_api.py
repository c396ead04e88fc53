"""The framework's own limit: a FastAPI app whose POST /jobs takes the same
JSON body as pgqueue's (validated by the same model) and writes nothing,
served by uvicorn as ``pgqueue api`` serves pgqueue's app.

    python -m bench.perf.noop_api --host 127.0.0.1 --port 8001

``bench.perf.api_group_commit`` runs it beside ``pgqueue api``.
"""

from __future__ import annotations

import argparse

import uvicorn
from fastapi import FastAPI

from pgqueue.api.models import EnqueueRequest
from pgqueue.api.server import uvicorn_config

app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)


@app.post("/jobs", status_code=201)
async def enqueue(body: EnqueueRequest) -> dict[str, object]:
    return {"id": 0, "state": "queued", **body.fields()}


@app.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    config = uvicorn_config(
        app, host=args.host, port=args.port, access_log=False, timeout_graceful_shutdown=10
    )
    uvicorn.Server(config).run()


if __name__ == "__main__":
    main()
