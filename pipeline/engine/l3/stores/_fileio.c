/* Batched reads of a file store's objects, each range's CRC-32C taken as it lands.

   `read_objects` reads a whole load's (file, offset, size) ranges into memory in one call, on
   threads of its own, without the interpreter's lock: each object opened once, below the
   store's folder with no link followed (the store's jail, as `beneath.py` does it), by the
   first thread to need it; each range read a chunk at a time into the thread's own chunk
   buffer, its CRC-32C computed there while still in the CPU's cache (a check after the whole
   read would fetch every byte from memory again), then streamed to its place past the caches,
   as one run or as rows a pitch apart (a pool that keeps a token's layers together). Threads
   take an object's ranges of one group at a time, in order, so the groups (a load's windows
   of pages, or a streamed load's groups of layers) finish in order; the calling thread wakes
   as each is whole and hands it to Python, which compares the CRCs with the objects' headers. This file only opens, moves and sums bytes.

   CRC-32C (Castagnoli, as the `crc32c` package computes it) on x86-64 runs either the CRC
   instruction, three independent streams combined by shifting (after Mark Adler's method), or
   carry-less multiplies folding four 16-byte lanes (after Intel's "Fast CRC Computation for
   Generic Polynomials Using PCLMULQDQ"), on 16-byte lanes or, where the CPU has AVX-512's
   VPCLMULQDQ, 64-byte ones: whichever this CPU runs fastest (timed at import); a table
   elsewhere. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__)
#include <immintrin.h>
#define HAVE_SSE42_PATH 1
#define WIDE_TARGET "avx512f,avx512vl,vpclmulqdq,sse4.2,pclmul"
#endif

#ifndef SYS_openat2
#define SYS_openat2 437 /* Linux's generic table: x86-64 and arm64 alike */
#endif
#define RESOLVE_NO_MAGICLINKS 0x02
#define RESOLVE_NO_SYMLINKS 0x04
#define RESOLVE_BENEATH 0x08

struct open_how { /* openat2's, as <linux/openat2.h> (not on every build host) has it */
    uint64_t flags, mode, resolve;
};

#define POLY 0x82f63b78u /* CRC-32C, reflected */
#define LONG_BLOCK 8192
#define SHORT_BLOCK 256
/* read, then summed while in the CPU's cache; and summed, then written: below about 1 MiB a
   call, each pread's or pwritev's fixed cost (the inode's lock, the page cache's walk)
   outweighs summing from L3 rather than L2 (2-core Zen 4, 128 objects of 4.5 MB: written 0.70
   as fast as plainly at 256 KiB a call, 0.84 at 1 and 2 MiB; read 0.80 of plain reads at 256
   KiB, 0.95 at 1 MiB) */
#define CHUNK (1024 * 1024)
#define IOV_BATCH 512        /* parts a write hands the kernel at once (IOV_MAX is 1024) */
#define THROUGH (16 * 1024) /* ranges from this size on are read through a thread's chunk */

typedef uint32_t (*Sum)(uint32_t, const unsigned char *, size_t);

typedef struct {
    uint32_t byte[256];        /* one byte at a time (no SSE 4.2) */
    uint32_t long_shift[4][256]; /* append LONG_BLOCK zero bytes to a CRC */
    uint32_t short_shift[4][256];
    uint64_t fold16[2], fold4[2], fold1[2]; /* carry-less folds forward by 2048, 512, 128 bits */
    Sum sum;          /* the fastest sum this CPU has */
    const char *name; /* its name, one of SUM_NAMES */
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

/* Four 64-byte lanes of 16-byte ones folded 256 bytes at a time (VPCLMULQDQ: four carry-less
   multiplies an instruction, about 2.5x the CRC instruction's three streams on AMD's Zen 4),
   folded into one 64-byte lane, its four 16-byte ones into one, as `crc_folded` ends. */
__attribute__((target(WIDE_TARGET))) static __m512i fold_wide(__m512i x, __m512i k) {
    return _mm512_xor_si512(_mm512_clmulepi64_epi128(x, k, 0x00),
                            _mm512_clmulepi64_epi128(x, k, 0x11));
}

__attribute__((target(WIDE_TARGET))) static uint32_t crc_wide(uint32_t crc, const unsigned char *p,
                                                              size_t len) {
    if (len < 256) return crc_sse42(crc, p, len);
    const __m512i k16 = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)tables.fold16));
    const __m512i k4 = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)tables.fold4));
    const __m128i k1 = _mm_loadu_si128((const __m128i *)tables.fold1);
    __m512i z0 = _mm512_loadu_si512(p), z1 = _mm512_loadu_si512(p + 64);
    __m512i z2 = _mm512_loadu_si512(p + 128), z3 = _mm512_loadu_si512(p + 192);
    z0 = _mm512_xor_si512(z0, _mm512_castsi128_si512(_mm_cvtsi32_si128((int)~crc)));
    for (p += 256, len -= 256; len >= 256; p += 256, len -= 256) {
        z0 = _mm512_xor_si512(fold_wide(z0, k16), _mm512_loadu_si512(p));
        z1 = _mm512_xor_si512(fold_wide(z1, k16), _mm512_loadu_si512(p + 64));
        z2 = _mm512_xor_si512(fold_wide(z2, k16), _mm512_loadu_si512(p + 128));
        z3 = _mm512_xor_si512(fold_wide(z3, k16), _mm512_loadu_si512(p + 192));
    }
    z0 = _mm512_xor_si512(fold_wide(z0, k4), z1);
    z0 = _mm512_xor_si512(fold_wide(z0, k4), z2);
    z0 = _mm512_xor_si512(fold_wide(z0, k4), z3);
    for (; len >= 64; p += 64, len -= 64)
        z0 = _mm512_xor_si512(fold_wide(z0, k4), _mm512_loadu_si512(p));
    __m128i x0 = _mm512_castsi512_si128(z0);
    x0 = _mm_xor_si128(fold(x0, k1), _mm512_extracti32x4_epi32(z0, 1));
    x0 = _mm_xor_si128(fold(x0, k1), _mm512_extracti32x4_epi32(z0, 2));
    x0 = _mm_xor_si128(fold(x0, k1), _mm512_extracti32x4_epi32(z0, 3));
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
    return tables.sum(crc, p, len);
}

#define SUM_COUNT 4
static const char *const SUM_NAMES[SUM_COUNT] = {"table", "crc32 instruction",
                                                 "carry-less multiply",
                                                 "wide carry-less multiply"};

/* Sum k of SUM_NAMES, or NULL where this CPU lacks what it runs on. */
static Sum sum_at(int k) {
    if (k == 0) return crc_table;
#ifdef HAVE_SSE42_PATH
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("sse4.2")) return NULL;
    if (k == 1) return crc_sse42;
    if (!__builtin_cpu_supports("pclmul")) return NULL;
    if (k == 2) return crc_folded;
    int wide = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
               __builtin_cpu_supports("vpclmulqdq");
    if (k == 3 && wide) return crc_wide;
#endif
    return NULL;
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

#endif

static void init_tables(void) {
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ POLY : c >> 1;
        tables.byte[n] = c;
    }
    shift_table(tables.long_shift, LONG_BLOCK);
    shift_table(tables.short_shift, SHORT_BLOCK);
    tables.fold16[0] = power_mod(2048 + 64 - 1);
    tables.fold16[1] = power_mod(2048 - 1);
    tables.fold4[0] = power_mod(512 + 64 - 1);
    tables.fold4[1] = power_mod(512 - 1);
    tables.fold1[0] = power_mod(128 + 64 - 1);
    tables.fold1[1] = power_mod(128 - 1);
    tables.sum = crc_table;
    tables.name = SUM_NAMES[0];
#ifdef HAVE_SSE42_PATH
    /* The fastest of the CPU's sums, timed on 64 KiB, best of five each (tens of microseconds
       at import; Intel's run the CRC instruction at about a byte a cycle a stream, AMD's Zen 2
       far slower). All give the same CRC. */
    static unsigned char buf[1 << 16];
    for (size_t i = 0; i < sizeof(buf); i++) buf[i] = (unsigned char)(i * 131);
    double best = 1e9;
    for (int k = 1; k < SUM_COUNT; k++) {
        Sum sum = sum_at(k);
        double s = sum ? seconds_of(sum, buf, sizeof(buf)) : 1e9;
        if (s < best) best = s, tables.sum = sum, tables.name = SUM_NAMES[k];
    }
#endif
}

/* One range into `into` (a small one: a header, read back at once), a chunk at a time, its
   CRC-32C summed as each chunk lands; 0 at a short file or a failed read. */
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

/* One row's bytes into the pool: streamed past the CPU's caches where both ends allow (the
   pool is read next by a copy to the device, not from this CPU's cache, and a cached store
   would first fetch each line it overwrites: measured, a load's reads 20-30% faster). */
static void put_row(unsigned char *to, const unsigned char *from, size_t len) {
#if defined(__x86_64__)
    if (((uintptr_t)to | (uintptr_t)from | len) % 16 == 0) {
        for (size_t k = 0; k < len; k += 16)
            _mm_stream_si128((__m128i *)(to + k), _mm_load_si128((const __m128i *)(from + k)));
        return;
    }
#endif
    memcpy(to, from, len);
}

/* `size` bytes at `offset` into `to`, however many reads it takes; 0 at a short file or a
   failed read. */
static int read_full(int fd, int64_t offset, unsigned char *to, int64_t size) {
    for (int64_t got = 0; got < size;) {
        ssize_t n = pread(fd, to + got, (size_t)(size - got), offset + got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return 0;
        got += n;
    }
    return 1;
}

/* `size` bytes from `from` put as rows of `row` bytes, each `pitch` bytes after the last (the
   last row may be short; one run: row = pitch = size). */
static void put_rows(unsigned char *into, const unsigned char *from, int64_t size, int64_t row,
                     int64_t pitch) {
    for (int64_t at = 0; at < size; at += row)
        put_row(into + at / row * pitch, from + at, (size_t)(size - at < row ? size - at : row));
}

/* One range read through `bounce` (CHUNK bytes, the thread's) a chunk of whole rows at a
   time, its CRC-32C summed there while in the CPU's cache, then its rows put a pitch apart
   (a host pool that keeps a token's layers together, `page_first`; one run: row = pitch =
   CHUNK); 0 at a short file or a failed read. */
static int read_through(int fd, int64_t offset, unsigned char *into, int64_t size, int64_t row,
                        int64_t pitch, unsigned char *bounce, uint32_t *crc) {
    uint32_t sum = 0;
    int64_t per = CHUNK / row * row; /* rows > CHUNK: refused by read_objects */
    for (int64_t done = 0; done < size; done += per) {
        int64_t want = size - done < per ? size - done : per;
        if (!read_full(fd, offset + done, bounce, want)) return 0;
        sum = crc32c(sum, bounce, (size_t)want);
        put_rows(into + done / row * pitch, bounce, want, row, pitch);
    }
#if defined(__x86_64__)
    _mm_sfence(); /* the streamed rows are visible before the range counts as read */
#endif
    *crc = sum;
    return 1;
}

/* The jail, as the store's Python opens (`beneath.py`, `files.py`): the path resolved below
   the root's descriptor with no link, `..` or absolute path anywhere in the walk, never
   blocking on a planted FIFO, and only a regular file of the object's size (any, for a
   negative `size`) taken; -1 else. */
static int open_object(int root, const char *path, int64_t size, int used) {
    struct open_how how = {.flags = O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC,
                           .resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
                                      RESOLVE_NO_MAGICLINKS};
    int fd = (int)syscall(SYS_openat2, root, path, &how, sizeof how);
    struct stat info;
    if (fd < 0) return -1;
    if (fstat(fd, &info) < 0 || !S_ISREG(info.st_mode) || (size >= 0 && info.st_size != size)) {
        close(fd);
        return -1;
    }
    if (used) { /* eviction orders by access time; the modification time is kept */
        const struct timespec now[2] = {{0, UTIME_NOW}, {0, UTIME_OMIT}};
        futimens(fd, now); /* a store another user owns is read without it */
    }
    return fd;
}

/* A thread of the extension's own: every signal blocked (they are the interpreter's main
   thread's), then its work. */
typedef struct {
    void *(*work)(void *);
    void *arg;
} Work;

static void *quiet(void *work) {
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    return ((Work *)work)->work(((Work *)work)->arg);
}

/* `work(arg)` on up to `threads` threads (at most 64, no more than `jobs`), the calling one
   among them, each taking jobs until none is left; returns once all are done. */
static void on_threads(void *(*work)(void *), void *arg, Py_ssize_t jobs, int threads) {
    Work quietly = {work, arg};
    pthread_t ids[63];
    int made = 0, wanted = threads < jobs ? threads : (int)jobs;
    for (; made < wanted - 1 && made < 63; made++)
        if (pthread_create(&ids[made], NULL, quiet, &quietly)) break;
    work(arg);
    for (int t = 0; t < made; t++) pthread_join(ids[t], NULL);
}

enum { UNOPENED, OPENING, OPEN, ABSENT }; /* an object's descriptor, as threads see it */

/* One `read_objects` call: its columns, its items (an object's ranges within one group, in
   the order they are taken) and what the threads share. */
typedef struct {
    int root, used;
    const char *const *paths; /* NULL: descriptors given */
    int32_t *fds;
    int *open_state;
    const int64_t *sizes, *objects, *offsets, *nbytes;
    const int64_t *rows, *pitches; /* NULL: every range lands as one run of bytes */
    const uint64_t *addresses;
    uint32_t *crcs;
    Py_ssize_t *item_start, *item_group, *group_left, items;
    int8_t *item_ok;
    Py_ssize_t next, limit; /* atomics: the next item to take; items from `limit` on are not read */
    pthread_mutex_t lock;
    pthread_cond_t group_done;
} Reads;

/* Object `o`'s descriptor, opened here by the first thread to need it (another waits for
   it: only a later group's item can reach an object whose first is still opening). */
static int object_fd(Reads *r, Py_ssize_t o) {
    int expected = UNOPENED;
    if (__atomic_compare_exchange_n(&r->open_state[o], &expected, OPENING, 0, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE)) {
        int fd = open_object(r->root, r->paths[o], r->sizes[o], r->used);
        r->fds[o] = fd;
        __atomic_store_n(&r->open_state[o], fd < 0 ? ABSENT : OPEN, __ATOMIC_RELEASE);
        return fd;
    }
    while ((expected = __atomic_load_n(&r->open_state[o], __ATOMIC_ACQUIRE)) == OPENING)
        sched_yield();
    return expected == OPEN ? r->fds[o] : -1;
}

/* Range k's rows where they land a pitch apart (`page_first`), 0 where it lands as one run. */
static int64_t ranged_row(const Reads *r, Py_ssize_t k) {
    return r->rows && r->rows[k] < r->nbytes[k] ? r->rows[k] : 0;
}

/* Ranges [k, m) of one object that lie end to end in its file, CHUNK bytes at most in all,
   read through `bounce` in one go: each summed there while in the CPU's cache and put in
   place, rows a pitch apart as `read_through` puts them (a page's units in one read, where a
   read each took as many calls); 0 at a short file or a failed read. */
static int read_run(Reads *r, int fd, Py_ssize_t k, Py_ssize_t m, unsigned char *bounce) {
    if (!read_full(fd, r->offsets[k], bounce, r->offsets[m - 1] + r->nbytes[m - 1] - r->offsets[k]))
        return 0;
    for (const unsigned char *from = bounce; k < m; from += r->nbytes[k++]) {
        int64_t size = r->nbytes[k], row = ranged_row(r, k);
        r->crcs[k] = crc32c(0, from, (size_t)size);
        put_rows((unsigned char *)r->addresses[k], from, size, row ? row : size,
                 row ? r->pitches[k] : size);
    }
#if defined(__x86_64__)
    _mm_sfence(); /* the streamed rows are visible before the ranges count as read */
#endif
    return 1;
}

/* The ranges from k on that `read_run` reads at once: end to end in the file, each through
   the chunk, CHUNK bytes at most in all (k alone where it is bigger); their end. */
static Py_ssize_t run_end(const Reads *r, Py_ssize_t k, Py_ssize_t stop) {
    int64_t total = r->nbytes[k];
    Py_ssize_t m = k + 1;
    for (; m < stop && r->offsets[m] == r->offsets[m - 1] + r->nbytes[m - 1] &&
           (r->nbytes[m] >= THROUGH || ranged_row(r, m)) && total + r->nbytes[m] <= CHUNK;
         m++)
        total += r->nbytes[m];
    return m;
}

static int read_item(Reads *r, Py_ssize_t i, unsigned char **bounce) {
    Py_ssize_t k = r->item_start[i], stop = r->item_start[i + 1];
    int fd = object_fd(r, r->objects[k]);
    while (fd >= 0 && k < stop) {
        unsigned char *into = (unsigned char *)r->addresses[k];
        int64_t row = ranged_row(r, k);
        Py_ssize_t m = k + 1;
        int ok;
        if (!row && r->nbytes[k] < THROUGH)
            ok = read_range(fd, r->offsets[k], into, r->nbytes[k], &r->crcs[k]);
        else if (!*bounce && !(*bounce = aligned_alloc(64, CHUNK)))
            ok = 0;
        else if (r->nbytes[k] <= CHUNK)
            ok = read_run(r, fd, k, m = run_end(r, k, stop), *bounce);
        else
            ok = read_through(fd, r->offsets[k], into, r->nbytes[k], row ? row : CHUNK,
                              row ? r->pitches[k] : CHUNK, *bounce, &r->crcs[k]);
        if (!ok) return 0;
        k = m;
    }
    return fd >= 0;
}

/* A reading thread: items in order, each whole or failed (reads stop there), until none is
   left; the last item of a group wakes the caller. */
static void *reader(void *arg) {
    Reads *r = arg;
    unsigned char *bounce = NULL; /* the thread's chunk to read through, made at need */
    for (Py_ssize_t i; (i = __atomic_fetch_add(&r->next, 1, __ATOMIC_RELAXED)) < r->items;) {
        if (i < __atomic_load_n(&r->limit, __ATOMIC_ACQUIRE)) {
            r->item_ok[i] = (int8_t)read_item(r, i, &bounce);
            for (Py_ssize_t at = r->limit; !r->item_ok[i] && i < at;)
                __atomic_compare_exchange_n(&r->limit, &at, i, 0, __ATOMIC_ACQ_REL,
                                            __ATOMIC_ACQUIRE);
        }
        if (__atomic_sub_fetch(&r->group_left[r->item_group[i]], 1, __ATOMIC_ACQ_REL) == 0) {
            pthread_mutex_lock(&r->lock);
            pthread_cond_broadcast(&r->group_done);
            pthread_mutex_unlock(&r->lock);
        }
    }
    free(bounce);
    return NULL;
}

/* A reading thread of its own, of the idle class (else niced): where the cores are all
   taken, the process's other threads (the I/O thread checking a group, the caller waiting for
   it, the collective agreeing on a load's hits, the forward's copies issued as groups land)
   take a core the moment they wake, and the reads take what is left. Niced alone (+5), 16
   readers on 16 cores held those wake-ups back 5-15 ms a load (H100 host, 2026-12-07). */
static void *reader_thread(void *arg) {
    struct sched_param idle = {0};
    if (pthread_setschedparam(pthread_self(), SCHED_IDLE, &idle))
        setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 5);
    return reader(arg);
}

/* Items from the ranges: a new one where the object or the group changes; -1 with an error
   where a group's objects are not in ascending order, once each. */
static Py_ssize_t make_items(Reads *r, Py_ssize_t n, const int64_t *ends, Py_ssize_t groups,
                             Py_ssize_t objects) {
    Py_ssize_t items = 0, g = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        while (g < groups && k >= ends[g]) g++;
        int64_t o = r->objects[k];
        int first_of_group = k == 0 || (g > 0 && k == ends[g - 1]);
        if (o < 0 || o >= objects) {
            PyErr_Format(PyExc_IndexError, "range %zd reads object %lld of %zd", k, (long long)o,
                         objects);
            return -1;
        }
        if (first_of_group || o != r->objects[k - 1]) {
            if (!first_of_group && o < r->objects[k - 1]) {
                PyErr_Format(PyExc_ValueError, "range %zd: a group's objects go in ascending "
                             "order, once each", k);
                return -1;
            }
            r->item_start[items] = k;
            r->item_group[items++] = g;
        }
    }
    r->item_start[items] = n;
    for (Py_ssize_t i = 0; i < items; i++) r->group_left[r->item_group[i]]++;
    return items;
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

/* Each item of `seq` (a sequence of `n` str) as UTF-8 in `out`, held by `*held`; 0 with an
   error at a NUL byte, or where `component` (a name within its folder) at an empty name, a
   '/', "." or "..". */
static int utf8_names(PyObject *seq, Py_ssize_t n, int component, PyObject **held,
                      const char ***out) {
    if (!(*held = PySequence_Tuple(seq))) return 0;
    if (PyTuple_GET_SIZE(*held) != n) {
        PyErr_Format(PyExc_ValueError, "%zd names for %zd objects", PyTuple_GET_SIZE(*held), n);
        return 0;
    }
    if (!(*out = PyMem_Calloc(n ? (size_t)n : 1, sizeof(char *)))) return !!PyErr_NoMemory();
    for (Py_ssize_t o = 0; o < n; o++) {
        Py_ssize_t len;
        const char *p = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(*held, o), &len);
        if (!p) return 0;
        int bad = component && (!len || strchr(p, '/') || !strcmp(p, ".") || !strcmp(p, ".."));
        if ((Py_ssize_t)strlen(p) != len || bad) {
            PyErr_SetString(PyExc_ValueError, component ? "a name is empty, '.', '..', or holds "
                                                          "a NUL or a '/'"
                                                        : "a path holds a NUL byte");
            return 0;
        }
        (*out)[o] = p;
    }
    return 1;
}

/* The objects' descriptors: opened below `root` by the reading threads (`paths`, the
   store's names), or given (`fds`, -1 for one not there); 0 with an error. */
static int objects_of(PyObject *files, Reads *r, PyObject **paths_held, const char ***paths,
                      Column *fds_given, Py_ssize_t n) {
    int root;
    PyObject *names;
    if (PyTuple_Check(files)) {
        if (!PyArg_ParseTuple(files, "iO:files", &root, &names) ||
            !utf8_names(names, n, 0, paths_held, paths))
            return 0;
        r->root = root;
        r->paths = *paths;
        return 1;
    }
    if (!column(files, fds_given, 4, 0, "fds")) return 0;
    if (fds_given->count != n) {
        PyErr_Format(PyExc_ValueError, "%zd fds for %zd objects", fds_given->count, n);
        PyBuffer_Release(&fds_given->view);
        fds_given->view.obj = NULL;
        return 0;
    }
    memcpy(r->fds, fds_given->view.buf, (size_t)n * sizeof(int32_t));
    for (Py_ssize_t o = 0; o < n; o++) r->open_state[o] = r->fds[o] < 0 ? ABSENT : OPEN;
    return 1;
}

/* Reads every item on `threads` threads while the caller, without the interpreter's lock
   (`state` saved), waits for each group in turn and, taking the lock, asks `on_group` whether
   to go on; 0 where `on_group` raised (after the threads are joined). */
static int run_groups(Reads *r, Py_ssize_t groups, int threads,
                      PyObject *on_group, PyThreadState **state) {
    pthread_t *ids = malloc(sizeof(pthread_t) * (size_t)threads);
    Work reading = {reader_thread, r};
    int made = 0, raised = 0;
    for (; ids && made < threads && r->items; made++)
        if (pthread_create(&ids[made], NULL, quiet, &reading)) break;
    if (!made) reader(r); /* no thread to be had: this one reads */
    for (Py_ssize_t g = 0, group_end = 0; g < groups; g++) {
        while (group_end < r->items && r->item_group[group_end] <= g) group_end++;
        pthread_mutex_lock(&r->lock);
        while (__atomic_load_n(&r->group_left[g], __ATOMIC_ACQUIRE))
            pthread_cond_wait(&r->group_done, &r->lock);
        pthread_mutex_unlock(&r->lock);
        if (__atomic_load_n(&r->limit, __ATOMIC_ACQUIRE) < group_end) break; /* a miss */
        if (on_group == Py_None) continue;
        PyEval_RestoreThread(*state);
        PyObject *go = PyObject_CallFunction(on_group, "n", g);
        int more = go ? PyObject_IsTrue(go) : -1;
        Py_XDECREF(go);
        *state = PyEval_SaveThread();
        if (more > 0) continue;
        for (Py_ssize_t at = r->limit; group_end < at;) /* the later groups are not read */
            __atomic_compare_exchange_n(&r->limit, &at, group_end, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE);
        raised = more < 0;
        break;
    }
    for (int t = 0; t < made; t++) pthread_join(ids[t], NULL);
    free(ids);
    return !raised;
}

/* What the call found: the objects opened, from the first, and the ranges read whole, from
   the first, up to where the reads stopped. */
static PyObject *found(Reads *r, Py_ssize_t objects) {
    Py_ssize_t opened = 0, i = 0;
    while (opened < objects && r->open_state[opened] == OPEN) opened++;
    while (i < r->limit && r->item_ok[i]) i++;
    return Py_BuildValue("nn", opened, r->item_start[i]);
}

static int ends_ok(const int64_t *ends, Py_ssize_t groups, Py_ssize_t n) {
    for (Py_ssize_t g = 0; g < groups; g++)
        if (ends[g] < (g ? ends[g - 1] : 0) || ends[g] > n || (g == groups - 1 && ends[g] != n)) {
            PyErr_SetString(PyExc_ValueError, "ends: where each group of ranges ends, ascending, "
                                              "the last at the number of ranges");
            return 0;
        }
    if (n && !groups) PyErr_SetString(PyExc_ValueError, "ends: no group holds the ranges");
    return !n || groups;
}

static PyObject *read_objects(PyObject *self, PyObject *args) {
    static const char *names[6] = {"sizes", "objects", "offsets", "addresses", "nbytes", "crcs"};
    PyObject *files, *objs[9] = {0}, *on_group = Py_None, *paths_held = NULL, *result = NULL;
    const char **paths = NULL;
    int used, threads, made = 0, columns = 7;
    Column cols[9], fds_given = {.view = {.obj = NULL}};
    Reads r = {.root = -1};
    if (!PyArg_ParseTuple(args, "OOpOOOOOOi|OOO:read_objects", &files, &objs[0], &used, &objs[1],
                          &objs[2], &objs[3], &objs[4], &objs[5], &objs[6], &threads, &on_group,
                          &objs[7], &objs[8]))
        return NULL;
    if ((objs[7] && objs[7] != Py_None) != (objs[8] && objs[8] != Py_None)) {
        PyErr_SetString(PyExc_ValueError, "read_objects: rows and pitches go together");
        return NULL;
    }
    if (objs[7] && objs[7] != Py_None) columns = 9;
    if (threads < 1 || (on_group != Py_None && !PyCallable_Check(on_group))) {
        PyErr_SetString(PyExc_ValueError, "read_objects: threads >= 1, on_group a callable");
        return NULL;
    }
    for (; made < columns; made++)
        if (!column(objs[made], &cols[made], made == 5 ? 4 : 8, made == 5,
                    made < 6 ? names[made] : made == 6 ? "ends" : made == 7 ? "rows" : "pitches"))
            goto out;
    Py_ssize_t count = cols[0].count, n = cols[1].count, groups = cols[6].count;
    for (int k = 2; k < columns; k++)
        if (k != 6 && cols[k].count != n) {
            PyErr_Format(PyExc_ValueError, "%s has %zd items, objects %zd",
                         k < 6 ? names[k] : k == 7 ? "rows" : "pitches", cols[k].count, n);
            goto out;
        }
    const int64_t *ends = cols[6].view.buf;
    if (!ends_ok(ends, groups, n)) goto out;
    r.used = used;
    r.sizes = cols[0].view.buf;
    r.objects = cols[1].view.buf;
    r.offsets = cols[2].view.buf;
    r.addresses = cols[3].view.buf;
    r.nbytes = cols[4].view.buf;
    r.crcs = cols[5].view.buf;
    if (columns == 9) {
        r.rows = cols[7].view.buf;
        r.pitches = cols[8].view.buf;
    }
    r.fds = calloc((size_t)count + 1, sizeof(int32_t));
    r.open_state = calloc((size_t)count + 1, sizeof(int));
    r.item_start = calloc((size_t)n + 1, sizeof(Py_ssize_t));
    r.item_group = calloc((size_t)n + 1, sizeof(Py_ssize_t));
    r.item_ok = calloc((size_t)n + 1, 1);
    r.group_left = calloc((size_t)groups + 1, sizeof(Py_ssize_t));
    if (!r.fds || !r.open_state || !r.item_start || !r.item_group || !r.item_ok || !r.group_left) {
        PyErr_NoMemory();
        goto out;
    }
    if (!objects_of(files, &r, &paths_held, &paths, &fds_given, count)) goto out;
    for (Py_ssize_t k = 0; k < n; k++)
        if (r.nbytes[k] < 0 || r.offsets[k] < 0) {
            PyErr_Format(PyExc_ValueError, "range %zd: a negative offset or length", k);
            goto out;
        } else if (r.rows && (r.rows[k] < 0 || (r.rows[k] && r.pitches[k] < r.rows[k]))) {
            PyErr_Format(PyExc_ValueError, "range %zd: rows of %lld bytes %lld apart overlap", k,
                         (long long)r.rows[k], (long long)r.pitches[k]);
            goto out;
        } else if (r.rows && r.rows[k] > CHUNK) {
            PyErr_Format(PyExc_ValueError, "range %zd: rows of %lld bytes, above CHUNK", k,
                         (long long)r.rows[k]);
            goto out;
        }
    if ((r.items = make_items(&r, n, ends, groups, count)) < 0) goto out;
    r.limit = r.items;
    pthread_mutex_init(&r.lock, NULL);
    pthread_cond_init(&r.group_done, NULL);
    PyThreadState *state = PyEval_SaveThread();
    int ok = run_groups(&r, groups, threads < r.items ? threads : (int)r.items, on_group,
                        &state);
    if (r.paths)
        for (Py_ssize_t o = 0; o < count; o++)
            if (r.open_state[o] == OPEN) close(r.fds[o]);
    PyEval_RestoreThread(state);
    pthread_cond_destroy(&r.group_done);
    pthread_mutex_destroy(&r.lock);
    result = ok ? found(&r, count) : NULL;
out:
    for (int k = 0; k < made; k++) PyBuffer_Release(&cols[k].view);
    if (fds_given.view.obj) PyBuffer_Release(&fds_given.view);
    Py_XDECREF(paths_held);
    PyMem_Free(paths);
    free(r.fds);
    free(r.open_state);
    free(r.item_start);
    free(r.item_group);
    free(r.item_ok);
    free(r.group_left);
    return result;
}

/* `present`'s call: each path's answer, found by threads taking the next path in turn. */
typedef struct {
    int root;
    const char *const *paths;
    Py_ssize_t count, next;
    int8_t *found;
} Lookups;

static void *look_up(void *arg) {
    Lookups *l = arg;
    for (Py_ssize_t i; (i = __atomic_fetch_add(&l->next, 1, __ATOMIC_RELAXED)) < l->count;) {
        int fd = open_object(l->root, l->paths[i], -1, 0);
        l->found[i] = fd >= 0;
        if (fd >= 0) close(fd);
    }
    return NULL;
}

static PyObject *present(PyObject *self, PyObject *args) {
    PyObject *files, *paths_held = NULL, *result = NULL;
    const char **paths = NULL;
    int threads;
    Reads r = {.root = -1};
    if (!PyArg_ParseTuple(args, "O!i:present", &PyTuple_Type, &files, &threads)) return NULL;
    if (threads < 1) {
        PyErr_SetString(PyExc_ValueError, "present: threads >= 1");
        return NULL;
    }
    PyObject *names = PyTuple_GET_SIZE(files) == 2 ? PyTuple_GET_ITEM(files, 1) : NULL;
    Py_ssize_t n = names ? PySequence_Size(names) : -1;
    if (n < 0) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "present: files is (root, paths)");
        return NULL;
    }
    Lookups l = {.count = n, .found = calloc((size_t)n + 1, 1)};
    if (!l.found) return PyErr_NoMemory();
    if (objects_of(files, &r, &paths_held, &paths, NULL, n)) {
        l.root = r.root;
        l.paths = r.paths;
        Py_BEGIN_ALLOW_THREADS
        on_threads(look_up, &l, n, threads);
        Py_END_ALLOW_THREADS
        result = PyList_New(n);
        for (Py_ssize_t i = 0; result && i < n; i++)
            PyList_SET_ITEM(result, i, PyBool_FromLong(l.found[i]));
    }
    Py_XDECREF(paths_held);
    PyMem_Free(paths);
    free(l.found);
    return result;
}

/* `write_objects`' call: each object's folder, its temporary and final names, its parts. */
typedef struct {
    const int32_t *folders;
    const char *const *tmps, *const *leaves;
    Py_buffer *parts;
    Py_ssize_t *first; /* object o's parts: [first[o], first[o + 1]) */
    const int64_t *tables; /* NULL, or where each object's header (its first part) holds the
                              digest table its payload's sums fill */
    int64_t check_at;      /* the header's 16 check bytes, filled last */
    const int64_t *units;  /* NULL (a part a unit), or the lengths its payload is cut into */
    Py_ssize_t unit_count;
    Py_ssize_t count, next;
    int *errors;
} Writes;

/* Parts [k, stop) written in order from `*at` on, gathered IOV_BATCH at a time, however
   partial each write; `*at` moved past them. 0, or the errno of the write that failed. */
static int write_parts(int fd, const Py_buffer *parts, Py_ssize_t k, Py_ssize_t stop, off_t *at) {
    struct iovec iov[IOV_BATCH];
    size_t done = 0; /* bytes of part k already written */
    while (k < stop) {
        int n = 0;
        size_t want = 0;
        for (Py_ssize_t j = k; j < stop && n < IOV_BATCH; j++, n++) {
            size_t skip = j == k ? done : 0;
            iov[n].iov_base = (char *)parts[j].buf + skip;
            want += iov[n].iov_len = (size_t)parts[j].len - skip;
        }
        if (!want) { /* empty parts only */
            k += n;
            done = 0;
            continue;
        }
        ssize_t got = pwritev(fd, iov, n, *at);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) return got ? errno : EIO;
        *at += got;
        for (size_t left = (size_t)got; k < stop;) { /* past the parts written whole */
            size_t rest = (size_t)parts[k].len - done;
            if (left < rest) {
                done += left;
                break;
            }
            left -= rest;
            done = 0;
            k++;
        }
    }
    return 0;
}

static void put_le32(unsigned char *to, uint32_t v) {
    for (int b = 0; b < 4; b++) to[b] = (unsigned char)(v >> (8 * b));
}

/* `n` bytes from `p` written at `*at` on, however partial each write; `*at` moved past them. */
static int write_span(int fd, const unsigned char *p, size_t n, off_t *at) {
    while (n) {
        ssize_t got = pwrite(fd, p, n, *at);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) return got ? errno : EIO;
        p += got;
        n -= (size_t)got;
        *at += got;
    }
    return 0;
}

/* A summed object's payload cut into units (`units`, which `summed_fits` checked tile its
   parts): a CHUNK or so of whole units at a time, each unit's CRC-32C put in its row just
   before the write that reads it. A page of the pool is one part, not a part a unit: no
   Python object a unit. */
static int write_cut(Writes *w, Py_ssize_t o, int fd, off_t *at) {
    unsigned char *table = (unsigned char *)w->parts[w->first[o]].buf + w->tables[o];
    Py_ssize_t u = 0;
    for (Py_ssize_t k = w->first[o] + 1; k < w->first[o + 1]; k++) {
        const unsigned char *p = w->parts[k].buf;
        for (size_t left = (size_t)w->parts[k].len; left;) {
            size_t bytes = 0;
            for (; u < w->unit_count && (size_t)w->units[u] <= left - bytes &&
                   (!bytes || bytes + (size_t)w->units[u] <= CHUNK);
                 u++) {
                put_le32(table + 8 * u, crc32c(0, p + bytes, (size_t)w->units[u]));
                bytes += (size_t)w->units[u];
            }
            int error = bytes ? write_span(fd, p, bytes, at) : EINVAL; /* `summed_fits` */
            if (error) return error;
            p += bytes;
            left -= bytes;
        }
    }
    return 0;
}

/* A summed object (`tables`): its payload parts written after the header's place a CHUNK
   or so at a time, each part's CRC-32C taken just before its write (so the write
   reads it from the CPU's cache: one pass over the pool where a sum, then a write, took two)
   into the header's table (rows of sum then length, 4 bytes each, little-endian:
   `core.l3.header`); then the header's check (the CRC-32C of the header with its check
   zeroed, in the first 4 of its 16 bytes) and the header itself, at the file's start. */
static int write_summed(Writes *w, Py_ssize_t o, int fd) {
    Py_ssize_t head = w->first[o], stop = w->first[o + 1];
    unsigned char *header = w->parts[head].buf;
    off_t at = w->parts[head].len;
    int error = w->units ? write_cut(w, o, fd, &at) : 0;
    for (Py_ssize_t k = head + 1; !w->units && !error && k < stop;) {
        Py_ssize_t end = k;
        for (size_t bytes = 0;
             end < stop && (end == k || bytes + (size_t)w->parts[end].len <= CHUNK) &&
             end - k < IOV_BATCH;
             end++) {
            const Py_buffer *part = &w->parts[end];
            put_le32(header + w->tables[o] + 8 * (end - head - 1),
                     crc32c(0, part->buf, (size_t)part->len));
            bytes += (size_t)part->len;
        }
        error = write_parts(fd, w->parts, k, end, &at);
        k = end;
    }
    if (error) return error;
    memset(header + w->check_at, 0, 16);
    put_le32(header + w->check_at, crc32c(0, header, (size_t)w->parts[head].len));
    off_t start = 0;
    return write_parts(fd, w->parts, head, head + 1, &start);
}

/* Object o written whole as a new temporary file beside its final name, its times set now,
   then renamed over the final name (none: left for the caller to rename): all relative to its
   folder's descriptor (no path walked, so no link followed); 0, or the errno of the step that
   failed (the temporary removed). */
static int write_object(Writes *w, Py_ssize_t o) {
    int folder = w->folders[o];
    int fd = openat(folder, w->tmps[o], O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) return errno;
    off_t start = 0;
    int error = w->tables ? write_summed(w, o, fd)
                          : write_parts(fd, w->parts, w->first[o], w->first[o + 1], &start);
    struct timespec now[2]; /* its first use, to the nanosecond (the file system's own
                               clock, UTIME_NOW, ticks in milliseconds) */
    clock_gettime(CLOCK_REALTIME, &now[0]);
    now[1] = now[0];
    if (!error && futimens(fd, now) < 0) error = errno;
    if (close(fd) < 0 && !error) error = errno;
    if (!error && w->leaves && renameat(folder, w->tmps[o], folder, w->leaves[o]) < 0)
        error = errno;
    if (error) unlinkat(folder, w->tmps[o], 0);
    return error;
}

static void *writer(void *arg) {
    Writes *w = arg;
    for (Py_ssize_t o; (o = __atomic_fetch_add(&w->next, 1, __ATOMIC_RELAXED)) < w->count;)
        w->errors[o] = write_object(w, o);
    return NULL;
}

/* Whether summed object o (parts [first[o], end)) has a header holding its table and its
   check; raises where not. */
static int summed_fits(const Writes *w, Py_ssize_t o, Py_ssize_t end) {
    Py_ssize_t head = w->first[o], units = w->units ? w->unit_count : end - head - 1;
    int64_t len = w->parts[head].len, table = w->tables[o];
    if (units < 0 || table < 0 || table + 8 * units > len || w->check_at < 0 ||
        w->check_at + 16 > len || (w->check_at < table + 8 * units && table < w->check_at + 16)) {
        PyErr_Format(PyExc_ValueError,
                     "object %zd: a header of %lld bytes holds no table of %zd rows at %lld "
                     "and check at %lld apart",
                     o, (long long)len, units, (long long)table, (long long)w->check_at);
        return 0;
    }
    Py_ssize_t u = 0; /* with units: they tile the payload's parts, none across two */
    for (Py_ssize_t k = head + 1; w->units && k < end; k++) {
        int64_t left = w->parts[k].len;
        while (left > 0 && u < w->unit_count) left -= w->units[u++];
        while (!left && u < w->unit_count && !w->units[u]) u++;
        if (left) {
            PyErr_Format(PyExc_ValueError, "object %zd: its part %zd is not whole units", o,
                         k - head - 1);
            return 0;
        }
    }
    if (w->units && u < w->unit_count) {
        PyErr_Format(PyExc_ValueError, "object %zd: its parts hold %zd of %zd units", o, u,
                     w->unit_count);
        return 0;
    }
    return 1;
}

static PyObject *write_objects(PyObject *self, PyObject *args) {
    PyObject *folders, *tmps, *leaves, *objects, *result = NULL, *held[3] = {NULL, NULL, NULL};
    PyObject *tables = Py_None, *units = Py_None;
    long long check_at = 0;
    int threads;
    Column fds = {.view = {.obj = NULL}}, table_col = {.view = {.obj = NULL}};
    Column unit_col = {.view = {.obj = NULL}};
    Writes w = {0};
    const char **tmp_names = NULL, **leaf_names = NULL;
    Py_ssize_t taken = 0, total = 0;
    if (!PyArg_ParseTuple(args, "OOOOi|OLO:write_objects", &folders, &tmps, &leaves, &objects,
                          &threads, &tables, &check_at, &units))
        return NULL;
    if (threads < 1) {
        PyErr_SetString(PyExc_ValueError, "write_objects: threads >= 1");
        return NULL;
    }
    if (!column(folders, &fds, 4, 0, "folders")) return NULL;
    Py_ssize_t n = fds.count;
    if (tables != Py_None) {
        if (!column(tables, &table_col, 8, 0, "tables")) goto out;
        if (table_col.count != n) {
            PyErr_SetString(PyExc_ValueError, "tables: one per object");
            goto out;
        }
        w.tables = table_col.view.buf;
        w.check_at = check_at;
        if (units != Py_None) {
            if (!column(units, &unit_col, 8, 0, "units")) goto out;
            w.units = unit_col.view.buf;
            w.unit_count = unit_col.count;
            for (Py_ssize_t u = 0; u < w.unit_count; u++)
                if (w.units[u] < 0) {
                    PyErr_SetString(PyExc_ValueError, "units: lengths >= 0");
                    goto out;
                }
        }
    } else if (units != Py_None) {
        PyErr_SetString(PyExc_ValueError, "units: only with tables (they are summed)");
        goto out;
    }
    if (!utf8_names(tmps, n, 1, &held[0], &tmp_names) ||
        (leaves != Py_None && !utf8_names(leaves, n, 1, &held[1], &leaf_names)))
        goto out;
    if (!(held[2] = PySequence_Tuple(objects)) || PyTuple_GET_SIZE(held[2]) != n) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "objects: one list of parts each");
        goto out;
    }
    for (Py_ssize_t o = 0; o < n; o++) {
        Py_ssize_t size = PySequence_Size(PyTuple_GET_ITEM(held[2], o));
        if (size < 0) goto out;
        total += size;
    }
    w.first = calloc((size_t)n + 1, sizeof(Py_ssize_t));
    w.parts = calloc((size_t)total + 1, sizeof(Py_buffer));
    w.errors = calloc((size_t)n + 1, sizeof(int));
    if (!w.first || !w.parts || !w.errors) {
        PyErr_NoMemory();
        goto out;
    }
    for (Py_ssize_t o = 0; o < n; o++) {
        PyObject *list = PySequence_Fast(PyTuple_GET_ITEM(held[2], o), "objects: lists of parts");
        if (!list) goto out;
        w.first[o] = taken;
        for (Py_ssize_t j = 0; j < PySequence_Fast_GET_SIZE(list); j++, taken++)
            if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(list, j), &w.parts[taken],
                                   PyBUF_C_CONTIGUOUS | (w.tables && !j ? PyBUF_WRITABLE : 0)) <
                0) {
                Py_DECREF(list);
                goto out;
            }
        Py_DECREF(list);
        if (w.tables && !summed_fits(&w, o, taken)) goto out;
    }
    w.first[n] = taken;
    w.folders = fds.view.buf;
    w.tmps = tmp_names;
    w.leaves = leaf_names;
    w.count = n;
    Py_BEGIN_ALLOW_THREADS
    on_threads(writer, &w, n, threads);
    Py_END_ALLOW_THREADS
    result = PyList_New(n);
    for (Py_ssize_t o = 0; result && o < n; o++)
        PyList_SET_ITEM(result, o, PyLong_FromLong(w.errors[o]));
out:
    for (Py_ssize_t j = 0; j < taken; j++) PyBuffer_Release(&w.parts[j]);
    PyBuffer_Release(&fds.view);
    PyBuffer_Release(&table_col.view);
    PyBuffer_Release(&unit_col.view);
    for (int k = 0; k < 3; k++) Py_XDECREF(held[k]);
    PyMem_Free(tmp_names);
    PyMem_Free(leaf_names);
    free(w.first);
    free(w.parts);
    free(w.errors);
    return result;
}

/* The sum named `how` ("" : the one reads use), or NULL with an error where this CPU lacks it. */
static Sum sum_named(const char *how) {
    if (!*how) return crc32c;
    for (int k = 0; k < SUM_COUNT; k++) {
        Sum sum = strcmp(how, SUM_NAMES[k]) ? NULL : sum_at(k);
        if (sum) return sum;
    }
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

/* `crcs_of`'s and `crcs_at`'s call: each range's sum, taken by threads taking the next range in turn. */
typedef struct {
    const uint64_t *addresses;
    const int64_t *nbytes;
    uint32_t *sums;
    Py_ssize_t count, next;
} RangeSums;

static void *range_summer(void *arg) {
    RangeSums *s = arg;
    for (Py_ssize_t i; (i = __atomic_fetch_add(&s->next, 1, __ATOMIC_RELAXED)) < s->count;)
        s->sums[i] = crc32c(0, (const unsigned char *)s->addresses[i], (size_t)s->nbytes[i]);
    return NULL;
}

static PyObject *crcs_of(PyObject *self, PyObject *args) {
    PyObject *arg;
    int threads = 1;
    if (!PyArg_ParseTuple(args, "O|i:crcs_of", &arg, &threads)) return NULL;
    PyObject *seq = PySequence_Fast(arg, "crcs_of takes a sequence of buffers");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), held = 0;
    size_t slots = n ? (size_t)n : 1;
    Py_buffer *views = PyMem_Calloc(slots, sizeof(Py_buffer));
    uint64_t *addresses = PyMem_Calloc(slots, sizeof(uint64_t));
    int64_t *nbytes = PyMem_Calloc(slots, sizeof(int64_t));
    uint32_t *sums = PyMem_Calloc(slots, sizeof(uint32_t));
    PyObject *found = NULL;
    if (!views || !addresses || !nbytes || !sums) {
        PyErr_NoMemory();
        goto out;
    }
    for (; held < n; held++) {
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, held), &views[held],
                               PyBUF_C_CONTIGUOUS) < 0)
            goto out;
        addresses[held] = (uint64_t)(uintptr_t)views[held].buf;
        nbytes[held] = views[held].len;
    }
    RangeSums job = {addresses, nbytes, sums, n, 0};
    Py_BEGIN_ALLOW_THREADS
    on_threads(range_summer, &job, n, threads);
    Py_END_ALLOW_THREADS
    found = PyList_New(n);
    for (Py_ssize_t i = 0; found && i < n; i++)
        PyList_SET_ITEM(found, i, PyLong_FromUnsignedLong(sums[i]));
out:
    for (Py_ssize_t i = 0; i < held; i++) PyBuffer_Release(&views[i]);
    PyMem_Free(views);
    PyMem_Free(addresses);
    PyMem_Free(nbytes);
    PyMem_Free(sums);
    Py_DECREF(seq);
    return found;
}

static PyObject *crcs_at(PyObject *self, PyObject *args) {
    PyObject *a, *n, *c;
    int threads = 1;
    if (!PyArg_ParseTuple(args, "OOO|i:crcs_at", &a, &n, &c, &threads)) return NULL;
    Column addresses, nbytes, sums;
    PyObject *found = NULL;
    if (!column(a, &addresses, 8, 0, "addresses")) return NULL;
    if (!column(n, &nbytes, 8, 0, "nbytes")) goto no_nbytes;
    if (!column(c, &sums, 4, 1, "crcs")) goto no_sums;
    if (nbytes.count != addresses.count || sums.count != addresses.count) {
        PyErr_SetString(PyExc_ValueError, "crcs_at: the columns differ in length");
        goto out;
    }
    for (Py_ssize_t k = 0; k < nbytes.count; k++)
        if (((const int64_t *)nbytes.view.buf)[k] < 0) {
            PyErr_Format(PyExc_ValueError, "crcs_at: range %zd has a negative length", k);
            goto out;
        }
    RangeSums job = {addresses.view.buf, nbytes.view.buf, sums.view.buf, addresses.count, 0};
    Py_BEGIN_ALLOW_THREADS
    on_threads(range_summer, &job, addresses.count, threads);
    Py_END_ALLOW_THREADS
    found = Py_NewRef(Py_None);
out:
    PyBuffer_Release(&sums.view);
no_sums:
    PyBuffer_Release(&nbytes.view);
no_nbytes:
    PyBuffer_Release(&addresses.view);
    return found;
}

static PyMethodDef methods[] = {
    {"read_objects", read_objects, METH_VARARGS,
     "read_objects(files, sizes, used, objects, offsets, addresses, nbytes, crcs, ends, threads, "
     "on_group=None, rows=None, pitches=None) -> (opened, read)\n\n"
     "Read range k (nbytes[k] at offsets[k] of object objects[k]) to the memory at "
     "addresses[k] and store its CRC-32C in crcs[k], on `threads` threads, without the "
     "interpreter's lock. files: (root_fd, paths), each path opened below root_fd with no link "
     "followed, a regular file of sizes[o] bytes or absent (`used`: its access time set now), "
     "or an int32 array of descriptors already open (-1: absent). Ranges go in groups "
     "(ends[g]: where group g ends), each group's objects ascending; a missing object or a "
     "short read stops the reads at its group; on_group(g) is called, holding the lock, once "
     "group g is whole, and a false answer stops the reads. Returns the objects opened and the "
     "ranges read whole, each counted from the first. rows, pitches (int64, per range, or both "
     "None): range k lands as rows of rows[k] bytes, pitches[k] apart (0: one run of bytes). "
     "Columns: int64, int64, int64, uint64, int64, uint32 (written), int64."},
    {"present", present, METH_VARARGS,
     "present((root_fd, paths), threads) -> list[bool]: whether each path below root_fd is a "
     "regular file, opened as read_objects opens an object (no link followed), on `threads` "
     "threads (at most 64) without the interpreter's lock."},
    {"write_objects", write_objects, METH_VARARGS,
     "write_objects(folders, tmps, leaves, objects, threads, tables=None, check_at=0, "
     "units=None) -> list[int]\n\n"
     "Write object o (the buffers objects[o], in order) as the new file tmps[o] in the folder "
     "open at folders[o] (int32), set its times now and rename it over leaves[o] there, on "
     "`threads` threads (at most 64) without the interpreter's lock; each object's errno, 0 "
     "where it was written (a failed one leaves no temporary file). No path is walked: names "
     "are single components of their folder; leaves None: each written object is left at its "
     "temporary name, for the caller to rename. tables (int64, per object) and check_at: each "
     "object's first part is its header (writable): its other parts are written after it, "
     "each one's CRC-32C put first in its row of 8 bytes (sum, length) of the table at "
     "tables[o], then the header's own CRC-32C (its 16 bytes at check_at zeroed) put there, "
     "and the header written last. units (int64, with tables): the other parts, end to end, "
     "are cut into units of these lengths (none across two parts), each unit's CRC-32C in "
     "its row: a page's units in one part."},
    {"crcs_of", crcs_of, METH_VARARGS,
     "crcs_of(buffers, threads=1) -> list[int]: the CRC-32C of each buffer, summed in one call "
     "outside the interpreter's lock, on up to `threads` threads (a write's units)."},
    {"crcs_at", crcs_at, METH_VARARGS,
     "crcs_at(addresses, nbytes, crcs, threads=1) -> None: crcs[k] = the CRC-32C of the "
     "nbytes[k] bytes at addresses[k] (memory the caller owns), summed in one call outside "
     "the interpreter's lock on up to `threads` threads (reads that land without a sum: "
     "Mooncake's). Columns: uint64, int64, uint32 (written)."},
    {"crc32c", py_crc32c, METH_VARARGS,
     "crc32c(data, crc=0, how='') -> int: CRC-32C of data, extending crc, by the sum reads use "
     "or the one named (SUMS)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fileio", NULL, -1, methods};

PyMODINIT_FUNC PyInit__fileio(void) {
    init_tables();
    PyObject *m = PyModule_Create(&module);
    if (m && (PyModule_AddIntConstant(m, "CHUNK", CHUNK) < 0 ||
              PyModule_AddStringConstant(m, "SUM", tables.name) < 0 ||
              PyModule_AddObject(m, "SUMS", Py_BuildValue("(ssss)", SUM_NAMES[0], SUM_NAMES[1],
                                                          SUM_NAMES[2], SUM_NAMES[3])) < 0)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
