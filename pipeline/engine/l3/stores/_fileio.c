/* Batched reads of a file store's objects, each range's CRC-32C taken as it lands.

   `read_into` reads many (file, offset, size) ranges into memory in one call, without the
   interpreter's lock: each range a chunk at a time, each chunk's CRC-32C computed while the
   chunk is still in the CPU's cache (a check after the whole read would fetch every byte from
   memory again). Python opens the files (the store's jail), lays out the ranges and compares
   the CRCs with the objects' headers; this file only moves and sums bytes.

   CRC-32C (Castagnoli, as the `crc32c` package computes it) uses SSE 4.2 where the CPU has it,
   three independent streams combined by shifting (after Mark Adler's method), and a table
   elsewhere. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#if defined(__x86_64__)
#include <nmmintrin.h>
#define HAVE_SSE42_PATH 1
#endif

#define POLY 0x82f63b78u /* CRC-32C, reflected */
#define LONG_BLOCK 8192
#define SHORT_BLOCK 256
#define CHUNK (256 * 1024) /* read, then summed while in L2 */

typedef struct {
    uint32_t byte[256];        /* one byte at a time (no SSE 4.2) */
    uint32_t long_shift[4][256]; /* append LONG_BLOCK zero bytes to a CRC */
    uint32_t short_shift[4][256];
    int hardware;
} Tables;

static Tables tables; /* filled once at import, read-only after */

static uint32_t gf2_times(const uint32_t *mat, uint32_t vec) {
    uint32_t sum = 0;
    for (; vec; vec >>= 1, mat++)
        if (vec & 1) sum ^= *mat;
    return sum;
}

static void gf2_square(uint32_t *square, const uint32_t *mat) {
    for (int n = 0; n < 32; n++) square[n] = gf2_times(mat, mat[n]);
}

/* The operator that appends `len` zero bytes (a power of two) to a CRC. */
static void zeros_op(uint32_t *even, size_t len) {
    uint32_t odd[32], row = 1;
    odd[0] = POLY;
    for (int n = 1; n < 32; n++, row <<= 1) odd[n] = row;
    gf2_square(even, odd); /* two zero bits */
    gf2_square(odd, even); /* four */
    do {
        gf2_square(even, odd); /* first time: one zero byte */
        len >>= 1;
        if (len == 0) return;
        gf2_square(odd, even);
        len >>= 1;
    } while (len);
    memcpy(even, odd, sizeof(odd));
}

static void shift_table(uint32_t table[4][256], size_t len) {
    uint32_t op[32];
    zeros_op(op, len);
    for (uint32_t n = 0; n < 256; n++)
        for (int k = 0; k < 4; k++) table[k][n] = gf2_times(op, n << (8 * k));
}

static uint32_t shifted(uint32_t table[4][256], uint32_t crc) {
    return table[0][crc & 0xff] ^ table[1][(crc >> 8) & 0xff] ^ table[2][(crc >> 16) & 0xff] ^
           table[3][crc >> 24];
}

static uint32_t crc_table(uint32_t crc, const unsigned char *p, size_t len) {
    crc = ~crc;
    while (len--) crc = tables.byte[(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return ~crc;
}

#ifdef HAVE_SSE42_PATH
/* Whole blocks of three streams (the instruction's latency is three cycles, its throughput
   one), each block's CRC shifted past the next's bytes and combined. */
__attribute__((target("sse4.2"))) static uint64_t streams(uint64_t c0, const unsigned char **at,
                                                          size_t *len, size_t block,
                                                          uint32_t table[4][256]) {
    const unsigned char *p = *at;
    for (; *len >= 3 * block; *len -= 3 * block, p += 2 * block) {
        const unsigned char *end = p + block;
        uint64_t c1 = 0, c2 = 0;
        for (; p < end; p += 8) {
            uint64_t a, b, c;
            memcpy(&a, p, 8);
            memcpy(&b, p + block, 8);
            memcpy(&c, p + 2 * block, 8);
            c0 = _mm_crc32_u64(c0, a);
            c1 = _mm_crc32_u64(c1, b);
            c2 = _mm_crc32_u64(c2, c);
        }
        c0 = shifted(table, (uint32_t)c0) ^ (uint32_t)c1;
        c0 = shifted(table, (uint32_t)c0) ^ (uint32_t)c2;
    }
    *at = p;
    return c0;
}

__attribute__((target("sse4.2"))) static uint32_t crc_sse42(uint32_t crc, const unsigned char *p,
                                                             size_t len) {
    uint64_t c0 = ~crc & 0xffffffffu;
    for (; len && ((uintptr_t)p & 7); len--) c0 = _mm_crc32_u8((uint32_t)c0, *p++);
    c0 = streams(c0, &p, &len, LONG_BLOCK, tables.long_shift);
    c0 = streams(c0, &p, &len, SHORT_BLOCK, tables.short_shift);
    for (; len >= 8; p += 8, len -= 8) {
        uint64_t a;
        memcpy(&a, p, 8);
        c0 = _mm_crc32_u64(c0, a);
    }
    for (; len; len--) c0 = _mm_crc32_u8((uint32_t)c0, *p++);
    return ~(uint32_t)c0;
}
#endif

static uint32_t crc32c(uint32_t crc, const unsigned char *p, size_t len) {
#ifdef HAVE_SSE42_PATH
    if (tables.hardware) return crc_sse42(crc, p, len);
#endif
    return crc_table(crc, p, len);
}

static void init_tables(void) {
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ POLY : c >> 1;
        tables.byte[n] = c;
    }
    shift_table(tables.long_shift, LONG_BLOCK);
    shift_table(tables.short_shift, SHORT_BLOCK);
#ifdef HAVE_SSE42_PATH
    __builtin_cpu_init();
    tables.hardware = __builtin_cpu_supports("sse4.2");
#endif
}

/* One range into `into`, a chunk at a time, its CRC-32C summed as each chunk lands; 0 at a
   short file or a failed read. */
static int read_range(int fd, int64_t offset, unsigned char *into, int64_t size, uint32_t *crc) {
    uint32_t sum = 0;
    while (size > 0) {
        size_t want = size < CHUNK ? (size_t)size : CHUNK;
        ssize_t got = pread(fd, into, want, offset);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) return 0;
        sum = crc32c(sum, into, (size_t)got);
        into += got;
        offset += got;
        size -= got;
    }
    *crc = sum;
    return 1;
}

typedef struct {
    Py_buffer view;
    Py_ssize_t count;
} Column;

static int column(PyObject *obj, Column *col, Py_ssize_t itemsize, int writable, const char *what) {
    if (PyObject_GetBuffer(obj, &col->view, PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) <
        0)
        return 0;
    if (col->view.len % itemsize) {
        PyErr_Format(PyExc_ValueError, "%s: %zd bytes is not a whole number of %zd-byte items",
                     what, col->view.len, itemsize);
        PyBuffer_Release(&col->view);
        return 0;
    }
    col->count = col->view.len / itemsize;
    return 1;
}

static PyObject *read_into(PyObject *self, PyObject *args) {
    PyObject *objs[5];
    static const char *names[5] = {"fds", "offsets", "addresses", "sizes", "crcs"};
    static const Py_ssize_t widths[5] = {4, 8, 8, 8, 4};
    Column cols[5];
    if (!PyArg_ParseTuple(args, "OOOOO:read_into", &objs[0], &objs[1], &objs[2], &objs[3],
                          &objs[4]))
        return NULL;
    int made = 0;
    for (; made < 5; made++)
        if (!column(objs[made], &cols[made], widths[made], made == 4, names[made])) break;
    Py_ssize_t n = made == 5 ? cols[0].count : -1, done = 0;
    for (int k = 1; k < made && n >= 0; k++)
        if (cols[k].count != n) {
            PyErr_Format(PyExc_ValueError, "%s has %zd items, fds %zd", names[k], cols[k].count, n);
            n = -1;
        }
    if (n >= 0) {
        const int32_t *fds = cols[0].view.buf;
        const int64_t *offsets = cols[1].view.buf, *sizes = cols[3].view.buf;
        const uint64_t *addresses = cols[2].view.buf;
        uint32_t *crcs = cols[4].view.buf;
        Py_BEGIN_ALLOW_THREADS
        while (done < n && read_range(fds[done], offsets[done], (unsigned char *)addresses[done],
                                      sizes[done], &crcs[done]))
            done++;
        Py_END_ALLOW_THREADS
    }
    for (int k = 0; k < made; k++) PyBuffer_Release(&cols[k].view);
    return n < 0 ? NULL : PyLong_FromSsize_t(done);
}

static PyObject *py_crc32c(PyObject *self, PyObject *args) {
    Py_buffer data;
    unsigned int crc = 0;
    if (!PyArg_ParseTuple(args, "y*|I:crc32c", &data, &crc)) return NULL;
    uint32_t sum;
    Py_BEGIN_ALLOW_THREADS
    sum = crc32c(crc, data.buf, (size_t)data.len);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    return PyLong_FromUnsignedLong(sum);
}

static PyMethodDef methods[] = {
    {"read_into", read_into, METH_VARARGS,
     "read_into(fds, offsets, addresses, sizes, crcs) -> int\n\n"
     "Read range i (size bytes at offset of the open file fds[i]) to the memory at address i, "
     "and store its CRC-32C in crcs[i], in order, until a read comes back short or fails; "
     "the number of ranges read whole. Columns: int32, int64, uint64, int64, uint32 (written)."},
    {"crc32c", py_crc32c, METH_VARARGS, "crc32c(data, crc=0) -> int: CRC-32C of data, extending crc."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fileio", NULL, -1, methods};

PyMODINIT_FUNC PyInit__fileio(void) {
    init_tables();
    PyObject *m = PyModule_Create(&module);
    if (m && PyModule_AddIntConstant(m, "CHUNK", CHUNK) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
