# Augmenting declarations (Cython reads them beside resync.py when setup.py compiles it): C types
# for the plausibility checks and the scan, and C calls into the header rule and the readers.
# resync.py stays the one source of every rule; this file adds no logic. Compiled, Resync is an
# extension type: an attribute not declared here cannot be set.
cimport cython
from capture.kafka.headers cimport request_header_version
from capture.kafka.readers cimport int16_at

cdef Py_ssize_t _IDS_AHEAD, _SCAN_KEEP  # _SCAN_KEEP: SCAN_KEEP as a C value (the .py binds both names)

@cython.locals(end=Py_ssize_t, size=Py_ssize_t, api_key=int, api_version=int, corr=Py_ssize_t, cid_len=int)
cpdef object plausible_request(buf, Py_ssize_t i, Py_ssize_t max_frame_size)
@cython.locals(size=Py_ssize_t)
cpdef object plausible_response(buf, Py_ssize_t i, Py_ssize_t max_frame_size, dict in_flight)
@cython.locals(patterns=dict)
cpdef object request_scan_pattern(Py_ssize_t max_frame_size)

cdef class Resync:
    cdef public Py_ssize_t max_frame_size
    cdef public Py_ssize_t max_decoded_frame
    cdef public object response_cover
    cpdef forget_responses(self)
    @cython.locals(end=Py_ssize_t, max_frame_size=Py_ssize_t, window=Py_ssize_t, large=Py_ssize_t,
                   i=Py_ssize_t, following=Py_ssize_t)
    cpdef tuple scan(self, buf, Py_ssize_t start, bint requests, dict in_flight)
