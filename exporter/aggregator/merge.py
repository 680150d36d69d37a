"""Merging the sidecars' answers into one (issue 16): pure functions, no I/O, no clock.

Owns the check that a peer's answer has the sidecar's shape (`check_*`: what the merge reads
has the types the merge needs; anything else is the peer's `invalid` answer, never a
traceback or a row silently dropped) and the mergers: connections (ids prefixed with the
peer, ordered again by the sidecar's rules and cut to the limit whenever the union passes
twice it, so at most 2 x `limit` rows are kept whatever the number of peers), census rows (merged by their key, counts
summed), churning clients (merged by client address and client_id, rates summed), brokers (listed
per peer), upgrade readiness (each part merged as its listing).

Used by exporter.aggregator.app (the routes pick the check and the merger) and
exporter.aggregator.fanout (which runs them on each answer); imports only the standard library,
the connection object's field declarations (exporter.census.fields, itself standard library
only) and the error of an answer of the wrong shape (exporter.http.models' `InvalidAnswer`, the
sidecar's side of the contract): a merge is a function of the answers, testable without a
server. Must not import the rest of the aggregator.
"""

from __future__ import annotations

from typing import Any

from exporter.census.fields import FIELDS, JSON_TYPES, ORDER_BY
from exporter.http.models import InvalidAnswer

#: A peer's name and the connection id it gave, joined: "127.0.0.1:9101/10.0.0.5:9092-...".
#: A peer's name is host:port (no "/"), so the first "/" splits them.
ID_SEPARATOR = "/"
#: Distinct client hosts in a merged census row: the API's documented bound (Client.client_addresses).
MAX_CLIENT_ADDRESSES = 100
#: Groups and topics a merged census row lists (issue 31): the sidecar's bounds (Client.groups, .topics).
MAX_CLIENT_GROUPS = 16
MAX_CLIENT_TOPICS = 64

# The order_by fields by the JSON type of their value (exporter/census/fields.py), so a peer's
# row cannot make the merge compare a string with a number (idle_seconds, a number or null, is
# checked on its own).
_ORDERED = [FIELDS[name] for name in ORDER_BY]
_STR_FIELDS = tuple(f.name for f in _ORDERED if JSON_TYPES[f.kind] is str and not f.nullable)
_OPT_STR_FIELDS = tuple(f.name for f in _ORDERED if JSON_TYPES[f.kind] is str and f.nullable)
_INT_FIELDS = tuple(f.name for f in _ORDERED if JSON_TYPES[f.kind] is int)
del _ORDERED


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _opt_str(v) -> bool:
    return v is None or isinstance(v, str)


def _list_of(body: Any, key: str) -> list:
    if not isinstance(body, dict):
        raise InvalidAnswer("not a JSON object")
    rows = body.get(key)
    if not isinstance(rows, list):
        raise InvalidAnswer(f"no list {key!r}")
    return rows


def _check_requests(row: dict, key: str, where: str) -> None:
    reqs = row.get(key)
    if not isinstance(reqs, list):
        raise InvalidAnswer(f"{where}: {key} is not a list")
    for r in reqs:
        if not (isinstance(r, dict) and isinstance(r.get("api"), str) and _is_int(r.get("count"))
                and (r.get("api_key") is None or _is_int(r.get("api_key")))
                and (r.get("api_version") is None or _is_int(r.get("api_version")))):
            raise InvalidAnswer(f"{where}: a bad {key} entry")


def check_connection(row: Any, where: str = "connection") -> None:
    if not isinstance(row, dict) or not isinstance(row.get("id"), str):
        raise InvalidAnswer(f"{where}: not an object with a string id")
    for name in _STR_FIELDS:
        if not isinstance(row.get(name), str):
            raise InvalidAnswer(f"{where}: {name} is not a string")
    for name in _OPT_STR_FIELDS:
        if not _opt_str(row.get(name, 0)):
            raise InvalidAnswer(f"{where}: {name} is not a string or null")
    for name in _INT_FIELDS:
        if not _is_int(row.get(name)):
            raise InvalidAnswer(f"{where}: {name} is not an integer")
    idle = row.get("idle_seconds", 0)
    if not (idle is None or _is_num(idle)):
        raise InvalidAnswer(f"{where}: idle_seconds is not a number")
    _check_inferred(row.get("inferred_software"))
    unknown = row.get("fingerprint_unknown")  # absent from a sidecar older than issue 26
    if unknown is not None and not (isinstance(unknown, dict) and isinstance(unknown.get("reason"), str)
                                    and isinstance(c := unknown.get("candidates"), list)
                                    and all(isinstance(x, str) for x in c)):
        raise InvalidAnswer(f"{where}: a bad fingerprint_unknown")
    refused = row.get("unsupported_request")  # absent from a sidecar older than issue 27
    if refused is not None and not (isinstance(refused, dict) and isinstance(refused.get("api"), str)
                                    and _is_int(refused.get("api_version"))):
        raise InvalidAnswer(f"{where}: a bad unsupported_request")


def check_connections(body: Any, limit: int | None = None) -> None:
    """`limit`: the page asked for; a peer that sends more rows is not answering the question
    (and would make the merge sort what it never needed)."""
    rows = _list_of(body, "connections")
    if limit is not None and len(rows) > limit:
        raise InvalidAnswer(f"{len(rows)} connections for limit={limit}")
    for row in rows:
        check_connection(row)
    if not _is_int(body.get("total")) or body["total"] < len(rows):
        raise InvalidAnswer("total is not a count of at least the rows listed")


def _check_inferred(value) -> None:
    """An inferred identity, passed on as the peer gave it. Its client_connections (issue 28: the
    sidecar's ids of the connections judged together, never prefixed; absent from an older
    sidecar) must be a list of strings: the page asks for each."""
    if value is None:
        return
    if not (isinstance(value, dict) and isinstance(value.get("name"), str)
            and isinstance(value.get("version_range"), str)):
        raise InvalidAnswer("a bad inferred_software")
    members = value.get("client_connections", [])
    if not (isinstance(members, list) and all(isinstance(m, str) for m in members)):
        raise InvalidAnswer("a bad inferred_software.client_connections")


def check_client(row: Any, where: str = "client") -> None:
    if not isinstance(row, dict):
        raise InvalidAnswer(f"{where}: not an object")
    for name in ("client_software_name", "client_software_version", "client_id", "principal"):
        if not _opt_str(row.get(name, 0)):
            raise InvalidAnswer(f"{where}: {name} is not a string or null")
    for name in ("listener", "identity_source", "first_seen", "last_seen"):
        if not isinstance(row.get(name), str):
            raise InvalidAnswer(f"{where}: {name} is not a string")
    for name in ("open_connections", "total_connections"):
        if not _is_int(row.get(name)):
            raise InvalidAnswer(f"{where}: {name} is not an integer")
    _check_inferred(row.get("inferred_software"))
    addresses = row.get("client_addresses")
    if not isinstance(addresses, list) or not all(isinstance(a, str) for a in addresses):
        raise InvalidAnswer(f"{where}: client_addresses is not a list of strings")
    _check_requests(row, "requests", where)
    for name in ("groups", "topics", "roles"):  # absent from a sidecar older than issue 31
        value = row.get(name, [])
        if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
            raise InvalidAnswer(f"{where}: {name} is not a list of strings")


def _union(have: list, more: list, bound: int | None = None) -> list:
    """Two of a census row's lists as one: what `have` holds, then what `more` adds, sorted, at most `bound`."""
    merged = sorted(set(have) | set(more))
    return merged if bound is None else merged[:bound]


def check_clients(body: Any) -> None:
    for row in _list_of(body, "clients"):
        check_client(row)
    if not _is_int(body.get("census_overflow")):
        raise InvalidAnswer("census_overflow is not a count")


def check_brokers(body: Any) -> None:
    for row in _list_of(body, "brokers"):
        if not isinstance(row, dict) or not isinstance(row.get("broker"), str):
            raise InvalidAnswer("broker: not an object with a string broker")


def check_churn(body: Any) -> None:
    for row in _list_of(body, "churning"):
        if not (isinstance(row, dict) and isinstance(row.get("client_address"), str)
                and _opt_str(row.get("client_id", 0)) and isinstance(row.get("first_seen"), str)
                and isinstance(row.get("last_seen"), str)):
            raise InvalidAnswer("churning: not an object with a client_address, client_id, first_seen and last_seen")
        rate, total = row.get("connections_per_minute"), row.get("connections_total")
        if not (isinstance(rate, (int, float)) and not isinstance(rate, bool) and rate >= 0
                and isinstance(total, int) and not isinstance(total, bool) and total >= 0):
            raise InvalidAnswer("churning: a bad connections_per_minute or connections_total")
    threshold = body.get("threshold_per_minute")
    if not (_is_num(threshold) and threshold > 0):
        raise InvalidAnswer("threshold_per_minute is not a positive number")
    for name in ("tracked_clients", "max_tracked_clients", "evicted"):
        if not (_is_int(body.get(name)) and body[name] >= 0):
            raise InvalidAnswer(f"{name} is not a count")


def check_upgrade(body: Any) -> None:
    for row in _list_of(body, "connections"):
        check_connection(row, "upgrade connection")
        _check_requests(row, "removed_requests", "upgrade connection")
    for row in _list_of(body, "clients"):
        check_client(row, "upgrade client")
        _check_requests(row, "removed_requests", "upgrade client")
    for row in _list_of(body, "clients_by_software"):
        if not isinstance(row, dict):
            raise InvalidAnswer("clients_by_software: not an object")
        for name in ("software_name", "software_version", "client_id", "principal"):
            if not _opt_str(row.get(name, 0)):
                raise InvalidAnswer(f"clients_by_software: {name} is not a string or null")
        if not isinstance(row.get("identity_source"), str):
            raise InvalidAnswer("clients_by_software: identity_source is not a string")
        if not isinstance(row.get("listeners"), list) or not all(isinstance(x, str) for x in row["listeners"]):
            raise InvalidAnswer("clients_by_software: listeners is not a list of strings")
        for name in ("open_connections", "total_connections"):
            if not _is_int(row.get(name)):
                raise InvalidAnswer(f"clients_by_software: {name} is not an integer")
        _check_requests(row, "removed_requests", "clients_by_software")
    if not isinstance(body.get("ready"), bool):
        raise InvalidAnswer("ready is not a boolean")


# --- connections --------------------------------------------------------------------------

def peer_row(peer: str, row: dict) -> dict:
    """A peer's connection row as the aggregator lists it: id prefixed with the peer, `peer` added."""
    out = dict(row)
    out["id"] = f"{peer}{ID_SEPARATOR}{row['id']}"
    out["peer"] = peer
    return out


def split_id(conn_id: str) -> tuple[str, str] | None:
    """`"PEER/ID"` -> (PEER, ID); None when there is no peer part."""
    peer, sep, rest = conn_id.partition(ID_SEPARATOR)
    if not sep or not peer or not rest:
        return None
    return peer, rest


def order_connections(rows: list[dict], terms: list[tuple[str, bool]]) -> None:
    """In place, the sidecar's order (exporter.census.registry.query): each term ascending or
    descending, None last in either direction; ties, and no terms, by (first_seen, id).
    Timestamps are RFC 3339 with microseconds in UTC, so their strings order as their times.
    Stable sorts, the last term first."""
    rows.sort(key=lambda r: (r["first_seen"], r["id"]))
    for name, desc in reversed(terms):
        if desc:  # reversed: None must have the smallest key to come last
            rows.sort(key=lambda r: (0,) if r.get(name) is None else (1, r[name]), reverse=True)
        else:
            rows.sort(key=lambda r: (1,) if r.get(name) is None else (0, r[name]))


class ConnectionsMerger:
    """The listing over peers: every peer was asked with the same filters, order and limit;
    the union is ordered again and cut to `limit`. Rows are kept as (peer, row) and copied with
    the prefixed id only when they make the page; the union is ordered and cut whenever it
    passes twice the limit, so at most 2 x `limit` rows (plus one peer's page) are kept
    whatever the number of peers."""

    def __init__(self, terms: list[tuple[str, bool]], limit: int) -> None:
        self.terms, self.limit = terms, limit
        self.kept: list[tuple[str, dict]] = []
        self.total = 0

    def add(self, peer: str, body: dict) -> None:
        self.total += body["total"]
        self.kept.extend((peer, r) for r in body["connections"])
        if len(self.kept) > 2 * self.limit:
            self._cut()

    def _cut(self) -> None:
        kept = self.kept
        # The tie-break is the id as listed, PEER/ID: its order is (PEER, "/", ID)'s.
        kept.sort(key=lambda pr: (pr[1]["first_seen"], pr[0] + ID_SEPARATOR + pr[1]["id"]))
        for name, desc in reversed(self.terms):
            if desc:
                kept.sort(key=lambda pr: (0,) if pr[1].get(name) is None else (1, pr[1][name]), reverse=True)
            else:
                kept.sort(key=lambda pr: (1,) if pr[1].get(name) is None else (0, pr[1][name]))
        del kept[self.limit:]

    @property
    def rows(self) -> list[dict]:
        self._cut()
        return [peer_row(peer, r) for peer, r in self.kept]

    def result(self) -> dict:
        return {"connections": self.rows, "total": self.total, "limit": self.limit}


# --- the census ---------------------------------------------------------------------------

def _request_key(r: dict) -> tuple:
    # The sidecar's order: by key and version, the "unknown" row (null key) last.
    return (r["api_key"] is None, r["api_key"] or 0, r["api_version"] or 0, r["api"])


def merge_requests(into: list[dict], more: list[dict]) -> list[dict]:
    """Request counts (or removed requests) by (api, api_key, api_version), counts summed."""
    by = {(r["api"], r["api_key"], r["api_version"]): dict(r) for r in into}
    for r in more:
        k = (r["api"], r["api_key"], r["api_version"])
        if k in by:
            by[k]["count"] += r["count"]
        else:
            by[k] = dict(r)
    return sorted(by.values(), key=_request_key)


def client_key(row: dict) -> tuple:
    inferred = row.get("inferred_software")
    return (row.get("client_software_name"), row.get("client_software_version"), row.get("client_id"),
            row.get("principal"), row["listener"], row["identity_source"],
            inferred["name"] if inferred else None, inferred["version_range"] if inferred else None)


def _client_order(row: dict) -> tuple:
    # exporter.census.registry.clients' order, then the fields it leaves to chance.
    inferred = row.get("inferred_software")
    return (row.get("client_software_name") or "", row.get("client_software_version") or "",
            row.get("client_id") or "", row["listener"], row["identity_source"],
            inferred["name"] if inferred else "", inferred["version_range"] if inferred else "",
            row.get("principal") or "")


class ClientsMerger:
    """Census rows merged by their key: open and total connections and request counts summed,
    first_seen the earliest, last_seen the latest, client addresses, groups, topics and roles
    unioned (bounded as the sidecar bounds them), the peers that saw the row listed. The first
    peer's inferred identity (and evidence) stays."""

    def __init__(self) -> None:
        self.rows: dict[tuple, dict] = {}
        self.census_overflow = 0

    def add_row(self, peer: str, row: dict) -> None:
        key = client_key(row)
        have = self.rows.get(key)
        if have is None:
            have = self.rows[key] = dict(row)
            have["client_addresses"] = sorted(set(row["client_addresses"]))[:MAX_CLIENT_ADDRESSES]
            have["requests"] = merge_requests([], row["requests"])
            if "removed_requests" in row:
                have["removed_requests"] = merge_requests([], row["removed_requests"])
            have["peers"] = [peer]
            for name, bound in (("groups", MAX_CLIENT_GROUPS), ("topics", MAX_CLIENT_TOPICS), ("roles", None)):
                if name in row:
                    have[name] = _union([], row[name], bound)
            return
        have["open_connections"] += row["open_connections"]
        have["total_connections"] += row["total_connections"]
        have["first_seen"] = min(have["first_seen"], row["first_seen"])
        have["last_seen"] = max(have["last_seen"], row["last_seen"])
        have["client_addresses"] = sorted(set(have["client_addresses"]) | set(row["client_addresses"])
                                          )[:MAX_CLIENT_ADDRESSES]
        have["requests"] = merge_requests(have["requests"], row["requests"])
        if "removed_requests" in row:
            have["removed_requests"] = merge_requests(have.get("removed_requests", []), row["removed_requests"])
        for name, bound in (("groups", MAX_CLIENT_GROUPS), ("topics", MAX_CLIENT_TOPICS), ("roles", None)):
            if name in row:
                have[name] = _union(have.get(name, []), row[name], bound)
        if peer not in have["peers"]:
            have["peers"].append(peer)

    def add(self, peer: str, body: dict) -> None:
        self.census_overflow += body["census_overflow"]
        for row in body["clients"]:
            self.add_row(peer, row)

    def merged(self) -> list[dict]:
        return sorted(self.rows.values(), key=_client_order)

    def result(self) -> dict:
        rows = self.merged()
        return {"clients": rows, "total": len(rows), "census_overflow": self.census_overflow}


# --- churning clients --------------------------------------------------------------------

class ChurnMerger:
    """Churning clients merged by (client address, client_id): two sidecars that saw the same
    client each saw some of its connections, so rates and totals are summed, first_seen is the
    earliest and last_seen the latest, and the peers that listed it are named. A sidecar lists a
    client only at or over its own threshold, so a client under it on every sidecar but over it
    in sum is not listed, and a merged rate counts only the sidecars that listed it. The
    threshold is the lowest of the peers' (every merged rate is at least it); tracked clients,
    their bound and evictions are summed. Bounded as the census merge: by the peers' answers
    (each within --peer-max-items), one row per key."""

    def __init__(self) -> None:
        self.rows: dict[tuple, dict] = {}
        self.threshold: float | None = None
        self.tracked = self.max_tracked = self.evicted = 0

    def add(self, peer: str, body: dict) -> None:
        threshold = body["threshold_per_minute"]
        self.threshold = threshold if self.threshold is None else min(self.threshold, threshold)
        self.tracked += body["tracked_clients"]
        self.max_tracked += body["max_tracked_clients"]
        self.evicted += body["evicted"]
        for row in body["churning"]:
            key = (row["client_address"], row.get("client_id"))
            have = self.rows.get(key)
            if have is None:  # only the checked keys: a peer's extra fields never reach the answer
                self.rows[key] = {"client_address": key[0], "client_id": key[1],
                                  "connections_per_minute": row["connections_per_minute"],
                                  "connections_total": row["connections_total"], "first_seen": row["first_seen"],
                                  "last_seen": row["last_seen"], "peers": [peer]}
                continue
            have["connections_per_minute"] = round(have["connections_per_minute"] + row["connections_per_minute"], 1)
            have["connections_total"] += row["connections_total"]
            have["first_seen"] = min(have["first_seen"], row["first_seen"])
            have["last_seen"] = max(have["last_seen"], row["last_seen"])
            if peer not in have["peers"]:
                have["peers"].append(peer)

    def result(self) -> dict:
        for row in self.rows.values():
            row["peers"].sort()  # the order the peers answered in is chance
        # The sidecar's order: highest rate first, then address and client_id.
        rows = sorted(self.rows.values(), key=lambda r: (-r["connections_per_minute"], r["client_address"],
                                                         r["client_id"] is not None, r["client_id"] or ""))
        return {"churning": rows, "total": len(rows), "threshold_per_minute": self.threshold,
                "tracked_clients": self.tracked, "max_tracked_clients": self.max_tracked, "evicted": self.evicted}


# --- brokers ------------------------------------------------------------------------------

class BrokersMerger:
    """Brokers are listed per peer, not merged: two peers' "PLAINTEXT:9092" are two brokers."""

    def __init__(self) -> None:
        self.rows: list[dict] = []

    def add(self, peer: str, body: dict) -> None:
        self.rows.extend(dict(b, peer=peer) for b in body["brokers"])

    def result(self) -> dict:
        self.rows.sort(key=lambda b: (b["peer"], b["broker"]))
        return {"brokers": self.rows}


# --- upgrade readiness --------------------------------------------------------------------

def _software_key(row: dict) -> tuple:
    return (row.get("software_name"), row.get("software_version"), row["identity_source"], row.get("client_id"),
            row.get("principal"))


def _software_order(row: dict) -> tuple:
    # exporter.census.readiness.by_software's order.
    return (row.get("software_name") or "", row.get("software_version") or "", row.get("client_id") or "",
            row.get("principal") or "", row["identity_source"])


class UpgradeMerger:
    """Who uses what the target removes, over peers: connections as the listing (in
    (first_seen, id) order, the first `max_connections`, the rest counted in connections_omitted),
    census rows as /clients, `clients_by_software` merged by
    (software, version, identity source, client_id, principal) with listeners unioned and
    counts summed. `ready` only if every peer said so (the caller also requires a whole answer)."""

    def __init__(self, target: str, max_connections: int = 10_000) -> None:
        self.target = target
        self.ready = True
        self.connections: list[dict] = []
        self.max_connections = max_connections
        self.connections_omitted = 0
        self.clients = ClientsMerger()
        self.software: dict[tuple, dict] = {}

    def add(self, peer: str, body: dict) -> None:
        self.ready = self.ready and body["ready"]
        self.connections.extend(peer_row(peer, r) for r in body["connections"])
        if len(self.connections) > self.max_connections:  # bounded whatever the number of peers; counted
            order_connections(self.connections, [])
            self.connections_omitted += len(self.connections) - self.max_connections
            del self.connections[self.max_connections:]
        for row in body["clients"]:
            self.clients.add_row(peer, row)
        for row in body["clients_by_software"]:
            key = _software_key(row)
            have = self.software.get(key)
            if have is None:
                have = self.software[key] = dict(row, listeners=sorted(set(row["listeners"])), peers=[peer],
                                                 removed_requests=merge_requests([], row["removed_requests"]))
                continue
            have["listeners"] = sorted(set(have["listeners"]) | set(row["listeners"]))
            have["open_connections"] += row["open_connections"]
            have["total_connections"] += row["total_connections"]
            have["removed_requests"] = merge_requests(have["removed_requests"], row["removed_requests"])
            if peer not in have["peers"]:
                have["peers"].append(peer)

    def result(self) -> dict:
        order_connections(self.connections, [])
        return {"target": self.target, "ready": self.ready,
                "clients_by_software": sorted(self.software.values(), key=_software_order),
                "connections": self.connections, "connections_omitted": self.connections_omitted,
                "clients": self.clients.merged()}
