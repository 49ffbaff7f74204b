/* Copies of equal blocks between CPU pools (a CPU rank's copies between its host and device
   tiers), on threads of its own without the interpreter's lock.

   The destination is written with streaming stores, past the CPU's caches: a copy of a load
   or a backup is not read again by this CPU soon, and a cached store would first fetch each
   line it overwrites from memory (a third of the traffic of a copy). Blocks whose ends are
   not 32-byte aligned are copied by memcpy. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

typedef struct {
    const uint64_t *dst, *src;
    size_t width;
    Py_ssize_t count, next;
} Blocks;

#if defined(__x86_64__)
__attribute__((target("avx2"))) static void stream_avx2(unsigned char *to,
                                                         const unsigned char *from, size_t len) {
    for (size_t k = 0; k < len; k += 64) {
        __m256i a = _mm256_loadu_si256((const __m256i *)(from + k));
        __m256i b = _mm256_loadu_si256((const __m256i *)(from + k + 32));
        _mm256_stream_si256((__m256i *)(to + k), a);
        _mm256_stream_si256((__m256i *)(to + k + 32), b);
    }
}

static void stream_sse2(unsigned char *to, const unsigned char *from, size_t len) {
    for (size_t k = 0; k < len; k += 16)
        _mm_stream_si128((__m128i *)(to + k), _mm_loadu_si128((const __m128i *)(from + k)));
}
#endif

static int has_avx2;

static void copy_block(unsigned char *to, const unsigned char *from, size_t len) {
#if defined(__x86_64__)
    if ((((uintptr_t)to | len) % 64) == 0) {
        if (has_avx2)
            stream_avx2(to, from, len);
        else
            stream_sse2(to, from, len);
        return;
    }
#endif
    memcpy(to, from, len);
}

static void *copier(void *arg) {
    Blocks *b = arg;
    for (Py_ssize_t i; (i = __atomic_fetch_add(&b->next, 1, __ATOMIC_RELAXED)) < b->count;)
        copy_block((unsigned char *)b->dst[i], (const unsigned char *)b->src[i], b->width);
#if defined(__x86_64__)
    _mm_sfence(); /* the streamed blocks are visible before the copy counts as done */
#endif
    return NULL;
}

/* A thread of the extension's own: every signal blocked (they are the interpreter's main
   thread's), then its share of the blocks. */
static void *quiet(void *arg) {
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    return copier(arg);
}

static int column(PyObject *obj, Py_buffer *view, const char *what) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS) < 0) return 0;
    if (view->len % 8) {
        PyErr_Format(PyExc_ValueError, "%s: not a column of 8-byte addresses", what);
        PyBuffer_Release(view);
        return 0;
    }
    return 1;
}

static PyObject *copy_blocks(PyObject *self, PyObject *args) {
    PyObject *d, *s;
    Py_ssize_t width;
    int threads = 1;
    if (!PyArg_ParseTuple(args, "OOn|i:copy_blocks", &d, &s, &width, &threads)) return NULL;
    Py_buffer dst, src;
    if (!column(d, &dst, "dst")) return NULL;
    if (!column(s, &src, "src")) {
        PyBuffer_Release(&dst);
        return NULL;
    }
    PyObject *done = NULL;
    if (dst.len != src.len || width < 0) {
        PyErr_SetString(PyExc_ValueError, "copy_blocks: dst and src differ in length, or the "
                                          "width is negative");
    } else {
        Blocks b = {dst.buf, src.buf, (size_t)width, dst.len / 8, 0};
        int most = threads < 1 ? 1 : threads > 64 ? 64 : threads;
        pthread_t ids[63];
        int made = 0;
        Py_BEGIN_ALLOW_THREADS
        for (; made < most - 1 && made < b.count - 1; made++)
            if (pthread_create(&ids[made], NULL, quiet, &b)) break;
        copier(&b);
        for (int t = 0; t < made; t++) pthread_join(ids[t], NULL);
        Py_END_ALLOW_THREADS
        done = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&dst);
    PyBuffer_Release(&src);
    return done;
}

static PyMethodDef methods[] = {
    {"copy_blocks", copy_blocks, METH_VARARGS,
     "copy_blocks(dst, src, width, threads=1) -> None: copy `width` bytes from each address "
     "src[k] to dst[k] (uint64 columns of memory the caller owns, blocks not overlapping), on "
     "up to `threads` threads without the interpreter's lock, past the CPU's caches."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_blocks", NULL, -1, methods};

PyMODINIT_FUNC PyInit__blocks(void) {
#if defined(__x86_64__)
    __builtin_cpu_init();
    has_avx2 = __builtin_cpu_supports("avx2");
#endif
    return PyModule_Create(&module);
}
