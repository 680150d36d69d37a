"""Who the connections that announce no software are (issues 15, 26 and 28): the identity resolver.

Owns `IdentityResolver`, called by the registry (exporter/census/registry.py) under its lock at
each sync point of a connection (`at_sync_point`: the events of exporter.census.basis.BASIS_SYNC
and the traffic sweeps), when one announces its software (`announce`) and at its close
(`connection_closed`). It keeps identity apart from the KIP-511 fields, in the record's `inferred`
(an `InferredIdentity`; REST `inferred_software`) and its own gauge (`inferred_gauge`):

- "sibling": the software a connection of the same client address and client_id announced
  (`announced`, open, or seen within `sibling_window` seconds before this one opened);
- else "fingerprint": exporter.census.fingerprint.assess() on what its client sent. A client
  (`record.ClientRecord`, the table `clients`) is the connections of one client address,
  client_id and principal (once settled) within `sibling_window`; each folds the versions it sent into the
  client's bounded `ClientBasis`, which is judged again only when it gains a fact, and every
  unannounced connection of the client shows that one inference (`ConnectionRecord.view`), open
  or closed, so a later connection refines it for all and a replay of an event log, whose
  rollups lose the order of requests across connections, ends where the live registry ends. A
  connection with no client_id yet (or SASL not yet settled) is judged alone. When the
  fingerprint names no one, its reason and candidate libraries stay as `unnamed` (REST
  `fingerprint_unknown`). A fingerprint is never spread to siblings (issue 26).
- An open connection with no announced identity waits under its (address, client_id)
  (`waiting`): when a sibling announces at a sync point, the waiting ones take its identity at
  that event, not at their own next one.

Decided only at sync points, so tally mode and one event per request agree. Bounded: one index
entry per (address, client_id), at most `max_open`; at most MAX_WAITING_PER_KEY waiting per key
and MAX_NAMED_PER_EVENT named per event; at most MAX_INFER_CALLS + 1 infer() calls per
connection judged alone, one per fact a client gains (MAX_CLIENT_PAIRS); at most `max_open`
clients (the least recently joined dropped, counted: `clients_evicted`); and at most
`max_fingerprints_per_second` calls in all per second of `now()` (past it a connection is tried
again at its next sync point, sweep or close, counted in `fingerprint_skipped["budget"]`).

Imports only `exporter.census.basis`, `.fingerprint`, `.record` and `.series`; the registry's
clock, its record lookups, its series budget and its decode error counts are passed in at
construction. Never imports the registry.
"""

from __future__ import annotations

import dataclasses
from collections import Counter, OrderedDict
from collections.abc import Callable
from itertools import islice

from exporter.census.basis import CANONICAL_PAIR, SIBLING_CONFIDENCE, fold_first_requests
from exporter.census.fingerprint import MAX_CANDIDATES, ClientBasis, Inference, Unknown, client_evidence
from exporter.census.fingerprint import assess as _assess
from exporter.census.record import (
    API_VERSIONS,
    MAX_WIRE_STRING,
    UNKNOWN,
    UNKNOWN_REQUEST,
    ClientRecord,
    ConnectionRecord,
    InferredIdentity,
)
from exporter.census.series import SeriesBudget, label_values

# Per connection judged alone: the calls of fingerprint.infer() it may cost (one per sync point
# that brought new information, plus one at close).
MAX_INFER_CALLS = 3
FINGERPRINT_SKIP_REASONS = ("budget",)
# Open connections without an announced identity waiting, per (client address, client_id), for a
# sibling to be identified (`_name_waiting` names them then, not at their own next sync point),
# and how many of them one event may name: the work per event is bounded whatever the wire does.
MAX_WAITING_PER_KEY = 16
MAX_NAMED_PER_EVENT = 16
_SASL_APIS = (17, 36)  # SaslHandshake, SaslAuthenticate
_EVICTION_SCAN = 8  # clients looked at for a finished one to forget first (the work per new client is bounded)


def _with_members(inferred: InferredIdentity, basis: ClientBasis, rec: ConnectionRecord) -> InferredIdentity:
    """A client's inference (a new one: readers hold the old one) with its evidence's last line
    naming the connections judged together, when there are several."""
    return dataclasses.replace(
        inferred, evidence=client_evidence(inferred.evidence, basis, rec.client_address, rec.client_id),
        client_connections=tuple(basis.members) if basis.member_count > 1 else ())


def _inferred_labels(inferred: InferredIdentity) -> tuple[str, str]:
    return label_values(inferred.name, inferred.version_range)


class IdentityResolver:
    """The identities the wire did not announce (see the module doc). Every method is called
    under the registry's lock."""

    def __init__(self, *, max_open: int, sibling_window: float, max_fingerprints_per_second: int,
                 now: Callable[[], float], find_open: Callable[[str], ConnectionRecord | None],
                 find_record: Callable[[str], ConnectionRecord | None], series: SeriesBudget,
                 broker_max: dict[str, dict[int, int]], decode_errors: Counter[str]) -> None:
        self.max_open = max_open
        self.sibling_window = sibling_window
        self._now = now  # the registry's "now": wall time live, the events' own time in a replay
        self._find_open = find_open  # conn_id -> its open record
        self._find_record = find_record  # conn_id -> its record, open or still listed as closed
        self._series_key = series.series_key
        self._broker_max = broker_max  # "LISTENER:PORT" -> api_key -> max version (the broker table's)
        self._decode_errors = decode_errors  # the registry's; a failed inference counts as "fingerprint"
        # The last connection that announced software (KIP-511 fields) per (client address,
        # client_id), for the unannounced connections of the same client (identity_source
        # "sibling"). One dict lookup per connection; at most `max_open` entries, the least
        # recently announced dropped first. Connection ids, not records: a sibling is found while
        # its record is open or recently closed (`find_record`), and the index keeps no record
        # alive past those bounds.
        self.announced: OrderedDict[tuple, str] = OrderedDict()
        self.waiting: OrderedDict[tuple, list[str]] = OrderedDict()  # `_wait`: at most max_open keys
        self.sibling_identities = 0  # connections that took a sibling's identity
        # Issue 28: clients by (client address, client_id, principal), each with the basis its
        # connections fold into (`_client_of`); at most `max_open`, the least recently joined
        # forgotten first, one whose connections all closed if one of the oldest is (counted: its
        # open connections keep folding into it; a new connection of the key starts a client anew).
        self.clients: OrderedDict[tuple, ClientRecord] = OrderedDict()
        self.clients_evicted = 0
        self.client_facts_dropped = 0  # facts a full client basis did not keep (MAX_CLIENT_PAIRS)
        self.infer_calls = 0  # fingerprint.infer() calls, all connections (each bounded by MAX_INFER_CALLS + 1)
        # ... and at most `max_fingerprints_per_second` of them per second of `now()` (`_infer_budget`)
        self.max_fingerprints_per_second = max_fingerprints_per_second
        self._budget_second: int | None = None
        self._budget_used = 0
        self.fingerprint_skipped: Counter[str] = Counter(dict.fromkeys(FINGERPRINT_SKIP_REASONS, 0))
        # Open unannounced connections by (listener, inferred name, inferred version range):
        # kafka_census_connections_inferred, under the series budget like the main gauge.
        self.inferred_gauge: Counter = Counter()

    # --- the registry's calls ------------------------------------------------------------
    #
    # At sync points only: events other than requests, responses and acks. Tally mode hands a
    # connection's run over just before each of them (capture/kafka/connection.py), so at a sync
    # point a connection's requests are the same in both modes, and so is what is inferred.

    def at_sync_point(self, rec: ConnectionRecord, closing: bool = False, sweep: bool = False) -> None:
        """`rec` reached a sync point (`closing`: its ConnectionClosed; `sweep`: a traffic sweep):
        fold its first requests, then name it by a sibling or its client's fingerprint."""
        # Fold the pairs first seen since the last sync point, in key order; not at a traffic sweep,
        # whose timing differs between a live capture and a replay of it (the fingerprint reads
        # them provisionally meanwhile).
        pending = rec.pending_requests
        if pending is not None and not sweep:
            rec.pending_requests = None
            rec.first_requests = fold_first_requests(rec.first_requests, map(CANONICAL_PAIR.__getitem__, pending))
        if rec.software_name is not None or rec.restored:  # announced (or restored): nothing to infer
            if not sweep and self.waiting and rec.client_id is not None and rec.software_name is not None \
                    and self.announced.get((rec.client_address, rec.client_id)) == rec.id:
                self._name_waiting(rec)
            return
        # Precedence: a sibling that announced its software; this connection's own fingerprint.
        # A fingerprint is never a sibling's (issue 26): an inference spread to every connection
        # of its client would multiply one wrong decision by a reconnect loop.
        inferred = rec.inferred
        if inferred is not None and inferred.source == "sibling":
            return
        if self._sibling(rec):
            return
        self._fingerprint(rec, closing)
        # It waits for a sibling to announce (at a sweep its tally was handed over: its client_id is settled).
        if rec.client_id is not None and not closing:
            self._wait(rec)

    def announce(self, rec: ConnectionRecord) -> None:
        """`rec` announced software: it names its client's unannounced connections (`_sibling`)."""
        announced = self.announced
        key = (rec.client_address, rec.client_id)
        announced[key] = rec.id
        announced.move_to_end(key)
        if len(announced) > self.max_open:
            announced.popitem(last=False)

    def set_inferred(self, rec: ConnectionRecord, inferred: InferredIdentity | None, labels: tuple = ()) -> None:
        """Replace an open record's own inferred identity (it no longer shows its client's, if it
        did), moving it in the inferred gauge under `labels` (its name and range label values)."""
        if rec.view:
            self._unview_gauge(rec)
            rec.view = False
        if rec.inferred_labels is not None:
            self.inferred_gauge[rec.inferred_labels] -= 1
        rec.own_inferred = inferred
        if inferred is None:
            rec.inferred_labels = None
            return
        key = rec.inferred_labels = self._series_key("connections_inferred", self.inferred_gauge,
                                                     (rec.listener, *labels))
        self.inferred_gauge[key] += 1

    def connection_closed(self, rec: ConnectionRecord) -> None:
        """`rec` closed (after its last sync point): it leaves its client, the waiting list and the
        inferred gauge."""
        client = rec.client
        if client is not None:  # one open connection less; the client ends `sibling_window` after the last
            client.open_count -= 1
            client.last_seen = max(client.last_seen, rec.last_seen)
        waiting = self.waiting.get((rec.client_address, rec.client_id)) if self.waiting else None
        if waiting is not None and rec.id in waiting:  # no longer waiting: keep no closed id alive
            waiting.remove(rec.id)
            if not waiting:
                del self.waiting[(rec.client_address, rec.client_id)]
        if rec.inferred_labels is not None:
            self.inferred_gauge[rec.inferred_labels] -= 1
        self._unview_gauge(rec)

    def totals(self) -> dict:
        """Its counts, as `MetricsSnapshot`'s fingerprint_* fields (plain copies, for `snapshot`)."""
        return dict(fingerprint_calls=self.infer_calls, fingerprint_skipped=dict(self.fingerprint_skipped),
                    fingerprint_clients=len(self.clients), fingerprint_clients_evicted=self.clients_evicted,
                    fingerprint_facts_dropped=self.client_facts_dropped)

    # --- siblings ---------------------------------------------------------------------------

    def _wait(self, rec: ConnectionRecord) -> None:
        """`rec` (open, no announced identity of its own or of a sibling) waits for a sibling of its
        client address and client_id to be identified. At most MAX_WAITING_PER_KEY per key and
        `max_open` keys (the oldest key dropped first); one leaves at its close, or when found
        closed or named."""
        inferred = rec.inferred
        if inferred is not None and inferred.source == "sibling":
            return  # nothing better can come
        key = (rec.client_address, rec.client_id)
        waiting = self.waiting
        ids = waiting.get(key)
        if ids is None:
            waiting[key] = [rec.id]
            if len(waiting) > self.max_open:
                waiting.popitem(last=False)
        elif rec.id not in ids and len(ids) < MAX_WAITING_PER_KEY:
            ids.append(rec.id)

    def _name_waiting(self, rec: ConnectionRecord) -> None:
        """`rec` announced its software at a sync point: the open connections waiting under its key
        take it as their sibling now. Only the sibling lookup runs for them, never their own fold or
        fingerprint (their requests may still be in a tally). At most MAX_NAMED_PER_EVENT per event;
        the others are first in line at the next."""
        key = (rec.client_address, rec.client_id)
        ids = self.waiting.get(key)
        if not ids:
            return
        later: list[str] = []
        budget = MAX_NAMED_PER_EVENT
        get = self._find_open
        for wid in ids:
            w = get(wid)
            if w is None or w is rec or w.software_name is not None or w.restored:
                continue  # closed, or announced or restored since: no longer waiting
            if budget == 0:
                later.append(wid)
                continue
            budget -= 1
            if not self._sibling(w, key=key):
                later.append(wid)
        if later:
            self.waiting[key] = later
        else:
            del self.waiting[key]

    def _sibling(self, rec: ConnectionRecord, key: tuple | None = None) -> bool:
        """Give `rec` (no software fields) the identity of the connection that announced one from
        the same client address and client_id, if it is open or spoke at most `sibling_window`
        seconds before `rec` opened (packet time, so a replay gives what the live capture gave).
        `key`: the (address, client_id) `rec` waits under (`_name_waiting`), as of its last sync
        point. Only an announced identity spreads: never a fingerprint (`at_sync_point`)."""
        if key is None:
            if rec.client_id is None:
                return False
            key = (rec.client_address, rec.client_id)
        sib_id = self.announced.get(key)
        sib = None if sib_id is None else self._find_record(sib_id)
        if sib is None or sib is rec or sib.software_name is None:
            return False
        if sib.closed_at is not None and rec.first_seen - sib.last_seen > self.sibling_window:
            return False
        inferred = rec.inferred
        if inferred is not None and inferred.sibling_connection_id == sib.id:
            return True
        name, version = sib.software_name, sib.software_version or UNKNOWN
        rec.own_unnamed = None
        self.set_inferred(rec, InferredIdentity(
            source="sibling", name=name, version_range=version, confidence=SIBLING_CONFIDENCE,
            evidence=(f"connection {sib.id} from the same client address and client_id announced "
                      f"{name} {version} (ApiVersions v{sib.identity_version})",),
            min_compatible=None, sibling_connection_id=sib.id,
        ), sib.labels)
        self.sibling_identities += 1
        return True

    # --- fingerprints -----------------------------------------------------------------------

    def _fingerprint(self, rec: ConnectionRecord, closing: bool) -> None:
        """exporter.census.fingerprint.assess() of the connection's client (issue 28): the union of what
        the client's connections sent (`_client_of`; the connection alone until it can join
        one). Called again only when that union changed since the last call: a client costs at
        most one call per fact it gained (MAX_CLIENT_PAIRS bounds them), a connection judged alone
        at most MAX_INFER_CALLS while open and one at close; all within the per-second budget."""
        if rec.mid_stream:
            # Joined mid-stream: "no ApiVersions seen" is not "none sent", and infer() takes it as a fact.
            return
        first = rec.first_requests
        pending = rec.pending_requests
        if pending:  # at a sweep: what the next sync point will fold
            first = fold_first_requests(first, map(CANONICAL_PAIR.__getitem__, pending))
        if not first:
            return
        # What it sent only grows: while it stands still, nothing new to fold (the sweeps of an
        # idle connection cost no work), and its client's inference is already decided.
        n = len(first) + len(rec.requests)
        client = rec.client
        if client is not None and n == rec.folded and client.assessed == client.basis.version:
            return
        broker_max = self._broker_max.get(f"{rec.listener}:{rec.broker_port}")
        # What it sent: every pair it counted, its first requests among them (the order of
        # requests across connections is lost in an event log, their set is not).
        sent = [k for k in rec.requests if k != UNKNOWN_REQUEST]
        if all(k[0] == API_VERSIONS for k in sent):
            # Nothing to judge yet (ApiVersions is judged by its version, with the rest); and a
            # client that announces itself in its answer never costs a client basis.
            return
        client = self._client_of(rec, closing)
        if client is None:  # alone: a basis of its own connection, rebuilt for each call
            seen = (first, rec.api_versions_request_version, rec.client_id)
            if not closing and (seen == rec.infer_basis or rec.infer_calls >= MAX_INFER_CALLS or len(first) < 2):
                return
            if rec.infer_calls > MAX_INFER_CALLS:
                return
            if not self._infer_budget():  # tried again at the next sync point, sweep or close (basis unchanged)
                self.fingerprint_skipped["budget"] += 1
                return
            rec.infer_basis = seen
            rec.infer_calls += 1
            own = ClientBasis()
            own.add_member(rec.id, rec.first_seen)
            own.fold(rec.api_versions_request_version, sent, broker_max)
            inferred, unnamed = self._decided(own, rec, self._assessed(own, rec.client_id))
            if inferred is None:
                if rec.own_inferred is not None and rec.own_inferred.source == "fingerprint":
                    self.set_inferred(rec, None)  # more evidence, less sure: a wrong name is worse than none
            else:
                self.set_inferred(rec, inferred, _inferred_labels(inferred))
            rec.own_unnamed = unnamed
            return
        basis = client.basis
        dropped = basis.dropped
        basis.fold(rec.api_versions_request_version, sent, broker_max)
        rec.folded = n
        self.client_facts_dropped += basis.dropped - dropped
        if client.assessed == basis.version:
            return
        # From the client's second distinct request on (as one connection's), or at a close.
        if len(basis) < 2 and not closing:
            return
        if not self._infer_budget():
            self.fingerprint_skipped["budget"] += 1
            return
        client.assessed = basis.version
        inferred, client.unnamed = self._decided(basis, rec, self._assessed(basis, rec.client_id))
        if inferred != client.inferred:
            self._move_client_gauge(client, inferred)

    def _assessed(self, basis: ClientBasis, client_id: str | None) -> Inference | Unknown | None:
        self.infer_calls += 1
        try:
            return _assess(basis.observation(client_id))
        except Exception:  # a fault of the inference must not stop the capture: counted, no identity
            self._decode_errors["fingerprint"] += 1
            return None

    @staticmethod
    def _decided(basis: ClientBasis, rec: ConnectionRecord, found: Inference | Unknown | None) -> tuple:
        """(inferred, unnamed): what assess() found, as a record holds it, bounded."""
        if not isinstance(found, Inference):
            return None, (None if found is None or not found.candidates else (
                str(found.reason)[:MAX_WIRE_STRING],
                tuple(str(c)[:MAX_WIRE_STRING] for c in found.candidates[:MAX_CANDIDATES])))
        return _with_members(InferredIdentity(
            source="fingerprint", name=str(found.name)[:MAX_WIRE_STRING],
            version_range=str(found.version_range)[:MAX_WIRE_STRING],
            confidence=round(float(found.confidence), 3),
            evidence=tuple(str(e) for e in found.evidence),
            min_compatible=found.min_compatible, sibling_connection_id=None, client_connections=(),
        ), basis, rec), None

    def _infer_budget(self) -> bool:
        """One infer() call out of this second's budget (seconds of `now()`: wall time live, the
        events' own time in a replay, so a replay decides as fast or slow as it runs); False when
        it is spent."""
        second = int(self._now())
        if second != self._budget_second:
            self._budget_second = second
            self._budget_used = 0
        if self._budget_used >= self.max_fingerprints_per_second:
            return False
        self._budget_used += 1
        return True

    # --- clients ----------------------------------------------------------------------------

    def _client_of(self, rec: ConnectionRecord, closing: bool) -> ClientRecord | None:
        """The client `rec` folds into, joining it (or a new one) at the first call that can tell
        the client: a client_id, and the principal settled (none asked, or authenticated, or the
        connection closing). A client whose connections all closed more than `sibling_window`
        seconds before `rec` opened is over: `rec` starts a new one under the key. Joining, an
        unannounced `rec` with no sibling's identity starts showing the client's inference."""
        client = rec.client
        if client is not None:
            return client
        if rec.client_id is None:
            return None
        if not closing and rec.sasl_outcome is None and (
                rec.sasl_mechanism is not None or any(k[0] in _SASL_APIS for k in rec.requests)):
            return None  # authenticating: its principal (part of the client) is not known yet
        key = (rec.client_address, rec.client_id, rec.principal)
        clients = self.clients
        client = clients.get(key)
        if client is not None and client.open_count == 0 and rec.first_seen - client.last_seen > self.sibling_window:
            client = None
        if client is None:
            client = clients[key] = ClientRecord(key)
            if len(clients) > self.max_open:
                # the least recently joined, preferring one whose connections have all closed
                victim = next((k for k in islice(clients, _EVICTION_SCAN) if clients[k].open_count == 0 and k != key),
                              next(iter(clients)))
                del clients[victim]
                self.clients_evicted += 1
        clients.move_to_end(key)
        rec.client = client
        client.basis.add_member(rec.id, rec.first_seen)
        client.open_count += 1
        if client.inferred is not None:  # the same inference, its evidence naming one connection more
            client.inferred = _with_members(client.inferred, client.basis, rec)
        own = rec.own_inferred
        if rec.software_name is None and not rec.restored and (own is None or own.source == "fingerprint"):
            self.set_inferred(rec, None)
            rec.own_unnamed = None
            rec.view = True
            client.viewers[rec.listener] += 1
            series = client.gauge_keys.get(rec.listener)
            if client.inferred is not None and series is None:
                series = client.gauge_keys[rec.listener] = self._series_key(
                    "connections_inferred", self.inferred_gauge, (rec.listener, *_inferred_labels(client.inferred)))
            if series is not None:
                self.inferred_gauge[series] += 1
        return client

    def _unview_gauge(self, rec: ConnectionRecord) -> None:
        """`rec` (open) stops counting in its client's inferred gauge: it closed, or has an
        identity of its own now."""
        client = rec.client
        if not rec.view or client is None:
            return
        client.viewers[rec.listener] -= 1
        key = client.gauge_keys.get(rec.listener)
        if key is not None:
            self.inferred_gauge[key] -= 1

    def _move_client_gauge(self, client: ClientRecord, inferred: InferredIdentity | None) -> None:
        """The client's inference changed: its open viewers move in the inferred gauge together
        (work per listener, not per connection)."""
        gauge = self.inferred_gauge
        for listener, series in client.gauge_keys.items():
            gauge[series] -= client.viewers[listener]
        client.gauge_keys = {}
        client.inferred = inferred
        if inferred is None:
            return
        labels = _inferred_labels(inferred)
        for listener, n in client.viewers.items():
            if n > 0:
                series = client.gauge_keys[listener] = self._series_key("connections_inferred", gauge,
                                                                        (listener, *labels))
                gauge[series] += n
