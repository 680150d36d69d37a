"""Name a client that does not announce itself, from what its connection sends (issue 15, part 1).

Owns `Observation`, `Inference`, `infer()`, `range_contains()`, `ClientBasis` and
`client_evidence()` (issue 28: a client's connections judged together, one rule for the registry
and the pipeline), the `Fingerprints` table class
(`TABLE`: the generated one; the leave-one-out evaluation builds others), and `observations_from_events()`,
the adapter from the capture core's events to Observations (duck-typed on the events' class
names). Imports only the standard library, its generated table, exporter/census/fingerprint_table.py
(`make regen`; tools/gen_fingerprints.py), and the identity basis (exporter/census/basis.py: the
first requests' bound and the confidence bar, shared with the registry, the event log and the
pipeline). It must not import the registry, the API or the rest of capture: the registry's
identity resolver (exporter/census/identity.py) and pipeline/identity.py call `assess()`.

How: every table row is one release (or a group of Java releases with the same vector) with,
per API, the versions it sends against a broker that does not cap it. A client sends
min(own max, broker max), so an observed version below the broker's max is the client's own;
one equal to it only says the client's max is at least that. A row is consistent when every
observed (api, version) can come from it under the broker's caps, and its ApiVersions request
version (the first on the connection, which carries the client's own max) matches. The
inference names a library only when exactly one library has consistent rows (or the client_id
is that library's default), and enough independent facts agree: a wrong name is worse than
None. The range is cut at the table's releases: never a point the evidence does not pin.
Java 2.4+ announces itself in every ApiVersions v3+ request (KIP-511), so an unannounced
connection whose ApiVersions is v3+ is never named Java: against a broker at Kafka 3.9's
versions, a current client (kafka-ts) would otherwise look exactly like Java 3.9.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from exporter.census import fingerprint_table as _table
from exporter.census.basis import FINGERPRINT_THRESHOLD, MAX_FIRST_REQUESTS

JAVA = "apache-kafka-java"
# Points per fact (confidence = 1 - 0.5 ** points): an exact version (below the broker's cap)
# is one independent fact; a capped one only bounds the client's max from below.
_EXACT, _OPEN_EXACT, _CAPPED, _NO_BROKER = 1.0, 0.5, 0.25, 0.25
_CLIENT_ID = 2.0
# README of kafka-client-fingerprints: "a match narrows the Java release down; it does not prove
# the client is Java" (other libraries send the same versions): one fact less for Java.
_JAVA_DISCOUNT = 1.0
_WIDE_FACTOR = 0.8  # the range spans more than half of the library's known releases
# Exact versions (below the broker's cap) a library must pin before a library whose rows overlap
# none of the observed APIs stops counting as an alternative: several coinciding exact versions
# from a library not recorded with those APIs are unlikely, one or two are not.
_DOMINANT_EXACT = 3
# Open world (issue 26): exact versions the chosen release must pin to be named without its
# library's default client_id. Leaving each library out of the table, the most exact versions an
# unrecorded library shared with a recorded one was 3 (aiokafka and kafka-python: one protocol
# code base), so 4; bench.fingerprint_eval (leave one library out) holds it at 0 wrong names.
MIN_EXACT = 4
MAX_CANDIDATES = 4  # libraries listed as the evidence of an unknown
# Libraries whose request versions follow a protocol version the application configures, not the
# release (issue 28's Go recordings): sarama picks each request's version from config.Version,
# mostly the versions the Java client of that Kafka release sends, as other Java-following clients
# do (kafka-python 2.2.15 sends sarama 1.45.2's Fetch v10, ListOffsets v4, Metadata v7 and
# FindCoordinator v2 on a connection without ApiVersions); and one release sends another's vector
# when configured alike (1.22.1 and 1.23.1 both send all v0 by default). So its versions name it
# only beside its default client_id, and its range is never cut at recorded releases: "*".
CONFIGURED_VERSIONS = frozenset({"sarama"})


@dataclass(frozen=True, slots=True)
class Observation:
    # ApiVersions request version this connection sent first; None: none, on a connection seen
    # from its start (do not infer() a connection picked up mid-stream: None is a fact here)
    api_versions_request_version: int | None
    requests: Mapping[tuple[int, int], int]  # (api_key, api_version) -> count on this connection
    first_requests: tuple[tuple[int, int], ...]  # the first <= 8 (api_key, api_version) in wire order
    client_id: str | None
    broker_max: Mapping[int, int] | None  # api_key -> the broker's max version on this listener; None: unknown


@dataclass(frozen=True, slots=True)
class Inference:
    name: str  # library, e.g. "apache-kafka-java", "kafka-python", "sarama"
    version_range: str  # e.g. "2.0.0-2.0.1", ">=3.7.0", ">0.13.0,<0.15.0"; never a false point
    confidence: float  # 0..1; infer() returns None below FINGERPRINT_THRESHOLD
    evidence: tuple[str, ...]
    min_compatible: str | None  # first release of that library compatible with Kafka 4.0; None unknown


@dataclass(frozen=True, slots=True)
class Unknown:
    """No name: why, and the libraries whose recorded releases could have sent this."""

    reason: str
    candidates: tuple[str, ...]  # "sarama * (api 0 v0, api 3 v0)"; at most MAX_CANDIDATES


def _vkey(v: str) -> tuple:
    return tuple(int(x) for x in re.findall(r"[0-9]+", v))


def _compile_client_ids(patterns: Mapping[str, tuple[str, ...]]) -> dict[str, tuple[re.Pattern, ...]]:
    return {lib: tuple(re.compile(p) for p in pats) for lib, pats in patterns.items()}


class Fingerprints:
    """A table of rows (the generated one by default; the leave-one-out evaluation builds others)."""

    def __init__(self, rows, releases: Mapping[str, tuple[str, ...]], min_compatible: Mapping[str, str | None],
                 client_ids: Mapping[str, tuple[str, ...]]) -> None:
        self.rows = tuple(rows)
        self.constraints = [{k: (lo, hi) for k, lo, hi in r.constraints} for r in self.rows]
        self.releases = dict(releases)
        self.min_compatible = dict(min_compatible)
        self.client_ids = _compile_client_ids(client_ids)

    def default_client_id_of(self, client_id: str | None) -> str | None:
        if not client_id:
            return None
        for lib, pats in self.client_ids.items():
            if any(p.fullmatch(client_id) for p in pats):
                return lib
        return None

    def fit(self, i: int, obs: Observation, pairs: Iterable[tuple[int, int]]):
        """(points, evidence) if row i can have sent this observation, else None."""
        row = self.rows[i]
        cons = self.constraints[i]
        bmax = obs.broker_max or {}
        points = 0.0
        evidence: list[str] = []
        overlap = exact = 0  # observed APIs this row has a constraint for; of them, pinned below the cap
        av = obs.api_versions_request_version
        if av is not None:
            if row.library == JAVA and av >= 3:
                # KIP-511: Java 2.4+ fills client_software_name in every ApiVersions v3+ request, so
                # an unannounced connection that sent v3+ is not Java (infer() only sees those).
                return None
            if av in row.apiversions:
                points += 1.0
                evidence.append(f"ApiVersions v{av} first")
            else:
                # The first ApiVersions request carries the client's own max whatever the broker (a
                # refused one is retried, README caveats, but the first is what Observation holds).
                return None
        elif None not in row.apiversions:
            return None  # this release opens every connection with ApiVersions
        elif not row.negotiates:
            points += 0.5
            evidence.append("no ApiVersions request")
        for key, ver in pairs:
            c = cons.get(key)
            if c is None:
                if row.complete:
                    return None  # this release cannot send that API
                continue  # not in the recording: says nothing
            overlap += 1
            lo, hi = c
            top = None if hi < 0 else hi
            b = bmax.get(key)
            if not row.negotiates:
                if not (lo <= ver and (top is None or ver <= top)):
                    return None
                points += _EXACT
                exact += 1
                evidence.append(f"api {key} v{ver}")
                continue
            if b is None:  # the broker's cap unknown: only the client's max is bounded
                if top is not None and ver > top:
                    return None
                points += _NO_BROKER
                continue
            low = min(lo, b)
            high = b if top is None else min(top, b)
            if not low <= ver <= high:
                return None
            if ver < b and top is not None and (lo == top or not row.complete):
                # the release sends exactly this when uncapped (a recording's range: it was seen
                # sending each end; Java's Fetch floor is a may, not a seen, and pins nothing)
                points += _EXACT
                exact += 1
                evidence.append(f"api {key} v{ver} (broker max {b})")
            elif ver < b and top is None:
                points += _OPEN_EXACT  # the client's own max, and the recording said at least lo
                exact += 1
                evidence.append(f"api {key} v{ver} (broker max {b})")
            else:
                points += _CAPPED  # at the cap, or inside a range the release may pick from
        return points, evidence, overlap, exact

    def range_of(self, library: str, matched: list[str], complete: bool) -> str:
        if library in CONFIGURED_VERSIONS:
            return "*"  # any release, configured alike, may send the vector
        releases = self.releases[library]
        idx = sorted(releases.index(v) for v in matched)
        i, j = idx[0], idx[-1]
        if complete:  # Java: every release is in the table; anything newer than its last may match too
            if j == len(releases) - 1:
                return f">={releases[i]}"
            return releases[i] if i == j else f"{releases[i]}-{releases[j]}"
        # Recorded releases are samples: the truth may lie anywhere up to the next recorded release.
        parts = []
        if i > 0:
            parts.append(f">{releases[i - 1]}")
        if j < len(releases) - 1:
            parts.append(f"<{releases[j + 1]}")
        return ",".join(parts) or "*"

    def assess(self, obs: Observation) -> Inference | Unknown:
        """The inference, or why there is none and which libraries could have sent this (see the
        module doc: the open-world rule)."""
        pairs = sorted(set(obs.requests) | set(obs.first_requests))
        pairs = [p for p in pairs if p[0] != 18]  # ApiVersions is judged by its first version
        by_lib: dict[str, list[tuple[int, float, list[str], int]]] = {}
        reach: dict[str, tuple[int, int]] = {}  # library -> (most APIs overlapped, most exact) by one row
        for i, row in enumerate(self.rows):
            fit = self.fit(i, obs, pairs)
            if fit is not None:
                by_lib.setdefault(row.library, []).append((i, fit[0], fit[1], fit[3]))
                o, e = reach.get(row.library, (0, 0))
                reach[row.library] = (max(o, fit[2]), max(e, fit[3]))
        cid_lib = self.default_client_id_of(obs.client_id)
        if not by_lib:
            # No recorded release sends these versions. A default client_id that names its library
            # (kafka-python-2.3.0, kafkajs, "... (github.com/segmentio/kafka-go)") still does: a
            # release not in the table. Java's producer-N names no library, so not Java.
            if cid_lib is None or cid_lib == JAVA or cid_lib not in self.releases or not pairs:
                return Unknown("no recorded release sends these versions", ())
            return Inference(name=cid_lib, version_range="*", confidence=round(1.0 - 0.5 ** _CLIENT_ID, 3),
                             evidence=(f"default client_id {(obs.client_id or '')[:40]!r}",
                                       "no recorded release sends these versions"),
                             min_compatible=self.min_compatible.get(cid_lib))
        if len(by_lib) > 1 and max(e for _, e in reach.values()) >= _DOMINANT_EXACT:
            # A library that fits only because its recordings never used any of the observed APIs
            # (an incomplete row says nothing) gives way to one that pins several of them exactly.
            by_lib = {lib: fits for lib, fits in by_lib.items() if reach[lib][0] > 0}
        if cid_lib is not None and cid_lib not in by_lib:
            return Unknown(f"the client_id is {cid_lib}'s default, the versions are not its",
                           self._candidates(by_lib, pairs))
        if len(by_lib) > 1:
            if cid_lib is None:
                return Unknown("several libraries fit", self._candidates(by_lib, pairs))
            by_lib = {cid_lib: by_lib[cid_lib]}
        ((library, fits),) = by_lib.items()
        best = max(fits, key=lambda f: f[1])
        points = best[1]
        evidence = list(best[2])
        if cid_lib == library:
            points += _CLIENT_ID
            evidence.append(f"default client_id {(obs.client_id or '')[:40]!r}")
        elif library == JAVA:
            points -= _JAVA_DISCOUNT
        matched = [v for i, *_ in fits for v in self.rows[i].versions]
        complete = self.rows[best[0]].complete
        confidence = 1.0 - 0.5 ** max(points, 0.0)
        releases = self.releases[library]
        if len(releases) >= 4 and len(set(matched)) * 2 > len(releases):
            confidence *= _WIDE_FACTOR
        if confidence < FINGERPRINT_THRESHOLD:
            return Unknown(f"confidence {confidence:.2f} < {FINGERPRINT_THRESHOLD}", self._candidates(by_lib, pairs))
        # Open world: the table knows some libraries; a vector is its library's only when it pins
        # more exact versions than an unrecorded library was seen to share (module doc).
        if best[3] < MIN_EXACT and not (cid_lib == library and library != JAVA):
            return Unknown(f"{best[3]} exact version{'s' * (best[3] != 1)}, {MIN_EXACT} needed "
                           "without the library's default client_id", self._candidates(by_lib, pairs))
        if library in CONFIGURED_VERSIONS and cid_lib != library:
            return Unknown(f"{library}'s versions follow its configured protocol version: named only "
                           "with its default client_id", self._candidates(by_lib, pairs))
        if not complete:
            evidence.append("matches recorded " + ", ".join(sorted(set(matched), key=_vkey)))
        return Inference(name=library, version_range=self.range_of(library, matched, complete),
                         confidence=round(confidence, 3), evidence=tuple(evidence[:8]),
                         min_compatible=self.min_compatible.get(library))

    def _candidates(self, by_lib: Mapping[str, list[tuple[int, float, list[str], int]]],
                    pairs: list[tuple[int, int]]) -> tuple[str, ...]:
        """Each library that fits, its range and what pinned it: "sarama * (api 0 v0, api 3 v0)",
        most exact versions first; at most MAX_CANDIDATES. None for a connection that sent nothing
        but ApiVersions: almost every library fits that, and listing them says nothing."""
        if not pairs:
            return ()
        out = []
        for library, fits in by_lib.items():
            best = max(fits, key=lambda f: (f[3], f[1]))
            matched = [v for i, *_ in fits for v in self.rows[i].versions]
            what = ", ".join(e.split(" (")[0] for e in best[2] if e.startswith("api ")) or "no exact version"
            out.append((-best[3], library, f"{library} {self.range_of(library, matched, self.rows[best[0]].complete)}"
                                           f" ({what})"))
        return tuple(text for *_, text in sorted(out)[:MAX_CANDIDATES])

    def infer(self, obs: Observation) -> Inference | None:
        found = self.assess(obs)
        return found if isinstance(found, Inference) else None


# ------------------------------------------------------------------------- a client's connections

# Issue 28: a client (its client address, client_id and principal, within the sibling window)
# spreads its work over connections, each with one or two request kinds; judged alone each is
# ambiguous. Its basis folds what each connection sent first, bounded; every connection of the
# client gets the inference of the union. One rule for the registry (live and replay) and the
# pipeline: both fold `ClientBasis` and call `assess(basis.observation(client_id))`.
MAX_CLIENT_PAIRS = 32  # distinct (api, version) facts a client's basis holds; more are counted, not kept
MAX_CLIENT_MEMBERS = 8  # connection ids a client's evidence names (all of them are counted)
MAX_EVIDENCE = 8  # evidence lines an inference keeps, the client's line last
MAX_EVIDENCE_CHARS = 256  # characters of one evidence line (connection ids are long)
CLIENT_EVIDENCE = "client of "  # how the client's evidence line starts
_MAX_CLIENT_AVS = 8  # distinct ApiVersions request versions kept (the wire may send any int16)
_MAX_LOST = 1024  # distinct dropped facts a basis remembers, so that each is counted once


class ClientBasis:
    """The union of what a client's connections sent. Each (api, version) is a fact of one
    of three kinds, by the broker's cap on the connection that sent it: exact (below the cap: the
    client's own max), capped (at the cap: only a lower bound), or uncapped (the cap unknown).
    The union is a set, so folding order does not change it (but for the bound). `observation()`
    turns it into the one Observation `assess()` judges: a capped fact below a version the client
    sent elsewhere says nothing more and is left out; a connection's ApiVersions request carries
    the client's own max, so the basis keeps the highest first version any connection sent.
    Connections joined mid-stream must not be folded (their "no ApiVersions" is not a fact)."""

    __slots__ = ("exact", "capped", "uncapped", "api_versions", "_members", "member_count",
                 "_lost", "_lost_more", "version")

    def __init__(self) -> None:
        self.exact: dict[tuple[int, int], int] = {}  # pair -> the highest cap it was below
        self.capped: set[tuple[int, int]] = set()
        self.uncapped: set[tuple[int, int]] = set()
        self.api_versions: set[int] = set()  # first ApiVersions request versions seen
        # The MAX_CLIENT_MEMBERS first opened: (first seen, connection id), whatever order they joined in.
        self._members: list[tuple[float, str]] = []
        self.member_count = 0
        # Facts not kept because the basis was full, each once however often it is folded again; at
        # most _MAX_LOST remembered (an API table's worth), any more only counted.
        self._lost: set | None = None
        self._lost_more = 0
        self.version = 0  # bumped whenever the union changes: an assess() of an older one is stale

    def __len__(self) -> int:
        return len(self.exact) + len(self.capped) + len(self.uncapped)

    @property
    def members(self) -> list[str]:
        return [conn_id for _, conn_id in self._members]

    def add_member(self, conn_id: str, first_seen: float = 0.0) -> None:
        self.member_count += 1
        members = self._members
        if len(members) < MAX_CLIENT_MEMBERS or (first_seen, conn_id) < members[-1]:
            bisect.insort(members, (first_seen, conn_id))
            del members[MAX_CLIENT_MEMBERS:]

    def fold(self, api_versions_request_version: int | None, pairs: Iterable[tuple[int, int]],
             broker_max: Mapping[int, int] | None) -> bool:
        """Fold the (api, version) pairs one connection sent (all of them so far: folding again is
        idempotent); True if the union changed."""
        before = self.version
        av = api_versions_request_version
        if av is not None and av not in self.api_versions:
            if len(self.api_versions) < _MAX_CLIENT_AVS:
                self.api_versions.add(av)
                self.version += 1
            else:
                self._lose(("ApiVersions", av))
        for pair in pairs:
            if pair[0] == 18:
                continue  # ApiVersions is judged by its first version
            cap = None if broker_max is None else broker_max.get(pair[0])
            if cap is not None and pair[1] < cap:
                known = self.exact.get(pair)
                if known is not None and known >= cap:
                    continue
                if known is None and len(self) >= MAX_CLIENT_PAIRS:
                    self._lose(pair)
                    continue
                self.exact[pair] = cap
            else:
                kind = self.uncapped if cap is None else self.capped
                if pair in kind:
                    continue
                if len(self) >= MAX_CLIENT_PAIRS:
                    self._lose(pair)
                    continue
                kind.add(pair)
            self.version += 1
        return self.version != before

    def _lose(self, fact: tuple) -> None:
        lost = self._lost
        if lost is None:
            lost = self._lost = set()
        if fact in lost:
            return
        if len(lost) < _MAX_LOST:
            lost.add(fact)
        else:
            self._lost_more += 1

    @property
    def dropped(self) -> int:
        """Facts the full basis did not keep (each counted once, up to _MAX_LOST distinct)."""
        return (0 if self._lost is None else len(self._lost)) + self._lost_more

    def observation(self, client_id: str | None) -> Observation:
        """The Observation of the whole client (see the class doc)."""
        known: dict[int, int] = {}  # api -> the highest exact or uncapped version
        for k, v in (*self.exact, *self.uncapped):
            known[k] = max(known.get(k, -1), v)
        capped: dict[int, int] = {}
        for k, v in self.capped:
            if v > known.get(k, -1):  # (so not an exact one too)
                capped[k] = max(capped.get(k, -1), v)
        broker_max: dict[int, int] = {}
        for (k, _v), cap in self.exact.items():
            broker_max[k] = max(broker_max.get(k, -1), cap)
        broker_max.update(capped)  # at the cap: the exact ones below it stay below it
        pairs = sorted({*self.exact, *self.uncapped, *capped.items()})
        av = max(self.api_versions) if self.api_versions else None
        return Observation(api_versions_request_version=av, requests=dict.fromkeys(pairs, 1),
                           first_requests=tuple(pairs), client_id=client_id, broker_max=broker_max or None)

    def evidence(self, address: str | None, client_id: str | None) -> str:
        """The client's part of an inference's evidence: which connections it judged together."""
        more = self.member_count - len(self._members)
        n = self.member_count
        head = (f"{CLIENT_EVIDENCE}{n} connection{'s' * (n != 1)} from {address} "
                f"with client_id {(client_id or '')[:40]!r}")
        tail = f" and {more} more)" if more > 0 else ")"
        ids = ", ".join(self.members)
        room = MAX_EVIDENCE_CHARS - len(head) - len(tail) - 2
        if len(ids) > room:  # cut visibly: the count says how many there are
            ids = ids[:max(room - 1, 0)] + "…"
        return f"{head} ({ids}{tail}"


def client_evidence(evidence: Iterable[str], basis: ClientBasis, address: str | None,
                    client_id: str | None) -> tuple[str, ...]:
    """An inference's evidence as every connection of a client shows it: its own lines (at most
    MAX_EVIDENCE - 1, each cut to MAX_EVIDENCE_CHARS), then, for a client of several connections,
    the line naming them. The registry and the pipeline both build it here."""
    own = tuple(e[:MAX_EVIDENCE_CHARS] for e in evidence if not e.startswith(CLIENT_EVIDENCE))[:MAX_EVIDENCE - 1]
    return own + (basis.evidence(address, client_id),) if basis.member_count > 1 else own


TABLE = Fingerprints(_table.ROWS, _table.RELEASES, _table.MIN_COMPATIBLE, _table.DEFAULT_CLIENT_IDS)


def infer(obs: Observation) -> Inference | None:
    """The most likely library and release range of an unannounced client, or None (see the module doc)."""
    return TABLE.infer(obs)


def assess(obs: Observation) -> Inference | Unknown:
    """infer(), or why not and the candidates (the registry keeps them as evidence of an unknown)."""
    return TABLE.assess(obs)


def range_contains(version_range: str, version: str) -> bool:
    """Whether `version` lies in a range as infer() writes it ("A", "A-B", ">=A", ">A,<B", "*")."""
    v = _vkey(version)
    for clause in version_range.split(","):
        clause = clause.strip()
        if clause == "*":
            continue
        for op, test in ((">=", lambda a: v >= a), ("<=", lambda a: v <= a),
                         (">", lambda a: v > a), ("<", lambda a: v < a)):
            if clause.startswith(op):
                if not test(_vkey(clause[len(op):])):
                    return False
                break
        else:
            lo, _, hi = clause.partition("-")
            if not _vkey(lo) <= v <= _vkey(hi or lo):
                return False
    return True


# ----------------------------------------------------------------------------- from core events


def observations_from_events(events: Iterable, broker_max: Mapping[int, int] | None = None) -> dict[str, Observation]:
    """One Observation per connection from the capture core's events (RequestSeen, RequestTally,
    ApiVersionsAnswer). ClientSoftware's KIP-511 name and version are never read. A connection
    without its own ApiVersions answer gets `broker_max`, else the last answer of any connection
    in `events` (the same listener is the caller's business)."""
    conns: dict[str, list] = {}
    answers: dict[str, dict[int, int]] = {}
    last_answer: dict[int, int] | None = None
    for e in events:
        kind = type(e).__name__
        if kind == "RequestSeen":
            c = conns.setdefault(e.conn_id, [None, {}, [], None, False])
            if e.api_key == 18 and not c[4]:
                c[0], c[4] = e.api_version, True
            c[1][(e.api_key, e.api_version)] = c[1].get((e.api_key, e.api_version), 0) + 1
            if len(c[2]) < MAX_FIRST_REQUESTS:
                c[2].append((e.api_key, e.api_version))
            if e.client_id is not None:
                c[3] = e.client_id
        elif kind == "RequestTally":
            c = conns.setdefault(e.conn_id, [None, {}, [], None, False])
            for key, ver, count, _bytes in e.requests:
                c[1][(key, ver)] = c[1].get((key, ver), 0) + count
                if len(c[2]) < MAX_FIRST_REQUESTS:
                    c[2].append((key, ver))
            if e.client_id is not None:
                c[3] = e.client_id
        elif kind == "ApiVersionsAnswer" and e.error_code == 0:
            answers[e.conn_id] = last_answer = {k: hi for k, _lo, hi in e.api_ranges}
    fallback = broker_max if broker_max is not None else last_answer
    return {cid: Observation(c[0], dict(c[1]), tuple(c[2]), c[3], answers.get(cid, fallback))
            for cid, c in conns.items()}
