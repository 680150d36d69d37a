"""Request and response header versions, and the request header reader.

Owns: which header version a frame uses, with both exceptions, and nothing else.
Imports only `readers`, `errors` and the generated `api_table`.

Sources: clients/src/main/resources/common/message/RequestHeader.json and ResponseHeader.json
(apache/kafka), KIP-482 (flexible versions and tagged fields), KIP-511 (ApiVersionsResponse).
"""

from __future__ import annotations

from .api_table import ApiSpec
from .errors import Kind, ProtocolError
from .readers import skip_tagged_fields

API_VERSIONS = 18
CONTROLLED_SHUTDOWN = 7


def request_header_version(api_key: int, api_version: int, spec: ApiSpec | None) -> int:
    """0: (api_key, api_version, correlation_id); 1: + client_id; 2: 1 + tagged fields.

    client_id is a NULLABLE_STRING (int16 length) in v1 and v2 alike, never a compact string,
    even in the flexible header v2 (RequestHeader.json: "flexibleVersions": "none" on ClientId).

    RequestHeader.json: "Version 0 of the RequestHeader is only used by v0 of
    ControlledShutdownRequest." An API newer than the generated table is read as header v1:
    client_id is at the same place in v1 and v2, and its body is skipped anyway.
    """
    if api_key == CONTROLLED_SHUTDOWN and api_version == 0:
        return 0
    if spec is not None and spec.flexible_from is not None and api_version >= spec.flexible_from:
        return 2
    return 1


def response_header_version(api_key: int, api_version: int, spec: ApiSpec | None) -> int:
    """0: correlation_id; 1: + tagged fields, for flexible versions.

    Exception (KIP-511, ApiVersionsResponse.json): ApiVersionsResponse always uses header v0,
    so a client that does not know the broker's versions can still read the answer.
    """
    if api_key == API_VERSIONS:
        return 0
    if spec is not None and spec.flexible_from is not None and api_version >= spec.flexible_from:
        return 1
    return 0


def skip_response_header(buf, off: int, end: int, api_key: int, api_version: int, spec: ApiSpec | None) -> int:
    """Skip a response header at `off` (just after the size prefix); return the body offset."""
    off += 4  # correlation_id, already read by the caller
    if off > end:
        raise ProtocolError(Kind.TRUNCATED, "response header runs past the end of the frame")
    if response_header_version(api_key, api_version, spec) >= 1:
        off = skip_tagged_fields(buf, off, end)
    return off
