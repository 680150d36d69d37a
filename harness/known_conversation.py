"""A Kafka conversation whose content is known, and the capture layer run over a synthetic pcap
of it (harness/synth.py writes the pcap; replay, the flow tracker and the registry read it): what
tests/capture/test_capture_synthetic.py asserts on, and the pcaps other areas' tests build (the
CLI, the HTTP API, the churn and pipeline tests). Imports the capture, the registry and the rest
of harness/; neither pytest nor tests/."""

from __future__ import annotations

import datetime
import struct
from dataclasses import dataclass

from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.api_versions.v3.response import ApiVersion, ApiVersionsResponse
from kio.schema.errors import ErrorCode
from kio.schema.metadata.v12.request import MetadataRequest
from kio.static.primitive import i16

from capture.events import RequestSeen
from capture.listeners import ListenerMap
from capture.replay import replay
from exporter.census.registry import ConnectionRegistry
from harness.kafka_frames import request_frame, response_frame, sized
from harness.synth import TcpConversation, write_pcap

LISTENERS = ListenerMap.parse(["PLAINTEXT=9092", "SSL=9093"])
V4 = (("10.0.0.1", 40000), ("10.0.0.2", 9092))
V6 = (("2001:db8::1", 40000), ("2001:db8::2", 9092))
T0 = 1_700_000_000.0


# --- Kafka content --------------------------------------------------------------------------


def api_versions(corr: int = 1) -> bytes:
    return request_frame(ApiVersionsRequest(client_software_name="census-synth", client_software_version="1.2.3"),
                         corr, "synth-app")


def api_versions_response(corr: int = 1) -> bytes:
    return response_frame(ApiVersionsResponse(
        error_code=ErrorCode.none, throttle_time=datetime.timedelta(0),
        api_keys=(ApiVersion(api_key=i16(3), min_version=i16(0), max_version=i16(12)),
                  ApiVersion(api_key=i16(18), min_version=i16(0), max_version=i16(3)))), corr)


def metadata(corr: int, client_id: str = "synth-app") -> bytes:
    return request_frame(MetadataRequest(topics=None, allow_auto_topic_creation=True,
                                         include_topic_authorized_operations=False), corr, client_id)


def opaque_response(corr: int) -> bytes:
    return sized(struct.pack(">i", corr) + b"\0" * 8)


def metadata_run(first: int, count: int, client_id: str = "synth-app") -> bytes:
    return b"".join(metadata(corr, client_id) for corr in range(first, first + count))


def greeting(conv: TcpConversation) -> list:
    """ApiVersions v3 answered, then a Metadata request answered."""
    return (conv.client(api_versions(1)) + conv.broker(api_versions_response(1))
            + conv.client(metadata(2)) + conv.broker(opaque_response(2)))


def full_conversation(conv: TcpConversation) -> list:
    return conv.handshake() + greeting(conv) + conv.close()


# --- running the capture layer --------------------------------------------------------------


@dataclass
class Run:
    events: list
    result: object  # ReplayResult
    registry: ConnectionRegistry

    def of(self, cls) -> list:
        return [e for e in self.events if isinstance(e, cls)]

    @property
    def conns(self) -> list[dict]:
        return self.registry.connections()

    @property
    def conn(self) -> dict:
        conns = self.conns
        assert len(conns) == 1, conns
        return conns[0]

    @property
    def drops(self) -> dict[str, int]:
        return dict(self.result.stats.drops)

    def requests(self) -> list[tuple[int, int, int]]:
        return [(r.api_key, r.api_version, r.correlation_id) for r in self.of(RequestSeen)]

    def correlation_ids(self) -> list[int]:
        return [r.correlation_id for r in self.of(RequestSeen)]


def run(tmp_path, packets, link="ether", *, pcapng=False, snaplen=None, times=None, **tracker_options) -> Run:
    path = tmp_path / ("c.pcapng" if pcapng else "c.pcap")
    write_pcap(path, packets, link, pcapng=pcapng, snaplen=snaplen, times=times)
    return run_file(path, **tracker_options)


def run_file(path, **tracker_options) -> Run:
    events = []
    result = replay(path, LISTENERS, events.append, **tracker_options)
    registry = ConnectionRegistry()
    for event in events:
        registry.apply(event)
    return Run(events, result, registry)
