"""Tests of exporter/census/fingerprint.py (infer) and its generated table (tools/gen_fingerprints.py).

Java facts are checked against rows of the generator's input (java-client-max-versions.tsv, see
tools/gen_fingerprints.py and docs/dependencies.md) read here directly, not through the
generator; that input is external reference data, named by $KAFKA_FINGERPRINTS_DIR: the tests
that read it (and the drift check) skip, saying so, when it is not set. Real recordings
(tests/fixtures/golden, tests/fixtures/fingerprints) are decoded by the capture core; their
KIP-511 names never reach infer() (Observation has no field for them). A wrong library name
fails every test here; None is allowed where evidence is thin.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from exporter.census import fingerprint_table as table
from exporter.census.basis import FINGERPRINT_THRESHOLD
from exporter.census.fingerprint import (
    JAVA,
    MIN_EXACT,
    Inference,
    Observation,
    Unknown,
    assess,
    infer,
    observations_from_events,
    range_contains,
)
from tools import gen_fingerprints as gen

REPO_ROOT = Path(__file__).resolve().parents[2]
REFERENCE = os.environ.get(gen.FINGERPRINTS.env)
TSV = Path(REFERENCE) / gen.JAVA_TSV if REFERENCE else None
needs_reference = pytest.mark.skipif(
    TSV is None, reason=f"external input: set {gen.FINGERPRINTS.env}=DIR, DIR/{gen.JAVA_TSV} "
    "(docs/dependencies.md), to run the Java checks and the drift check")
UNCAPPED = {k: 99 for k in range(100)}
JAVA_RELEASES = table.RELEASES[JAVA]


def read_tsv() -> dict[str, dict[int, int]]:
    out: dict[str, dict[int, int]] = {}
    if TSV is None:
        return out  # the tests that read it are skipped
    for line in TSV.read_text().splitlines()[1:]:
        rel, key, _name, mx = line.split("\t")
        out.setdefault(rel, {})[int(key)] = int(mx)
    return out


JAVA_VECTORS = read_tsv()


def in_range(inference: Inference) -> list[str]:
    return [r for r in table.RELEASES[inference.name] if range_contains(inference.version_range, r)]


def candidates(found: Inference | Unknown) -> dict[str, str]:
    """An Unknown's candidates: library -> the range it lists ("sarama * (api 0 v0)" -> sarama: *)."""
    assert isinstance(found, Unknown), found
    return dict(c.split(" (")[0].split(" ", 1) for c in found.candidates)


def java_observation(release: str, broker: dict[int, int] | None, client_id: str | None = None) -> Observation:
    """What a Java client of `release` sends when it uses every API it has that `broker` has."""
    vec = JAVA_VECTORS[release]
    negotiates = release not in gen.JAVA_NO_APIVERSIONS
    av = None if not negotiates else vec[18]  # the first ApiVersions request: the client's own max
    reqs = {}
    for key, mx in vec.items():
        if key == 18 or (broker is not None and key not in broker):
            continue
        v = min(mx, broker[key]) if negotiates and broker else mx
        reqs[(key, v)] = 1
    return Observation(av, reqs, tuple(list(reqs)[:8]), client_id, broker)


# --------------------------------------------------------------------------- the generated table


@needs_reference
def test_generated_table_is_up_to_date():
    proc = subprocess.run([sys.executable, "-m", "tools.gen_fingerprints", "--check"], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"run `make regen` (python -m tools.gen_fingerprints):\n{proc.stderr[-4000:]}"


@needs_reference
def test_check_reports_drift(tmp_path, monkeypatch, capsys):
    stale = tmp_path / "fingerprint_table.py"
    stale.write_text(gen.OUTPUT_PATH.read_text().replace("'2.1'", "'2.0'", 1))
    monkeypatch.setattr(gen, "OUTPUT_PATH", stale)
    assert gen.main(["--check"]) == 1
    err = capsys.readouterr().err
    assert "out of date" in err and "-    'apache-kafka-java': '2.0'," in err


def test_missing_reference_dir_is_one_line(tmp_path, capsys):
    assert gen.main(["--fingerprints", str(tmp_path / "nope"), "--check"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not found" in err and "KAFKA_FINGERPRINTS_DIR" in err


def test_no_reference_dir_names_the_variable_and_the_upstream_version(monkeypatch, capsys):
    """No default: a directory beside the checkout is not the repository's to name."""
    monkeypatch.delenv("KAFKA_FINGERPRINTS_DIR", raising=False)
    assert gen.main(["--check"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "set KAFKA_FINGERPRINTS_DIR=DIR or pass --fingerprints DIR" in err
    assert "java-client-max-versions.tsv" in err and "1eb7644349cb07139d6a3c1ad1986979647cac99" in err


@needs_reference
def test_java_rows_cover_every_release_once_and_group_identical_vectors():
    rows = [r for r in table.ROWS if r.library == JAVA]
    releases = [v for r in rows for v in r.versions]
    assert releases == list(JAVA_VECTORS) and len(releases) == 65
    for r in rows:
        vectors = {tuple(sorted(JAVA_VECTORS[v].items())) for v in r.versions}
        assert len(vectors) == 1, r.versions
    for a, b in zip(rows, rows[1:]):  # neighbours differ, else they would be one group
        assert (a.apiversions, a.constraints) != (b.apiversions, b.constraints)
    # The input's derivation notes: 2.0.x ApiVersions 2, Produce 6, Fetch 8, Metadata 6; 0.10.1.x
    # sends no ApiVersions.
    row20 = next(r for r in rows if "2.0.0" in r.versions)
    cons = {k: (lo, hi) for k, lo, hi in row20.constraints}
    assert row20.apiversions == (2,) and (cons[0], cons[1], cons[3]) == ((6, 6), (8, 8), (6, 6))
    assert next(r for r in rows if "0.10.1.0" in r.versions).apiversions == (None,)
    assert table.MIN_COMPATIBLE[JAVA] == "2.1"


# --------------------------------------------------------------------------- Java inference


def announces(release: str) -> bool:
    """KIP-511: Java 2.4+ sends ApiVersions v3+, always with its software name and version."""
    return release not in gen.JAVA_NO_APIVERSIONS and JAVA_VECTORS[release][18] >= 3


SILENT_JAVA = [r for r in JAVA_VECTORS if not announces(r)]


@needs_reference
def test_the_silent_java_releases_are_those_before_2_4():
    assert SILENT_JAVA and max(SILENT_JAVA, key=gen.version_key) == "2.3.1"
    assert min((r for r in JAVA_VECTORS if announces(r)), key=gen.version_key) == "2.4.0"


@needs_reference
@pytest.mark.parametrize("release", SILENT_JAVA)
def test_every_java_release_before_2_4_is_named_with_its_range(release):
    got = infer(java_observation(release, UNCAPPED, "producer-1"))
    assert got is not None and got.name == JAVA and release in in_range(got), got
    assert got.confidence >= FINGERPRINT_THRESHOLD and got.min_compatible == "2.1"
    # Without the default client_id: Java or nothing.
    bare = infer(java_observation(release, UNCAPPED))
    assert bare is None or (bare.name == JAVA and release in in_range(bare))


@needs_reference
@pytest.mark.parametrize("release", [r for r in JAVA_VECTORS if announces(r)])
def test_an_unannounced_apiversions_v3_connection_is_never_named_java(release):
    # Java 2.4+ would have announced itself: its versions, even with its default client_id, name
    # no Java release (kafka-ts against a Kafka 3.9-level broker sends exactly Java 3.9's).
    got = infer(java_observation(release, UNCAPPED, "producer-1"))
    assert got is None or got.name != JAVA, got


def other_libraries_fitting(obs: Observation) -> set[str]:
    """Libraries other than Java with a row that can have sent `obs` (read from the rows, by hand)."""
    from exporter.census import fingerprint as fp

    pairs = sorted(p for p in obs.requests if p[0] != 18)
    rows = fp.TABLE.rows
    return {rows[i].library for i in range(len(rows))
            if rows[i].library != JAVA and fp.TABLE.fit(i, obs, pairs) is not None}


@needs_reference
def test_java_without_client_id_is_named_unless_another_library_sends_the_same():
    unnamed = {}
    for release in SILENT_JAVA:
        obs = java_observation(release, UNCAPPED)
        if infer(obs) is None:
            unnamed[release] = other_libraries_fitting(obs)
    # None only where a recorded library fits too, never for thin evidence: the observation has
    # every API.
    assert all(unnamed.values()), unnamed
    assert len(unnamed) <= 8, unnamed


@needs_reference
@pytest.mark.parametrize("release", [r for r in SILENT_JAVA if r not in gen.JAVA_NO_APIVERSIONS])
def test_a_capped_broker_widens_the_range_and_keeps_the_release(release):
    broker = dict(JAVA_VECTORS["2.0.0"])  # a Kafka 2.0 broker caps newer clients
    broker[18] = 99  # (any ApiVersions version: the first request carries the client's own)
    uncapped = infer(java_observation(release, UNCAPPED, "producer-1"))
    capped = assess(java_observation(release, broker, "producer-1"))
    # A capped broker leaves fewer exact versions than the open world asks (MIN_EXACT): Java stays
    # a candidate, with a range that holds the release and widens where the cap hides newer ones.
    if isinstance(capped, Inference):
        assert capped.name == JAVA and release in in_range(capped)
        capped_range = capped.version_range
    else:
        assert set(candidates(capped)) == {JAVA}, capped
        capped_range = candidates(capped)[JAVA]
    widened = [r for r in JAVA_RELEASES if range_contains(capped_range, r)]
    assert release in widened and set(in_range(uncapped)) <= set(widened)
    if gen.version_key(release) >= (2, 1):
        assert len(widened) > len(in_range(uncapped))


def test_a_version_at_the_broker_cap_only_bounds_from_below():
    # Java 2.1 against a broker whose Produce/Fetch/Metadata stop at 2.1's own maxima: the same
    # request versions 2.2 sends, so 2.1 and 2.2 stay in; 2.0 (Produce 6) does not.
    broker = {0: 7, 1: 10, 3: 7, 18: 2}
    obs = Observation(2, {(0, 7): 3, (1, 10): 9, (3, 7): 1}, ((3, 7), (0, 7), (1, 10)), "producer-1", broker)
    # Every version at the cap pins nothing exactly: no name (open world), Java the one candidate.
    java = candidates(assess(obs))[JAVA]
    assert range_contains(java, "2.1.0") and range_contains(java, "2.2.0") and not range_contains(java, "2.0.1")


# --------------------------------------------------------------------------- thin or ambiguous


def test_only_metadata_is_too_thin():
    assert infer(Observation(None, {(3, 5): 1}, ((3, 5),), None, UNCAPPED)) is None
    assert infer(Observation(None, {(3, 5): 1}, ((3, 5),), None, None)) is None


def test_nothing_at_all_gives_none():
    assert infer(Observation(None, {}, (), None, None)) is None


def test_several_libraries_fitting_give_none():
    # ApiVersions v4 and a Metadata at the broker's cap: the kafka-python 3.0 and kafka-ts recordings
    # both fit (and Java 3.9 would have announced itself).
    obs = Observation(4, {(3, 12): 2}, ((18, 4), (3, 12), (3, 12)), None, {3: 12, 18: 4})
    from exporter.census import fingerprint as fp
    fitting = {fp.TABLE.rows[i].library for i in range(len(fp.TABLE.rows)) if fp.TABLE.fit(i, obs, [(3, 12)])}
    assert {"kafka-python", "kafka-ts"} <= fitting and JAVA not in fitting
    assert infer(obs) is None


@needs_reference
def test_a_client_id_of_another_library_vetoes_the_name():
    obs = java_observation("1.1.0", UNCAPPED, "rdkafka")
    assert infer(obs) is None


def test_a_version_no_release_sends_gives_none():
    # Produce 9 with ApiVersions v1
    obs = Observation(1, {(0, 9): 1, (3, 5): 1}, ((3, 5), (0, 9)), "producer-1", UNCAPPED)
    assert infer(obs) is None


def test_range_contains():
    assert range_contains("2.0.0-2.0.1", "2.0.1") and not range_contains("2.0.0-2.0.1", "2.1.0")
    assert range_contains(">=3.9.0", "4.1.0") and not range_contains(">=3.9.0", "3.8.1")
    assert range_contains(">1.4.7,<2.1.0", "2.0.2") and not range_contains(">1.4.7,<2.1.0", "1.4.7")
    assert range_contains("*", "0.1") and range_contains("0.10.2.0", "0.10.2.0")


# --------------------------------------------------------------------------- open world (issue 26)

# Tansu's caps, as its ApiVersions answer in the golden recordings gives them (the broker)
TANSU = next(r for r in gen.load_recordings() if r.name == "golden/kafkajs").broker_max


@pytest.mark.parametrize("client_id", ["storm", None])
def test_a_produce_v0_and_a_metadata_v0_name_no_one_and_list_sarama_as_a_candidate(client_id):
    # Issue 26: a library with no recording sent these against Tansu and was named "sarama *".
    obs = Observation(None, {(3, 0): 1, (0, 0): 1}, ((3, 0), (0, 0)), client_id, TANSU)
    found = assess(obs)
    assert isinstance(found, Unknown) and infer(obs) is None
    assert "sarama" in candidates(found) and f"{MIN_EXACT} needed" in found.reason
    assert all("api 0 v0" in c for c in found.candidates if c.startswith("sarama"))


def test_an_apiversions_v0_then_a_metadata_v5_names_no_one_and_lists_aiokafka():
    # Issue 26: named "aiokafka >0.12.0" (ApiVersions v0 first, api 3 v5) though no aiokafka sent it.
    obs = Observation(0, {(18, 0): 1, (3, 5): 1}, ((18, 0), (3, 5)), "storm-b", TANSU)
    found = assess(obs)
    assert isinstance(found, Unknown) and candidates(found).get("aiokafka") == ">0.12.0", found


def test_the_default_client_id_of_a_self_naming_library_stands_for_the_missing_exact_versions():
    # The same thin vector with aiokafka's default client_id: the id names its library.
    thin = Observation(0, {(18, 0): 1, (3, 5): 1}, ((18, 0), (3, 5)), "aiokafka-0.14.0", TANSU)
    got = infer(thin)
    assert got is not None and got.name == "aiokafka" and any("default client_id" in e for e in got.evidence)


@needs_reference
def test_java_default_client_ids_do_not_lower_the_bar():
    # "producer-1" is what many clients call themselves: a capped silent Java vector stays a candidate.
    broker = dict(JAVA_VECTORS["2.0.0"])
    found = assess(java_observation("2.1.0", broker, "producer-1"))
    assert isinstance(found, Unknown) and JAVA in candidates(found)


@needs_reference
def test_leaving_each_library_out_names_none_of_its_connections_alone_or_as_clients():
    """bench.fingerprint_eval's leave-one-library-out: a table with no row, recording or default client_id
    of a library names none of its unannounced connections, judged alone or with their client, per
    library, Java included (its recordings, and synthetic connections from its source vectors)."""
    from bench.fingerprint_eval import library_out

    results = library_out()
    wrong = {lib: (t.alone["wrong"], t.together["wrong"], t.clients["wrong"]) for lib, t in results.items()}
    assert {lib: w for lib, w in wrong.items() if any(w)} == {}
    assert sum(t.connections for t in results.values()) > 1000 and len(results) >= 12
    assert sum(sum(t.clients.values()) for t in results.values()) > 200


@needs_reference
def test_the_open_world_bar_is_the_lowest_that_names_no_library_wrong(monkeypatch):
    """MIN_EXACT is chosen on the leave-one-library-out evaluation: one less names some library wrong,
    alone and as a client (when a new recording makes it hold at one less, lower it and rerun
    bench.fingerprint_eval --sweep)."""
    from bench.fingerprint_eval import library_out
    from exporter.census import fingerprint

    monkeypatch.setattr(fingerprint, "MIN_EXACT", MIN_EXACT - 1)
    results = library_out().values()
    assert sum(t.alone["wrong"] for t in results) > 0 and sum(t.together["wrong"] for t in results) > 0


# --------------------------------------------------------------------------- real recordings


RECORDINGS = gen.load_recordings()
THIN_AGAINST_TANSU = {"golden/kafka-python", "golden/kafka-ts", "golden/platformatic"}


@pytest.mark.parametrize("rec", RECORDINGS, ids=[r.name for r in RECORDINGS])
def test_recording_is_never_named_wrong_and_named_where_its_vector_is_its_own(rec):
    observations = observations_from_events(gen.recording_events(rec.name))
    assert observations
    named = 0
    for conn_id, obs in observations.items():
        got = infer(obs)
        if got is None:
            continue
        assert got.name == rec.library, (conn_id, got)
        assert range_contains(got.version_range, rec.version), (conn_id, got)
        named += 1
    # Every recording is named somewhere but those whose vectors pin fewer than MIN_EXACT versions
    # exactly against Tansu (its caps sit at or below their maxima) with no default client_id: the
    # open world leaves them unknown, their library among the candidates. A client that failed
    # against the broker and sent nothing but ApiVersions has no vector. Java 2.4+ (issue 28's
    # recordings) opens every connection with ApiVersions v3+, announcing itself: never inferred.
    if rec.library == JAVA and all(av is not None and av >= 3 for av, _, _ in rec.connections):
        assert named == 0, rec.name
    elif rec.name in THIN_AGAINST_TANSU:
        assert named == 0, rec.name  # a new rule or recording that names it: move it out of the set
        listed = [candidates(f) for o in observations.values() if isinstance(f := assess(o), Unknown) and f.candidates]
        assert any(rec.library in c and range_contains(c[rec.library], rec.version) for c in listed), listed
    elif gen.informative(rec):
        assert named >= 1, rec.name


@needs_reference
def test_leave_one_release_out_never_names_a_wrong_library_and_clients_name_more():
    """bench/fingerprint_eval/'s evaluation: every recording of a release against a table built
    without them, each unannounced connection judged alone and with its client's."""
    from bench.fingerprint_eval import evaluate, tally

    results = evaluate("release")
    wrong = [(r.rec.name, j.conn.conn_id, j.alone, j.together) for r in results for j in r.conns
             if "wrong" in (j.v_alone, j.v_together)]
    assert wrong == []
    t = tally(results)
    assert t.connections > 300 and t.clients["wrong"] == 0
    # The point of judging a client's connections together (issue 28): strictly more named right.
    assert t.together["right"] > t.alone["right"], (t.alone, t.together)
    right = {r.rec.name for r in results if any(j.v_together == "right" for j in r.conns)}
    assert len(right) >= len([r for r in results if r.conns]) // 2, sorted(right)


@needs_reference
def test_the_evaluation_judges_a_client_as_the_census_does():
    """bench.fingerprint_eval's per-client judgment (every recording in the table) is the registry's:
    each unannounced connection of a replayed pcap shows the inference the bench gives its client
    (but those the census names after an announcing sibling)."""
    from bench.fingerprint_eval import evaluate
    from exporter.census.registry import ConnectionRegistry

    compared = 0
    for r in evaluate("in-sample"):
        if not r.rec.name.startswith("fingerprints/") or not r.conns:
            continue  # the golden recordings hold no TCP connection events for the registry
        reg = ConnectionRegistry(clock=lambda: 2e9, closed_ttl=1e12, max_fingerprints_per_second=10 ** 6)
        for ev in gen.recording_events(r.rec.name):
            reg.apply(ev)
        shown = {c["id"]: c["inferred_software"] for c in reg.connections()}
        for j in r.conns:
            inferred = shown[j.conn.conn_id]
            if inferred is not None and inferred["source"] == "sibling":
                continue
            want = (j.together.name, j.together.version_range) if isinstance(j.together, Inference) else None
            assert (inferred and (inferred["name"], inferred["version_range"])) == want, (r.rec.name, j.conn.conn_id)
            compared += 1
    assert compared > 300


def test_a_library_that_pins_several_versions_outweighs_one_never_recorded_with_them():
    # aiokafka 0.14's consumer connection against Tansu (golden/aiokafka): ApiVersions v0, then group
    # APIs below the broker's caps. kafka-node also opens with ApiVersions v0, but its recordings
    # never used these APIs: it is no alternative once aiokafka pins them exactly.
    tansu = {8: 9, 9: 9, 11: 9, 14: 5, 18: 4}
    obs = Observation(0, {(8, 3): 1, (9, 3): 1, (11, 5): 1, (14, 3): 1}, ((18, 0), (11, 5), (14, 3), (9, 3), (8, 3)),
                      "census-aiokafka", tansu)
    got = infer(obs)
    assert got is not None and got.name == "aiokafka" and range_contains(got.version_range, "0.14.0")
    # Two pinned versions are not enough to set kafka-node aside.
    thin = Observation(0, {(9, 3): 1, (14, 3): 1}, ((18, 0), (14, 3), (9, 3)), "census-aiokafka", tansu)
    assert infer(thin) is None


def test_recorded_libraries_get_open_ranges_cut_at_the_neighbouring_recordings():
    from exporter.census.fingerprint import TABLE

    rels = TABLE.releases["kafka-python"]
    assert len(rels) >= 3
    middle = rels[1:2]
    assert TABLE.range_of("kafka-python", middle, complete=False) == f">{rels[0]},<{rels[2]}"
    assert TABLE.range_of("kafka-python", rels[-1:], complete=False) == f">{rels[-2]}"
    assert TABLE.range_of("kafka-python", list(rels), complete=False) == "*"
    assert TABLE.range_of(JAVA, ["3.9.0"], complete=True) == ">=3.9.0"


def test_observations_come_from_core_events_without_kip511_names():
    events = gen.recording_events("golden/platformatic")
    obs = observations_from_events(events)
    assert len(obs) == 4 and all(not hasattr(o, "client_software_name") for o in obs.values())
    first = obs["platformatic-000"]
    assert first.api_versions_request_version == 3 and first.first_requests[0] == (18, 3)
    assert first.broker_max is not None and first.broker_max[1] == 17  # Tansu's Fetch max
    fetch_only = obs["platformatic-003"]  # no ApiVersions of its own: the listener's answer
    assert fetch_only.api_versions_request_version is None and fetch_only.broker_max == first.broker_max


def test_a_self_naming_default_client_id_names_a_release_the_table_lacks():
    # Versions no recorded release sends (a newer kafkajs, say), with kafkajs's default client_id.
    new = Observation(2, {(0, 9): 1, (3, 9): 1}, ((18, 2), (3, 9), (0, 9)), "kafkajs", {0: 11, 3: 12})
    got = infer(new)
    assert got is not None and (got.name, got.version_range) == ("kafkajs", "*")
    assert got.confidence >= FINGERPRINT_THRESHOLD
    # Java's default names no library; nor does an id with nothing sent beside it.
    assert infer(Observation(2, {(0, 9): 1, (3, 9): 1}, ((3, 9), (0, 9)), "producer-1", {0: 11, 3: 12})) is None
    assert infer(Observation(2, {}, ((18, 2),), "kafkajs", {0: 11, 3: 12})) is None


@needs_reference
def test_a_self_naming_client_id_vetoes_another_library_whose_release_fits():
    assert infer(java_observation("1.1.0", UNCAPPED, "kafkajs")) is None
