"""`kafka-census` settings and serving as an operator meets them: the installed console script
as a real subprocess. Settings resolve flags > KAFKA_CENSUS_* environment > --config YAML >
defaults; every bad setting is one `kafka-census: error:` line and exit 2, never a traceback;
`replay --serve` serves what the file contained until SIGTERM, then exits 0; the proxy warns
about a --max-connections the operator gave (flag, variable or YAML) that the open-files limit
cannot hold, and bounds the default silently. exporter.cli.settings itself: tests/cli/test_settings.py."""

from __future__ import annotations

import json
import signal
import socket
from pathlib import Path

import pytest

from harness import synth
from harness.census import Census
from harness.cli_runs import assert_usage_error, clean_env, run
from harness.known_conversation import full_conversation
from harness.net import free_port

pytestmark = pytest.mark.e2e  # runs the kafka-census command

# broker port -> the listener setting that alone matches it
PORTS = {"default": 9092, "config": 9201, "env": 9202, "flag": 9203}


@pytest.fixture(scope="module")
def pcap(tmp_path_factory) -> Path:
    """One complete conversation to each of the four broker ports in PORTS."""
    packets = []
    for i, port in enumerate(PORTS.values(), start=1):
        conv = synth.TcpConversation(client=(f"10.0.0.{10 + i}", 40000 + i), broker=("10.0.0.2", port))
        packets += full_conversation(conv)
    path = tmp_path_factory.mktemp("settings") / "four.pcap"
    synth.write_pcap(path, packets)
    return path


@pytest.fixture
def config(tmp_path):
    def write(text: str | bytes) -> Path:
        path = tmp_path / "census.yaml"
        if isinstance(text, bytes):
            path.write_bytes(text)
        else:
            path.write_text(text)
        return path
    return write


def listed(out) -> list[tuple[str, int, str]]:
    assert out.returncode == 0, out.stderr
    return [(c["listener"], c["broker_port"], c["client_software_name"]) for c in json.loads(out.stdout)]


# --- precedence -----------------------------------------------------------------------------

def test_default_listener_when_nothing_is_set(pcap):
    assert listed(run("replay", pcap, "--format", "json")) == [("PLAINTEXT", 9092, "census-synth")]


def test_config_beats_the_default(pcap, config):
    cfg = config("listener:\n  - CFG=9201\n")
    assert listed(run("replay", pcap, "--format", "json", "--config", cfg)) == [("CFG", 9201, "census-synth")]


def test_environment_beats_the_config(pcap, config):
    cfg = config("listener: CFG=9201\n")
    out = run("replay", pcap, "--format", "json", "--config", cfg, env=clean_env(KAFKA_CENSUS_LISTENER="ENV=9202"))
    assert listed(out) == [("ENV", 9202, "census-synth")]


def test_flag_beats_the_environment_and_the_config(pcap, config):
    cfg = config("listener: CFG=9201\n")
    out = run("replay", pcap, "--format", "json", "--config", cfg, "--listener", "FLAG=9203",
              env=clean_env(KAFKA_CENSUS_LISTENER="ENV=9202"))
    assert listed(out) == [("FLAG", 9203, "census-synth")]


def test_list_settings_take_comma_separated_environment_values(pcap):
    out = run("replay", pcap, "--format", "json", env=clean_env(KAFKA_CENSUS_LISTENER="ENV=9202, FLAG=9203"))
    assert listed(out) == [("ENV", 9202, "census-synth"), ("FLAG", 9203, "census-synth")]


# --- bad settings: one error line, exit 2 ---------------------------------------------------

@pytest.mark.parametrize("text, fragments", [
    ("listeners: PLAINTEXT=9092\n", ["unknown setting 'listeners'", "known:", "listener"]),
    ("listener: [PLAINTEXT=9092\n", ["not valid YAML"]),
    ("- listener\n- PLAINTEXT=9092\n", ["expected a mapping"]),
    ("max-flows: many\n", ["max-flows in --config", "bad value 'many'"]),
    ("idle-timeout: [1, 2]\n", ["idle-timeout in --config", "bad value"]),
], ids=["unknown-key", "invalid-yaml", "not-a-mapping", "bad-int", "list-for-float"])
def test_bad_config_is_one_error_line_and_exit_2(pcap, config, text, fragments):
    assert_usage_error(run("replay", pcap, "--config", config(text)), "--config", *fragments)


@pytest.mark.parametrize("text", ["max-flows: true\n", "max-flows: 2.5\n"], ids=["bool-for-int", "float-for-int"])
def test_config_values_of_the_wrong_yaml_type_are_rejected(pcap, config, text):
    """YAML types the value: `true` and `2.5` are no flow-table size (the flag and the
    environment variable reject both; int() would silently turn them into 1 and 2)."""
    assert_usage_error(run("replay", pcap, "--config", config(text)), "max-flows in --config", "bad value")


def test_config_that_is_not_utf8_is_one_error_line(pcap, config):
    assert_usage_error(run("replay", pcap, "--config", config(b"listener: \xff\xfe\n")), "--config")


def test_missing_config_file(pcap, tmp_path):
    missing = tmp_path / "nope.yaml"
    assert_usage_error(run("replay", pcap, "--config", missing), f"--config {missing}", "No such file")


def test_empty_config_is_the_defaults(pcap, config):
    assert listed(run("replay", pcap, "--format", "json", "--config", config(""))) == [
        ("PLAINTEXT", 9092, "census-synth")]


@pytest.mark.parametrize("name, value", [("MAX_FLOWS", "abc"), ("IDLE_TIMEOUT", "soon"), ("MAX_FLOWS", "2.5")])
def test_bad_environment_value_is_one_error_line_and_exit_2(pcap, name, value):
    out = run("replay", pcap, env=clean_env(**{f"KAFKA_CENSUS_{name}": value}))
    assert_usage_error(out, f"KAFKA_CENSUS_{name}", f"bad value {value!r}")


def test_environment_value_is_validated_like_the_flag(pcap):
    assert_usage_error(run("replay", pcap, env=clean_env(KAFKA_CENSUS_MAX_FLOWS="0")), "--max-flows")


@pytest.mark.parametrize("http", ["nohost", "1.2.3.4:99999", "127.0.0.1:", "127.0.0.1:0"])
def test_bad_http_forms_exit_2(pcap, http):
    assert_usage_error(run("replay", pcap, "--serve", "--http", http), "bad --http", http)


@pytest.mark.parametrize("http", [":9100", "[]:9100"])
def test_every_interface_must_be_written_out(pcap, http):
    """A bare `:PORT` used to mean every interface: exposing client lists is never implied."""
    assert_usage_error(run("replay", pcap, "--serve", "--http", http), f"bad --http {http!r}",
                       "the host is required", "0.0.0.0:9100 or [::]:9100")


def test_bad_http_from_the_environment_exits_2_for_capture():
    out = run("capture", "-i", "lo", env=clean_env(KAFKA_CENSUS_HTTP="nohost"))
    assert_usage_error(out, "bad --http 'nohost'")


def test_busy_port_is_one_error_line_and_exit_1(pcap):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        out = run("replay", pcap, "--serve", "--http", f"127.0.0.1:{port}")
    assert out.returncode == 1, out.stderr
    lines = out.stderr.strip().splitlines()
    assert lines == [f"error: cannot listen on 127.0.0.1:{port}: Address already in use"], out.stderr


def test_capture_without_an_interface_names_the_environment_variable():
    assert_usage_error(run("capture"), "--interface", "KAFKA_CENSUS_INTERFACE")


def test_replay_serve_needs_http(pcap):
    assert_usage_error(run("replay", pcap, "--serve"), "--serve needs --http")


# --- replay --serve -------------------------------------------------------------------------

def test_replay_http_without_serve_is_refused_not_ignored(pcap):
    assert_usage_error(run("replay", pcap, "--http", "127.0.0.1:9100"), "--http serves only with --serve")


def test_replay_serve_serves_the_file_and_stops_cleanly_on_sigterm(tmp_path):
    path = tmp_path / "one.pcap"
    synth.write_pcap(path, full_conversation(synth.TcpConversation()))
    port = free_port()
    with Census(["replay", path, "--serve"], port, env=clean_env()) as census:  # ready: /readyz says ok
        status, _, body = census.request("/readyz")
        assert (status, json.loads(body)) == (200, {"status": "ok"})

        status, _, body = census.request("/api/v1/connections")
        assert status == 200
        listing = json.loads(body)
        assert listing["total"] == 1
        [conn] = listing["connections"]
        assert (conn["client_address"], conn["broker_port"], conn["listener"]) == ("10.0.0.1", 9092, "PLAINTEXT")
        assert (conn["client_software_name"], conn["client_software_version"]) == ("census-synth", "1.2.3")
        assert conn["state"] == "closed"

        metrics = census.metrics_text().splitlines()
        assert 'kafka_census_connections_opened_total{listener="PLAINTEXT"} 1.0' in metrics
        assert ('kafka_census_connections{client_software_name="census-synth",client_software_version="1.2.3",'
                'listener="PLAINTEXT"} 0.0') in metrics

        code, stderr = census.stop(signal.SIGTERM)
    assert code == 0, stderr
    assert "Traceback" not in stderr
    assert f"http://127.0.0.1:{port}/metrics" in stderr  # the announcement


# --- the proxy's open-files bound: explicit is where a value came from, not what it is ---------

# The open-files limit the proxy sees: room for (1024 - 64) // 2 = 480 connections.
LOWERED_NOFILE = ("sh", "-c", 'ulimit -n 1024 && exec "$@"', "sh")


@pytest.mark.parametrize("how", ["flag", "env", "config", "default"])
def test_max_connections_over_the_open_files_limit_is_warned_unless_it_is_the_default(config, how):
    """The default (100000) is bounded silently; the same number given by the operator is not
    silently cut to 480 (it was: the bound compared the value with the default)."""
    args = ["proxy", "--listen", f"127.0.0.1:{free_port()}", "--upstream", "127.0.0.1:9"]
    env = clean_env()
    if how == "flag":
        args += ["--max-connections", "100000"]
    elif how == "env":
        env["KAFKA_CENSUS_MAX_CONNECTIONS"] = "100000"
    elif how == "config":
        args += ["--config", str(config("max-connections: 100000\n"))]
    with Census(args, None, ready_log="Ctrl-C to stop", env=env, prefix=LOWERED_NOFILE) as census:
        code, stderr = census.stop(signal.SIGINT)
    assert code == 0, stderr
    started = stderr[:stderr.index("Ctrl-C to stop")].splitlines(keepends=True)  # up to: the proxy runs
    # 1024 less 64 reserved and the HTTP accept backlog (128; no --http here), two descriptors each
    warning = "warning: the open-files limit (1024) allows 416 proxied connections, not --max-connections 100000 ("
    assert any(line.startswith(warning) for line in started) == (how != "default"), started
    assert "Traceback" not in stderr
