"""The Helm chart's bounds that follow the pod's resources (issue 13, items 3 and 4): the decoder
budget and the connection tables derived from the container's memory limit, the event log's
total from its volume, each refused when a value given cannot fit; and the HTTP side's bounds
(issue 25) on every serving container. Rendering: tests/deploy/helm_render.py.
"""

from __future__ import annotations

import re

import helm_python
import pytest

from harness.memory_bounds import FLOW_BYTES, RECORD_BYTES
from tests.deploy.helm_render import (
    census_containers,
    ci_values,
    flag_value,
    manifests,
    mode_values,
    parse_cli,
    pod_specs,
    render,
)

# --- bounds that follow the pod's resources (issue 13, items 3 and 4) -------------------------

def capture_args(values: dict) -> list[str]:
    [(_, c)] = census_containers(manifests(render(values)))[:1]
    parse_cli(c["args"])
    return c["args"]


@pytest.mark.parametrize("limit, expected", [
    ("512Mi", 128), ("768Mi", 192), ("1Gi", 256), ("2Gi", 512), ("1G", 238), (536870912, 128), ("1.5Gi", 384),
])
def test_max_buffer_mb_is_a_quarter_of_the_memory_limit(limit, expected):
    for mode in ("daemonset", "sidecar"):
        values = mode_values(mode, resources={"limits": {"memory": limit}})
        assert flag_value(capture_args(values), "--max-buffer-mb") == expected


def test_max_buffer_mb_explicit_value_and_its_bound():
    """capture.maxBufferMB wins, up to the limit minus the baseline: 128 MiB and the kernel
    capture buffer (capture.bufferMB, default 64). 512Mi: at most 320; with bufferMB 128, 256."""
    # 200, not 320: the connection tables need room too (test_connection_tables_*)
    assert flag_value(capture_args({"capture": {"maxBufferMB": 200}}), "--max-buffer-mb") == 200
    for capture, bound in (({"maxBufferMB": 321}, 320), ({"maxBufferMB": 257, "bufferMB": 128}, 256)):
        with pytest.raises(helm_python.HelmRenderError, match=re.escape(
                f"capture.maxBufferMB {capture['maxBufferMB']} exceeds resources.limits.memory (512 MiB) "
                f"minus the baseline") + f".*at most {bound}$"):
            render({"capture": capture})
    # a limit whose quarter does not fit beside the baseline, and one with no room at all
    with pytest.raises(helm_python.HelmRenderError, match=re.escape(
            "resources.limits.memory (240 MiB): a quarter of it (60 MiB") + ".*at most 48$"):
        render({"resources": {"limits": {"memory": "240Mi"}}})
    with pytest.raises(helm_python.HelmRenderError, match="leaves no room for the decoder and reassembly budget"):
        render({"resources": {"limits": {"memory": "192Mi"}}})
    with pytest.raises(helm_python.HelmRenderError, match=re.escape('cannot read the quantity "lots"')):
        render({"resources": {"limits": {"memory": "lots"}}})
    # no memory limit (null removes the default's): the CLI's default, unless given
    assert flag_value(capture_args({"resources": {"limits": None}}), "--max-buffer-mb") is None
    values = {"resources": {"limits": None}, "capture": {"maxBufferMB": 4096}}
    assert flag_value(capture_args(values), "--max-buffer-mb") == 4096
    # the proxy decodes what it forwards with the same decoders: the same budget
    assert flag_value(capture_args(mode_values("proxy")), "--max-buffer-mb") == 128


def tables_room(limit_mib: int, *, kernel: int = 64, budget: int, queue: int = 0) -> int:
    """Bytes the chart leaves for the connection tables: the limit less the 128 MiB baseline,
    the kernel buffer, the decoder budget and the event log's queue."""
    return (limit_mib - 128 - kernel - budget - queue) << 20


def derived_tables(limit_mib: int, *, closed: int = 10_000, **room) -> int:
    """The chart's rule, from the constants of harness/memory_bounds.py that
    tests/capture/test_table_memory.py asserts: an equal number of flows and records in what is
    left beside the closed records, in thousands."""
    left = tables_room(limit_mib, **room) - closed * RECORD_BYTES
    return left // (FLOW_BYTES + RECORD_BYTES) // 1000 * 1000


def table_flags(values: dict) -> tuple:
    args = capture_args(values)
    parsed = parse_cli(args)
    for flag, got in (("--max-flows", parsed.max_flows), ("--max-connections", parsed.max_connections),
                      ("--max-closed-connections", parsed.max_closed_connections)):
        assert flag_value(args, flag) in (None, got)
    return (flag_value(args, "--max-flows"), flag_value(args, "--max-connections"),
            flag_value(args, "--max-closed-connections"))


@pytest.mark.parametrize("limit, mib, budget, expected", [
    ("512Mi", 512, 128, 22_000), ("768Mi", 768, 192, 48_000), ("1Gi", 1024, 256, 74_000),
    ("2Gi", 2048, 512, 177_000),
])
def test_connection_tables_are_derived_from_the_memory_limit(limit, mib, budget, expected):
    """No capture.maxFlows/maxConnections: both are what the limit leaves beside the baseline,
    the kernel buffer and the decoder budget, at FLOW_BYTES a flow and RECORD_BYTES a record
    (the 10,000 closed ones included). Before, the CLI's 100,000 of each (~750 MB of tables at
    the measured sizes) went with any limit: a connection flood could OOM-kill the pod."""
    assert derived_tables(mib, budget=budget) == expected
    for mode in ("daemonset", "sidecar"):
        flows, connections, closed = table_flags(mode_values(mode, resources={"limits": {"memory": limit}}))
        assert flows == connections == expected and closed is None
        used = flows * FLOW_BYTES + (connections + 10_000) * RECORD_BYTES
        assert used <= tables_room(mib, budget=budget) < used + 1000 * (FLOW_BYTES + RECORD_BYTES)


def test_connection_tables_account_for_the_event_log_queue_and_the_kernel_buffer():
    # With the event log: its queue (16 MiB) and its rollup state (~56 MiB at 200,000 entries).
    expected = derived_tables(512, budget=128, queue=72)
    assert expected == 13_000
    assert table_flags({"eventLog": {"enabled": True}})[:2] == (expected, expected)
    expected = derived_tables(512, budget=128, kernel=128)
    assert expected == 14_000
    assert table_flags({"capture": {"bufferMB": 128}})[:2] == (expected, expected)


def test_connection_tables_explicit_values_and_their_bound():
    """A value given is passed as is if it fits, the other one takes what is left; values that
    cannot fit at the limit are refused, naming the figures."""
    # one given: the other gets the rest
    left = tables_room(512, budget=128) - 10_000 * RECORD_BYTES - 5_000 * FLOW_BYTES
    assert table_flags({"capture": {"maxFlows": 5_000}}) == (5_000, left // RECORD_BYTES // 1000 * 1000, None)
    left = tables_room(512, budget=128) - 10_000 * RECORD_BYTES - 5_000 * RECORD_BYTES
    assert table_flags({"capture": {"maxConnections": 5_000}}) == (left // FLOW_BYTES // 1000 * 1000, 5_000, None)
    # closed connections are passed and counted
    assert table_flags({"capture": {"maxClosedConnections": 50_000}}) == (
        derived_tables(512, budget=128, closed=50_000),) * 2 + (50_000,)
    # both given and fitting: as given
    assert table_flags({"capture": {"maxFlows": 20_000, "maxConnections": 20_000}}) == (20_000, 20_000, None)
    # the CLI defaults at the default limit: refused
    with pytest.raises(helm_python.HelmRenderError, match=re.escape(
            "capture.maxFlows 100000 and capture.maxConnections 100000 do not fit: resources.limits.memory "
            "512 MiB less 128") + ".*leaves 192 MiB for the connection tables.*so they need 766 MiB"):
        render({"capture": {"maxFlows": 100_000, "maxConnections": 100_000}})
    for mode in ("daemonset", "sidecar"):
        with pytest.raises(helm_python.HelmRenderError, match="capture.maxFlows 30000 and capture.maxConnections"):
            render(mode_values(mode, capture={"maxFlows": 30_000, "maxConnections": 30_000}))
    # one given, too large for the other to get 1000
    with pytest.raises(helm_python.HelmRenderError, match=re.escape(
            "the connection tables do not fit") + ".*MiB go to the values given; room for fewer than 1000"):
        render({"capture": {"maxFlows": 31_500}})
    # a decoder budget that leaves nothing
    with pytest.raises(helm_python.HelmRenderError, match=re.escape(
            "320 (maxBufferMB) leaves 0 MiB for the connection tables") + ".*nothing is left"):
        render({"capture": {"maxBufferMB": 320}})
    # no memory limit: the CLI defaults, or what is given, unchecked
    assert table_flags({"resources": {"limits": None}}) == (None, None, None)
    assert table_flags({"resources": {"limits": None}, "capture": {"maxFlows": 500_000}}) == (500_000, None, None)
    # the proxy tracks no flows: none of these
    args = " ".join(capture_args(mode_values("proxy")))
    assert "--max-flows" not in args and "--max-connections" not in args


@pytest.mark.parametrize("volume, expected", [
    ({}, 1536),                                                   # the default emptyDir of 2Gi
    ({"emptyDir": {"sizeLimit": "4Gi"}}, 3072),
    ({"emptyDir": {"sizeLimit": "1G"}}, 714),                    # 953 MiB
    ({"ephemeral": {"volumeClaimTemplate": {"spec": {"accessModes": ["ReadWriteOnce"],
                                                     "resources": {"requests": {"storage": "10Gi"}}}}}}, 7680),
], ids=["default", "emptydir-4gi", "emptydir-1g", "ephemeral-10gi"])
def test_event_log_total_is_three_quarters_of_the_volume(volume, expected):
    for mode in ("daemonset", "sidecar"):
        values = mode_values(mode, eventLog={"enabled": True, "volume": volume})
        assert flag_value(capture_args(values), "--event-log-max-total-mb") == expected


def test_event_log_total_explicit_value_and_its_bound():
    """eventLog.maxTotalMB wins, up to the volume's size minus the active file (eventLog.maxMB,
    default 64): a full emptyDir gets the pod evicted, in sidecar mode the broker's."""
    assert flag_value(capture_args({"eventLog": {"enabled": True, "maxTotalMB": 1984}}),
                      "--event-log-max-total-mb") == 1984
    for event_log, bound in (({"maxTotalMB": 1985}, 1984), ({"maxTotalMB": 1900, "maxMB": 256}, 1792),
                             ({"maxTotalMB": 5000, "volume": {"emptyDir": {"sizeLimit": "4Gi"}}}, 4032)):
        with pytest.raises(helm_python.HelmRenderError, match=re.escape(
                f"eventLog.maxTotalMB {event_log['maxTotalMB']} does not fit the event log's volume")
                + f".*at most {bound}$"):
            render({"eventLog": {"enabled": True, **event_log}})
    with pytest.raises(helm_python.HelmRenderError, match="the event log's volume is too small"):
        render({"eventLog": {"enabled": True, "volume": {"emptyDir": {"sizeLimit": "64Mi"}}}})
    with pytest.raises(helm_python.HelmRenderError, match="the event log's volume is too small"):
        render({"eventLog": {"enabled": True, "maxMB": 300, "volume": {"emptyDir": {"sizeLimit": "384Mi"}}}})
    # the CLI refuses a cap below the rotation size: so does the chart, before anything starts
    with pytest.raises(helm_python.HelmRenderError,
                       match=re.escape("eventLog.maxTotalMB 32 is below eventLog.maxMB 64")):
        render({"eventLog": {"enabled": True, "maxTotalMB": 32, "volume": {"hostPath": {"path": "/x"}}}})
    # a volume of unknown size: the CLI's default, or the value as given
    for volume in ({"persistentVolumeClaim": {"claimName": "ev"}}, {"emptyDir": {}},
                   {"hostPath": {"path": "/var/lib/kafka-census", "type": "DirectoryOrCreate"}}):
        values = {"eventLog": {"enabled": True, "volume": volume}}
        assert flag_value(capture_args(values), "--event-log-max-total-mb") is None
        values["eventLog"]["maxTotalMB"] = 50000
        assert flag_value(capture_args(values), "--event-log-max-total-mb") == 50000
    # 0 (no cap) is not a value the chart accepts
    with pytest.raises(helm_python.HelmValuesError, match="at '/eventLog/maxTotalMB'"):
        render({"eventLog": {"enabled": True, "maxTotalMB": 0}})
    # no event log, no flag
    assert flag_value(capture_args({"eventLog": {"maxTotalMB": 10}}), "--event-log-max-total-mb") is None


def test_max_series_is_left_to_the_binary_unless_set():
    assert flag_value(capture_args({}), "--max-series") is None
    for mode in ("daemonset", "sidecar", "proxy"):  # every registry: the proxy has one too
        assert flag_value(capture_args(mode_values(mode, capture={"maxSeries": 50000})), "--max-series") == 50000
    with pytest.raises(helm_python.HelmValuesError, match="at '/capture/maxSeries'"):
        render({"capture": {"maxSeries": 0}})


def test_event_log_rollup_seconds_reaches_the_cli_and_is_bounded():
    args = capture_args({"eventLog": {"enabled": True, "rollupSeconds": 300}})
    assert parse_cli(args).event_log_rollup_seconds == 300
    assert not any(a.startswith("--event-log-rollup-seconds") for a in capture_args({"eventLog": {"enabled": True}}))
    for bad in (0, 3601):
        with pytest.raises(helm_python.HelmValuesError, match="rollupSeconds"):
            render({"eventLog": {"enabled": True, "rollupSeconds": bad}})


# --- the HTTP side's bounds (issue 25) ----------------------------------------------------------

HTTP_LIMIT_FLAGS = {"http_max_connections": 128, "http_header_timeout": 10.0, "http_idle_timeout": 30.0,
                    "http_max_requests": 8, "http_max_scrapes": 2, "http_max_response_mb": 16, "http_cpu_share": 0.25}


@pytest.mark.parametrize("mode", ["daemonset", "sidecar", "proxy", "aggregator-proxy"])
def test_every_serving_container_gets_the_http_bounds(mode):
    """The chart states every HTTP bound in every mode and on the aggregator (http.limits), at
    the CLI's defaults unless set; the kafka-census parser reads them back."""
    from exporter.http.bounds import HttpLimits

    defaults = HttpLimits()
    assert HTTP_LIMIT_FLAGS == {"http_max_connections": defaults.max_connections,
                                "http_header_timeout": defaults.header_timeout,
                                "http_idle_timeout": defaults.idle_timeout,
                                "http_max_requests": defaults.max_requests, "http_max_scrapes": defaults.max_scrapes,
                                "http_max_response_mb": defaults.max_response_bytes >> 20,
                                "http_cpu_share": defaults.cpu_share}, "values.yaml's http.limits follow the CLI"
    for limits, want in (({}, HTTP_LIMIT_FLAGS),
                         ({"maxConnections": 64, "maxRequests": 2, "cpuShare": 0.5},
                          {**HTTP_LIMIT_FLAGS, "http_max_connections": 64, "http_max_requests": 2,
                           "http_cpu_share": 0.5})):
        values = ci_values(mode)
        values.setdefault("http", {})["limits"] = limits
        docs = manifests(render(values))
        containers = [c for _, _, spec in pod_specs(docs) for c in spec["containers"]
                      if c["name"] == "kafka-census" or (c.get("args") or [""])[0] in ("capture", "proxy", "aggregate")]
        assert containers, mode
        for c in containers:
            args = parse_cli(c["args"])
            # the aggregator's own: aggregator.httpLimits (maxRequests 2) over http.limits
            expected = {**want, "http_max_requests": 2} if args.command == "aggregate" else want
            assert {k: getattr(args, k) for k in HTTP_LIMIT_FLAGS} == expected, (mode, c["name"])


def test_schema_rejects_bad_http_limits():
    for bad in ({"maxConnections": 1}, {"cpuShare": 0}, {"cpuShare": 2}, {"headerTimeoutSeconds": 0},
                {"unknown": 1}):
        with pytest.raises(helm_python.HelmValuesError) as err:
            render({"http": {"limits": bad}})
        assert "limits" in str(err.value), bad
