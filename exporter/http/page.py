"""The incident page (issue 19): one HTML page, one script, one stylesheet, served by the census.

Owns `install(app)`, which adds `/` (exporter/http/web/index.html), `/ui/app.js` and `/ui/app.css`
to a FastAPI application (the sidecar's, exporter.http.app, and the aggregator's,
exporter.aggregator.app), `PAGE_PATHS` (the paths the bearer token does not guard: the page
holds no data, every number on it comes from /api/v1 with the token the operator types in) and
the page's Content-Security-Policy. The files are package data, read once at install time;
nothing on the page names another origin.

Imports only the standard library and Starlette: exporter.http.app imports it.
"""

from __future__ import annotations

from importlib import resources

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

#: The page, its script and its stylesheet: open with --api-token-file too (the page holds no
#: data; the API it reads keeps asking for the token).
PAGE_PATHS = frozenset({"/", "/ui/app.js", "/ui/app.css"})

#: Nothing but this origin's own script, style and JSON; no inline script or style, no plugin,
#: no form submission, no framing. img-src data: for the empty favicon (no /favicon.ico request).
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")

_FILES = {"/": ("index.html", "text/html; charset=utf-8"),
          "/ui/app.js": ("app.js", "text/javascript; charset=utf-8"),
          "/ui/app.css": ("app.css", "text/css; charset=utf-8")}


def asset(name: str) -> bytes:
    """exporter/http/web/NAME as installed (from the source tree under `pip install -e`)."""
    return resources.files("exporter.http").joinpath("web", name).read_bytes()


def file_route(path: str, body: bytes, media_type: str, headers: dict[str, str]) -> Route:
    """GET/HEAD `path` -> `body`, outside the OpenAPI document (also /docs' files, exporter.http.docs_ui)."""

    async def endpoint(request: Request) -> Response:
        return Response(body, media_type=media_type, headers=headers)

    return Route(path, endpoint=endpoint, methods=["GET", "HEAD"], include_in_schema=False)


def install(app) -> None:
    """Add the page's three routes to `app`."""
    headers = {"Content-Security-Policy": CSP, "Cache-Control": "no-cache"}
    app.router.routes.extend(file_route(path, asset(name), media_type, headers)
                             for path, (name, media_type) in _FILES.items())
