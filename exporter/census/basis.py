"""The identity basis: what an unannounced connection's identity is inferred from, and its constants.

Owns the rule of a connection's first requests (`MAX_FIRST_REQUESTS` and
`fold_first_requests`: pairs of the generated API table, `CANONICAL_PAIR`, first seen between
two sync points, folded in key order at the next one, `BASIS_SYNC`), `FingerprintBasis` (the
event that carries them from an event log back into a registry) and the constants of an inferred identity: the
sibling window (`DEFAULT_SIBLING_WINDOW`), an announced sibling's confidence
(`SIBLING_CONFIDENCE`) and the fingerprint's bar (`FINGERPRINT_THRESHOLD`).

Written once, here, for everything that infers or records identity: the registry
(exporter/census/registry.py and its identity resolver, exporter/census/identity.py), the
fingerprint (exporter/census/fingerprint.py), the event log's rollup (exporter/eventlog/rollup.py,
which keeps each connection's basis as the registry folds it) and the pipeline
(pipeline/identity.py). Imports only `capture.events` (the event contract), the generated API
table (`capture.kafka.api_table`, reference data) and the standard library: an event log writer
and a Spark executor load nothing else of the census for it (never the fingerprint table, never
the registry).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from capture.events import (
    ApiVersionsAnswer,
    ClientSoftware,
    ConnectionClosed,
    DecodeError,
    Desync,
    Event,
    SaslHandshake,
    SaslIdentity,
    TlsDetected,
)
from capture.kafka.api_table import API_TABLE

# A connection's first requests: the first MAX_FIRST_REQUESTS distinct (api_key, api_version)
# pairs of the generated API table it sent, in wire order as far as a tally lets it be known
# (ConnectionRecord.first_requests; the fingerprint reads them with the version of its first
# ApiVersions request).
MAX_FIRST_REQUESTS = 8
# Every (api_key, api_version) pair of the generated API table -> one tuple of it, shared: the
# registry's first_requests and the rollup's bases hold references, not tuples of their own; a
# pair outside the table is not a key (the pipeline's test of a pair).
CANONICAL_PAIR: dict[tuple[int, ...], tuple[int, int]] = {
    pair: pair for pair in ((s.key, v) for s in API_TABLE.values() for v in range(s.min_version, s.max_version + 1))}
# The events at which the pairs first seen since the previous one are folded into the first
# requests (sync points): every connection event but requests, responses, acks and traffic
# sweeps. Tally mode hands a connection's run over just before each of them
# (capture/kafka/connection.py), so at a sync point the requests are the same in both modes.
BASIS_SYNC = frozenset({ClientSoftware, ApiVersionsAnswer, SaslHandshake, SaslIdentity, TlsDetected, DecodeError,
                        Desync, ConnectionClosed})
# Seconds after its last packet that an announced connection still names the unannounced
# connections of its client address and client_id (identity_source "sibling"); an open one
# always does. Clients open their extra connections (kafkajs's fetch ones) seconds apart. Also
# how long a client (the connections judged together) outlives its last connection.
DEFAULT_SIBLING_WINDOW = 300.0
# The confidence of an announced sibling's identity: not 1, behind a NAT another process may
# share the address and the client_id.
SIBLING_CONFIDENCE = 0.9
# A fingerprint's confidence below this names no one (exporter.census.fingerprint.assess).
FINGERPRINT_THRESHOLD = 0.75


def fold_first_requests(first: tuple, pending: Iterable) -> tuple:
    """The first requests after a sync point: `first`, then the pairs of `pending` (seen since
    the previous sync point, each a pair of the API table) it does not hold yet, in key order,
    at most MAX_FIRST_REQUESTS in all. `first` itself (the same object) when nothing is added."""
    if len(first) >= MAX_FIRST_REQUESTS:
        return first
    new = sorted(k for k in pending if k not in first)
    return (first + tuple(new))[:MAX_FIRST_REQUESTS] if new else first


@dataclass(frozen=True, slots=True, kw_only=True)
class FingerprintBasis(Event):
    """A connection's fingerprint basis as the event log recorded it (fields `first_requests` and
    `api_versions_request_version` of a ConnectionRollup record; the event log's reader gives it
    back): what a registry rebuilt from a schema 2 log takes as the connection's own, since the
    rollups it reads lost the order of the requests. Never produced by a capture."""

    first_requests: tuple[tuple[int, int], ...]
    api_versions_request_version: int | None
