"""The defaults of the aggregator's bounds and intervals: one value each, and why it is that value.

Owns the DEFAULT_* of the `kafka-census aggregate` settings: exporter.cli.settings declares each
setting with one of these (flag, KAFKA_CENSUS_* variable, --config key, help), and the classes
that use them take them as their keyword defaults (exporter.aggregator.peers, .cache, .fanout,
.app), so a default is written once. The command's other settings (--http, --api-token-file,
--metrics-auth, --log-level) are the CLI's, shared.

Imports nothing: exporter.cli.settings imports it, and settings loads without FastAPI, uvicorn,
httpx or pydantic (tests/cli/test_settings.py), which the modules that use these values import.
"""

# --- the peers (exporter.aggregator.peers) ---------------------------------------------------

DEFAULT_PEERS_DNS_INTERVAL = 30.0  # seconds between lookups of --peers-dns
DEFAULT_MAX_PEERS = 100

# --- asking them (exporter.aggregator.fanout) -----------------------------------------------

DEFAULT_PEER_TIMEOUT = 5.0
DEFAULT_PEER_MAX_MB = 32
DEFAULT_PEER_CONCURRENCY = 16
# JSON values counted in one peer's answer as it is read (`,` `{` `[` outside strings, an upper
# bound on the values json would build). The sidecar's 10,000-row connections page (bench's
# synthetic rows, exporter.http.app's encoding) holds 668,555 (558,555 before issue 31 gave each
# connection its topics, groups and roles): 67 a row; x 4.5 headroom = 3M. A connection's topic
# uses add 8 items each. Its densest rows run 10-19 bytes an item, so a real answer reaches this only near
# --peer-max-mb; tiny hostile rows (`{},` 1.5 bytes an item) stop here after ~4 MB, before a
# parse that would cost up to 300 bytes an item.
DEFAULT_PEER_MAX_ITEMS = 3_000_000
# Large answers parsed and merged at once: the parse holds the GIL, so a second slot would hold a
# second parsed answer in memory without finishing sooner.
DEFAULT_PEER_PARSE_CONCURRENCY = 1

# --- the caches (exporter.aggregator.cache) -------------------------------------------------

DEFAULT_CACHE_SECONDS = 3.0
DEFAULT_CACHE_ENTRIES = 128
DEFAULT_CACHE_MAX_MB = 64  # a whole 10,000-row answer is ~11 MB
DEFAULT_PEER_FAILURE_SECONDS = 3.0  # as --cache-seconds: callers within it share one failure

# --- the probe (exporter.aggregator.app) ----------------------------------------------------

DEFAULT_PEER_PROBE_INTERVAL = 15.0
