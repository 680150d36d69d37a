"""The topic settings (issue 31) reach the registry and the capture layers: `--topics/--no-topics`,
`--max-topics-per-connection`, `--max-topics`, `--max-topic-ids` and `--topic-metrics`, each a
flag, a KAFKA_CENSUS_* variable and a --config key, checked, for capture, replay and proxy."""

from __future__ import annotations

import inspect

import pytest

from exporter.census.topickeys import (
    DEFAULT_MAX_TOPIC_ENTRIES,
    DEFAULT_MAX_TOPIC_IDS,
    DEFAULT_MAX_TOPICS,
    DEFAULT_MAX_TOPICS_PER_CONNECTION,
)
from exporter.cli.common import UsageError, live_registry, topic_bounds, topic_decoding, tracker_options
from exporter.cli.main import build_parser, resolve_settings

COMMANDS = {"capture": ["capture", "-i", "lo"], "replay": ["replay", "x.pcap"],
            "proxy": ["proxy", "--listen", "127.0.0.1:1", "--upstream", "127.0.0.1:2"]}


def parsed(argv: list[str], environ: dict | None = None):
    args = build_parser().parse_args(argv)
    resolve_settings(args, environ=environ or {})
    return args


@pytest.mark.parametrize("command", list(COMMANDS))
def test_defaults(command):
    args = parsed(COMMANDS[command])
    assert topic_bounds(args) == {"max_topics_per_connection": DEFAULT_MAX_TOPICS_PER_CONNECTION,
                                  "max_topics": DEFAULT_MAX_TOPICS, "max_topic_ids": DEFAULT_MAX_TOPIC_IDS,
                                  "max_topic_entries": DEFAULT_MAX_TOPIC_ENTRIES, "topic_metrics": False}
    assert topic_decoding(args) == {"topics": True, "max_topics": DEFAULT_MAX_TOPICS_PER_CONNECTION}


def test_flags_variables_and_config_reach_the_registry_and_the_decoder(tmp_path):
    args = parsed([*COMMANDS["capture"], "--no-topics", "--max-topics", "50", "--topic-metrics",
                   "--max-topic-entries", "77"],
                  {"KAFKA_CENSUS_MAX_TOPIC_IDS": "7", "KAFKA_CENSUS_MAX_TOPICS_PER_CONNECTION": "9"})
    registry = live_registry(args)
    state = registry._topics
    assert (state.max_per_connection, state.max_topics, state.max_ids, state.metrics) == (9, 50, 7, True)
    assert state.max_entries == 77
    options = tracker_options(args)
    assert (options["topics"], options["max_topics"]) == (False, 9)
    config = tmp_path / "census.yaml"
    config.write_text("topics: false\nmax-topics: 3\ntopic-metrics: true\n")
    args = parsed([*COMMANDS["replay"], "--config", str(config), "--topics"])
    assert topic_decoding(args)["topics"] is True  # the flag wins over the file
    assert topic_bounds(args)["max_topics"] == 3 and topic_bounds(args)["topic_metrics"] is True


@pytest.mark.parametrize("flag", ["--max-topics-per-connection", "--max-topics", "--max-topic-ids"])
def test_a_bound_below_one_is_a_usage_error(flag):
    args = parsed([*COMMANDS["replay"], flag, "0"])
    with pytest.raises(UsageError, match=f"{flag} must be at least 1"):
        topic_bounds(args)


def test_the_capture_layers_take_the_topic_switch_and_bound():
    """The composition root passes `topics` and `max_topics` to FlowTracker (capture, replay) and
    to the Proxy; the core's own default bound is --max-topics-per-connection's."""
    from capture.flows import FlowTracker
    from capture.proxy import Proxy

    for layer in (FlowTracker, Proxy):
        params = inspect.signature(layer).parameters
        assert {"topics", "max_topics"} <= set(params), layer.__name__
        assert params["max_topics"].default == DEFAULT_MAX_TOPICS_PER_CONNECTION
