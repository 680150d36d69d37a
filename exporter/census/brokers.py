"""The brokers as their ApiVersions answers describe them: API ranges, features, and what each refuses.

Owns `BrokerTable`: per broker ("LISTENER:PORT", never an address the wire names: at most the
configured listener ports of a capture or the routes of a proxy, and never more than
`max_brokers`) its announced API ranges and KIP-584 features (REST GET /api/v1/brokers and the
broker gauges), its maximum version per API (`maxima`: what the fingerprint compares a client's
versions with) and the request versions it closes a connection on (`refuses`, issue 27). A broker
past the bound, an API key the generated table does not know and a feature with a bad name or
past MAX_BROKER_FEATURES are not kept, and counted (`drops`, by BROKER_DROPS).

Imports only `capture.events` (the event contract), the generated API table and
`exporter.census.record` (`iso_time`); called under the registry's lock
(exporter/census/registry.py), never imports it.
"""

from __future__ import annotations

import re
from collections import Counter

from capture.events import ApiVersionsAnswer
from capture.kafka.api_table import API_TABLE, REMOVED_IN_KAFKA4
from exporter.census.record import API_VERSIONS, iso_time

MAX_BROKER_FEATURES = 32  # KIP-584 features per broker (Kafka 4.1 announces 7)
BROKER_DROPS = ("broker", "api", "feature")
_FEATURE = re.compile(r"[A-Za-z0-9._-]{1,64}")  # KIP-584 names, e.g. "metadata.version"


def refused_by(ranges: dict[int, tuple[int, int]]) -> frozenset[tuple[int, int]]:
    """The table's request versions a broker with these ApiVersions ranges closes the connection
    on: outside its range, of an API it does not list, and, once it enforces KIP-896 (it
    advertises a floor above some removed version, as every 4.x broker does for Fetch), the
    removed versions it still advertises (Kafka 4.x lists Produce from v0 but closes on v0-2).
    Never ApiVersions: a broker answers every version of it."""
    kip896 = any(ranges[k][0] > max(vs) for k, vs in REMOVED_IN_KAFKA4.items() if k in ranges)
    out: set[tuple[int, int]] = set()
    for key, spec in API_TABLE.items():
        if key == API_VERSIONS:
            continue
        lo, hi = ranges.get(key, (1, 0))  # not listed: every version refused
        removed = REMOVED_IN_KAFKA4.get(key, ()) if kip896 else ()
        out.update((key, v) for v in range(spec.min_version, spec.max_version + 1)
                   if not lo <= v <= hi or v in removed)
    return frozenset(out)


class BrokerTable:
    """The brokers' last accepted ApiVersions answers (see the module doc). `entries` maps a
    broker to its REST entry, replaced whole, never mutated (readers may hold the old one)."""

    def __init__(self, max_brokers: int) -> None:
        self.max_brokers = max_brokers
        self.drops: Counter[str] = Counter(dict.fromkeys(BROKER_DROPS, 0))
        self.entries: dict[str, dict] = {}
        self._keys: dict[str, tuple | None] = {}  # broker -> the answer its entry was built from
        self._seen: dict[str, float] = {}
        self.maxima: dict[str, dict[int, int]] = {}  # broker -> api_key -> max version (the fingerprint's)
        # broker -> the request_key()s it refuses (`refused_by`): a connection it closes with one of
        # them unanswered closes as unsupported_version.
        self.refuses: dict[str, frozenset[tuple[int, int]]] = {}

    def answer(self, listener: str, port: int, ev: ApiVersionsAnswer) -> None:
        """An accepted ApiVersions answer on a connection of `listener` to `port`."""
        # The listener's port, not the address: a capture sees packets to any address on a
        # listener port (spoofed ones too), while the ports are configuration.
        broker = f"{listener}:{port}"
        known = self.entries.get(broker)
        if known is None and len(self.entries) >= self.max_brokers:
            self.drops["broker"] += 1
            return
        # Every connection brings the same answer: rebuilding ~75 dicts for it costs more than all
        # the connection's other events together. Unchanged: only refresh seen_at (once a second).
        key = (listener, ev.api_ranges, ev.supported_features, ev.finalized_features, ev.finalized_features_epoch)
        if known is not None and self._keys.get(broker) == key:
            if ev.ts - self._seen.get(broker, 0.0) >= 1.0:
                self._seen[broker] = ev.ts
                self.entries[broker] = {**known, "seen_at": iso_time(ev.ts)}  # readers may hold the old one
            return
        # A real answer lists each table key once and a few features; a huge one is not kept as a key.
        sane = len(ev.api_ranges) <= 2 * len(API_TABLE) and len(ev.supported_features) <= MAX_BROKER_FEATURES \
            and len(ev.finalized_features) <= MAX_BROKER_FEATURES
        self._keys[broker] = key if sane else None
        self._seen[broker] = ev.ts
        ranges: dict[int, tuple[int, int]] = {}
        for k, lo, hi in ev.api_ranges:
            if k in API_TABLE:
                ranges[k] = (lo, hi)
            else:  # a key the table does not know has no name to export
                self.drops["api"] += 1
        finalized = {name: (lo, hi) for name, lo, hi in ev.finalized_features[:MAX_BROKER_FEATURES]}
        features: dict[str, tuple[int, int]] = {}
        for name, lo, hi in ev.supported_features:
            if len(features) < MAX_BROKER_FEATURES and _FEATURE.fullmatch(name) and name not in features:
                features[name] = (lo, hi)
            else:
                self.drops["feature"] += 1
        self.maxima[broker] = {k: hi for k, (_, hi) in ranges.items()}
        self.refuses[broker] = refused_by(ranges)
        self.entries[broker] = {
            "broker": broker, "listener": listener, "seen_at": iso_time(ev.ts),
            "api_ranges": [{"api_key": k, "api": API_TABLE[k].name, "min_version": lo, "max_version": hi}
                           for k, (lo, hi) in sorted(ranges.items())],
            "features": [{"name": name, "min_version": lo, "max_version": hi,
                          "finalized_min_level": finalized.get(name, (None, None))[0],
                          "finalized_max_level": finalized.get(name, (None, None))[1]}
                         for name, (lo, hi) in features.items()],
            "finalized_features_epoch": ev.finalized_features_epoch,
        }

    def listing(self) -> list[dict]:
        """GET /api/v1/brokers: every entry (a copy), by broker."""
        return [dict(b, api_ranges=[dict(r) for r in b["api_ranges"]], features=[dict(f) for f in b["features"]])
                for _, b in sorted(self.entries.items())]
