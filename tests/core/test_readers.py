"""Tests of the primitive readers (capture/kafka/readers.py), h11 style.

Every reader is fed a valid encoding three ways: the whole buffer; one byte at a time (the
buffer grows and `end` with it: every proper prefix must raise `ProtocolError(TRUNCATED)` and
the full one must parse); and with trailing bytes that must be left untouched (the returned
offset points exactly at them). Encodings come from kio's writers (kio.serial.writers), an
encoder generated independently from the official schemas, or from `struct` where kio has none.
Then the edge cases each reader owns: varint length, negative lengths, null, hostile counts,
unknown tags, invalid UTF-8.
"""

from __future__ import annotations

import io
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.serial import writers as kw

from capture.kafka import Kind, ProtocolError
from capture.kafka import readers as r

# Bytes that must survive every reader untouched: not a valid continuation of anything.
TRAILER = b"\xde\xad\xbe\xef\x00\xff"
LEADER = b"\x7f\x80\x00"  # read at a non-zero offset, too

FAST = settings(max_examples=60, deadline=None)

I8 = st.integers(-(2**7), 2**7 - 1)
I16 = st.integers(-(2**15), 2**15 - 1)
I32 = st.integers(-(2**31), 2**31 - 1)
I64 = st.integers(-(2**63), 2**63 - 1)
# Kafka's unsigned varint carries a 32-bit value (ByteUtils.writeUnsignedVarint).
UVARINT = st.one_of(st.integers(0, 2**32 - 1), st.sampled_from([0, 127, 128, 16383, 16384, 2**21, 2**28, 2**32 - 1]))
TEXT = st.text(max_size=40)
BLOB = st.binary(max_size=60)


def kio(writer, *args) -> bytes:
    buf = io.BytesIO()
    writer(buf, *args)
    return buf.getvalue()


def uvarint(n: int) -> bytes:
    return kio(kw.write_unsigned_varint, n)


def expect_error(kind: str, reader, buf, off: int = 0, end: int | None = None) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        reader(buf, off, len(buf) if end is None else end)
    assert info.value.kind == kind, info.value
    return info.value


def feed_three_ways(reader, encoded: bytes, expected, *, prefix_kind=lambda n: Kind.TRUNCATED):
    """The h11 harness. `prefix_kind(n)` is the error kind of the n-byte prefix."""
    # 1. The whole buffer, as each buffer type the core and its callers pass.
    for buf in (encoded, bytearray(encoded), memoryview(encoded)):
        value, off = reader(buf, 0, len(buf))
        assert value == expected
        assert off == len(encoded)

    # 2. One byte at a time: the buffer really is only the prefix, so a reader that ignored
    #    `end` would hit IndexError instead of raising the protocol error.
    grown = bytearray()
    for n, byte in enumerate(encoded):
        err = expect_error(prefix_kind(n), reader, bytes(grown))
        assert str(err)  # every error carries a message
        grown.append(byte)
    value, off = reader(bytes(grown), 0, len(grown))
    assert value == expected and off == len(encoded)

    # 3. Trailing bytes, and a non-zero start: the offset lands exactly on the trailer.
    buf = bytearray(LEADER + encoded + TRAILER)
    before = bytes(buf)
    value, off = reader(buf, len(LEADER), len(buf))
    assert value == expected
    assert off == len(LEADER) + len(encoded)
    assert bytes(buf[off:]) == TRAILER
    assert bytes(buf) == before  # readers never write

    # 4. `end` is a hard limit even when the buffer holds more (the rest of another frame).
    if encoded:
        expect_error(prefix_kind(len(encoded) - 1), reader, encoded + TRAILER, 0, len(encoded) - 1)


# Span readers return offsets; compare the bytes they point at.
def span_as_bytes(reader):
    def read(buf, off, end):
        (start, stop), new_off = reader(buf, off, end)
        assert off <= start <= stop == new_off <= end
        return bytes(buf[start:stop]), new_off

    return read


# --------------------------------------------------------------------------- fixed width


@FAST
@given(I8)
def test_int8(value):
    feed_three_ways(r.read_int8, kio(kw.write_int8, value), value)


@FAST
@given(st.booleans())
def test_bool(value):
    feed_three_ways(r.read_bool, kio(kw.write_boolean, value), value)


def test_bool_is_any_nonzero_byte():
    # The broker reads a boolean as `readByte() != 0` (generated Readable code).
    assert r.read_bool(b"\x02", 0, 1) == (True, 1)
    assert r.read_bool(b"\x00", 0, 1) == (False, 1)


@FAST
@given(I16)
def test_int16(value):
    feed_three_ways(r.read_int16, kio(kw.write_int16, value), value)


@FAST
@given(I16)
def test_int16_at_is_read_int16_without_the_offset(value):
    encoded = kio(kw.write_int16, value)
    for buf in (encoded + TRAILER, bytearray(LEADER + encoded), memoryview(encoded)):
        off = len(LEADER) if isinstance(buf, bytearray) else 0
        assert r.int16_at(buf, off, off + 2) == value == r.read_int16(buf, off, off + 2)[0]
    expect_error(Kind.TRUNCATED, r.int16_at, encoded[:1])
    expect_error(Kind.TRUNCATED, r.int16_at, encoded + TRAILER, 0, 1)  # `end`, not the buffer, bounds it


@FAST
@given(I32)
def test_int32(value):
    feed_three_ways(r.read_int32, kio(kw.write_int32, value), value)


@FAST
@given(I64)
def test_int64(value):
    feed_three_ways(r.read_int64, kio(kw.write_int64, value), value)


# --------------------------------------------------------------------------- varint


@FAST
@given(UVARINT)
def test_uvarint(value):
    encoded = uvarint(value)
    assert 1 <= len(encoded) <= 5
    feed_three_ways(r.read_uvarint, encoded, value)


def test_uvarint_five_bytes_is_the_maximum():
    # 2^32-1 takes all five bytes (ByteUtils: at most 5 for an int).
    assert uvarint(2**32 - 1) == b"\xff\xff\xff\xff\x0f"
    assert r.read_uvarint(b"\xff\xff\xff\xff\x0f", 0, 5) == (2**32 - 1, 5)
    # A 6th byte (5th still has the continuation bit) is an error, not a longer number...
    expect_error(Kind.VARINT, r.read_uvarint, b"\xff\xff\xff\xff\xff\x01")
    expect_error(Kind.VARINT, r.read_uvarint, b"\x80\x80\x80\x80\x80\x00")  # even a non-canonical 0
    # ...known as soon as the 5th byte is seen: the 6th need not have arrived.
    expect_error(Kind.VARINT, r.read_uvarint, b"\xff\xff\xff\xff\xff")
    for n in range(5):
        expect_error(Kind.TRUNCATED, r.read_uvarint, b"\xff" * n)


def test_uvarint_accepts_non_canonical_padding():
    # The broker's reader accepts zero-padded forms too, up to 5 bytes.
    assert r.read_uvarint(b"\x81\x80\x00", 0, 3) == (1, 3)


# --------------------------------------------------------------------------- strings


@FAST
@given(TEXT)
def test_string(value):
    feed_three_ways(r.read_string, kio(kw.write_legacy_string, value), value)


@FAST
@given(st.one_of(st.none(), TEXT))
def test_nullable_string(value):
    feed_three_ways(r.read_nullable_string, kio(kw.write_nullable_legacy_string, value), value)


@FAST
@given(TEXT)
def test_compact_string(value):
    feed_three_ways(r.read_compact_string, kio(kw.write_compact_string, value), value)


@FAST
@given(st.one_of(st.none(), TEXT))
def test_compact_nullable_string(value):
    feed_three_ways(r.read_compact_nullable_string, kio(kw.write_nullable_compact_string, value), value)


def test_strings_with_a_multi_byte_varint_length():
    value = "k" * 200  # compact length 201 needs two varint bytes
    encoded = kio(kw.write_compact_string, value)
    assert encoded[:2] == b"\xc9\x01"
    feed_three_ways(r.read_compact_string, encoded, value)
    feed_three_ways(r.read_compact_nullable_string, encoded, value)


def test_null_where_a_string_is_required():
    # STRING and COMPACT_STRING have no null: -1 / 0 is a bad length, not None.
    expect_error(Kind.BAD_LENGTH, r.read_string, b"\xff\xff")
    expect_error(Kind.BAD_LENGTH, r.read_compact_string, b"\x00")
    # The nullable forms read the same bytes as None and consume exactly them.
    assert r.read_nullable_string(b"\xff\xff" + TRAILER, 0, 2 + len(TRAILER)) == (None, 2)
    assert r.read_compact_nullable_string(b"\x00" + TRAILER, 0, 1 + len(TRAILER)) == (None, 1)


@pytest.mark.parametrize("length", [-2, -100, -(2**15)])
def test_negative_string_lengths(length):
    encoded = struct.pack(">h", length) + b"abc"
    expect_error(Kind.BAD_LENGTH, r.read_string, encoded)
    expect_error(Kind.BAD_LENGTH, r.read_nullable_string, encoded)  # only -1 means null


def test_string_length_past_the_end_is_truncated():
    expect_error(Kind.TRUNCATED, r.read_string, struct.pack(">h", 10) + b"abc")
    expect_error(Kind.TRUNCATED, r.read_compact_string, uvarint(11) + b"abc")
    # A huge varint length (up to 2^32-1) is a truncation too, and costs nothing.
    expect_error(Kind.TRUNCATED, r.read_compact_nullable_string, uvarint(2**32 - 1) + b"abc")


@pytest.mark.parametrize(
    "raw, text",
    [
        (b"\xff\xfeok", "\ufffd\ufffdok"),  # bytes that never occur in UTF-8
        (b"caf\xc3", "caf\ufffd"),  # a multi-byte sequence cut short
        (b"\xc3\xa9t\xc3\xa9", "\u00e9t\u00e9"),  # valid multi-byte text is untouched
    ],
)
def test_invalid_utf8_is_replaced_like_java(raw, text):
    # The broker decodes with new String(bytes, UTF_8), which replaces malformed input with
    # U+FFFD instead of failing; a client id with a stray byte is still a client id.
    n = len(raw)
    assert r.read_string(struct.pack(">h", n) + raw, 0, 2 + n) == (text, 2 + n)
    assert r.read_nullable_string(struct.pack(">h", n) + raw, 0, 2 + n) == (text, 2 + n)
    compact = uvarint(n + 1) + raw
    assert r.read_compact_string(compact, 0, len(compact)) == (text, len(compact))
    assert r.read_compact_nullable_string(compact, 0, len(compact)) == (text, len(compact))


# --------------------------------------------------------------------------- bytes


@FAST
@given(BLOB)
def test_bytes_span(value):
    feed_three_ways(span_as_bytes(r.read_bytes_span), kio(kw.write_legacy_bytes, value), value)


@FAST
@given(BLOB)
def test_compact_bytes_span(value):
    # COMPACT_BYTES has the same wire form as a compact string (length+1, then the bytes).
    feed_three_ways(span_as_bytes(r.read_compact_bytes_span), kio(kw.write_compact_string, value), value)


def test_null_and_negative_bytes():
    expect_error(Kind.BAD_LENGTH, r.read_bytes_span, kio(kw.write_nullable_legacy_bytes, None))
    expect_error(Kind.BAD_LENGTH, r.read_bytes_span, struct.pack(">i", -(2**31)) + b"x")
    expect_error(Kind.BAD_LENGTH, r.read_compact_bytes_span, kio(kw.write_nullable_compact_string, None))
    expect_error(Kind.TRUNCATED, r.read_bytes_span, struct.pack(">i", 2**31 - 1) + b"x")


# --------------------------------------------------------------------------- arrays


def read_int16_array(compact: bool):
    """An ARRAY / COMPACT_ARRAY of int16: the count via read_array_length, then the items."""

    def read(buf, off, end):
        count, off = r.read_array_length(buf, off, end, compact=compact, min_item_size=2)
        items = []
        for _ in range(count):
            item, off = r.read_int16(buf, off, end)
            items.append(item)
        return items, off

    return read


@FAST
@given(st.one_of(st.none(), st.lists(I16, max_size=12)), st.booleans())
def test_array(items, compact):
    write = kw.compact_array_writer(kw.write_int16) if compact else kw.legacy_array_writer(kw.write_int16)
    encoded = kio(write, items)
    count_len = len(encoded) - 2 * len(items or ())
    # A prefix that holds the whole count but not the items is rejected by the count check
    # ("cannot fit", before any item is read): BAD_LENGTH, not TRUNCATED. Decoded bodies are
    # only read once their frame is complete, where that is the right diagnosis.
    feed_three_ways(
        read_int16_array(compact), encoded, list(items or ()),  # a null array reads as empty
        prefix_kind=lambda n: Kind.TRUNCATED if n < count_len else Kind.BAD_LENGTH,
    )


@pytest.mark.parametrize("compact", [False, True])
def test_hostile_array_count_costs_one_comparison(compact):
    count = 2**31 - 1
    head = uvarint(count + 1) if compact else struct.pack(">i", count)
    buf = head + b"\x00\x01\x00\x02"  # a tiny buffer: two int16 where 2^31-1 were announced
    err = expect_error(Kind.BAD_LENGTH,
                       lambda b, o, e: r.read_array_length(b, o, e, compact=compact, min_item_size=2), buf)
    assert "cannot fit" in str(err)


def test_negative_array_counts():
    read = lambda b, o, e: r.read_array_length(b, o, e, compact=False, min_item_size=1)  # noqa: E731
    assert read(struct.pack(">i", -1), 0, 4) == (0, 4)  # null array
    expect_error(Kind.BAD_LENGTH, read, struct.pack(">i", -2))
    expect_error(Kind.BAD_LENGTH, read, struct.pack(">i", -(2**31)))


def test_array_count_exactly_fitting_is_accepted():
    read = lambda b, o, e: r.read_array_length(b, o, e, compact=False, min_item_size=3)  # noqa: E731
    assert read(struct.pack(">i", 2) + bytes(6), 0, 10) == (2, 4)
    expect_error(Kind.BAD_LENGTH, read, struct.pack(">i", 2) + bytes(5))


# --------------------------------------------------------------------------- tagged fields

# (tag, payload) pairs; tags are uvarints, so large ones take several bytes.
TAGGED = st.lists(st.tuples(st.integers(0, 2**31 - 1), st.binary(max_size=20)), max_size=5, unique_by=lambda t: t[0])


def encode_tagged(fields) -> bytes:
    out = io.BytesIO()
    kw.write_unsigned_varint(out, len(fields))
    for tag, payload in sorted(fields):
        kw.write_tagged_field(out, tag, lambda b, v: b.write(v), payload)
    return out.getvalue()


def read_tagged_as_bytes(buf, off, end):
    fields, new_off = r.read_tagged_fields(buf, off, end)
    return [(tag, bytes(buf[a:b])) for tag, a, b in fields], new_off


def tagged_prefix_kind(encoded: bytes, count: int):
    count_len = len(uvarint(count))

    # Each field takes at least 2 bytes (tag, size): a prefix too short for that many fields
    # fails the count check (BAD_LENGTH); one long enough runs off the end (TRUNCATED).
    def kind(n):
        if n < count_len or count * 2 <= n - count_len:
            return Kind.TRUNCATED
        return Kind.BAD_LENGTH

    return kind


@FAST
@given(TAGGED)
def test_tagged_fields(fields):
    encoded = encode_tagged(fields)
    expected = sorted(fields)
    feed_three_ways(read_tagged_as_bytes, encoded, expected, prefix_kind=tagged_prefix_kind(encoded, len(fields)))


@FAST
@given(TAGGED)
def test_skip_tagged_fields(fields):
    encoded = encode_tagged(fields)
    skip = lambda b, o, e: (None, r.skip_tagged_fields(b, o, e))  # noqa: E731
    feed_three_ways(skip, encoded, None, prefix_kind=tagged_prefix_kind(encoded, len(fields)))


def test_unknown_tags_are_skipped_by_length():
    # Tag 0 is known to some caller; 7 and 100000 are from a newer Kafka. Their sizes alone
    # carry the reader past them, whatever their payload looks like (here: a fake varint
    # run and bytes that look like another tagged section).
    fields = [(0, b"\x01"), (7, b"\xff\xff\xff\xff\xff\xff"), (100000, b"\x05\x00\x00")]
    encoded = encode_tagged(fields)
    assert r.read_tagged_fields(encoded + TRAILER, 0, len(encoded) + len(TRAILER))[1] == len(encoded)
    assert r.skip_tagged_fields(encoded + TRAILER, 0, len(encoded) + len(TRAILER)) == len(encoded)
    assert read_tagged_as_bytes(encoded, 0, len(encoded))[0] == fields


def test_tagged_field_edge_cases():
    expect_error(Kind.BAD_LENGTH, r.read_tagged_fields, uvarint(2**31) + b"\x00\x00")  # hostile count
    expect_error(Kind.BAD_LENGTH, r.skip_tagged_fields, uvarint(2**31) + b"\x00\x00")
    expect_error(Kind.TRUNCATED, r.read_tagged_fields, b"\x01\x00\x05ab")  # size past the end
    expect_error(Kind.VARINT, r.read_tagged_fields, b"\x01\xff\xff\xff\xff\xff\x00")  # 6-byte tag
    assert r.skip_tagged_fields(b"\x00" + TRAILER, 0, 1 + len(TRAILER)) == 1  # the common empty case
    expect_error(Kind.TRUNCATED, r.skip_tagged_fields, b"")
