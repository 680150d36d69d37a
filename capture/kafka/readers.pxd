# Augmenting declarations (Cython reads them beside readers.py when setup.py compiles it): C
# offsets and C calls between the readers, and for the modules that cimport them (headers,
# bodies, connection). readers.py stays the one source of every rule; this file adds no logic.
# `buf` stays untyped: the readers take bytes, bytearray and memoryview alike.
cimport cython

cpdef tuple read_int8(buf, Py_ssize_t off, Py_ssize_t end)
cpdef tuple read_bool(buf, Py_ssize_t off, Py_ssize_t end)
@cython.locals(value=int)
cpdef int int16_at(buf, Py_ssize_t off, Py_ssize_t end) except? -1
cpdef tuple read_int16(buf, Py_ssize_t off, Py_ssize_t end)
cpdef tuple read_int32(buf, Py_ssize_t off, Py_ssize_t end)
cpdef tuple read_int64(buf, Py_ssize_t off, Py_ssize_t end)
@cython.locals(value=Py_ssize_t, shift=Py_ssize_t, i=Py_ssize_t, b=Py_ssize_t)
cpdef tuple read_uvarint(buf, Py_ssize_t off, Py_ssize_t end)
cpdef Py_ssize_t _checked_length(Py_ssize_t length, Py_ssize_t off, Py_ssize_t end, what) except? -1
cpdef str _text(buf, Py_ssize_t start, Py_ssize_t stop)
@cython.locals(length=Py_ssize_t, stop=Py_ssize_t)
cpdef tuple read_string(buf, Py_ssize_t off, Py_ssize_t end)
@cython.locals(length=Py_ssize_t, stop=Py_ssize_t)
cpdef tuple read_nullable_string(buf, Py_ssize_t off, Py_ssize_t end)
@cython.locals(n=Py_ssize_t, stop=Py_ssize_t)
cpdef tuple read_compact_string(buf, Py_ssize_t off, Py_ssize_t end)
@cython.locals(n=Py_ssize_t, stop=Py_ssize_t)
cpdef tuple read_compact_nullable_string(buf, Py_ssize_t off, Py_ssize_t end)
@cython.locals(length=Py_ssize_t, stop=Py_ssize_t)
cpdef tuple read_bytes_span(buf, Py_ssize_t off, Py_ssize_t end)
@cython.locals(n=Py_ssize_t, stop=Py_ssize_t)
cpdef tuple read_compact_bytes_span(buf, Py_ssize_t off, Py_ssize_t end)
@cython.locals(count=Py_ssize_t, tag=Py_ssize_t, size=Py_ssize_t, stop=Py_ssize_t)
cpdef Py_ssize_t walk_tagged_fields(buf, Py_ssize_t off, Py_ssize_t end, visit=*) except? -1
cpdef Py_ssize_t skip_tagged_fields(buf, Py_ssize_t off, Py_ssize_t end) except? -1
