"""`below_version_regex` (dashboards/panels.py), the regex of every version below a minimum
that the minimum-version alert matches: compared with a plain Python version comparison over
thousands of versions and by hypothesis, and with Go's regexp engine through promtool.
"""

from __future__ import annotations

import itertools
import random
import re

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.deploy.dashboard_files import gen, run_promtool, version_below

MINIMUMS = ("1", "2", "9", "10", "10.2", "2.3.1", "2.3", "1.8.2", "2.0.2", "2.1.0", "0.1", "0.0.1", "0.10",
            "1.0.0.1", "100", "101.0.7", "12.34.56", "19.99", "3.0", "999.1000", "1.10", "2.16.1", "4.0.0",
            "20.10.3", "7.0.0.0")
SUFFIXES = ("", "-rc1", "-rdkafka-2.16.0", ".", ".x", "x", "+build.5", "-SNAPSHOT", "rc1", "..1", "-", ".-1")


def _versions() -> list[str]:
    components = (0, 1, 2, 3, 7, 8, 9, 10, 11, 12, 16, 19, 20, 33, 34, 35, 56, 99, 100, 101, 123, 999, 1000, 1001)
    rng = random.Random(511)
    base = [".".join(map(str, c)) for n in (1, 2, 3) for c in itertools.product(components, repeat=n)]
    base += [".".join(map(str, c)) for c in itertools.product((0, 1, 2, 10), repeat=4)]
    base += [".".join(map(str, c)) for c in itertools.product((0, 2, 7), repeat=5)]
    out = list(base)
    for v in rng.sample(base, 3000):
        out.append(v + rng.choice(SUFFIXES[1:]))
        out.append(rng.choice("vV") + v + rng.choice(SUFFIXES))
        out.append(".".join("0" * rng.randint(1, 2) + c for c in v.split(".")))  # leading zeros
    out += ["", "unknown", "other", "v", "x1.2", ".1", "-1", "latest", "2.16.1-rdkafka-2.16.0", "1.9.2-librdkafka"]
    return out


def test_regex_agrees_with_version_comparison_exhaustively():
    versions = _versions()
    assert len(versions) > 20_000
    mismatches = []
    for minimum in MINIMUMS:
        regex = re.compile(gen.below_version_regex(minimum))
        for v in versions:
            if bool(regex.fullmatch(v)) != version_below(v, minimum):
                mismatches.append((minimum, v, version_below(v, minimum)))
    assert not mismatches, mismatches[:20]


def test_regex_examples():
    below_10_2 = re.compile(gen.below_version_regex("10.2"))
    for v in ("9.9", "9", "1.0", "1", "10.1.99", "10.1", "10", "10.0.5-rc1", "0.9", "v9.1", "010.1"):
        assert below_10_2.fullmatch(v), v
    for v in ("10.2", "10.2.0", "10.2.1", "11.0", "100.0", "20.1", "10.10", "10.20", "unknown", "", "10.2-rc1"):
        assert not below_10_2.fullmatch(v), v
    below = re.compile(gen.below_version_regex("2.3.1"))
    assert below.fullmatch("2.3.0") and below.fullmatch("2.2.99") and below.fullmatch("1.99.99")
    assert below.fullmatch("2.3") and below.fullmatch("2.3.0-rdkafka-2.16.0")
    assert not below.fullmatch("2.3.1") and not below.fullmatch("2.3.10") and not below.fullmatch("2.30.0")
    assert not below.fullmatch("2.16.1-rdkafka-2.16.0")
    assert re.compile(gen.below_version_regex("2.17")).fullmatch("2.16.1-rdkafka-2.16.0")
    assert gen.below_version_regex("2.3.0") == gen.below_version_regex("2.3")
    assert "\\" not in gen.below_version_regex("1.8.2")  # no escaping inside PromQL/YAML/JSON/Helm strings


@pytest.mark.parametrize("bad", ["", "0", "0.0.0", "1.x", "v1.2", "1..2", "1.2.", " 1", "-1"])
def test_regex_refuses_minimums_without_anything_below(bad):
    with pytest.raises(ValueError):
        gen.below_version_regex(bad)


@settings(max_examples=400, deadline=None)
@given(version=st.text(alphabet="0123456789.vV-rcx", max_size=14),
       minimum=st.lists(st.integers(0, 1200), min_size=1, max_size=4).filter(any).map(
           lambda c: ".".join(map(str, c))))
def test_regex_property(version, minimum):
    assert bool(re.fullmatch(gen.below_version_regex(minimum), version)) == version_below(version, minimum)


def test_regex_in_prometheus_own_engine(tmp_path):
    """Go's RE2 through promtool agrees with the Python comparison: one alert per minimum over
    label values of many versions; the alerts that fire are exactly the versions below."""
    rng = random.Random(896)
    versions = sorted(set(rng.sample(_versions(), 150)) - {""}) + ["2.16.1-rdkafka-2.16.0", "9.9", "10.2", "100.0"]
    minimums = ("10.2", "2.3.1", "1.8.2", "0.10", "101.0.7")
    rules = {"groups": [{"name": "re2", "rules": [
        {"alert": f"Below{i}", "expr": f'v{{version=~"{gen.below_version_regex(m)}"}} > 0'}
        for i, m in enumerate(minimums)]}]}
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules, width=10_000))
    tests = {"rule_files": ["rules.yaml"], "tests": [{
        "interval": "1m",
        "input_series": [{"series": f'v{{version="{v}"}}', "values": "1x3"} for v in versions],
        "alert_rule_test": [{"eval_time": "2m", "alertname": f"Below{i}",
                             "exp_alerts": [{"exp_labels": {"version": v}} for v in versions if version_below(v, m)]}
                            for i, m in enumerate(minimums)],
    }]}
    assert all(t["exp_alerts"] for t in tests["tests"][0]["alert_rule_test"])
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(tests, width=10_000))
    proc = run_promtool("test", "rules", "test.yaml", cwd=tmp_path)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
