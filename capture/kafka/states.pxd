# Augmenting declarations (Cython reads them beside states.py when setup.py compiles it): the two
# transition checks as C calls, which connection.py cimports. states.py stays the one statement
# of every state and transition; this file adds no logic.
cdef bytes _STREAM_NEXT, _SASL_WAIT_NEXT
cdef Py_ssize_t _STREAM_EVENT_COUNT, _SASL_WAIT_EVENT_COUNT

cpdef int next_stream_state(int state, int event) except -1
cpdef int next_sasl_wait_state(int state, int event) except -1
