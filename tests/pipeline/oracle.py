"""The independent computation the fleet pipeline's jobs are compared with
(tests/pipeline/test_pipeline_jobs.py): plain Python over the event-log files, read with
`exporter.eventlog.reader.read_events` (or `parse_line`, skipping the lines it refuses), of the
definitions in pipeline/events.py's and pipeline/jobs.py's docstrings. It imports nothing of
`pipeline`.
"""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path

from capture.kafka.api_table import API_TABLE, REMOVED_IN_KAFKA4
from exporter.eventlog.format import parse_line
from exporter.eventlog.reader import read_events

USED_TYPES = {"ConnectionOpened", "ClientSoftware", "RequestSeen", "SaslIdentity", "TlsSession", "ConnectionClosed",
              "ResponseSeen", "RequestTally", "ConnectionRollup",
              "ApiVersionsAnswer"}  # read for the broker's maxima (pipeline.identity), not as activity
ROLLED = ("RequestTally", "ConnectionRollup")  # request counts per (api_key, api_version): schema 1 tally, schema 2
DAY = 86400.0


_LOG_NAME = re.compile(r"events-\d{8}T\d{6}Z-(?P<host>.+)-\d+\.ndjson\Z")


def log_files(*roots: Path) -> list[Path]:
    """Finished event-log files under `roots`, recursively."""
    return sorted(p for root in roots for p in Path(root).rglob("*.ndjson") if p.is_file())


def records(*roots: Path, lenient: bool = False) -> list[tuple[str, dict]]:
    """(source, record) of every line; `lenient` skips the lines the reader refuses."""
    out = []
    for path in log_files(*roots):
        source = _LOG_NAME.match(path.name)["host"]
        if lenient:
            for line in path.read_bytes().splitlines():
                try:
                    out.append((source, parse_line(line)))
                except ValueError:
                    pass
        else:
            out.extend((source, rec) for rec in read_events(path))
    return out


# A connection's record types that are activity: counted only within [since, until); the
# others (state) are read whatever their ts within the days read (pipeline/events.py).
ACTIVITY = {"RequestSeen", "ResponseSeen", *ROLLED}
TABLE_TYPES = USED_TYPES | {"ConnectionState"}  # what `pipeline ingest` keeps


@dataclass
class Conn:
    first_seen: float | None = None
    client_address: str | None = None
    broker: str | None = None
    listener: str | None = None
    closed: float | None = None
    latest: float = -math.inf  # of any record read
    seen: list = field(default_factory=list)  # ts of its records read but ApiVersionsAnswer
    # (ts, rank, value) of the latest, rank 1 for an event, 0 for a restatement (ConnectionState
    # states what was true before an event at its ts): a tie between two different values would
    # make "last" ambiguous.
    software: tuple = (-math.inf, 0, (None, None))
    client_id: tuple = (-math.inf, 0, None)  # the last a request carried
    state_client_id: tuple = (-math.inf, 0, None)  # else a restatement's
    principal: tuple = (-math.inf, 0, None)  # the last successful SASL (or a restatement's principal)
    cert: tuple = (-math.inf, 0, None)  # the TLS client certificate's subject
    requests: Counter = field(default_factory=Counter)  # (utc day, api_key, api_version) -> count
    api_names: dict = field(default_factory=dict)  # api_key -> name

    @property
    def last_seen(self) -> float:
        return self.capped(max(self.seen))

    def capped(self, ts: float) -> float:
        """Never after its ConnectionClosed (a writer may restate a connection whose close is
        still in its queue, at the later time of a new file)."""
        return ts if self.closed is None else min(ts, self.closed)

    @property
    def end(self) -> float:
        return self.closed if self.closed is not None else self.latest

    def totals(self) -> Counter:
        out: Counter = Counter()
        for (_, k, v), n in self.requests.items():
            out[(k, v)] += n
        return out


def _latest(current: tuple, ts: float, value, rank: int = 1):
    if (ts, rank) == current[:2] and value != current[2]:
        raise AssertionError(f"two values at the same ts {ts}: {current[2]!r} and {value!r}")
    return (ts, rank, value) if (ts, rank) >= current[:2] else current


def whole_days(since: float | None, until: float | None) -> tuple[float | None, float | None]:
    return (None if since is None else math.floor(since / DAY) * DAY,
            None if until is None else math.ceil(until / DAY) * DAY)


def read_records(recs, since: float | None = None, until: float | None = None):
    """The records a run over [since, until) reads: those the table keeps, of the window's whole
    UTC days, activity only within the window."""
    lo, hi = whole_days(since, until)
    for source, r in recs:
        ts = r["ts"]
        if r["type"] not in TABLE_TYPES or (lo is not None and ts < lo) or (hi is not None and ts >= hi):
            continue
        if r["type"] in ACTIVITY and ((since is not None and ts < since) or (until is not None and ts >= until)):
            continue
        yield source, r


def oracle_connections(recs, since: float | None = None, until: float | None = None) -> dict[tuple, Conn]:
    """Connections keyed by (source, conn_id), from the records a run over [since, until) reads
    (pipeline/events.py's model, in plain Python), whether or not connected in the window."""
    conns: dict[tuple, Conn] = defaultdict(Conn)
    for source, r in read_records(recs, since, until):
        ts, kind = r["ts"], r["type"]
        c = conns[(source, r["conn_id"])]
        c.latest = max(c.latest, ts)
        if kind != "ApiVersionsAnswer":
            c.seen.append(ts)
        if kind in ("ConnectionOpened", "ConnectionState"):
            first = r["first_seen"] if kind == "ConnectionState" else ts
            if c.first_seen is None or first < c.first_seen:
                c.first_seen = first
                c.client_address, c.listener = r["client_address"], r["listener"]
                c.broker = f"{r['broker_address']}:{r['broker_port']}"
        if kind == "ConnectionState":
            if r["request_version"] is not None:
                c.software = _latest(c.software, ts, (r["name"], r["version"]), rank=0)
            if r["client_id"] is not None:
                c.state_client_id = _latest(c.state_client_id, ts, r["client_id"], rank=0)
            who = r["principal"] if r["principal"] is not None else r["client_subject"]
            if who is not None:
                c.principal = _latest(c.principal, ts, who, rank=0)
        elif kind == "ConnectionClosed":
            c.closed = ts if c.closed is None else min(c.closed, ts)
        elif kind == "ClientSoftware" and r["accepted"]:
            c.software = _latest(c.software, ts, (r["name"], r["version"]))
        elif kind == "RequestSeen":
            c.requests[(utc_day(ts), r["api_key"], r["api_version"])] += 1
            if r["api_name"] is not None:
                c.api_names[r["api_key"]] = r["api_name"]
            if r["client_id"] is not None:
                c.client_id = _latest(c.client_id, ts, r["client_id"])
        elif kind in ROLLED:  # counts since the previous one (deltas)
            for key, version, n, _ in r["requests"]:
                c.requests[(utc_day(ts), key, version)] += n
                if key in API_TABLE:
                    c.api_names[key] = API_TABLE[key].name
            if r["client_id"] is not None:
                c.client_id = _latest(c.client_id, ts, r["client_id"])
        elif kind == "SaslIdentity" and r["outcome"] == "success":
            c.principal = _latest(c.principal, ts, r["principal"])
        elif kind == "TlsSession":
            c.cert = _latest(c.cert, ts, r["client_subject"])
    return {k: c for k, c in conns.items() if c.first_seen is not None}


def oracle_window(recs, since: float | None = None, until: float | None = None) -> tuple[float, float]:
    """[since, until), an open end replaced by the bound of the UTC days of the records read."""
    read = [r["ts"] for _, r in read_records(recs, since, until)]
    lo = since if since is not None else math.floor(min(read) / DAY) * DAY
    hi = until if until is not None else (math.floor(max(read) / DAY) + 1) * DAY
    return lo, hi


def present(conns: dict[tuple, Conn], since: float, until: float) -> dict[tuple, Conn]:
    """The connections connected within [since, until)."""
    return {k: c for k, c in conns.items() if c.end >= since and c.first_seen < until}


@dataclass
class ConnDay:
    """A connection on one UTC day it was connected: the inventory's unit."""
    conn: Conn
    day: date | None  # None: the whole window (the report's tables)
    last_seen: float | None
    requests: Counter  # (api_key, api_version) -> count


def oracle_days(conns: dict[tuple, Conn], since: float, until: float) -> dict[tuple, ConnDay]:
    """(source, conn_id, day) -> the connection on every UTC day from that of max(first_seen,
    since) to that of min(end, until) (a day only if it overlaps [since, until))."""
    out = {}
    for key, c in present(conns, since, until).items():
        first = math.floor(max(c.first_seen, since) / DAY)
        last = math.ceil(until / DAY) - 1 if c.end >= until else math.floor(c.end / DAY)
        for d in range(first, last + 1):
            day = utc_day(d * DAY)
            seen = [ts for ts in c.seen if ts < (d + 1) * DAY]
            out[(*key, day)] = ConnDay(c, day, c.capped(max(seen)) if seen else None,
                                       Counter({(k, v): n for (dd, k, v), n in c.requests.items() if dd == day}))
    return out


def oracle_whole(conns: dict[tuple, Conn], since: float | None = None, until: float | None = None) -> dict:
    """(source, conn_id) -> the connection over the whole window (no day)."""
    lo, hi = (-math.inf if since is None else since), (math.inf if until is None else until)
    return {k: ConnDay(c, None, c.last_seen, c.totals()) for k, c in present(conns, lo, hi).items()}


def micros(ts: float) -> int:
    return int(ts * 1_000_000)  # what a double becomes as a Spark timestamp (truncated)


def api_label(c: Conn, key: int) -> str:
    return c.api_names.get(key, f"api_{key}")


def principal_of(c: Conn) -> str | None:
    """SASL (or a restatement's principal) wins over the certificate, as on a SASL_SSL broker."""
    return c.principal[2] if c.principal[2] is not None else c.cert[2]


def client_id_of(c: Conn) -> str | None:
    return c.client_id[2] if c.client_id[2] is not None else c.state_client_id[2]


def software_of(c: Conn) -> tuple:
    return c.software[2]


def client_key(c: Conn) -> tuple:
    name, version = software_of(c)
    return (name or "unknown", version or "unknown", client_id_of(c), principal_of(c), c.client_address,
            c.listener, c.broker)


def _days_key(cd: ConnDay) -> tuple:
    return () if cd.day is None else (cd.day,)


def oracle_inventory(rows: dict[tuple, ConnDay]) -> dict[tuple, tuple]:
    """A row per client (and day, for rows of `oracle_days`)."""
    out: dict[tuple, list] = {}
    for cd in rows.values():
        row = out.setdefault((*client_key(cd.conn), *_days_key(cd)), [math.inf, -math.inf, 0, set(), 0])
        row[0] = min(row[0], cd.conn.first_seen)
        if cd.last_seen is not None:
            row[1] = max(row[1], cd.last_seen)
        row[2] += 1
        row[3] |= {f"{api_label(cd.conn, k)} v{v}" for k, v in cd.requests}
        row[4] += sum(cd.requests.values())
    return {k: (micros(first), micros(last), n, sorted(apis), reqs)
            for k, (first, last, n, apis, reqs) in out.items()}


def utc_day(ts: float):
    return datetime.fromtimestamp(ts, UTC).date()


def oracle_adoption(rows: dict[tuple, ConnDay]) -> dict[tuple, tuple]:
    connections: Counter = Counter()
    clients: dict[tuple, set] = defaultdict(set)
    for cd in rows.values():
        key = (cd.day, *client_key(cd.conn)[:2])
        connections[key] += 1
        clients[key].add((client_id_of(cd.conn) or "", principal_of(cd.conn) or "", cd.conn.client_address or ""))
    return {k: (connections[k], len(clients[k])) for k in connections}


def oracle_api_usage(rows: dict[tuple, ConnDay]) -> dict[tuple, int]:
    out: Counter = Counter()
    for cd in rows.values():
        for (k, v), n in cd.requests.items():
            out[(*_days_key(cd), k, api_label(cd.conn, k), v, *client_key(cd.conn)[:2])] += n
    return dict(out)


def oracle_upgrade_readiness(rows: dict[tuple, ConnDay]) -> dict[tuple, tuple]:
    removed = {(k, v) for k, versions in REMOVED_IN_KAFKA4.items() for v in versions}
    out: dict[tuple, list] = {}
    for cd in rows.values():
        for (k, v), n in cd.requests.items():
            if (k, v) in removed:
                minimum = API_TABLE[k].kafka4_min_version if k in API_TABLE else None
                key = (*client_key(cd.conn), *_days_key(cd), k, api_label(cd.conn, k), v, minimum)
                row = out.setdefault(key, [0, 0, -math.inf])
                row[0] += n
                row[1] += 1
                if cd.last_seen is not None:
                    row[2] = max(row[2], cd.last_seen)
    return {k: (n, conns_, micros(last), "4.0") for k, (n, conns_, last) in out.items()}
