"""Generator for ``exporter/census/fingerprint_table.py``, the client fingerprints of exporter/census/fingerprint.py.

This module owns the *derivation* of the fingerprint table: which request versions each
client library and release sends, which ApiVersions request version it opens with, and the
default client_id patterns that corroborate a library. It is a build tool, run by hand
(``make regen``) or by the drift test, and lives in tools/, outside the runtime packages: nothing
imports it at runtime, and the generated table does not depend on it. It imports the project's
capture core (to decode the recordings), ``capture.kafka.api_table`` (for the versions Kafka 4.0
removed) and tools/regen.py (the command line and write-or-check rule it shares with
tools/gen_apis.py).

Inputs, read at generation time and never copied into the repository:

* ``<fingerprints>/java-client-max-versions.tsv``: every Apache Kafka release 0.10.0.0-3.9.0
  and the highest request version of each client-facing API its Java client sends by default
  (columns ``release api_key api_name max_request_version``; derived from the release tags of
  apache/kafka up to commit 1eb7644349cb07139d6a3c1ad1986979647cac99, 2024-10-25). Releases
  with identical vectors are grouped.
* ``tests/fixtures/golden/*.json``: six real clients recorded against Tansu (record_golden.py).
* ``tests/fixtures/fingerprints/*.pcap`` with ``MANIFEST.json``: more real client releases. Its
  Java recordings (issue 28: kafka-clients 0.10.2-4.x against Apache Kafka 3.9 and 4.4) give no
  row: the Java rows come from the input above, complete, and the recordings are checked against
  them (``java_disagreements``): a disagreement stops the generator, since the recordings are the
  truth and the generator's facts (or its input) must then be corrected.

A recording gives, per API, the versions its connections sent against *that* broker; the
broker's ApiVersions answer in the same recording says which were capped. A version below the
broker's max is the library's own max (an exact row); a version equal to it only says the
library's max is at least that (an open row). Recording rows are incomplete: an API the
recording did not use says nothing. Java rows are complete: an API a release does not have
excludes it. KIP-511 software names in the recordings are never read.

Usage (from the repository root)::

    python -m tools.gen_fingerprints [--fingerprints DIR] [--check] [--exclude NAME ...]

``DIR`` defaults to ``$KAFKA_FINGERPRINTS_DIR`` (``make regen FINGERPRINTS=DIR`` sets it); there
is no other default (docs/dependencies.md names the input and its version), and without either
the generator says so, naming the variable and what DIR must hold.
``--check`` regenerates in memory and compares with the committed file (exit 1 and a diff on
drift); input errors print one line and exit 2. ``--exclude`` leaves recordings out (the
leave-one-out evaluation, bench/fingerprint_eval/, calls ``build_rows`` directly).
"""

from __future__ import annotations

import argparse
import base64
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from tools import regen
from tools.regen import GenError

REPO_ROOT = Path(__file__).resolve().parents[1]
OUTPUT_REL = "exporter/census/fingerprint_table.py"
OUTPUT_PATH = REPO_ROOT / OUTPUT_REL
JAVA_TSV = "java-client-max-versions.tsv"
FINGERPRINTS = regen.Input(
    "--fingerprints", "KAFKA_FINGERPRINTS_DIR",
    f"{JAVA_TSV}: the highest request version of each client-facing API the Java client of every "
    "Apache Kafka release 0.10.0.0-3.9.0 sends (release tags of apache/kafka up to commit "
    "1eb7644349cb07139d6a3c1ad1986979647cac99)")
GOLDEN_DIR = REPO_ROOT / "tests" / "fixtures" / "golden"
RECORDINGS_DIR = REPO_ROOT / "tests" / "fixtures" / "fingerprints"

JAVA = "apache-kafka-java"

# ----------------------------------------------------------------------------- reviewed facts
# Each fact below is written by hand, with its source; the generator applies them, the drift
# test keeps the table equal to what they give.

# kafka-client-fingerprints/README.md, caveats: "0.10.0.x and 0.10.1.x clients do not
# negotiate at all (no ApiVersions request; they always send their own version)".
JAVA_NO_APIVERSIONS = ("0.10.0.0", "0.10.0.1", "0.10.1.0", "0.10.1.1")
# README caveats: "The 3.1+ consumer sends Fetch <= 12 when a partition has no topic ID": from
# 3.1.0 on, Fetch may be seen anywhere in [12, max] against a broker that supports more.
JAVA_FETCH_FLOOR = ("3.1.0", 1, 12)
# KIP-896 (README "Checks against the repository"): 2.1 is the oldest Java client Kafka 4.0 serves.
JAVA_MIN_COMPATIBLE = "2.1"

# Default client_id of each library when the application sets none (regexes, full match).
# Sources: Java ProducerConfig/ConsumerConfig/AdminClientConfig ("producer-N", "consumer-N",
# "consumer-<group>-N", "adminclient-N"; Streams threads "<app>-<uuid>-StreamThread-N-consumer");
# kafka-python and aiokafka 'client_id': 'kafka-python-' / 'aiokafka-' + __version__; librdkafka
# client.id "rdkafka"; kafkajs clientId "kafkajs"; sarama Config.ClientID "sarama"; kafka-node
# "kafka-node-client".
DEFAULT_CLIENT_IDS: dict[str, tuple[str, ...]] = {
    JAVA: (r"(producer|consumer|adminclient)-[0-9]+", r"consumer-.+-[0-9]+",
           r".+-StreamThread-[0-9]+-(consumer|producer|restore-consumer)"),
    # and, seen in tests/fixtures/fingerprints (MANIFEST client_ids): the producer's
    # "kafka-python-producer-N" / "aiokafka-producer-N", kafka-python 1.x/2.0 "kafka-python1.4.7".
    "kafka-python": (r"kafka-python-?[0-9][0-9a-z.]*", r"kafka-python-(producer|consumer)-[0-9]+"),
    "aiokafka": (r"aiokafka-[0-9][0-9a-z.]*", r"aiokafka-(producer|consumer)-[0-9]+"),
    "librdkafka": (r"rdkafka",),
    "kafkajs": (r"kafkajs",),
    "sarama": (r"sarama",),
    "kafka-node": (r"kafka-node-client",),
    # segmentio kafka-go: "<user>@<host> (github.com/segmentio/kafka-go)" (MANIFEST client_ids)
    "kafka-go": (r".+ \(github\.com/segmentio/kafka-go\)",),
    # franz-go: kgo.ClientID's default "kgo" (pkg/kgo/config.go; MANIFEST client_ids)
    "franz-go": (r"kgo",),
}


# The golden recordings (tests/fixtures/golden/<client>.json): library name and the version whose
# request vector the recording shows. confluent-kafka's vector is librdkafka's: its KIP-511
# version string says "2.16.1-rdkafka-2.16.0" (harness/golden.py EXPECTED_IDENTITY).
GOLDEN_LIBRARIES: dict[str, tuple[str, str | None]] = {
    # golden client: (library, version; None: the recording's client_package_version)
    "aiokafka": ("aiokafka", None),
    "confluent-kafka": ("librdkafka", "2.16.0"),
    "kafka-python": ("kafka-python", None),
    "kafka-ts": ("kafka-ts", None),
    "kafkajs": ("kafkajs", None),
    "platformatic": ("platformatic-kafka", None),
}

# Library names of tests/fixtures/fingerprints/MANIFEST.json entries, folded to one name per
# request-building code base (confluent-kafka-python wheels bundle the librdkafka of the same
# version, MANIFEST notes; kcat is librdkafka underneath).
LIBRARY_ALIASES: dict[str, str] = {
    "confluent-kafka": "librdkafka",
    "confluent-kafka-python": "librdkafka",
    # confluent-kafka-go links the static librdkafka its module ships; MANIFEST fingerprint_version
    # is that librdkafka's version (its KIP-511 client.software.version).
    "confluent-kafka-go": "librdkafka",
    "kcat": "librdkafka",
    "python3-kafka": "kafka-python",
    "segmentio-kafka-go": "kafka-go",
    "@platformatic/kafka": "platformatic-kafka",
    "platformatic": "platformatic-kafka",
}

UNBOUNDED = -1  # a constraint's upper bound when the recording's broker capped the version

# Libraries that fill the KIP-511 software name in every ApiVersions v3+ request they send, so an
# unannounced connection that opened with v3+ is not theirs (the rule exporter/census/fingerprint.py
# applies to Java 2.4+): their rows keep only the connections that opened with ApiVersions v0-v2
# or none, and a recording left with none gives no row. Sources: sarama broker.go (1.40-1.45: the
# fire-and-forget ApiVersionsRequest{Version: 3, ClientSoftwareName: "sarama"}; 1.61:
# sendAndReceiveApiVersions, the same name), franz-go pkg/kgo (cfg.softwareName, "kgo" unless the
# application sets another, sent in every ApiVersions v3+). Both send the Java client's versions of
# some Kafka release (franz-go 1.14 its newest: Java 3.5's; sarama 1.61 by default Java 2.8's): left
# in, a connection of another client with those versions and ApiVersions v3 would be named after
# them (leaving Java out of the table, bench.fingerprint_eval named a Java 3.5 connection franz-go).
ANNOUNCES_IN_EVERY_V3 = ("sarama", "franz-go")


@dataclass(frozen=True)
class Row:
    library: str
    versions: tuple[str, ...]  # releases with this vector, oldest first (Java: grouped; recordings: one)
    apiversions: tuple[int | None, ...]  # first ApiVersions request version of its connections (None: none sent)
    constraints: tuple[tuple[int, int, int], ...]  # (api_key, lo, hi): sent against an uncapping broker; hi -1: >= lo
    complete: bool  # every API it can send is listed (Java) or only what a recording used
    negotiates: bool  # sends min(own max, broker max); False: always its own version (Java 0.10.0/0.10.1)
    source: str


def version_key(v: str) -> tuple:
    """Numeric ordering of release strings ("0.10.2.0" < "2.0.0" < "2.16.0")."""
    return tuple(int(x) for x in re.findall(r"[0-9]+", v))


# ----------------------------------------------------------------------------- Java


def load_java(directory: Path) -> list[Row]:
    path = directory / JAVA_TSV
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise GenError(f"cannot read {path}: {e}") from None
    if not lines or lines[0].split("\t") != ["release", "api_key", "api_name", "max_request_version"]:
        raise GenError(f"{path}: unexpected header {lines[:1]!r}")
    by_release: dict[str, dict[int, int]] = {}
    for n, line in enumerate(lines[1:], 2):
        parts = line.split("\t")
        if len(parts) != 4 or not parts[1].isdigit() or not parts[3].isdigit():
            raise GenError(f"{path}:{n}: malformed row {line!r}")
        vec = by_release.setdefault(parts[0], {})
        if int(parts[1]) in vec:
            raise GenError(f"{path}:{n}: api_key {parts[1]} twice for {parts[0]}")
        vec[int(parts[1])] = int(parts[3])
    releases = sorted(by_release, key=version_key)
    if releases != list(by_release):
        raise GenError(f"{path}: releases are not in version order")
    for r in JAVA_NO_APIVERSIONS:
        if r not in by_release:
            raise GenError(f"{path}: release {r} (named in the generator's reviewed facts) is missing")
    floor_from, floor_key, floor_v = JAVA_FETCH_FLOOR
    rows: list[Row] = []
    for rel in releases:
        vec = by_release[rel]
        if 18 not in vec:
            raise GenError(f"{path}: {rel} has no ApiVersions row")
        cons = []
        for key, mx in sorted(vec.items()):
            floor = key == floor_key and version_key(rel) >= version_key(floor_from) and mx > floor_v
            cons.append((key, floor_v if floor else mx, mx))
        no_av = rel in JAVA_NO_APIVERSIONS
        row = Row(JAVA, (rel,), (None,) if no_av else (vec[18],), tuple(cons), True, not no_av, JAVA_TSV)
        prev = rows[-1] if rows else None
        if prev and (prev.apiversions, prev.constraints, prev.negotiates) == \
                (row.apiversions, row.constraints, row.negotiates):
            rows[-1] = Row(JAVA, prev.versions + (rel,), row.apiversions, row.constraints, True, row.negotiates,
                           JAVA_TSV)
        else:
            rows.append(row)
    return rows


# ----------------------------------------------------------------------------- recordings


@dataclass
class Recording:
    """What one real client recording shows, connection by connection, KIP-511 names left out."""

    name: str  # fixture name, e.g. "golden/aiokafka" or "fingerprints/sarama-1.22.1"
    library: str
    version: str
    connections: list  # per connection: (first ApiVersions request version | None, ((api, version), ...), client_id)
    broker_max: dict[int, int]  # the broker's ApiVersions answer in this recording


def observe_events(events) -> tuple[dict, dict[int, int]]:
    """Per connection id: (first ApiVersions request version | None, requests in order, client_id),
    and the broker's maxima, from core events (RequestSeen, RequestTally, ApiVersionsAnswer).
    ClientSoftware's name and version are never read: the fingerprint must work without them."""
    conns: dict[str, list] = {}
    broker: dict[int, int] = {}
    for e in events:
        kind = type(e).__name__
        if kind == "RequestSeen":
            c = conns.setdefault(e.conn_id, [None, [], None])
            if e.api_key == 18 and c[0] is None and not any(k == 18 for k, _ in c[1]):
                c[0] = e.api_version
            c[1].append((e.api_key, e.api_version))
            if e.client_id is not None:
                c[2] = e.client_id
        elif kind == "RequestTally":
            c = conns.setdefault(e.conn_id, [None, [], None])
            for key, ver, count, _ in e.requests:
                c[1].extend([(key, ver)] * count)
            if e.client_id is not None:
                c[2] = e.client_id
        elif kind == "ApiVersionsAnswer" and e.error_code == 0:
            broker = {k: hi for k, _, hi in e.api_ranges}
    return {k: (v[0], tuple(v[1]), v[2]) for k, v in conns.items()}, broker


def golden_events(path: Path) -> list:
    """The core's events of every connection of one golden recording, in connection order."""
    from capture.kafka import Direction, KafkaConnection

    data = json.loads(path.read_text(encoding="utf-8"))
    events: list = []
    for c in data["connections"]:
        conn = KafkaConnection(f"{data['client']}-{c['index']:03d}")
        last = 0.0
        for d, ts, b64 in c["chunks"]:
            conn.receive(Direction.FROM_CLIENT if d == "c" else Direction.FROM_BROKER, base64.b64decode(b64), ts)
            events.extend(conn.events())
            last = ts
        conn.close("fin", last)
        events.extend(conn.events())
    return events


def replay_pcap(path: Path, port: int) -> list:
    """The core's events of a pcap, replayed as the CLI's `replay` does (without tallies, so every
    request is its own event)."""
    from capture.listeners import Listener, ListenerMap
    from capture.replay import replay

    events: list = []
    replay(str(path), ListenerMap([Listener("fp", port, "PLAINTEXT")]), events.append, tally=False)
    return events


def load_golden(directory: Path = GOLDEN_DIR) -> list[Recording]:
    out = []
    for path in sorted(directory.glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        client = data["client"]
        if client not in GOLDEN_LIBRARIES:
            raise GenError(f"{path}: golden client {client!r} has no library in GOLDEN_LIBRARIES")
        library, version = GOLDEN_LIBRARIES[client]
        conns, broker = observe_events(golden_events(path))
        out.append(Recording(f"golden/{path.stem}", library, version or data["client_package_version"],
                             [conns[k] for k in sorted(conns)], broker))
    return out


def manifest_entries(directory: Path = RECORDINGS_DIR) -> list[dict]:
    """MANIFEST.json's entries whose pcap exists, each with ``_file``, ``_port``, ``_library``
    (folded by LIBRARY_ALIASES) and ``_version`` added."""
    manifest = directory / "MANIFEST.json"
    if not manifest.exists():
        return []
    try:
        data = json.loads(manifest.read_text(encoding="utf-8"))
    except ValueError as e:
        raise GenError(f"{manifest}: {e}") from None
    entries = data.get("recordings", data) if isinstance(data, dict) else data
    if isinstance(entries, dict):
        entries = [dict(v, file=v.get("file", k)) for k, v in entries.items()]
    out = []
    for entry in entries:
        if not isinstance(entry, dict):
            raise GenError(f"{manifest}: an entry is not an object: {entry!r}")
        file = entry.get("file") or entry.get("pcap")
        if not file or "library" not in entry or "version" not in entry:
            raise GenError(f"{manifest}: an entry without file, library or version: {entry!r}")
        if not (directory / file).exists():
            continue  # listed before it was recorded: nothing to derive yet
        library = LIBRARY_ALIASES.get(entry["library"], entry["library"])
        version = str(entry.get("fingerprint_version") or entry["version"])
        port = int(entry["port"])
        out.append(dict(entry, _file=file, _port=port, _library=library, _version=version))
    return sorted(out, key=lambda e: e["_file"])


def load_manifest(directory: Path = RECORDINGS_DIR) -> list[Recording]:
    out = []
    for entry in manifest_entries(directory):
        path = directory / entry["_file"]
        conns, broker = observe_events(replay_pcap(path, entry["_port"]))
        if not conns:
            raise GenError(f"{path}: no Kafka request on port {entry['_port']}")
        out.append(Recording(f"fingerprints/{path.stem}", entry["_library"], entry["_version"],
                             [conns[k] for k in sorted(conns)], broker))
    return out


def load_recordings() -> list[Recording]:
    return load_golden() + load_manifest()


def recording_events(name: str) -> list:
    """The core's events of the recording called `name` (as in Recording.name)."""
    kind, stem = name.split("/", 1)
    if kind == "golden":
        return golden_events(GOLDEN_DIR / f"{stem}.json")
    entry = next(e for e in manifest_entries() if Path(e["_file"]).stem == stem)
    return replay_pcap(RECORDINGS_DIR / entry["_file"], entry["_port"])


def recording_row(rec: Recording) -> Row:
    """A recording's vector: per API, exact where below the broker's max, open where capped. A
    recording with no ApiVersions request at all (sarama before 1.40, and later ones below
    config.Version 2.4; kafka-go 0.2) does not negotiate: it cannot know the broker's versions,
    so the ones it sent are its own, whatever the broker. Of a library in ANNOUNCES_IN_EVERY_V3,
    only the connections that opened with ApiVersions v0-v2 or none count (the row's apiversions
    may then be empty: build_rows leaves such a row out)."""
    seen: dict[int, list[int]] = {}
    avs: set[int | None] = set()
    negotiates = any(av is not None for av, _reqs, _cid in rec.connections)
    for av, reqs, _cid in rec.connections:
        if rec.library in ANNOUNCES_IN_EVERY_V3 and av is not None and av >= 3:
            continue
        avs.add(av)
        for key, ver in reqs:
            if key != 18:
                seen.setdefault(key, []).append(ver)
    cons = []
    for key in sorted(seen):
        lo, hi = min(seen[key]), max(seen[key])
        cap = rec.broker_max.get(key)
        cons.append((key, lo, UNBOUNDED if cap is not None and hi >= cap else hi))
    return Row(rec.library, (rec.version,), tuple(sorted(avs, key=lambda v: -1 if v is None else v)),
               tuple(cons), False, negotiates, rec.name)


def min_compatible(library: str, rows: list[Row]) -> str | None:
    """Java: KIP-896's 2.1. Others: the oldest recorded release from which on every recording used
    only versions Kafka 4.x accepts (None: the newest recorded one does not)."""
    if library == JAVA:
        return JAVA_MIN_COMPATIBLE
    from capture.kafka.api_table import API_TABLE

    def ok(row: Row) -> bool:
        for key, lo, _hi in row.constraints:
            spec = API_TABLE.get(key)
            if spec is None or spec.kafka4_min_version is None or lo < spec.kafka4_min_version:
                return False
        return True

    first = None
    for row in sorted(rows, key=lambda r: version_key(r.versions[0]), reverse=True):
        if not ok(row):
            break
        first = row.versions[0]
    return first


def check_client_ids(recordings: list[Recording]) -> None:
    """A recording's client_id must never be another library's default: the patterns would name it wrong."""
    compiled = {lib: [re.compile(p) for p in pats] for lib, pats in DEFAULT_CLIENT_IDS.items()}
    for rec in recordings:
        for _av, _reqs, cid in rec.connections:
            for lib, pats in compiled.items():
                if lib != rec.library and cid and any(p.fullmatch(cid) for p in pats):
                    raise GenError(f"{rec.name}: client_id {cid!r} matches the default of {lib}, not {rec.library}")


def informative(rec: Recording) -> bool:
    """A recording whose client sent nothing but ApiVersions (it failed against the broker) has no vector."""
    return any(key != 18 for _av, reqs, _cid in rec.connections for key, _v in reqs)


def java_row_of(rows: list[Row], release: str) -> Row | None:
    """The Java row of `release`, or of its line's first release when the input lacks the patch
    (kafka-client-fingerprints/README.md: "No patch release differs from its line's first
    release"; its mirror lacks 3.7.2 and everything after 3.9.0). None: a line the input does not
    have (4.x)."""
    line = ".".join(release.split(".")[:-1])
    for wanted in (release, f"{line}.0"):
        for row in rows:
            if row.library == JAVA and wanted in row.versions:
                return row
    return None


def java_disagreements(rows: list[Row], recordings: list[Recording]) -> list[str]:
    """Where a Java recording sent what its release's row says it cannot: a first ApiVersions
    request of another version, an API the row does not have, a version below the recording
    broker's cap outside the row's [lo, hi] (the client's own max, or the Fetch floor), or one at
    the cap above the row's max. Empty: the table agrees with every recording it covers."""
    out = []
    for rec in recordings:
        if rec.library != JAVA:
            continue
        row = java_row_of(rows, rec.version)
        if row is None:
            continue
        told = f"{rec.name}: {JAVA} {rec.version} (row {row.versions[0]}-{row.versions[-1]})"
        cons = {key: (lo, hi) for key, lo, hi in row.constraints}
        for av, reqs, cid in rec.connections:
            if av not in row.apiversions:
                out.append(f"{told}: connection {cid!r} opened with ApiVersions v{av}, the row says {row.apiversions}")
            for key, ver in sorted(set(reqs)):
                if key == 18:
                    continue
                if key not in cons:
                    out.append(f"{told}: api {key} v{ver} sent, the row has no api {key}")
                    continue
                lo, hi = cons[key]
                cap = rec.broker_max.get(key)
                capped = cap is not None and ver >= cap
                if (capped and ver > hi) or (not capped and not lo <= ver <= hi):
                    out.append(f"{told}: api {key} v{ver} sent (broker max {cap}), the row says "
                               f"{lo if lo == hi else f'{lo}-{hi}'}")
    return sorted(set(out))


def build_rows(fingerprints_dir: Path, recordings: list[Recording]) -> list[Row]:
    check_client_ids(recordings)
    rows = load_java(fingerprints_dir)
    # One row per recording: two recordings of one release (e.g. sarama with another
    # config.Version) are two configurations, each a vector of its own. Java recordings give
    # none: the Java rows above are complete, and java_disagreements checks them against these.
    rec_rows = [recording_row(r) for r in recordings if informative(r) and r.library != JAVA]
    rec_rows = [r for r in rec_rows if r.apiversions]  # ANNOUNCES_IN_EVERY_V3: nothing left to match
    rows += sorted(rec_rows, key=lambda r: (r.library, version_key(r.versions[0]), r.source))
    return rows


# ----------------------------------------------------------------------------- rendering

HEADER = '''"""Client fingerprints for exporter/census/fingerprint.py (generated: see the header).

``ROWS``: one ``FingerprintRow`` per recorded client release (Java: per group of releases with
the same vector). ``constraints`` gives, per API key, the versions the release sends against a
broker that does not cap it: ``(api_key, lo, hi)``, ``hi == -1`` when a recording's broker capped
the version (the library's max is at least ``lo``). ``complete``: every API the release can send
is listed (Java rows); recording rows list only what the recording used. ``negotiates``: it sends
min(own max, broker max); Java 0.10.0/0.10.1 always send their own version.
``DEFAULT_CLIENT_IDS``: full-match regexes of each library's default client_id.
``MIN_COMPATIBLE``: the first release of each library that Kafka 4.0 serves (None: unknown).
``RELEASES``: every release the table knows per library, oldest first (ranges are cut at them).

Imports nothing.
"""'''


def libraries(rows: list[Row]) -> list[str]:
    return sorted({r.library for r in rows}, key=lambda n: (n != JAVA, n))


def releases_of(rows: list[Row]) -> dict[str, tuple[str, ...]]:
    return {lib: tuple(sorted({v for r in rows if r.library == lib for v in r.versions}, key=version_key))
            for lib in libraries(rows)}


def min_compatible_of(rows: list[Row]) -> dict[str, str | None]:
    return {lib: min_compatible(lib, [r for r in rows if r.library == lib]) for lib in libraries(rows)}


def render(rows: list[Row], provenance: list[str]) -> str:
    lines = [
        f"# Generated by `python -m tools.gen_fingerprints` from Java clients' max versions ({JAVA_TSV})",
        "# and the client recordings in tests/fixtures/ (golden/*.json, fingerprints/*.pcap). DO NOT EDIT.",
        HEADER,
        "",
        "from typing import NamedTuple",
        "",
        "",
        "class FingerprintRow(NamedTuple):",
        "    library: str",
        "    versions: tuple[str, ...]  # releases with this vector, oldest first",
        "    apiversions: tuple[int | None, ...]  # first ApiVersions request version per connection; None: none sent",
        "    constraints: tuple[tuple[int, int, int], ...]  # (api_key, lo, hi); hi -1: at least lo",
        "    complete: bool",
        "    negotiates: bool",
        "    source: str",
        "",
        "",
        "# Sources:",
        *[f"#   {p}" for p in provenance],
        "# fmt: off",
        "ROWS: tuple[FingerprintRow, ...] = (",
    ]
    for r in rows:
        lines.append(f"    FingerprintRow({r.library!r}, {r.versions!r}, {r.apiversions!r},")
        lines.append(f"                   {r.constraints!r},")
        lines.append(f"                   {r.complete!r}, {r.negotiates!r}, {r.source!r}),")
    lines += [")", "# fmt: on", "", "DEFAULT_CLIENT_IDS: dict[str, tuple[str, ...]] = {"]
    for lib, pats in DEFAULT_CLIENT_IDS.items():
        lines.append(f"    {lib!r}: {pats!r},")
    lines += ["}", "", "MIN_COMPATIBLE: dict[str, str | None] = {"]
    for lib, first in min_compatible_of(rows).items():
        lines.append(f"    {lib!r}: {first!r},")
    lines += ["}", "", "RELEASES: dict[str, tuple[str, ...]] = {"]
    for lib, rels in releases_of(rows).items():
        lines.append(f"    {lib!r}: {rels!r},")
    lines.append("}")
    return "\n".join(lines) + "\n"


def fingerprints_dir() -> Path:
    """The reference directory from $KAFKA_FINGERPRINTS_DIR (bench/fingerprint_eval/'s way in);
    GenError, naming the variable, when it is unset or missing."""
    return regen.input_dir(None, FINGERPRINTS)


def generate(fingerprints_dir: Path, exclude: tuple[str, ...] = ()) -> str:
    recordings = [r for r in load_recordings() if r.name not in exclude]
    rows = build_rows(fingerprints_dir, recordings)
    wrong = java_disagreements(rows, recordings)
    if wrong:
        raise GenError(f"the Java rows disagree with {len(wrong)} recorded fact(s); the recordings are the truth: "
                       "correct the reviewed facts or the input (docs/fingerprints.md, Java)\n" + "\n".join(wrong))
    # The Java recordings gave no row (only the check above): they are not a source of the table.
    provenance = [f"{JAVA_TSV} (every release 0.10.0.0-3.9.0)"] + [
        f"{r.name} ({r.library} {r.version})" + ("" if informative(r) else ": nothing but ApiVersions, left out")
        for r in recordings if r.library != JAVA]
    return render(rows, provenance)


def main(argv: list[str] | None = None) -> int:
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--exclude", action="append", default=[],
                            help="leave a recording out (e.g. golden/aiokafka)")

    return regen.main(argv, prog="gen_fingerprints", description=f"Generate {OUTPUT_REL} from the Java table and "
                      "the recordings.", spec=FINGERPRINTS, output=OUTPUT_PATH, output_rel=OUTPUT_REL,
                      generate=lambda directory, args: generate(directory, tuple(args.exclude)),
                      add_arguments=add_arguments)


if __name__ == "__main__":
    sys.exit(main())
