"""The topic reads (issue 31): who writes and who reads each topic, from the connections' topic usage.

Owns what REST `GET /api/v1/topics` and `GET /api/v1/topics/{name}` answer (`listing`; the detail is its `topic=`):
the open and recently closed records' topic maps, copied under the registry's lock a chunk of
TOPIC_PER_HOLD records per hold (a shallow copy of each map, one C call: its values are replaced
whole, never mutated), then grouped with the lock free by topic (an id the id map names now is
its topic, so usage by id before the Metadata answer is named too; a topic known only by its id
stays apart, `topic` null) and, per topic, by client: the connections with the same software
(announced, else inferred), client_id, principal, client address, group_id and
transactional_id. A client is listed under each role its uses give it (`topickeys.topic_roles`),
with the frames and bytes of that role's uses only.

A consumer's group id is on its coordinator connection only, a producer's transactional id on
the connections that send it; its fetch, produce and Metadata connections carry none. So a
connection without one that consumes (or produces) takes the group id (the transactional id)
its client's other connections (same software, client_id, principal and client address) named,
when they named exactly one (`_effective`): the consumer is one row with its group, and the
`group=` filter finds its fetches. A client's Metadata-only
connection is not listed under "others" when the client (same software, client_id, principal
and address, whatever its group) has another role towards the topic.

Imports only `exporter.census.record` (times, identity sources, the record type) and
`exporter.census.topickeys` (the rules); the registry's chunked copy and its references are
passed in. Never imports the registry (exporter/census/registry.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from exporter.census.record import ConnectionRecord, iso_time
from exporter.census.topickeys import OTHER_TOPIC, ROLE_USES, TOPIC_ROLES, split_key, topic_roles, wanted_keys

TOPIC_PER_HOLD = 64  # records whose topic maps (each at most --max-topics-per-connection entries) are copied per hold
MAX_CONN_IDS = 16  # connection ids a client row of a topic lists (`connections` counts them all)
# Client rows a topic's list holds, the most bytes (then frames) first; past it the answer's `cut`
# says how many were left out. Only the listed rows are ever built.
MAX_TOPIC_CLIENTS = 1000
TOPICS_PER_CHUNK = 16  # topics built (and encoded) at a time by a lazy listing
ROLE_LISTS = {"producer": "producers", "consumer": "consumers", "admin": "admins", "other": "others"}
ROLE_FILTERS = ("producer", "consumer", "admin")

Copier = Callable[..., list]
_REPLICATE = frozenset(("replicate",))
_METADATA = {"metadata"}
_CONSUMES, _PRODUCES = ROLE_USES["consumer"], ROLE_USES["producer"]


def _part(rec: ConnectionRecord):
    """What a topic read copies of a record, under the lock (its topic map: one C call); None for
    one that named no topic, group or transactional id."""
    topics = rec.topics
    if not topics and rec.group_id is None and rec.transactional_id is None:
        return None
    inferred = rec.inferred
    software: tuple[str, str | None, str | None]
    if rec.software_name is not None:
        software = ("announced", rec.software_name, rec.software_version)
    elif inferred is not None:
        software = (inferred.source, inferred.name, inferred.version_range)
    else:
        software = ("none", None, None)
    return (rec.id, rec.state == "open", (software, rec.client_id, rec.principal, rec.client_address),
            rec.group_id, rec.transactional_id, dict(topics) if topics else None)


class _Client:
    __slots__ = ("key", "uses", "frames", "bytes", "connections", "open", "conn_ids", "first", "last")

    def __init__(self, key: tuple) -> None:
        self.key = key
        self.uses: set[str] = set()
        self.frames = self.bytes = self.connections = self.open = 0
        self.conn_ids: list[str] = []
        self.first, self.last = float("inf"), 0.0

    def row(self) -> dict:
        (source, name, version), client_id, principal, address, group, txn = self.key
        return {"software_name": name, "software_version": version, "identity_source": source,
                "client_id": client_id, "principal": principal, "client_address": address, "group_id": group,
                "transactional_id": txn, "uses": sorted(self.uses), "frames": self.frames, "bytes": self.bytes,
                "connections": self.connections, "open_connections": self.open, "conn_ids": sorted(self.conn_ids),
                "first_seen": iso_time(self.first), "last_seen": iso_time(self.last)}


class _Topic:
    __slots__ = ("topic", "topic_id", "roles", "produced", "fetched", "first", "last")

    def __init__(self, topic: str | None, topic_id: str | None) -> None:
        self.topic, self.topic_id = topic, topic_id
        self.roles: dict[str, dict[tuple, _Client]] = {role: {} for role in TOPIC_ROLES}
        self.produced = self.fetched = 0
        self.first, self.last = float("inf"), 0.0

    def add(self, conn_id: str, open_: bool, client: tuple, entries: list[tuple]) -> None:
        """One connection's entries of this topic: (use, frames, bytes, first_seen, last_seen)."""
        uses = {e[0] for e in entries}
        roles = topic_roles(uses)
        for use, _, nbytes, first, last in entries:
            if use == "produce":
                self.produced += nbytes
            elif use == "fetch":
                self.fetched += nbytes
            self.first, self.last = min(self.first, first), max(self.last, last)
        for role in roles:
            counted = ROLE_USES[role]
            if role == "other" and roles != {"other"}:
                counted = _REPLICATE  # a client's metadata requests count in "others" only when it did nothing else
            mine = [e for e in entries if e[0] in counted]
            if not mine:
                continue
            row = self.roles[role].get(client)
            if row is None:
                row = self.roles[role][client] = _Client(client)
            row.connections += 1
            row.open += open_
            if len(row.conn_ids) < MAX_CONN_IDS:
                row.conn_ids.append(conn_id)
            for use, frames, nbytes, first, last in mine:
                row.uses.add(use)
                row.frames += frames
                row.bytes += nbytes
                row.first, row.last = min(row.first, first), max(row.last, last)

    def to_dict(self, notes: list[str]) -> dict:
        """The Topic object; a list past MAX_TOPIC_CLIENTS is cut, said in `notes`."""
        out: dict = {"topic": self.topic, "topic_id": self.topic_id}
        roles = self.roles
        # who (software, client_id, principal, address) has a real role: its Metadata-only rows go
        elsewhere = {key[:4] for role in ("producer", "consumer", "admin") for key in roles[role]}
        for role in TOPIC_ROLES:
            clients: Iterable[_Client] = roles[role].values()
            if role == "other" and elsewhere:
                clients = [c for c in clients if c.key[:4] not in elsewhere or c.uses != _METADATA]
            ordered = sorted(clients, key=_client_order)
            if len(ordered) > MAX_TOPIC_CLIENTS:
                notes.append(f"{MAX_TOPIC_CLIENTS} of {len(ordered)} {ROLE_LISTS[role]} of topic "
                             f"{self.topic or self.topic_id} listed (the most bytes first)")
                del ordered[MAX_TOPIC_CLIENTS:]
            out[ROLE_LISTS[role]] = [c.row() for c in ordered]
        out.update(bytes_produced=self.produced, bytes_fetched=self.fetched, first_seen=iso_time(self.first),
                   last_seen=iso_time(self.last))
        return out


def _effective(parts: list) -> dict[tuple, tuple[str | None, str | None]]:
    """Per client (software, client_id, principal, address): the group id and the transactional
    id its connections named, each when they named exactly one (else None)."""
    seen: dict[tuple, tuple[set, set]] = {}
    for _, _, who, group, txn, _ in parts:
        groups, txns = seen.setdefault(_named(who), (set(), set()))
        if group is not None:
            groups.add(group)
        if txn is not None:
            txns.add(txn)
    return {who: (next(iter(groups)) if len(groups) == 1 else None, next(iter(txns)) if len(txns) == 1 else None)
            for who, (groups, txns) in seen.items()}


def _named(who: tuple) -> tuple:
    """A client without its identity's source: a fetch connection named after its sibling (source
    "sibling") is the same client as the coordinator connection that announced the name."""
    return (who[0][1:], *who[1:])


def _grouped(parts: list, names: dict[str, str], wanted: frozenset[str] | None,
             group_filter: str | None) -> dict[tuple, _Topic]:
    """The copied parts grouped by topic ((name, None), or (None, id) for an id no answer named);
    `wanted`: only these topic keys; `group_filter`: only the connections of that group."""
    ids: dict[str, str] = {}
    for mapped, name in names.items():
        ids.setdefault(name, mapped)
    effective = _effective(parts)
    out: dict[tuple, _Topic] = {}
    for conn_id, open_, who, group, txn, topics in parts:
        if not topics:
            continue
        if group is None or txn is None:
            uses = {use for use, _ in topics}
            if group is None and not uses.isdisjoint(_CONSUMES):
                group = effective[_named(who)][0]
            if txn is None and not uses.isdisjoint(_PRODUCES):
                txn = effective[_named(who)][1]
        if group_filter is not None and group != group_filter:
            continue
        by_topic: dict[tuple, list[tuple]] = {}
        for (use, key), (frames, nbytes, first, last) in topics.items():
            if wanted is not None and key not in wanted:
                continue
            topic, topic_id = split_key(key, names)
            by_topic.setdefault((topic, None if topic is not None else topic_id), []).append(
                (use, frames, nbytes, first, last))
        client = (*who, group, txn)
        for ident, entries in by_topic.items():
            entry = out.get(ident)
            if entry is None:
                named = ident[0]
                entry = out[ident] = _Topic(named, ident[1] if named is None else ids.get(named))
            entry.add(conn_id, open_, client, entries)
    return out


def _client_order(c: _Client) -> tuple:
    (source, name, version), client_id, principal, address, group, txn = c.key
    return (-c.bytes, -c.frames, name or "", client_id or "", address, group or "", txn or "", principal or "",
            version or "", source)


def _order(ident: tuple) -> tuple:
    name, topic_id = ident
    return (name == OTHER_TOPIC, name is None, name or "", topic_id or "")


def listing(copied: Copier, refs: list[ConnectionRecord], names: dict[str, str], overflowed: int, *,
            topic: str | None = None, role: str | None = None, group: str | None = None,
            lazy: bool = False) -> dict:
    """GET /api/v1/topics: every topic the records (open and recently closed) named, ordered by
    name ("<other>" and the ids no answer named last). `topic`: that topic only (a name, or an
    id); `role`: topics with at least one client of that role (producer, consumer, admin);
    `group`: only the connections of that consumer group count. A client list past
    MAX_TOPIC_CLIENTS is cut, said in the answer's "cut" (absent when none is).

    `lazy`: "topics" is an iterator of chunks (lists of TOPICS_PER_CHUNK topics), each built
    as it is reached (a response budget that stops reading builds no more), "listed" how many
    it holds, and "notes" a list the cuts are said in as the chunks are built."""
    if role is not None and role not in ROLE_FILTERS:
        raise ValueError(f"unknown role {role!r}; known: {', '.join(ROLE_FILTERS)}")
    wanted = wanted_keys(topic, names) if topic is not None else None
    parts = [part for part in copied(refs, _part, TOPIC_PER_HOLD) if part is not None]
    grouped = _grouped(parts, names, wanted, group)
    entries = []
    for ident in sorted(grouped, key=_order):
        entry = grouped[ident]
        if topic is not None and topic not in ident:  # an id named now listed under its name: still that topic
            if not (ident[0] is not None and names.get(topic) == ident[0]):
                continue
        if role is not None and not entry.roles[role]:
            continue
        entries.append(entry)
    del grouped, parts
    unresolved = sum(1 for entry in entries if entry.topic is None)
    notes: list[str] = []
    if lazy:
        chunks = ([entry.to_dict(notes) for entry in entries[i:i + TOPICS_PER_CHUNK]]
                  for i in range(0, len(entries), TOPICS_PER_CHUNK))
        return {"topics": chunks, "listed": len(entries), "topics_overflowed": overflowed,
                "unresolved_ids": unresolved, "notes": notes}
    body = {"topics": [entry.to_dict(notes) for entry in entries], "topics_overflowed": overflowed,
            "unresolved_ids": unresolved}
    if notes:
        body["cut"] = "; ".join(notes)
    return body
