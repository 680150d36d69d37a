"""The capture layers hand `topics` and `max_topics` to every KafkaConnection they make: the flow
tracker (and so `replay()` and the live capture, which feed one), and the proxy. What the core
reads with them is tests/core/test_topics.py's; here, that it is switched on, bounded, and off
by default. Packets come from harness/synth.py (scapy), frames from kio."""

from __future__ import annotations

import pytest
from kio.schema.metadata.v4.request import MetadataRequest, MetadataRequestTopic

from capture.events import RequestTally, TopicUsage
from capture.flows import FlowTracker
from capture.listeners import ListenerMap
from capture.proxy import Proxy, Route
from capture.proxy_relay import ProxiedConnection
from capture.replay import replay
from harness.kafka_frames import request_frame
from harness.synth import TcpConversation, write_pcap

LISTENERS = ListenerMap.parse(["PLAINTEXT=9092"])


def metadata_pcap(path, names) -> None:
    conv = TcpConversation(client=("10.0.0.1", 40000), broker=("10.0.0.2", 9092))
    frame = request_frame(MetadataRequest(topics=tuple(MetadataRequestTopic(name=n) for n in names),
                                          allow_auto_topic_creation=False), 1)
    packets = [*conv.handshake(), *conv.send("client", frame, split=100), *conv.close()]
    write_pcap(path, packets, times=[1_700_000_000.0 + i * 0.001 for i in range(len(packets))])


@pytest.mark.parametrize("tally", [False, True], ids=["events", "tally"])
def test_replay_passes_topics_and_max_topics_to_the_cores(tmp_path, tally):
    path = tmp_path / "metadata.pcap"
    metadata_pcap(path, [f"topic-{i}" for i in range(10)])
    events: list = []
    replay(path, LISTENERS, events.append, tally=tally, topics=True, max_topics=4)
    usage = [e for e in events if isinstance(e, TopicUsage)]
    assert [len(e.usage) for e in usage] == [4] and usage[0].dropped == 6
    if tally:  # right after the run's RequestTally
        kinds = [type(e) for e in events]
        assert kinds[kinds.index(TopicUsage) - 1] is RequestTally
    events.clear()
    replay(path, LISTENERS, events.append, tally=tally)  # off by default
    assert not [e for e in events if isinstance(e, TopicUsage)]


def test_the_tracker_refuses_a_max_topics_below_one():
    with pytest.raises(ValueError):
        FlowTracker(LISTENERS, lambda e: None, topics=True, max_topics=0)
    tracker = FlowTracker(LISTENERS, lambda e: None)
    assert (tracker.topics, tracker.max_topics) == (False, 256)


def test_the_proxy_passes_topics_and_max_topics_to_the_cores():
    route = Route("127.0.0.1", 0, "127.0.0.1", 9092, "PLAINTEXT", "PLAINTEXT")
    proxy = Proxy([route], lambda e: None, topics=True, max_topics=7)
    conn = ProxiedConnection(proxy, "c1", None, 0.0)
    assert conn.kafka._topics is not None and conn.kafka._topics.max_topics == 7
    assert ProxiedConnection(Proxy([route], lambda e: None), "c2", None, 0.0).kafka._topics is None
    with pytest.raises(ValueError):
        Proxy([route], lambda e: None, topics=True, max_topics=0)
