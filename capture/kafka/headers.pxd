# Augmenting declarations (Cython reads them beside headers.py when setup.py compiles it): C calls
# for the header rules, which connection.py cimports. headers.py stays the one source of every
# rule; this file adds no logic.
from capture.kafka.readers cimport skip_tagged_fields

cpdef int request_header_version(int api_key, int api_version, spec) except? -1
cpdef int response_header_version(int api_key, int api_version, spec) except? -1
cpdef Py_ssize_t skip_response_header(buf, Py_ssize_t off, Py_ssize_t end, int api_key, int api_version,
                                      spec) except? -1
