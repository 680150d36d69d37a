"""Swagger UI at /docs without a CDN (issue 19): every file it needs served by the census itself.

Owns `install(app)`, which adds /docs and its files to a FastAPI application (the sidecar's,
exporter.http.app, and the aggregator's, exporter.aggregator.app; both pass `docs_url=None` so that
FastAPI's own /docs, which loads Swagger UI from a public CDN, is not there), `DOCS_PATHS` (the
paths the bearer token does not guard) and the page's Content-Security-Policy.

Swagger UI's script and stylesheet come from the pinned `fastapi-offline` package (its static
files only: Swagger UI 5.32.6, which renders the OpenAPI 3.1 documents FastAPI writes; 4.x, as in
`swagger-ui-bundle`, refuses them), read once per process, under a path that names the package's
version so a browser may keep them. Its ReDoc is not served. The initializer is a file of its own
(`INIT_JS`), never inline, so that the CSP allows no inline script. Every URL on the page is
relative (docs/..., openapi.json): /docs works behind a proxy that serves the census under a
path prefix.

The token: with --api-token-file every operation declares the bearer scheme (exporter.http.app's
`document_bearer`), so Swagger UI's Authorize button takes the token and "Try it out" sends it
as `Authorization: Bearer ...`. It lives in the page's memory only: persistAuthorization stays
off (it would keep the token in localStorage), no cookie, never in a URL. /docs, its files and
/openapi.json load without the token (a browser cannot send a header with a navigation, and the
Authorize button only exists once the document has loaded); they hold no data from the wire,
and every operation they describe still needs the token.

Imports only the standard library, Starlette and exporter.http.page (fastapi_offline is located,
never imported: its code makes a FastAPI app of its own): exporter.http.app imports it.
"""

from __future__ import annotations

import functools
import html
import importlib.util
from pathlib import Path

from starlette.routing import Route

from exporter.http.page import file_route

DOCS_URL = "/docs"
#: The package whose static files are Swagger UI (pinned in pyproject.toml).
PACKAGE = "fastapi-offline"
#: Its version: in the files' paths, so that a browser may keep them a year (immutable). The pin,
#: written out: importlib.metadata would cost every command ~20 ms at import
#: (tests/http/test_docs_ui.py holds it equal to the installed package and to pyproject.toml's pin).
PACKAGE_VERSION = "1.7.7"
_DIR = f"{DOCS_URL}/assets/{PACKAGE}-{PACKAGE_VERSION}"
#: Swagger UI's files, by the path they are served at: (file in the package, media type).
VENDOR = {
    f"{_DIR}/swagger-ui-bundle.js": ("swagger-ui-bundle.js", "text/javascript; charset=utf-8"),
    f"{_DIR}/swagger-ui.css": ("swagger-ui.css", "text/css; charset=utf-8"),
    f"{_DIR}/favicon.png": ("favicon.png", "image/png"),
}
INIT_URL = f"{DOCS_URL}/assets/docs-init.js"
#: Open with --api-token-file too (see the module docstring). /openapi.json is added by the
#: apps themselves (exporter.http.app.OPEN_PATHS): it is theirs, not this module's.
DOCS_PATHS = frozenset({DOCS_URL, INIT_URL, *VENDOR})

#: Only this origin's script, stylesheet, images and JSON: no inline script or style (Swagger UI
#: sets its inline styles through the DOM, which style-src does not govern; the browser tests
#: watch the console for violations), no eval, no plugin, no form submission, no framing.
#: img-src data: for the icons its stylesheet embeds as data: URLs.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")

#: The initializer. Swagger UI's options: the document at the page's data-openapi-url; the
#: token in memory only (persistAuthorization false, no credentials); no validator badge (it
#: would load an image from the validator's public site).
INIT_JS = b"""\
// The initializer of /docs (kafka-census, exporter/http/docs_ui.py): a file, so the page's
// Content-Security-Policy allows no inline script.
"use strict";
(function () {
  var root = document.getElementById("swagger-ui");
  window.ui = SwaggerUIBundle({
    url: root.getAttribute("data-openapi-url"),
    dom_id: "#swagger-ui",
    layout: "BaseLayout",
    presets: [SwaggerUIBundle.presets.apis],
    deepLinking: true,
    showExtensions: true,
    showCommonExtensions: true,
    persistAuthorization: false,
    withCredentials: false,
    validatorUrl: null
  });
})();
"""

_PAGE = """\
<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title} - API</title>
<link rel="icon" type="image/png" href="{favicon}">
<link rel="stylesheet" href="{css}">
</head>
<body>
<div id="swagger-ui" data-openapi-url="{openapi}"></div>
<script src="{bundle}"></script>
<script src="{init}"></script>
</body>
</html>
"""


def _relative(path: str) -> str:
    """`path` as a URL relative to /docs (a sibling of it: the page's directory is /)."""
    return path.removeprefix("/")


def page(title: str, openapi_url: str) -> bytes:
    """The /docs page of an app titled `title` whose OpenAPI document is at `openapi_url`."""
    assets = {name: _relative(path) for path, (name, _) in VENDOR.items()}
    return _PAGE.format(title=html.escape(title), openapi=html.escape(_relative(openapi_url)),
                        favicon=assets["favicon.png"], css=assets["swagger-ui.css"],
                        bundle=assets["swagger-ui-bundle.js"], init=_relative(INIT_URL)).encode()


def static_dir() -> Path:
    """fastapi_offline/static, found without importing the package."""
    spec = importlib.util.find_spec("fastapi_offline")
    assert spec is not None and spec.submodule_search_locations, f"{PACKAGE} is not installed"
    return Path(next(iter(spec.submodule_search_locations))) / "static"


@functools.cache
def vendor_file(name: str) -> bytes:
    """A file of the pinned Swagger UI, read once per process (1.7 MB for all three)."""
    return (static_dir() / name).read_bytes()


def _route(path: str, body: bytes, media_type: str, cache: str) -> Route:
    return file_route(path, body, media_type, {"Content-Security-Policy": CSP, "Cache-Control": cache})


def install(app, openapi_url: str = "/openapi.json") -> None:
    """Add /docs and its files to `app` (outside the OpenAPI document). The app must have been
    made with `docs_url=None`."""
    routes = [_route(DOCS_URL, page(app.title, openapi_url), "text/html; charset=utf-8", "no-cache"),
              _route(INIT_URL, INIT_JS, "text/javascript; charset=utf-8", "no-cache")]
    for path, (name, media_type) in VENDOR.items():
        routes.append(_route(path, vendor_file(name), media_type, "public, max-age=31536000, immutable"))
    app.router.routes.extend(routes)
