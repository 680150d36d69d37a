"""Independent oracles for the capture layer: tshark (Wireshark's Kafka dissector) to decode a
pcap, tcpdump to record one, pcapy to count what was recorded.

Usable both from pytest (``tests/capture/test_oracles.py``) and from plain scripts
(``bench/record_produce_pcap.py``, ``bench/replay.py``); nothing here imports pytest or the ``capture`` package, so
the oracles cannot share a bug with the code they check.

* :func:`tshark_requests` — the Kafka requests of each connection in a pcap, as tshark 4.0
  decodes them (request side only: tshark's response decoding depends on matching request
  state and is unreliable when many requests share a segment).
* :func:`tcpdump_capture` — a context manager recording ``tcpdump -i IF -w PATH -U -s 0 -n
  FILTER`` (plus --immediate-mode, -B and, as root, -Z root: see its docstring); it never
  leaves a tcpdump running and reports tcpdump's own packet counts.
* :func:`pcap_packet_count` — packets in a pcap/pcapng file, read with pcapy.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from harness.process import pdeathsig_preexec

TSHARK_HINT = "run `make setup` (installs tshark)"
TCPDUMP_HINT = "run `make setup` (installs tcpdump)"

#: Connection key used by the oracles: (client_address, client_port, broker_address, broker_port).
ConnKey = tuple[str, int, str, int]

# tshark 4.0 field names (`tshark -G fields | grep -P '\tkafka\.'`). A request PDU carries
# kafka.request_key (responses carry kafka.response_key instead); kafka.request.version is the
# request header's api version. kafka.api_key / kafka.api_version are their generic aliases.
F_API_KEY = "kafka.request_key"
F_API_VERSION = "kafka.request.version"
F_CORRELATION_ID = "kafka.correlation_id"
F_CLIENT_ID = "kafka.client_id"
F_SOFTWARE_NAME = "kafka.client_software_name"
F_SOFTWARE_VERSION = "kafka.client_software_version"
#: How tshark 4.0 shows a null (length -1) nullable string such as client_id.
TSHARK_NULL_STRING = "[ Null ]"

API_VERSIONS = 18


# --------------------------------------------------------------------------- tshark
def tshark_binary() -> str:
    path = shutil.which("tshark")
    if path is None:
        raise RuntimeError(f"tshark not found: {TSHARK_HINT}")
    return path


def tshark_command(pcap_path: str | os.PathLike, ports: Iterable[int]) -> list[str]:
    """The tshark command line :func:`tshark_requests` runs (exposed for error messages)."""
    cmd = [tshark_binary(), "-r", str(pcap_path), "-n"]
    for port in ports:
        cmd += ["-d", f"tcp.port=={int(port)},kafka"]
    # -T json rather than -T fields: with fields, several PDUs in one frame come out as
    # comma-joined lists per field, and optional fields (client software, null client_id)
    # cannot be re-aligned, nor can strings containing commas. In JSON each Kafka PDU is its
    # own "kafka" key in the frame's "layers" object (duplicate keys, kept apart by
    # _pairs_hook). -j keeps only these layers' top-level fields (no subtrees), which is all
    # we read and keeps the output small; -Y drops frames without a request.
    cmd += ["-Y", F_API_KEY, "-T", "json", "-j", "ip ipv6 tcp kafka"]
    return cmd


class _Pairs(list):
    """A JSON object kept as its list of (key, value) pairs: tshark repeats keys."""


def _pairs_hook(pairs):
    return _Pairs(pairs)


def _get(obj: _Pairs, key: str):
    """The last value of ``key`` in ``obj`` (tshark repeats some keys; fields we read are single)."""
    found = None
    for k, v in obj:
        if k == key:
            found = v
    return found


def _int(value) -> int | None:
    return None if value is None else int(value, 0)


def _str(value) -> str | None:
    if value is None or value == TSHARK_NULL_STRING:
        return None
    return value


def _endpoint(layers: _Pairs) -> tuple[str, int, str, int] | None:
    """(src, sport, dst, dport) of a frame: the innermost IP layer and TCP layer."""
    ip = tcp = None
    for name, layer in layers:
        if name in ("ip", "ipv6") and isinstance(layer, _Pairs):
            ip = (name, layer)
        elif name == "tcp" and isinstance(layer, _Pairs):
            tcp = layer
    if ip is None or tcp is None:
        return None
    prefix, layer = ip
    src, dst = _get(layer, f"{prefix}.src"), _get(layer, f"{prefix}.dst")
    sport, dport = _int(_get(tcp, "tcp.srcport")), _int(_get(tcp, "tcp.dstport"))
    if None in (src, dst, sport, dport):
        return None
    return src, sport, dst, dport


def parse_tshark_json(text: str, ports: Iterable[int]) -> dict[ConnKey, list[dict]]:
    """Kafka requests per connection from ``tshark -T json`` output (see :func:`tshark_requests`)."""
    broker_ports = {int(p) for p in ports}
    result: dict[ConnKey, list[dict]] = {}
    text = text.strip()
    if not text:  # tshark prints nothing at all when no frame passes -Y
        return result
    for packet in json.loads(text, object_pairs_hook=_pairs_hook):
        layers = _get(_get(packet, "_source"), "layers")
        ends = _endpoint(layers)
        if ends is None:
            continue
        src, sport, dst, dport = ends
        # Requests flow client -> broker; the broker is the end on a listener port.
        if dport in broker_ports:
            key = (src, sport, dst, dport)
        elif sport in broker_ports:  # a request towards the client: only if both ends listen
            key = (dst, dport, src, sport)
        else:
            continue
        for name, pdu in layers:
            if name != "kafka" or not isinstance(pdu, _Pairs):
                continue
            api_key = _int(_get(pdu, F_API_KEY))
            if api_key is None:  # a response PDU in a frame that also holds a request
                continue
            api_version = _int(_get(pdu, F_API_VERSION))
            software = api_key == API_VERSIONS and api_version is not None and api_version >= 3
            result.setdefault(key, []).append({
                "api_key": api_key,
                "api_version": api_version,
                "correlation_id": _int(_get(pdu, F_CORRELATION_ID)),
                "client_id": _str(_get(pdu, F_CLIENT_ID)),
                "client_software_name": _str(_get(pdu, F_SOFTWARE_NAME)) if software else None,
                "client_software_version": _str(_get(pdu, F_SOFTWARE_VERSION)) if software else None,
            })
    return result


def tshark_requests(pcap_path: str | os.PathLike, ports: Iterable[int], *,
                    timeout: float = 300.0) -> dict[ConnKey, list[dict]]:
    """The Kafka requests in ``pcap_path``, per connection, in capture order, as tshark decodes them.

    ``ports`` are the broker (listener) ports; each is decoded as Kafka with ``-d``. Keys are
    (client_address, client_port, broker_address, broker_port); each request is a dict with
    api_key, api_version, correlation_id, client_id (None when null), client_software_name and
    client_software_version (None unless ApiVersions v3+). Several PDUs in one frame come out
    in stream order. Raises RuntimeError if tshark is missing, fails or exceeds ``timeout``.
    """
    ports = list(ports)
    if not ports:
        raise ValueError("tshark_requests needs at least one broker port")
    cmd = tshark_command(pcap_path, ports)
    try:
        proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"tshark took more than {timeout:.0f} s on {pcap_path}") from None
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited with code {proc.returncode}: "
                           f"{_without_root_warning(proc.stderr).strip()[-2000:]}")
    return parse_tshark_json(proc.stdout, ports)


def _without_root_warning(stderr: str) -> str:
    return "\n".join(line for line in stderr.splitlines()
                     if "This could be dangerous" not in line)


# --------------------------------------------------------------------------- tcpdump
@dataclasses.dataclass
class TcpdumpCapture:
    """One tcpdump run. The counts are tcpdump's own report, filled in when the capture stops
    (None if tcpdump did not print them, e.g. after being killed).

    ``captured`` is what tcpdump wrote to the file. ``received_by_filter`` comes from the
    kernel, which on ``lo`` counts every packet twice (outgoing and incoming copies; libpcap
    drops the outgoing one), so there it is 2 x ``captured`` when nothing was lost.
    """

    path: Path
    command: list[str]
    pid: int | None = None
    captured: int | None = None
    received_by_filter: int | None = None
    dropped_by_kernel: int | None = None
    returncode: int | None = None
    killed: bool = False
    stderr: str = ""


_COUNT = re.compile(r"^(\d+) packets? (captured|received by filter|dropped by kernel)\s*$")


def _parse_tcpdump_stats(cap: TcpdumpCapture) -> None:
    for line in cap.stderr.splitlines():
        m = _COUNT.match(line.strip())
        if m:
            value, what = int(m.group(1)), m.group(2)
            if what == "captured":
                cap.captured = value
            elif what == "received by filter":
                cap.received_by_filter = value
            else:
                cap.dropped_by_kernel = value


def _is_listening(line: str) -> bool:
    # tcpdump 4.99 prints "tcpdump: listening on lo, link-type ..." (older: without prefix).
    return line.startswith(("tcpdump: listening on", "listening on"))


def _wait_until_file_settles(path: Path, quiet: float, limit: float) -> None:
    """Wait (at most ``limit`` s) until ``path`` has not grown for ``quiet`` s: packets the
    kernel already queued are then written before tcpdump is told to stop."""
    deadline = time.monotonic() + limit
    last, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        try:
            size = path.stat().st_size
        except OSError:
            size = -1
        now = time.monotonic()
        if size != last:
            last, since = size, now
        elif now - since >= quiet:
            return
        time.sleep(0.02)


@contextlib.contextmanager
def tcpdump_capture(interface: str, bpf_filter: str, path: str | os.PathLike, *,
                    start_timeout: float = 10.0, stop_timeout: float = 10.0,
                    settle_seconds: float = 0.2, buffer_mib: int = 64) -> Iterator[TcpdumpCapture]:
    """Record ``interface`` to ``path`` with
    ``tcpdump -i IF -w PATH [-Z root] --immediate-mode -U -B KIB -s 0 -n FILTER``.

    Yields once tcpdump reports "listening on" (packets sent after that are captured). On
    exit it waits until the file has not grown for ``settle_seconds``, sends tcpdump SIGINT and
    waits for it, so the file is complete and the yielded :class:`TcpdumpCapture` holds
    tcpdump's counts. Every wait is bounded: a tcpdump that does not stop within
    ``stop_timeout`` is killed (``killed`` is then True and the counts are None). As a last
    resort tcpdump also gets SIGTERM if this Python process dies (PR_SET_PDEATHSIG; as root,
    with ``-Z root`` so that tcpdump's privilege drop does not clear it).
    Raises RuntimeError if tcpdump is missing, fails to start, or does not start listening
    within ``start_timeout``.

    Why ``--immediate-mode``: without it libpcap (TPACKET_V3) hands packets to tcpdump one
    ring block at a time, a block being released when full or after tcpdump's 1 s timeout;
    packets in the block still open at SIGINT are never written (measured: 95 of 136 packets
    of a short client run). ``-U`` only flushes what tcpdump was given. Why ``-B``
    (``buffer_mib``, default 64 MiB): on ``lo`` (MTU 65536) tcpdump's default 2 MiB ring holds
    about 30 full segments, and a bulk producer overflows it ("dropped by kernel").
    """
    binary = shutil.which("tcpdump")
    if binary is None:
        raise RuntimeError(f"tcpdump not found: {TCPDUMP_HINT}")
    path = Path(path)
    # As root, -Z root keeps tcpdump from switching to the "tcpdump" user (Debian's default):
    # the kernel clears PR_SET_PDEATHSIG on a uid change, and that is our last-resort stop.
    keep_root = ["-Z", "root"] if os.geteuid() == 0 else []
    cmd = [binary, "-i", interface, "-w", str(path), *keep_root, "--immediate-mode", "-U",
           "-B", str(int(buffer_mib) * 1024), "-s", "0", "-n", bpf_filter]
    cap = TcpdumpCapture(path=path, command=cmd)
    lines: list[str] = []
    listening = threading.Event()
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, errors="replace",
                            start_new_session=True, preexec_fn=pdeathsig_preexec())  # noqa: PLW1509

    def read_stderr() -> None:  # drains the pipe so tcpdump can never block on it
        for line in proc.stderr:
            lines.append(line)
            if _is_listening(line):
                listening.set()
        listening.set()  # EOF: tcpdump exited; wake the starter

    cap.pid = proc.pid
    reader = threading.Thread(target=read_stderr, name="tcpdump-stderr", daemon=True)
    reader.start()
    try:
        listening.wait(start_timeout)
        if not any(_is_listening(line) for line in lines):
            # Either tcpdump failed (stderr closed at exit: give it a moment to be reaped) or
            # it is still starting after start_timeout; the finally below stops it.
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(1.0)
            reader.join(1.0)
            state = (f"exited with code {proc.returncode}" if proc.poll() is not None
                     else f"did not start listening on {interface} within {start_timeout:.0f} s")
            raise RuntimeError(f"tcpdump {state}: {''.join(lines).strip()[-2000:]}")
        yield cap
    finally:
        if proc.poll() is None:
            _wait_until_file_settles(path, settle_seconds, stop_timeout)
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGINT)
            try:
                proc.wait(stop_timeout)
            except subprocess.TimeoutExpired:
                cap.killed = True
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                proc.wait(stop_timeout)
        reader.join(stop_timeout)
        with contextlib.suppress(OSError):
            proc.stderr.close()
        cap.returncode = proc.returncode
        cap.stderr = "".join(lines)
        _parse_tcpdump_stats(cap)


# --------------------------------------------------------------------------- pcapy
def pcap_packet_count(path: str | os.PathLike) -> int:
    """Number of packets in a pcap or pcapng file (read with pcapy-ng, in batches)."""
    import pcapy

    reader = pcapy.open_offline(str(path))
    count = 0
    try:
        while True:
            _, meta = reader.next_batch(4096)
            if not meta:
                return count
            count += len(meta) // 16  # one 16-byte (sec, usec, offset, caplen) record per packet
    finally:
        with contextlib.suppress(Exception):
            reader.close()


def summarize_requests(requests: dict[ConnKey, list[dict]]) -> dict[int, int]:
    """Requests per api_key over all connections (handy to compare with the capture layer)."""
    counts: dict[int, int] = {}
    for reqs in requests.values():
        for r in reqs:
            counts[r["api_key"]] = counts.get(r["api_key"], 0) + 1
    return counts


# --------------------------------------------------------------------------- tshark follow
#: (client_port, server_port, the client's bytes, the server's bytes)
Stream = tuple[int, int, bytes, bytes]


def tshark_streams(pcap_path: str | os.PathLike, server_ports: Iterable[int], *,
                   timeout: float = 120.0) -> list[Stream]:
    """Each direction's reassembled payload of every TCP stream to ``server_ports``, as
    tshark's ``-z follow,tcp,raw`` reassembles it (retransmissions removed by tshark's TCP
    analysis, not by us)."""
    binary = tshark_binary()
    ports = sorted(set(server_ports))
    port_filter = " or ".join(f"tcp.port == {p}" for p in ports)
    listing = subprocess.run(
        [binary, "-r", str(pcap_path), "-Y", f"({port_filter}) and tcp.flags.syn == 1 and tcp.flags.ack == 0",
         "-T", "fields", "-e", "tcp.stream"],
        capture_output=True, text=True, timeout=timeout)
    if listing.returncode != 0:
        raise RuntimeError(f"tshark failed: {_without_root_warning(listing.stderr)}")
    streams = sorted({int(s) for s in listing.stdout.split()})
    if not streams:
        return []
    cmd = [binary, "-r", str(pcap_path), "-q"]
    for s in streams:
        cmd += ["-z", f"follow,tcp,raw,{s}"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"tshark failed: {_without_root_warning(out.stderr)}")
    result = []
    for block in out.stdout.split("Follow: tcp,raw")[1:]:
        nodes, sent = {}, {0: bytearray(), 1: bytearray()}
        for line in block.splitlines():
            m = re.match(r"^Node ([01]): (.*):(\d+)$", line)
            if m:
                nodes[int(m[1])] = int(m[3])
            elif line.startswith("\t") and re.fullmatch(r"[0-9a-f]+", line.strip()):
                sent[1] += bytes.fromhex(line.strip())
            elif re.fullmatch(r"[0-9a-f]+", line):
                sent[0] += bytes.fromhex(line)
        if len(nodes) != 2:
            continue
        # Node 0 is the end that sent the first segment of the stream: the client.
        if nodes[0] in ports and nodes[1] not in ports:
            nodes = {0: nodes[1], 1: nodes[0]}
            sent = {0: sent[1], 1: sent[0]}
        result.append((nodes[0], nodes[1], bytes(sent[0]), bytes(sent[1])))
    return result
