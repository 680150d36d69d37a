# Augmenting declarations (Cython reads them beside connection.py when setup.py compiles it):
# C types for the framing state and the two frame loops. connection.py stays the one source of
# every rule; this file adds no logic. Compiled, the four classes are extension types: an
# attribute not declared here cannot be set, and methods cannot be replaced on an instance
# (a test that spies on one subclasses instead). Keep it in step with connection.py's
# attributes (tests/core/test_differential.py and the core tests fail otherwise).
cimport cython
# C calls into the rules the frame loops apply per frame (the .py imports the same names itself).
from capture.kafka.bodies cimport (
    read_api_versions_request_cached,
    read_api_versions_response_cached,
    read_join_group_group_id,
    read_produce_prefix,
    read_sasl_authenticate_request,
    read_sasl_authenticate_response,
    read_sasl_handshake_request,
    read_sasl_handshake_response,
    software_field_valid,
)
from capture.kafka.headers cimport request_header_version, skip_response_header
from capture.kafka.readers cimport skip_tagged_fields
# The transition checks (every change of state goes through one) and tally mode's counting.
from capture.kafka.states cimport next_sasl_wait_state, next_stream_state
from capture.kafka.tally cimport TallyRun, new_tally_run
# Topics mode's reading (topic_walk.py) and what a connection hands over of it (topics.py).
from capture.kafka.topic_walk cimport request_layout, response_layout
from capture.kafka.topics cimport Topics

cdef class _Stream:
    cdef public object direction
    cdef public bytearray buf
    cdef public Py_ssize_t pos
    cdef public Py_ssize_t skip
    cdef public int state
    cdef public Py_ssize_t scan_skipped
    cdef public Py_ssize_t tokens
    cdef public bytes cid_raw
    cdef public str cid_str
    cdef public object walker
    cpdef _setup(self, direction, int state)
    cpdef move(self, int event)
    @cython.locals(n=Py_ssize_t)
    cpdef feed(self, data)
    @cython.locals(end=Py_ssize_t)
    cpdef consume_frame(self, Py_ssize_t frame_end)

# Numbers and str only: an object the cyclic GC does not track (Cython leaves out GC support for
# a type whose object attributes cannot be part of a cycle).
cdef class _InFlight:
    cdef public Py_ssize_t seq
    cdef public int api_key
    cdef public int api_version
    cdef public double ts
    cdef public bint unconfirmed
    cdef public str software_name
    cdef public str software_version
    cdef public str mechanism
    cdef public int topic_use

cdef class _EventBuilder:
    cdef object cls
    cdef tuple setters

# Module constants the frame loops compare with, as C values (not visible to Python importers).
cdef int PRODUCE, METADATA, JOIN_GROUP, SASL_HANDSHAKE, SASL_AUTHENTICATE
cdef int _NO_CLIENT_ID, _NO_ACKS, _KEY_SLOTS, _VERSION_SLOTS, NO_USE
cdef Py_ssize_t _BATCH, SCAN_KEEP
# The states and events of states.py (the .py imports them), compared and passed as C ints.
cdef int SYNCED, SCANNING, VERIFYING, SASL_RAW, IGNORED
cdef int DESYNC, RESYNC, LARGE_CANDIDATE, IMPLAUSIBLE, SASL_V0_ACCEPTED, RAW_DONE, TLS, CLOSE
cdef int ANSWER_NOT_AWAITED, ANSWER_AWAITED
cdef int V0_HANDSHAKE_SENT, V0_HANDSHAKE_SENT_UNSYNCED, ANSWER_LOST, ANSWER_READ, KAFKA_RESUMED
cdef frozenset _DECODED_REQUESTS, _DECODED_RESPONSES
cdef bytes _HEADER_OF
cdef bint _COMPILED
cdef list _SPECS

cdef object _spec_of(int api_key)
@cython.locals(value=Py_ssize_t)
cdef Py_ssize_t _int32_at(bytearray buf, Py_ssize_t i) except? -1
@cython.locals(value=int)
cdef int _int16_at(bytearray buf, Py_ssize_t i) except? -1
@cython.locals(stream=_Stream)
cdef _Stream _new_stream(direction, int state)
@cython.locals(entry=_InFlight)
cdef _InFlight _new_in_flight(Py_ssize_t seq, int api_key, int api_version, double ts)

cdef class KafkaConnection:
    cdef public object conn_id
    cdef public Py_ssize_t max_frame_size
    cdef public Py_ssize_t max_decoded_frame
    cdef public Py_ssize_t max_in_flight
    cdef public _Stream _client
    cdef public _Stream _broker
    cdef public object _input
    cdef public object _active
    cdef public object _events
    cdef public double _ts
    cdef public dict _in_flight
    cdef public Py_ssize_t _requests
    cdef public Py_ssize_t responses
    cdef public Py_ssize_t held_bytes
    cdef public object _sasl
    cdef public object _resync
    cdef public bint _first_client_bytes
    cdef public int _sasl_wait
    cdef public object _v0_handshake
    cdef public Py_ssize_t _frames_dropped_unread
    cdef public bint closed
    cdef public bint mid_stream
    cdef public bint tls
    cdef public object identity
    cdef public list refused
    cdef public bint tally
    cdef public TallyRun _tally_run
    cdef public Py_ssize_t max_topics
    cdef public Topics _topics
    cdef object __weakref__

    cpdef receive(self, direction, data, double ts)
    cpdef list events(self)
    @cython.locals(stream=_Stream)
    cpdef bint _pump(self)
    cpdef bint _step(self, _Stream stream)
    @cython.locals(run=TallyRun)
    cpdef _emit(self, event)
    @cython.locals(topics=Topics, handed=tuple)
    cpdef _hand_over_tally(self, TallyRun run)
    cpdef _desync(self, _Stream stream, kind, detail)
    cpdef _decode_error(self, _Stream stream, kind, api_key, api_version, detail)
    @cython.locals(pos=Py_ssize_t, end=Py_ssize_t, avail=Py_ssize_t, size=Py_ssize_t, frame_end=Py_ssize_t,
                   complete=bint, api_key=int, api_version=int, cid_len=int, body=Py_ssize_t, known=bint,
                   header_version=int, done=Py_ssize_t, max_frame_size=Py_ssize_t, buf=bytearray,
                   max_in_flight=Py_ssize_t, header_of=bytes, specs=list, lim=Py_ssize_t, off=Py_ssize_t,
                   ts=double, entry=_InFlight, in_flight=dict, acks=int, transactional=bint, run=TallyRun,
                   topics=Topics)
    cpdef bint _client_frames(self, _Stream stream)
    cpdef _move_sasl_wait(self, int event)
    cpdef _request_body(self, _Stream stream, int api_key, int api_version, int header_version, Py_ssize_t off,
                        Py_ssize_t end)
    @cython.locals(layout=tuple)
    cpdef bint _topic_wait(self, Topics topics, int api_key, int api_version, Py_ssize_t body, bint complete,
                           Py_ssize_t size) except -1
    cpdef _topic_counted(self, Topics topics, bint each)
    @cython.locals(layout=tuple, off=Py_ssize_t, use=int, buf=bytearray)
    cpdef _topic_request(self, _Stream stream, Topics topics, int api_key, int api_version, int header_version,
                         Py_ssize_t body, Py_ssize_t frame_end, Py_ssize_t size)
    @cython.locals(topics=Topics, off=Py_ssize_t, api_key=int, version=int, pairs=bint, buf=bytearray)
    cpdef _topic_response(self, _Stream stream, _InFlight entry, Py_ssize_t pos, Py_ssize_t frame_end,
                          Py_ssize_t size)
    @cython.locals(pos=Py_ssize_t, size=Py_ssize_t, frame_end=Py_ssize_t, api_key=int, entry=_InFlight,
                   buf=bytearray, ts=double, decode=bint, run=TallyRun, scan=bint, topics=Topics)
    cpdef bint _broker_frame(self, _Stream stream)
    @cython.locals(in_flight=dict, entry=_InFlight, oldest=_InFlight)
    cpdef _InFlight _match(self, _Stream stream, corr)
    @cython.locals(api_key=int, version=int, off=Py_ssize_t, ts=double)
    cpdef _response_body(self, _Stream stream, _InFlight entry, Py_ssize_t pos, Py_ssize_t frame_end)
