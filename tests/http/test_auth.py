"""Access control: exporter/http/auth.py (the token file, the constant-time compare, the bearer check),
its wiring into the app (exporter/http/app.py), SIGHUP reloaders (exporter/service/serve.py), and the real
`kafka-census replay FILE --serve --api-token-file F` as an operator runs it: 401 without the
token, /metrics and the probes open, SIGHUP switching tokens, the token never in the log."""

from __future__ import annotations

import json
import logging
import os
import signal
from contextlib import contextmanager
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry, Gauge, make_asgi_app

from exporter.census.registry import ConnectionRegistry
from exporter.http import auth
from exporter.http.app import create_app
from exporter.http.auth import ApiToken, TokenError, bearer_token, read_token
from exporter.service.serve import Service
from harness import synth
from harness.census import Census, free_port
from harness.cli_runs import assert_usage_error, clean_env, run
from harness.known_conversation import full_conversation

TOKEN = "s3cr3t-Token_1+/="
NEW_TOKEN = "0ther-t0ken-2"


@pytest.fixture
def token_file(tmp_path) -> Path:
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    return path


def replace(path: Path, text: str) -> None:
    """Atomically, as the kubelet updates a mounted Secret (a new file, then a rename)."""
    tmp = path.with_name(path.name + ".new")
    tmp.write_text(text)
    os.replace(tmp, path)


def test_auth_module_imports_the_standard_library_only():
    """Its docstring's promise: no framework, no registry, no capture."""
    import ast
    import sys

    tree = ast.parse(Path(auth.__file__).read_text())
    modules = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    modules |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    assert modules and {m.split(".")[0] for m in modules} <= set(sys.stdlib_module_names) | {"__future__"}


# --- the token file -------------------------------------------------------------------------

def test_token_is_read_with_surrounding_whitespace_stripped(tmp_path):
    path = tmp_path / "t"
    path.write_bytes(b"  \t" + TOKEN.encode() + b"\r\n\n")
    assert read_token(path) == TOKEN.encode()


@pytest.mark.parametrize("content, fragment", [
    (b"", "is empty"),
    (b" \n\t\n", "is empty"),
    (b"zq1 zq2\n", "one word of printable ASCII"),
    (b"zq3\nzq4\n", "one word of printable ASCII"),
    ("t\u00f6ken".encode(), "one word of printable ASCII"),
    (b"x" * (auth.MAX_TOKEN_FILE_BYTES + 1), "not a token file"),
], ids=["empty", "blank", "space", "newline", "non-ascii", "too-long"])
def test_unusable_token_files_are_refused_without_showing_the_content(tmp_path, content, fragment):
    path = tmp_path / "t"
    path.write_bytes(content)
    with pytest.raises(TokenError) as err:
        read_token(path)
    message = str(err.value)
    assert fragment in message and str(path) in message
    for word in content.split():
        assert word.decode(errors="replace") not in message


def test_missing_token_file_names_the_file_and_the_reason(tmp_path):
    with pytest.raises(TokenError, match=r"--api-token-file .*/nope: No such file or directory"):
        ApiToken(tmp_path / "nope")


def test_the_token_file_is_bounded_at_4_kib(tmp_path):
    path = tmp_path / "t"
    path.write_bytes(b"x" * auth.MAX_TOKEN_FILE_BYTES)
    assert len(read_token(path)) == auth.MAX_TOKEN_FILE_BYTES


# --- the compare ----------------------------------------------------------------------------

@pytest.mark.parametrize("presented, ok", [
    (TOKEN, True), (TOKEN[:-1], False), (TOKEN + "x", False), ("", False), (TOKEN.upper(), False),
    ("x" * len(TOKEN), False),
])
def test_matches_only_the_exact_token(token_file, presented, ok):
    assert ApiToken(token_file).matches(presented.encode()) is ok


def test_compare_is_compare_digest_on_equal_length_digests(token_file, monkeypatch):
    """hmac.compare_digest on two SHA-256 digests: the time depends neither on where the first
    difference is nor on the presented token's length."""
    calls = []

    def spy(a, b):
        calls.append((a, b))
        return a == b

    monkeypatch.setattr(auth.hmac, "compare_digest", spy)
    token = ApiToken(token_file)
    assert token.matches(TOKEN.encode()) and not token.matches(b"short")
    assert [(type(a), type(b), len(a), len(b)) for a, b in calls] == [(bytes, bytes, 32, 32)] * 2


def test_the_token_is_not_kept_in_clear_nor_shown_by_repr(token_file):
    token = ApiToken(token_file)
    assert TOKEN not in repr(token) and str(token_file) in repr(token)
    assert all(TOKEN.encode() != v and TOKEN != v for v in vars(token).values())


# --- reload ---------------------------------------------------------------------------------

def test_reload_switches_to_the_new_token(token_file):
    token = ApiToken(token_file)
    replace(token_file, NEW_TOKEN + "\n")
    token.reload()
    assert token.matches(NEW_TOKEN.encode()) and not token.matches(TOKEN.encode())


@pytest.mark.parametrize("breakage", ["empty", "deleted", "spaces"])
def test_a_bad_file_at_reload_keeps_the_old_token(token_file, breakage):
    token = ApiToken(token_file)
    if breakage == "empty":
        replace(token_file, "")
    elif breakage == "deleted":
        token_file.unlink()
    else:
        replace(token_file, "new token with spaces")
    with pytest.raises(TokenError, match="the previous token stays in force") as err:
        token.reload()
    assert "new token" not in str(err.value)
    assert token.matches(TOKEN.encode())


# --- the Authorization header ---------------------------------------------------------------

@pytest.mark.parametrize("headers, expected", [
    ([(b"authorization", b"Bearer abc")], b"abc"),
    ([(b"authorization", b"bearer abc")], b"abc"),  # the scheme is case-insensitive (RFC 7235)
    ([(b"authorization", b"BEARER  abc ")], b"abc"),
    ([(b"authorization", b"Basic YWxpY2U6eA==")], None),
    ([(b"authorization", b"Bearer")], None),
    ([(b"authorization", b"Bearer ")], None),
    ([(b"authorization", b"abc")], None),
    ([(b"authorization", b"Bearer abc"), (b"authorization", b"Bearer abc")], None),  # ambiguous
    ([(b"x-authorization", b"Bearer abc")], None),
    ([], None),
])
def test_bearer_token_parsing(headers, expected):
    assert bearer_token(headers) == expected


# --- the app with a token (in process) ------------------------------------------------------

def _app(token_file, **kwargs):
    prom = CollectorRegistry()
    Gauge("kafka_census_test_value", "A test gauge.", registry=prom).set(1)
    return create_app(ConnectionRegistry(), metrics_app=make_asgi_app(registry=prom),
                      api_token=ApiToken(token_file), **kwargs)


def bearer(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


PROTECTED = ["/api/v1/connections", "/api/v1/connections/nope", "/api/v1/clients", "/api/v1/brokers",
             "/api/v1/upgrade-readiness", "/api/v1/health", "/no-such-path", "/healthz/", "/HEALTHZ"]


@pytest.mark.parametrize("path", PROTECTED)
def test_every_path_but_the_open_ones_needs_the_token(token_file, path):
    with TestClient(_app(token_file)) as c:
        for headers in ({}, bearer("wrong"), {"Authorization": f"Basic {TOKEN}"}):
            r = c.get(path, headers=headers, follow_redirects=False)
            assert r.status_code == 401, (path, headers, r.status_code)
        assert c.get(path, headers=bearer(TOKEN), follow_redirects=False).status_code != 401


def test_401_is_json_with_a_bearer_challenge_and_browser_safe_headers(token_file):
    with TestClient(_app(token_file)) as c:
        missing = c.get("/api/v1/connections")
        wrong = c.get("/api/v1/connections", headers=bearer("wrong"))
        metrics_ok = c.get("/metrics")
    for r in (missing, wrong):
        assert r.status_code == 401
        assert r.headers["content-type"] == "application/json"
        assert r.headers["cache-control"] == "no-store"
        assert r.headers["x-content-type-options"] == "nosniff"
        assert r.headers["x-frame-options"] == "DENY"
        assert r.headers["referrer-policy"] == "no-referrer"
        assert "frame-ancestors 'none'" in r.headers["content-security-policy"]
        assert set(r.json()) == {"detail"} and "Bearer" in r.json()["detail"]
        assert "wrong" not in r.text
    # RFC 6750 3 and 3.1: a challenge always, the error code only when a token was presented
    assert missing.headers["www-authenticate"] == 'Bearer realm="kafka-census"'
    assert wrong.headers["www-authenticate"] == 'Bearer realm="kafka-census", error="invalid_token"'
    assert missing.content == wrong.content  # the body says nothing about what was wrong
    assert metrics_ok.status_code == 200 and "kafka_census_test_value 1.0" in metrics_ok.text


def test_probes_and_metrics_are_open_by_default(token_file):
    with TestClient(_app(token_file)) as c:
        assert c.get("/healthz").json() == {"status": "ok"}
        assert c.get("/readyz").json() == {"status": "ok"}
        assert c.get("/metrics").status_code == 200
        assert c.get("/metrics", headers=bearer("wrong")).status_code == 200  # ignored, not checked
        listing = c.get("/api/v1/connections", headers=bearer(TOKEN))
    assert listing.status_code == 200 and listing.json()["total"] == 0


def test_metrics_auth_closes_metrics_only(token_file):
    with TestClient(_app(token_file, metrics_auth=True)) as c:
        assert c.get("/metrics").status_code == 401
        assert c.get("/metrics", headers=bearer("wrong")).status_code == 401
        r = c.get("/metrics", headers=bearer(TOKEN))
        assert r.status_code == 200 and "kafka_census_test_value 1.0" in r.text
        assert c.get("/healthz").status_code == c.get("/readyz").status_code == 200


def test_metrics_auth_without_a_token_is_refused():
    with pytest.raises(ValueError, match="metrics_auth needs api_token"):
        create_app(ConnectionRegistry(), metrics_auth=True)


def test_openapi_declares_the_bearer_scheme_on_the_api_only(token_file):
    with TestClient(_app(token_file)) as c:
        doc = c.get("/openapi.json", headers=bearer(TOKEN)).json()
    assert doc["components"]["securitySchemes"]["bearer"] == {
        "type": "http", "scheme": "bearer", "description": "The token of --api-token-file"}
    for path, operations in doc["paths"].items():
        for op in operations.values():
            if path in ("/healthz", "/readyz"):
                assert "security" not in op and "401" not in op["responses"], path
            else:
                assert op["security"] == [{"bearer": []}], path
                assert op["responses"]["401"]["content"]["application/json"]["schema"] == {
                    "$ref": "#/components/schemas/Error"}


def test_a_reloaded_token_applies_to_the_next_request(token_file):
    token = ApiToken(token_file)
    with TestClient(create_app(ConnectionRegistry(), api_token=token)) as c:
        assert c.get("/api/v1/brokers", headers=bearer(TOKEN)).status_code == 200
        replace(token_file, NEW_TOKEN)
        assert c.get("/api/v1/brokers", headers=bearer(NEW_TOKEN)).status_code == 401  # not yet reloaded
        token.reload()
        assert c.get("/api/v1/brokers", headers=bearer(NEW_TOKEN)).status_code == 200
        assert c.get("/api/v1/brokers", headers=bearer(TOKEN)).status_code == 401


def test_without_a_token_nothing_changes_but_the_headers():
    with TestClient(create_app(ConnectionRegistry())) as c:
        r = c.get("/api/v1/connections")
        assert r.status_code == 200 and "www-authenticate" not in r.headers
        assert c.get("/docs").status_code == 200


# --- Service: reloaders ---------------------------------------------------------------------

@pytest.fixture
def census_log():
    """Records of the "kafka-census" logger, at every level (a handler of our own, whatever
    logging the process has)."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("kafka-census")
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    yield records
    logger.removeHandler(handler)
    logger.setLevel(old_level)


def test_reloaders_run_in_order_and_a_failure_is_logged_not_fatal(census_log):
    service = Service(ConnectionRegistry(), version="test")
    ran = []

    def broken():
        ran.append("broken")
        raise OSError("cert.pem: No such file or directory")

    service.add_reloader("first", lambda: ran.append("first"))
    service.add_reloader("broken", broken)
    service.add_reloader("last", lambda: ran.append("last") or "loaded cert CN=broker-0")
    service.reload()
    assert ran == ["first", "broken", "last"]
    lines = [(r.levelname, r.getMessage()) for r in census_log]
    assert lines == [
        ("ERROR", "SIGHUP: reloading the broken failed: cert.pem: No such file or directory"),
        ("INFO", "SIGHUP: last: loaded cert CN=broker-0"),  # what a reloader says it loaded
        ("INFO", "SIGHUP: reloaded first, last (failed: broken)"),
    ]


def test_a_service_with_a_token_reloads_it_on_reload(token_file, census_log):
    service = Service(ConnectionRegistry(), version="test", api_token=ApiToken(token_file))
    replace(token_file, NEW_TOKEN)
    service.reload()
    assert service.api_token.matches(NEW_TOKEN.encode())
    replace(token_file, "")
    service.reload()
    assert service.api_token.matches(NEW_TOKEN.encode())
    messages = [r.getMessage() for r in census_log]
    assert messages[0] == "SIGHUP: reloaded api token"
    assert "is empty; the previous token stays in force" in messages[1]
    assert all(NEW_TOKEN not in m and TOKEN not in m for m in messages)


def test_nothing_to_reload_is_said(census_log):
    Service(ConnectionRegistry(), version="test").reload()
    assert [r.getMessage() for r in census_log] == ["SIGHUP: nothing to reload"]


# --- the real command (e2e: each test starts kafka-census) ------------------------------------

@pytest.fixture(scope="module")
def pcap(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("auth") / "one.pcap"
    synth.write_pcap(path, full_conversation(synth.TcpConversation()))
    return path


@contextmanager
def serve(pcap: Path, *args, env=None):
    """`kafka-census replay PCAP --serve --http 127.0.0.1:PORT *args` until the block ends, then
    SIGTERM: it must exit 0 without a traceback."""
    with Census(["replay", pcap, "--serve", *args], free_port(), env=env if env is not None else clean_env()) as s:
        yield s
        code, err = s.stop()
        assert code == 0, err
        assert "Traceback" not in err


@pytest.mark.e2e
def test_served_api_needs_the_token_metrics_and_probes_do_not(pcap, tmp_path, token_file):
    with serve(pcap, "--api-token-file", token_file, "--log-level", "debug") as s:
        for path in ("/docs", "/openapi.json"):  # open: a navigation carries no header (test_docs_ui)
            assert s.status(path) == 200, path
        for path in ("/api/v1/connections",):
            assert s.status(path) == 401, path
            assert s.status(path, "wrong") == 401, path
            assert s.status(path, TOKEN) == 200, path
        status, headers, body = s.request("/api/v1/connections")
        assert (status, headers["www-authenticate"], set(json.loads(body))) == (
            401, 'Bearer realm="kafka-census"', {"detail"})
        status, _, body = s.request("/api/v1/connections", TOKEN)
        assert json.loads(body)["total"] == 1
        assert s.status("/metrics") == 200 and s.status("/readyz") == 200 and s.status("/healthz") == 200
        s.wait_for_log("debug: 401 GET /api/v1/connections: wrong bearer token")
    log = s.stderr
    assert f"info: the REST API on 127.0.0.1:{s.base.rsplit(':', 1)[1]} requires a bearer token" in log
    assert "open to anyone" not in log
    assert TOKEN not in log and TOKEN.split("-")[0] not in log  # not even part of it, at debug level


@pytest.mark.e2e
def test_metrics_auth_closes_metrics_of_the_served_command(pcap, tmp_path, token_file):
    with serve(pcap, "--api-token-file", token_file, "--metrics-auth", "--log-level", "warning") as s:
        assert s.status("/metrics") == 401
        assert s.status("/metrics", TOKEN) == 200
        assert s.status("/healthz") == 200 and s.status("/readyz") == 200
    assert "info:" not in s.stderr and "warning:" not in s.stderr  # --log-level warning, token set


@pytest.mark.e2e
def test_sighup_switches_tokens_and_an_empty_file_keeps_the_old_one(pcap, tmp_path, token_file):
    with serve(pcap, "--api-token-file", token_file, "--log-level", "debug") as s:
        assert s.status("/api/v1/brokers", TOKEN) == 200
        replace(token_file, f"{NEW_TOKEN}\n")
        assert s.status("/api/v1/brokers", NEW_TOKEN) == 401  # nothing changes before SIGHUP
        s.proc.send_signal(signal.SIGHUP)
        s.wait_for_log("info: SIGHUP: reloaded api token")
        assert s.status("/api/v1/brokers", NEW_TOKEN) == 200
        assert s.status("/api/v1/brokers", TOKEN) == 401

        token_file.write_text("")
        s.proc.send_signal(signal.SIGHUP)
        s.wait_for_log("(failed: api token)")
        assert s.status("/api/v1/brokers", NEW_TOKEN) == 200
        assert s.status("/api/v1/brokers", TOKEN) == 401
    errors = [line for line in s.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: SIGHUP: reloading the api token failed: --api-token-file {token_file} is empty; "
                      "the previous token stays in force"]
    assert TOKEN not in s.stderr and NEW_TOKEN not in s.stderr


@pytest.mark.e2e
def test_an_open_api_is_a_startup_warning(pcap, tmp_path):
    with serve(pcap) as s:
        assert s.status("/api/v1/connections") == 200
        s.proc.send_signal(signal.SIGHUP)  # not fatal without a token either
        s.wait_for_log("info: SIGHUP: nothing to reload")
    port = s.base.rsplit(":", 1)[1]
    assert (f"warning: the REST API is open to anyone who can reach 127.0.0.1:{port} (no --api-token-file)"
            in s.stderr.splitlines())


@pytest.mark.e2e
def test_token_file_and_metrics_auth_from_the_environment_and_the_config(pcap, tmp_path, token_file):
    config = tmp_path / "census.yaml"
    config.write_text(f"api-token-file: {token_file}\nlog-level: WARNING\n")
    env = clean_env(KAFKA_CENSUS_METRICS_AUTH="true")
    with serve(pcap, "--config", config, env=env) as s:
        assert s.status("/api/v1/clients") == 401 and s.status("/api/v1/clients", TOKEN) == 200
        assert s.status("/metrics") == 401 and s.status("/metrics", TOKEN) == 200
    assert "info:" not in s.stderr
    env = clean_env(KAFKA_CENSUS_API_TOKEN_FILE=str(token_file))
    with serve(pcap, "--no-metrics-auth", env={**env, "KAFKA_CENSUS_METRICS_AUTH": "yes"}) as s:
        assert s.status("/api/v1/clients") == 401 and s.status("/metrics") == 200  # the flag wins


# --- starting: one error line ---------------------------------------------------------------

@pytest.mark.e2e
@pytest.mark.parametrize("content", [None, "", "  \n"], ids=["missing", "empty", "blank"])
def test_unusable_token_file_at_start_is_one_error_line_and_exit_1(pcap, tmp_path, content):
    path = tmp_path / "token"
    if content is not None:
        path.write_text(content)
    out = run("replay", pcap, "--serve", "--http", f"127.0.0.1:{free_port()}", "--api-token-file", path)
    assert out.returncode == 1, out.stderr
    reason = "No such file or directory" if content is None else "is empty"
    assert out.stderr.strip().splitlines() == [
        f"error: --api-token-file {path}{': ' if content is None else ' '}{reason}"]


@pytest.mark.e2e
def test_metrics_auth_without_a_token_file_is_a_usage_error(pcap):
    out = run("replay", pcap, "--serve", "--http", "127.0.0.1:9", "--metrics-auth")
    assert_usage_error(out, "--metrics-auth needs --api-token-file")


@pytest.mark.e2e
def test_a_token_file_without_http_is_a_usage_error(pcap, token_file):
    assert_usage_error(run("replay", pcap, "--api-token-file", token_file), "--api-token-file", "needs --http")


@pytest.mark.e2e
@pytest.mark.parametrize("name, value", [("METRICS_AUTH", "maybe"), ("LOG_LEVEL", "loud")])
def test_bad_access_settings_from_the_environment(pcap, name, value):
    out = run("replay", pcap, env=clean_env(**{f"KAFKA_CENSUS_{name}": value}))
    assert_usage_error(out, f"KAFKA_CENSUS_{name}", f"bad value {value!r}")
