"""What a browser loads besides the API: the OpenAPI schema, Swagger UI at
/docs, and the dashboard.

/docs needs no internet: Swagger UI's files come from the fastapi-offline
package and are served under /docs/, and every URL in the page is relative
(so it also works behind a path prefix). /docs and /openapi.json sit behind
the same authentication as the endpoints; the dashboard page does not (it
holds no data, and asks for the token its own requests then carry).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import re
from importlib import resources
from typing import Any

from fastapi import FastAPI, Response
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.openapi.utils import get_openapi
from fastapi.responses import HTMLResponse, JSONResponse
from starlette.exceptions import HTTPException

from .middleware import PUBLIC_PATHS

__all__ = ["DOCS_ASSETS", "install_pages"]

# The files of Swagger UI that /docs uses, by name under /docs/.
DOCS_ASSETS = {
    "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "swagger-ui.css": "text/css; charset=utf-8",
    "favicon.png": "image/png",
}


def install_pages(app: FastAPI) -> None:
    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title, version=app.version, summary=app.summary, routes=app.routes
            )
            _add_security(schema)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

    @app.get("/openapi.json", include_in_schema=False)
    async def openapi_json() -> JSONResponse:
        return JSONResponse(app.openapi())

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url="openapi.json",
            title="pgqueue API",
            swagger_js_url="docs/swagger-ui-bundle.js",
            swagger_css_url="docs/swagger-ui.css",
            swagger_favicon_url="docs/favicon.png",
            # The validator badge would send the schema to an outside service.
            swagger_ui_parameters={"validatorUrl": None},
        )

    @app.get("/docs/{name}", include_in_schema=False)
    async def docs_asset(name: str) -> Response:
        if name not in DOCS_ASSETS:
            raise HTTPException(404, f"no file {name!r} under /docs")
        return Response(
            _docs_asset(name),
            media_type=DOCS_ASSETS[name],
            headers={"Cache-Control": "max-age=86400", "X-Content-Type-Options": "nosniff"},
        )

    @app.get("/dashboard", include_in_schema=False)
    async def dashboard() -> HTMLResponse:
        page, headers = _dashboard_page()
        return HTMLResponse(page, headers=headers)


@functools.cache
def _docs_asset(name: str) -> bytes:
    return (resources.files("fastapi_offline") / "static" / name).read_bytes()


@functools.cache
def _dashboard_page() -> tuple[bytes, dict[str, str]]:
    """The page, and headers whose CSP allows only its own inline script and
    style (by hash) and requests to this origin."""
    page = (resources.files(__package__) / "dashboard" / "index.html").read_bytes()
    text = page.decode("utf-8")

    def hashes(tag: str) -> str:
        blocks = re.findall(rf"<{tag}>(.*?)</{tag}>", text, flags=re.DOTALL)
        return " ".join(
            f"'sha256-{base64.b64encode(hashlib.sha256(b.encode()).digest()).decode()}'"
            for b in blocks
        )

    csp = (
        f"default-src 'none'; script-src {hashes('script')}; style-src {hashes('style')}; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    )
    return page, {
        "Content-Security-Policy": csp,
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
        "Cache-Control": "no-cache",
    }


def _add_security(schema: dict[str, Any]) -> None:
    """Declare the bearer scheme on every operation but the public ones."""
    schema.setdefault("components", {}).setdefault("securitySchemes", {})["bearer"] = {
        "type": "http",
        "scheme": "bearer",
        "description": "PGQUEUE_API_TOKENS (admin) or PGQUEUE_API_READ_TOKENS (GET only). "
        "Not required when the server has no token configured.",
    }
    for path, operations in schema.get("paths", {}).items():
        if path in PUBLIC_PATHS:
            continue
        for operation in operations.values():
            operation["security"] = [{"bearer": []}]
