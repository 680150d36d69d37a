# Augmenting declarations (Cython reads them beside topics.py when setup.py compiles it): C fields
# for a connection's Topics and C calls for connection.py, which cimports them. topics.py stays
# the one source of every rule; this file adds no logic. Compiled, Counts and Topics are
# extension types (Topics extends topic_walk's FrameScan): an attribute not declared here cannot
# be set.
cimport cython
from capture.kafka.topic_walk cimport FrameScan, wire_text

cdef int _USES

cdef class Counts:
    cdef public Py_ssize_t frames
    cdef public Py_ssize_t nbytes

cdef class Topics(FrameScan):
    cdef public tuple frame_layout
    cdef public int frame_use
    cdef public bint frame_bad
    cdef public list usage
    cdef public Py_ssize_t used
    cdef public Py_ssize_t dropped
    cdef public Py_ssize_t unread
    cdef public int last_use
    cdef public object last_name
    cdef public object last_id
    cdef public Counts last_counts
    cdef public object last_group
    cdef public object last_member
    cdef public object last_instance
    cdef public object last_protocol_type
    cdef public bytes txn_raw
    cdef public object txn

    cpdef bint group_changed(self) except -1
    @cython.locals(start=Py_ssize_t, stop=Py_ssize_t, raw=bytes)
    cpdef bint txn_changed(self, bytearray buf) except -1
    @cython.locals(frames=Py_ssize_t)
    cpdef add_frame(self, int use, bint request)
    @cython.locals(counts=Counts, usage=dict)
    cpdef _add(self, int use, name, tid, Py_ssize_t frames, Py_ssize_t nbytes)
    cpdef bint pending(self)
    @cython.locals(usage=list, counts=dict, use=int, value=Counts)
    cpdef tuple hand_over(self, conn_id, double ts)
