# Augmenting declarations (Cython reads them beside topic_walk.py when setup.py compiles it): C
# values for the layouts' operations, C fields for a frame's part and C calls for topics.py and
# connection.py, which cimport them. topic_walk.py stays the one source of every rule; this file
# adds no logic. Compiled, FrameScan is an extension type: an attribute not declared here cannot
# be set.
cimport cython

# The operations of topic_layouts.py (the .py imports them), compared as C ints in the walk.
cdef int FIXED, STRING, BYTES, ARRAY, ENTRIES, FIXED_ARRAY, TAGS, TOPIC, TOPIC_ID, RECORDS, TOPIC_NAMES
cdef int GROUP, MEMBER, INSTANCE, PROTOCOL_TYPE, TXN, REPLICA, METADATA
cdef int _KEY_SLOTS, _VERSION_SLOTS, _SUBSCRIPTION_MAX, PRODUCE, JOIN_GROUP
cdef list _REQUEST_LAYOUTS, _RESPONSE_LAYOUTS

cpdef tuple request_layout(int api_key, int api_version)
cpdef tuple response_layout(int api_key, int api_version)
@cython.locals(name=str, names=dict)
cpdef str topic_name(bytes raw)
@cython.locals(text=str, ids=dict)
cpdef str topic_id(bytes raw)
cpdef str wire_text(bytearray buf, Py_ssize_t start, Py_ssize_t stop)

cdef class FrameScan:
    cdef public Py_ssize_t max_topics
    cdef public Py_ssize_t at
    cdef public Py_ssize_t entry_count
    cdef public object first_name
    cdef public object first_id
    cdef public Py_ssize_t first_bytes
    cdef public dict more
    cdef public Py_ssize_t frame_dropped
    cdef public Py_ssize_t frame_unread
    cdef public list pairs
    cdef public list hold
    cdef public bint holding
    cdef public object name
    cdef public object id
    cdef public Py_ssize_t nbytes
    cdef public object group
    cdef public Py_ssize_t groups
    cdef public object member
    cdef public Py_ssize_t members
    cdef public object instance
    cdef public object protocol_type
    cdef public Py_ssize_t txn_start
    cdef public Py_ssize_t txn_stop
    cdef public Py_ssize_t replica
    cdef public list metadata
    cdef public bytes name_raw
    cdef public str name_str

    cpdef _start_frame(self)
    @cython.locals(use=int)
    cpdef int scan_request(self, bytearray buf, Py_ssize_t off, Py_ssize_t end, tuple layout, int api_key,
                           int api_version) except? -2
    cpdef scan_response(self, bytearray buf, Py_ssize_t off, Py_ssize_t end, tuple layout, bint pairs)
    @cython.locals(version=int)
    cpdef _subscription(self, bytearray buf, Py_ssize_t start, Py_ssize_t stop)
    @cython.locals(value=Py_ssize_t, shift=Py_ssize_t, i=Py_ssize_t, b=Py_ssize_t)
    cpdef Py_ssize_t _prefix(self, bytearray buf, Py_ssize_t off, Py_ssize_t end, bint compact, bint wide) except? -2
    @cython.locals(n=Py_ssize_t)
    cpdef Py_ssize_t _span(self, bytearray buf, Py_ssize_t off, Py_ssize_t end, bint compact, bint wide) except? -2
    @cython.locals(n=Py_ssize_t)
    cpdef Py_ssize_t _count(self, bytearray buf, Py_ssize_t off, Py_ssize_t end, bint compact) except? -2
    @cython.locals(n=Py_ssize_t, i=Py_ssize_t, op=int, length=Py_ssize_t, count=Py_ssize_t, value=Py_ssize_t,
                   start=Py_ssize_t, text=str, name=str)
    cpdef Py_ssize_t _walk(self, bytearray buf, Py_ssize_t off, Py_ssize_t end, tuple ops, bint compact) except -1
    @cython.locals(length=Py_ssize_t, count=Py_ssize_t, partitions=Py_ssize_t, nbytes=Py_ssize_t, by_id=bint,
                   text=str)
    cpdef _produce(self, bytearray buf, Py_ssize_t off, Py_ssize_t end, bint flexible, int version)
    @cython.locals(raw=bytes)
    cpdef _topic_at(self, bytearray buf, Py_ssize_t off, Py_ssize_t length)
    @cython.locals(count=Py_ssize_t, tag=Py_ssize_t, size=Py_ssize_t, start=Py_ssize_t, stop=Py_ssize_t,
                   j=Py_ssize_t)
    cpdef Py_ssize_t _tags(self, bytearray buf, Py_ssize_t off, Py_ssize_t end, tuple known) except -1
    @cython.locals(pairs=list, more=dict)
    cpdef _commit(self, name, tid, Py_ssize_t nbytes)
    cpdef drop_frame(self)
    cpdef tuple take_pairs(self)
