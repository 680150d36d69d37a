# Augmenting declarations (Cython reads them beside flows.py when setup.py compiles it): C types
# for a flow's per-direction state and the batch loop. flows.py stays the one source of every
# rule; this file adds no logic. Compiled, _Stream and _Flow are extension types: an attribute
# not declared here cannot be set.
cimport cython
from capture.kafka.connection cimport KafkaConnection as _TypedConnection  # the .py imports the name itself

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

@cython.locals(n=Py_ssize_t, nbytes=Py_ssize_t, sec=double, usec=double, off=Py_ssize_t, caplen=Py_ssize_t,
               ts=double, flags=int, po=Py_ssize_t, pe=Py_ssize_t, flow=_Flow, stream=_Stream, peer=_Stream,
               conn=_TypedConnection, next_expiry=double)
cpdef tuple _feed_batch(tracker, parse, buf, meta)
