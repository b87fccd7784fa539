"""``/docs`` from the package: Swagger UI's assets are served by this server
(``app/static/swagger/``, vendored from swagger-ui-dist; see its VERSION), so
the docs work offline and load nothing from another origin.  ReDoc (whose page
fetches its script and fonts from CDNs) is off.

Use: ``FastAPI(..., docs_url=None, redoc_url=None)`` then ``install(app)``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

SWAGGER_DIR = Path(__file__).resolve().parent.parent / "static" / "swagger"
ASSETS = "/docs-assets"
# validatorUrl None: Swagger UI would otherwise send the spec to an online validator
PARAMETERS = {"validatorUrl": None, "displayRequestDuration": True}


def install(app: FastAPI, path: str = "/docs") -> None:
    """Serve Swagger UI at ``path`` with its assets under ``/docs-assets``,
    and tidy the generated schema (see ``tidy``)."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            tidy(generate())
        return app.openapi_schema or {}

    app.openapi = openapi  # type: ignore[method-assign]
    app.mount(ASSETS, StaticFiles(directory=SWAGGER_DIR), name="docs-assets")
    openapi_url = app.openapi_url or "/openapi.json"
    title = f"{app.title} — API"

    @app.get(path, include_in_schema=False)
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=openapi_url,
            title=title,
            swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS}/favicon-32x32.png",
            swagger_ui_parameters=PARAMETERS,
        )


def tidy(spec: dict[str, Any]) -> dict[str, Any]:
    """A success response documented by a model (``responses=returns(M)``,
    app/api/declare.py) while the route still returns a plain dict gets
    FastAPI's ``{"type": "object", "additionalProperties": true, "title": …}``
    merged beside the model's ``$ref``: keep the ``$ref`` alone."""
    for operations in spec.get("paths", {}).values():
        for operation in operations.values():
            for response in operation.get("responses", {}).values():
                for media in response.get("content", {}).values():
                    schema = media.get("schema", {})
                    if "$ref" in schema:
                        media["schema"] = {"$ref": schema["$ref"]}
    return spec
