"""kafka-census's Prometheus alert rules (dashboards/alerts.yaml, written by dashboards/generate.py):
each alert with its summary, description and runbook, and one KafkaCensusClientBelowMinimumVersion
rule per entry of the minimum-version table (generate.py's `MINIMUM_VERSIONS`, passed in).

Owns the runbooks (`RUNBOOK_*`), the groups and their rules (`alert_rules`), the shape of a
minimum-version rule (`minimum_version_expr`, which the Helm chart templates the same way) and
the name of its group (`SOFTWARE_GROUP`, which the chart may replace). Imports the standard
library and dashboards/panels.py (its PromQL helpers and `below_version_regex`).
"""

from __future__ import annotations

from dashboards.panels import JOB_SELECTOR, SOFTWARE, below_version_regex, problem_ratio, recent_increase

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


def minimum_version_rules(minimums: tuple[tuple[str, str, str], ...]) -> list[dict]:
    """One rule per (software name, minimum, why) of `minimums`."""
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
        runbook=RUNBOOK_MINIMUM) for name, minimum, _why in minimums]


def alert_rules(minimums: tuple[tuple[str, str, str], ...]) -> dict:
    """Every group of alerts.yaml; `minimums` as in minimum_version_rules."""
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
        {"name": SOFTWARE_GROUP, "rules": minimum_version_rules(minimums)},
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
