"""/docs without a CDN (exporter/http/docs_ui.py), in process, on the sidecar's and the aggregator's apps.

The page names only its own origin's files, by relative URLs; each file is served whole from
the pinned package, with its media type and the strict CSP; source maps and ReDoc are not
served; FastAPI's CDN page and its OAuth2 redirect page are gone. With --api-token-file the page,
its files and the OpenAPI document load without the token (a browser navigation sends no
header) while every operation still asks for it, and the document tells Swagger UI's Authorize
button to send it as a bearer header. The same in a real Chromium: tests/browser/test_browser_docs.py.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser
from urllib.parse import urljoin, urlsplit

import pytest
from fastapi.testclient import TestClient

from exporter.aggregator.app import create_app as create_aggregate_app
from exporter.aggregator.fanout import Aggregator
from exporter.aggregator.peers import Peers
from exporter.census.registry import ConnectionRegistry
from exporter.http import docs_ui
from exporter.http.app import create_app
from exporter.http.auth import ApiToken

TOKEN = "d0cs-t0ken-1"


def sidecar(**kw):
    return create_app(ConnectionRegistry(), **kw)


def aggregator(**kw):
    return create_aggregate_app(Aggregator(Peers([], dns=None, max_peers=1)), **kw)


APPS = {"sidecar": sidecar, "aggregator": aggregator}


@pytest.fixture(params=sorted(APPS))
def client(request):
    with TestClient(APPS[request.param]()) as c:
        yield c


@pytest.fixture
def token_file(tmp_path):
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    return path


class _Refs(HTMLParser):
    """Every src and href of a page, and the text of its inline scripts and styles."""

    def __init__(self) -> None:
        super().__init__()
        self.refs: list[str] = []
        self.inline: list[str] = []
        self._tag: str | None = None
        self.attrs: list[tuple[str, str | None]] = []

    def handle_starttag(self, tag, attrs):
        self.attrs += attrs
        self.refs += [value for name, value in attrs if name in ("src", "href") and value is not None]
        self._tag = tag

    def handle_data(self, data):
        if self._tag in ("script", "style") and data.strip():
            self.inline.append(data)

    def handle_endtag(self, tag):
        self._tag = None


def refs(html: str) -> _Refs:
    parser = _Refs()
    parser.feed(html)
    return parser


def test_the_page_names_only_its_own_files(client):
    r = client.get("/docs")
    assert r.status_code == 200 and r.headers["content-type"] == "text/html; charset=utf-8"
    assert r.headers["content-security-policy"] == docs_ui.CSP
    page = refs(r.text)
    assert sorted(page.refs) == sorted(docs_ui._relative(p) for p in [*docs_ui.VENDOR, docs_ui.INIT_URL])
    assert not page.inline, "inline script or style: the CSP forbids it"
    assert not any(name.startswith("on") for name, _ in page.attrs), "an inline event handler"
    # No absolute or protocol-relative URL, no CDN, anywhere in the page.
    assert not re.search(r"https?:|//|cdn", r.text, re.I), r.text
    # Relative, so that they resolve under the page's own origin and path prefix, whatever it is.
    for base in ("http://census.example:9100/docs", "http://proxy.example/census/docs"):
        origin, prefix = base.rsplit("/", 1)[0], base.rsplit("/", 1)[0] + "/"
        for ref in page.refs:
            assert urljoin(base, ref).startswith(prefix), (base, ref)
            assert urlsplit(urljoin(base, ref)).netloc == urlsplit(origin).netloc


def test_every_file_is_served_whole_with_its_type_and_the_csp(client):
    expected_types = {"js": "text/javascript; charset=utf-8", "css": "text/css; charset=utf-8", "png": "image/png"}
    for path, (name, _) in docs_ui.VENDOR.items():
        r = client.get(path)
        assert r.status_code == 200, path
        assert r.headers["content-type"] == expected_types[name.rsplit(".", 1)[1]], path
        assert r.content == (docs_ui.static_dir() / name).read_bytes(), path
        assert r.headers["content-security-policy"] == docs_ui.CSP
        assert r.headers["cache-control"] == "public, max-age=31536000, immutable"  # versioned path
        assert r.headers["x-content-type-options"] == "nosniff"
        assert docs_ui.PACKAGE_VERSION in path
    init = client.get(docs_ui.INIT_URL)
    assert (init.status_code, init.headers["content-type"]) == (200, "text/javascript; charset=utf-8")
    assert init.headers["cache-control"] == "no-cache"  # not versioned: it changes with kafka-census
    assert init.content == docs_ui.INIT_JS
    assert client.head("/docs").status_code == 200


def test_the_versioned_paths_name_the_installed_package():
    """A new version must change the paths, or browsers would keep the old files for a year."""
    import importlib.metadata
    import tomllib
    from pathlib import Path
    assert docs_ui.PACKAGE_VERSION == importlib.metadata.version(docs_ui.PACKAGE)
    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    pins = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    assert f"{docs_ui.PACKAGE}=={docs_ui.PACKAGE_VERSION}" in [p.split(" ")[0] for p in pins]


def test_the_bundle_is_swagger_ui_5():
    """4.x cannot render FastAPI's OpenAPI 3.1 documents ("Unable to render this definition")."""
    bundle = docs_ui.vendor_file("swagger-ui-bundle.js")
    found = re.search(rb'PACKAGE_VERSION:"(\d+)\.(\d+)\.(\d+)"', bundle)
    assert found and int(found.group(1)) >= 5, found


def test_nothing_else_of_the_package_and_no_cdn_page(client):
    static = docs_ui.static_dir()
    assert (static / "redoc.standalone.js").exists()  # the package has it; it is not served
    base = next(iter(docs_ui.VENDOR)).rsplit("/", 1)[0]
    for name in ("redoc.standalone.js", "swagger-ui-bundle.js.map", "swagger-ui.css.map", "../__init__.py",
                 "%2e%2e/core.py"):
        assert client.get(f"{base}/{name}").status_code == 404, name
    assert client.get("/docs/oauth2-redirect").status_code == 404
    assert client.get("/redoc").status_code == 404
    for path in ("/docs", docs_ui.INIT_URL):
        assert b"cdn" not in client.get(path).content.lower()


def test_the_initializer_keeps_the_token_in_memory_only():
    init = docs_ui.INIT_JS.decode()
    settings = dict(re.findall(r"^\s+(\w+): (.+?),?$", init, re.M))
    assert settings["persistAuthorization"] == "false"  # true would keep it in localStorage
    assert settings["withCredentials"] == "false"
    assert settings["validatorUrl"] == "null"  # the badge would load an image from a public site
    assert settings["url"] == 'root.getAttribute("data-openapi-url")'
    assert not re.search(r"https?:|localStorage|sessionStorage|document\.cookie", init)


def test_the_title_is_escaped():
    page = docs_ui.page('<script>alert(1)</script> & "x"', "/openapi.json").decode()
    assert "<script>alert" not in page and "&lt;script&gt;alert(1)&lt;/script&gt; &amp; &quot;x&quot;" in page


@pytest.mark.parametrize("app", sorted(APPS))
def test_with_a_token_the_page_loads_and_the_api_still_asks(app, token_file):
    with TestClient(APPS[app](api_token=ApiToken(token_file))) as c:
        for path in ("/docs", "/openapi.json", docs_ui.INIT_URL, *docs_ui.VENDOR):
            assert c.get(path).status_code == 200, path
        assert c.get("/api/v1/connections").status_code == 401
        # (the aggregator without peers answers 503: past the token all the same)
        assert c.get("/api/v1/connections", headers={"Authorization": f"Bearer {TOKEN}"}).status_code in (200, 503)
        doc = c.get("/openapi.json").json()
    # What Swagger UI's Authorize button reads: a bearer scheme, required by every API operation.
    assert doc["components"]["securitySchemes"]["bearer"] == {
        "type": "http", "scheme": "bearer", "description": "The token of --api-token-file"}
    operations = [op for path, ops in doc["paths"].items() if path.startswith("/api/") for op in ops.values()]
    assert operations and all(op["security"] == [{"bearer": []}] for op in operations)
    # The pages are not in the document: they are not part of the API.
    assert not any(path.startswith("/docs") for path in doc["paths"])


def test_every_docs_path_is_open_and_nothing_more():
    from exporter.http.app import OPEN_PATHS
    assert docs_ui.DOCS_PATHS <= OPEN_PATHS and "/openapi.json" in OPEN_PATHS
    assert docs_ui.DOCS_PATHS == {"/docs", docs_ui.INIT_URL, *docs_ui.VENDOR}
