"""Wire strings and request paths reach the terminal and the log only escaped.

A client id, software name, SASL principal or TLS subject is whatever the peer sent, and an
HTTP request path whatever the caller asked for. Through `exporter.textsafe.visible` (the
escaping), the `replay` table (the real command on a pcap), the table printer fed by the
registry, the log formatter, and a real uvicorn behind `kafka-census replay --serve` asked for
`/...%0Aerror:%20forged`: every record stays one line, nothing forges an `error:` line, and no
escape sequence or bidi override reaches the terminal.
"""

from __future__ import annotations

import datetime
import logging
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.api_versions.v3.response import ApiVersion, ApiVersionsResponse
from kio.schema.errors import ErrorCode
from kio.static.primitive import i16

from capture.events import ClientSoftware, ConnectionOpened, RequestSeen, SaslIdentity, TlsSession
from capture.proxy_tls import subject_name
from exporter.census.registry import ConnectionRegistry
from exporter.cli.logs import configure_logging
from exporter.cli.output import print_connections
from exporter.textsafe import visible
from harness import peers, synth
from harness.census import Census
from harness.kafka_frames import request_frame, response_frame

REPO = Path(__file__).resolve().parents[2]

# What a hostile peer puts in a string: a newline and a forged record, a carriage return that
# rewinds the line, an ANSI colour, a Unicode line separator, NEL (C1), a right-to-left override.
HOSTILE = "x\nerror: forged\r\x1b[31m\u2028\x85\u202e"
ESCAPED = "x\\nerror: forged\\r\\x1b[31m\\u2028\\x85\\u202e"
UNSAFE = [chr(c) for c in (*range(0x20), *range(0x7f, 0xa0), 0x61c, 0x200e, 0x200f, *range(0x2028, 0x202f),
                           *range(0x2066, 0x206a))]


def test_visible_escapes_every_control_separator_and_bidi_character():
    assert visible(HOSTILE) == ESCAPED
    assert visible("\t\0\x7f") == "\\t\\x00\\x7f"
    for ch in UNSAFE:
        out = visible(f"a{ch}b")
        assert out.startswith("a\\") and out.endswith("b") and out.isprintable(), (hex(ord(ch)), out)
    # Everything else is left as it is: names in any script, emoji, backslashes.
    for text in ("census-app", "Zoë Ω 日本 🙂", "DOMAIN\\user", "CN=app,O=acme\\, inc"):
        assert visible(text) == text


def _row_lines(out: str) -> list[str]:
    return out.splitlines()[1:]  # after the header


def _assert_safe_table(out: str, rows: int) -> None:
    assert len(out.split("\n")) == rows + 2, out  # header, one line per connection, final newline
    assert not any(ch in out for ch in UNSAFE if ch != "\n"), repr(out)


def test_the_table_escapes_client_id_software_principal_and_tls_subject(capsys):
    registry = ConnectionRegistry()
    for n, (client_id, principal) in enumerate([(HOSTILE, None), ("plain", HOSTILE), ("tls", None)]):
        conn = f"c{n}"
        registry.apply(ConnectionOpened(conn_id=conn, ts=1.0, client_address="10.0.0.1", client_port=40000 + n,
                                        broker_address="10.0.0.2", broker_port=9092, listener="PLAINTEXT",
                                        security_protocol="PLAINTEXT", mid_stream=False, source="proxy"))
        registry.apply(ClientSoftware(conn_id=conn, ts=1.0, request_version=3, name="sw" + HOSTILE,
                                      version="1" + HOSTILE, valid=False, error_code=0, accepted=True))
        registry.apply(RequestSeen(conn_id=conn, ts=1.0, api_key=3, api_name="Metadata", api_version=12,
                                   correlation_id=2, client_id=client_id, size=30))
        if principal is not None:
            registry.apply(SaslIdentity(conn_id=conn, ts=1.0, mechanism="PLAIN", principal=principal,
                                        outcome="success", error_code=0, framing="SaslAuthenticate"))
        if client_id == "tls":  # the proxy's TLS subject, built from the client certificate
            subject = subject_name({"subject": ((("commonName", HOSTILE),),)})
            registry.apply(TlsSession(conn_id=conn, ts=1.0, tls_version="TLSv1.3", cipher="x", client_subject=subject))
    conns = registry.connections()
    assert HOSTILE in {c["client_id"] for c in conns} and {HOSTILE, "CN=" + HOSTILE} <= {c["principal"] for c in conns}
    print_connections(conns, "table")
    out = capsys.readouterr().out
    _assert_safe_table(out, 3)
    by_port = {line.split()[0]: line for line in _row_lines(out)}
    assert ESCAPED[:24] in by_port["10.0.0.1:40000"]  # client_id, cut to its 24 columns
    assert "\\nerror: f" in by_port["10.0.0.1:40001"] and "\\nerror: f" in by_port["10.0.0.1:40002"]  # principals
    assert all("sw" + ESCAPED[:38] in line for line in by_port.values())  # software, cut to 40 columns
    # JSON escapes them itself: one document, the strings intact.
    print_connections(conns, "json")
    out = capsys.readouterr().out
    assert HOSTILE not in out and "\\u001b[31m" in out and "\\u2028" in out


@pytest.mark.e2e  # the real kafka-census command
def test_replay_prints_hostile_wire_strings_escaped(tmp_path):
    """The real command on a pcap whose client sends them, answered by a (spoofed) broker."""
    conv = synth.TcpConversation()
    request = request_frame(ApiVersionsRequest(client_software_name="sw" + HOSTILE, client_software_version="1.0"),
                            1, client_id=HOSTILE)
    answer = response_frame(ApiVersionsResponse(
        error_code=ErrorCode.none, throttle_time=datetime.timedelta(0),
        api_keys=(ApiVersion(api_key=i16(18), min_version=i16(0), max_version=i16(3)),)), 1)
    pcap = tmp_path / "hostile.pcap"
    synth.write_pcap(pcap, conv.handshake() + conv.client(request) + conv.broker(answer) + conv.close())
    proc = subprocess.run([sys.executable, "-m", "exporter.cli.main", "replay", str(pcap)],
                          capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    _assert_safe_table(proc.stdout, 1)
    assert ESCAPED[:24] in proc.stdout


def test_a_log_record_with_wire_text_stays_one_line(capsys):
    configure_logging("debug")  # as the command does it: a handler on the (captured) stderr
    log = logging.getLogger("kafka-census")
    try:
        log.warning("client %s sent %s", HOSTILE, "b" + HOSTILE)
        logging.getLogger("uvicorn.error").warning("request %s", HOSTILE)  # uvicorn's: the same formatter
        try:
            raise ValueError(HOSTILE)
        except ValueError:
            log.exception("failed: %s", HOSTILE)
    finally:
        for name in ("kafka-census", "uvicorn"):
            logger = logging.getLogger(name)
            for handler in [h for h in logger.handlers if h.get_name() == "kafka-census-stderr"]:
                logger.removeHandler(handler)
    err = capsys.readouterr().err
    lines = err.split("\n")
    assert lines[0] == f"warning: client {ESCAPED} sent b{ESCAPED}"
    assert lines[1] == f"warning: request {ESCAPED}"
    assert lines[2] == f"error: failed: {ESCAPED}"
    # The traceback keeps its lines (the message's newline makes one more), each indented and
    # escaped: none can pass for a record.
    assert lines[3] == "  Traceback (most recent call last):"
    assert lines[-3:-1] == ["  ValueError: x", "  error: forged\\r\\x1b[31m\\u2028\\x85\\u202e"]
    assert all(line.startswith("  ") for line in lines[3:-1]) and lines[-1] == ""
    assert not any(line.startswith("error: forged") for line in lines)
    assert not any(ch in err for ch in UNSAFE if ch != "\n")


@pytest.mark.e2e  # the real kafka-census command
def test_a_request_path_cannot_forge_a_log_line(tmp_path):
    """A real uvicorn (`replay --serve`) logging at debug, where a refused request's path is
    logged; and a malformed request, which uvicorn itself logs."""
    conv = synth.TcpConversation()
    pcap = tmp_path / "one.pcap"
    synth.write_pcap(pcap, conv.handshake() + conv.close())
    token = tmp_path / "token"
    token.write_text("t" * 32 + "\n")
    token.chmod(0o600)
    census = Census(["replay", str(pcap), "--serve", "--api-token-file", str(token), "--log-level", "debug"],
                    peers.free_port())
    try:
        for path in ("/api/v1/connections%0Aerror:%20forged%0D%1B[31m%E2%80%A8", "/x%0D%0Aerror:%20forged"):
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(census.base + path, timeout=10)
            assert refused.value.code == 401
        with socket.create_connection(("127.0.0.1", int(census.target.rpartition(":")[2])), timeout=10) as s:
            s.sendall(b"GET /\x01\x1b[31m HTTP/1.1\r\n\r\n")
            assert s.recv(100).startswith(b"HTTP/1.1 400")
    finally:
        code, err = census.stop()
    assert code == 0, err
    lines = err.splitlines()
    assert not [line for line in lines if line.startswith("error: forged")], err
    assert "debug: 401 GET /api/v1/connections\\nerror: forged\\r\\x1b[31m\\u2028: no bearer token" in lines, err
    assert "debug: 401 GET /x\\r\\nerror: forged: no bearer token" in lines, err
    assert "warning: Invalid HTTP request received." in lines, err  # uvicorn's record, our formatter
    assert not any(ch in err for ch in UNSAFE if ch != "\n")
