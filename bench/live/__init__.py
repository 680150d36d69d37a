"""Live capture throughput: the highest packet rate on loopback that kafka-census captures and
decodes with zero kernel drops, on one core.

The capture is the CLI's live path in one process pinned to one core: `LiveCapture` on `lo` (the
CLI's default 64 MiB kernel ring) + `FlowTracker` in tally mode + `ConnectionRegistry`, driven
by `run_live`, on the hot path this install runs (the report says which). A bounded load
generator, pinned to the other core, plays both ends of Kafka connections on a loopback listener
port: clients send pre-built requests (ApiVersions v3 first, then Produce v9 with acks=1 and a
100-byte opaque record set and Metadata v12, 3:1), a tiny server answers each request frame with
a response frame of the same correlation id, both with TCP_NODELAY so that each request and each
response is about one packet. The clients are paced to the target packet rate (requests +
responses); the generator counts what it really sent.

For each rate: offered packets/s (the generator's sends, and the kernel's count of packets that
passed the capture filter, ACKs and handshakes included), packets captured, kernel drops,
requests decoded vs sent (equal when nothing was dropped), the capture process's CPU, the
backlog it still had when the generator stopped (drain seconds; zero drops with a long drain
means the 64 MiB ring absorbed a rate the decoder cannot sustain), and how busy each core was.
The peer in the same run: tcpdump (`-w /dev/null`, same ring size, pinned to the same core)
at the same rate (`--no-tcpdump` to skip it).

Load (`--load`): `tcp` is the generator above, real sockets; one core of Python and the kernel's
TCP work for both ends tops out near 200k packets/s, below the capture's ceiling. `inject`
(the default) plays the same Kafka exchanges (same frames, TCP handshake, in-order sequence
numbers, one request or response per packet, FIN at the end) as raw frames written to `lo`
through an AF_PACKET socket from addresses that are not local (10.99.0.0/24), so the kernel
drops them right after the capture taps have copied them: the capture sees exactly what it sees
of real traffic (each packet twice on lo, the outgoing copy dropped by libpcap), while the
generator's core pays one send per packet. The table says which load ran.

Priority (`--nice`, default -20): the capture and tcpdump run at that nice value on their core,
as a sidecar given its core would; on a shared machine other tenants' processes otherwise take
the capture's core (the capture process then gets half of it and the ring overflows while it
waits, as the "capture core busy" column shows). `--nice 0` measures without it.

Needs root (capture on lo) and two CPUs. Every loop is bounded in count and time; every child
is killed at the end.

    python -m bench.live [--seconds 5] [--rates 20000,50000,100000,150000,200000]

Prints a Markdown table and writes bench/results/live.json.

The package: `__main__` (the command line, the rates, the table, the results file; it is also
each child's entry: `--generator`, `--inject`, `--capture`); `load` (the Kafka frames and both
load generators, `tcp` and `inject`); `capture_child` (the CLI's live path on one core);
`measure` (one rate: kafka-census, then tcpdump, beside a fresh generator).
"""
