"""Tests of the generated Kafka API table (capture/kafka/api_table.py) and its generator.

The expected facts below are written by hand from the upstream sources named in the
comments, not taken from the generator, so that a generator bug cannot confirm itself.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tools import gen_apis

REPO_ROOT = Path(__file__).resolve().parents[1]
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
    not os.environ.get(gen_apis.SCHEMAS.env),
    reason=f"external input: set {gen_apis.SCHEMAS.env}=DIR, Kafka's message schemas (docs/dependencies.md), "
    "to check for drift")


@needs_schemas
def test_generated_file_is_up_to_date():
    """Regenerating from Apache Kafka's message schemas (the `make regen` input) and kio gives no diff."""
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
    assert gen_apis.strip_comments(text) == expected


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
    # 4.x-subset/ApiVersionsRequest.json: the same, so Kafka 4 removed nothing.
    spec = API_TABLE[18]
    assert (spec.key, spec.name) == (18, "ApiVersions")
    assert (spec.min_version, spec.max_version, spec.flexible_from) == (0, 4, 3)
    assert (spec.kafka4_min_version, spec.kafka4_max_version) == (0, 4)
    assert api_table.removed_in_kafka4(spec) == ()


def test_produce_removed_versions():
    # KIP-896; 4.x-subset/ProduceRequest.json: "validVersions": "3-13" ("Versions 0-2 were
    # removed in Apache Kafka 4.0, version 3 is the new baseline"); 3.9-trunk: "0-11".
    spec = API_TABLE[0]
    assert spec.name == "Produce"
    assert (spec.min_version, spec.max_version, spec.flexible_from) == (0, 13, 9)
    assert api_table.removed_in_kafka4(spec) == (0, 1, 2)
    assert spec.source_4x == "4.x-subset"


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
    # none of them is in 4.x-subset nor in kio 0.6.5 (kio.schema.index.api_key_map skips 4-7).
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


def test_api_known_in_4x_only_through_kio():
    # StreamsGroupHeartbeat (KIP-1071): apiKey 88, only v0, flexible from v0; in kio 0.6.5
    # (kio/schema/streams_group_heartbeat/v0/request.py), absent from 3.9-trunk and 4.x-subset.
    spec = API_TABLE[88]
    assert (spec.name, spec.source_4x) == ("StreamsGroupHeartbeat", "kio")
    assert (spec.min_version, spec.max_version, spec.flexible_from) == (0, 0, 0)
    assert (spec.kafka4_min_version, spec.kafka4_max_version) == (0, 0)
    assert spec.listeners == ()  # kio carries no listener information
    # AlterPartition: 3.9-trunk "0-3", flexible "0+"; kio has v2-v3 only (KIP-896 dropped 0-1).
    spec = API_TABLE[56]
    assert (spec.name, spec.source_4x) == ("AlterPartition", "kio")
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
    assert max(API_TABLE) >= 92  # kio 0.6.5 knows up to DeleteShareGroupOffsets (92)


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
            assert spec.source_4x in ("4.x-subset", "kio")
    removed = {k: api_table.removed_in_kafka4(s) for k, s in API_TABLE.items()}
    assert api_table.REMOVED_IN_KAFKA4 == {k: v for k, v in removed.items() if v}


def test_the_kafka4_upgrade_target_is_the_removed_versions_and_their_baselines():
    # KIP-896 as above: Produce keeps v3+, Fetch v4+, the ZooKeeper-era APIs (4-7) are gone
    # entirely (no minimum); the REST API and the pipeline both read this one target table.
    target = api_table.UPGRADE_TARGETS["4.0"]
    assert set(api_table.UPGRADE_TARGETS) == {"4.0"}
    assert target.removed is api_table.REMOVED_IN_KAFKA4
    assert set(target.minimum_version) == set(target.removed)
    assert (target.minimum_version[0], target.minimum_version[1], target.minimum_version[56]) == (3, 4, 2)
    assert all(target.minimum_version[k] is None for k in (4, 5, 6, 7))
    for key, minimum in target.minimum_version.items():
        assert minimum == API_TABLE[key].kafka4_min_version
        assert minimum is None or max(target.removed[key]) < minimum


# --------------------------------------------------------------------------- sans-IO


def test_api_table_imports_nothing_but_typing():
    tree = ast.parse(API_TABLE_PATH.read_text())
    imports = [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]
    assert [ast.unparse(node) for node in imports] == ["from typing import NamedTuple"]
    names = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    assert not names & {"__import__", "importlib", "exec", "eval", "open"}
