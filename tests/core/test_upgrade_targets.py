"""The upgrade targets come from what real Apache Kafka brokers accepted (issue 27, part 3).

tests/fixtures/kafka-brokers/<version>.json is each release's ApiVersions answer and the versions
it advertised but closed the connection on, recorded off real brokers by tools/record_brokers.py;
tools/gen_targets.py builds capture/kafka/upgrade_targets.py from them. These tests hold the
generated module to its input, and the targets to what the brokers did, where the KIP text and the
brokers differ.
"""

from __future__ import annotations

import ast

from capture.kafka.api_table import API_TABLE, REMOVED_IN_KAFKA4
from capture.kafka.upgrade_targets import UPGRADE_TARGETS
from tools import gen_targets

PRODUCE, JOIN_GROUP = 0, 11


def test_the_generated_targets_do_not_drift_from_the_recorded_brokers():
    assert gen_targets.main(["--check"]) == 0


def test_targets_are_named_by_release_and_by_line():
    facts = gen_targets.load_facts()
    releases = {v for v in facts if not v.startswith("3.")}
    assert releases <= set(UPGRADE_TARGETS) and {"4.0.0", "4.0.1", "4.0", "4.4"} <= set(UPGRADE_TARGETS)
    assert UPGRADE_TARGETS["4.0"].release == max((r for r in releases if r.startswith("4.0.")),
                                                 key=lambda v: tuple(map(int, v.split("."))))
    assert UPGRADE_TARGETS["4.0"].removed == UPGRADE_TARGETS[UPGRADE_TARGETS["4.0"].release].removed


def test_produce_v0_to_v2_are_removed_though_every_4x_broker_advertises_them():
    for name, target in UPGRADE_TARGETS.items():
        facts = gen_targets.load_facts()[target.release]
        assert next(r for r in facts["api_ranges"] if r[0] == PRODUCE)[1] == 0, name  # advertised from v0
        assert target.removed[PRODUCE] == (0, 1, 2) and target.minimum_version[PRODUCE] == 3, name


def test_join_group_v0_and_v1_were_removed_in_4_0_0_and_restored_in_4_0_1():
    assert UPGRADE_TARGETS["4.0.0"].removed[JOIN_GROUP] == (0, 1)
    assert JOIN_GROUP not in UPGRADE_TARGETS["4.0.1"].removed
    assert JOIN_GROUP not in UPGRADE_TARGETS["4.0"].removed


def test_where_the_brokers_and_the_kip_agree_and_differ():
    """What the 4.0 line removed, as the brokers showed it, is the KIP-896 list (the schemas' validVersions)
    restricted to what a client listener of 3.9 served: the ZooKeeper-era inter-broker APIs were never
    offered to clients, so no client can lose them."""
    target = UPGRADE_TARGETS["4.0"]
    served_by_3_9 = {k for k, _, _ in gen_targets.load_facts()["3.9.2"]["api_ranges"]}
    kip = {k: v for k, v in REMOVED_IN_KAFKA4.items() if k in served_by_3_9}
    assert target.removed == kip, (target.removed, kip)


def test_every_removed_version_is_one_the_table_knows():
    for target in UPGRADE_TARGETS.values():
        for key, versions in target.removed.items():
            spec = API_TABLE[key]
            assert all(spec.min_version <= v <= spec.max_version for v in versions)
            low = target.minimum_version[key]
            assert low is None or max(versions) < low


def test_the_targets_module_imports_nothing_but_typing():
    tree = ast.parse(gen_targets.OUTPUT.read_text())
    imports = [ast.unparse(n) for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert imports == ["from __future__ import annotations", "from typing import NamedTuple"]
