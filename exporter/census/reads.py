"""The registry's reads: the connection listing (copy, filter, order, page) and the client census.

Owns what a REST read does with the records it copies (issue 13: a REST request must not stall
the capture): what is copied of a record per lock hold (`column_chunk`, `record_copy`,
`open_census_part`, `census_copy`), the listing's filters and order (`QUERY_FILTERS`,
`ORDER_FIELDS`, `listing`), and the census (`CensusRow`: closed connections folded into one row per software
name, version, client id, principal and listener, so batch clients that came and went an hour
ago still count; `census_rows` adds the open ones and resolves a client's row to what the client
is inferred to be when listed).

Readers hold the registry's lock only to copy, a bounded chunk of records per hold; filtering,
ordering and building dicts happen on the copies. The chunk sizes keep one hold near a
millisecond at 100k connections (bench/exporter/ measures the longest), and no step of the
work done outside the lock is one long C call: CPython's GIL would stall the capture thread just
the same. The chunked copy itself is the registry's (`ConnectionRegistry._copied`, passed in as
`copied`: it alone knows its lock).

Issue 31: the `topic=` filter (any use; a name, or an id no answer named yet) is decided under
the lock, a chunk of TOPIC_MATCH_PER_HOLD records per hold (a record may hold hundreds of
entries), `group=` like any column; a census row keeps the groups, topics and uses of its
connections (bounded: MAX_ROW_GROUPS, MAX_ROW_TOPICS) and lists them with its roles.

Imports only `exporter.census.record`, `exporter.census.fields` (the connection object's
declaration) and `exporter.census.topickeys` (the topic rules); never imports the registry
(exporter/census/registry.py).
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import islice
from operator import attrgetter

from exporter.census.fields import FIELDS, ORDER_BY, STRING_ORDER
from exporter.census.record import (
    CLIENT_ROW,
    ClientRecord,
    ConnectionRecord,
    InferredIdentity,
    detached,
    identity_source,
    iso_time,
    record_copy,
    request_counts,
)
from exporter.census.topickeys import connection_roles, key_label, wanted_keys

ROWS_PER_HOLD = 512  # records whose slots are copied per hold (one C attrgetter call each)
REQUESTS_PER_HOLD = 512  # request maps (or census parts of open records) copied per hold
CENSUS_PER_HOLD = 64  # census rows (a set and a Counter each) copied per hold
SORT_CHUNK = 2048  # keys sorted per C call; the chunks are merged lazily, up to the limit
# Client addresses a census row lists: it names the hosts of a client, not every spoofable one.
MAX_ROW_ADDRESSES = 32
# Groups and topics a census row lists (issue 31): a client's, not a wildcard consumer's every one.
MAX_ROW_GROUPS = 16
MAX_ROW_TOPICS = 64
TOPIC_MATCH_PER_HOLD = 64  # records whose topic maps a `topic=` filter walks per hold (<= 256 entries each)

# `ConnectionRegistry._copied(items, copy, per_hold, whole=False)`: `[copy(item) for item in
# items]` (`whole`: one copy per chunk), a chunk per hold of the registry's lock.
Copier = Callable[..., list]

# order_by field (the connection object's name, exporter/census/fields.py) -> record slot
# (None: idle_seconds, computed from "now"); the string ones order by code point.
ORDER_FIELDS: dict[str, str | None] = {name: FIELDS[name].slot for name in ORDER_BY}
# filter (the REST query parameter) -> record slot; "address" is the client's or the broker's.
QUERY_FILTERS: dict[str, str | None] = {
    "listener": "listener",
    "client_software_name": "software_name",
    "client_software_version": "software_version",
    "client_id": "client_id",
    "principal": "principal",
    "address": None,
    "inferred_software_name": None,  # the name a sibling or a fingerprint gave (inferred_software.name)
    "identity_source": "identity_source",  # computed per record as it is copied (identity_source())
    "close_reason": "close_reason",
    "topic": None,  # any use of the topic (`topic_keys`: its name, the ids mapped to it, the value as an id)
    "group": "group_id",
}

# filter of the census listing (`census_rows`) -> a census row's field, matched exactly;
# "inferred_software_name" is `inferred_software.name`.
CLIENT_FILTERS = ("listener", "client_software_name", "client_software_version", "client_id", "principal",
                  "identity_source", "inferred_software_name", "topic", "group")

# The fields a listing filters and orders by, copied as one list per field per chunk: no
# container per record, so a copy of 100k records gives the cyclic collector little to scan.
_COLUMNS = ("first_seen", "id", "state", "closed_at", "last_seen", "client_address", "client_port", "broker_address",
            "listener", "client_id", "software_name", "software_version", "principal", "bytes_from_client",
            "bytes_from_broker", "inferred", "identity_source", "close_reason", "group_id")
_COLUMN_GETTERS = tuple(identity_source if name == "identity_source" else attrgetter(name) for name in _COLUMNS)


# --- what is copied under the lock --------------------------------------------------------------

def column_chunk(recs: list[ConnectionRecord]) -> list[list]:
    return [list(map(get, recs)) for get in _COLUMN_GETTERS]


# --- the connection listing -----------------------------------------------------------------

def checked_query(filters: dict | None, order_by: list[tuple[str, bool]] | tuple) -> dict:
    """`filters` (or none), once the listing's filters and order are known to be valid."""
    filters = filters or {}
    for name in filters:
        if name not in QUERY_FILTERS:
            raise ValueError(f"unknown filter {name!r}; known: {', '.join(QUERY_FILTERS)}")
    if len({name for name, _ in order_by}) != len(order_by) or any(n not in ORDER_FIELDS for n, _ in order_by):
        raise ValueError(f"order_by needs distinct fields of: {', '.join(ORDER_FIELDS)}")
    return filters


def listing(copied: Copier, refs: list[ConnectionRecord], now: float, state: str, filters: dict,
            order_by: list[tuple[str, bool]] | tuple, limit: int | None,
            names: dict[str, str] | None = None) -> tuple[Iterator[list[dict]], int]:
    """The connection listing of `refs` (the registry's `query`): copies first the fields it
    filters and orders by (one list per field, `_COLUMNS`), then, as the page is iterated, the
    page's records (slots and request map); filters, orders and builds the dicts on the copies.
    The page's dicts exist a chunk at a time (the cyclic collector's pause grows with what a
    request keeps alive). A page row is the record as copied for the page, at most milliseconds
    after the copy it was ordered by. `names`: the topic id map (id -> name) the rows' ids are
    named with, and a `topic` filter matches the ids of (`topickeys.wanted_keys`)."""
    if not refs:
        return iter(()), 0
    chunked = dict(zip(_COLUMNS, zip(*copied(refs, column_chunk, ROWS_PER_HOLD, whole=True))))
    columns = {name: [v for chunk in chunks for v in chunk] for name, chunks in chunked.items()}
    index: Sequence[int] = range(len(refs))
    if state != "all":  # closed since the references were taken
        column = columns["state"]
        index = [i for i in index if column[i] == state]
    for name, value in filters.items():
        if name == "address":
            client, broker = columns["client_address"], columns["broker_address"]
            index = [i for i in index if client[i] == value or broker[i] == value]
        elif name == "inferred_software_name":
            inferred = columns["inferred"]
            index = [i for i in index if inferred[i] is not None and inferred[i].name == value]
        elif name == "topic":  # last: the other filters first narrow what the lock is taken for
            continue
        else:
            slot = QUERY_FILTERS[name]
            assert slot is not None  # the filters without a column of their own are above
            column = columns[slot]
            index = [i for i in index if column[i] == value]
    if "topic" in filters:
        wanted = wanted_keys(filters["topic"], names or {})

        def holds(rec: ConnectionRecord) -> bool:  # under the lock
            topics = rec.topics
            return bool(topics) and any(key in wanted for _, key in topics)  # type: ignore[union-attr]

        index = [i for i, ok in zip(index, copied([refs[i] for i in index], holds, TOPIC_MATCH_PER_HOLD)) if ok]
    total = len(index)
    page_refs = [refs[i] for i in _first_in_order(columns, index, order_by, now, total if limit is None else limit)]
    del columns
    return page(copied, page_refs, now, names), total


def page(copied: Copier, recs: list[ConnectionRecord], now: float,
         names: dict[str, str] | None = None) -> Iterator[list[dict]]:
    """The connection objects of `recs`, a chunk of REQUESTS_PER_HOLD at a time, each copied as it is reached."""
    for start in range(0, len(recs), REQUESTS_PER_HOLD):
        copies = copied(recs[start:start + REQUESTS_PER_HOLD], record_copy, REQUESTS_PER_HOLD)
        yield [detached(*copy).to_dict(now, names) for copy in copies]


def _in_order(items: list, limit: int | None = None) -> list:
    """`sorted(items)[:limit]`, one C sort per `SORT_CHUNK` items and a lazy merge (Python code,
    so the GIL changes hands) that stops at `limit`."""
    chunks = [sorted(items[i:i + SORT_CHUNK]) for i in range(0, len(items), SORT_CHUNK)]
    if len(chunks) <= 1:
        return chunks[0][:limit] if chunks else []
    return list(islice(heapq.merge(*chunks), limit))


def _sort_columns(name: str, values: list, desc: bool) -> list[list]:
    """One order_by term as two flat key columns, (is None, value): None last in either
    direction. Flat, so that a row's key is one tuple, not one per term (the collector scans
    every container a request keeps alive)."""
    nulls = [v is None for v in values]
    if name in STRING_ORDER:
        if desc:
            rank = {v: i for i, v in enumerate(_in_order(list({v for v in values if v is not None})))}
            values = [0 if v is None else -rank[v] for v in values]
        else:
            values = ["" if v is None else v for v in values]
    else:
        values = [0 if v is None else (-v if desc else v) for v in values]
    return [nulls, values] if any(nulls) else [values]  # no None: the flags would order nothing


def _first_in_order(columns: dict[str, list], index, terms, now: float, limit: int) -> list[int]:
    """The first `limit` of `index` (positions in the columns) by the terms, ties by
    (first_seen, id): one composite key per row, so a request with every field costs one sort,
    not one per term."""
    if not index or limit <= 0:
        return []
    keys = []
    for name, desc in terms:
        slot = ORDER_FIELDS[name]
        if slot is None:
            closed_at, last_seen = columns["closed_at"], columns["last_seen"]
            values = [max(0.0, (closed_at[i] if closed_at[i] is not None else now) - last_seen[i]) for i in index]
        else:
            column = columns[slot]
            values = [column[i] for i in index]
        keys.extend(_sort_columns(name, values, desc))
    first_seen, ids = columns["first_seen"], columns["id"]
    keys.append([first_seen[i] for i in index])
    keys.append([ids[i] for i in index])
    keys.append(index)  # the position: ids are unique, so never compared
    rows: list = []
    for start in range(0, len(index), SORT_CHUNK):
        rows.extend(zip(*(k[start:start + SORT_CHUNK] for k in keys)))
    del keys
    return [row[-1] for row in _in_order(rows, limit)]


# --- the census -------------------------------------------------------------------------------

@dataclass
class CensusRow:
    """One row of the census: the connections of one census key (`ConnectionRecord.census_key`)."""

    open: int = 0
    total: int = 0
    first_seen: float = float("inf")
    last_seen: float = 0.0
    addresses: set = field(default_factory=set)
    requests: Counter = field(default_factory=Counter)
    # The first folded connection's inference (its evidence names it).
    inferred: InferredIdentity | None = None
    # A client's row (issue 28): the latest client of the key, whose inference the row shows as
    # it is when read.
    client: ClientRecord | None = None
    # Issue 31: its connections' groups, topic keys (at most MAX_ROW_GROUPS, MAX_ROW_TOPICS) and topic uses,
    # made when first needed: a row is kept per closed connection's key, and three empty sets
    # cost ~650 bytes (tests/capture/test_table_memory.py).
    groups: set | None = None
    topics: set | None = None
    uses: set | None = None

    def add(self, first_seen: float, last_seen: float, address: str, requests, group: str | None = None,
            topics: dict | None = None) -> None:
        """Count one connection: its first and last packet, its client address, its requests
        (a `request_key` -> count mapping), its group and its topic map."""
        self.total += 1
        self.first_seen = min(self.first_seen, first_seen)
        self.last_seen = max(self.last_seen, last_seen)
        if len(self.addresses) < MAX_ROW_ADDRESSES:  # a census row names its hosts, not every port
            self.addresses.add(address)
        self.requests.update(requests)
        if group is not None:
            if self.groups is None:
                self.groups = set()
            if len(self.groups) < MAX_ROW_GROUPS:
                self.groups.add(group)
        if topics:
            row_topics = self.topics
            if row_topics is None:
                row_topics = self.topics = set()
            uses = self.uses
            if uses is None:
                uses = self.uses = set()
            for use, key in topics:
                uses.add(use)
                if len(row_topics) < MAX_ROW_TOPICS:
                    row_topics.add(key)

    def add_closed(self, rec: ConnectionRecord) -> None:
        """Count a connection that closed (the registry, under its lock)."""
        if rec.view:
            self.client = rec.client  # the client's inference when read (the latest client of the key)
        self.add(rec.first_seen, rec.last_seen, rec.client_address, rec.requests, rec.group_id, rec.topics)

    def merge(self, other: CensusRow) -> None:
        """Fold in `other`, a row of the same identity: its counts, times, addresses (up to
        MAX_ROW_ADDRESSES in all) and requests."""
        self.open += other.open
        self.total += other.total
        self.first_seen = min(self.first_seen, other.first_seen)
        self.last_seen = max(self.last_seen, other.last_seen)
        for address in other.addresses:
            if len(self.addresses) >= MAX_ROW_ADDRESSES:
                break
            self.addresses.add(address)
        self.requests.update(other.requests)
        if other.groups:
            mine = self.groups = self.groups or set()
            mine.update(list(other.groups)[:max(0, MAX_ROW_GROUPS - len(mine))])
        if other.topics:
            mine = self.topics = self.topics or set()
            mine.update(list(other.topics)[:max(0, MAX_ROW_TOPICS - len(mine))])
        if other.uses:
            self.uses = (self.uses or set()) | other.uses


def census_copy(item: tuple) -> tuple:
    """A (key, row) of the census table, copied (under the lock) with its client's inference now."""
    key, row = item
    client = row.client
    return key, CensusRow(0, row.total, row.first_seen, row.last_seen, set(row.addresses), Counter(row.requests),
                          client.inferred if client is not None else row.inferred, None,
                          set(row.groups) if row.groups else None, set(row.topics) if row.topics else None,
                          set(row.uses) if row.uses else None)


def open_census_part(rec: ConnectionRecord) -> tuple:
    """What the census takes of an open record (under the lock)."""
    topics = rec.topics
    return (rec.census_key(), rec.state == "open", rec.first_seen, rec.last_seen, rec.client_address,
            dict(rec.requests), rec.inferred, rec.group_id, dict(topics) if topics else None)


def _resolved(rows: dict[tuple, CensusRow]) -> dict[tuple, CensusRow]:
    """Census rows with a client's row (issue 28) keyed by what the client is inferred to be now,
    merged with the rows of the same key: one row per identity, however it was learnt."""
    out: dict[tuple, CensusRow] = {}
    for key, row in rows.items():
        marker = key[5]
        if marker is not None and marker[0] == CLIENT_ROW:
            inferred = row.inferred
            key = (*key[:5], None if inferred is None else inferred.census_part())
        into = out.get(key)
        if into is None:
            out[key] = row
        else:
            into.merge(row)
    return out


def checked_client_filters(filters: dict[str, str] | None) -> dict[str, str]:
    filters = filters or {}
    for name in filters:
        if name not in CLIENT_FILTERS:
            raise ValueError(f"unknown filter {name!r}; known: {', '.join(CLIENT_FILTERS)}")
    return filters


def _client_matches(row: dict, filters: dict[str, str]) -> bool:
    for name, value in filters.items():
        if name == "topic":
            if value not in row["topics"]:
                return False
        elif name == "group":
            if value not in row["groups"]:
                return False
        elif name == "inferred_software_name":
            inferred = row["inferred_software"]
            if not inferred or inferred["name"] != value:
                return False
        elif row[name] != value:
            return False
    return True


def census_rows(copied: Copier, census: list[tuple], opened: list[ConnectionRecord],
                filters: dict[str, str], names: dict[str, str] | None = None) -> list[dict]:
    """The census listing (the registry's `clients`): the census table's (key, row) items, then
    the open records (taken after them: a connection closing meanwhile is folded in once at
    most), each copied in chunks; folded, ordered and filtered with the lock free. `names`: the
    topic id map the rows' topics are named with (an id it does not map is listed as the id)."""
    names = names or {}
    rows: dict[tuple, CensusRow] = {}
    for key, row in copied(census, census_copy, CENSUS_PER_HOLD):
        rows[key] = row
    for key, open_, first_seen, last_seen, address, requests, inferred, group, topics in copied(
            opened, open_census_part, REQUESTS_PER_HOLD):
        if not open_:  # closed since: folded into its census row, maybe after that row was copied
            continue
        row = rows.get(key)
        if row is None:
            row = rows[key] = CensusRow(inferred=inferred)
        row.add(first_seen, last_seen, address, requests, group, topics)
        row.open += 1
    out = []
    for (name, version, client_id, principal, listener, inferred_key), row in _resolved(rows).items():
        out.append({
            "client_software_name": name, "client_software_version": version, "client_id": client_id,
            "principal": principal, "listener": listener,
            # "announced": the software fields say who; else how the row's identity was inferred
            "identity_source": "announced" if name is not None else (inferred_key[0] if inferred_key else "none"),
            "inferred_software": row.inferred.to_dict() if inferred_key and row.inferred is not None else None,
            "open_connections": row.open,
            "total_connections": row.total, "first_seen": iso_time(row.first_seen),
            "last_seen": iso_time(row.last_seen), "client_addresses": sorted(row.addresses),
            "requests": request_counts(row.requests),
            "groups": sorted(row.groups or ()),
            "topics": sorted({key_label(k, names) for k in row.topics or ()}),
            "roles": connection_roles([k for k, _ in row.requests], row.uses or ()),
        })
    out.sort(key=lambda r: (r["client_software_name"] or "", r["client_software_version"] or "",
                            r["client_id"] or "", r["listener"], r["identity_source"],
                            r["inferred_software"]["name"] if r["inferred_software"] else "",
                            r["inferred_software"]["version_range"] if r["inferred_software"] else ""))
    if filters:
        out = [r for r in out if _client_matches(r, filters)]
    return out
