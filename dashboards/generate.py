"""The one source of kafka-census's Grafana dashboards and Prometheus alert rules: what it
renders, and the command that writes it.

Owns: the three dashboards ("Kafka clients", "Upgrade readiness", "kafka-census health"), the
table of minimum client versions (`MINIMUM_VERSIONS`), the rendering of every output file and
the command line. The panels' building blocks, the shared PromQL and `below_version_regex` (the
PromQL regex of every version string below a minimum) are dashboards/panels.py's; the alert
rules and their runbooks dashboards/alerts.py's. Imports those two, the standard library and
PyYAML: it is a build tool, never imported by the program.

Writes (from the repository root, ``python dashboards/generate.py``):

    dashboards/kafka-clients.json, upgrade-readiness.json, kafka-census-health.json, alerts.yaml
    helm/kafka-census/files/dashboards/*.json, files/alerts.yaml   byte-identical copies (Helm's
                                                                     .Files.Get reads only inside
                                                                     the chart)
    helm/kafka-census/files/minimum-versions.yaml                    the minimum-version table
                                                                     with each regex, for the
                                                                     chart's values

``--check`` renders in memory and exits 1 listing the files that differ from what is on disk
(the drift test); ``--below-regex VERSION`` prints the regex for one minimum (for operators
who set the chart's minimum-version list themselves).

Every dashboard expression is plain PromQL once Grafana's variables are replaced
(``$listener`` -> ``.*``, ``$__rate_interval`` -> e.g. ``1m``, ``$__range`` -> e.g. ``1h``);
``datasource`` is used only in panels' datasource references, never in an expression.
Output is deterministic: JSON with sorted keys and 2-space indent, YAML in a fixed key order,
both ending in one newline.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

REPO_ROOT = Path(__file__).resolve().parent.parent
CHART_FILES = Path("helm/kafka-census/files")
if str(REPO_ROOT) not in sys.path:  # run as a script: dashboards/ is on the path, not the repository
    sys.path.insert(0, str(REPO_ROOT))

from dashboards.alerts import SOFTWARE_GROUP, alert_rules  # noqa: E402
from dashboards.panels import (  # noqa: E402
    JOB_SELECTOR,
    LISTENER,
    RANGE,
    RATE,
    SOFTWARE,
    below_version_regex,
    dashboard,
    problem_ratio,
    rate,
    recent_increase,
    sel,
    stat,
    table,
    target,
    timeseries,
)

# --------------------------------------------------------------------------- configuration
#: Minimum client software versions: (KIP-511 ClientSoftwareName, minimum, why). Below the
#: minimum fires KafkaCensusClientBelowMinimumVersion. The defaults are the client releases
#: KIP-896 checked against the protocol baseline Kafka 4.0 keeps ("the latest client release
#: at the end of 2021"), and the Kafka 4.0 upgrade notes for the Java client. Change the
#: table and run `make regen`, or set the Helm chart's minimum-version list (see
#: dashboards/README.md). Only clients that send ApiVersions v3+ have a name to match: others
#: are "unknown" and are caught by the deprecated-API alert instead.
MINIMUM_VERSIONS: tuple[tuple[str, str, str], ...] = (
    ("apache-kafka-java", "2.1.0",
     "Kafka 4.0 upgrade notes: Java clients must be 2.1 or newer (KIP-896, KIP-1124). Java clients "
     "send their name from 2.4 on; older ones show as unknown."),
    ("librdkafka", "1.8.2", "KIP-896 verified Kafka 4.0's protocol baseline against librdkafka 1.8.2."),
    ("confluent-kafka-python", "1.8.2", "librdkafka-based; versions follow librdkafka's (KIP-896: 1.8.2)."),
    ("confluent-kafka-go", "1.8.2", "librdkafka-based; versions follow librdkafka's (KIP-896: 1.8.2)."),
    ("confluent-kafka-dotnet", "1.8.2", "librdkafka-based; versions follow librdkafka's (KIP-896: 1.8.2)."),
    ("kafka-python", "2.0.2", "KIP-896 verified Kafka 4.0's protocol baseline against kafka-python 2.0.2."),
)


# --------------------------------------------------------------------------- the dashboards
def kafka_clients() -> dict:
    conns = sel("kafka_census_connections", LISTENER)
    unknown = sel("kafka_census_connections", LISTENER, 'client_software_name="unknown"')
    identified = sel("kafka_census_connections", LISTENER, 'client_software_name!="unknown"')
    answers = sel("kafka_census_api_versions_responses_total", LISTENER)
    invalid = sel("kafka_census_api_versions_responses_total", LISTENER, 'error="INVALID_REQUEST"')
    requests = sel("kafka_census_requests_total", LISTENER)
    deprecated = sel("kafka_census_deprecated_requests_total", LISTENER)
    by_software = f"sum by ({SOFTWARE})"
    return dashboard("kafka-census-clients", "Kafka clients",
                     "Who is connected to the Kafka brokers, with which client software and version "
                     "(KIP-511), through which listener.", [
        ("Overview", [
            stat("Open connections", "Kafka connections open now on the selected listeners.", f"sum({conns})"),
            stat("Software versions in use", "Distinct client software name/version pairs with open connections "
                 "('unknown' excluded).",
                 f"count({by_software} ({identified}) > 0) or vector(0)"),
            stat("Connections without identity", "Open connections whose client sent no KIP-511 software name: "
                 "ApiVersions v0-v2 clients, connections opened without ApiVersions, captures that joined "
                 "mid-stream, TLS.", f"sum({unknown}) or vector(0)"),
            stat("Rejected identities", "ApiVersions requests the broker answered INVALID_REQUEST in the time range: "
                 "the client's software name or version fails the broker's KIP-511 pattern.",
                 f"sum(increase({invalid}[{RANGE}])) or vector(0)", red_at=1),
        ]),
        ("Connections", [
            timeseries("Connections by client software", "Open connections per KIP-511 ClientSoftwareName.",
                       [target(f"sum by (client_software_name) ({conns})", "{{client_software_name}}")], stack=True),
            timeseries("Connections by client software and version", "Open connections per software name and "
                       "version; 'other' means the exporter's label limit was reached.",
                       [target(f"{by_software} ({conns})", "{{client_software_name}} {{client_software_version}}")],
                       stack=True),
            timeseries("Connections by listener", "Open connections per broker listener.",
                       [target(f"sum by (listener) ({conns})", "{{listener}}")], stack=True),
            timeseries("Connections opened and closed", "New and closed connections per second; close reasons: "
                       "fin, rst, idle, evicted, reused (capture); client_closed, upstream_closed, client_reset, "
                       "upstream_reset, upstream_refused, upstream_timeout, upstream_tls_failed, "
                       "tls_handshake_failed, shutdown (proxy). Steady churn is often a client reconnecting in a loop.",
                       [target(f'sum by (listener) ({rate(sel("kafka_census_connections_opened_total", LISTENER))})',
                               "opened {{listener}}"),
                        target(f'sum by (listener, reason) '
                               f'({rate(sel("kafka_census_connections_closed_total", LISTENER))})',
                               "closed {{listener}} ({{reason}})")], unit="cps"),
            timeseries("Clients reconnecting in a loop", "Clients (client address and client_id) opening connections "
                       "at or over --churn-threshold-per-minute (60 a minute by default), per exporter. "
                       "GET /api/v1/churn, `kafka-census churn` and the incident page name them; the alert "
                       "KafkaCensusClientReconnectStorm fires after 10 minutes.",
                       [target("sum by (instance) (kafka_census_churning_clients)", "{{instance}}")]),
        ]),
        ("Identities", [
            timeseries("Connections without a client identity", "Open connections with software 'unknown': "
                       "clients that send ApiVersions v0-v2 (aiokafka, kafkajs, Sarama, Java before 2.4, "
                       "librdkafka before 1.4) or no ApiVersions at all, captures that joined mid-stream, and "
                       "TLS without the proxy. The REST API lists them by client_id and address.",
                       [target(f"sum by (listener) ({unknown})", "{{listener}}")], stack=True),
            timeseries("Invalid client identities", "ApiVersions v3+ requests answered INVALID_REQUEST (42): the "
                       "software name or version does not match the broker's pattern, so the broker registers "
                       "nothing and the client fails its handshake.",
                       [target(f"sum by (listener, request_version) ({rate(invalid)})",
                               "{{listener}} v{{request_version}}")], unit="reqps"),
            timeseries("ApiVersions answers by request version and error", "How clients identify themselves: "
                       "v3+ carries the KIP-511 fields; UNSUPPORTED_VERSION makes a client retry with a lower "
                       "version.",
                       [target(f"sum by (request_version, error) ({rate(answers)})",
                               "v{{request_version}} {{error}}")], unit="reqps", w=24),
        ]),
        ("Versions", [
            table("Client software versions", "One row per software name and version: open connections, "
                  "requests per second, and requests using API versions Kafka 4.0 removed in the time range.", [
                      ("Open connections", f"{by_software} ({conns})"),
                      ("Requests/s", f"{by_software} ({rate(requests)})"),
                      ("Removed-version requests", f"{by_software} ({recent_increase(deprecated, RANGE)})"),
                  ], keys=["client_software_name", "client_software_version"], h=10),
            timeseries("Version adoption", "Share of each client software's open connections by version: how far "
                       "an upgrade has rolled out.",
                       [target(f"{by_software} ({conns})\n/ on (client_software_name) group_left ()\n"
                               f"(sum by (client_software_name) ({conns}) > 0)",
                               "{{client_software_name}} {{client_software_version}}")],
                       unit="percentunit", max_value=1, w=24),
            timeseries("Requests by client software and version", "Kafka requests per second per software "
                       "name and version.",
                       [target(f"{by_software} ({rate(requests)})",
                               "{{client_software_name}} {{client_software_version}}")], unit="reqps"),
            timeseries("Request latency p99 by API", "99th percentile from a request's last byte to its "
                       "response's last byte, as captured (the broker's and the network's time).",
                       [target(f'histogram_quantile(0.99, sum by (le, api) '
                               f'({rate(sel("kafka_census_request_duration_seconds_bucket", LISTENER))}))',
                               "{{api}}")], unit="s"),
        ]),
    ])


def upgrade_readiness() -> dict:
    deprecated = sel("kafka_census_deprecated_requests_total", LISTENER)
    requests = sel("kafka_census_requests_total", LISTENER)
    produce = sel("kafka_census_produce_requests_total", LISTENER)
    bad_acks = sel("kafka_census_produce_requests_total", LISTENER, 'acks!~"0|1|-1"')
    sasl = sel("kafka_census_sasl_authentications_total", LISTENER)
    return dashboard("kafka-census-upgrade", "Upgrade readiness",
                     "What breaks if the brokers are upgraded: API versions Kafka 4.0 removed (KIP-896), "
                     "invalid produce acks (KIP-1), SASL mechanisms, and what each broker announces.", [
        ("Kafka 4.0 (KIP-896)", [
            stat("Removed-version requests", "Requests in the time range using an API version Kafka 4.0 "
                 "removed. Against a 4.0 broker each fails with UNSUPPORTED_VERSION.",
                 f"sum({recent_increase(deprecated, RANGE)}) or vector(0)", red_at=1),
            stat("Client versions affected", "Client software name/version pairs that used a removed API "
                 "version in the time range ('unknown' counts as one).",
                 f"count(sum by ({SOFTWARE}) ({recent_increase(deprecated, RANGE)}) > 0) or vector(0)",
                 red_at=1),
            stat("Produce requests with invalid acks", "Produce requests in the time range with acks other "
                 "than 0, 1 or -1 (acks > 1 is error 21 INVALID_REQUIRED_ACKS since KIP-1).",
                 f"sum({recent_increase(bad_acks, RANGE)}) or vector(0)", red_at=1),
            stat("SASL mechanisms seen", "Distinct SASL mechanisms clients used since each exporter started.",
                 f"count(count by (mechanism) ({sasl})) or vector(0)"),
        ]),
        ("Removed API versions", [
            timeseries("Removed-version requests by client software and version", "Requests per second using "
                       "API versions Kafka 4.0 removed, per client software and version.",
                       [target(f"sum by ({SOFTWARE}) ({rate(deprecated)})",
                               "{{client_software_name}} {{client_software_version}}")], unit="reqps"),
            timeseries("Removed-version requests by API and version", "Which API versions are still used "
                       "that Kafka 4.0 no longer accepts.",
                       [target(f"sum by (api, api_version) ({rate(deprecated)})", "{{api}} v{{api_version}}")],
                       unit="reqps"),
            table("Who uses removed API versions", "Requests in the time range per listener, software, API and "
                  "version that Kafka 4.0 removed. GET /api/v1/upgrade-readiness?target=4.0 names the "
                  "connections (client_id, principal, address).",
                  [("Requests", f"sum by (listener, {SOFTWARE}, api, api_version) "
                                f"({recent_increase(deprecated, RANGE)}) > 0")],
                  keys=["listener", "client_software_name", "client_software_version", "api", "api_version"]),
            table("API versions in use", "Requests in the time range per API and version, all clients: compare "
                  "with the brokers' ranges below before changing broker versions.",
                  [("Requests", f"sum by (api, api_version) ({recent_increase(requests, RANGE)}) > 0")],
                  keys=["api", "api_version"], w=12, h=10),
            table("Client software using each API", "Requests in the time range per API, version and client "
                  "software.",
                  [("Requests", f"sum by (api, api_version, {SOFTWARE}) ({recent_increase(requests, RANGE)}) > 0")],
                  keys=["api", "api_version", "client_software_name", "client_software_version"], w=12, h=10),
        ]),
        ("Produce acks", [
            timeseries("Produce requests by acks", "Produce requests per second by acks (0: no response, "
                       "1: leader, -1: all in-sync replicas).",
                       [target(f"sum by (acks) ({rate(produce)})", "acks={{acks}}")], unit="reqps"),
            timeseries("Producers with invalid acks (acks > 1)", "Produce requests with acks other than 0, 1, -1, "
                       "by client software. Brokers reject them with INVALID_REQUIRED_ACKS (21) since KIP-1.",
                       [target(f"sum by ({SOFTWARE}, acks) ({rate(bad_acks)})",
                               "{{client_software_name}} {{client_software_version}} acks={{acks}}")],
                       unit="reqps"),
        ]),
        ("SASL", [
            timeseries("SASL authentications by mechanism and outcome", "Authentications per second: "
                       "mechanisms to keep enabled on the new brokers, and failures.",
                       [target(f"sum by (mechanism, outcome) ({rate(sasl)})", "{{mechanism}} {{outcome}}")],
                       unit="ops"),
            table("SASL mechanisms by listener", "Authentications since each exporter started, by listener, "
                  "mechanism and outcome.", [("Authentications", f"sum by (listener, mechanism, outcome) ({sasl})")],
                  keys=["listener", "mechanism", "outcome"], w=12),
        ]),
        ("Brokers", [
            table("Broker API version ranges", "Each API's version range in the brokers' last "
                  "ApiVersionsResponse (KIP-35).", [
                      ("Min version", "max by (broker, api) (kafka_census_broker_api_min_version)"),
                      ("Max version", "max by (broker, api) (kafka_census_broker_api_max_version)"),
                  ], keys=["broker", "api"], w=12, h=12, sort_by="api"),
            table("Broker features (KIP-584)", "Supported feature versions and finalized (cluster-wide) levels "
                  "the brokers announced, e.g. metadata.version.", [
                      ("Max version", "max by (broker, feature) (kafka_census_broker_feature_max_version)"),
                      ("Finalized level", "max by (broker, feature) (kafka_census_broker_feature_finalized_level)"),
                  ], keys=["broker", "feature"], w=12, h=12, sort_by="feature"),
        ]),
    ])


def health() -> dict:
    up = f"up{{{JOB_SELECTOR}}}"
    per_source = "sum by (instance, source)"
    return dashboard("kafka-census-health", "kafka-census health",
                     "Is the census complete? Capture drops, protocol decode problems, tracked flows and the "
                     "exporter's own health.", [
        ("Exporter", [
            stat("Targets up", "kafka-census scrape targets Prometheus reaches.", f"sum({up})"),
            stat("Targets down", "kafka-census scrape targets Prometheus cannot scrape.",
                 f"count({up} == 0) or vector(0)", red_at=1),
            stat("Flows tracked now", "TCP flows the captures track now.", "sum(kafka_census_capture_flows)"),
            stat("Kernel drops in range", "Packets the kernel dropped in the time range because the capture "
                 "fell behind.",
                 f"sum(increase(kafka_census_capture_kernel_dropped_total[{RANGE}])) or vector(0)", red_at=1),
            timeseries("Scrape duration", "Time to build one scrape (kafka-census) and the whole scrape as "
                       "Prometheus measured it.",
                       [target("max by (instance) (kafka_census_scrape_duration_seconds)", "build {{instance}}"),
                        target(f"max by (instance) (scrape_duration_seconds{{{JOB_SELECTOR}}})",
                               "scrape {{instance}}")], unit="s"),
            table("Versions", "kafka-census build running on each target.",
                  [("Up", "max by (instance, version, python_version) (kafka_census_build_info)")],
                  keys=["instance", "version", "python_version"], w=12, sort_by="instance"),
        ]),
        ("Capture", [
            timeseries("Packets captured", "Packets per second each capture read.",
                       [target(f"{per_source} ({rate('kafka_census_capture_packets_total')})",
                               "{{instance}} {{source}}")], unit="pps"),
            timeseries("Kernel drops", "Packets per second the kernel (capture buffer full) or the interface "
                       "dropped before kafka-census read them (pcap_stats). Any drop can cost identities and "
                       "requests.",
                       [target(f"{per_source} ({rate('kafka_census_capture_kernel_dropped_total')})",
                               "kernel {{instance}} {{source}}"),
                        target(f"{per_source} ({rate('kafka_census_capture_interface_dropped_total')})",
                               "interface {{instance}} {{source}}")], unit="pps"),
            timeseries("Packets not decoded by reason", "Packets or segments not passed to the decoder: "
                       "not_listener, retransmission, out_of_window, snaplen_truncated...",
                       [target(f"sum by (reason) ({rate('kafka_census_capture_drops_total')})", "{{reason}}")],
                       unit="pps"),
            timeseries("Tracked TCP flows", "TCP flows tracked now, per capture.",
                       [target(f"{per_source} (kafka_census_capture_flows)", "{{instance}} {{source}}")]),
            timeseries("TCP gaps and flow evictions", "Gaps: bytes the capture never saw (the connection "
                       "desyncs, then resyncs). Evictions: the flow table was full (--max-flows).",
                       [target(f"{per_source} ({rate('kafka_census_capture_gaps_total')})",
                               "gaps {{instance}} {{source}}"),
                        target(f"{per_source} ({rate('kafka_census_capture_flows_evicted_total')})",
                               "evictions {{instance}} {{source}}")], unit="ops", w=24),
        ]),
        ("Protocol", [
            timeseries("Decode errors by kind", "Protocol problems that kept frame boundaries.",
                       [target(f"sum by (kind) ({rate('kafka_census_decode_errors_total')})", "{{kind}}")],
                       unit="ops"),
            timeseries("Desyncs by kind", "Times a direction lost its frame boundaries (TCP gap, garbage, "
                       "non-Kafka traffic on a listener port) and had to resync.",
                       [target(f"sum by (kind) ({rate('kafka_census_desyncs_total')})", "{{kind}}")], unit="ops"),
            timeseries("Decode problem ratio", "Decode errors plus desyncs per decoded request; the alert "
                       "fires above 1% for 10 minutes.",
                       [target(problem_ratio(RATE), "{{instance}}")], unit="percentunit"),
            timeseries("Requests decoded by listener", "Kafka requests decoded per second.",
                       [target(f'sum by (listener) ({rate(sel("kafka_census_requests_total", LISTENER))})',
                               "{{listener}}")], unit="reqps"),
        ]),
        ("Bounds and event log", [
            timeseries("Bounded tables", "Identities that went to the 'other' label (software label limit), "
                       "connections not tracked (--max-connections), closed connections forgotten early.",
                       [target(f"sum by (instance) ({rate('kafka_census_software_label_overflow_total')})",
                               "label overflow {{instance}}"),
                        target(f"sum by (instance) ({rate('kafka_census_untracked_connections_total')})",
                               "untracked {{instance}}"),
                        target(f"sum by (instance) ({rate('kafka_census_forgotten_closed_connections_total')})",
                               "forgotten {{instance}}")], unit="ops"),
            timeseries("Event log", "Events written to the event log, write errors (e.g. disk full) and events "
                       "dropped; only with --event-log.",
                       [target(f"sum by (instance) ({rate('kafka_census_event_log_written_total')})",
                               "written {{instance}}"),
                        target(f"sum by (instance) ({rate('kafka_census_event_log_write_errors_total')})",
                               "write errors {{instance}}"),
                        target(f"sum by (instance) ({rate('kafka_census_event_log_dropped_total')})",
                               "dropped {{instance}}")], unit="ops"),
            timeseries("State file", "Connections given back their identity from --state-file after a restart, "
                       "and failed saves of the state file; only with --state-file.",
                       [target(f"sum by (instance) ({rate('kafka_census_state_restored_connections_total')})",
                               "restored {{instance}}"),
                        target(f"sum by (instance) ({rate('kafka_census_state_write_errors_total')})",
                               "write errors {{instance}}")], unit="ops"),
        ]),
    ])


DASHBOARDS = {"kafka-clients.json": kafka_clients, "upgrade-readiness.json": upgrade_readiness,
              "kafka-census-health.json": health}


# --------------------------------------------------------------------------- rendering
class _Dumper(yaml.SafeDumper):
    """Block style; multi-line strings (expressions, runbooks) as literal blocks."""


def _str(dumper: yaml.SafeDumper, value: str):
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def _yaml(data, header: str) -> str:
    body = yaml.dump(data, Dumper=_Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True,
                     width=1_000_000, indent=2)
    return header + body


def _json(data) -> str:
    return json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


MINIMUM_VERSIONS_HEADER = f"""\
# Generated by dashboards/generate.py from its MINIMUM_VERSIONS table; do not edit.
# Default minimum client software versions for the chart's values. For each entry the chart
# renders one rule of alert KafkaCensusClientBelowMinimumVersion (group {SOFTWARE_GROUP}), the same
# shape the generator writes to alerts.yaml:
#   expr: max by (listener, client_software_name, client_software_version) (
#           max_over_time(kafka_census_connections{{client_software_name="<name>",
#                                                    client_software_version=~"<below_regex>"}}[1h])
#         ) > 0
#   labels: {{severity: warning, minimum_version: "<minimum>", client_software_name: "<name>"}}
# below_regex matches every version string whose leading numeric part is below `minimum`
# (PromQL regexes are anchored at both ends). For another minimum:
#   python dashboards/generate.py --below-regex 2.3.1
"""


def render() -> dict[str, str]:
    """Every output file: {path relative to the repository root: content}."""
    out = {}
    for filename, build in DASHBOARDS.items():
        text = _json(build())
        out[f"dashboards/{filename}"] = text
        out[f"{CHART_FILES}/dashboards/{filename}"] = text
    alerts = _yaml(alert_rules(MINIMUM_VERSIONS), "# Generated by dashboards/generate.py; do not edit. Prometheus "
                                                  "alert rules for kafka-census.\n")
    out["dashboards/alerts.yaml"] = alerts
    out[f"{CHART_FILES}/alerts.yaml"] = alerts
    table = [{"name": name, "minimum": minimum, "below_regex": below_version_regex(minimum)}
             for name, minimum, _ in MINIMUM_VERSIONS]
    out[f"{CHART_FILES}/minimum-versions.yaml"] = _yaml({"minimumVersions": table}, MINIMUM_VERSIONS_HEADER)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Render kafka-census's Grafana dashboards and alert rules.")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 listing the files that differ from a fresh rendering")
    parser.add_argument("--below-regex", metavar="VERSION",
                        help="print the PromQL regex of every version below VERSION and exit")
    args = parser.parse_args(argv)
    if args.below_regex is not None:
        try:
            print(below_version_regex(args.below_regex))
        except ValueError as exc:
            print(f"generate.py: error: {exc}", file=sys.stderr)
            return 2
        return 0
    files = render()
    if args.check:
        drifted = [rel for rel, text in files.items()
                   if not (REPO_ROOT / rel).is_file() or (REPO_ROOT / rel).read_text(encoding="utf-8") != text]
        for rel in drifted:
            print(f"drifted: {rel}", file=sys.stderr)
        if drifted:
            print("run `python dashboards/generate.py` (make regen) and commit the result", file=sys.stderr)
            return 1
        return 0
    for rel, text in files.items():
        path = REPO_ROOT / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {rel}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
