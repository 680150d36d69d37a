"""A pcap file writer for batches as the live capture reads them (`capture --write-pcap`).

Owns `PcapWriter`: classic pcap (microsecond timestamps), written straight from pcapy-ng's
batch buffer and packed (sec, usec, offset, caplen) records, with no object per packet. The
original length is not in those records, so it is written as the captured length; the live
capture's snaplen (256 KiB) is above any loopback or Ethernet frame. Stops at `max_bytes`
and says so (`full`) instead of filling the disk. Imports nothing from the project.

The file holds every byte on the wire, SASL passwords and tokens included, so it is created
as a new file only (O_CREAT|O_EXCL: an existing file is refused, never truncated), never
through a symlink (O_NOFOLLOW), mode 0600. A failed write (disk full, I/O error) is never
fatal to the capture: the file is cut back to its last whole record, writing stops, and it is
counted (`write_errors`, `failed`, `error`) with one warning.
"""

from __future__ import annotations

import logging
import os
import struct

_FILE_HEADER = struct.Struct("=IHHiIII")
_RECORD = struct.Struct("=IIII")
_META = struct.Struct("=IIII").iter_unpack

log = logging.getLogger("kafka-census")


class PcapWriterError(Exception):
    """The pcap file cannot be created; the message is one line for the operator."""


class PcapWriter:
    def __init__(self, path, linktype: int, *, snaplen: int = 262_144, max_bytes: int = 1 << 30) -> None:
        self.path = str(path)
        self.max_bytes = max_bytes
        try:
            self._fd: int | None = os.open(
                self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            what = "is a symlink" if os.path.islink(self.path) else "already exists"
            raise PcapWriterError(f"--write-pcap {self.path} {what}: refusing to overwrite it "
                                  "(it would hold every credential on the wire); give a new file name") from None
        except OSError as exc:
            raise PcapWriterError(f"cannot create --write-pcap {self.path}: {exc.strerror or exc}") from None
        self.written = 0
        self.packets = 0
        self.full = False
        self.failed = False  # a write failed: nothing more is written
        self.write_errors = 0
        self.error: str | None = None
        self._write(_FILE_HEADER.pack(0xA1B2C3D4, 2, 4, 0, 0, snaplen, linktype), 0)

    def write_batch(self, buf: bytes, meta: bytes) -> None:
        if self.full or self.failed or not meta:
            return
        parts = []
        size = 0
        count = 0
        pack = _RECORD.pack
        for sec, usec, off, caplen in _META(meta):
            if self.written + size + 16 + caplen > self.max_bytes:
                self.full = True
                break
            parts.append(pack(sec, usec, caplen, caplen))
            parts.append(buf[off:off + caplen])
            size += 16 + caplen
            count += 1
        self._write(b"".join(parts), count)

    def _write(self, data: bytes, packets: int) -> None:
        fd = self._fd
        if fd is None:  # closed: nothing more is written (os.write would raise TypeError)
            return
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(fd, view):]
        except OSError as exc:
            self.write_errors += 1
            self.failed = True
            self.error = exc.strerror or str(exc)
            try:  # a short write leaves half a record: cut back so the file stays readable
                os.ftruncate(fd, self.written)
            except OSError:
                pass
            log.warning("cannot write --write-pcap %s: %s; no more packets are written to it (the capture "
                        "goes on)", self.path, self.error)
            return
        self.written += len(data)
        self.packets += packets

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)
