"""The one error type of the protocol core, and the labels under which problems are counted.

Owns: `ProtocolError` and the `Kind` label vocabulary. Imports nothing from the project.
A `ProtocolError` means "the peer sent bytes that are not valid Kafka here". Any other
exception escaping the core is a bug. Messages never quote payload bytes, so a password or
token inside a frame cannot leak through an exception.
"""

from __future__ import annotations


class Kind:
    """Bounded label values for decode problems (exported as metric labels)."""

    FRAME_SIZE = "frame_size"                  # size prefix negative or above the maximum
    TRUNCATED = "truncated"                    # a field runs past the end of its frame
    BAD_HEADER = "bad_header"                  # request/response header not decodable
    VARINT = "varint"                          # unsigned varint longer than 5 bytes
    BAD_LENGTH = "bad_length"                  # string/bytes/array length negative or too big
    FRAME_TOO_LARGE_TO_DECODE = "frame_too_large_to_decode"
    UNKNOWN_API_KEY = "unknown_api_key"
    UNKNOWN_API_VERSION = "unknown_api_version"
    UNMATCHED_RESPONSE = "unmatched_response"  # correlation id of no request in flight
    UNANSWERED_REQUEST = "unanswered_request"  # a later response came first: this one never will
    IN_FLIGHT_OVERFLOW = "in_flight_overflow"
    SASL_TOKEN = "sasl_token"                  # a SASL token we could not read
    SASL_UNCERTAIN = "sasl_uncertain"          # a client frame after a SaslHandshake v0 whose answer was
                                               # not seen: maybe a raw token, so dropped unread
    BUFFER_BUDGET = "buffer_budget"            # the caller dropped this direction's buffer (global budget)
    GAP = "gap"                                # the caller lost bytes (TCP gap)
    TRUNCATED_AT_CLOSE = "truncated_at_close"  # connection closed inside a frame


class ProtocolError(Exception):
    """The peer sent bytes that are not valid Kafka protocol at this point."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message

    def __repr__(self) -> str:
        return f"ProtocolError(kind={self.kind!r}, message={self.message!r})"
