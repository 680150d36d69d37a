# Augmenting declarations (Cython reads them beside packets.py when setup.py compiles it): C types
# for the parsed segment and the parsers. packets.py stays the one source of every rule; this
# file adds no logic. Compiled, the packet bytes are a typed read-only view (bounds-checked, so
# a wrong offset raises as in Python, never reads past the buffer) and Segment an extension type
# with C fields: parsing a packet builds no Python object (IPv6 addresses aside).
cimport cython

ctypedef const unsigned char[::1] _Bytes

cdef class Segment:
    cdef public bint v6
    cdef public unsigned int src4
    cdef public unsigned int dst4
    cdef public object src6
    cdef public object dst6
    cdef public int sport
    cdef public int dport
    cdef public unsigned int seq
    cdef public unsigned int ack
    cdef public int flags
    cdef public Py_ssize_t po
    cdef public Py_ssize_t pe

@cython.locals(doff=int, hi=cython.uint)
cdef int _tcp_segment(_Bytes buf, Py_ssize_t t, Py_ssize_t ip_end, Segment seg) except -1

@cython.locals(vihl=int, ihl=int, total=int, ip_end=Py_ssize_t, t=Py_ssize_t, doff=int, hi=cython.uint)
cdef int _ipv4(_Bytes buf, Py_ssize_t p, Py_ssize_t end, Segment seg) except -1

@cython.locals(plen=int, ip_end=Py_ssize_t, nxt=int, q=Py_ssize_t, status=int)
cdef int _ipv6(_Bytes buf, Py_ssize_t p, Py_ssize_t end, Segment seg) except -1

cdef int _by_ethertype(_Bytes buf, Py_ssize_t p, Py_ssize_t end, int ethertype, Segment seg) except -1

@cython.locals(version=int)
cdef int _by_version(_Bytes buf, Py_ssize_t p, Py_ssize_t end, Segment seg) except -1

@cython.locals(ethertype=int, p=Py_ssize_t)
cdef int _ethernet(_Bytes buf, Py_ssize_t off, Py_ssize_t end, Segment seg) except -1

cdef int _sll(_Bytes buf, Py_ssize_t off, Py_ssize_t end, Segment seg) except -1

cdef int _sll2(_Bytes buf, Py_ssize_t off, Py_ssize_t end, Segment seg) except -1

cdef int _bsd_family(int family, _Bytes buf, Py_ssize_t p, Py_ssize_t end, Segment seg) except -1

@cython.locals(le=int, be=int)
cdef int _null(_Bytes buf, Py_ssize_t off, Py_ssize_t end, Segment seg) except -1

cdef int _loop(_Bytes buf, Py_ssize_t off, Py_ssize_t end, Segment seg) except -1

cpdef int parse_into(int linktype, _Bytes buf, Py_ssize_t off, Py_ssize_t end, Segment seg) except -1

@cython.locals(end=Py_ssize_t, cap=Py_ssize_t, n=Py_ssize_t, stopped=bint, hi=cython.uint, caplen=cython.uint)
cpdef tuple pcap_records(_Bytes buf, Py_ssize_t pos, bint little, unsigned int snapshot, unsigned int[::1] meta)
