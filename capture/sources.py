"""Packet sources: pcap/pcapng files and live interfaces, both through libpcap (pcapy-ng).

Owns `PcapFile`, `LiveCapture` and `CaptureError`. Packets arrive in batches exactly as
pcapy-ng's `next_batch` returns them (one bytes buffer plus packed (sec, usec, offset, caplen)
records), so there is no Python object per packet until a parser looks at it. Every libpcap
failure becomes a one-line `CaptureError` an operator can act on. Imports pcapy and
`capture.packets`/`capture.listeners` only (and `capture._native`, to know which path runs).

Files: with the compiled hot path, a classic pcap file (microsecond, version 2.4, either byte
order) is read in large windows by `os.pread` and its records walked in C
(`capture.packets.pcap_records`): a batch is then the window itself, where libpcap copies every
packet twice (into its buffer, then into pcapy-ng's). libpcap still opens and checks every
file, reads pcapng and the other variants, and takes over from the first record it would cut
or refuse (and a damaged tail), so the batches are the ones libpcap gives
(tests/capture/test_capture_pcapfile.py compares them).

Live capture: libpcap with a kernel BPF filter built from the listener ports and a large
kernel buffer. pcapy-ng 2.1.0 does not expose pcap_set_immediate_mode, so a short read
timeout (50 ms, the TPACKET_V3 block timeout) bounds how long a packet waits in the kernel
ring instead. The handle is non-blocking and we poll its descriptor ourselves: a blocking
read on a TPACKET_V3 ring never returns while the wire is silent (the kernel retires only
non-empty blocks), which would make a quiet capture impossible to stop. libpcap itself skips
the outgoing copy of each packet on `lo` (and on `any` for loopback traffic), so each packet
is seen once. The kernel still queues both copies on `lo` (libpcap 1.9, bundled by pcapy-ng,
drops the outgoing one in user space), so there pcap_stats counts each packet twice. An
`inbound` filter would avoid that, but lost packets in our tests: not used.
"""

from __future__ import annotations

import os
import select
import struct

import pcapy

from capture import _native
from capture.packets import LINKTYPE_ETHERNET, MAX_SNAPLEN, UnsupportedLinkType, pcap_records, segment_parser

BATCH = 4096  # packets per next_batch call: amortizes the C/Python boundary
WINDOW = 8 << 20  # bytes of a pcap file read at once by the compiled reader (> 16 + MAX_SNAPLEN)
WINDOW_RECORDS = 16_384  # records per batch at most, as a bound on the batch's bookkeeping


# pcap_activate's negative statuses (pcap/pcap.h).
_ACTIVATE_ERRORS = {
    -1: "generic libpcap error", -4: "already activated", -5: "no such device",
    -6: "monitor mode not supported", -7: "not activated", -8: "permission denied",
    -9: "interface is not up", -10: "cannot set time stamp type", -11: "promiscuous mode: permission denied",
    -12: "time stamp precision not supported",
}


class CaptureError(Exception):
    """A packet source cannot be opened or read; the message is for the operator."""


def _pcap_message(exc: Exception) -> str:
    return str(exc).strip().rstrip(".") or exc.__class__.__name__


def _check_linktype(linktype: int, what: str) -> None:
    try:
        segment_parser(linktype)
    except UnsupportedLinkType as exc:
        raise CaptureError(f"{what}: {exc}") from None


class PcapFile:
    """A pcap or pcapng file. `truncated` says why reading stopped early, if it did."""

    def __init__(self, path, *, own_reader: bool | None = None) -> None:
        """`own_reader`: walk classic pcap records in C (see the module docstring); None (the
        default) when the hot path runs compiled, where it is faster than libpcap."""
        self.path = str(path)
        if not os.path.exists(self.path):
            raise CaptureError(f"{self.path}: no such file")
        if os.path.isdir(self.path):
            raise CaptureError(f"{self.path}: is a directory, not a pcap file")
        self.size = os.path.getsize(self.path)
        self._pcap = self._open()
        self.linktype = self._pcap.datalink()
        _check_linktype(self.linktype, self.path)
        self.truncated: str | None = None
        self.packets = 0
        if own_reader is None:
            own_reader = _native.native_modules().get("capture.packets") == _native.COMPILED
        self._own = self._own_format() if own_reader else None

    def _own_format(self) -> tuple[bool, int] | None:
        """(little-endian, libpcap's snapshot length) of a file the own reader walks; None for
        pcapng and every other variant (libpcap reads those)."""
        with open(self.path, "rb") as f:
            head = f.read(24)
        if len(head) < 24:
            return None
        if head[:4] == b"\xd4\xc3\xb2\xa1":
            little = True
        elif head[:4] == b"\xa1\xb2\xc3\xd4":
            little = False
        else:
            return None
        major, minor, snaplen = struct.unpack_from("<HHxxxxxxxxI" if little else ">HHxxxxxxxxI", head, 4)
        if (major, minor) != (2, 4):
            return None
        # pcap_check_header: a snaplen of 0 or above the link type's maximum becomes that maximum.
        return little, snaplen if 0 < snaplen <= MAX_SNAPLEN else MAX_SNAPLEN

    def _open(self):
        try:
            return pcapy.open_offline(self.path)
        except pcapy.PcapError as exc:
            raise CaptureError(f"{self.path}: not a readable pcap or pcapng file ({_pcap_message(exc)})") from None

    def batches(self):
        """Yield (buf, meta) until the end of the file. A damaged tail ends the iteration with
        `truncated` set; every whole packet before the damage is still yielded."""
        if self._own is not None:
            if (yield from self._own_batches()):
                return
            done = self.packets  # libpcap takes over at the first record the own reader left
            while done:
                _, meta = self._pcap.next_batch(min(done, BATCH))
                done -= len(meta) // 16
        while True:
            try:
                buf, meta = self._pcap.next_batch(BATCH)
            except pcapy.PcapError as exc:
                # next_batch discards its whole batch on an error: read it again one by one.
                yield from self._salvage()
                self.truncated = f"{self.path}: damaged after packet {self.packets} ({_pcap_message(exc)})"
                return
            if not meta:
                return
            self.packets += len(meta) // 16
            yield buf, meta

    def _own_batches(self):
        """The compiled reader's batches; returns True at the end of the file, False where libpcap
        must go on (a record it would cut or refuse, or a partial record at the end)."""
        assert self._own is not None  # batches() calls it for a file the own reader walks
        little, snapshot = self._own
        fd = os.open(self.path, os.O_RDONLY)
        pos = 24
        try:
            # Buffers sized by the file (a small file allocates little), read to its current end.
            meta = bytearray(min(WINDOW_RECORDS, os.fstat(fd).st_size // 16 + 1) * 16)
            words = memoryview(meta).cast("I")
            while True:
                want = min(WINDOW, os.fstat(fd).st_size - pos)
                if want <= 0:
                    return True
                window = os.pread(fd, want, pos)
                if not window:
                    return True
                n, used, stopped = pcap_records(window, 0, little, snapshot, words)
                if n:
                    self.packets += n
                    pos += used
                    yield window, memoryview(meta)[:n * 16].tobytes()
                if stopped or not n:
                    return False
        finally:
            os.close(fd)

    def _salvage(self):
        pcap = self._open()
        done = self.packets
        while done:  # skip what was already yielded
            _, meta = pcap.next_batch(min(done, BATCH))
            done -= len(meta) // 16
        while True:
            try:
                hdr, data = pcap.next()
            except pcapy.PcapError:
                return
            if hdr is None:
                return
            sec, usec = hdr.getts()
            self.packets += 1
            meta = memoryview(bytearray(16)).cast("I")
            # getts() gives the record's 32-bit fields as signed C longs (a damaged usec of
            # 0xffffffff reads -1); next_batch gives them unsigned: do as next_batch does.
            meta[0], meta[1], meta[2], meta[3] = sec & 0xFFFFFFFF, usec & 0xFFFFFFFF, 0, len(data)
            yield data, meta.tobytes()

    def close(self) -> None:
        self._pcap.close()


class LiveCapture:
    """libpcap on a live interface (`lo`, `eth0`, `any`...), filtered in the kernel."""

    def __init__(self, interface: str, listeners, *, snaplen: int = 262_144, buffer_mb: int = 64,
                 timeout_ms: int = 50, promiscuous: bool = False) -> None:
        self.interface = interface
        try:
            pcap = pcapy.create(interface)
            pcap.set_snaplen(snaplen)
            pcap.set_promisc(1 if promiscuous else 0)
            pcap.set_timeout(timeout_ms)
            pcap.set_buffer_size(buffer_mb << 20)
            status = pcap.activate()  # pcapy-ng returns pcap_activate's status, never raises
        except pcapy.PcapError as exc:
            raise CaptureError(self._explain(str(exc))) from None
        if status < 0:
            raise CaptureError(self._explain(_ACTIVATE_ERRORS.get(status, f"libpcap error {status}")))
        # 802.1Q tags exist only on Ethernet framing; libpcap refuses `vlan` on cooked (`any`).
        self.bpf = listeners.bpf_filter(vlan=pcap.datalink() == LINKTYPE_ETHERNET)

        try:
            pcap.setfilter(self.bpf)
        except pcapy.PcapError as exc:
            raise CaptureError(f"cannot set the capture filter {self.bpf!r}: {_pcap_message(exc)}") from None
        self._pcap = pcap
        self.timeout_ms = timeout_ms
        pcap.setnonblock(1)
        self._poll = select.poll()
        self._poll.register(pcap.getfd(), select.POLLIN)
        self.linktype = pcap.datalink()
        _check_linktype(self.linktype, f"interface {interface}")

    def _explain(self, msg: str) -> str:
        msg = msg.strip().rstrip(".")
        low = msg.lower()
        if "permission" in low or "not permitted" in low:
            return (f"capturing on {self.interface} needs root or CAP_NET_RAW "
                    f"(e.g. setcap cap_net_raw+ep on the Python binary) ({msg})")
        if "no such device" in low or "doesn't exist" in low:
            return f"no interface {self.interface!r}; available: {', '.join(available_interfaces()) or 'none'}"
        return f"cannot capture on {self.interface}: {msg}"

    def batches(self, stop):
        """Yield (buf, meta) until `stop` (a threading.Event) is set; an empty batch after each
        quiet read timeout lets the caller do periodic work."""
        pcap, poll, timeout = self._pcap, self._poll.poll, self.timeout_ms
        while not stop.is_set():
            try:
                buf, meta = pcap.next_batch(BATCH)
            except pcapy.PcapError as exc:
                raise CaptureError(f"capture on {self.interface} failed: {_pcap_message(exc)}") from None
            if not meta:
                poll(timeout)
            yield buf, meta

    def kernel_stats(self) -> tuple[int, int, int]:
        """libpcap's (received, dropped by the kernel, dropped by the interface)."""
        return self._pcap.stats()

    def close(self) -> None:
        self._pcap.close()


def available_interfaces() -> list[str]:
    try:
        return list(pcapy.findalldevs())
    except pcapy.PcapError:
        return []
