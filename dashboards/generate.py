"""The one source of kafka-census's Grafana dashboards and Prometheus alert rules.

Owns: the three dashboards ("Kafka clients", "Upgrade readiness", "kafka-census health"), the
alert rules with their runbooks, the table of minimum client versions and
`below_version_regex`, the PromQL regex of every version string below a minimum. Imports only
the standard library and PyYAML: it is a build tool, never imported by the program.

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
import re
import sys
from pathlib import Path

import yaml

REPO_ROOT = Path(__file__).resolve().parent.parent
CHART_FILES = Path("helm/kafka-census/files")

# --------------------------------------------------------------------------- configuration
#: Selects kafka-census scrape jobs (`up`, the absent check). The chart's ServiceMonitor and a
#: plain scrape config both give job names containing "kafka-census".
JOB_SELECTOR = 'job=~".*kafka-census.*"'

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

# Grafana variables and the label matcher every listener-labelled series gets.
LISTENER = 'listener=~"$listener"'
RATE = "$__rate_interval"
RANGE = "$__range"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
SOFTWARE = "client_software_name, client_software_version"
TAGS = ["kafka", "kafka-census"]


# --------------------------------------------------------------------------- version regex
def _minimum_components(minimum: str) -> tuple[int, ...]:
    """`minimum` as integers without trailing zeros ("2.3.0" -> (2, 3)); ValueError if it is
    not dotted decimal or nothing is below it ("0", "0.0")."""
    if not re.fullmatch(r"[0-9]+(\.[0-9]+)*", minimum):
        raise ValueError(f"minimum version {minimum!r} is not dotted decimal (e.g. 2.3.1)")
    parts = [int(p) for p in minimum.split(".")]
    while parts and parts[-1] == 0:
        parts.pop()
    if not parts:
        raise ValueError(f"no version is below {minimum!r}")
    return tuple(parts)


def _digit_range(lo: int, hi: int) -> str:
    return str(lo) if lo == hi else f"[{lo}-{hi}]"


def _numbers_below(n: int) -> str:
    """A regex for every decimal 0 .. n-1 written without leading zeros (n >= 1)."""
    digits = str(n)
    width = len(digits)
    alternatives = []
    for shorter in range(1, width):  # every number with fewer digits than n
        alternatives.append("[0-9]" if shorter == 1 else "[1-9]" + "[0-9]" * (shorter - 1))
    for i in range(width):  # same width: equal up to digit i, smaller at digit i, anything after
        lowest = 1 if i == 0 and width > 1 else 0
        highest = int(digits[i]) - 1
        if highest >= lowest:
            alternatives.append(digits[:i] + _digit_range(lowest, highest) + "[0-9]" * (width - i - 1))
    return alternatives[0] if len(alternatives) == 1 else "(" + "|".join(alternatives) + ")"


def below_version_regex(minimum: str) -> str:
    """A regex matching, in full, every version string below `minimum`, for
    ``client_software_version=~"..."`` (PromQL anchors regexes at both ends).

    A version is compared by its leading numeric part: an optional ``v``/``V``, then dotted
    decimal components (leading zeros allowed); whatever follows is ignored, so
    ``2.16.1-rdkafka-2.16.0`` counts as 2.16.1 and ``3.7.0-SNAPSHOT`` as 3.7.0. Missing
    components are zeros (``2.3`` is 2.3.0). A version with no leading number (``unknown``)
    is never below. Component values may have any number of digits: below 10.2 matches 9.9 and
    1.0 but not 10.2, 11.0 or 100.0.

    One alternative per place the version can first fall short of the minimum: a smaller
    component followed by a non-digit or the end, or the numeric part ending early while the
    minimum still has a non-zero component. Written for Go's RE2 (no backreferences,
    lookaround or counted repetition) and valid in Python's `re` alike; a literal dot is
    ``[.]``, never ``\\.``, so the regex needs no escaping inside a PromQL, YAML, JSON or Helm
    string.
    """
    m = _minimum_components(minimum)
    not_a_digit_after = "([^0-9].*)?"
    numeric_part_ends = "([^.0-9].*|[.]([^0-9].*)?)?"
    alternatives = []
    for i, component in enumerate(m):
        equal_prefix = "[.]".join(f"0*{c}" for c in m[:i])
        if i > 0:  # the version stops after m[:i]: the rest of m is not all zeros, so it is below
            alternatives.append(equal_prefix + numeric_part_ends)
        if component > 0:
            separator = "[.]" if i > 0 else ""
            alternatives.append(equal_prefix + separator + "0*" + _numbers_below(component) + not_a_digit_after)
    return "[vV]?(" + "|".join(alternatives) + ")"


# --------------------------------------------------------------------------- PromQL helpers
def sel(metric: str, *matchers: str) -> str:
    return f"{metric}{{{', '.join(matchers)}}}" if matchers else metric


def rate(selector: str) -> str:
    return f"rate({selector}[{RATE}])"


def recent_increase(selector: str, window: str) -> str:
    """Increase of a counter over `window`, counting series born inside it too.

    kafka-census creates a labelled counter at its first event (a one-off batch job's
    Produce v2 appears with value 3 and stays there); `increase()` cannot see a rise from
    "no series" to 3, so series that did not exist `window` ago contribute their value. The
    `> 0` matters: a zero increase would otherwise hide the newborn series' value in the `or`."""
    return f"(increase({selector}[{window}]) > 0 or ({selector} unless {selector} offset {window}))"


def problem_ratio(window: str) -> str:
    """Decode errors plus desyncs per decoded request, per kafka-census instance. The two
    families can share `kind` values, so each is tagged before the union."""
    return (
        "sum by (job, instance) (\n"
        f'  label_replace(rate(kafka_census_decode_errors_total[{window}]), "problem", "decode_error", "", "")\n'
        f'  or label_replace(rate(kafka_census_desyncs_total[{window}]), "problem", "desync", "", "")\n'
        ")\n"
        f"/ sum by (job, instance) (rate(kafka_census_requests_total[{window}]))"
    )


# --------------------------------------------------------------------------- Grafana model
def target(expr: str, legend: str = "", *, instant: bool = False, table: bool = False) -> dict:
    t = {"datasource": DATASOURCE, "editorMode": "code", "expr": expr, "legendFormat": legend,
         "range": not instant, "instant": instant}
    if table:
        t["format"] = "table"
    return t


def _thresholds(red_at: float | None) -> dict:
    steps = [{"color": "green", "value": None}]
    if red_at is not None:
        steps.append({"color": "red", "value": red_at})
    return {"mode": "absolute", "steps": steps}


def timeseries(title: str, description: str, targets: list[dict], *, unit: str = "short", w: int = 12,
               h: int = 8, stack: bool = False, max_value: float | None = None) -> dict:
    defaults = {
        "color": {"mode": "palette-classic"},
        "custom": {"drawStyle": "line", "fillOpacity": 20 if stack else 0, "lineWidth": 1,
                   "showPoints": "never", "spanNulls": False,
                   "stacking": {"group": "A", "mode": "normal" if stack else "none"}},
        "min": 0, "thresholds": _thresholds(None), "unit": unit,
    }
    if max_value is not None:
        defaults["max"] = max_value
    return {"type": "timeseries", "title": title, "description": description, "targets": targets,
            "fieldConfig": {"defaults": defaults, "overrides": []},
            "options": {"legend": {"calcs": ["lastNotNull", "max"], "displayMode": "table",
                                   "placement": "bottom", "showLegend": True},
                        "tooltip": {"mode": "multi", "sort": "desc"}},
            "w": w, "h": h}


def stat(title: str, description: str, expr: str, *, unit: str = "short", red_at: float | None = None,
         w: int = 6, h: int = 4) -> dict:
    return {"type": "stat", "title": title, "description": description,
            "targets": [target(expr, title, instant=True)],
            "fieldConfig": {"defaults": {"color": {"mode": "thresholds"}, "thresholds": _thresholds(red_at),
                                         "unit": unit}, "overrides": []},
            "options": {"colorMode": "value", "graphMode": "none", "justifyMode": "auto",
                        "orientation": "auto", "textMode": "auto",
                        "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}},
            "w": w, "h": h}


def table(title: str, description: str, columns: list[tuple[str, str]], *, keys: list[str],
          w: int = 24, h: int = 8, sort_by: str | None = None) -> dict:
    """An instant table: one target per value column ((header, expr)), rows joined on `keys`."""
    targets = [target(expr, header, instant=True, table=True) for header, expr in columns]
    rename = {"Value" if len(columns) == 1 else f"Value #{chr(ord('A') + i)}": header
              for i, (header, _) in enumerate(columns)}
    index = {key: i for i, key in enumerate([*keys, *rename.values()])}
    transformations = [{"id": "merge", "options": {}}] if len(columns) > 1 else []
    transformations.append({"id": "organize", "options": {"excludeByName": {"Time": True},
                                                          "indexByName": index, "renameByName": rename}})
    return {"type": "table", "title": title, "description": description, "targets": targets,
            "transformations": transformations,
            "fieldConfig": {"defaults": {"custom": {"align": "auto", "filterable": True},
                                         "thresholds": _thresholds(None)}, "overrides": []},
            "options": {"cellHeight": "sm", "showHeader": True,
                        "sortBy": [{"desc": True, "displayName": sort_by or columns[0][0]}]},
            "w": w, "h": h}


def _layout(rows: list[tuple[str, list[dict]]]) -> list[dict]:
    """Rows of panels flowed left to right on Grafana's 24-column grid; ids in order from 1."""
    panels, y, next_id = [], 0, 1
    for row_title, row_panels in rows:
        panels.append({"type": "row", "title": row_title, "id": next_id, "collapsed": False, "panels": [],
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}})
        next_id, y = next_id + 1, y + 1
        x, line_height = 0, 0
        for spec in row_panels:
            panel = dict(spec)
            w, h = panel.pop("w"), panel.pop("h")
            if x + w > 24:
                x, y, line_height = 0, y + line_height, 0
            panel.update(id=next_id, gridPos={"h": h, "w": w, "x": x, "y": y}, datasource=DATASOURCE)
            for ref, t in enumerate(panel["targets"]):
                t["refId"] = chr(ord("A") + ref)
            panels.append(panel)
            next_id, x, line_height = next_id + 1, x + w, max(line_height, h)
        y += line_height
    return panels


def _variables() -> list[dict]:
    query = "label_values(kafka_census_connections, listener)"
    return [
        {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
         "current": {}, "hide": 0, "includeAll": False, "multi": False, "options": [], "refresh": 1,
         "regex": ""},
        {"name": "listener", "label": "Listener", "type": "query", "datasource": DATASOURCE,
         "definition": query, "query": query, "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
         "hide": 0, "includeAll": True, "allValue": ".*",
         "multi": True, "options": [], "refresh": 2, "regex": "", "sort": 1},
    ]


def dashboard(uid: str, title: str, description: str, rows: list[tuple[str, list[dict]]]) -> dict:
    return {
        "annotations": {"list": [{"builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                                  "enable": True, "hide": True, "iconColor": "rgba(0, 211, 255, 1)",
                                  "name": "Annotations & Alerts", "type": "dashboard"}]},
        "description": description + " Generated by dashboards/generate.py (kafka-census): edit the generator, "
                                     "not this JSON.",
        "editable": True,
        "fiscalYearStartMonth": 0,
        "graphTooltip": 1,
        "id": None,
        "links": [{"asDropdown": False, "icon": "external link", "includeVars": True, "keepTime": True,
                   "tags": ["kafka-census"], "targetBlank": False, "title": "kafka-census", "tooltip": "",
                   "type": "dashboards", "url": ""}],
        "panels": _layout(rows),
        "refresh": "1m",
        "schemaVersion": 39,
        "tags": TAGS,
        "templating": {"list": _variables()},
        "time": {"from": "now-6h", "to": "now"},
        "timepicker": {},
        "timezone": "",
        "title": title,
        "uid": uid,
        "version": 1,
        "weekStart": "",
    }


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


# --------------------------------------------------------------------------- alert rules
RUNBOOK_DEPRECATED = """\
What it means: a client sent requests with an API version that Apache Kafka 4.0 removed (KIP-896
keeps only the protocol of Kafka 2.1 and later). Brokers before 4.0 still answer them, so nothing
is broken today; a 4.0 broker answers UNSUPPORTED_VERSION and such a client stops working. This is
an upgrade blocker, not an outage.
What to do:
1. Find the applications: GET /api/v1/upgrade-readiness?target=4.0 on any kafka-census sidecar
   lists each connection and client (client_id, principal, address) with the removed versions it
   used; the "Upgrade readiness" dashboard shows software, versions and APIs.
2. Have the owners upgrade the client library (Java 2.1+, librdkafka-based clients 1.8.2+,
   kafka-python 2.0.2+, or newer). Software "unknown" sent no KIP-511 name (ApiVersions v0-v2):
   find it by client_id or address in the REST API.
3. Keep the brokers below 4.0 until this alert has stayed quiet for a full business cycle
   (monthly batch jobs too).
"""

RUNBOOK_MINIMUM = """\
What it means: clients announce (KIP-511 ApiVersions v3+) a software version below the minimum
set for that software. Versions compare on their leading numeric part (2.16.1-rdkafka-2.16.0
counts as 2.16.1). The default minimums are the client releases KIP-896 verified against the
protocol Kafka 4.0 keeps, so older clients may break when the brokers move to 4.0.
What to do:
1. Find the applications: GET /api/v1/connections?state=all&client_software_name=NAME&client_software_version=VERSION
   gives client_id, principal and address; GET /api/v1/clients has the census with closed
   connections folded in.
2. Ask the owners to upgrade the client library (for librdkafka wrappers: the wrapper and its
   bundled librdkafka).
3. To change a minimum: edit MINIMUM_VERSIONS in dashboards/generate.py and run `make regen`, or
   set the Helm chart's minimum-version list, with the regex from
   `python dashboards/generate.py --below-regex VERSION`.
"""

RUNBOOK_KERNEL_DROPS = """\
What it means: the kernel dropped packets before kafka-census read them (pcap_stats): the
capture buffer filled up because kafka-census fell behind. Brokers and clients are not affected
(the capture is passive), but the census is incomplete: dropped segments become TCP gaps,
connections desync and resync, some requests go uncounted, and a new connection's ApiVersions
exchange (its identity) can be lost, so it shows as unknown.
What to do:
1. Check the "kafka-census health" dashboard: packets/s against drops, CPU of the sidecar. One
   core handles roughly 100k packets/s.
2. Remove CPU throttling: raise the sidecar's CPU limit/request.
3. Raise the kernel buffer (--buffer-mb, default 64) for bursts; capture on the broker's
   interface rather than "any"; list only Kafka listener ports (--listener).
"""

RUNBOOK_UNSUPPORTED_VERSION = """\
What it means: the broker closed client connections without an answer right after a request
version it does not accept: outside the API ranges it advertises, or, on a Kafka 4 broker, a
version KIP-896 removed (it still advertises Produce v0-2 but closes on them). These clients
are failing now: typically an old client library after the brokers were upgraded to Kafka 4.
What to do:
1. List them: `kafka-census connections --state closed --close-reason unsupported_version`
   or GET /api/v1/connections?state=closed&close_reason=unsupported_version (each connection's
   unsupported_request names the version; client_id and address name the application).
2. Upgrade those clients (the upgrade-readiness report gives each library's first release
   that Kafka 4 serves), or roll the brokers back while they do.
"""

RUNBOOK_RECONNECT_STORM = """\
What it means: a client (one client address and client_id) has been opening connections at or
over the churn threshold (--churn-threshold-per-minute, 60 a minute by default) for 10 minutes: a
reconnect loop. Each new connection costs the broker an accept, often a TLS handshake and a SASL
exchange, and a connection slot (max.connections, connection rate quotas); the client itself is
usually failing (a broker answer it cannot handle, an authentication error, a too-old or too-new
protocol version).
What to do:
1. List who: the incident page's "Churning clients", GET /api/v1/churn or `kafka-census churn
   --server URL` (address, client_id, connections a minute).
2. Look at one of its connections (kafka-census connections --client-id ID --state all): the
   requests it sent before closing and its close reason usually say what it does not accept.
3. Ask the client's owners to fix it, or cap it at the broker (connection creation rate quota,
   KIP-612) while they do.
"""

RUNBOOK_DECODE_RATIO = """\
What it means: more than 1% of decoded requests come with a decode error or a desync (lost frame
boundaries). Usual causes: packet loss in the capture (kernel drops, TCP gaps), non-Kafka or TLS
traffic on a port configured as a plaintext listener, or a client/broker protocol version newer
than kafka-census knows. The brokers are unaffected; the census is less complete.
What to do:
1. On the "kafka-census health" dashboard, see which kinds dominate (decode errors and desyncs by
   kind) and whether kernel drops or TCP gaps rise at the same time (then see the kernel drops
   runbook).
2. Check the --listener map: a port listed as PLAINTEXT that speaks TLS or another protocol
   desyncs on every connection; give it its real security protocol (e.g. SSL=9093:SSL).
3. Connections with problems show decode_errors/desyncs in GET /api/v1/connections; kinds such as
   unknown_api_key or unknown_api_version point at clients newer than kafka-census's API table:
   upgrade kafka-census.
"""

RUNBOOK_DOWN = """\
What it means: Prometheus cannot scrape this kafka-census target. While it is down, connection
counts, client versions and upgrade-readiness data for its broker are missing. Kafka itself is
not affected: kafka-census only observes.
What to do:
1. kubectl describe / logs of the pod's kafka-census container: a capture error (missing
   CAP_NET_RAW, unknown interface) is one "error:" line at start; the container exits 1.
2. Check /healthz and /readyz on the --http port, and that the Service/ServiceMonitor port and
   path (/metrics) match it.
"""

RUNBOOK_ABSENT = """\
What it means: no kafka-census series reaches Prometheus at all: every sidecar is gone, or the
scrape configuration (ServiceMonitor, job name) no longer selects them. Nothing watches client
versions or upgrade blockers meanwhile.
What to do:
1. Check that the sidecars run (kubectl get pods) and that Prometheus lists their targets
   (Status > Targets, a job whose name contains kafka-census).
2. If the ServiceMonitor or scrape job was renamed, the alerts select job=~".*kafka-census.*":
   keep "kafka-census" in the job name.
"""

SOFTWARE_GROUP = "kafka-census-client-versions"  # the chart may replace this group from its values


def _alert(name: str, expr: str, *, severity: str, summary: str, description: str, runbook: str,
           for_: str | None = None, labels: dict | None = None) -> dict:
    rule: dict = {"alert": name, "expr": expr}
    if for_:
        rule["for"] = for_
    rule["labels"] = {"severity": severity, **(labels or {})}
    rule["annotations"] = {"summary": summary, "description": description, "runbook": runbook}
    return rule


def minimum_version_expr(name: str, below_regex: str) -> str:
    """The rule expression for one software's minimum (the chart templates the same shape).
    max_over_time over 1h: a short-lived client (a batch job) still counts for an hour."""
    selector = f'kafka_census_connections{{client_software_name="{name}", client_software_version=~"{below_regex}"}}'
    return (f"max by (listener, {SOFTWARE}) (\n"
            f"  max_over_time({selector}[1h])\n"
            ") > 0")


def minimum_version_rules() -> list[dict]:
    return [_alert(
        "KafkaCensusClientBelowMinimumVersion", minimum_version_expr(name, below_version_regex(minimum)),
        # client_software_name repeats the series' own label: it keeps the rules distinct for
        # `promtool check rules` (same alert name and labels would be a duplicate)
        severity="warning", labels={"minimum_version": minimum, "client_software_name": name},
        summary=f"{{{{ $labels.client_software_name }}}} {{{{ $labels.client_software_version }}}} is below the "
                f"minimum version {minimum}",
        description=f"Clients running {{{{ $labels.client_software_name }}}} {{{{ $labels.client_software_version }}}} "
                    f"had up to {{{{ $value }}}} open connection(s) on listener {{{{ $labels.listener }}}} in the last "
                    f"hour; the minimum for {name} is {minimum}.",
        runbook=RUNBOOK_MINIMUM) for name, minimum, _why in MINIMUM_VERSIONS]


def alert_rules() -> dict:
    deprecated = "kafka_census_deprecated_requests_total"
    return {"groups": [
        {"name": "kafka-census-upgrade", "rules": [_alert(
            "KafkaCensusDeprecatedApiVersionsInUse",
            f"sum by (listener, {SOFTWARE}, api, api_version) (\n"
            f"  {recent_increase(deprecated, '1h')}\n"
            ") > 0",
            severity="warning",
            summary="{{ $labels.client_software_name }} {{ $labels.client_software_version }} uses "
                    "{{ $labels.api }} v{{ $labels.api_version }}, removed in Kafka 4.0",
            description="{{ $value | humanize }} {{ $labels.api }} v{{ $labels.api_version }} request(s) in the last "
                        "hour from {{ $labels.client_software_name }} {{ $labels.client_software_version }} on "
                        "listener {{ $labels.listener }}. Kafka 4.0 brokers reject this version (KIP-896).",
            runbook=RUNBOOK_DEPRECATED)]},
        {"name": SOFTWARE_GROUP, "rules": minimum_version_rules()},
        {"name": "kafka-census-casualties", "rules": [_alert(
            "KafkaCensusClientsRefusedByBroker",
            f"sum by (listener, {SOFTWARE}, api, api_version) (\n"
            f"  {recent_increase('kafka_census_unsupported_version_closes_total', '15m')}\n"
            ") > 0",
            severity="critical",
            summary="The broker refuses {{ $labels.api }} v{{ $labels.api_version }} from "
                    "{{ $labels.client_software_name }} {{ $labels.client_software_version }}",
            description="{{ $value | humanize }} connection(s) of {{ $labels.client_software_name }} "
                        "{{ $labels.client_software_version }} on listener {{ $labels.listener }} were closed by the "
                        "broker in the last 15 minutes at {{ $labels.api }} v{{ $labels.api_version }}, a version it "
                        "does not accept.",
            runbook=RUNBOOK_UNSUPPORTED_VERSION)]},
        {"name": "kafka-census-health", "rules": [
            _alert("KafkaCensusKernelDrops",
                   "sum by (job, instance, source) (increase(kafka_census_capture_kernel_dropped_total[5m])) > 0",
                   severity="warning",
                   summary="kafka-census on {{ $labels.instance }} is missing packets",
                   description="The kernel dropped {{ $value | humanize }} packet(s) of capture {{ $labels.source }} "
                               "on {{ $labels.instance }} in the last 5 minutes: connections, requests and client "
                               "identities may be missing from the census.",
                   runbook=RUNBOOK_KERNEL_DROPS),
            _alert("KafkaCensusDecodeErrorRatioHigh", problem_ratio("5m") + "\n> 0.01", for_="10m",
                   severity="warning",
                   summary="kafka-census on {{ $labels.instance }} cannot decode part of the Kafka traffic",
                   description="Decode errors and desyncs are {{ $value | humanizePercentage }} of the decoded "
                               "requests on {{ $labels.instance }} (over 1% for 10 minutes).",
                   runbook=RUNBOOK_DECODE_RATIO),
            _alert("KafkaCensusClientReconnectStorm",
                   "max by (job, instance) (kafka_census_churning_clients) > 0", for_="10m", severity="warning",
                   summary="A client reconnects in a loop on {{ $labels.instance }}",
                   description="{{ $value }} client(s) (client address and client_id) have opened connections at "
                               "or over the churn threshold on {{ $labels.instance }} for 10 minutes.",
                   runbook=RUNBOOK_RECONNECT_STORM),
            _alert("KafkaCensusExporterDown", f"up{{{JOB_SELECTOR}}} == 0", for_="5m", severity="warning",
                   summary="kafka-census target {{ $labels.instance }} is down",
                   description="Prometheus has failed to scrape {{ $labels.instance }} (job {{ $labels.job }}) "
                               "for 5 minutes.",
                   runbook=RUNBOOK_DOWN),
            _alert("KafkaCensusExporterAbsent", f"absent(kafka_census_build_info{{{JOB_SELECTOR}}})", for_="15m",
                   severity="warning",
                   summary="No kafka-census metrics reach Prometheus",
                   description="kafka_census_build_info has been absent for 15 minutes: no kafka-census target "
                               "is scraped.",
                   runbook=RUNBOOK_ABSENT),
        ]},
    ]}


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
    alerts = _yaml(alert_rules(), "# Generated by dashboards/generate.py; do not edit. Prometheus alert rules for "
                                  "kafka-census.\n")
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
