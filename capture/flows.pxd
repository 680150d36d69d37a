# Augmenting declarations (Cython reads them beside flows.py when setup.py compiles it): C types
# for a flow's per-direction state and the batch loop. flows.py stays the one source of every
# rule; this file adds no logic. Compiled, _Stream and _Flow are extension types: an attribute
# not declared here cannot be set.
cimport cython
from capture.kafka.connection cimport KafkaConnection as _TypedConnection  # the .py imports the name itself
from capture.packets cimport Segment as _TypedSegment
cimport capture.packets as packets  # packets.parse_into called at C level (the .py imports the module too)

cdef class _Stream:
    cdef public object next
    cdef public dict held
    cdef public Py_ssize_t held_bytes
    cdef public object fin_at
    cdef public Py_ssize_t bytes
    cdef public Py_ssize_t segments
    cdef public object direction

cdef class _Flow:
    cdef public object key
    cdef public object conn_id
    cdef public object conn
    cdef public object listener
    cdef public _Stream client
    cdef public _Stream broker
    cdef public double first_seen
    cdef public double last_seen
    cdef public object syn_isn
    cdef public bint tls
    cdef public Py_ssize_t buffered
    cdef public bint proven
    cdef public bint dirty
    cdef public bint indexed
    cdef public unsigned int client_ip4
    cdef public unsigned int broker_ip4
    cdef public int client_port
    cdef public int broker_port

cdef unsigned long long _MASK64, _MIX1, _MIX2

cpdef unsigned long long _flow_hash(unsigned long long client_ip, unsigned long long client_port,
                                    unsigned long long broker_ip, unsigned long long broker_port)

@cython.locals(seg=_TypedSegment, data="const unsigned char[::1]", words="const unsigned int[::1]",
               size=Py_ssize_t, i=Py_ssize_t, n=Py_ssize_t, nbytes=Py_ssize_t, off=Py_ssize_t,
               caplen=Py_ssize_t, end=Py_ssize_t, code=int, ts=double, flags=int, po=Py_ssize_t,
               pe=Py_ssize_t, sport=int, dport=int, listener_ports="const unsigned char[::1]",
               index=dict, next_expiry=double, flow=_Flow, last=_Flow, stream=_Stream, peer=_Stream,
               conn=_TypedConnection)
cpdef tuple _feed_batch(tracker, int linktype, buf, meta)

@cython.locals(conn=_TypedConnection, n=Py_ssize_t)
cpdef _drain(tracker, _Flow flow)
