"""Bytes on the wire -> events.

`capture.kafka` is the sans-IO Kafka protocol core. Packet sources, TCP reassembly and the
proxy (`capture.proxy`) live beside it and feed it; they own all sockets, threads and clocks.
Other packages may import only the event vocabulary (`capture.kafka.events`) and the public
reference data (`capture.kafka.api_table`), never the internals.
"""
