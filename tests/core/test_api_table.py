"""Tests of the generated Kafka API table (capture/kafka/api_table.py) and its generator.

The expected facts below are written by hand from the upstream sources named in the
comments, not taken from the generator, so that a generator bug cannot confirm itself.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tools import api_schemas, gen_apis

REPO_ROOT = Path(__file__).resolve().parents[2]
API_TABLE_PATH = REPO_ROOT / "capture" / "kafka" / "api_table.py"


def _load(name: str, path: Path):
    """Load a module from its file, without relying on the repo root being on sys.path."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # NamedTuple and dataclasses look their module up
    spec.loader.exec_module(module)
    return module


api_table = _load("_kafka_census_api_table", API_TABLE_PATH)
API_TABLE = api_table.API_TABLE
ApiSpec = api_table.ApiSpec


# --------------------------------------------------------------------------- drift check

# The generator's input is external reference data (docs/dependencies.md), never in the repository:
# the tests that regenerate need it named, and skip, saying how, when it is not.
needs_schemas = pytest.mark.skipif(
    not os.environ.get(api_schemas.SCHEMAS.env),
    reason=f"external input: set {api_schemas.SCHEMAS.env}=DIR, Kafka's message schemas (docs/dependencies.md), "
    "to check for drift")


def require_clients_jar() -> None:
    """The newest Kafka's schemas come from the kafka-clients jar `make setup-kafka` installs (part
    of `make setup`): where the drift check runs (CI sets the schemas variable), a missing jar is
    a failure that says how to install it, never a skip."""
    jar = api_schemas.default_clients_jar()
    if not jar.is_file():
        pytest.fail(f"{jar.relative_to(REPO_ROOT)} is missing: the API table is generated from Apache Kafka "
                    f"{api_schemas.newest_pinned_kafka()}'s message schemas inside it; run `make setup-kafka`",
                    pytrace=False)


@needs_schemas
def test_generated_file_is_up_to_date():
    """Regenerating from Apache Kafka's message schemas (the `make regen` inputs: the kafka-clients
    jar of the newest pinned Kafka and the schemas directory) and kio gives no diff."""
    require_clients_jar()
    proc = subprocess.run(
        [sys.executable, "-m", "tools.gen_apis", "--check"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, (
        f"`python -m tools.gen_apis --check` exited {proc.returncode}; "
        f"run `make regen` if the inputs changed.\n{proc.stderr}"
    )


@needs_schemas
def test_check_reports_drift_with_a_diff(tmp_path, monkeypatch, capsys):
    require_clients_jar()
    stale = tmp_path / "api_table.py"
    stale_text = API_TABLE_PATH.read_text().replace('ApiSpec(0,  "Produce"', 'ApiSpec(0,  "Prodooce"')
    stale.write_text(stale_text)
    monkeypatch.setattr(gen_apis, "OUTPUT_PATH", stale)
    assert gen_apis.main(["--check"]) == 1
    err = capsys.readouterr().err
    assert '-    0:  ApiSpec(0,  "Prodooce"' in err
    assert '+    0:  ApiSpec(0,  "Produce", ' in err
    assert stale.read_text() == stale_text  # --check never writes


def test_missing_schemas_dir_is_one_clear_error(tmp_path, capsys):
    missing = tmp_path / "no-such-dir"
    assert gen_apis.main(["--schemas", str(missing), "--check"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "input directory not found" in err and str(missing) in err and "KAFKA_SCHEMAS_DIR" in err


def test_no_schemas_dir_names_the_variable_and_the_upstream_version(monkeypatch, capsys):
    """No default: a directory beside the checkout is not the repository's to name."""
    monkeypatch.delenv("KAFKA_SCHEMAS_DIR", raising=False)
    assert gen_apis.main(["--check"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "set KAFKA_SCHEMAS_DIR=DIR or pass --schemas DIR" in err
    assert "1eb7644349cb07139d6a3c1ad1986979647cac99" in err and "kafka-python 3.0.12" in err


# --------------------------------------------------------------------------- the sources' precedence

# Tiny inputs, written here: the rule under test is which source each fact comes from, not the data.
README = ("`3.9-trunk/`: apache/kafka at commit 1eb7644349cb07139d6a3c1ad1986979647cac99; "
          "`4.x-subset/`: the copies kafka-python 3.0.12 ships.\n")


def _schema(name: str, key: int, valid: str, flexible: str = "none", listeners=("broker",)) -> dict[str, str]:
    """{file name: text} of one API's request and response schemas, with a `//` comment as upstream's."""
    out = {}
    for kind in ("Request", "Response"):
        data: dict = {"apiKey": key, "type": kind.lower(), "name": name + kind, "validVersions": valid}
        if valid != "none":
            data["flexibleVersions"] = flexible
            if kind == "Request":
                data["listeners"] = list(listeners)
        out[f"{name}{kind}.json"] = "// Licensed to the ASF.\n" + json.dumps(data)
    return out


def _inputs(tmp_path: Path, old: dict, subset: dict, jar: dict, version: str = "9.9.0") -> tuple[Path, Path]:
    schemas = tmp_path / "schemas"
    for sub, files in (("3.9-trunk", old), ("4.x-subset", subset)):
        (schemas / sub).mkdir(parents=True)
        for name, text in files.items():
            (schemas / sub / name).write_text(text)
    (schemas / "README.md").write_text(README)
    path = tmp_path / f"kafka-clients-{version}.jar"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("common/message/", "")
        for name, text in jar.items():
            z.writestr("common/message/" + name, text)
        z.writestr("kafka/kafka-version.properties", f"commitId=0123456789abcdef\nversion={version}\n")
        z.writestr("org/apache/kafka/Other.class", b"\xca\xfe")
    return schemas, path


def test_the_jar_comes_first_for_the_4x_facts_then_the_subset_then_kio(tmp_path, monkeypatch):
    old = {**_schema("ApiVersions", 18, "0-4", "3+", ("zkBroker", "broker")), **_schema("Produce", 0, "0-11", "9+"),
           **_schema("ControlledShutdown", 7, "0-3", "3+", ("zkBroker", "controller")),
           **_schema("DeleteGroups", 42, "0-2", "2+")}
    subset = {**_schema("ApiVersions", 18, "0-4", "3+"), **_schema("Produce", 0, "3-12", "9+")}
    jar = {**_schema("ApiVersions", 18, "0-5", "3+", ("broker", "controller")),
           **_schema("ControlledShutdown", 7, "none"), **_schema("NewThing", 95, "0-1", "0+")}
    schemas, jar_path = _inputs(tmp_path, old, subset, jar)
    excluded = []

    def fake_kio(exclude):  # kio knows DeleteGroups and (wrongly, here) ControlledShutdown
        excluded.append(set(exclude))
        facts = {42: api_schemas.Facts("kio", 42, "DeleteGroups", (0, 1, 2, 3), frozenset({2, 3}), None),
                 7: api_schemas.Facts("kio", 7, "ControlledShutdown", (0, 1), frozenset(), None)}
        return {k: f for k, f in facts.items() if k not in exclude}

    monkeypatch.setattr(gen_apis, "load_kio", fake_kio)
    monkeypatch.setattr(gen_apis, "kio_version", lambda: "0.0.1")
    text = gen_apis.generate(schemas, jar_path)
    table = {}
    exec(compile(text, "api_table.py", "exec"), table)  # the generated module, as the census imports it
    rows = table["API_TABLE"]
    # ApiVersions: the jar's v5 wins over the subset's 0-4; listeners are the union.
    assert rows[18][2:] == (0, 5, 3, 0, 5, ("zkBroker", "broker", "controller"), "kafka-clients")
    # Produce: not in the jar, so the subset's 3-12; 3.9-trunk keeps 0-2 (KIP-896's removals).
    assert rows[0][2:] == (0, 12, 9, 3, 12, ("broker",), "4.x-subset")
    # ControlledShutdown: "validVersions": "none" in the jar is a removal that kio cannot undo.
    assert rows[7][2:] == (0, 3, 3, None, None, ("zkBroker", "controller"), "removed")
    assert rows[42][5:7] == (0, 3) and rows[42].source_4x == "kio"
    assert rows[95][1:] == ("NewThing", 0, 1, 0, 0, 1, ("broker",), "kafka-clients")
    assert excluded == [{18, 0, 7, 95}]
    assert text.splitlines()[1].startswith("# Apache Kafka 9.9.0 (common/message/ in kafka-clients-9.9.0.jar, "
                                           "commit 0123456789abcdef)")


def test_a_missing_jar_is_one_line_saying_make_setup_kafka(tmp_path, capsys):
    schemas, _ = _inputs(tmp_path, _schema("ApiVersions", 18, "0-4", "3+"), {}, {})
    missing = tmp_path / "nowhere" / "kafka-clients.jar"
    assert gen_apis.main(["--schemas", str(schemas), "--kafka-clients-jar", str(missing), "--check"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert str(missing) in err and "run `make setup-kafka`" in err and "--kafka-clients-jar" in err


def test_the_default_jar_is_the_newest_pinned_kafkas_in_build():
    # harness/kafka_broker.py pins {"3.9": "3.9.2", "4": "4.4.0"}; make setup-kafka copies each into
    # build/kafka/<version>/. The pin is read, not imported (the harness is not a build tool's import).
    from harness import kafka_broker

    assert api_schemas.pinned_kafka_versions() == kafka_broker.KAFKA_VERSIONS
    newest = max(kafka_broker.KAFKA_VERSIONS.values(), key=lambda v: tuple(map(int, v.split("."))))
    assert api_schemas.newest_pinned_kafka() == newest
    assert api_schemas.default_clients_jar() == kafka_broker.JARS_DIR / newest / f"kafka-clients-{newest}.jar"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"a": 1} // trailing', '{"a": 1} '),
        ('// whole line\n{"u": "http://x//y"}', '\n{"u": "http://x//y"}'),
        ('{"q": "say \\"//\\" here"} // c', '{"q": "say \\"//\\" here"} '),
        ('{"a": /* inline */ 1}', '{"a":  1}'),
    ],
)
def test_strip_comments_keeps_slashes_inside_strings(text, expected):
    assert api_schemas.strip_comments(text) == expected


# --------------------------------------------------------------------------- facts


def test_apispec_fields():
    assert ApiSpec._fields == (
        "key",
        "name",
        "min_version",
        "max_version",
        "flexible_from",
        "kafka4_min_version",
        "kafka4_max_version",
        "listeners",
        "source_4x",
    )


def test_api_versions():
    # 3.9-trunk/ApiVersionsRequest.json: apiKey 18, "validVersions": "0-4", "flexibleVersions": "3+";
    # Apache Kafka 4.4.0's (common/message/ in kafka-clients-4.4.0.jar): "0-5", "3+" ("Version 5
    # introduces ClusterId and NodeId checking and REBOOTSTRAP_REQUIRED error (KIP-1242)"), the
    # version kafka-clients 4.4 opens every connection with. Kafka 4 removed nothing.
    spec = API_TABLE[18]
    assert (spec.key, spec.name) == (18, "ApiVersions")
    assert (spec.min_version, spec.max_version, spec.flexible_from) == (0, 5, 3)
    assert (spec.kafka4_min_version, spec.kafka4_max_version) == (0, 5)
    assert spec.source_4x == "kafka-clients"
    assert api_table.removed_in_kafka4(spec) == ()


def test_produce_removed_versions():
    # KIP-896; 4.x-subset/ProduceRequest.json: "validVersions": "3-13" ("Versions 0-2 were
    # removed in Apache Kafka 4.0, version 3 is the new baseline"); 3.9-trunk: "0-11".
    spec = API_TABLE[0]
    assert spec.name == "Produce"
    assert (spec.min_version, spec.max_version, spec.flexible_from) == (0, 13, 9)
    assert api_table.removed_in_kafka4(spec) == (0, 1, 2)
    assert spec.source_4x == "kafka-clients"  # 4.4.0's ProduceRequest.json says the same "3-13"


def test_fetch_kafka4_baseline():
    # KIP-896; 4.x-subset/FetchRequest.json: "validVersions": "4-18", "flexibleVersions": "12+";
    # 3.9-trunk/FetchRequest.json: "0-17".
    spec = API_TABLE[1]
    assert spec.name == "Fetch"
    assert (spec.kafka4_min_version, spec.kafka4_max_version) == (4, 18)
    assert (spec.min_version, spec.max_version, spec.flexible_from) == (0, 18, 12)
    assert api_table.removed_in_kafka4(spec) == (0, 1, 2, 3)


def test_zookeeper_era_apis_removed_entirely():
    # 3.9-trunk has LeaderAndIsr (4, "0-7"), StopReplica (5, "0-4"), UpdateMetadata (6, "0-8")
    # and ControlledShutdown (7, "0-3", flexible "3+", listeners zkBroker + controller);
    # Kafka 4.4.0's schemas of all four say "validVersions": "none" ("This request was removed in
    # Apache Kafka 4.0."), and none is in 4.x-subset nor in kio 0.6.5 (its api_key_map skips 4-7).
    expected = {4: ("LeaderAndIsr", 7), 5: ("StopReplica", 4), 6: ("UpdateMetadata", 8), 7: ("ControlledShutdown", 3)}
    for key, (name, max_version) in expected.items():
        spec = API_TABLE[key]
        assert (spec.name, spec.min_version, spec.max_version) == (name, 0, max_version)
        assert spec.source_4x == "removed"
        assert spec.kafka4_min_version is None and spec.kafka4_max_version is None
        assert api_table.removed_in_kafka4(spec) == tuple(range(max_version + 1))
    cs = API_TABLE[7]
    assert cs.flexible_from == 3
    assert cs.listeners == ("zkBroker", "controller")
    assert {k for k, s in API_TABLE.items() if s.source_4x == "removed"} == set(expected)


def test_apis_and_versions_newer_than_the_other_sources_come_from_kafka_4_4():
    # Apache Kafka 4.4.0's schemas (kafka-clients-4.4.0.jar, common/message/):
    # StreamsGroupHeartbeat (KIP-1071), apiKey 88: "validVersions": "0-1", "flexibleVersions": "0+",
    # listeners ["broker"]; kio 0.6.5 has only v0 and no listeners; absent from 3.9-trunk and 4.x-subset.
    spec = API_TABLE[88]
    assert (spec.name, spec.source_4x) == ("StreamsGroupHeartbeat", "kafka-clients")
    assert (spec.min_version, spec.max_version, spec.flexible_from) == (0, 1, 0)
    assert (spec.kafka4_min_version, spec.kafka4_max_version) == (0, 1)
    assert spec.listeners == ("broker",)
    # New API keys: StreamsGroupTopologyDescriptionUpdate (93, "0", listeners ["broker"]) and
    # UnregisterController (94, "0", listeners ["broker", "controller"]), both flexible "0+".
    assert API_TABLE[93][1:] == ("StreamsGroupTopologyDescriptionUpdate", 0, 0, 0, 0, 0, ("broker",), "kafka-clients")
    assert API_TABLE[94][1:] == ("UnregisterController", 0, 0, 0, 0, 0, ("broker", "controller"), "kafka-clients")
    # New versions: TxnOffsetCommit "0-6" (4.x-subset "0-5"), DeleteGroups "0-3" (4.x-subset "0-2").
    assert (API_TABLE[28].max_version, API_TABLE[28].kafka4_max_version) == (6, 6)
    assert (API_TABLE[42].max_version, API_TABLE[42].kafka4_max_version) == (3, 3)
    # AlterPartition: 3.9-trunk "0-3", flexible "0+"; 4.4.0 "2-3" (KIP-896 dropped 0-1).
    spec = API_TABLE[56]
    assert (spec.name, spec.source_4x) == ("AlterPartition", "kafka-clients")
    assert api_table.removed_in_kafka4(spec) == (0, 1)


def test_renamed_api_uses_the_4x_name():
    # apiKey 74 is ListClientMetricsResourcesRequest.json ("0") in 3.9-trunk and
    # ListConfigResourcesRequest.json ("0-1") in 4.x-subset (KIP-1142).
    spec = API_TABLE[74]
    assert (spec.name, spec.min_version, spec.max_version) == ("ListConfigResources", 0, 1)


def test_every_key_up_to_the_highest_is_present():
    # Kafka numbers API keys densely; a gap would need an explanation here. None today:
    # even the keys removed by Kafka 4.0 (4-7) are kept, with source_4x == "removed".
    explained_gaps: dict[int, str] = {}
    missing = set(range(max(API_TABLE) + 1)) - set(API_TABLE)
    assert missing == set(explained_gaps)
    assert max(API_TABLE) >= 94  # Kafka 4.4.0 knows up to UnregisterController (94)


def test_table_is_self_consistent():
    assert list(API_TABLE) == sorted(API_TABLE)
    for key, spec in API_TABLE.items():
        assert spec.key == key
        assert 0 <= spec.min_version <= spec.max_version
        if spec.flexible_from is not None:
            assert spec.flexible_from <= spec.max_version
        if spec.kafka4_min_version is None:
            assert spec.kafka4_max_version is None and spec.source_4x == "removed"
        else:
            assert spec.min_version <= spec.kafka4_min_version <= spec.kafka4_max_version <= spec.max_version
            assert spec.source_4x in ("kafka-clients", "4.x-subset", "kio")
    removed = {k: api_table.removed_in_kafka4(s) for k, s in API_TABLE.items()}
    assert api_table.REMOVED_IN_KAFKA4 == {k: v for k, v in removed.items() if v}


def test_the_upgrade_targets_are_not_the_schemas_but_the_brokers():
    # What each release removed comes from real brokers (tests/core/test_upgrade_targets.py): the table
    # keeps the KIP-896 list of the schemas, which the deprecated-request counters read.
    assert not hasattr(api_table, "UPGRADE_TARGETS")
    assert (api_table.REMOVED_IN_KAFKA4[0], api_table.REMOVED_IN_KAFKA4[1]) == ((0, 1, 2), (0, 1, 2, 3))


# --------------------------------------------------------------------------- sans-IO


def test_api_table_imports_nothing_but_typing():
    tree = ast.parse(API_TABLE_PATH.read_text())
    imports = [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]
    assert [ast.unparse(node) for node in imports] == ["from typing import NamedTuple"]
    names = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    assert not names & {"__import__", "importlib", "exec", "eval", "open"}
