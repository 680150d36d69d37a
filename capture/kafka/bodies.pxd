# Augmenting declarations (Cython reads them beside bodies.py when setup.py compiles it): C offsets
# and C calls into readers, and for connection.py, which cimports the decoders it calls per frame.
# bodies.py stays the one source of every rule; this file adds no logic. The decoders with a
# nested visitor (ApiVersions answer, features) stay Python functions, compiled.
cimport cython
from capture.kafka.readers cimport (
    int16_at,
    read_bool,
    read_bytes_span,
    read_compact_bytes_span,
    read_compact_nullable_string,
    read_compact_string,
    read_int16,
    read_int32,
    read_int64,
    read_nullable_string,
    read_string,
    skip_tagged_fields,
    walk_tagged_fields,
)

@cython.locals(verdicts=dict)
cpdef bint software_field_valid(value) except? -1
cpdef tuple read_api_versions_request(buf, Py_ssize_t off, Py_ssize_t end, int version)
@cython.locals(offers=dict)
cpdef tuple read_api_versions_request_cached(buf, Py_ssize_t off, Py_ssize_t end, int version)
@cython.locals(answers=dict, last=tuple)
cpdef dict read_api_versions_response_cached(buf, Py_ssize_t off, Py_ssize_t end, int request_version)
cpdef str read_sasl_handshake_request(buf, Py_ssize_t off, Py_ssize_t end, int version)
cpdef tuple read_sasl_handshake_response(buf, Py_ssize_t off, Py_ssize_t end, int version)
cpdef tuple read_sasl_authenticate_request(buf, Py_ssize_t off, Py_ssize_t end, int version)
cpdef int read_sasl_authenticate_response(buf, Py_ssize_t off, Py_ssize_t end, int version) except? -1
@cython.locals(transactional=bint)
cpdef tuple read_produce_prefix(buf, Py_ssize_t off, Py_ssize_t end, int version, bint flexible)
cpdef str read_join_group_group_id(buf, Py_ssize_t off, Py_ssize_t end, int version, bint flexible)
