# Augmenting declarations (Cython reads them beside tally.py when setup.py compiles it): C fields
# for the counts and C calls for the frame loops, which connection.py cimports. tally.py stays
# the one source of every rule; this file adds no logic. Compiled, TallyRun is an extension type:
# an attribute not declared here cannot be set.
cimport cython

cdef int _NO_ACKS  # NO_ACKS as a C value (the .py binds both names)

cdef class TallyRun:
    cdef dict requests
    cdef dict responses
    cdef dict acks
    cdef object client_id
    cdef double ts
    cdef Py_ssize_t streak_count
    cdef Py_ssize_t streak_bytes
    cdef int streak_api_key
    cdef int streak_api_version
    cdef int streak_acks
    cdef bint streak_transactional
    cdef list response_counts
    cdef int response_api_key
    cdef int response_api_version
    cpdef _setup(self)
    cpdef bint counted(self)
    cpdef count_request(self, int api_key, int api_version, int acks, bint transactional, Py_ssize_t size,
                        client_id, double ts)
    @cython.locals(counts=list)
    cpdef count_response(self, int api_key, int api_version, Py_ssize_t size, double latency, double ts)
    @cython.locals(n=Py_ssize_t, acks=int)
    cpdef _add_streak(self)
    @cython.locals(requests=dict, responses=dict, acks=dict)
    cpdef tuple hand_over(self, conn_id)

@cython.locals(run=TallyRun)
cpdef TallyRun new_tally_run()
