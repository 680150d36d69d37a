"""What the fuzz modules (tests/core/test_fuzz.py, tests/core/test_fuzz_flows.py) share: their
hypothesis profiles, `Peak` (the tracemalloc peak each example's memory bound is checked against),
and the seed corpus.

Seed corpus: the frames real clients exchanged with Tansu (tests/fixtures/golden/*.json), a few
SASL exchanges built with kio, and the kio transcript of tests/core/transcripts.py.

Runs: `make test` runs each test with the example count its module gives, derandomized and
without the example database (`kafka-census-fuzz` profile), ~60-90 s in all: the same inputs
every time, so a failure reproduces. A long random search: `make fuzz`, or
`KAFKA_CENSUS_FUZZ_EXAMPLES=20000 pytest tests/core/test_fuzz.py tests/core/test_fuzz_flows.py`
(profile `kafka-census-fuzz-long`: that many examples per test, random, failures saved in
.hypothesis/ and replayed first on the next run, each printed with a @reproduce_failure blob); pin
its seed with --hypothesis-seed=N.
"""

from __future__ import annotations

import base64
import datetime
import json
import os
import pathlib
import tracemalloc

from hypothesis import HealthCheck, settings
from hypothesis.database import DirectoryBasedExampleDatabase
from kio.schema.errors import ErrorCode
from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest
from kio.schema.sasl_authenticate.v2.response import SaslAuthenticateResponse
from kio.schema.sasl_handshake.v0.request import SaslHandshakeRequest as Hs0
from kio.schema.sasl_handshake.v0.response import SaslHandshakeResponse as Hs0Resp
from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest as Hs1
from kio.schema.sasl_handshake.v1.response import SaslHandshakeResponse as Hs1Resp

from capture.events import Direction
from harness.kafka_frames import request_frame, response_frame, sized
from tests.core.transcripts import TRANSCRIPT

C, B = Direction.FROM_CLIENT, Direction.FROM_BROKER
KiB = 1024
GOLDEN = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "golden"


# --- profiles --------------------------------------------------------------------------------

EXAMPLES = int(os.environ.get("KAFKA_CENSUS_FUZZ_EXAMPLES") or 0)
settings.register_profile(
    "kafka-census-fuzz", deadline=None, derandomize=True, database=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
settings.register_profile(
    "kafka-census-fuzz-long", settings.get_profile("kafka-census-fuzz"), derandomize=False,
    database=DirectoryBasedExampleDatabase(pathlib.Path(__file__).resolve().parents[2] / ".hypothesis" / "examples"))
# Applied per test, never loaded globally: other test modules keep hypothesis' defaults.
PROFILE = settings.get_profile("kafka-census-fuzz-long" if EXAMPLES else "kafka-census-fuzz")


def fuzz(examples: int):
    """The settings of one fuzz test: `examples` in CI, KAFKA_CENSUS_FUZZ_EXAMPLES if set."""
    return settings(PROFILE, max_examples=EXAMPLES or examples)


class Peak:
    """`with Peak() as p:` ... `p.peak`: bytes allocated at the peak inside the block."""

    def __enter__(self):
        self.was_tracing = tracemalloc.is_tracing()
        if not self.was_tracing:
            tracemalloc.start()
        tracemalloc.reset_peak()
        self.base = tracemalloc.get_traced_memory()[0]
        return self

    def __exit__(self, *exc):
        self.peak = tracemalloc.get_traced_memory()[1] - self.base
        if not self.was_tracing:
            tracemalloc.stop()
        return False


# --- the seed corpus ---------------------------------------------------------------------------


def _golden() -> list[tuple[str, tuple[tuple[Direction, bytes], ...]]]:
    """Every connection of every golden fixture: (name, ((direction, chunk), ...)) as recorded."""
    out = []
    for path in sorted(GOLDEN.glob("*.json")):
        fixture = json.loads(path.read_text())
        for conn in fixture["connections"]:
            chunks = tuple((C if d == "c" else B, base64.b64decode(data)) for d, _, data in conn["chunks"])
            out.append((f"{fixture['client']}#{conn['index']}", chunks))
    return out


def _sasl_seeds() -> list[tuple[str, tuple[tuple[Direction, bytes], ...]]]:
    """SASL in both framings (the golden broker has none): raw tokens after SaslHandshake v0
    (PLAIN, SCRAM) and SaslAuthenticate after v1."""
    def v0(mech, tokens):
        return ((C, request_frame(Hs0(mechanism=mech), 1)),
                (B, response_frame(Hs0Resp(error_code=ErrorCode.none, mechanisms=("PLAIN", "SCRAM-SHA-256")), 1)),
                *tokens)
    plain = v0("PLAIN", ((C, sized(b"\x00alice\x00secret")), (B, sized(b""))))
    scram = v0("SCRAM-SHA-256", ((C, sized(b"n,,n=bob,r=abc")), (B, sized(b"r=abcdef,s=c2FsdA==,i=4096")),
                                 (C, sized(b"c=biws,r=abcdef,p=cHJvb2Y=")), (B, sized(b"v=c2ln"))))
    auth = ((C, request_frame(Hs1(mechanism="PLAIN"), 1)),
            (B, response_frame(Hs1Resp(error_code=ErrorCode.none, mechanisms=("PLAIN",)), 1)),
            (C, request_frame(SaslAuthenticateRequest(auth_bytes=b"\x00carol\x00secret"), 2)),
            (B, response_frame(SaslAuthenticateResponse(error_code=ErrorCode.none, error_message=None, auth_bytes=b"",
                                                        session_lifetime=datetime.timedelta(0)), 2)))
    return [("sasl-v0-plain", plain), ("sasl-v0-scram", scram), ("sasl-v1-plain", auth)]


# The kio-built transcript of tests/core/transcripts.py too: versions and APIs the golden
# clients do not send (Produce v3/v9 with transactional ids, JoinGroup v5/v6, flexible headers).
CORPUS = _golden() + _sasl_seeds() + [("kio-transcript", tuple(TRANSCRIPT))]
CORPUS_NAMES = [name for name, _ in CORPUS]

