/* Batched reads of a file store's objects, each range's CRC-32C taken as it lands.

   `read_into` reads many (file, offset, size) ranges into memory in one call, without the
   interpreter's lock: each range a chunk at a time, each chunk's CRC-32C computed while the
   chunk is still in the CPU's cache (a check after the whole read would fetch every byte from
   memory again). Python opens the files (the store's jail), lays out the ranges and compares
   the CRCs with the objects' headers; this file only moves and sums bytes.

   CRC-32C (Castagnoli, as the `crc32c` package computes it) on x86-64 runs either the CRC
   instruction, three independent streams combined by shifting (after Mark Adler's method), or
   carry-less multiplies folding four 16-byte lanes (after Intel's "Fast CRC Computation for
   Generic Polynomials Using PCLMULQDQ"), whichever this CPU runs faster (timed at import);
   a table elsewhere. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__)
#include <nmmintrin.h>
#include <wmmintrin.h>
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
    uint64_t fold4[2], fold1[2]; /* carry-less folds forward by 512 and 128 bits */
    int hardware, carryless;     /* which sum runs: the CRC instruction, the multiplier */
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

#ifdef HAVE_SSE42_PATH
/* 16 bytes folded forward by a distance: each 64-bit half carry-less multiplied by x to the
   distance (plus 64 for the first half, whose terms are 64 degrees higher) mod P, as a
   reflected constant one degree short (a reflected product lands one degree low). */
__attribute__((target("sse4.2,pclmul"))) static __m128i fold(__m128i x, __m128i k) {
    return _mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11));
}

/* Four 16-byte lanes folded 64 bytes at a time (the multiplier is far faster than the CRC
   instruction on some CPUs: AMD's Zen 2 sums about 6 GB/s a core with the latter), then one
   lane, whose CRC the CRC instruction takes over: it is the CRC of the bytes folded. */
__attribute__((target("sse4.2,pclmul"))) static uint32_t crc_folded(uint32_t crc,
                                                                    const unsigned char *p,
                                                                    size_t len) {
    if (len < 64) return crc_sse42(crc, p, len);
    const __m128i k4 = _mm_loadu_si128((const __m128i *)tables.fold4);
    const __m128i k1 = _mm_loadu_si128((const __m128i *)tables.fold1);
    __m128i x0 = _mm_loadu_si128((const __m128i *)p);
    __m128i x1 = _mm_loadu_si128((const __m128i *)(p + 16));
    __m128i x2 = _mm_loadu_si128((const __m128i *)(p + 32));
    __m128i x3 = _mm_loadu_si128((const __m128i *)(p + 48));
    x0 = _mm_xor_si128(x0, _mm_cvtsi32_si128((int)~crc)); /* the register: the first bytes */
    for (p += 64, len -= 64; len >= 64; p += 64, len -= 64) {
        x0 = _mm_xor_si128(fold(x0, k4), _mm_loadu_si128((const __m128i *)p));
        x1 = _mm_xor_si128(fold(x1, k4), _mm_loadu_si128((const __m128i *)(p + 16)));
        x2 = _mm_xor_si128(fold(x2, k4), _mm_loadu_si128((const __m128i *)(p + 32)));
        x3 = _mm_xor_si128(fold(x3, k4), _mm_loadu_si128((const __m128i *)(p + 48)));
    }
    x0 = _mm_xor_si128(fold(x0, k1), x1);
    x0 = _mm_xor_si128(fold(x0, k1), x2);
    x0 = _mm_xor_si128(fold(x0, k1), x3);
    for (; len >= 16; p += 16, len -= 16)
        x0 = _mm_xor_si128(fold(x0, k1), _mm_loadu_si128((const __m128i *)p));
    uint64_t c = _mm_crc32_u64(0, (uint64_t)_mm_cvtsi128_si64(x0));
    c = _mm_crc32_u64(c, (uint64_t)_mm_extract_epi64(x0, 1));
    return crc_sse42(~(uint32_t)c, p, len);
}
#endif

/* x^n mod P as a reflected 64-bit constant (degree d at bit 63 - d). */
static uint64_t power_mod(unsigned n) {
    uint64_t r = 1;
    while (n--) r = r & 0x80000000u ? ((r << 1) ^ 0x1edc6f41u) & 0xffffffffu : r << 1;
    uint64_t reflected = 0;
    for (int d = 0; d < 32; d++)
        if (r >> d & 1) reflected |= 1ull << (63 - d);
    return reflected;
}

static uint32_t crc32c(uint32_t crc, const unsigned char *p, size_t len) {
#ifdef HAVE_SSE42_PATH
    if (tables.carryless) return crc_folded(crc, p, len);
    if (tables.hardware) return crc_sse42(crc, p, len);
#endif
    return crc_table(crc, p, len);
}

#ifdef HAVE_SSE42_PATH
static double seconds_of(uint32_t (*sum)(uint32_t, const unsigned char *, size_t),
                         const unsigned char *buf, size_t len) {
    struct timespec t0, t1;
    double best = 1e9;
    for (int k = 0; k < 5; k++) {
        clock_gettime(CLOCK_MONOTONIC, &t0);
        volatile uint32_t sink = sum(0, buf, len);
        (void)sink;
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        best = s < best ? s : best;
    }
    return best;
}

/* Whether the multiplier sums faster than the CRC instruction on this CPU (Intel's run the
   instruction at about a byte a cycle per stream; AMD's Zen 2 far slower), timed on 64 KiB,
   best of five each (tens of microseconds at import). Both give the same CRC. */
static int faster_folded(void) {
    static unsigned char buf[1 << 16];
    for (size_t i = 0; i < sizeof(buf); i++) buf[i] = (unsigned char)(i * 131);
    return seconds_of(crc_folded, buf, sizeof(buf)) < seconds_of(crc_sse42, buf, sizeof(buf));
}
#endif

static void init_tables(void) {
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ POLY : c >> 1;
        tables.byte[n] = c;
    }
    shift_table(tables.long_shift, LONG_BLOCK);
    shift_table(tables.short_shift, SHORT_BLOCK);
    tables.fold4[0] = power_mod(512 + 64 - 1);
    tables.fold4[1] = power_mod(512 - 1);
    tables.fold1[0] = power_mod(128 + 64 - 1);
    tables.fold1[1] = power_mod(128 - 1);
#ifdef HAVE_SSE42_PATH
    __builtin_cpu_init();
    tables.hardware = __builtin_cpu_supports("sse4.2");
    if (tables.hardware && __builtin_cpu_supports("pclmul"))
        tables.carryless = faster_folded();
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

/* Whether to go on after a group of ranges: `on_group(g)`'s truth, called with the lock. */
static int group_done(PyObject *on_group, Py_ssize_t g, int *failed) {
    PyObject *r = PyObject_CallFunction(on_group, "n", g);
    int go = r ? PyObject_IsTrue(r) : -1;
    Py_XDECREF(r);
    *failed = go < 0;
    return go > 0;
}

static PyObject *read_into(PyObject *self, PyObject *args) {
    PyObject *objs[6], *on_group = Py_None;
    static const char *names[6] = {"fds", "offsets", "addresses", "sizes", "crcs", "ends"};
    static const Py_ssize_t widths[6] = {4, 8, 8, 8, 4, 8};
    Column cols[6];
    objs[5] = Py_None;
    if (!PyArg_ParseTuple(args, "OOOOO|OO:read_into", &objs[0], &objs[1], &objs[2], &objs[3],
                          &objs[4], &objs[5], &on_group))
        return NULL;
    int wanted = objs[5] == Py_None ? 5 : 6, made = 0, failed = 0;
    if (wanted == 6 && !PyCallable_Check(on_group)) {
        PyErr_SetString(PyExc_TypeError, "read_into: ends come with a callable on_group");
        return NULL;
    }
    for (; made < wanted; made++)
        if (!column(objs[made], &cols[made], widths[made], made == 4, names[made])) break;
    Py_ssize_t n = made == wanted ? cols[0].count : -1, done = 0;
    for (int k = 1; k < made && k < 5 && n >= 0; k++)
        if (cols[k].count != n) {
            PyErr_Format(PyExc_ValueError, "%s has %zd items, fds %zd", names[k], cols[k].count, n);
            n = -1;
        }
    if (n >= 0) {
        const int32_t *fds = cols[0].view.buf;
        const int64_t *offsets = cols[1].view.buf, *sizes = cols[3].view.buf;
        const int64_t *ends = wanted == 6 ? cols[5].view.buf : NULL;
        Py_ssize_t groups = wanted == 6 ? cols[5].count : 0, g = 0;
        const uint64_t *addresses = cols[2].view.buf;
        uint32_t *crcs = cols[4].view.buf;
        Py_BEGIN_ALLOW_THREADS
        while (done < n && read_range(fds[done], offsets[done], (unsigned char *)addresses[done],
                                      sizes[done], &crcs[done])) {
            done++;
            if (g < groups && done == ends[g]) { /* a group whole: its caller checks it */
                Py_BLOCK_THREADS
                int go = group_done(on_group, g++, &failed);
                Py_UNBLOCK_THREADS
                if (!go) break;
            }
        }
        Py_END_ALLOW_THREADS
    }
    for (int k = 0; k < made; k++) PyBuffer_Release(&cols[k].view);
    return n < 0 || failed ? NULL : PyLong_FromSsize_t(done);
}

typedef uint32_t (*Sum)(uint32_t, const unsigned char *, size_t);

/* The sum named `how` ("" : the one reads use), or NULL with an error where this CPU lacks it. */
static Sum sum_named(const char *how) {
    if (!*how) return crc32c;
    if (!strcmp(how, "table")) return crc_table;
#ifdef HAVE_SSE42_PATH
    if (!strcmp(how, "crc32 instruction") && tables.hardware) return crc_sse42;
    if (!strcmp(how, "carry-less multiply") && tables.hardware && __builtin_cpu_supports("pclmul"))
        return crc_folded;
#endif
    PyErr_Format(PyExc_ValueError, "no CRC-32C sum '%s' on this CPU", how);
    return NULL;
}

static PyObject *py_crc32c(PyObject *self, PyObject *args) {
    Py_buffer data;
    unsigned int crc = 0;
    const char *how = "";
    if (!PyArg_ParseTuple(args, "y*|Is:crc32c", &data, &crc, &how)) return NULL;
    Sum sum = sum_named(how);
    uint32_t found = 0;
    if (sum) {
        Py_BEGIN_ALLOW_THREADS
        found = sum(crc, data.buf, (size_t)data.len);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&data);
    return sum ? PyLong_FromUnsignedLong(found) : NULL;
}

static PyObject *crcs_of(PyObject *self, PyObject *arg) {
    PyObject *seq = PySequence_Fast(arg, "crcs_of takes a sequence of buffers");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), held = 0;
    Py_buffer *views = PyMem_Calloc(n ? (size_t)n : 1, sizeof(Py_buffer));
    uint32_t *sums = PyMem_Calloc(n ? (size_t)n : 1, sizeof(uint32_t));
    PyObject *found = NULL;
    if (!views || !sums) {
        PyErr_NoMemory();
        goto out;
    }
    for (; held < n; held++)
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, held), &views[held],
                               PyBUF_C_CONTIGUOUS) < 0)
            goto out;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) sums[i] = crc32c(0, views[i].buf, (size_t)views[i].len);
    Py_END_ALLOW_THREADS
    found = PyList_New(n);
    for (Py_ssize_t i = 0; found && i < n; i++)
        PyList_SET_ITEM(found, i, PyLong_FromUnsignedLong(sums[i]));
out:
    for (Py_ssize_t i = 0; i < held; i++) PyBuffer_Release(&views[i]);
    PyMem_Free(views);
    PyMem_Free(sums);
    Py_DECREF(seq);
    return found;
}

static PyMethodDef methods[] = {
    {"read_into", read_into, METH_VARARGS,
     "read_into(fds, offsets, addresses, sizes, crcs, ends=None, on_group=None) -> int\n\n"
     "Read range i (size bytes at offset of the open file fds[i]) to the memory at address i, "
     "and store its CRC-32C in crcs[i], in order, until a read comes back short or fails; "
     "the number of ranges read whole. Columns: int32, int64, uint64, int64, uint32 (written). "
     "With ends (int64: where each group of ranges ends), on_group(g) is called, holding the "
     "interpreter's lock, as each group is read whole; a false answer stops the reads."},
    {"crcs_of", crcs_of, METH_O,
     "crcs_of(buffers) -> list[int]: the CRC-32C of each buffer, summed in one call outside the "
     "interpreter's lock (a write's units: one release of the lock a page, not one a unit)."},
    {"crc32c", py_crc32c, METH_VARARGS,
     "crc32c(data, crc=0, how='') -> int: CRC-32C of data, extending crc, by the sum reads use "
     "or the one named (SUMS)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fileio", NULL, -1, methods};

PyMODINIT_FUNC PyInit__fileio(void) {
    init_tables();
    PyObject *m = PyModule_Create(&module);
    const char *sum = tables.carryless  ? "carry-less multiply"
                      : tables.hardware ? "crc32 instruction"
                                        : "table";
    if (m && (PyModule_AddIntConstant(m, "CHUNK", CHUNK) < 0 ||
              PyModule_AddStringConstant(m, "SUM", sum) < 0 ||
              PyModule_AddObject(m, "SUMS", Py_BuildValue("(sss)", "table", "crc32 instruction",
                                                          "carry-less multiply")) < 0)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
