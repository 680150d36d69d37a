"""Go clients from the Go module proxy (issue 28 part 2), as the census sees them in the recordings.

tests/fixtures/fingerprints/record.py (install method ``gomod``) built the programs of
tests/fixtures/fingerprints/clients/gomod/<program>/ against one pinned module version each (the
go.mod and go.sum of <program>/<module version>/) and recorded them against a fresh Apache Kafka
3.9.2, and those that do their whole script there against 4.4.0 too: in one pcap each, a run with
the library's default client id, then one with ``-client-id census-go-app``. Here the pcaps are
replayed in-process into the registry, as `kafka-census replay` does (no broker, no Go, no
network; tests/census/test_fingerprint_recordings.py checks replay against tshark's decode), and:

- the recordings are the ones the issue names, each pinned by a committed go.mod that requires
  exactly its module version, and every run did its script (2 produced, 2 consumed, no error);
- the two runs are separate connections: the library's default client ids, then only the set one;
- a client that announces KIP-511 software (franz-go, confluent-kafka-go, sarama from 1.40 with a
  config.Version of 2.4 or later, sarama 1.61 by default) is named on every connection with
  exactly the name and version it announced, on the connection itself or, where the connection
  sent no ApiVersions, through an announcing sibling;
- the others (sarama 1.23 and sarama 1.40-1.45 by default, kafka-go 0.4) are named by
  inference with their own library and a version range that contains the release, or stay
  unknown: never another library.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from tests.census.recordings import HERE, connections, silent_verdicts
from tests.census.recordings import RECORDINGS as MANIFEST

GOMOD = HERE / "clients" / "gomod"
RECORDINGS = {name: e for name, e in MANIFEST.items() if e["installed"]["method"] == "gomod"}
SET_CLIENT_ID = "census-go-app"

#: What issue 28 asks for: module, module version, sarama's -kafka-version (None: the release's
#: default config.Version) -> the brokers it is recorded against. sarama: three IBM releases across
#: its history and the old Shopify path before 1.30, each with its default protocol version and
#: with a recent one (sarama.MaxVersion of the release); franz-go two releases; kafka-go two 0.4.x;
#: confluent-kafka-go one. 4.4 only where the client does its whole script there (record.py).
BOTH = ("apache-kafka 3.9.2", "apache-kafka 4.4.0")
ONLY_3_9 = ("apache-kafka 3.9.2",)
EXPECTED: dict[tuple[str, str, str | None], tuple[str, ...]] = {
    ("github.com/Shopify/sarama", "v1.23.1", None): ONLY_3_9,
    ("github.com/Shopify/sarama", "v1.23.1", "2.3.0"): ONLY_3_9,
    ("github.com/IBM/sarama", "v1.40.1", None): ONLY_3_9,
    ("github.com/IBM/sarama", "v1.40.1", "3.3.2"): ONLY_3_9,
    ("github.com/IBM/sarama", "v1.45.2", None): BOTH,
    ("github.com/IBM/sarama", "v1.45.2", "4.0.0"): BOTH,
    ("github.com/IBM/sarama", "v1.61.1", None): BOTH,
    ("github.com/IBM/sarama", "v1.61.1", "4.3.1"): BOTH,
    ("github.com/twmb/franz-go", "v1.14.0", None): BOTH,
    ("github.com/twmb/franz-go", "v1.22.3", None): BOTH,
    ("github.com/segmentio/kafka-go", "v0.4.42", None): BOTH,
    ("github.com/segmentio/kafka-go", "v0.4.51", None): BOTH,
    ("github.com/confluentinc/confluent-kafka-go/v2", "v2.11.1", None): BOTH,
}
LIBRARY_OF_MODULE = {"github.com/Shopify/sarama": "sarama", "github.com/IBM/sarama": "sarama",
                     "github.com/twmb/franz-go": "franz-go", "github.com/segmentio/kafka-go": "kafka-go",
                     "github.com/confluentinc/confluent-kafka-go/v2": "confluent-kafka-go"}
#: The library's own client ids when the application sets none, as the recordings show them.
#: kafka-go: its Writer's Transport sends an empty client id, its Reader's Dialer
#: "<program>@<host> (github.com/segmentio/kafka-go)" (the recorder's binary is "client").
DEFAULT_CLIENT_IDS = {"sarama": {"sarama"}, "franz-go": {"kgo"}, "confluent-kafka-go": {"rdkafka"},
                      "kafka-go": {"", "client@vm (github.com/segmentio/kafka-go)"}}

#: What each release announces in ApiVersions v3+ (KIP-511), read from its source:
#: - sarama sends ApiVersions v3+ only when config.Version is 2.4 or later (and ApiVersionsRequest
#:   is on, the default); its version string is from the Go build info: 1.40 and 1.45 read the
#:   *main* module's version (broker.go/version.go: bi.Main.Version), which for an application is
#:   "(devel)", sent as "dev"; 1.61 reads its own module's, with Go's "v";
#: - franz-go sends "kgo" and its module version from the build info, with the "v";
#: - confluent-kafka-go sets librdkafka's client.software.name "confluent-kafka-go" and
#:   client.software.version to the linked librdkafka's version.
ANNOUNCES: dict[tuple[str, str | None], tuple[str, str] | None] = {
    ("v1.23.1", None): None,
    ("v1.23.1", "2.3.0"): None,  # sarama 1.23 has no ApiVersions v3 (KIP-511 came in 1.40's line)
    ("v1.40.1", None): None,  # default config.Version 1.0.0
    ("v1.40.1", "3.3.2"): ("sarama", "dev"),
    ("v1.45.2", None): None,  # default config.Version 2.1.0
    ("v1.45.2", "4.0.0"): ("sarama", "dev"),
    ("v1.61.1", None): ("sarama", "v1.61.1"),  # default config.Version 2.8.0
    ("v1.61.1", "4.3.1"): ("sarama", "v1.61.1"),
    ("v1.14.0", None): ("kgo", "v1.14.0"),
    ("v1.22.3", None): ("kgo", "v1.22.3"),
    ("v0.4.42", None): None,  # kafka-go 0.4 sends ApiVersions v0 only
    ("v0.4.51", None): None,
    ("v2.11.1", None): ("confluent-kafka-go", "2.11.1"),
}


def key(e: dict) -> tuple[str, str, str | None]:
    args = e["client_args"]
    return e["module"], f"v{e['version']}", args[args.index("-kafka-version") + 1] if args else None


def announced(e: dict) -> tuple[str, str] | None:
    _, modversion, kafka_version = key(e)
    return ANNOUNCES[(modversion, kafka_version)]


def test_the_recordings_are_the_ones_issue_28_names():
    got: dict[tuple, list[str]] = {}
    for name, e in RECORDINGS.items():
        got.setdefault(key(e), []).append(e["broker"])
        assert e["library"] == LIBRARY_OF_MODULE[e["module"]], name
        variant = f"-v{key(e)[2]}" if key(e)[2] else ""
        line = ".".join(e["broker"].split()[1].split(".")[:2])
        assert name == f"{e['library']}-{e['version']}{variant}-kafka{line}"
    assert {k: tuple(sorted(v)) for k, v in got.items()} == EXPECTED


@pytest.mark.parametrize("name", sorted(RECORDINGS))
def test_each_recording_is_its_pinned_module_version_and_did_its_script(name):
    e = RECORDINGS[name]
    module, modversion, _ = key(e)
    assert e["installed"]["pins"] == [f"{module}@{modversion}"]
    assert f"{module} {modversion}" in e["installed"]["packages"]  # what `go version -m` read off the binary
    pin = HERE / e["installed"]["go_mod"]
    assert pin == GOMOD / Path(e["client_script"]).parent.name / modversion / "go.mod"
    assert re.search(rf"^\s*(require\s+)?{re.escape(module)} {re.escape(modversion)}$", pin.read_text(), re.M)
    assert f"{module} {modversion} h1:" in (pin.parent / "go.sum").read_text()
    # Both runs did the whole script: 2 produced, 2 consumed in a fresh group, no error.
    assert [(r["client_id"], r["exit"], r["timed_out"], r["produced"], r["consumed"]) for r in e["outcome"]] == \
        [(None, 0, False, 2, 2), (SET_CLIENT_ID, 0, False, 2, 2)], e["outcome"]
    assert not [r for r in e["outcome"] if {"error", "produce_error", "group_error"} & set(r)], e["outcome"]


def test_every_pin_directory_is_recorded_and_pins_one_module_version():
    pins = {p.parent for p in GOMOD.glob("*/v*/go.mod")}
    assert pins == {(HERE / e["installed"]["go_mod"]).parent for e in RECORDINGS.values()}
    for pin in pins:
        assert (pin / "go.sum").exists() and (pin.parent / "main.go").exists(), pin


def test_the_shopify_program_is_the_ibm_one_but_for_the_import_path():
    def body(path: Path) -> str:
        text = path.read_text()
        return text[text.index("package main"):]
    ibm, shopify = body(GOMOD / "sarama" / "main.go"), body(GOMOD / "shopify-sarama" / "main.go")
    assert '"github.com/IBM/sarama"' in ibm
    assert shopify == ibm.replace('"github.com/IBM/sarama"', '"github.com/Shopify/sarama"')


@pytest.mark.parametrize("name", sorted(RECORDINGS))
def test_the_two_runs_are_separate_connections_with_their_client_ids(name):
    e = RECORDINGS[name]
    ids = Counter(c["client_id"] for c in connections(name))
    assert set(ids) == DEFAULT_CLIENT_IDS[e["library"]] | {SET_CLIENT_ID}, ids
    assert ids[SET_CLIENT_ID] >= 2 and sum(ids.values()) - ids[SET_CLIENT_ID] >= 2, ids
    assert sorted(e["client_ids"]) == sorted(ids)  # tshark's decode says the same


@pytest.mark.parametrize("name", sorted(n for n, e in RECORDINGS.items() if announced(e)))
def test_an_announcing_client_is_named_with_exactly_what_it_announced(name):
    want = announced(RECORDINGS[name])
    conns = connections(name)
    sources: Counter = Counter()
    for c in conns:
        if c["client_software_name"] is not None:
            assert c["api_versions_request_version"] >= 3, c
            assert (c["client_software_name"], c["client_software_version"]) == want, c
            assert c["inferred_software"] is None, c
            sources["announced"] += 1
        else:
            # A connection that sent no ApiVersions (franz-go before 1.22 asks on one connection
            # per broker): named by its announcing sibling, never by a fingerprint.
            assert c["api_versions_request_version"] is None, c
            inferred = c["inferred_software"]
            assert inferred is not None and inferred["source"] == "sibling", c
            assert (inferred["name"], inferred["version_range"]) == want, c
            sources["sibling"] += 1
    assert sources["announced"] >= 2, sources  # at least one per run


def test_which_clients_announce_is_as_their_sources_say():
    """The expectations above are the wire's: a client announces exactly where ANNOUNCES says."""
    for name, e in RECORDINGS.items():
        assert (e["api_versions_request_version"] is not None and e["api_versions_request_version"] >= 3) == \
            (announced(e) is not None), name


@pytest.mark.parametrize("name", sorted(n for n, e in RECORDINGS.items() if not announced(e)))
def test_a_silent_client_is_named_by_inference_with_its_range_or_unknown(name):
    verdicts = silent_verdicts(name)
    assert sum(verdicts.values()) == RECORDINGS[name]["connections"]
