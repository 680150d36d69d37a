"""Bytes on the wire -> events.

`capture.kafka` is the sans-IO Kafka protocol core. Packet sources, TCP reassembly and the
proxy (`capture.proxy`) live beside it and feed it; they own all sockets, threads and clocks.
Other packages may import only the event vocabulary (`capture.kafka.events`) and the public
reference data (`capture.kafka.api_table`), never the internals.

The hot path (`_native.NATIVE_MODULES`) runs compiled when its Cython extensions are built and
current, as Python otherwise; `native_modules()` says which, module by module.
"""

from capture import _native

_native.install()  # before any hot-path module is imported
native_modules = _native.native_modules
hot_path = _native.hot_path
