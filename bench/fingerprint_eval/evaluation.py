"""bench.fingerprint_eval's evaluation: the generator's table with a release or a library left
out (cached per mode), the unannounced connections of a recording and the clients they form as
the registry forms them, each judged alone and as a client (`evaluate`), the right / wrong /
unknown counts and the confusion between libraries (`tally`), and Java left out on synthetic
connections from its source vectors (`library_out`).
"""

from __future__ import annotations

import functools
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from exporter.census.fingerprint import (
    JAVA,
    ClientBasis,
    Fingerprints,
    Inference,
    Observation,
    Unknown,
    observations_from_events,
    range_contains,
)
from tools import gen_fingerprints as gen

WINDOW = 300.0  # the registry's default --sibling-window: a client ends this long after its last connection closed
VERDICTS = ("right", "wrong", "unknown")


def table_without(rows_dir, recordings, leave_out=()) -> Fingerprints:
    """The generator's table without the recordings named in `leave_out`."""
    rows = gen.build_rows(rows_dir, [r for r in recordings if r.name not in leave_out])
    return Fingerprints(rows, gen.releases_of(rows), gen.min_compatible_of(rows), gen.DEFAULT_CLIENT_IDS)


def table_without_library(rows_dir, recordings, library: str) -> Fingerprints:
    """A table that knows nothing of `library`: none of its recordings, rows or default client_ids."""
    rows = [r for r in gen.build_rows(rows_dir, [r for r in recordings if r.library != library])
            if r.library != library]
    client_ids = {lib: pats for lib, pats in gen.DEFAULT_CLIENT_IDS.items() if lib != library}
    return Fingerprints(rows, gen.releases_of(rows), gen.min_compatible_of(rows), client_ids)


@functools.cache
def _recordings() -> tuple:
    return tuple(gen.load_recordings())


@functools.cache
def cached_table(mode: str, key) -> Fingerprints:
    """mode "release": without every recording of release `key` (library, version); "library":
    without library `key`; "in-sample": every recording in. Cached: MIN_EXACT is read at assess()."""
    directory = gen.fingerprints_dir()
    recordings = list(_recordings())
    if mode == "library":
        return table_without_library(directory, recordings, key)
    if mode == "release":
        return table_without(directory, recordings, {r.name for r in recordings if (r.library, r.version) == key})
    return table_without(directory, recordings)


def table_for(mode: str, rec) -> Fingerprints:
    return cached_table(mode, rec.library if mode == "library"
                        else (rec.library, rec.version) if mode == "release" else None)


# -------------------------------------------------------------------------- connections, clients


@dataclass(frozen=True)
class Conn:
    """One connection the census would infer (no KIP-511 name announced on it)."""

    conn_id: str
    key: tuple | None  # (client address, client_id, principal); None: no client_id, judged alone
    first_seen: float
    last_seen: float
    obs: Observation


@dataclass(frozen=True)
class Connections:
    unannounced: tuple[Conn, ...]
    announced: int  # connections that announced their software: never inferred, not judged


def connections(events) -> Connections:
    """The connections of a recording's events that sent a request and announced no software (the
    last accepted ApiVersions exchange carried no name), each with its client's key."""
    observations = observations_from_events(events)
    address: dict[str, str] = {}
    principal: dict[str, str | None] = {}
    name: dict[str, str | None] = {}
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    for e in events:
        kind = type(e).__name__
        first.setdefault(e.conn_id, e.ts)
        last[e.conn_id] = e.ts
        if kind == "ConnectionOpened":
            address[e.conn_id] = e.client_address
        elif kind == "SaslIdentity" and e.outcome == "success":
            principal[e.conn_id] = e.principal
        elif kind == "ClientSoftware" and e.accepted:
            name[e.conn_id] = e.name  # the identity is the last accepted exchange
    out = []
    for conn_id, obs in sorted(observations.items()):
        if name.get(conn_id) is not None:
            continue
        key = None if obs.client_id is None else (address.get(conn_id, "recording"), obs.client_id,
                                                   principal.get(conn_id))
        out.append(Conn(conn_id, key, first[conn_id], last[conn_id], obs))
    return Connections(tuple(out), sum(1 for n in name.values() if n is not None))


def clients_of(conns, window: float = WINDOW) -> list[list[Conn]]:
    """The clients of `conns`, as the registry forms them: one per key, a new one when a connection
    opens more than `window` seconds after every earlier one of the key closed."""
    groups: list[list[Conn]] = []
    current: dict[tuple, list[Conn]] = {}
    for c in sorted(conns, key=lambda c: (c.first_seen, c.conn_id)):
        group = None if c.key is None else current.get(c.key)
        if group is not None and c.first_seen - max(m.last_seen for m in group) > window:
            group = None
        if group is None:
            group = []
            groups.append(group)
            if c.key is not None:
                current[c.key] = group
        group.append(c)
    return groups


def judge(table: Fingerprints, members) -> Inference | Unknown:
    """The members' union, folded and assessed as exporter/census/identity.py's `_fingerprint` and
    pipeline/identity.py's `infer_client` do (one member: the connection alone)."""
    basis = ClientBasis()
    for m in members:
        basis.add_member(m.conn_id, m.first_seen)
        o = m.obs
        basis.fold(o.api_versions_request_version, (*o.first_requests, *o.requests), o.broker_max)
    return table.assess(basis.observation(members[-1].obs.client_id))


def verdict(found: Inference | Unknown, library: str, version: str) -> str:
    if not isinstance(found, Inference):
        return "unknown"
    return "right" if found.name == library and range_contains(found.version_range, version) else "wrong"


# ---------------------------------------------------------------------------------- evaluation


@dataclass(frozen=True)
class Judged:
    conn: Conn
    client: int  # its client's index in the recording
    alone: Inference | Unknown
    together: Inference | Unknown
    v_alone: str
    v_together: str


@dataclass(frozen=True)
class RecordingResult:
    rec: gen.Recording
    conns: tuple[Judged, ...]
    clients: int
    announced: int


@functools.cache
def _connections(name: str) -> Connections:
    return connections(gen.recording_events(name))


def judge_recording(table: Fingerprints, rec, conns: Connections) -> RecordingResult:
    out = []
    groups = clients_of(conns.unannounced)
    for i, group in enumerate(groups):
        together = judge(table, group)
        for c in group:
            alone = judge(table, [c])
            out.append(Judged(c, i, alone, together, verdict(alone, rec.library, rec.version),
                              verdict(together, rec.library, rec.version)))
    return RecordingResult(rec, tuple(sorted(out, key=lambda j: j.conn.conn_id)), len(groups), conns.announced)


def evaluate(mode: str = "release", libraries=None) -> list[RecordingResult]:
    """Every recording (of `libraries`, if given) against the table `mode` builds for it:
    "release" (its release left out), "library" (its library left out) or "in-sample"."""
    return [judge_recording(table_for(mode, rec), rec, _connections(rec.name))
            for rec in _recordings() if libraries is None or rec.library in libraries]


@dataclass
class Tally:
    alone: Counter = field(default_factory=Counter)  # connections, judged alone
    together: Counter = field(default_factory=Counter)  # connections, judged with their client
    clients: Counter = field(default_factory=Counter)  # clients
    confusion_alone: dict = field(default_factory=lambda: defaultdict(Counter))  # true -> named -> connections
    confusion_together: dict = field(default_factory=lambda: defaultdict(Counter))
    wrong_names: Counter = field(default_factory=Counter)  # "name range" -> connections named it wrong

    def add(self, library: str, alone: Inference | Unknown, v_alone: str, together: Inference | Unknown,
            v_together: str, first_of_client: bool) -> None:
        self.alone[v_alone] += 1
        self.together[v_together] += 1
        if first_of_client:
            self.clients[v_together] += 1
        self.confusion_alone[library][alone.name if isinstance(alone, Inference) else "unknown"] += 1
        self.confusion_together[library][together.name if isinstance(together, Inference) else "unknown"] += 1
        for found, v, how in ((alone, v_alone, "alone"), (together, v_together, "as a client")):
            if v == "wrong":
                assert isinstance(found, Inference)
                self.wrong_names[f"{found.name} {found.version_range} ({how})"] += 1

    @property
    def connections(self) -> int:
        return sum(self.alone.values())

    @property
    def wrong(self) -> int:
        """Wrong names: connections alone, connections as clients and clients, together."""
        return self.alone["wrong"] + self.together["wrong"] + self.clients["wrong"]


def tally(results, by_library: bool = False):
    """One Tally of `results` (or one per library)."""
    out: dict[str, Tally] = defaultdict(Tally)
    for r in results:
        t = out[r.rec.library if by_library else ""]
        seen = set()
        for j in r.conns:
            t.add(r.rec.library, j.alone, j.v_alone, j.together, j.v_together, j.client not in seen)
            seen.add(j.client)
    return dict(sorted(out.items())) if by_library else out[""]


# What a silent Java client (before 2.4: no KIP-511 fields) sends on one connection, by role, built
# from its source-derived vectors (every release, where the recordings have one per line).
JAVA_ROLES = {"producer": (3, 0, 22, 10), "consumer": (3, 10, 11, 14, 12, 9, 1, 2), "metadata and produce": (3, 0),
              "metadata": (3,), "admin": (3, 19, 20, 32)}


def java_vectors(directory) -> dict[str, dict[int, int]]:
    """release -> api_key -> the highest version it sends (the generator's Java input)."""
    out: dict[str, dict[int, int]] = {}
    for line in (directory / gen.JAVA_TSV).read_text(encoding="utf-8").splitlines()[1:]:
        release, key, _name, top = line.split("\t")
        out.setdefault(release, {})[int(key)] = int(top)
    return out


def evaluate_java_out() -> Tally:
    """Every silent Java release, in each role, against Tansu's caps, an unknown broker and an
    uncapping one, with Java's default client_id and a set one, inferred by a table with no Java
    rows: each connection alone, and per client the five roles of one release, broker and client_id
    together (a harder test than real clients, whose default client_ids differ per role)."""
    directory = gen.fingerprints_dir()
    table = cached_table("library", JAVA)
    tansu = next(r for r in _recordings() if r.name == "golden/kafkajs").broker_max
    res = Tally()
    for release, vec in java_vectors(directory).items():
        negotiates = release not in gen.JAVA_NO_APIVERSIONS
        if negotiates and vec[18] >= 3:
            continue  # announces itself (KIP-511)
        for b, broker in enumerate((tansu, None, {k: 99 for k in range(100)})):
            for client_id in ("producer-1", "orders-app"):
                members = []
                for role, keys in JAVA_ROLES.items():
                    reqs = {(k, min(vec[k], broker[k]) if broker and negotiates else vec[k]): 1
                            for k in keys if k in vec and (broker is None or k in broker)}
                    obs = Observation(vec[18] if negotiates else None, reqs, tuple(reqs)[:8], client_id, broker)
                    members.append(Conn(f"{release}/{b}/{role}/{client_id}", (release, b, client_id), 0.0, 0.0, obs))
                together = judge(table, members)
                for i, m in enumerate(members):
                    alone = judge(table, [m])
                    res.add(JAVA, alone, verdict(alone, JAVA, release), together, verdict(together, JAVA, release),
                            i == 0)
    return res


def library_out() -> dict[str, Tally]:
    """Leave one library out, per library, with Java's synthetic connections beside its recordings."""
    out = tally(evaluate("library"), by_library=True)
    out[f"{JAVA} (synthetic: before 2.4, from its sources)"] = evaluate_java_out()
    return out
