"""Every `kafka-census` setting, declared once: its parser, its default and its help text.

Owns `SETTINGS` (dest -> `Setting`) of every command that has settings (capture, replay, proxy,
aggregate and the incident CLI), the value parsers, the help text of each setting's flag
(`Setting.help_text`, the default always from the declaration), reading a `--config` YAML
file (`load_config`) and the precedence flag > KAFKA_CENSUS_* environment > YAML > default in
one function (`resolve`, which also says where each value came from). A setting is a flag, a
`KAFKA_CENSUS_<DEST>` variable and a `<dest-with-dashes>:` YAML key, all parsed by one parser:
YAML's `true` is not an integer and `2.5` not a count.

Each default is imported from the module that owns it (the registry's table bounds from
exporter.census.registry, the sibling window from exporter.census.basis, the flow table's from
capture.flows, the decoders' buffer budget from capture.buffer_budget, the proxy's from
capture.proxy, ...); tests/cli/test_settings.py checks every one against its owner. Only the CLI's
own settings (--http, --log-level, ...) are declared here with their values. This module is part of the CLI, the
composition root (exporter/cli/): it may import capture. It must
not import the commands, exporter.cli.main, FastAPI or uvicorn; the modules it takes defaults
from (exporter.incident.client) import nothing of the CLI: no import ring.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from capture import buffer_budget as _buffer_budget
from capture import flows as _flows
from capture import proxy as _proxy
from capture.listeners import DEFAULT_LISTENER
from capture.sources import LiveCapture
from exporter.aggregator import defaults as _aggregator
from exporter.census import basis as _basis
from exporter.census import churn as _churn
from exporter.census import registry as _registry
from exporter.census import topickeys as _topickeys
from exporter.eventlog import rollup as _rollup
from exporter.eventlog import writer as _eventlog
from exporter.http import bounds as _httpbounds
from exporter.incident import client as _incident
from exporter.service import state as _state

ENV_PREFIX = "KAFKA_CENSUS_"


class SettingError(ValueError):
    """A bad setting value or --config file; the message names it (the CLI exits 2)."""


# --- value parsers: what argparse, the environment or yaml.safe_load gives -> the value ---------

def parse_csv(value) -> list[str]:
    """A YAML list, or "a, b,c" from a flag or a variable."""
    if isinstance(value, list):
        return [str(v) for v in value]
    return [v.strip() for v in str(value).split(",") if v.strip()]


def parse_int(value) -> int:
    """An integer from a flag, a variable or YAML; YAML's true or 2.5 are not integers."""
    if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
        raise ValueError(value)
    return int(value)


def parse_float(value) -> float:
    if isinstance(value, bool):
        raise ValueError(value)
    return float(value)


def parse_str(value) -> str:
    if not isinstance(value, (str, int)) or isinstance(value, bool):
        raise ValueError(value)
    return str(value)


def parse_bool(value) -> bool:
    """YAML's true/false; from a variable true/false, yes/no, on/off or 1/0."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        word = value.strip().lower()
        if word in ("true", "yes", "on", "1"):
            return True
        if word in ("false", "no", "off", "0"):
            return False
    raise ValueError(value)


def parse_positive_float(value) -> float:
    number = parse_float(value)
    if not number > 0 or number == float("inf"):
        raise ValueError(value)
    return number


def parse_positive_int(value) -> int:
    number = parse_int(value)
    if number < 1:
        raise ValueError(value)
    return number


def choice(*choices: str) -> Callable[[Any], str]:
    """A parser of one of `choices`, case-insensitive (argparse's `choices` for the flag)."""
    def parse(value) -> str:
        word = parse_str(value).strip().lower()
        if word not in choices:
            raise ValueError(value)
        return word
    parse.choices = choices  # type: ignore[attr-defined]
    return parse


LOG_LEVELS = ("debug", "info", "warning", "error")


# --- the declaration ------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Setting:
    """One setting. `help` is what the flag's --help says; `{default}` in it stands for the
    default as `default_text()` gives it, and without it " (default X)" is appended (nothing
    for a default of None or an empty list). `shown` overrides how the default is written; ""
    hides it (a switch that is simply off unless given)."""

    dest: str
    parse: Callable[[Any], Any]
    default: Any
    help: str
    shown: str | None = None
    flags: tuple[str, ...] = ()  # the flag's names, when not `--dest-with-dashes`

    @property
    def flag(self) -> str:
        return self.flags[0] if self.flags else "--" + self.dest.replace("_", "-")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.dest.upper()

    @property
    def key(self) -> str:
        """The --config YAML key."""
        return self.dest.replace("_", "-")

    def default_text(self) -> str | None:
        """The default as help shows it, or None when there is none to show."""
        if self.shown is not None:
            return self.shown or None  # "": nothing to show (a switch that is off unless given)
        value = self.default
        if value is None:
            return None
        if isinstance(value, bool):
            return "on" if value else "off"
        if isinstance(value, float):
            return f"{value:g}"
        if isinstance(value, list):
            return ",".join(value) if value else None
        return str(value)

    def help_text(self, help: str | None = None) -> str:
        """`help` (a command's own wording of this setting; else the declared one) with the
        default from the declaration. Every `%` is escaped: argparse formats help with it."""
        text = self.help if help is None else help
        shown = self.default_text()
        if "{default}" in text:
            if shown is None:
                raise AssertionError(f"{self.dest}: help names a default it does not have")
            text = text.replace("{default}", shown)
        elif shown is not None:
            text += f" (default {shown})"
        return text.replace("%", "%%")


def keyword_default(func, name: str):
    """The default of keyword `name` of `func`: where an owner keeps its default only there."""
    return inspect.signature(func).parameters[name].default


_MiB = 1 << 20
_S = Setting
_CLI_SETTINGS = (
    # serving (every command that serves)
    _S("http", parse_str, None, "serve /metrics and the REST API here, e.g. 127.0.0.1:9100; every interface must "
       "be written out: 0.0.0.0:9100 or [::]:9100"),
    _S("api_token_file", parse_str, None, "the REST API (/api/v1) requires 'Authorization: Bearer TOKEN' "
       "with the token in FILE (re-read on SIGHUP); /healthz, /readyz, /docs, /openapi.json and the page "
       "at / stay open"),
    _S("metrics_auth", parse_bool, False, "/metrics requires the token too (default {default}: open, for Prometheus "
       "scrapes without credentials; its series count software versions, never hosts or principals)"),
    _S("log_level", choice(*LOG_LEVELS), "info", "what the log on stderr shows"),
    # the HTTP side's bounds (exporter.http.bounds; docs/hardening.md)
    _S("http_max_connections", parse_int, _httpbounds.DEFAULT_HTTP_MAX_CONNECTIONS, "HTTP connections held open; "
       "past it the one waiting longest for a request is closed (a probe always gets in), or the new one when every "
       "one is inside a request; taken from the open-files limit before the proxy's share"),
    _S("http_header_timeout", parse_float, _httpbounds.DEFAULT_HTTP_HEADER_TIMEOUT, "close an HTTP connection that "
       "has not sent a whole request head this long after connecting (or after its first byte following an idle "
       "spell)"),
    _S("http_idle_timeout", parse_float, _httpbounds.DEFAULT_HTTP_IDLE_TIMEOUT, "close a keep-alive HTTP connection "
       "idle this long between requests, and one that reads nothing of its answer this long"),
    _S("http_max_requests", parse_int, _httpbounds.DEFAULT_HTTP_MAX_REQUESTS, "API requests served at once; one "
       "more is answered 503 with Retry-After (/healthz and /readyz never count, /metrics has its own)"),
    _S("http_max_scrapes", parse_int, _httpbounds.DEFAULT_HTTP_MAX_SCRAPES, "/metrics requests served at once; one "
       "more is answered 503 with Retry-After"),
    _S("http_max_response_mb", parse_int, _httpbounds.DEFAULT_HTTP_MAX_RESPONSE_MB, "a response's size; a listing "
       "past it is cut, said in its 'cut' field and the X-Kafka-Census-Cut header (all at once: (--http-max-requests "
       "+ --http-max-scrapes) x this)"),
    _S("http_cpu_share", parse_float, _httpbounds.DEFAULT_HTTP_CPU_SHARE, "the part of the wall clock that building "
       "API answers and scrapes may take, all together, so that the capture or the proxy always gets Python's "
       "interpreter lock (1: no pacing)"),
    _S("compat_metrics", parse_csv, [], "also emit the broker's KIP-511 gauge under these projects' jmx_exporter "
       "names"),
    # the registry's bounds
    _S("max_series", parse_int, _registry.DEFAULT_MAX_SERIES, "label sets the metrics may hold (a histogram's "
       "count 18); past it new ones fold into 'other', counted in kafka_census_series_folded_total"),
    _S("max_brokers", parse_int, _registry.DEFAULT_MAX_BROKERS, "brokers (listener:port) whose ApiVersions "
       "answers are kept"),
    _S("max_software_labels", parse_int, _registry.DEFAULT_MAX_SOFTWARE_LABELS, "distinct client software "
       "name/version label pairs; later ones are 'other'"),
    _S("max_census_rows", parse_int, _registry.DEFAULT_MAX_CENSUS_ROWS, "rows of the client census (software, "
       "client_id, principal, listener); closed connections of a new row past it are counted in census_overflow, "
       "not listed"),
    _S("max_fingerprints_per_second", parse_int, _registry.DEFAULT_MAX_FINGERPRINTS_PER_SECOND, "fingerprint "
       "inferences of unannounced connections per second (replay: per second of the file's time); past it a "
       "connection is tried again later, counted in kafka_census_fingerprint_skipped_total{reason=\"budget\"}"),
    _S("churn_threshold_per_minute", parse_float, _churn.DEFAULT_CHURN_THRESHOLD_PER_MINUTE, "a client (client "
       "address and client_id) opening this many connections a minute or more is listed as churning (GET "
       "/api/v1/churn, the incident page, kafka_census_churning_clients): a reconnect loop"),
    _S("max_churn_clients", parse_int, _churn.DEFAULT_MAX_CHURN_CLIENTS, "clients (client address and client_id) "
       "whose connection rate is tracked; past it the least recently seen is forgotten, counted in "
       "kafka_census_churn_clients_evicted_total"),
    _S("max_connections", parse_int, _registry.DEFAULT_MAX_OPEN, "bound of the live connection table (the proxy: "
       "of its connections too, within the open-files limit)"),
    _S("max_closed_connections", parse_int, _registry.DEFAULT_MAX_CLOSED, "recently closed connections kept for "
       "the REST API; the oldest go first"),
    _S("closed_ttl", parse_float, _registry.DEFAULT_CLOSED_TTL, "how long a closed connection stays listed"),
    # topics, groups and transactional ids (issue 31: exporter/census/topics.py; docs/hardening.md)
    _S("topics", parse_bool, True, "decode the topics, consumer groups and transactional ids each connection names "
       "(GET /api/v1/topics, the connections' topics); --no-topics: the decoder reads no request body for them"),
    _S("max_topics_per_connection", parse_int, _topickeys.DEFAULT_MAX_TOPICS_PER_CONNECTION, "(use, topic) entries "
       "a connection keeps, and the decoder lists per frame; past it counted in its topics_dropped and "
       "kafka_census_topics_dropped_total"),
    _S("max_topics", parse_int, _topickeys.DEFAULT_MAX_TOPICS, "distinct topics the open and recently closed "
       "connections may name; a new one past it is kept under the topic \"<other>\", counted in "
       "kafka_census_topics_overflow_total"),
    _S("max_topic_ids", parse_int, _topickeys.DEFAULT_MAX_TOPIC_IDS, "topic ids mapped to names from the Metadata "
       "answers seen (Fetch and Produce v13+ name topics by id); past it the least recently named is forgotten, "
       "counted in kafka_census_topic_ids_evicted_total"),
    _S("max_topic_entries", parse_int, _topickeys.DEFAULT_MAX_TOPIC_ENTRIES, "(use, topic) entries all the open "
       "and recently closed connections keep together (about 200 bytes each); past it a new one is counted in "
       "kafka_census_topics_dropped_total{reason=\"total\"}"),
    _S("topic_metrics", parse_bool, False, "also serve kafka_census_topic_clients{topic,role} and "
       "kafka_census_topic_bytes_total{topic,use,software}: a label set per topic, within --max-series (default "
       "{default}: a cluster of many topics would fill the budget)"),
    _S("sibling_window", parse_float, _basis.DEFAULT_SIBLING_WINDOW, "a connection that announced its software "
       "names the unannounced connections of the same client address and client_id for this long after it was "
       "last seen"),
    # the event log
    _S("event_log", parse_str, None, "write every event as NDJSON here (the pipeline's input)"),
    _S("event_log_max_mb", parse_int, _eventlog.DEFAULT_MAX_BYTES // _MiB, "rotate event log files at this size"),
    _S("event_log_max_age", parse_float, _eventlog.DEFAULT_MAX_AGE_SECONDS, "rotate event log files at this age"),
    _S("event_log_max_total_mb", parse_int, _eventlog.DEFAULT_MAX_TOTAL_BYTES // _MiB, "delete this log's oldest "
       "finished files so that its files, counting the one being written at --event-log-max-mb, stay within this "
       "total (default {default}; at least --event-log-max-mb)"),
    _S("event_log_queue_mb", parse_int, _eventlog.DEFAULT_QUEUE_BYTES // _MiB, "events waiting for the event "
       "log's writer thread; past this they are dropped and counted "
       "(kafka_census_event_log_dropped_total{reason=\"queue_full\"}), the capture never waits"),
    _S("event_log_rollup_seconds", parse_float, _rollup.DEFAULT_INTERVAL, "request traffic goes to the event log "
       "as one record per connection with its counts, bytes and latency per (api, version) since the last: at "
       f"close and this often (default {{default}}, 1 to {_eventlog.MAX_ROLLUP_SECONDS:g}; a crash loses at most "
       "this long of counts)"),
    # capture and replay
    _S("interface", parse_str, None, "interface: lo, eth0, any...", flags=("--interface", "-i")),
    _S("listener", parse_csv, [DEFAULT_LISTENER], "a broker listener port (repeatable; default {default})"),
    _S("idle_timeout", parse_float, _flows.DEFAULT_IDLE_TIMEOUT, "close a connection silent this long (default "
       "{default}: the broker's 10 min idle close + 1)"),
    _S("max_flows", parse_int, _flows.DEFAULT_MAX_FLOWS, "bound of the TCP flow table"),
    _S("max_buffer_mb", parse_int, _buffer_budget.DEFAULT_MAX_BUFFER_BYTES // _MiB, "one budget for the decoder "
       "buffers, requests awaiting answers and held out-of-order segments of all connections; past it the largest are "
       "dropped and counted (drops reason buffer_budget)"),
    _S("buffer_mb", parse_int, keyword_default(LiveCapture.__init__, "buffer_mb"), "kernel capture buffer "
       "(default {default} MiB)"),
    _S("state_file", parse_str, None, "keep open connections' identities here across restarts (with --http): "
       "saved every --state-interval and on shutdown, restored to connections joined mid-stream"),
    _S("state_interval", parse_float, _state.DEFAULT_INTERVAL, "how often to save --state-file"),
    # proxy
    _S("listen", parse_csv, [], "where clients connect, one per broker (repeatable; pairs with --upstream in order)"),
    _S("upstream", parse_csv, [], "the broker behind the --listen of the same position (make the broker advertise "
       "the --listen address)"),
    _S("proxy_listener", parse_csv, ["PLAINTEXT"], "the listener the connections are counted under (once for all, "
       "or once per --listen; default {default})", flags=("--listener",)),
    _S("tls_cert", parse_str, None, "terminate TLS from clients with this certificate chain (the broker's, for its "
       "advertised name)"),
    _S("tls_key", parse_str, None, "the private key of --tls-cert"),
    _S("tls_client_ca", parse_str, None, "require client certificates signed by these CAs; the subject becomes the "
       "connection's principal"),
    _S("upstream_tls", parse_bool, False, "connect to the broker with TLS (its certificate must name the "
       "--upstream host)", shown=""),
    _S("upstream_ca", parse_str, None, "CAs that sign the broker's certificate (default: the system's)"),
    _S("connect_timeout", parse_float, _proxy.DEFAULT_CONNECT_TIMEOUT, "give up connecting to the broker after "
       "this long"),
    _S("event_loop", choice(*_proxy.EVENT_LOOPS), _proxy.DEFAULT_EVENT_LOOP, "the proxy's asyncio loop: auto is "
       "uvloop when it can be imported (less CPU per request), else asyncio's own; the log says which runs"),
)

_AGGREGATE_SETTINGS = (
    _S("peers", parse_csv, [], "peers: http://HOST:PORT (or HOST:PORT), comma-separated or repeated"),
    _S("peers_dns", parse_str, None, "peers: every A/AAAA address of NAME (a headless Service), on PORT, "
       "re-resolved every --peers-dns-interval"),
    _S("peers_dns_interval", parse_float, _aggregator.DEFAULT_PEERS_DNS_INTERVAL, "how often --peers-dns is "
       "resolved again; a failed lookup keeps the last peers"),
    _S("max_peers", parse_int, _aggregator.DEFAULT_MAX_PEERS, "at most this many peers; DNS addresses beyond are "
       "not asked and every answer is partial, naming them"),
    _S("peer_token_file", parse_str, None, "bearer token sent to the peers (their --api-token-file), re-read on "
       "SIGHUP"),
    _S("peer_timeout", parse_float, _aggregator.DEFAULT_PEER_TIMEOUT, "a peer that has not answered whole within "
       "this is missing (kind timeout)"),
    _S("peer_max_mb", parse_int, _aggregator.DEFAULT_PEER_MAX_MB, "bytes read from one peer's answer; beyond, the "
       "answer is dropped (kind too_large) and the bytes counted"),
    _S("peer_max_items", parse_int, _aggregator.DEFAULT_PEER_MAX_ITEMS, "JSON values in one peer's answer, counted "
       "as its bytes arrive (a 10,000-row connections page holds ~670,000); beyond, the answer is dropped before "
       "it is parsed (kind too_large) and counted"),
    _S("peer_concurrency", parse_int, _aggregator.DEFAULT_PEER_CONCURRENCY, "peers asked at once; the answers being "
       "read hold at most N x --peer-max-mb"),
    _S("peer_parse_concurrency", parse_int, _aggregator.DEFAULT_PEER_PARSE_CONCURRENCY, "large peer answers "
       "(over 64 KiB) parsed and merged at once; each may hold 8 x --peer-max-mb + 300 bytes x --peer-max-items "
       "(parsing holds Python's interpreter lock: more only hold more)"),
    _S("peer_failure_seconds", parse_float, _aggregator.DEFAULT_PEER_FAILURE_SECONDS, "a peer that failed is not "
       "asked again for this long: callers get its failure, marked cached (connect, timeout, unauthorized: for "
       "the peer; too_large, invalid, http_status: for that query); 0: always ask"),
    _S("peer_probe_interval", parse_float, _aggregator.DEFAULT_PEER_PROBE_INTERVAL, "ask every peer this often "
       "even without callers, so peer_up stays current; 0: never"),
    _S("cache_seconds", parse_float, _aggregator.DEFAULT_CACHE_SECONDS, "reuse a whole answer for this long "
       "(partial ones never); 0: no cache"),
    _S("cache_entries", parse_int, _aggregator.DEFAULT_CACHE_ENTRIES, "answers cached at most, and peer failures "
       "cached at most"),
    _S("cache_max_mb", parse_int, _aggregator.DEFAULT_CACHE_MAX_MB, "bytes of the answers cached at most; the "
       "oldest go first, and a larger answer is not cached"),
    _S("allow_unauthenticated", parse_bool, False, "serve without --api-token-file (client ids, addresses and "
       "principals of the whole cluster to anyone who reaches --http); without either the command refuses to "
       "start", shown=""),
)

_INCIDENT_SETTINGS = (
    _S("server", parse_str, _incident.DEFAULT_SERVER, "a kafka-census sidecar or aggregator (default: "
       f"{ENV_PREFIX}SERVER, else {{default}}; in a cluster `kubectl port-forward svc/NAME 9100:9595`, the "
       "chart's port)"),
    _S("token_file", parse_str, None, "the bearer token of the server's --api-token-file (default: "
       f"{ENV_PREFIX}TOKEN_FILE); never shown in any message"),
    _S("timeout", parse_positive_float, _incident.DEFAULT_TIMEOUT, "give up on a server silent this long: exit 3"),
    _S("max_response_mb", parse_positive_int, _incident.DEFAULT_MAX_RESPONSE_MB, "read at most this much of an "
       "answer; a larger one is exit 1"),
)
del _S


def _table(*groups: Iterable[Setting]) -> dict[str, Setting]:
    table: dict[str, Setting] = {}
    for group in groups:
        for setting in group:
            # One name, one meaning: a command sharing a setting shares its declaration.
            assert setting.dest not in table, f"setting {setting.dest} is declared twice"
            table[setting.dest] = setting
    return table


#: dest -> Setting, of every command. A command has the settings its parser has dests for.
SETTINGS: dict[str, Setting] = _table(_CLI_SETTINGS, _AGGREGATE_SETTINGS, _INCIDENT_SETTINGS)


def help_text(dest: str, help: str | None = None) -> str:
    """The help of `dest`'s flag: `SETTINGS[dest].help_text(help)`."""
    return SETTINGS[dest].help_text(help)


def config_help() -> str:
    return (f"YAML file of settings (keys: the long flags); flags win over {ENV_PREFIX}* environment variables, "
            "which win over the file")


# --- sources and precedence -----------------------------------------------------------------

FLAG, ENVIRONMENT, CONFIG, DEFAULT = "flag", "environment", "config", "default"


def load_config(path: str) -> dict[str, Any]:
    """The settings of a --config YAML file, by dest; SettingError for a file that cannot be
    read, is not YAML, not a mapping, or names a setting no command has."""
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except OSError as exc:
        raise SettingError(f"--config {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise SettingError(f"--config {path}: not UTF-8 text") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise SettingError(f"--config {path}:{where} not valid YAML") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SettingError(f"--config {path}: expected a mapping of settings")
    out = {}
    for key, value in data.items():
        dest = str(key).replace("-", "_")
        if dest not in SETTINGS:
            raise SettingError(f"--config {path}: unknown setting {key!r}; known: "
                               + ", ".join(s.key for s in SETTINGS.values()))
        out[dest] = value
    return out


def resolve(dests: Iterable[str], flags: Mapping[str, Any], environ: Mapping[str, str],
            config: Mapping[str, Any]) -> dict[str, tuple[Any, str]]:
    """The one precedence rule: for each of `dests`, (value, origin) from the first of
    the flag (`flags[dest]`, None when not given; argparse already parsed it), the
    KAFKA_CENSUS_<DEST> variable in `environ`, `config` (load_config's) and the declared
    default. Origin is FLAG, ENVIRONMENT, CONFIG or DEFAULT, so that a caller can tell an
    explicit value from the default even when they are equal. A bad variable or YAML value
    is SettingError naming where it came from."""
    out: dict[str, tuple[Any, str]] = {}
    for dest in dests:
        setting = SETTINGS[dest]
        given = flags.get(dest)
        if given is not None:
            out[dest] = (given, FLAG)
            continue
        raw = environ.get(setting.env)
        if raw is not None:
            origin, where = ENVIRONMENT, setting.env
        elif dest in config:
            origin, where, raw = CONFIG, f"{setting.key} in --config", config[dest]
        else:
            default = setting.default
            out[dest] = (list(default) if isinstance(default, list) else default, DEFAULT)
            continue
        try:
            out[dest] = (setting.parse(raw), origin)
        except (TypeError, ValueError):
            raise SettingError(f"{where}: bad value {raw!r}") from None
    return out


# --- the reference ----------------------------------------------------------------------------

def reference() -> str:
    """Every setting as a Markdown table (flag, variable, YAML key, default, meaning), from the
    declaration: what docs/ shows (`python -m exporter.cli.settings` prints it)."""
    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    rows = ["| flag | environment | YAML key | default | meaning |", "|---|---|---|---|---|"]
    for s in SETTINGS.values():
        meaning = (s.help_text() if "{default}" in s.help else s.help).replace("%%", "%")
        rows.append(f"| `{s.flag}` | `{s.env}` | `{s.key}` | {cell(s.default_text() or '-')} | {cell(meaning)} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(reference(), end="")
