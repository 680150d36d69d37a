"""A pcap file writer for batches as the live capture reads them (`capture --write-pcap`).

Owns `PcapWriter`: classic pcap (microsecond timestamps), written straight from pcapy-ng's
batch buffer and packed (sec, usec, offset, caplen) records, with no object per packet. The
original length is not in those records, so it is written as the captured length; the live
capture's snaplen (256 KiB) is above any loopback or Ethernet frame. Stops at `max_bytes`
and says so (`full`) instead of filling the disk. Imports nothing from the project.
"""

from __future__ import annotations

import struct

_FILE_HEADER = struct.Struct("=IHHiIII")
_RECORD = struct.Struct("=IIII")
_META = struct.Struct("=IIII").iter_unpack


class PcapWriter:
    def __init__(self, path, linktype: int, *, snaplen: int = 262_144, max_bytes: int = 1 << 30) -> None:
        self.path = str(path)
        self.max_bytes = max_bytes
        self._file = open(self.path, "wb")
        self._file.write(_FILE_HEADER.pack(0xA1B2C3D4, 2, 4, 0, 0, snaplen, linktype))
        self.written = _FILE_HEADER.size
        self.packets = 0
        self.full = False

    def write_batch(self, buf: bytes, meta: bytes) -> None:
        if self.full or not meta:
            return
        parts = []
        size = 0
        pack = _RECORD.pack
        for sec, usec, off, caplen in _META(meta):
            if self.written + size + 16 + caplen > self.max_bytes:
                self.full = True
                break
            parts.append(pack(sec, usec, caplen, caplen))
            parts.append(buf[off:off + caplen])
            size += 16 + caplen
            self.packets += 1
        self._file.write(b"".join(parts))
        self.written += size

    def close(self) -> None:
        self._file.close()
