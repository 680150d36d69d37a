"""The incident CLI (`kafka-census connections|clients|upgrade-readiness`, issue 16) as an
operator runs it: the real command, a subprocess, against a real sidecar -- `kafka-census capture
-i lo --http --api-token-file` watching a real Tansu broker, real clients (confluent-kafka
announces its software, aiokafka does not and is inferred), a connection held open, and a raw
client whose client_id carries terminal escapes and which sends Produce v2 (removed by Kafka
4.0). Tansu, not Apache Kafka: what is under test is the CLI's reading and rendering of a
sidecar's answers, which any broker's traffic gives, and a Kafka 4 broker would close the
Produce v2 connection this test keeps listed.

Against the real `kafka-census aggregate` in front of two real sidecars (`replay --serve` of
recorded real clients): the PEER column, and a real partial answer once one sidecar is stopped.
Where no real peer can produce the case -- a partial answer told only by its header, an
aggregator none of whose peers answered, a server that answers garbage, one that never answers --
a small local HTTP server stands in (said at each test); tests/aggregator/test_aggregate.py covers the
aggregator's answers themselves.

Needs root (live capture), as `make test` has on CI.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import signal
import socket
import subprocess
import threading
import unicodedata
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from kio.schema.api_versions.v3.request import ApiVersionsRequest

from harness import peers
from harness.census import Census, wait_for
from harness.kafka_frames import produce_v0_2, raw_request, request_frame
from tests.cli.incident_runs import SCRIPT, cli, one_error_line

pytestmark = pytest.mark.e2e  # kafka-census sidecars and the aggregator, asked by the incident commands

TOKEN = "incident-test-token-0123456789abcdef"
HOSTILE_ID = "census-evil\x1b[31mRED\x1b[0m\n\u202eX"
HELD_ID = "census-held"
WIDE_ID = "計費服務-請求客戶端-" * 3  # East Asian wide: two terminal cells per character
EVERY_CONNECTION_COLUMN = ["CLIENT", "CLIENT-ID", "SOFTWARE", "PRINCIPAL", "STATE", "LISTENER", "LAST-SEEN",
                           "AGE", "REQUESTS", "ID", "BROKER", "PROTOCOL", "IDENTITY", "CONFIDENCE", "SASL",
                           "BYTES-IN", "BYTES-OUT", "DECODE-ERRORS", "DESYNCS", "FIRST-SEEN", "LAST-SEEN-AT"]


def cell_width(text: str) -> int:
    """Terminal cells of `text` (measured here, not by the module under test): East Asian wide
    and full-width characters take two."""
    return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)


def api(base: str, path: str, **params) -> dict:
    """GET base/api/v1/PATH?PARAMS with the token, decoded."""
    query = ("?" + urllib.parse.urlencode(params)) if params else ""
    req = urllib.request.Request(base + "/api/v1/" + path + query, headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.load(resp)


class Sidecar(Census):
    def __init__(self, port: int, http_port: int, token_file: Path) -> None:
        self.token_file = token_file
        super().__init__(["capture", "-i", "lo", "--listener", f"PLAINTEXT={port}",
                          "--api-token-file", str(token_file)], http_port)

    def api(self, path: str, **params) -> dict:
        return api(self.base, path, **params)

    def cli(self, *args, env: dict | None = None) -> subprocess.CompletedProcess:
        return cli(*args, "--server", self.base, "--token-file", self.token_file, env=env)


def _send_and_close(port: int, data: bytes) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(data)
        sock.settimeout(2)
        with contextlib.suppress(OSError):
            sock.recv(65536)


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("incident")
    token_file = tmp / "token"
    token_file.write_text(TOKEN + "\n")
    port = peers.free_port()
    with peers.start_tansu(port, port) as broker:
        side = Sidecar(port, peers.free_port(), token_file)
        held = None
        try:
            for name in ("confluent-kafka", "aiokafka"):
                peers.run_client(name, broker.bootstrap, timeout=90)
            _send_and_close(port, produce_v0_2(2, 1, acks=1, client_id=HOSTILE_ID))
            _send_and_close(port, raw_request(18, 0, 1, WIDE_ID, b""))  # ApiVersions v0
            held = socket.create_connection(("127.0.0.1", port), timeout=5)
            held.sendall(request_frame(ApiVersionsRequest(client_software_name="census-held",
                                                          client_software_version="0.1.0"), 1, HELD_ID))
            held.recv(65536)  # the broker answered: the capture has seen the exchange
            # Everything but the held connection has closed, and the held one is named.
            wait_for("the clients' connections to close", lambda: (
                side.api("connections", state="open")["total"] == 1
                and side.api("connections", state="open")["connections"][0]["client_software_name"]
                == "census-held"), timeout=60, interval=0.1)
            yield side
        finally:
            if held is not None:
                held.close()
            side.stop()


def rows(side: Sidecar, **params) -> list[dict]:
    return side.api("connections", limit=10000, **params)["connections"]


def test_table_lists_every_connection_the_api_lists_with_inferred_identities_marked(sidecar):
    out = sidecar.cli("connections", "--limit", 10000)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split() == ["CLIENT", "CLIENT-ID", "SOFTWARE", "PRINCIPAL", "STATE", "LISTENER", "LAST-SEEN",
                                "AGE", "REQUESTS"]
    api = rows(sidecar)
    assert len(lines) == 1 + len(api)
    inferred = 0
    for line, c in zip(lines[1:], api):  # the API's order, one line each
        assert line.startswith(f"{c['client_address']}:{c['client_port']} "), (line, c)
        if c["client_software_name"]:
            assert f" {c['client_software_name']} {c['client_software_version']} " in line
            assert "(inferred)" not in line
        elif c["inferred_software"]:
            inf = c["inferred_software"]
            assert f" {inf['name']} {inf['version_range']} (inferred) " in line, line
            inferred += 1
    assert inferred, "aiokafka announces no software: its connections are inferred"
    assert {"confluent-kafka-python", "census-held"} <= {c["client_software_name"] for c in api}
    held = [line for line, c in zip(lines[1:], api) if c["client_id"] == HELD_ID]
    assert len(held) == 1 and " open " in held[0]


def test_wide_shows_every_column_uncut(sidecar):
    out = sidecar.cli("connections", "-o", "wide", "--state", "closed", env={"COLUMNS": "60"})
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split() == EVERY_CONNECTION_COLUMN
    api = rows(sidecar, state="closed")
    assert len(lines) == 1 + len(api)
    for line, c in zip(lines[1:], api):
        assert c["id"] in line and c["identity_source"] in line and c["last_seen"] in line
    assert max(map(len, lines)) > 60  # wide ignores the terminal: every column, uncut
    assert "…" not in out.stdout


def test_json_is_the_api_answer(sidecar):
    # Closed connections only: an open one's idle_seconds moves between two requests.
    out = sidecar.cli("connections", "-o", "json", "--state", "closed", "--order-by", "client_port desc",
                      "--limit", 3)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == sidecar.api("connections", state="closed", order_by="client_port desc",
                                                 limit=3)
    assert out.stdout.isascii()
    for command, path, params in (("clients", "clients", {}),
                                  ("upgrade-readiness", "upgrade-readiness", {"target": "4.0"})):
        out = sidecar.cli(command, "-o", "json")
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout) == sidecar.api(path, **params), command


@pytest.mark.parametrize("flags, params", [
    (["--listener", "PLAINTEXT"], {"listener": "PLAINTEXT"}),
    (["--software-name", "confluent-kafka-python"], {"client_software_name": "confluent-kafka-python"}),
    (["--software-version", "0.1.0"], {"client_software_version": "0.1.0"}),
    (["--client-id", HOSTILE_ID], {"client_id": HOSTILE_ID}),
    (["--principal", "nobody"], {"principal": "nobody"}),
    (["--address", "127.0.0.1"], {"address": "127.0.0.1"}),
    (["--identity-source", "fingerprint"], {"identity_source": "fingerprint"}),
    (["--inferred-software-name", "aiokafka"], {"inferred_software_name": "aiokafka"}),
    (["--state", "open"], {"state": "open"}),
    (["--order-by", "client_software_name desc, client_port"], {"order_by": "client_software_name desc, client_port"}),
    (["--limit", "2", "--order-by", "client_port"], {"limit": 2, "order_by": "client_port"}),
])
def test_filters_and_order_are_the_apis(sidecar, flags, params):
    out = sidecar.cli("connections", "-o", "json", *flags)
    assert out.returncode == 0, out.stderr
    expected = sidecar.api("connections", **params)
    got = json.loads(out.stdout)
    assert [c["id"] for c in got["connections"]] == [c["id"] for c in expected["connections"]]
    assert (got["total"], got["limit"]) == (expected["total"], expected["limit"])
    # ... and the table shows the same rows in the same order.
    table = sidecar.cli("connections", *flags)
    assert table.returncode == 0, table.stderr
    shown = [line.split()[0] for line in table.stdout.splitlines()[1:]]
    assert shown == [f"{c['client_address']}:{c['client_port']}" for c in expected["connections"]]


def test_some_filters_select_something(sidecar):
    """The filter test above would pass on empty answers: these ones are not empty."""
    for params in ({"client_software_name": "confluent-kafka-python"}, {"client_id": HOSTILE_ID},
                   {"identity_source": "fingerprint"}, {"state": "open"}):
        assert sidecar.api("connections", **params)["total"] >= 1, params
    assert sidecar.api("connections", limit=2, order_by="client_port")["total"] > 2


def test_clients_table_and_filters(sidecar):
    out = sidecar.cli("clients", "--software-name", "confluent-kafka-python")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split() == ["SOFTWARE", "CLIENT-ID", "PRINCIPAL", "LISTENER", "OPEN", "TOTAL", "LAST-SEEN"]
    api = sidecar.api("clients", client_software_name="confluent-kafka-python")["clients"]
    assert api and len(lines) == 1 + len(api)
    for line, r in zip(lines[1:], api):
        assert line.startswith(f"confluent-kafka-python {r['client_software_version']} ")
        assert f" {r['client_id']} " in line
    out = sidecar.cli("clients", "--identity-source", "fingerprint", "-o", "json")
    assert json.loads(out.stdout) == sidecar.api("clients", identity_source="fingerprint")
    assert all(r["identity_source"] == "fingerprint" for r in json.loads(out.stdout)["clients"])


def test_upgrade_readiness_names_who_blocks_4_0(sidecar):
    out = sidecar.cli("upgrade-readiness", "--target", "4.0", "-o", "wide")
    assert out.returncode == 0, out.stderr  # not ready is an answer, not an error
    lines = out.stdout.splitlines()
    assert lines[0].startswith("Kafka 4.0: NOT ready,")
    body = sidecar.api("upgrade-readiness", target="4.0")
    assert not body["ready"] and len(lines) == 3 + len(body["clients_by_software"])
    evil = [line for line in lines if "census-evil" in line]
    assert len(evil) == 1 and "Produce v2" in evil[0] and "min v3" in evil[0]


def test_a_narrow_terminal_gets_lines_that_fit(sidecar):
    out = sidecar.cli("connections", env={"COLUMNS": "60"})
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 1 + sidecar.api("connections")["total"]
    assert all(cell_width(line) <= 60 for line in lines), lines
    assert lines[0].split()[:3] == ["CLIENT", "CLIENT-ID", "SOFTWARE"]
    assert "…" in out.stdout  # cut, not wrapped
    assert [line for line in lines if line.split()[1].startswith("計費服務-")]  # cut by cells, not characters
    assert "hidden to fit 60 columns; -o wide shows every column" in out.stderr
    api = rows(sidecar)
    for line, c in zip(lines[1:], api):
        if c["inferred_software"] and not c["client_software_name"]:
            assert line.rstrip().endswith("(inferred)") or "(inferred) " in line, line  # the mark survives the cut
    for command in ("clients", "upgrade-readiness"):
        out = sidecar.cli(command, env={"COLUMNS": "60"})
        assert out.returncode == 0 and all(cell_width(line) <= 60 for line in out.stdout.splitlines()), out.stdout


def test_wire_text_is_escaped_before_the_terminal(sidecar):
    api = sidecar.api("connections", client_id=HOSTILE_ID)["connections"]
    assert len(api) == 1 and api[0]["client_id"] == HOSTILE_ID  # the API keeps what the wire said
    for output in ("table", "wide"):
        out = sidecar.cli("connections", "--client-id", HOSTILE_ID, "-o", output)
        assert out.returncode == 0, out.stderr
        assert "\x1b" not in out.stdout and "\u202e" not in out.stdout
        lines = out.stdout.splitlines()
        assert len(lines) == 2  # the newline in the client_id did not start a line
        assert "census-evil\\x1b[31mRED\\x1b[0m\\n\\u202eX" in lines[1]
    out = sidecar.cli("upgrade-readiness")
    assert "\x1b" not in out.stdout and "census-evil\\x1b[31mRED" in out.stdout
    out = sidecar.cli("connections", "--client-id", HOSTILE_ID, "-o", "json")
    assert out.stdout.isascii() and "\x1b" not in out.stdout  # JSON escapes, the value is the wire's
    assert json.loads(out.stdout)["connections"][0]["client_id"] == HOSTILE_ID


def test_token_missing_or_wrong_is_exit_4_in_one_line(sidecar, tmp_path):
    out = cli("connections", "--server", sidecar.base)
    assert out.returncode == 4
    assert "401 unauthorized (no --token-file given)" in one_error_line(out)
    wrong = tmp_path / "wrong"
    wrong.write_text("not-the-token")
    out = cli("clients", "--server", sidecar.base, "--token-file", wrong)
    assert out.returncode == 4
    line = one_error_line(out)
    assert "does not accept the token" in line and "not-the-token" not in line  # the token is never shown


def test_server_and_token_from_the_environment_and_config(sidecar, tmp_path):
    out = cli("connections", "--state", "open", env={"KAFKA_CENSUS_SERVER": sidecar.base,
                                                     "KAFKA_CENSUS_TOKEN_FILE": str(sidecar.token_file)})
    assert out.returncode == 0, out.stderr
    assert HELD_ID in out.stdout
    config = tmp_path / "census.yaml"
    config.write_text(f"server: {sidecar.base}\ntoken-file: {sidecar.token_file}\n")
    out = cli("clients", "--config", config)
    assert out.returncode == 0, out.stderr
    assert "census-held 0.1.0" in out.stdout
    # The flag wins over the variable.
    out = cli("clients", "--server", sidecar.base, env={"KAFKA_CENSUS_SERVER": "http://127.0.0.1:1",
                                                        "KAFKA_CENSUS_TOKEN_FILE": str(sidecar.token_file)})
    assert out.returncode == 0, out.stderr


def test_a_refused_port_is_exit_3_in_one_line():
    port = peers.free_port()  # nothing listens there
    out = cli("connections", "--server", f"127.0.0.1:{port}")
    assert out.returncode == 3
    assert one_error_line(out) == f"error: http://127.0.0.1:{port}/api/v1/connections: unreachable: Connection refused"


def test_a_silent_server_is_exit_3_after_the_timeout():
    with socket.socket() as listener:  # accepts (the kernel does), never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        out = cli("clients", "--server", f"127.0.0.1:{listener.getsockname()[1]}", "--timeout", "0.5")
    assert out.returncode == 3
    assert "no answer within --timeout 0.5 s" in one_error_line(out)


def test_usage_errors_are_exit_2(sidecar, tmp_path):
    out = sidecar.cli("connections", "--order-by", "bogus")  # the server refuses it (400)
    assert out.returncode == 2
    assert "unknown order_by field 'bogus'" in one_error_line(out)
    out = sidecar.cli("connections", "--limit", "0")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    out = sidecar.cli("clients", "--identity-source", "api_versions_v3")  # /clients has four sources
    assert out.returncode == 2
    out = cli("connections", "--server", "ftp://x")
    assert out.returncode == 2 and "--server 'ftp://x'" in one_error_line(out)
    out = cli("connections", "--token-file", tmp_path / "absent")
    assert out.returncode == 2 and "No such file" in one_error_line(out)
    out = cli("connections", env={"KAFKA_CENSUS_TIMEOUT": "-1"})
    assert out.returncode == 2 and "KAFKA_CENSUS_TIMEOUT" in out.stderr.splitlines()[-1]


def test_help_documents_the_exit_codes():
    for command in ("connections", "clients", "upgrade-readiness"):
        out = cli(command, "--help")
        assert out.returncode == 0
        for code in ("0  the answer", "1  the server", "2  bad usage", "3  unreachable", "4  unauthorized",
                     "5  partial"):
            assert code in out.stdout, (command, code)


def test_watch_prints_successive_tables_without_a_terminal(sidecar):
    out = sidecar.cli("connections", "--state", "open", "--watch", "0.05", "--watch-count", "3")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    stamps = [line for line in lines if line.startswith("--- ") and line.endswith(f" {sidecar.base} ---")]
    assert len(stamps) == 3 and lines[0] == stamps[0]
    assert sum(line.split()[:1] == ["CLIENT"] for line in lines) == 3
    assert sum(HELD_ID in line for line in lines) == 3
    assert "\x1b[" not in out.stdout  # no screen clearing into a pipe
    out = sidecar.cli("clients", "-o", "json", "--watch", "0.05", "--watch-count", "2")
    docs = [json.loads(line) for line in out.stdout.splitlines()]  # one JSON document per line
    assert len(docs) == 2 and all("clients" in d for d in docs)


def test_watch_redraws_a_terminal_within_its_size(sidecar):
    import pty

    master, child_side = pty.openpty()
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAFKA_CENSUS_")}
    proc = subprocess.Popen([str(SCRIPT), "connections", "--server", sidecar.base, "--token-file",
                             str(sidecar.token_file), "--watch", "0.05", "--watch-count", "2"],
                            stdout=child_side, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            env={**env, "COLUMNS": "60", "LINES": "8"})
    os.close(child_side)
    chunks = []
    with contextlib.suppress(OSError):  # EIO once the command has exited and closed the terminal
        while chunk := os.read(master, 65536):
            chunks.append(chunk)
    os.close(master)
    err = proc.communicate(timeout=30)[1]
    assert proc.returncode == 0, err
    screens = b"".join(chunks).decode().split("\x1b[H\x1b[2J")  # home + clear before each redraw
    assert screens[0] == "" and len(screens) == 3, screens
    total = sidecar.api("connections")["total"]
    assert total > 4  # more than the screen holds: cut to the terminal's 8 lines
    for screen in screens[1:]:
        lines = screen.replace("\r\n", "\n").rstrip("\n").split("\n")
        assert lines[0].startswith("Every 0.05s: kafka-census connections") and len(lines) <= 8, lines
        assert lines[2].split()[:2] == ["CLIENT", "CLIENT-ID"] and all(cell_width(x) <= 60 for x in lines), lines
        assert any(x.startswith("... ") and "more lines" in x for x in lines), lines
        assert lines[-1].startswith("note: ") and "hidden to fit 60 columns" in lines[-1]  # on the screen
    assert err == b""  # nothing on stderr to scroll the screen


def test_watch_ends_cleanly_on_ctrl_c(sidecar):
    proc = subprocess.Popen([str(SCRIPT), "connections", "--server", sidecar.base, "--token-file",
                             str(sidecar.token_file), "--watch", "30"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    try:
        assert proc.stdout.readline().startswith("--- ")  # the first table is out; it now sleeps
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err


def test_watch_stops_at_once_on_an_error_retrying_cannot_fix(sidecar):
    out = cli("connections", "--server", sidecar.base, "--watch", "0.05", "--watch-count", "50")
    assert out.returncode == 4
    assert out.stdout.count("--- ") == 1 and out.stderr.count("401 unauthorized") == 1


# --- stand-ins for an aggregator: the aggregator's own e2e test covers these answers for real ----

class StandIn:
    """A local HTTP server that answers every GET with one fixed status, headers and body."""

    def __init__(self, status: int, body: bytes, headers: dict | None = None) -> None:
        answer = (status, body, headers or {"Content-Type": "application/json"})

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
                code, data, extra = answer
                self.send_response(code)
                for name, value in extra.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                self.server.paths.append(self.path)

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.paths = []
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> StandIn:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


MISSING = [{"peer": "10.0.0.9:9595", "url": "http://10.0.0.9:9595", "kind": "connect",
            "error": "connection refused"}]


def test_a_partial_answer_prints_the_table_warns_and_exits_5(sidecar):
    """Stand-in for the aggregator's partial answer (body fields and headers as docs/aggregator.md's
    aggregator section gives them): a real sidecar row, with its peer."""
    row = dict(rows(sidecar, state="closed", client_software_name="confluent-kafka-python")[0])
    row["peer"] = "10.0.0.8:9595"
    row["id"] = f"10.0.0.8:9595/{row['id']}"
    body = {"connections": [row], "total": 1, "limit": 1000, "partial": True, "missing_peers": MISSING,
            "peers_asked": 2, "peers_answered": 1}
    headers = {"Content-Type": "application/json", "X-Kafka-Census-Partial": "true",
               "X-Kafka-Census-Peers": "1/2", "X-Kafka-Census-Missing-Peers": "10.0.0.9:9595"}
    with StandIn(200, json.dumps(body).encode(), headers) as agg:
        out = cli("connections", "--server", agg.url, "--software-name", "confluent-kafka-python")
        as_json = cli("connections", "--server", agg.url, "-o", "json")
    assert agg.server.paths[0] == "/api/v1/connections?client_software_name=confluent-kafka-python"
    assert out.returncode == 5
    lines = out.stdout.splitlines()
    assert lines[0].split()[:2] == ["CLIENT", "PEER"] and len(lines) == 2 and " 10.0.0.8:9595 " in lines[1]
    assert out.stderr.splitlines() == [
        "warning: partial answer: missing 1 peer (1 of 2 peers answered): 10.0.0.9:9595 (connect: connection refused)"]
    assert as_json.returncode == 5 and json.loads(as_json.stdout) == body
    assert "missing 1 peer" in as_json.stderr


def test_a_partial_header_alone_is_partial():
    """Stand-in: only the header says partial (a body without the aggregator's fields)."""
    body = {"clients": [], "total": 0, "census_overflow": 0}
    headers = {"Content-Type": "application/json", "X-Kafka-Census-Partial": "true",
               "X-Kafka-Census-Missing-Peers": "10.0.0.9:9595,10.0.0.10:9595"}
    with StandIn(200, json.dumps(body).encode(), headers) as agg:
        out = cli("clients", "--server", agg.url)
    assert out.returncode == 5
    assert "warning: partial answer: missing 2 peers: 10.0.0.9:9595, 10.0.0.10:9595" in out.stderr


def test_no_peer_answered_is_exit_1_naming_them():
    """Stand-in for the aggregator's 502 when every peer is missing."""
    body = {"detail": "no peer answered", "partial": True, "missing_peers": MISSING, "peers_asked": 1,
            "peers_answered": 0}
    with StandIn(502, json.dumps(body).encode()) as agg:
        out = cli("connections", "--server", agg.url)
    assert out.returncode == 1
    assert "502 no peer answered: missing 1 peer (0 of 1 peers answered): 10.0.0.9:9595 (connect" \
        in one_error_line(out)


@pytest.mark.parametrize("status, body, extra, message", [
    (200, b"<html>not json</html>", [], "the answer is not JSON"),
    (200, b"[1, 2]", [], "the answer is not a JSON object"),
    (200, b'{"total": 3}', [], "unreadable answer: no 'connections' list"),
    (500, b'{"detail": "boom\\u001b[2J"}', [], "500 Internal Server Error: boom\\x1b[2J"),
    (404, b'{"detail": "Not Found"}', [], "404 not found"),
    (302, b"", [], "302 redirect"),
    (200, b'{"connections": [], "pad": "' + b"x" * (1 << 20) + b'"}', ["--max-response-mb", "1"],
     "larger than --max-response-mb 1 MiB"),
])
def test_a_bad_answer_is_exit_1_in_one_line(status, body, extra, message):
    """Stand-in: a server that is not (or not only) kafka-census."""
    headers = {"Content-Type": "application/json", "Location": "http://elsewhere.example/"}
    with StandIn(status, body, headers) as server:
        out = cli("connections", "--server", server.url, *extra)
    assert out.returncode == 1
    line = one_error_line(out)
    assert message in line and "\x1b" not in line, line
    assert len(server.server.paths) == 1  # a redirect is not followed


# --- the real aggregator in front of two real sidecars (each a `replay --serve` of a recorded
# real client, so no capture is needed): the PEER column, and a real partial answer ------------

RECORDINGS = {"kafkajs-2.0.0.pcap": 45369, "confluent-kafka-python-2.3.0.pcap": 58823}  # file: Tansu's port
FINGERPRINTS = Path(__file__).resolve().parents[1] / "fixtures" / "fingerprints"


class Replay(Census):
    def __init__(self, pcap: str, broker_port: int, token_file: Path) -> None:
        super().__init__(["replay", str(FINGERPRINTS / pcap), "--serve", "--listener", f"PLAINTEXT={broker_port}",
                          "--api-token-file", str(token_file)], peers.free_port())


def test_against_the_real_aggregator_peers_are_named_and_a_missing_one_is_exit_5(tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    replays = [Replay(pcap, port, token_file) for pcap, port in RECORDINGS.items()]
    agg = None
    try:
        agg = Census(["aggregate", "--peers", ",".join(r.base for r in replays), "--peer-token-file",
                      str(token_file), "--api-token-file", str(token_file), "--cache-seconds", "0",
                      "--peer-timeout", "5"], peers.free_port())

        def run(*args):
            return cli(*args, "--server", agg.base, "--token-file", token_file)

        out = run("connections", "--order-by", "client_port")
        assert out.returncode == 0, out.stderr
        lines = out.stdout.splitlines()
        assert lines[0].split()[:3] == ["CLIENT", "PEER", "CLIENT-ID"]
        shown_peers = {line.split()[1] for line in lines[1:]}
        assert shown_peers == {r.target for r in replays}  # every row names its sidecar
        kafkajs = [line for line in lines[1:] if line.split()[2] == "kafkajs"]  # sends no software name
        assert kafkajs and all(line.split()[3] == "kafkajs" and line.split()[5] == "(inferred)" for line in kafkajs)
        as_json = run("connections", "-o", "json", "--order-by", "client_port")
        body = json.loads(as_json.stdout)
        assert len(lines) == 1 + len(body["connections"]) and body["partial"] is False
        assert body["total"] == sum(api(r.base, "connections")["total"] for r in replays) == len(lines) - 1
        assert body == api(agg.base, "connections", order_by="client_port")
        wide = run("clients", "-o", "wide")
        assert wide.returncode == 0 and wide.stdout.splitlines()[0].split()[-1] == "PEERS", wide.stdout

        gone = replays.pop()
        gone.stop()
        out = run("connections", "--order-by", "client_port")
        assert out.returncode == 5, out.stderr
        assert {line.split()[1] for line in out.stdout.splitlines()[1:]} == {replays[0].target}
        warning = out.stderr.strip().splitlines()
        assert len(warning) == 1 and warning[0].startswith("warning: partial answer: missing 1 peer (1 of 2 peers "
                                                           f"answered): {gone.target} (")
    finally:
        for census in ([agg] if agg else []) + replays:
            census.stop()
