"""Leave-one-release-out and leave-one-library-out evaluations of the client fingerprints, per
connection and per client: prints markdown.

    .venv/bin/python -m bench.fingerprint_eval [--sweep] [--in-sample] [--per-connection] [--only unknown]

Every real recording (tests/fixtures/golden/*.json and tests/fixtures/fingerprints/*.pcap with
MANIFEST.json: the earlier clients, the Java client across releases and the Go clients) is decoded
by the capture core. Only the connections the census would infer are judged: those whose last
accepted ApiVersions exchange announced no KIP-511 software name (the name is read only to leave
the others out, never to infer). Each is judged twice against a table that does not know it:

- *per connection*: alone, as a capture that saw only it (the broker's maxima on its listener
  known, as any client's ApiVersions answer gives them to the census);
- *per client*: with the other unannounced connections of its client (the same client address,
  client_id and principal, within the registry's default `--sibling-window`; a connection without
  a client_id is a client of its own), folded into one `exporter.census.fingerprint.ClientBasis` whose
  observation is assessed, as exporter/census/identity.py's `_fingerprint` and pipeline/identity.py's
  `infer_client` do. Every connection of the client gets the client's verdict.

A connection is *right* when it is named the recording's library with a range containing its
true version, *wrong* when it is named anything else, *unknown* when `assess()` names no one.

- **Leave one release out**: the table is rebuilt (tools/gen_fingerprints.build_rows, the
  generator's own derivation) without every recording of the release (a library and version:
  sarama 1.45.2's four recordings go together). Java's rows come from the Kafka sources, every
  release, and its recordings only check them: leaving one out changes no Java row.
- **Leave one library out** (issue 26, the open-world rule): every recording, row and default
  client_id of the library is taken out, as if the census had never seen it: any name is wrong.
  Java is judged on its recordings and, as before they existed, on 750 synthetic silent
  connections built from its source vectors.

Also: the confusion between libraries (per connection and per client), the open-world bar
(`exporter.census.fingerprint.MIN_EXACT`) at other values (`--sweep`), and, with `--only unknown`, the
tables of docs/fingerprints.md's "What `unknown` still means" (per library and release line,
whether one connection alone can be named; which libraries the wire cannot tell apart), generated
from the same evaluations. The exit status is 1 if any table names anything wrong.
Not a speed benchmark: no timing, nothing to compare against a peer.
"""

from __future__ import annotations

import argparse
import functools
import re
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from exporter.census import fingerprint
from exporter.census.basis import FINGERPRINT_THRESHOLD
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

# ------------------------------------------------------------------------------------- tables


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
def _table(mode: str, key) -> Fingerprints:
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
    return _table(mode, rec.library if mode == "library" else (rec.library, rec.version) if mode == "release" else None)


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
    table = _table("library", JAVA)
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


# ------------------------------------------------------------------------------------ markdown


def _rwu(c: Counter) -> str:
    return " / ".join(str(c[v]) for v in VERDICTS)


def summary_markdown(release: Tally, libs: dict[str, Tally]) -> str:
    recorded = Tally()
    for name, t in libs.items():
        if "synthetic" not in name:
            for attr in ("alone", "together", "clients"):
                getattr(recorded, attr).update(getattr(t, attr))
    synthetic = next(t for name, t in libs.items() if "synthetic" in name)
    out = ["### Summary: unannounced connections, right / wrong / unknown", "",
           "| evaluation | connections (clients) | per connection | per client: connections | per client: clients |",
           "|---|---:|---:|---:|---:|"]
    for title, t in (("leave one release out", release), ("leave one library out (any name is wrong)", recorded),
                     ("leave Java out, synthetic (any name is wrong)", synthetic)):
        out.append(f"| {title} | {t.connections} ({sum(t.clients.values())}) | {_rwu(t.alone)} "
                   f"| {_rwu(t.together)} | {_rwu(t.clients)} |")
    return "\n".join(out) + "\n"


def confusion_markdown(t: Tally) -> str:
    out = []
    for title, conf in (("per connection", t.confusion_alone), ("per client", t.confusion_together)):
        cols = sorted({c for row in conf.values() for c in row} - {"unknown"}) + ["unknown"]
        out += [f"Confusion {title} (connections; rows: true library, columns: named):", "",
                "| true \\ named | " + " | ".join(cols) + " |", "|---|" + "---:|" * len(cols)]
        for lib in sorted(conf):
            out.append(f"| {lib} | " + " | ".join(str(conf[lib][c] or "") for c in cols) + " |")
        out.append("")
    return "\n".join(out)


def _releases(results) -> str:
    by_lib: dict[str, set[str]] = defaultdict(set)
    for r in results:
        by_lib[r.rec.library].add(r.rec.version)
    return "; ".join(f"{lib} {', '.join(sorted(v, key=gen.version_key))}" for lib, v in sorted(by_lib.items()))


def release_markdown(results: list[RecordingResult], title: str = "Leave one release out") -> str:
    out = [f"### {title}", "",
           "| recording | library | true version | unannounced connections (clients) | alone: right / wrong / unknown "
           "| as clients: right / wrong / unknown | ranges named (as clients) |",
           "|---|---|---|---:|---:|---:|---|"]
    silent = []
    for r in results:
        if not r.conns:
            silent.append(r)
            continue
        ranges = sorted({j.together.version_range for j in r.conns if j.v_together == "right"
                         and isinstance(j.together, Inference)})
        out.append(f"| {r.rec.name} | {r.rec.library} | {r.rec.version} | {len(r.conns)} ({r.clients}) "
                   f"| {_rwu(Counter(j.v_alone for j in r.conns))} | {_rwu(Counter(j.v_together for j in r.conns))} "
                   f"| {', '.join(f'`{x}`' for x in ranges) or '-'} |")
    t = tally(results)
    out += ["", f"Unannounced connections: {t.connections} in {sum(t.clients.values())} clients. Per connection: "
                + ", ".join(f"{t.alone[v]} {v}" for v in VERDICTS) + ". Per client: "
                + ", ".join(f"{t.together[v]} {v}" for v in VERDICTS) + f" (clients: {_rwu(t.clients)}).",
            "", f"Not judged: {len(silent)} recordings whose every connection announced its software "
                f"({sum(r.announced for r in silent)} connections): " + _releases(silent) + ".", ""]
    return "\n".join(out) + "\n" + confusion_markdown(t)


def library_out_markdown(res: dict[str, Tally]) -> str:
    out = ["### Leave one library out (the table knows nothing of it: any name is wrong)", "",
           "| library left out | unannounced connections (clients) | named alone (wrong) "
           "| named as clients: connections (wrong) | clients (wrong) |",
           "|---|---:|---:|---:|---:|"]
    for lib, t in res.items():
        out.append(f"| {lib} | {t.connections} ({sum(t.clients.values())}) | {t.alone['wrong']} "
                   f"| {t.together['wrong']} | {t.clients['wrong']} |")
    out += ["", f"Wrong names: {sum(t.alone['wrong'] for t in res.values())} connections alone, "
                f"{sum(t.together['wrong'] for t in res.values())} as clients "
                f"({sum(t.clients['wrong'] for t in res.values())} clients)."]
    for lib, t in res.items():
        out += [f"- {lib} named {name}: {n} connections" for name, n in t.wrong_names.most_common()]
    return "\n".join(out) + "\n"


def sweep_markdown(values=(0, 2, 3, 4, 5)) -> str:
    """The open-world bar (fingerprint.MIN_EXACT) chosen on the evaluations: per candidate value, the
    wrong names of both evaluations and what leaving each release out still names right."""
    out = ["### Choosing the open-world bar (exact versions needed without a default client_id)", "",
           "| MIN_EXACT | wrong, library left out: alone / as clients (connections) "
           "| wrong, release left out: alone / as clients | right, release left out: alone / as clients |",
           "|---|---:|---:|---:|"]
    kept = fingerprint.MIN_EXACT
    try:
        for value in values:
            fingerprint.MIN_EXACT = value
            libs = library_out()
            rel = tally(evaluate("release"))
            mark = " (chosen)" if value == kept else " (no bar, before issue 26)" if value == 0 else ""
            out.append(f"| {value}{mark} | {sum(t.alone['wrong'] for t in libs.values())} / "
                       f"{sum(t.together['wrong'] for t in libs.values())} "
                       f"| {rel.alone['wrong']} / {rel.together['wrong']} "
                       f"| {rel.alone['right']} / {rel.together['right']} of {rel.connections} |")
    finally:
        fingerprint.MIN_EXACT = kept
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------- what `unknown` still means


def release_line(library: str, version: str) -> str:
    """Java: the release without its patch (0.10.2, 2.3); others: major.minor."""
    parts = version.split(".")
    return ".".join(parts[:-1]) if library == JAVA else ".".join(parts[:2])


def why(found: Inference | Unknown, conn: Conn) -> str:
    """Why a connection alone stays unknown, in a few words."""
    if not any(k != 18 for k, _ in conn.obs.requests):
        return "nothing but ApiVersions"
    reason = found.reason if isinstance(found, Unknown) else ""
    for pattern, words in ((r"exact version", f"fewer than {fingerprint.MIN_EXACT} exact versions"),
                           (r"several libraries", "several libraries fit"),
                           (r"configured protocol version", "sarama without its default client_id"),
                           (r"default, the versions are not", "its client_id's library never sent these versions"),
                           (r"no recorded release", "no recorded release sends it"),
                           (r"confidence", f"confidence < {FINGERPRINT_THRESHOLD}")):
        if re.search(pattern, reason):
            return words
    return reason or "named wrong"


def lines_markdown(results: list[RecordingResult]) -> str:
    """Per library and release line: whether one connection alone is named (leave one release out)."""
    lines: dict[tuple[str, str], list[RecordingResult]] = defaultdict(list)
    for r in results:
        lines[(r.rec.library, release_line(r.rec.library, r.rec.version))].append(r)
    out = ["| library | line (recorded releases) | unannounced connections | named alone | named as a client "
           "| one connection alone | why the others stay unknown alone |",
           "|---|---|---:|---:|---:|---|---|"]
    loud: list[tuple[str, str, str]] = []  # consecutive lines of one library that announce themselves

    def flush() -> None:
        if loud:
            lib, first, last = loud[0][0], loud[0][1], loud[-1][1]
            releases = ", ".join(v for *_, v in loud)
            out.append(f"| {lib} | {first if first == last else f'{first} to {last}'} ({releases}) | 0 | - | - "
                       "| announces itself (KIP-511) | - |")
            loud.clear()

    for (lib, line), rs in sorted(lines.items(), key=lambda kv: (kv[0][0], gen.version_key(kv[0][1]))):
        judged = [j for r in rs for j in r.conns]
        releases = ", ".join(sorted({r.rec.version for r in rs}, key=gen.version_key))
        if loud and loud[0][0] != lib:
            flush()
        if not judged:
            loud.append((lib, line, releases))
            continue
        flush()
        alone = sum(j.v_alone == "right" for j in judged)
        together = sum(j.v_together == "right" for j in judged)
        can = "every one" if alone == len(judged) else "some" if alone else "none"
        reasons = Counter(why(j.alone, j.conn) for j in judged if j.v_alone != "right")
        out.append(f"| {lib} | {line} ({releases}) | {len(judged)} | {alone} | {together} | {can} | "
                   + ("; ".join(f"{w} ({n})" for w, n in reasons.most_common()) or "-") + " |")
    flush()
    return "\n".join(out) + "\n"


def _agree(a, b) -> tuple[list[int], list[int]] | None:
    """Two rows against a broker that caps neither: (APIs both pin at one same version, APIs that set
    them apart), or None when no first ApiVersions request is theirs alike."""
    if not set(a.apiversions) & set(b.apiversions):
        return None
    ca = {k: (lo, None if hi < 0 else hi) for k, lo, hi in a.constraints}
    cb = {k: (lo, None if hi < 0 else hi) for k, lo, hi in b.constraints}
    same, apart = [], []
    for k in sorted(set(ca) & set(cb)):
        (l1, h1), (l2, h2) = ca[k], cb[k]
        if (h1 is not None and l2 > h1) or (h2 is not None and l1 > h2):
            apart.append(k)
        elif l1 == h1 == l2 == h2:
            same.append(k)
    # A complete row (Java) cannot send an API it lacks: one the other row pins sets them apart.
    apart += sorted(k for k in cb if k not in ca and a.complete) + sorted(k for k in ca if k not in cb and b.complete)
    return same, sorted(set(apart))


def _silent(row) -> bool:
    """A row an unannounced connection can match: not Java 2.4+ (it announces in every v3+)."""
    return not (row.library == JAVA and all(av is not None and av >= 3 for av in row.apiversions))


def _api(key: int) -> str:
    from capture.kafka.api_table import API_TABLE

    spec = API_TABLE.get(key)
    return spec.name if spec is not None else f"api {key}"


def pairs_markdown(table: Fingerprints, least: int = 3) -> str:
    """Pairs of libraries with releases that send the same versions of `least` or more APIs (from the
    table's rows, against a broker that caps neither), and the APIs that set them apart: per pair of
    libraries, the releases that share the most with nothing apart (the same vector), and the
    releases that share the most of all, when they are others."""
    best: dict[tuple[str, str, bool], tuple] = {}  # (library, library, the same vector) -> the closest
    rows = [r for r in table.rows if _silent(r)]
    for a in rows:
        for b in rows:
            if a.library >= b.library:
                continue
            found = _agree(a, b)
            if found is None:
                continue
            same, apart = found
            score = (len(same), -len(apart))
            for key in {(a.library, b.library, not apart), (a.library, b.library, False)}:
                if score > best.get(key, ((-1, 0),))[0]:
                    best[key] = (score, a, b, same, apart)
    out = ["| libraries | closest releases | versions both send | what sets them apart |", "|---|---|---|---|"]
    shown = set()
    # The same vectors first, then by the versions shared.
    order = sorted(best.items(), key=lambda kv: (bool(kv[1][4]), -kv[1][0][0], kv[0]))
    for (x, y, _), (_score, a, b, same, apart) in order:
        if len(same) < least or (a, b) in shown:
            continue
        shown.add((a, b))
        rel = " / ".join(f"{r.versions[0]}{'-' + r.versions[-1] if len(r.versions) > 1 else ''}" for r in (a, b))
        cons = {k: lo for k, lo, _hi in a.constraints}
        out.append(f"| {x} / {y} | {rel} | {len(same)}: " + ", ".join(f"{_api(k)} v{cons[k]}" for k in same)
                   + f" | {', '.join(_api(k) for k in apart) or 'nothing: the same vector'} |")
    return "\n".join(out) + "\n"


def several_markdown(sample: list[RecordingResult], most: int = 8) -> str:
    """The candidates of the recorded connections that stay unknown because several libraries fit
    (every recording in the table): per set of libraries, connections alone and as clients."""
    sets: dict[tuple[str, ...], Counter] = defaultdict(Counter)
    for r in sample:
        for j in r.conns:
            for how, found in (("alone", j.alone), ("as clients", j.together)):
                if isinstance(found, Unknown) and "several libraries" in found.reason:
                    sets[tuple(sorted({c.split(" ", 1)[0] for c in found.candidates}))][how] += 1
    out = ["| candidates (every recording in the table) | connections alone | connections as clients |",
           "|---|---:|---:|"]
    for libs, n in sorted(sets.items(), key=lambda kv: (-sum(kv[1].values()), kv[0]))[:most]:
        out.append(f"| {', '.join(libs)} | {n['alone']} | {n['as clients']} |")
    return "\n".join(out) + "\n"


def unknown_markdown() -> str:
    """The body of docs/fingerprints.md's "What `unknown` still means" (its tables), generated."""
    release = evaluate("release")
    sample = evaluate("in-sample")
    return ("### One connection alone, per library and release line\n\n" + lines_markdown(release)
            + "\n### Libraries the wire cannot tell apart\n\n" + pairs_markdown(_table("in-sample", None))
            + "\n" + several_markdown(sample))


# ----------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fingerprint_eval", description=__doc__.split("\n")[0])
    parser.add_argument("--in-sample", action="store_true", help="also the figures with every recording in the table")
    parser.add_argument("--per-connection", action="store_true", help="list every connection's inference")
    parser.add_argument("--sweep", action="store_true", help="also both evaluations at other open-world bars")
    parser.add_argument("--only", choices=["unknown"],
                        help="unknown: only the tables of docs/fingerprints.md's \"What `unknown` still means\"")
    args = parser.parse_args(argv)
    if args.only == "unknown":
        print(unknown_markdown())
        return 0
    release = evaluate("release")
    libs = library_out()
    print(summary_markdown(tally(release), libs))
    print(release_markdown(release))
    print(library_out_markdown(libs))
    if args.sweep:
        print(sweep_markdown())
    if args.in_sample:
        print(release_markdown(evaluate("in-sample"), "Every recording in the table (in-sample)"))
    if args.per_connection:
        for r in release:
            for j in r.conns:
                alone = j.alone if isinstance(j.alone, Inference) else None
                together = j.together if isinstance(j.together, Inference) else None
                print(f"{r.rec.name:50} {j.conn.conn_id:24} client {j.client:<3} {j.v_alone:8} "
                      f"{alone and (alone.name, alone.version_range)}  {j.v_together:8} "
                      f"{together and (together.name, together.version_range)}")
    wrong = tally(release).wrong + sum(t.wrong for t in libs.values())
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
