# Augmenting declarations (Cython reads them beside connection.py when setup.py compiles it):
# C types for the framing state and the two frame loops. connection.py stays the one source of
# every rule; this file adds no logic. Compiled, the three classes are extension types: an
# attribute not declared here cannot be set, and methods cannot be replaced on an instance
# (a test that spies on one subclasses instead). Keep it in step with connection.py's
# attributes (tests/test_differential.py and the core tests fail otherwise).
cimport cython

cdef class _Half:
    cdef public object direction
    cdef public bytearray buf
    cdef public Py_ssize_t pos
    cdef public Py_ssize_t skip
    cdef public object state
    cdef public Py_ssize_t scan_skipped
    cdef public Py_ssize_t tokens
    cdef public bytes cid_raw
    cdef public str cid_str
    @cython.locals(n=Py_ssize_t)
    cpdef feed(self, data)
    @cython.locals(end=Py_ssize_t)
    cpdef consume_frame(self, Py_ssize_t frame_end)

cdef class _InFlight:
    cdef public Py_ssize_t seq
    cdef public int api_key
    cdef public int api_version
    cdef public object spec
    cdef public double ts
    cdef public object detail

cdef class KafkaConnection:
    cdef public object conn_id
    cdef public Py_ssize_t max_frame_size
    cdef public Py_ssize_t max_decoded_frame
    cdef public Py_ssize_t max_in_flight
    cdef public _Half _client
    cdef public _Half _broker
    cdef public object _input
    cdef public object _active
    cdef public object _events
    cdef public double _ts
    cdef public dict _in_flight
    cdef public Py_ssize_t _requests
    cdef public Py_ssize_t responses
    cdef public Py_ssize_t held_bytes
    cdef public object _sasl
    cdef public object _scan
    cdef public object _response_cover
    cdef public bint _first_client_bytes
    cdef public object _hs0
    cdef public bint _hs0_lost
    cdef public Py_ssize_t _uncertain_frames
    cdef public bint _wake_queued
    cdef public bint closed
    cdef public bint mid_stream
    cdef public bint tls
    cdef public object identity
    cdef public list refused
    cdef public bint tally
    cdef public dict _tally_requests
    cdef public dict _tally_responses
    cdef public dict _tally_acks
    cdef public object _tally_client_id
    cdef public double _tally_ts
    cdef object __weakref__

    cpdef receive(self, direction, data, double ts)
    @cython.locals(half=_Half)
    cpdef bint _pump(self)
    cpdef bint _step(self, _Half half)
    @cython.locals(pos=Py_ssize_t, end=Py_ssize_t, avail=Py_ssize_t, size=Py_ssize_t, frame_end=Py_ssize_t,
                   complete=bint, api_key=int, api_version=int, body=object, known=bint, header_version=int,
                   done=Py_ssize_t, max_frame_size=Py_ssize_t, tally=bint, buf=bytearray, max_in_flight=Py_ssize_t)
    cpdef bint _client_frames(self, _Half half)
    @cython.locals(pos=Py_ssize_t, size=Py_ssize_t, frame_end=Py_ssize_t, api_key=int, entry=_InFlight,
                   buf=bytearray, latency=double, ts=double, decode=bint)
    cpdef bint _broker_frame(self, _Half half)
