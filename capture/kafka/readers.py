"""Pure readers for the Kafka primitive types.

Owns: every primitive of the protocol guide (https://kafka.apache.org/protocol#protocol_types):
fixed-width integers, unsigned varints, (compact) (nullable) strings and bytes, array
lengths and tagged-field sections. Imports only the standard library and `errors`.

Shape: `read_x(buf, offset, end) -> (value, new_offset)`. `end` is where the enclosing frame
(or the buffered part of it) stops; reading past it raises `ProtocolError(TRUNCATED)`, and the
framing layer decides whether that means "wait for more bytes" or "malformed frame".
Lengths are checked against the bytes left before anything is allocated, so a hostile length
or count costs nothing.
"""

from __future__ import annotations

import struct

from .errors import Kind, ProtocolError

_I8 = struct.Struct(">b")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")

# A Kafka unsigned varint encodes at most a 32-bit value: 5 bytes (ByteUtils.readUnsignedVarint).
_MAX_VARINT_BYTES = 5


def _truncated(what: str) -> ProtocolError:
    return ProtocolError(Kind.TRUNCATED, f"{what} runs past the end of the frame")


def read_int8(buf, off: int, end: int) -> tuple[int, int]:
    if off + 1 > end:
        raise _truncated("int8")
    return _I8.unpack_from(buf, off)[0], off + 1


def read_bool(buf, off: int, end: int) -> tuple[bool, int]:
    if off + 1 > end:
        raise _truncated("bool")
    return buf[off] != 0, off + 1


def int16_at(buf, off: int, end: int) -> int:
    """The INT16 at off, alone (for a caller that knows where the next field starts): compiled,
    a C value, where read_int16's (value, offset) pair is two objects more."""
    if off + 2 > end:
        raise _truncated("int16")
    # By index, not struct: compiled, two byte reads cost a fraction of a call into struct (the
    # produce prefix reads one per request); as Python, the same.
    value = buf[off] << 8 | buf[off + 1]
    return value - 0x10000 if value & 0x8000 else value


def read_int16(buf, off: int, end: int) -> tuple[int, int]:
    return int16_at(buf, off, end), off + 2


def read_int32(buf, off: int, end: int) -> tuple[int, int]:
    if off + 4 > end:
        raise _truncated("int32")
    return _I32.unpack_from(buf, off)[0], off + 4


def read_int64(buf, off: int, end: int) -> tuple[int, int]:
    if off + 8 > end:
        raise _truncated("int64")
    return _I64.unpack_from(buf, off)[0], off + 8


def read_uvarint(buf, off: int, end: int) -> tuple[int, int]:
    value = 0
    shift = 0
    for i in range(_MAX_VARINT_BYTES):
        if off + i >= end:
            raise _truncated("varint")
        b = buf[off + i]
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, off + i + 1
        shift += 7
    raise ProtocolError(Kind.VARINT, "unsigned varint longer than 5 bytes")


def _checked_length(length: int, off: int, end: int, what: str) -> int:
    if length < 0:
        raise ProtocolError(Kind.BAD_LENGTH, f"negative {what} length")
    if off + length > end:
        raise _truncated(what)
    return off + length


def _text(buf, start: int, stop: int) -> str:
    # The broker decodes with Java's new String(bytes, UTF_8), which replaces malformed input.
    return str(buf[start:stop], "utf-8", "replace")  # any bytes-like slice: one copy, then the decode


def read_string(buf, off: int, end: int) -> tuple[str, int]:
    """STRING: int16 length, then UTF-8. Null is not allowed."""
    length, off = read_int16(buf, off, end)
    stop = _checked_length(length, off, end, "string")
    return _text(buf, off, stop), stop


def read_nullable_string(buf, off: int, end: int) -> tuple[str | None, int]:
    """NULLABLE_STRING: int16 length, -1 is null."""
    length, off = read_int16(buf, off, end)
    if length == -1:
        return None, off
    stop = _checked_length(length, off, end, "string")
    return _text(buf, off, stop), stop


def read_compact_string(buf, off: int, end: int) -> tuple[str, int]:
    """COMPACT_STRING: uvarint length+1, then UTF-8. 0 (null) is not allowed."""
    n, off = read_uvarint(buf, off, end)
    if n == 0:
        raise ProtocolError(Kind.BAD_LENGTH, "null compact string where a string is required")
    stop = _checked_length(n - 1, off, end, "compact string")
    return _text(buf, off, stop), stop


def read_compact_nullable_string(buf, off: int, end: int) -> tuple[str | None, int]:
    n, off = read_uvarint(buf, off, end)
    if n == 0:
        return None, off
    stop = _checked_length(n - 1, off, end, "compact string")
    return _text(buf, off, stop), stop


def read_bytes_span(buf, off: int, end: int) -> tuple[tuple[int, int], int]:
    """BYTES: int32 length, then the bytes. Returns the (start, stop) span, not a copy."""
    length, off = read_int32(buf, off, end)
    stop = _checked_length(length, off, end, "bytes")
    return (off, stop), stop


def read_compact_bytes_span(buf, off: int, end: int) -> tuple[tuple[int, int], int]:
    n, off = read_uvarint(buf, off, end)
    if n == 0:
        raise ProtocolError(Kind.BAD_LENGTH, "null compact bytes where bytes are required")
    stop = _checked_length(n - 1, off, end, "compact bytes")
    return (off, stop), stop


def read_array_length(buf, off: int, end: int, *, compact: bool, min_item_size: int) -> tuple[int, int]:
    """ARRAY (int32 count) or COMPACT_ARRAY (uvarint count+1). Null arrays read as 0.

    A count that could not fit in the bytes left (each item needs at least `min_item_size`)
    is rejected before any item is read: a hostile count of 2^31 costs one comparison.
    """
    if compact:
        n, off = read_uvarint(buf, off, end)
        count = n - 1
    else:
        count, off = read_int32(buf, off, end)
    if count < 0:
        if count == -1:
            return 0, off
        raise ProtocolError(Kind.BAD_LENGTH, "negative array length")
    if count * min_item_size > end - off:
        raise ProtocolError(Kind.BAD_LENGTH, f"array of {count} items cannot fit in {end - off} bytes")
    return count, off


def walk_tagged_fields(buf, off: int, end: int, visit=None) -> int:
    """A tagged-field section (KIP-482): uvarint count, then (uvarint tag, uvarint size, data).

    Calls `visit(tag, start, stop)` for each field, in order, and returns the offset after the
    section. Nothing is kept per field: a frame of 2-byte fields (up to one per 2 bytes of
    max_decoded_frame) costs no memory beyond the frame itself. The caller decodes the tags it
    knows and skips the rest by length, so tags added by newer Kafka versions are never fatal.
    """
    count, off = read_uvarint(buf, off, end)
    if count * 2 > end - off:
        raise ProtocolError(Kind.BAD_LENGTH, f"{count} tagged fields cannot fit in {end - off} bytes")
    for _ in range(count):
        tag, off = read_uvarint(buf, off, end)
        size, off = read_uvarint(buf, off, end)
        stop = _checked_length(size, off, end, "tagged field")
        if visit is not None:
            visit(tag, off, stop)
        off = stop
    return off


def read_tagged_fields(buf, off: int, end: int) -> tuple[list[tuple[int, int, int]], int]:
    """The section as [(tag, start, stop)] spans (see `walk_tagged_fields`)."""
    fields: list[tuple[int, int, int]] = []
    off = walk_tagged_fields(buf, off, end, lambda tag, start, stop: fields.append((tag, start, stop)))
    return fields, off


def skip_tagged_fields(buf, off: int, end: int) -> int:
    if off < end and buf[off] == 0:  # the common case: no tagged fields
        return off + 1
    return walk_tagged_fields(buf, off, end)
