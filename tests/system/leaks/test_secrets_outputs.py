"""Secrets seen on the wire never reach an output: SASL passwords and tokens never leave the parse
(no log, no metric, no REST answer, no file; docs/hardening.md, "Secrets"). The run, one for
this module and test_secrets_decoder.py: tests/system/leaks/conftest.py.

First the positive controls: the traffic carried every secret (each run's framing and
mechanism, read from the pcap; a SCRAM proof per run, recomputed from its password), and REST
shows the principals and mechanisms. Then each secret -- the PLAIN passwords right and wrong,
the OAUTHBEARER tokens valid and expired and their claims, per SCRAM exchange the client proof,
the client-final message, the salted password, client key, stored key, client signature and
server key (recomputed from the password and the salt on the wire, and checked against the proof
on the wire), the admin's password, the created user's password and the salted passwords of
AlterUserScramCredentials (recomputed from the salt in the request) -- is searched
(tests/system/leaks/secrets_catalog.py) in: the capture's stderr, /metrics, every GET route of
/openapi.json (every connection id for /connections/{id}), the event log files and every other
file the capture wrote, `kafka-census replay` of the pcap (table and json), the pipeline's
pcap-decode of the pcap and report over both event logs (every file, the Parquet tables read
back, stdout and stderr), and `kafka-census proxy` in front of the same broker with the same
clients.
"""

from __future__ import annotations

import base64
import json
import re
import secrets
import subprocess
import sys
import urllib.parse
from collections import Counter
from pathlib import Path

import pytest

from harness.census import CENSUS
from harness.net import free_port
from tests.system.leaks.sasl_peers import HandshakeV0Relay, scram_derived
from tests.system.leaks.secrets_catalog import (
    ADMIN_CLIENT_ID,
    CREATED_CLIENT_ID,
    FRAMINGS,
    MECHANISMS,
    PROXIED,
    PROXIED_V0,
    RUNS,
    SASL,
    SASL_V0,
    SCRAM,
    assert_no_leak,
    client_id_of,
    through_relay,
)
from tests.system.leaks.secrets_run import Capture, _rest_outputs, _run_clients, sasl_handshakes

pytestmark = pytest.mark.e2e  # Apache Kafka, SASL clients and kafka-census capture and proxy

REPO = Path(__file__).resolve().parents[3]


# --- the traffic really carried the secrets -------------------------------------------------

def test_real_clients_sent_every_secret(run, conversations, exchanges, upsertions):
    """Positive controls: without them a leak test passes on traffic without secrets."""
    bad = {k: v for k, v in run.reports.items() if v["ok"] != (k[0] == "accepted")}
    assert not bad, f"client runs with an unexpected outcome: {bad}"
    assert run.admin_report["ok"], f"AlterUserScramCredentials: {run.admin_report}"
    assert run.created_report["ok"], f"the user AlterUserScramCredentials made cannot log in: {run.created_report}"
    # Each run's connections used the framing and the mechanism it was meant to: SaslHandshake
    # v0 for raw tokens, v1 for SaslAuthenticate (read from the pcap, not from the decoder).
    handshakes = [(conv.broker_port, *h) for conv in conversations for h in sasl_handshakes(conv)]
    for outcome, client, mechanism, framing in RUNS:
        port = run.ports[SASL_V0 if through_relay(client, framing) else SASL]
        mine = {(p, v, m) for p, cid, v, m in handshakes if cid == client_id_of(outcome, client, framing)
                and m == mechanism}
        assert mine == {(port, 0 if framing == "raw" else 1, mechanism)}, (outcome, client, mechanism, framing, mine)
    assert run.relay_edits, "the relay changed no ApiVersions answer"
    wire = run.pcap.read_bytes()
    c = run.creds
    for what, value in [("PLAIN password", c.passwords["PLAIN"]), ("wrong PLAIN password", c.wrong_passwords["PLAIN"]),
                        ("admin's PLAIN password", c.admin_password), ("OAUTHBEARER token", c.token),
                        ("expired OAUTHBEARER token", c.expired_token)]:
        assert value.encode() in wire, f"the {what} is not on the wire"
    for mechanism in SCRAM:
        assert c.passwords[mechanism].encode() not in wire, "SCRAM sends no password"
        assert c.wrong_passwords[mechanism].encode() not in wire, "SCRAM sends no password"
    # A proof per SCRAM run, with the password its outcome says, on its listener.
    got = Counter((x.broker_port, x.mechanism, x.password) for x in exchanges)
    for outcome, client, mechanism, framing in RUNS:
        if mechanism in SCRAM:
            port = run.ports[SASL_V0 if through_relay(client, framing) else SASL]
            password = "password" if outcome == "accepted" else "wrong password"
            assert got[(port, mechanism, password)], f"no {mechanism} proof with the {password} on the wire to {port}"
    assert got[(run.ports[SASL], "SCRAM-SHA-512", "created user's password")], "the created user sent no proof"
    # The salted passwords the admin sent are the created user's, salted with the salt beside them.
    assert sorted(u.mechanism for u in upsertions) == list(SCRAM), upsertions
    for u in upsertions:
        assert u.user == c.created_user
        assert u.salted_password == scram_derived(u.mechanism, c.created_password, u.salt, u.iterations,
                                                  b"")["salted_password"], f"{u.mechanism}: not the salted password"
    # The decoder saw each mechanism in each framing accepted and refused (from the event log).
    records = [json.loads(line) for name, data in run.files.items() if name.startswith("events/")
               for line in data.splitlines() if line.strip()]
    seen = {(r["mechanism"], r["framing"], r["outcome"]) for r in records if r["type"] == "SaslIdentity"}
    for m in MECHANISMS:
        for f in FRAMINGS:
            assert (m, f, "success") in seen, (m, f, sorted(seen))
            # Kafka answers a refusal in SaslAuthenticate with SASL_AUTHENTICATION_FAILED, and
            # closes a raw-token connection: "failure" or "incomplete", never "success".
            assert (m, f, "failure") in seen or (m, f, "incomplete") in seen, (m, f, sorted(seen))


def test_principal_and_mechanism_are_shown(run):
    """The other half of the rule: the user name of PLAIN and SCRAM is the principal REST
    shows, with the mechanism; OAUTHBEARER shows its mechanism and no principal; a refused
    authentication shows its mechanism and no principal."""
    c = run.creds
    rows = [r for r in run.rows if r["sasl_mechanism"]]
    accepted = [r for r in rows if (r["client_id"] or "").endswith("-accepted")]
    for m in MECHANISMS:
        mine = [r for r in accepted if r["sasl_mechanism"] == m]
        assert mine, f"no {m} connection in REST"
        principals = {r["principal"] for r in mine}
        assert principals == ({c.users[m]} if m in c.users else {None}), (m, principals)
    assert {r["listener"] for r in accepted} == {SASL, SASL_V0}
    refused = [r for r in rows if (r["client_id"] or "").endswith("-refused")]
    assert {r["sasl_mechanism"] for r in refused} == set(MECHANISMS)
    assert all(r["principal"] is None for r in refused), [r["principal"] for r in refused]
    by_client_id = {(r["client_id"], r["principal"], r["sasl_mechanism"]) for r in rows}
    assert (ADMIN_CLIENT_ID, c.admin_user, "PLAIN") in by_client_id
    assert (CREATED_CLIENT_ID, c.created_user, "SCRAM-SHA-512") in by_client_id
    census = {row["principal"] for row in run.clients}
    assert {c.users[m] for m in c.users} | {c.admin_user, c.created_user} <= census, census
    one = next(r for r in accepted if r["principal"] == c.users["PLAIN"])
    detail = json.loads(run.rest[f"GET /api/v1/connections/{urllib.parse.quote(one['id'], safe='')}"])
    assert detail["principal"] == c.users["PLAIN"] and detail["sasl_mechanism"] == "PLAIN"
    metrics = run.rest["GET /metrics"].decode()
    for m in MECHANISMS:
        series = rf'kafka_census_sasl_authentications_total{{[^}}]*mechanism="{m}"[^}}]*outcome="success"'
        assert re.search(series, metrics), m


# --- the outputs ----------------------------------------------------------------------------

def test_no_secret_in_the_capture_log(run, catalog):
    assert run.exit_code == 0, catalog.mask(run.stderr)
    assert_no_leak(catalog, {f"capture stderr (log level {run.log_level})": run.stderr, "capture stdout": run.stdout})


def test_no_secret_in_metrics(run, catalog):
    assert_no_leak(catalog, {"GET /metrics": run.rest["GET /metrics"]})


def test_no_secret_in_any_rest_response(run, catalog):
    assert any(k.startswith("GET /api/v1/connections/") for k in run.rest)
    assert {"GET /api/v1/clients", "GET /api/v1/brokers", "GET /openapi.json"} <= set(run.rest), sorted(run.rest)
    assert any(k.startswith("GET /api/v1/upgrade-readiness") for k in run.rest), sorted(run.rest)
    assert_no_leak(catalog, {k: v for k, v in run.rest.items() if k != "GET /metrics"})


def test_no_secret_through_the_proxy(run, catalog, broker, tmp_path_factory):
    """The proxy sees every token in the clear. The same credentials as the capture's run go,
    accepted and refused, through `kafka-census proxy` to the same Kafka (confluent-kafka's raw
    runs through the proxy and then a HandshakeV0Relay), so the catalog's passwords and tokens
    apply (this run's SCRAM proofs are new and not in the catalog; the decoder is the capture's)."""
    tmp = tmp_path_factory.mktemp("secrets-proxy")
    creds = run.creds
    relay_port = free_port()
    with HandshakeV0Relay(relay_port, ("127.0.0.1", broker.port(PROXIED_V0))):
        proxy = Capture(tmp, [], proxy=[(broker.fronts[PROXIED], broker.port(PROXIED), PROXIED),
                                        (broker.fronts[PROXIED_V0], relay_port, PROXIED_V0)])
        try:
            reports = _run_clients(RUNS, creds, lambda client, framing:
                                   broker.bootstrap(PROXIED_V0 if through_relay(client, framing) else PROXIED))
            proxy.wait_all_closed()
            rest, rows = _rest_outputs(proxy)
        finally:
            code, out, err = proxy.finish()
    assert code == 0, catalog.mask(err)
    bad = {k: v for k, v in reports.items() if v["ok"] != (k[0] == "accepted")}
    assert not bad, f"client runs through the proxy with an unexpected outcome: {bad}"
    assert {(r["sasl_mechanism"], r["listener"]) for r in rows} >= {(m, PROXIED) for m in MECHANISMS} | \
        {(m, PROXIED_V0) for m in MECHANISMS}
    assert any(r["principal"] == creds.users["PLAIN"] for r in rows)
    files = {str(p.relative_to(tmp)): p.read_bytes() for p in sorted(tmp.rglob("*")) if p.is_file()}
    assert any(name.startswith("events/") for name in files), sorted(files)
    assert_no_leak(catalog, {"proxy stderr (log level debug)": err, "proxy stdout": out, **rest,
                             **{f"proxy file {name}": data for name, data in files.items()}})


def test_no_secret_in_the_event_log_or_any_file_the_capture_wrote(run, catalog):
    assert any(name.startswith("events/") for name in run.files), sorted(run.files)
    assert_no_leak(catalog, {f"file {name}": data for name, data in run.files.items()})


@pytest.mark.parametrize("fmt", ["table", "json"])
def test_no_secret_in_replay(run, catalog, fmt):
    done = subprocess.run([str(CENSUS), "replay", str(run.pcap), "--format", fmt,
                           *[f for spec in run.listener_specs() for f in ("--listener", spec)]],
                          capture_output=True, timeout=120)
    assert done.returncode == 0, catalog.mask(done.stderr)
    users = [*run.creds.users.values(), run.creds.admin_user, run.creds.created_user]
    for user in users:  # the principals are listed (the table cuts them at 12)
        assert (user if fmt == "json" else user[:12]).encode() in done.stdout, user
    assert_no_leak(catalog, {f"replay --format {fmt} stdout": done.stdout,
                             f"replay --format {fmt} stderr": done.stderr})


PIPELINE_DRIVER = r"""
import json, sys
from pathlib import Path
from pipeline.cli import build_parser, progress, spark_session
from pipeline.pcaps import run_pcap_decode
from pipeline.report import run_report

pcap, events, decoded, report, dump, *listeners = sys.argv[1:]
spark = spark_session("local[2]", "test_secrets")
spark.sparkContext.setLogLevel("ERROR")
try:
    flags = [f for spec in listeners for f in ("--listener", spec)]
    print(json.dumps(run_pcap_decode(spark, build_parser().parse_args(
        ["pcap-decode", "--input", pcap, "--output", decoded, *flags]), progress)))
    print(json.dumps(run_report(spark, build_parser().parse_args(
        ["report", "--input", events, decoded + "/events", "--output", report]), progress)))
    with open(dump, "w") as out:  # Parquet pages are compressed: read the tables back
        for part in sorted({p.parent for p in Path(report).rglob("*.parquet")}):
            for row in spark.read.parquet(str(part)).toJSON().collect():
                out.write(f"{part.name}\t{row}\n")
finally:
    spark.stop()
"""


@pytest.fixture(scope="module")
def pipeline_outputs(run, catalog) -> dict[str, bytes]:
    """One Spark session: pcap-decode of the pcap, then the report (with its four tables)
    over the capture's event log and the decoded one."""
    decoded, report, dump = run.tmp / "pipeline-decoded", run.tmp / "pipeline-report", run.tmp / "parquet-rows.tsv"
    done = subprocess.run([sys.executable, "-c", PIPELINE_DRIVER, str(run.pcap), str(run.tmp / "events"), str(decoded),
                           str(report), str(dump), *run.listener_specs()],
                          cwd=str(REPO), capture_output=True, timeout=600)
    assert done.returncode == 0, catalog.mask(done.stderr)
    out = {"pipeline stdout": done.stdout, "pipeline stderr": done.stderr}
    for d in (decoded, report):
        out |= {f"pipeline file {p.relative_to(run.tmp)}": p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}
    out["pipeline Parquet tables, read back"] = dump.read_bytes()
    return out


@pytest.mark.spark  # pcap-decode and the report, in a Spark child
def test_no_secret_in_pipeline_outputs(run, catalog, pipeline_outputs):
    page = next(v for k, v in pipeline_outputs.items() if k.endswith("kafka-census-report.html"))
    assert run.creds.users["PLAIN"].encode() in page  # principals are in the report
    assert any(k.startswith("pipeline file pipeline-decoded/events/") for k in pipeline_outputs)
    assert b"\t" in pipeline_outputs["pipeline Parquet tables, read back"]
    assert_no_leak(catalog, pipeline_outputs)


# --- the searches ------------------------------------------------------------------------------

def test_the_searches_find_what_they_look_for(catalog):
    """The needles match the encodings they claim, whatever the alignment."""
    label, value = next((s, v) for s, v in catalog.secrets if s == "PLAIN password")
    for prefix in (b"", b"x", b"xy", b"xyz"):
        blob = prefix + value + b"tail"
        for encoded in (blob.hex().encode(), base64.b64encode(blob), base64.urlsafe_b64encode(blob),
                        repr(blob).encode(), json.dumps(blob.decode()).encode()):
            assert catalog.leaks("probe", b"<" + encoded + b">"), (prefix, encoded)
    assert not catalog.leaks("probe", b"census-pw-" + secrets.token_hex(16).encode())
    assert len(catalog.needles) > 10 * len(catalog.secrets) // 2
