"""Merging the sidecars' topic answers (issue 31): who writes and who reads each topic, cluster-wide.

Owns the checks that a peer's `/api/v1/topics` or `/api/v1/topics/{name}` answer has the
sidecar's shape (`check_topics`, `check_topic`: what the merge reads has the types it needs;
anything else is the peer's `invalid` answer) and `TopicsMerger`: a topic is cluster-wide, so
the peers' entries are merged by topic name; each client row (TopicClient) is kept as the peer
gave it, with `peer` added and its `conn_ids` prefixed with the peer as the aggregator's
connection ids are (`PEER/ID`); bytes are summed, first_seen is the earliest and last_seen the
latest. A topic a peer knows only by its id (`topic` null: it saw no Metadata answer naming
it) is named by another peer's entry with the same topic_id, at the end of the merge (the
answers arrive in any order). Kept: one entry per topic and id, and the peers' rows: bounded
by the peers' answers (each within --peer-max-items), as the census merge.

Used by exporter.aggregator.app; imports only the standard library and the error of an answer
of the wrong shape (exporter.http.models' `InvalidAnswer`). Must not import the rest of the
aggregator (exporter.aggregator.merge's rule: a merge is a function of the answers).
"""

from __future__ import annotations

from typing import Any

from exporter.http.models import InvalidAnswer

#: The client lists of a topic, by role (the sidecar's Topic).
ROLES = ("producers", "consumers", "admins", "others")
#: A peer's name and the connection id it gave, joined, as exporter.aggregator.merge.ID_SEPARATOR.
ID_SEPARATOR = "/"
# The TopicClient fields that are text or null (identity), counts, and times.
_CLIENT_TEXT = ("software_name", "software_version", "identity_source", "client_id", "principal", "client_address",
                "group_id", "transactional_id")
_CLIENT_COUNTS = ("frames", "bytes", "connections", "open_connections")
MAX_CONN_IDS = 16  # connection ids a client row lists (the sidecar's bound, TopicClient.conn_ids)


def _is_count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _opt_str(v) -> bool:
    return v is None or isinstance(v, str)


def _strings(v) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


def check_topic_client(row: Any, where: str) -> None:
    if not isinstance(row, dict):
        raise InvalidAnswer(f"{where}: not an object")
    for name in _CLIENT_TEXT:
        if not _opt_str(row.get(name)):
            raise InvalidAnswer(f"{where}: {name} is not a string or null")
    for name in _CLIENT_COUNTS:
        if not _is_count(row.get(name)):
            raise InvalidAnswer(f"{where}: {name} is not a count")
    for name in ("uses", "conn_ids"):
        if not _strings(row.get(name)):
            raise InvalidAnswer(f"{where}: {name} is not a list of strings")
    for name in ("first_seen", "last_seen"):
        if not isinstance(row.get(name), str):
            raise InvalidAnswer(f"{where}: {name} is not a string")


def check_topic(row: Any, where: str = "topic") -> None:
    """One Topic (the detail's answer, or a listing's row)."""
    if not isinstance(row, dict):
        raise InvalidAnswer(f"{where}: not an object")
    name, topic_id = row.get("topic"), row.get("topic_id")
    if not (_opt_str(name) and _opt_str(topic_id)) or (name is None and topic_id is None):
        raise InvalidAnswer(f"{where}: neither a topic name nor a topic_id")
    for role in ROLES:
        clients = row.get(role)
        if not isinstance(clients, list):
            raise InvalidAnswer(f"{where}: {role} is not a list")
        for client in clients:
            check_topic_client(client, f"{where} {role}")
    for name in ("bytes_produced", "bytes_fetched"):
        if not _is_count(row.get(name)):
            raise InvalidAnswer(f"{where}: {name} is not a count")
    for name in ("first_seen", "last_seen"):
        if not isinstance(row.get(name), str):
            raise InvalidAnswer(f"{where}: {name} is not a string")


def check_topics(body: Any) -> None:
    """A `/api/v1/topics` answer."""
    if not isinstance(body, dict) or not isinstance(body.get("topics"), list):
        raise InvalidAnswer("no list 'topics'")
    for row in body["topics"]:
        check_topic(row)
    for name in ("topics_overflowed", "unresolved_ids"):
        if not _is_count(body.get(name)):
            raise InvalidAnswer(f"{name} is not a count")


def peer_client(peer: str, row: dict) -> dict:
    """A peer's client row as the aggregator lists it: `peer` added, its connection ids PEER/ID
    (what `/api/v1/connections/{id}` of the aggregator routes back)."""
    return dict(row, peer=peer, conn_ids=[f"{peer}{ID_SEPARATOR}{i}" for i in row["conn_ids"]])


#: The census's overflow topic (exporter.census.topickeys.OTHER_TOPIC): listed after the named ones.
OTHER_TOPIC = "<other>"


def _client_order(row: dict) -> tuple:
    # The sidecar's (exporter.census.topic_reads): the busiest first, then by identity; then the
    # peer (the same client seen by two sidecars).
    return (-row["bytes"], -row["frames"], row.get("software_name") or "", row.get("client_id") or "",
            row.get("client_address") or "", row.get("group_id") or "", row.get("transactional_id") or "",
            row.get("principal") or "", row.get("software_version") or "", row.get("identity_source") or "",
            row["peer"])


def _client_key(row: dict) -> tuple:
    # What makes a client of a topic (the sidecar's grouping), and the peer that saw it.
    return (row["peer"], row.get("software_name"), row.get("software_version"), row.get("identity_source"),
            row.get("client_id"), row.get("principal"), row.get("client_address"), row.get("group_id"),
            row.get("transactional_id"))


def _add_client(have: dict, row: dict) -> None:
    """`row` into `have`, the same client of the same peer: frames and bytes summed (its entries
    by name and by id are different uses), uses and connection ids unioned (at most
    MAX_CONN_IDS, as the sidecar lists them), first/last seen widened. A connection listed under
    both (by name and by id) is counted once: where both lists are whole (under MAX_CONN_IDS) the
    connections are their union, and a list within the other adds no open connection; past the
    bound the larger count, a lower bound."""
    for name in ("frames", "bytes"):
        have[name] += row[name]
    mine, theirs = set(have["conn_ids"]), set(row["conn_ids"])
    union = mine | theirs
    if len(mine) == have["connections"] and len(theirs) == row["connections"]:  # both lists whole
        opened = have["open_connections"] + row["open_connections"]
        if theirs <= mine or mine <= theirs:
            opened = max(have["open_connections"], row["open_connections"])
        have["connections"], have["open_connections"] = len(union), min(opened, len(union))
    else:
        have["connections"] = max(have["connections"], row["connections"], len(union))
        have["open_connections"] = max(have["open_connections"], row["open_connections"])
    have["uses"] = sorted(set(have["uses"]) | set(row["uses"]))
    have["conn_ids"] = sorted(union)[:MAX_CONN_IDS]
    have["first_seen"] = min(have["first_seen"], row["first_seen"])
    have["last_seen"] = max(have["last_seen"], row["last_seen"])


def _grouped_consumers(rows: list[dict]) -> list[dict]:
    """A consumer's fetch connections are on its partitions' leaders, its group only on its
    coordinator, often another broker: a sidecar that saw only its fetches lists it without a
    group. Such a row takes the group its client (the same client_id, principal and client
    address, whatever identity each sidecar gave it) has on the other sidecars' rows, when
    there is exactly one, as each sidecar does for its own connections."""
    groups: dict[tuple, set] = {}
    for row in rows:
        if row.get("client_id") is not None and row.get("group_id") is not None:
            groups.setdefault((row["client_id"], row.get("principal"), row.get("client_address")), set()).add(
                row["group_id"])
    out = []
    for row in rows:
        if row.get("group_id") is None and row.get("client_id") is not None:
            known = groups.get((row["client_id"], row.get("principal"), row.get("client_address")), ())
            if len(known) == 1:
                row = dict(row, group_id=next(iter(known)))
        out.append(row)
    return out


class _Entry:
    """One topic being merged: its name or id, the ids seen with it, its rows and sums. A client
    of the same peer given twice (its connections by name and by id, in a listing and a later
    round, or folded from the id's entry) is one row, as the peer would list it had it named
    the id."""

    __slots__ = ("topic", "topic_id", "ids", "clients", "bytes_produced", "bytes_fetched", "first_seen",
                 "last_seen")

    def __init__(self, row: dict) -> None:
        self.topic: str | None = row["topic"]
        self.topic_id: str | None = row["topic_id"]
        self.ids: set[str] = set() if row["topic_id"] is None else {row["topic_id"]}
        self.clients: dict[str, dict[tuple, dict]] = {role: {} for role in ROLES}  # by _client_key
        self.bytes_produced = self.bytes_fetched = 0
        self.first_seen: str = row["first_seen"]
        self.last_seen: str = row["last_seen"]

    def _take(self, role: str, row: dict) -> None:
        rows = self.clients[role]
        key = _client_key(row)
        have = rows.get(key)
        if have is None:
            rows[key] = row
        else:
            _add_client(have, row)

    def add(self, peer: str, row: dict) -> None:
        if row["topic_id"] is not None:
            self.ids.add(row["topic_id"])
            if self.topic_id is None:
                self.topic_id = row["topic_id"]
        for role in ROLES:
            for client in row[role]:
                self._take(role, peer_client(peer, client))
        self.bytes_produced += row["bytes_produced"]
        self.bytes_fetched += row["bytes_fetched"]
        self.first_seen = min(self.first_seen, row["first_seen"])
        self.last_seen = max(self.last_seen, row["last_seen"])

    def fold(self, other: _Entry) -> None:
        """`other` (a topic known by id only) into this one, which names it."""
        self.ids |= other.ids
        if self.topic_id is None:
            self.topic_id = other.topic_id
        for role in ROLES:
            for row in other.clients[role].values():
                self._take(role, row)
        self.bytes_produced += other.bytes_produced
        self.bytes_fetched += other.bytes_fetched
        self.first_seen = min(self.first_seen, other.first_seen)
        self.last_seen = max(self.last_seen, other.last_seen)

    def result(self) -> dict:
        lists = {role: list(rows.values()) for role, rows in self.clients.items()}
        lists["consumers"] = _grouped_consumers(lists["consumers"])
        return {"topic": self.topic, "topic_id": self.topic_id,
                **{role: sorted(rows, key=_client_order) for role, rows in lists.items()},
                "bytes_produced": self.bytes_produced, "bytes_fetched": self.bytes_fetched,
                "first_seen": self.first_seen, "last_seen": self.last_seen}


class TopicsMerger:
    """The peers' topics merged by name (`add`: a listing; `add_topic`: one Topic, the detail's
    answer); ids a peer could not name resolved by another peer's entry at `result`.

    One topic asked again under its other names and ids (exporter.aggregator.app's rounds): a
    peer's answer for a name covers that name and every id the peer maps to it, its answer for
    an id it cannot name that id only. So, per peer, one named entry per name is taken and one
    unnamed entry per id (`taken`); a later one is the same usage again, dropped."""

    def __init__(self) -> None:
        self.named: dict[str, _Entry] = {}
        self.by_id: dict[str, _Entry] = {}  # topics known by id only, so far
        self.overflowed: dict[str, int] = {}  # by peer: a peer asked twice counts once
        self.taken: dict[str, set[tuple[str, str]]] = {}  # by peer: ("n", name) and ("i", id) taken

    @property
    def topics_overflowed(self) -> int:
        return sum(self.overflowed.values())

    def add(self, peer: str, body: dict) -> None:
        self.overflowed[peer] = body["topics_overflowed"]
        for row in body["topics"]:
            self.add_topic(peer, row)

    def covers(self, peer: str, name_or_id: str) -> bool:
        """The peer's entries taken so far cover that topic name or id."""
        taken = self.taken.get(peer, ())
        return ("n", name_or_id) in taken or ("i", name_or_id) in taken

    def add_topic(self, peer: str, row: dict) -> None:
        name, topic_id = row["topic"], row["topic_id"]
        taken = self.taken.setdefault(peer, set())
        mark = ("n", name) if name is not None else ("i", topic_id)
        if mark in taken:
            return
        taken.add(mark)
        if name is not None and topic_id is not None:
            taken.add(("i", topic_id))
        table, key = (self.named, name) if name is not None else (self.by_id, topic_id)
        entry = table.get(key)
        if entry is None:
            entry = table[key] = _Entry(row)
        entry.add(peer, row)

    def entries(self) -> list[_Entry]:
        """The merged topics, ids named where a peer named them: named ones by name, then the
        ids still unnamed."""
        names = {i: entry for entry in self.named.values() for i in entry.ids}
        for topic_id in [i for i in self.by_id if i in names]:
            names[topic_id].fold(self.by_id.pop(topic_id))
        # The sidecar's order: by name, "<other>" after them, then the ids no peer named.
        return sorted(self.named.values(), key=lambda e: (e.topic == OTHER_TOPIC, e.topic or "")) + \
            sorted(self.by_id.values(), key=lambda e: e.topic_id or "")

    def aliases(self, asked: str) -> list[str]:
        """The names and ids the answers so far gave the topic asked, but `asked` itself: what
        the peers that had nothing under `asked` are asked next."""
        entries = self.entries()
        names = sorted({e.topic for e in entries if e.topic is not None} - {asked})
        return names + sorted({i for e in entries for i in e.ids} - {asked} - set(names))

    def result(self) -> dict:
        topics = [e.result() for e in self.entries()]
        return {"topics": topics, "topics_overflowed": self.topics_overflowed,
                "unresolved_ids": sum(1 for t in topics if t["topic"] is None)}



class TopicMerger(TopicsMerger):
    """One topic's answers (`/api/v1/topics/{name}` of each peer: a Topic, or 404) as one Topic:
    every entry the peers gave under the name asked and under its `aliases`; `result` None if
    no peer had it. A peer's `cut` note is the route's (exporter.aggregator.app)."""

    def add(self, peer: str, body: dict) -> None:
        self.add_topic(peer, body)

    def result(self) -> dict | None:  # type: ignore[override]
        entries = self.entries()
        if not entries:
            return None
        first = entries[0]  # a named one, if any peer named it
        for other in entries[1:]:
            first.fold(other)
        # Only the folded entry is kept: a later round adds to it, and a second result() folds nothing twice.
        self.named = {first.topic: first} if first.topic is not None else {}
        self.by_id = {} if first.topic is not None else {first.topic_id: first}  # type: ignore[dict-item]
        return first.result()
