"""Resynchronisation: where Kafka frames start again in a direction's buffer after the frame
boundary was lost (a `Desync`).

Owns: what a plausible request or response header is (`plausible_request`,
`plausible_response`), the candidate headers found with one regex in C (requests: api_key and
version in the table after a bounded size; responses: a correlation id in flight), and the
decision of a scan (`Resync.scan`): wait for more bytes, resume at a verified candidate, or
skip a large one unread to verify the header after it. It moves no state, pops no request and
emits nothing: connection.py applies the verdict (its SCANNING and VERIFYING states). Imports
only `api_table`, `headers` and `readers` of `capture.kafka` and the standard library.

A candidate header is trusted once the header after its frame is plausible too: checked in the
buffer when both fit in max_decoded_frame (waiting for bytes if need be), otherwise, for a
large frame with no verifiable alternative in the buffer, by skipping it unread and checking
the next (VERIFYING). What a scan keeps is at most one candidate's frame and the next header,
so scanning holds <= max_decoded_frame + 4 bytes.
"""

from __future__ import annotations

import re
import struct

from .api_table import API_TABLE
from .headers import request_header_version
from .readers import int16_at

# A request header up to its client_id length (size, key, version, correlation id, length):
# what scanning keeps at the end of the buffer, and what a plausibility check reads.
SCAN_KEEP = _SCAN_KEEP = 14
# Resync.scan's verdicts: (WAIT, keep_from, 0), (FOUND, candidate, next frame), (LARGE, candidate,
# end of its frame).
WAIT, FOUND, LARGE = 0, 1, 2
# Ids a response pattern covers beyond the highest in flight. Fewer: more compiles (~0.25 ms
# each) on lossy traffic (produce.pcap with 1 packet in 3 lost: 1183 at 16, 583 at 64, 194 at
# 256); more: more lookalike ids for Python to reject (8 MiB of "00 00 00 80" repeated after a
# desync, id 1 in flight: 1.3 s at 256, 0.05 s at 64).
_IDS_AHEAD = 64

_SIZE = struct.Struct(">i")
_REQ = struct.Struct(">ihhi")  # size, api_key, api_version, correlation_id
_RESP = struct.Struct(">ii")  # size, correlation_id


def plausible_request(buf, i: int, max_frame_size: int):
    """True / False / None (need more bytes): does a request header start at i?"""
    end = len(buf)
    if end - i < 12:
        return None
    size, api_key, api_version, corr = _REQ.unpack_from(buf, i)
    if size < 10 or size > max_frame_size or corr < 0:
        return False  # clients count correlation ids up from 0 (NetworkClient, librdkafka)
    spec = API_TABLE.get(api_key)
    if spec is None or not spec.min_version <= api_version <= spec.max_version:
        return False
    if request_header_version(api_key, api_version, spec) == 0:
        return True  # no client_id to check
    if end - i < 14:
        return None
    cid_len = int16_at(buf, i + 12, end)
    return -1 <= cid_len <= size - 10


def plausible_response(buf, i: int, max_frame_size: int, in_flight: dict):
    """True / False / None (need more bytes): does a response to a request in flight start at i?"""
    if len(buf) - i < 8:
        return None
    size, corr = _RESP.unpack_from(buf, i)
    return 4 <= size <= max_frame_size and corr in in_flight


class Resync:
    """One connection's scans: its limits, and the pattern of the response ids it looks for
    (kept across scans: one pattern serves many)."""

    __slots__ = ("max_frame_size", "max_decoded_frame", "response_cover")

    def __init__(self, max_frame_size: int, max_decoded_frame: int) -> None:
        self.max_frame_size = max_frame_size
        self.max_decoded_frame = max_decoded_frame
        self.response_cover: tuple | None = None  # (lo, hi, pattern) of the ids a scan looks for

    def forget_responses(self) -> None:
        """The requests in flight were forgotten: the next response scan covers the ids anew."""
        self.response_cover = None

    def scan(self, buf, start: int, requests: bool, in_flight: dict) -> tuple:
        """Where frames start again in buf[start:], for a request stream or a response stream:
        (WAIT, keep_from, 0): the bytes before keep_from can go, wait for more; (FOUND, i,
        following): a verified candidate at i, frames resume at `following`, the frame after it;
        (LARGE, i, following): only a candidate too large to verify here, whose frame ends at
        `following`, to be skipped unread and the header there checked (VERIFYING)."""
        end = len(buf)
        max_frame_size = self.max_frame_size
        window = self.max_decoded_frame + 4
        large = -1
        if requests:
            candidates = self._request_candidates(buf, start)
        else:
            candidates = self._response_candidates(buf, start, in_flight)
        for i in candidates:
            if requests:
                verdict = plausible_request(buf, i, max_frame_size)
            else:
                verdict = plausible_response(buf, i, max_frame_size, in_flight)
            if verdict is None:  # the header itself is cut by the end of the buffer
                return WAIT, i, 0
            if not verdict:
                continue
            following = i + 4 + _SIZE.unpack_from(buf, i)[0]
            if following + _SCAN_KEEP - i > window:  # the frame and the next header must fit
                if large < 0:
                    large = i
                continue
            if following > end:
                after = None
            elif requests:
                after = plausible_request(buf, following, max_frame_size)
            else:
                after = plausible_response(buf, following, max_frame_size, in_flight)
            if after is None:  # verifiable once the rest arrives (within the window)
                return WAIT, i, 0
            if after:
                return FOUND, i, following
        if large >= 0:
            return LARGE, large, large + 4 + _SIZE.unpack_from(buf, large)[0]
        return WAIT, max(start, end - _SCAN_KEEP), 0

    def _request_candidates(self, buf, start: int):
        """Positions, in order and lazily, of plausible-looking request headers."""
        search = request_scan_pattern(self.max_frame_size).search
        m = search(buf, start + 4)  # the pattern matches at the api_key; candidates may overlap
        while m is not None:
            i = m.start() - 4
            yield i
            m = search(buf, i + 5)

    def _response_candidates(self, buf, start: int, in_flight: dict):
        """Positions, in order and lazily, of headers answering a request in flight: one pass
        in C over the buffer whatever the number of ids (one search per id made resync under
        loss, with the table full of requests whose answers were lost, ~150x slower)."""
        if not in_flight:
            return
        lo, hi = min(in_flight), max(in_flight)
        if lo < 0 <= hi:  # both signs: as unsigned the range wraps, so take every id
            lo, hi = 0, 0xFFFFFFFF
        lo, hi = lo & 0xFFFFFFFF, hi & 0xFFFFFFFF
        cover = self.response_cover
        if cover is None or lo < cover[0] or hi > cover[1]:
            # Cover ids still to come too (clients count up, KafkaClient and librdkafka alike): one
            # pattern serves many scans, where compiling one per scan cost a third of a lossy replay.
            ahead = min(hi + _IDS_AHEAD, hi | 0xFFFF) if lo >> 16 == hi >> 16 else hi
            cover = self.response_cover = (lo, ahead, response_scan_pattern(self.max_frame_size, lo, ahead))
        search = cover[2].search
        unpack = _RESP.unpack_from
        m = search(buf, start + 4)  # the pattern matches at the id; candidates may overlap
        while m is not None:
            i = m.start() - 4
            if unpack(buf, i)[1] in in_flight:
                yield i
            m = search(buf, i + 5)


_scan_patterns: dict[int, re.Pattern] = {}


def request_scan_pattern(max_frame_size: int) -> re.Pattern:
    """Candidate request headers, matched at their api_key: api_key and api_version within the
    table's range, preceded by a size of 10..max_frame_size (checked on its leading bytes), in
    C. The size is a lookbehind rather than the first item so that zero-filled bytes (padding
    in record batches) fail in C: as a leading lookahead they matched everywhere and each was
    rejected in Python (2 MB/s)."""
    patterns = _scan_patterns  # a local: compiled, typed as a dict (resync.pxd)
    pattern = patterns.get(max_frame_size)
    if pattern is None:
        pattern = patterns[max_frame_size] = _compile_scan_pattern(max_frame_size)
    return pattern


def _compile_scan_pattern(max_frame_size: int) -> re.Pattern:
    top = min(max_frame_size >> 24, 0x7F)
    max_key = max(API_TABLE)
    max_version = max(spec.max_version for spec in API_TABLE.values())
    assert max_key < 256 and max_version < 256
    return re.compile(
        b"\\x00[\\x00-%s]\\x00[\\x00-%s](?<=%s....)"
        % (_esc(max_key), _esc(max_version), _size_pattern(top, 10)),
        re.DOTALL,
    )


def _size_pattern(top: int, least: int) -> bytes:
    """A big-endian int32 size of `least`..(top+1)*2^24-1, from its leading bytes (least < 256)."""
    size = b"\\x00(?:[\\x01-\\xff]..|\\x00(?:[\\x01-\\xff].|\\x00[%s-\\xff]))" % _esc(least)
    return b"(?:[\\x01-%s]...|%s)" % (_esc(top), size) if top else size


def _esc(byte: int) -> bytes:
    return re.escape(bytes([byte]))


_response_patterns: dict[tuple, re.Pattern] = {}


def response_scan_pattern(max_frame_size: int, lo: int, hi: int) -> re.Pattern:
    """Candidate response headers, matched at their correlation id: one whose big-endian bytes
    lie in lo..hi (unsigned), preceded by a size of 4..max_frame_size (checked on its leading
    bytes). The caller checks that the id is in flight: the range is a superset. The id comes
    first so that re's literal-prefix search skips most bytes (GB/s on random data, where a
    leading lookahead ran at tens of MB/s)."""
    key = (max_frame_size, lo, hi)
    pattern = _response_patterns.get(key)
    if pattern is None:
        if len(_response_patterns) >= 256:  # ids move on: forget ranges no longer in use
            _response_patterns.clear()
        a, b = lo.to_bytes(4, "big"), hi.to_bytes(4, "big")
        if a[:2] == b[:2]:  # the usual case, one 65536-id block: exact on the low 16 bits
            x, y = a[2], b[2]
            if x == y:
                low = b"%s[%s-%s]" % (_esc(x), _esc(a[3]), _esc(b[3]))
            else:
                low = b"%s[%s-\\xff]" % (_esc(x), _esc(a[3]))
                if y - x > 1:
                    low += b"|[%s-%s]." % (_esc(x + 1), _esc(y - 1))
                low = b"(?:%s|%s[\\x00-%s])" % (low, _esc(y), _esc(b[3]))
            corr = _esc(a[0]) + _esc(a[1]) + low
        else:  # across blocks: the first differing byte's range, then any
            n = 0 if a[0] != b[0] else 1
            corr = b"".join(_esc(c) for c in a[:n]) + b"[%s-%s]" % (_esc(a[n]), _esc(b[n])) + b"." * (3 - n)
        top = min(max_frame_size >> 24, 0x7F)
        pattern = _response_patterns[key] = re.compile(corr + b"(?<=%s....)" % _size_pattern(top, 4), re.DOTALL)
    return pattern
