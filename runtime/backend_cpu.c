/* backend_cpu.c: the CPU backend: a model's state in host memory (64-byte aligned),
 * the products through OpenBLAS, and the kernels of kernels.h in the model's precision.
 * Its operations are the row of backend.c's registry named "cpu". */
#include "arith.h"
#include "cv.h"
#include "forms.h"
#include "pool.h"
#include "sgemm.h"

#include <cblas.h>
#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define CV_NAME(x) x##_f
#define R float
#define CV_EXP cavs_exp_f
#include "kernels.h"
#undef R
#undef CV_NAME
#undef CV_EXP
#define CV_NAME(x) x##_d
#define R double
#define CV_EXP exp
#include "kernels.h"
#undef R
#undef CV_NAME
#undef CV_EXP

#define DBL(c) ((c)->desc->precision == CAVS_DOUBLE)

static int cpu_probe(char *msg, size_t len) {
  if (len) *msg = 0;
  return 0;
}

/* A parameter packed for sgemm.c's products, as it was in pass `pass`: a product by a
   parameter runs once a task, and packing it each time cost as much as a small task's
   product (the top levels of a tree). Keyed by where op(B) starts and its shape. Only a
   parameter read by more than one product a pass is packed so: one read once (an
   expert's matrix, whose rows run in one product a pass) is packed by that product,
   a block at a time, as any operand is: packed whole first, it bought no time and held
   a copy of itself (bench/README, "Experts' matrices packed by their product"). `seen` is the
   last pass it was read in, `uses` its products there, `before` in the pass it was
   read in before that. */
typedef struct Packed {
  const void *b;
  long ldb;
  int tb, n, k;
  unsigned pass, seen;
  int uses, before;
  float *data;
  size_t floats;
} Packed;
/* every parameter's forms of a model with 64 experts of two matrices */
enum { PACKED_MAX = 320 };

/* A product's distinct looked-up rows (cpu_gemm_distinct): slot_of[i] is 1 + the
   distinct row of index i while a product is being sorted out (0 otherwise: calloc's
   zeros, its pages touched only where the indices fall); slot[r] row r's distinct row
   (-1: no index); word[u] and first[u] distinct row u's index and first row; xu and tu
   a product's operands over the distinct rows. */
typedef struct Distinct {
  int *slot_of, *slot, *word, *first;
  long words, rows;
  void *xu, *tu;
  size_t xu_bytes, tu_bytes;
  /* what tu holds, where it is the sums of dy by index: dy, its rows and columns, the
     indices and the pass (dx's product and dW's read the same sums: within a backward
     pass a product's dy is final when it is read, and so are the indices) */
  bool sums;
  const void *sums_of;
  long sums_ld;
  int sums_a, sums_b, sums_cols;
  const int *sums_idx;
  unsigned sums_pass;
} Distinct;

/* The backend's state of one model (m->bs): its threads, its packed parameters. */
typedef struct Cpu {
  cv_pool *pool; /* NULL: one thread */
  int threads;
  Packed packed[PACKED_MAX];
  int npacked;
  Distinct distinct;
} Cpu;

static cv_pool *pool_of(const cavs_ctx *c) { return c->model->bs ? ((Cpu *)c->model->bs)->pool : NULL; }
cv_pool *cv_cpu_pool(const cavs_model *m) { return m->be == &cv_backend_cpu && m->bs ? ((Cpu *)m->bs)->pool : NULL; }

/* With threads > 1 the model has a pool of its own (pool.h) that runs the products, each
   split into column blocks with OpenBLAS single-threaded inside each, and the fused
   loops and large clears: one set of threads for everything. OpenBLAS's thread count is
   the process's, not the model's: a model made with threads sets it to 1 (with 1 too:
   one thread means one). */
static int cpu_open(cavs_model *m, const cavs_model_opts *o) {
  Cpu *s = calloc(1, sizeof *s);
  if (!s) return cv_fail_mem(m, "out of memory");
  m->bs = s;
  s->threads = o && o->threads > 0 ? o->threads : 1;
  if (o && o->threads > 0) openblas_set_num_threads(1);
  if (s->threads > 1 && !(s->pool = cv_pool_new(s->threads))) {
    /* (EAGAIN: pthread_create's "insufficient resources", a thread's stack not mapped,
       which is memory running out, as the status the `cavs` command gives it says) */
    int e = errno;
    return e == EAGAIN || e == ENOMEM ? cv_fail_mem(m, "cannot start %d threads: %s", s->threads, strerror(e))
                                      : cv_fail(m, "cannot start %d threads: %s", s->threads, strerror(e));
  }
  return 0;
}

/* Every block has 64 bytes before it that say how it was made: from the C library, or
   (a zeroed block of 64 KiB or more: the parameters, gradients and moments) mapped on
   its own, so that its pages come from the system's zeros only as they are first
   written and go back page by page (cpu_drop: another process's experts). */
enum { CPU_HEAD = 64, CPU_MAPPED_MIN = 64 << 10 };
/* (AddressSanitizer watches malloc's blocks, not a mapping: the mapping's bytes around
   the block are poisoned, as malloc's redzones are, and unpoisoned before munmap) */
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define CPU_POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define CPU_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define CPU_POISON(p, n) ((void)(p), (void)(n))
#define CPU_UNPOISON(p, n) ((void)(p), (void)(n))
#endif
typedef struct CpuHead {
  size_t mapped; /* the mapping's bytes, the page before the block's included; 0: malloc */
} CpuHead;
static CpuHead *head_of(void *p) { return (CpuHead *)((char *)p - CPU_HEAD); }
static size_t page_size(void) { return (size_t)sysconf(_SC_PAGESIZE); }

static void *cpu_alloc(cavs_model *m, size_t bytes) {
  (void)m;
  if (bytes > SIZE_MAX - 2 * CPU_HEAD) return NULL;
  char *p = aligned_alloc(64, ((bytes + 63) & ~(size_t)63) + CPU_HEAD);
  if (!p) return NULL;
  ((CpuHead *)p)->mapped = 0;
  return p + CPU_HEAD;
}
static void *cpu_alloc_zeroed(cavs_model *m, size_t bytes) {
  size_t page = page_size();
  if (bytes < CPU_MAPPED_MIN || bytes > SIZE_MAX - 2 * page) {
    void *p = cpu_alloc(m, bytes);
    if (p) memset(p, 0, bytes);
    return p;
  }
  size_t len = (bytes + page - 1) / page * page + page;
  char *base = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) return NULL;
  head_of(base + page)->mapped = len;
  CPU_POISON(base, page - CPU_HEAD);
  CPU_POISON(base + page + bytes, len - page - bytes);
  return base + page;
}
static void cpu_release(void *p) {
  if (!p) return;
  size_t mapped = head_of(p)->mapped;
  if (!mapped) {
    free(head_of(p));
    return;
  }
  CPU_UNPOISON((char *)p - page_size(), mapped);
  munmap((char *)p - page_size(), mapped);
}
static void cpu_drop(void *block, size_t off, size_t bytes) {
  char *p = block;
  size_t page = page_size(), a = (off + page - 1) / page * page, b = (off + bytes) / page * page;
  /* (a small block is only zeroed; a mapped one zeroed at its ends, its whole pages
     given back: a private mapping's pages read as zero after MADV_DONTNEED) */
  if (!bytes) return;
  if (!head_of(block)->mapped || b <= a || madvise(p + a, b - a, MADV_DONTNEED)) {
    memset(p + off, 0, bytes);
    return;
  }
  memset(p + off, 0, a - off);
  memset(p + b, 0, off + bytes - b);
}
/* a clear of many bytes, split over the threads in 4 KiB-aligned pieces */
typedef struct ZeroJob {
  char *p;
  size_t bytes, per;
} ZeroJob;
static void zero_part(void *arg, int i) {
  ZeroJob *z = arg;
  size_t at = (size_t)i * z->per;
  if (at < z->bytes) memset(z->p + at, 0, z->bytes - at < z->per ? z->bytes - at : z->per);
}
static void cpu_zero(cavs_model *m, void *p, size_t bytes) {
  cv_pool *pool = m->bs ? ((Cpu *)m->bs)->pool : NULL;
  int parts = cv_pool_threads(pool);
  double t0 = cv_now();
  if (!pool || bytes < ((size_t)1 << 20)) memset(p, 0, bytes);
  else {
    ZeroJob z = {p, bytes, ((bytes + (size_t)parts - 1) / (size_t)parts + 4095) & ~(size_t)4095};
    cv_pool_run(pool, zero_part, &z, parts);
  }
  m->stats.zero_seconds += cv_now() - t0;
}
static int cpu_copy(cavs_model *m, void *dst, const void *src, size_t bytes) {
  (void)m;
  memcpy(dst, src, bytes);
  return 0;
}
static int cpu_copy2d(cavs_model *m, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                      size_t rows) {
  (void)m;
  for (size_t r = 0; r < rows; r++) memcpy((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
  return 0;
}
/* Launches are counted where the CUDA backend launches (cavs_backend_stats): the same
   pass counts the same on both. */
#define LAUNCH(c, cond) ((c)->model->stats.launches += (cond) ? 1 : 0)
/* the seconds a statement takes, added to one of the model's timers */
#define TIMED(m, field, stmt)                                                                  \
  do {                                                                                         \
    double t0_ = cv_now();                                                                     \
    stmt;                                                                                      \
    (m)->stats.field += cv_now() - t0_;                                                        \
  } while (0)

static int cpu_zero_rows(cavs_model *m, void *base, size_t row, const int *rows, int n) {
  m->stats.launches += n > 0;
  TIMED(m, zero_seconds, for (int i = 0; i < n; i++) memset((char *)base + (size_t)rows[i] * row, 0, row));
  return 0;
}
static void cpu_close(cavs_model *m) {
  Cpu *s = m->bs;
  if (s) {
    cv_pool_free(s->pool);
    for (int i = 0; i < s->npacked; i++) free(s->packed[i].data);
    Distinct *d = &s->distinct;
    free(d->slot_of), free(d->slot), free(d->word), free(d->first), free(d->xu), free(d->tu);
  }
  free(s);
  m->bs = NULL;
}
static int cpu_schedule(cavs_model *m) { return 0; }
static int cpu_synchronize(cavs_model *m) { return 0; }

/* A product split over the pool: C's columns in blocks (op(B)'s columns: B's own, or its
   rows when transposed), or its rows when it has too few columns; each block one
   single-threaded gemm. Every element of C is the same dot product, in the same order,
   whatever the split: the result does not depend on the thread count. */
typedef struct GemmJob {
  bool dbl;
  enum CBLAS_TRANSPOSE A, B;
  int m, n, k;
  double alpha, beta;
  const char *a, *b;
  char *c;
  long lda, ldb, ldc;
  int parts;
  bool by_rows;
  bool own;             /* sgemm.c's product rather than the BLAS's, decided for the whole product */
  bool small;           /* its few rows read op(B) in place (cv_sgemm_small) */
  bool narrow;          /* fewer than 16 columns (cv_sgemm_narrow) */
  const float *packed;  /* with own: op(B) packed for this pass (a parameter), or NULL */
} GemmJob;

static void gemm_part(void *arg, int i) {
  const GemmJob *g = arg;
  size_t es = g->dbl ? 8 : 4;
  int len = g->by_rows ? g->m : g->n;
  /* blocks of whole 16-element groups (64 bytes of floats); of whole 64-column panels
     when they read a packed parameter */
  int align = g->packed && !g->by_rows ? 64 : 16;
  int per = ((len + g->parts - 1) / g->parts + align - 1) / align * align, at = i * per;
  if (at >= len) return;
  int cnt = len - at < per ? len - at : per;
  const char *a = g->a, *b = g->b;
  char *c = g->c;
  int m = g->m, n = g->n;
  if (g->by_rows) {
    a += (size_t)at * (g->A == CblasNoTrans ? (size_t)g->lda : 1) * es;
    c += (size_t)at * (size_t)g->ldc * es;
    m = cnt;
  } else {
    b += (size_t)at * (g->B == CblasNoTrans ? 1 : (size_t)g->ldb) * es;
    c += (size_t)at * es;
    n = cnt;
  }
  if (g->narrow && cv_sgemm_narrow(g->A == CblasTrans, g->B == CblasTrans, m, n, g->k, (float)g->alpha,
                                   (const float *)a, g->lda, (const float *)b, g->ldb, (float)g->beta, (float *)c,
                                   g->ldc) == 0)
    return;
  if (g->small && cv_sgemm_small(g->A == CblasTrans, g->B == CblasTrans, m, n, g->k, (float)g->alpha,
                                  (const float *)a, g->lda, (const float *)b, g->ldb, (float)g->beta, (float *)c,
                                  g->ldc) == 0)
    return;
  if (g->packed && cv_sgemm_packed(g->A == CblasTrans, m, n, g->k, (float)g->alpha, (const float *)a, g->lda,
                                    g->packed, g->n, g->by_rows ? 0 : at, (float)g->beta, (float *)c, g->ldc) == 0)
    return;
  if (g->own && cv_sgemm(g->A == CblasTrans, g->B == CblasTrans, m, n, g->k, (float)g->alpha, (const float *)a,
                         g->lda, (const float *)b, g->ldb, (float)g->beta, (float *)c, g->ldc) == 0)
    return;
  if (g->dbl)
    cblas_dgemm(CblasRowMajor, g->A, g->B, m, n, g->k, g->alpha, (const double *)a, (int)g->lda, (const double *)b,
                (int)g->ldb, g->beta, (double *)c, (int)g->ldc);
  else
    cblas_sgemm(CblasRowMajor, g->A, g->B, m, n, g->k, (float)g->alpha, (const float *)a, (int)g->lda,
                (const float *)b, (int)g->ldb, (float)g->beta, (float *)c, (int)g->ldc);
}

/* op(B) packed for this pass when it is one of the model's parameters (they do not
   change within a pass: cavs_model_forward and cavs_model_backward count passes), or
   NULL: not a parameter, no room in the table, no memory (the product packs it itself). */
static const float *packed_param(cavs_model *m, bool tb, int n, int k, const void *b, long ldb) {
  Cpu *s = m->bs;
  const char *p = b, *lo = m->pflat, *hi = lo + m->nflat * m->esize;
  if (!s || !lo || p < lo || p >= hi) return NULL;
  Packed *e = NULL;
  for (int i = 0; i < s->npacked && !e; i++) {
    Packed *q = &s->packed[i];
    if (q->b == b && q->ldb == ldb && q->tb == tb && q->n == n && q->k == k) e = q;
  }
  if (!e) {
    if (s->npacked == PACKED_MAX) return NULL;
    e = &s->packed[s->npacked++];
    *e = (Packed){.b = b, .ldb = ldb, .tb = tb, .n = n, .k = k, .pass = m->pass - 1, .seen = m->pass - 1};
  }
  if (e->seen != m->pass) {
    e->before = e->uses;
    e->uses = 0;
    e->seen = m->pass;
  }
  /* packed at its first product of a pass when it had more than one the pass before,
     else at its second: a parameter read once a pass is never packed whole */
  if (++e->uses < 2 && e->before < 2) return NULL;
  if (e->pass != m->pass) {
    size_t need = cv_sgemm_packed_floats(n, k);
    if (need > e->floats) {
      void *d = NULL;
      if (posix_memalign(&d, 64, need * sizeof(float))) return NULL;
      free(e->data);
      e->data = d;
      e->floats = need;
    }
    cv_sgemm_pack(tb, n, k, b, ldb, e->data);
    e->pass = m->pass;
  }
  return e->data;
}

/* whether cv_sgemm runs in AVX2 (no AVX-512, or CAVS_GEMM=avx2) */
static bool own_in_avx2(void) {
  static int avx2 = -1;
  if (avx2 < 0) avx2 = !strcmp(cv_sgemm_small_isa(), "avx2");
  return avx2;
}

/* The product's job: which kernels run it (decided by its shape alone, so that a
   product's bits do not depend on the threads), over `parts` blocks */
static GemmJob gemm_job(cavs_ctx *c, enum CBLAS_TRANSPOSE A, enum CBLAS_TRANSPOSE B, int m, int n, int k,
                        double alpha, const void *a, long lda, const void *b, long ldb, double beta, void *cm,
                        long ldc, int parts) {
  GemmJob g = {DBL(c), A, B, m, n, k, alpha, beta, a, b, cm, lda, ldb, ldc, parts, false, false, false, false, NULL};
  /* Single precision through sgemm.c where the processor has AVX-512 (twice the BLAS's
     rate on a Zen 5, bench/README) or AVX2 with FMA (at par with the BLAS in cache on a
     Zen 3, ahead in an epoch: the parameters packed once a pass, the operands asked
     for ahead, C set rather than cleared), but for C narrower than one vector (a
     classifier's few classes), where its tiles would be mostly padding. Its one failure
     (no memory for packing) falls back to the BLAS, which computes the same product. */
  g.own = !g.dbl && n >= 16 && c->model->own_gemm;
  /* A few rows read op(B) once or a few times: packing it would cost as much (and a
     parameter packed for a pass is read by few such products at batch size 1). Both
     operands transposed (no model's product) go the packed way. */
  g.small = !g.dbl && n >= 16 && c->model->small_gemm && m <= CV_SGEMM_SMALL_M &&
            !(A == CblasTrans && B == CblasTrans);
  /* Fewer than 16 columns (a classifier's classes): the few-rows kernels over all the
     rows, op(B) laid out as n rows of k (sgemm.c, cv_sgemm_narrow); the BLAS ran the
     Tree-LSTM's 5 classes at 14-18 GFLOP/s. */
  g.narrow = !g.dbl && n < 16 && c->model->small_gemm;
  /* In AVX2 the own product packs op(B) more slowly than the BLAS does, which shows
     where few rows or a short k read each packed panel: under 64 of either (a tree's
     leaves at batch size 1, a gradient summed over them) it goes to the BLAS (a Zen 3:
     44 against 61 GFLOP/s at 20 x 2048 x 512; bench/README, "The big product in
     AVX2"). By the shape alone, not by whether op(B) is packed for the pass (which
     depends on the passes before: a resumed run would take other kernels). */
  if (g.own && !g.small && (m < 64 || k < 64) && own_in_avx2()) g.own = false;
  if (g.own && !g.small) g.packed = packed_param(c->model, B == CblasTrans, n, k, b, ldb);
  return g;
}

static void gemm_parts(cavs_ctx *c, enum CBLAS_TRANSPOSE A, enum CBLAS_TRANSPOSE B, int m, int n, int k,
                       double alpha, const void *a, long lda, const void *b, long ldb, double beta, void *cm,
                       long ldc) {
  cv_pool *pool = pool_of(c);
  int parts = cv_pool_threads(pool);
  GemmJob g = gemm_job(c, A, B, m, n, k, alpha, a, lda, b, ldb, beta, cm, ldc, parts);
  /* below a megaflop, or without 32 columns (rows) a thread, one call */
  if (!pool || 2.0 * m * n * k < 1e6 || (n < 32 * parts && m < 32 * parts)) {
    g.parts = 1;
    gemm_part(&g, 0);
    return;
  }
  /* by rows where C has at least as many rows as columns: each thread then reads its
     share of op(A) (the rows, activations out of cache) and all of op(B) (a parameter,
     packed once a pass and shared), where a split by columns has every thread read all
     of op(A); by columns otherwise. Tree-FC's products at 8192 rows, the Tree-LSTM's
     x @ W at 1200 (bench/README, "C set at the first slice, products split by rows"). */
  g.by_rows = n < 32 * parts || m >= n;
  cv_pool_run(pool, gemm_part, &g, parts);
}

/* Whether a single row goes to libcavs's few-rows kernel rather than the BLAS's gemv
   (cpu_gemm) */
static bool own_row(const cavs_ctx *c, int ta, int tb, int n) {
  return !DBL(c) && n >= 16 && c->model->small_gemm && !(ta == CAVS_TRANS && tb == CAVS_TRANS);
}

/* Whether cpu_gemm runs a product through gemm_parts (not a gemv, a ger or an empty
   sum: below) */
static bool gemm_general(const cavs_ctx *c, int ta, int tb, int m, int n, int k, double beta) {
  return m > 0 && n > 0 && k > 0 && !(m == 1 && !own_row(c, ta, tb, n)) && !(k == 1 && beta == 1);
}

static void cpu_gemm(cavs_ctx *c, int ta, int tb, int m, int n, int k, double alpha, const void *a, long lda,
                     const void *b, long ldb, double beta, void *cm, long ldc) {
  if (m <= 0 || n <= 0) return;
  LAUNCH(c, 1);
  if (k <= 0) {
    /* an empty sum: C = beta C */
    for (int i = 0; i < m; i++)
      for (int j = 0; j < n; j++) {
        if (DBL(c)) ((double *)cm)[(size_t)i * ldc + j] *= beta;
        else ((float *)cm)[(size_t)i * ldc + j] *= (float)beta;
      }
    return;
  }
  enum CBLAS_TRANSPOSE A = ta == CAVS_TRANS ? CblasTrans : CblasNoTrans;
  enum CBLAS_TRANSPOSE B = tb == CAVS_TRANS ? CblasTrans : CblasNoTrans;
  double t0 = cv_now();
  /* A single row (one vertex: batch size 1, a tree's top levels, --policy serial) is a
     matrix-vector product, and a single-row parameter gradient an outer product: gemv
     and ger, without the packing gemm does for its blocks (most of an M=1 gemm's time).
     op(A)'s one row, or op(A)'s one column, is read with A's stride where it is not
     contiguous. Where libcavs's few-rows kernel runs, a row goes to it instead
     (gemm_parts: faster than the BLAS's gemv on Zen 4 and Zen 3, bench/README). */
  if (m == 1 && !own_row(c, ta, tb, n)) {
    int inc = ta == CAVS_TRANS ? (int)lda : 1;
    if (DBL(c))
      cblas_dgemv(CblasRowMajor, B == CblasNoTrans ? CblasTrans : CblasNoTrans, B == CblasNoTrans ? k : n,
                  B == CblasNoTrans ? n : k, alpha, b, (int)ldb, a, inc, beta, cm, 1);
    else
      cblas_sgemv(CblasRowMajor, B == CblasNoTrans ? CblasTrans : CblasNoTrans, B == CblasNoTrans ? k : n,
                  B == CblasNoTrans ? n : k, (float)alpha, b, (int)ldb, a, inc, (float)beta, cm, 1);
  } else if (k == 1 && beta == 1) {
    int ia = ta == CAVS_TRANS ? 1 : (int)lda, ib = tb == CAVS_TRANS ? (int)ldb : 1;
    if (DBL(c)) cblas_dger(CblasRowMajor, m, n, alpha, a, ia, b, ib, cm, (int)ldc);
    else cblas_sger(CblasRowMajor, m, n, (float)alpha, a, ia, b, ib, cm, (int)ldc);
  } else
    gemm_parts(c, A, B, m, n, k, alpha, a, lda, b, ldb, beta, cm, ldc);
  cavs_backend_stats *st = &c->model->stats;
  st->gemm_seconds += cv_now() - t0;
  st->gemm_flops += 2.0 * m * n * k;
  st->gemm_calls++;
}

/* Products with nothing between them (gemms: a mixture's experts), each whole on one
   thread, the threads taking consecutive runs of the list of about equal flops. Split
   over the pool instead, a product of an expert's 160 rows spent as long waiting for
   the other thread and packing both operands twice (each thread packs all of the
   operand it does not split) as in its kernels (bench/README, "Experts side by
   side"). A product of more than a quarter of a thread's share, and one that is not
   general (a row, an outer product), runs first, alone, as gemm runs it: with fewer
   than four products a thread, the shares are as uneven as the experts' loads (4
   experts of 640 rows took 2% longer side by side). A product's bits are gemm's
   either way: they do not depend on how it is split. */
enum { GEMMS_MAX = 64 };
typedef struct GemmsJob {
  GemmJob g[GEMMS_MAX];
  const cv_gemm *src[GEMMS_MAX]; /* (each product's activation: cv_gemm_act) */
  cavs_ctx *c;
  int n, parts;
  double flops; /* the list's */
} GemmsJob;

/* thread i runs the products that start within its share of the flops, each followed
   by its activation (over its rows, still in this core's cache) */
static void gemms_part(void *arg, int i) {
  GemmsJob *j = arg;
  double run = 0;
  for (int q = 0; q < j->n; q++) {
    const GemmJob *x = &j->g[q];
    int t = (int)(run * j->parts / j->flops);
    if ((t < j->parts ? t : j->parts - 1) == i) {
      gemm_part(&j->g[q], 0);
      cv_gemm_act(j->c, j->src[q]);
    }
    run += 2.0 * x->m * x->n * x->k;
  }
}

static double flops_of(const cv_gemm *g) { return 2.0 * g->m * g->n * g->k; }

static void cpu_gemms(cavs_ctx *c, const cv_gemm *g, int n) {
  cv_pool *pool = pool_of(c);
  int parts = cv_pool_threads(pool);
  for (; n > GEMMS_MAX; g += GEMMS_MAX, n -= GEMMS_MAX) cpu_gemms(c, g, GEMMS_MAX);
  double total = 0;
  for (int i = 0; i < n; i++) total += flops_of(&g[i]);
  bool alone[GEMMS_MAX];
  int together = 0;
  for (int i = 0; i < n; i++) {
    alone[i] = !pool || total < 1e6 || flops_of(&g[i]) > total / parts / 4 ||
               !gemm_general(c, g[i].ta, g[i].tb, g[i].m, g[i].n, g[i].k, g[i].beta);
    if (alone[i]) {
      cpu_gemm(c, g[i].ta, g[i].tb, g[i].m, g[i].n, g[i].k, g[i].alpha, g[i].a, g[i].lda, g[i].b, g[i].ldb, g[i].beta,
               g[i].c, g[i].ldc);
      cv_gemm_act(c, &g[i]);
    } else
      together++;
  }
  if (!together) return;
  double t0 = cv_now(), left = 0;
  GemmsJob j;
  int q = 0;
  for (int i = 0; i < n; i++) {
    if (alone[i]) continue;
    j.src[q] = &g[i];
    j.g[q++] = gemm_job(c, g[i].ta == CAVS_TRANS ? CblasTrans : CblasNoTrans,
                        g[i].tb == CAVS_TRANS ? CblasTrans : CblasNoTrans, g[i].m, g[i].n, g[i].k, g[i].alpha, g[i].a,
                        g[i].lda, g[i].b, g[i].ldb, g[i].beta, g[i].c, g[i].ldc, 1);
    left += flops_of(&g[i]);
    LAUNCH(c, 1);
  }
  j.n = q, j.parts = parts, j.flops = left, j.c = c;
  cv_pool_run(pool, gemms_part, &j, parts);
  cavs_backend_stats *st = &c->model->stats;
  st->gemm_seconds += cv_now() - t0;
  st->gemm_flops += left;
  st->gemm_calls += q;
}

static void zero_rows(cavs_ctx *c, void *y, long ldy, int a, int len, int cols) {
  size_t es = DBL(c) ? 8 : 4;
  LAUNCH(c, len > 0);
  TIMED(c->model, zero_seconds,
        for (int r = a; r < a + len; r++) memset((char *)y + (size_t)r * (size_t)ldy * es, 0, (size_t)cols * es));
}

static void cpu_gemm_rows(cavs_ctx *c, const int *idx, int skip, int r0, int n, int form, int cols, int k,
                          const void *x, long ldx, const void *w, long ldw, void *y, long ldy) {
  /* every run its own product: a zero row costs flops here, a call very little */
  cv_gemm_rows_with(cpu_gemm, zero_rows, c, idx, skip, r0, n, form, cols, k, x, ldx, w, ldw, y, ldy, INT_MAX);
}

static void cpu_gemm_skip(cavs_ctx *c, int skip, int r0, int n, int form, int cols, int k, const void *x, long ldx,
                          const void *w, long ldw, void *y, long ldy) {
  cv_gemm_skip_with(cpu_gemm, zero_rows, c, skip, r0, n, form, cols, k, x, ldx, w, ldw, y, ldy);
}

/* A fused loop in column blocks of 16 (64 bytes of floats), when there is enough of it */
typedef struct LoopJob {
  cavs_ctx *c;
  cavs_cols f;
  int r0, n, parts;
  long width;
} LoopJob;
static void loop_part(void *arg, int i) {
  const LoopJob *l = arg;
  long per = ((l->width + l->parts - 1) / l->parts + 15) & ~15L, j0 = i * per;
  if (j0 < l->width) l->f(l->c, l->r0, l->n, j0, l->width - j0 < per ? l->width : j0 + per);
}
/* CAVS_LOOP_ROWS: in blocks of rows, each thread's rows whole (every pointer of a row
   advances through its own lines, where a column block leaves the other half of each
   line pair to the other thread: on the 2-core Zen 3 a column-split cell loop ran 1.3
   times faster on two threads than on one, a row-split one 1.8) */
static void loop_rows_part(void *arg, int i) {
  const LoopJob *l = arg;
  int per = (l->n + l->parts - 1) / l->parts, a = i * per;
  if (a < l->n) l->f(l->c, l->r0 + a, l->n - a < per ? l->n - a : per, 0, l->width);
}
static void cpu_loop(cavs_ctx *c, cavs_cols f, int r0, int n, long width, int flags) {
  cv_pool *pool = pool_of(c);
  int parts = cv_pool_threads(pool);
  if (n <= 0 || width <= 0) return;
  double t0 = cv_now();
  LoopJob l = {c, f, r0, n, parts, width};
  if (!pool || (flags & CAVS_LOOP_ALONE) || (long)n * width < 16384) f(c, r0, n, 0, width);
  else if ((flags & CAVS_LOOP_ROWS) && n >= parts) cv_pool_run(pool, loop_rows_part, &l, parts);
  else if (width < 32L * parts) f(c, r0, n, 0, width);
  else cv_pool_run(pool, loop_part, &l, parts);
  c->model->stats.loop_seconds += cv_now() - t0;
}

/* The row operations over the pool where there is enough of them (n w cells): those
   that write their own rows split by rows, the scatter-adds (two rows may add to one
   child's or one word's row) by columns in blocks of 16. */
enum { ROW_GATHER_FWD, ROW_GATHER_BWD, ROW_LOOKUP_FWD, ROW_LOOKUP_BWD, ROW_COPY, ROW_SUM };
typedef struct RowJob {
  cavs_ctx *c;
  int op, k, r0, n, parts, add, state;
  bool open; /* ROW_LOOKUP_FWD: the rows without an index left as they are (and with
                 `add`, the others added to) */
  void *dst;
  const void *src;
  long ld, lds, w;
  const int *idx, *first; /* ROW_SUM: idx the rows' slots, first each slot's first row */
} RowJob;

static void row_part(void *arg, int i) {
  const RowJob *q = arg;
  cavs_ctx *c = q->c;
  bool dbl = DBL(c), by_cols = q->op == ROW_GATHER_BWD || q->op == ROW_LOOKUP_BWD || q->op == ROW_SUM;
  long len = by_cols ? q->w : q->n, per = (len + q->parts - 1) / q->parts;
  if (by_cols) per = (per + 15) & ~15L;
  long at = i * per, cnt = len - at < per ? len - at : per;
  if (cnt <= 0) return;
  int r0 = by_cols ? q->r0 : q->r0 + (int)at, n = by_cols ? q->n : (int)cnt;
  switch (q->op) {
  case ROW_GATHER_FWD:
    if (dbl) gather_fwd_d(c, q->k, q->state, q->dst, q->ld, r0, n);
    else gather_fwd_f(c, q->k, q->state, q->dst, q->ld, r0, n);
    break;
  case ROW_GATHER_BWD:
    if (dbl) gather_bwd_d(c, q->k, q->state, q->src, q->ld, r0, n, at, at + cnt);
    else gather_bwd_f(c, q->k, q->state, q->src, q->ld, r0, n, at, at + cnt);
    break;
  case ROW_LOOKUP_FWD: /* src: the table, lds its stride */
    if (q->add && dbl) lookup_add_d(q->src, q->lds, q->idx, q->dst, q->ld, r0, n, q->w);
    else if (q->add) lookup_add_f(q->src, q->lds, q->idx, q->dst, q->ld, r0, n, q->w);
    else if (q->open && dbl) lookup_open_d(q->src, q->lds, q->idx, q->dst, q->ld, r0, n, q->w);
    else if (q->open) lookup_open_f(q->src, q->lds, q->idx, q->dst, q->ld, r0, n, q->w);
    else if (dbl) lookup_fwd_d(q->src, q->lds, q->idx, q->dst, q->ld, r0, n, q->w);
    else lookup_fwd_f(q->src, q->lds, q->idx, q->dst, q->ld, r0, n, q->w);
    break;
  case ROW_LOOKUP_BWD: /* dst: the table's gradient, columns [at, at + cnt) */
    if (dbl) lookup_bwd_d((double *)q->dst + at, q->lds, q->idx, (const double *)q->src + at, q->ld, r0, n, cnt);
    else lookup_bwd_f((float *)q->dst + at, q->lds, q->idx, (const float *)q->src + at, q->ld, r0, n, cnt);
    break;
  case ROW_SUM: /* dst: the slots' rows, lds apart; columns [at, at + cnt) */
    if (dbl)
      sum_rows_d((double *)q->dst + at, q->lds, q->idx, q->first, (const double *)q->src + at, q->ld, r0, n, cnt);
    else sum_rows_f((float *)q->dst + at, q->lds, q->idx, q->first, (const float *)q->src + at, q->ld, r0, n, cnt);
    break;
  case ROW_COPY: { /* rows counted from dst and src */
    size_t d0 = (size_t)at * (size_t)q->ld, s0 = (size_t)at * (size_t)q->lds;
    if (dbl) copy_rows_d((double *)q->dst + d0, q->ld, (const double *)q->src + s0, q->lds, n, q->w, q->add);
    else copy_rows_f((float *)q->dst + d0, q->ld, (const float *)q->src + s0, q->lds, n, q->w, q->add);
    break;
  }
  }
}

static void rows_run(RowJob *q) {
  cv_pool *pool = pool_of(q->c);
  q->parts = cv_pool_threads(pool);
  double t0 = cv_now();
  if (!pool || (long)q->n * q->w < 32768 || q->w < 32) {
    q->parts = 1;
    row_part(q, 0);
  } else
    cv_pool_run(pool, row_part, q, q->parts);
  double t = cv_now() - t0;
  q->c->model->stats.rows_seconds += t;
  if (q->op == ROW_GATHER_FWD || q->op == ROW_GATHER_BWD) q->c->model->stats.gather_seconds += t;
}

static void cpu_gather_fwd(cavs_ctx *c, int k, int state, void *dst, long ld, int r0, int n) {
  LAUNCH(c, n > 0);
  rows_run(&(RowJob){.c = c, .op = ROW_GATHER_FWD, .k = k, .state = state, .dst = dst, .ld = ld, .r0 = r0, .n = n,
                     .w = c->model->bw[state]});
}

static void cpu_gather_bwd(cavs_ctx *c, int k, int state, const void *src, long ld, int r0, int n) {
  LAUNCH(c, n > 0);
  rows_run(&(RowJob){.c = c, .op = ROW_GATHER_BWD, .k = k, .state = state, .src = src, .ld = ld, .r0 = r0, .n = n,
                     .w = c->model->bw[state]});
}

/* Is edge e's child at home there (plan_homes): its loops stored its state in the edge's
   row and read its gradient there? Then echild copies nothing and adds nothing back. */
static inline bool edge_home(const cavs_model *m, int e) { return cv_at_home(m, m->echild[e], cv_edge_key(m, e)); }

/* Children as sets (`children *`): the edges of rows [r0, r0 + n), one thread, in edge
 * order (a sum over a row's edges has the same bits at any thread count). */
#define EDGE_OPS(R, S)                                                                                       \
  static void echild_fwd_##S(cavs_ctx *c, int state, R *dst, long ld, int r0, int n) {                       \
    const R *st = (const R *)c->val[state];                                                                  \
    long w = c->model->bw[state];                                                                            \
    for (int e = c->eoff[r0]; e < c->eoff[r0 + n]; e++)                                                      \
      if (!edge_home(c->model, e))                                                                           \
        memcpy(dst + (size_t)e * (size_t)ld, st + (size_t)c->echild[e] * (size_t)w, sizeof(R) * (size_t)w);  \
  }                                                                                                          \
  static void echild_bwd_##S(cavs_ctx *c, int state, const R *src, long ld, int r0, int n) {                 \
    R *st = (R *)c->grad[state];                                                                             \
    long w = c->model->bw[state];                                                                            \
    for (int e = c->eoff[r0]; e < c->eoff[r0 + n]; e++) {                                                    \
      if (edge_home(c->model, e)) continue;                                                                  \
      R *o = st + (size_t)c->echild[e] * (size_t)w;                                                          \
      const R *s = src + (size_t)e * (size_t)ld;                                                             \
      for (long j = 0; j < w; j++) o[j] += s[j];                                                             \
    }                                                                                                        \
  }                                                                                                          \
  static void ebcast_##S(cavs_ctx *c, R *v, long ldv, R *ev, long lde, long w, int r0, int n, bool bwd) {     \
    for (int r = r0; r < r0 + n; r++)                                                                        \
      for (int e = c->eoff[r]; e < c->eoff[r + 1]; e++) {                                                    \
        R *a = v + (size_t)r * (size_t)ldv, *b = ev + (size_t)e * (size_t)lde;                               \
        if (bwd)                                                                                             \
          for (long j = 0; j < w; j++) a[j] += b[j];                                                         \
        else                                                                                                 \
          memcpy(b, a, sizeof(R) * (size_t)w);                                                               \
      }                                                                                                      \
  }                                                                                                          \
  static void esum_fwd_##S(cavs_ctx *c, const R *src, long lds, R *dst, long ldd, long w, int r0, int n) {   \
    for (int r = r0; r < r0 + n; r++) /* (arith.h's cell: the CUDA kernel's sum too) */                      \
      for (long j = 0; j < w; j++) dst[(size_t)r * (size_t)ldd + (size_t)j] = cv_esum_cell_##S(src, lds, c->eoff, r, j);\
  }                                                                                                          \
  static void esum_bwd_##S(cavs_ctx *c, R *dsrc, long lds, const R *ddst, long ldd, long w, int r0, int n) { \
    for (int r = r0; r < r0 + n; r++)                                                                        \
      for (int e = c->eoff[r]; e < c->eoff[r + 1]; e++)                                                      \
        for (long j = 0; j < w; j++) dsrc[(size_t)e * (size_t)lds + (size_t)j] += ddst[(size_t)r * (size_t)ldd + (size_t)j]; \
  }
EDGE_OPS(float, f)
EDGE_OPS(double, d)
#undef EDGE_OPS

/* dropout: y = x * mask / (1 - p) in training (c->keep), y = x in inference */
#define DROP_OPS(R, S)                                                                                       \
  static void dropout_fwd_##S(cavs_ctx *c, unsigned salt, double p, const R *x, long ldx, R *y, long ldy,    \
                              long w, int r0, int n) {                                                       \
    R scale = (R)(1.0 / (1.0 - p));                                                                          \
    for (int r = r0; r < r0 + n; r++)                                                                        \
      for (long j = 0; j < w; j++) {                                                                         \
        R v = x[(size_t)r * (size_t)ldx + (size_t)j];                                                        \
        y[(size_t)r * (size_t)ldy + (size_t)j] = !c->keep ? v : cavs_drop_keep(c->rkey[r], salt, j, p) ? v * scale : 0; \
      }                                                                                                      \
  }                                                                                                          \
  static void dropout_bwd_##S(cavs_ctx *c, unsigned salt, double p, const R *dy, long ldy, R *dx, long ldx,  \
                              long w, int r0, int n) {                                                       \
    R scale = (R)(1.0 / (1.0 - p));                                                                          \
    for (int r = r0; r < r0 + n; r++)                                                                        \
      for (long j = 0; j < w; j++)                                                                           \
        if (cavs_drop_keep(c->rkey[r], salt, j, p))                                                          \
          dx[(size_t)r * (size_t)ldx + (size_t)j] += dy[(size_t)r * (size_t)ldy + (size_t)j] * scale;        \
  }
DROP_OPS(float, f)
DROP_OPS(double, d)

/* noise: y = x * z in training (c->keep), z a standard normal draw rounded to R first
   (as the cuda kernel does), y = 0 in inference; backward dx += dy * z */
#define NOISE_OPS(R, S)                                                                                      \
  static void noise_fwd_##S(cavs_ctx *c, unsigned salt, const R *x, long ldx, R *y, long ldy, long w, int r0, \
                            int n) {                                                                         \
    for (int r = r0; r < r0 + n; r++)                                                                        \
      for (long j = 0; j < w; j++)                                                                           \
        y[(size_t)r * (size_t)ldy + (size_t)j] =                                                             \
            c->keep ? x[(size_t)r * (size_t)ldx + (size_t)j] * (R)cavs_noise_z(c->rkey[r], salt, j) : (R)0;  \
  }                                                                                                          \
  static void noise_bwd_##S(cavs_ctx *c, unsigned salt, const R *dy, long ldy, R *dx, long ldx, long w, int r0, \
                            int n) {                                                                         \
    for (int r = r0; r < r0 + n; r++)                                                                        \
      for (long j = 0; j < w; j++)                                                                           \
        dx[(size_t)r * (size_t)ldx + (size_t)j] +=                                                           \
            dy[(size_t)r * (size_t)ldy + (size_t)j] * (R)cavs_noise_z(c->rkey[r], salt, j);                  \
  }
NOISE_OPS(float, f)
NOISE_OPS(double, d)
#undef NOISE_OPS
#undef DROP_OPS

#define ROW_OPS_CALL(c, name, ...)                                                                              \
  do {                                                                                                       \
    double t0_ = cv_now();                                                                                   \
    LAUNCH(c, n > 0);                                                                                        \
    if (DBL(c)) name##_d(__VA_ARGS__);                                                                       \
    else name##_f(__VA_ARGS__);                                                                              \
    c->model->stats.rows_seconds += cv_now() - t0_;                                                          \
  } while (0)
/* mv and mm (matrices per vertex). mv: a row's vector times its matrix as loops over
 * the row (a BLAS call a row costs more than the product at a model's sizes); backward,
 * its dot products and outer product. mm: the rows' matrices packed one after another
 * (rm_buf), so that the rows are one product through cpu_gemm, and its gradient. */
#define RMAT_OPS(R, S)                                                                                     \
  static void rowmv_fwd_##S(long a, long b, const R *x, long ldx, const R *m, long ldm, R *y, long ldy,    \
                            int r0, int n) {                                                               \
    for (int r = r0; r < r0 + n; r++) {                                                                    \
      const R *xr = x + (size_t)r * (size_t)ldx, *mr = m + (size_t)r * (size_t)ldm;                        \
      R *yr = y + (size_t)r * (size_t)ldy;                                                                 \
      for (long j = 0; j < b; j++) yr[j] = 0;                                                              \
      for (long i = 0; i < a; i++) {                                                                       \
        const R xi = xr[i], *mi = mr + (size_t)i * (size_t)b;                                              \
        for (long j = 0; j < b; j++) yr[j] += xi * mi[j];                                                  \
      }                                                                                                    \
    }                                                                                                      \
  }                                                                                                        \
  static void rowmv_bwd_##S(long a, long b, const R *x, long ldx, const R *m, long ldm, const R *dy,       \
                            long lddy, R *dx, long lddx, R *dm, long lddm, int r0, int n) {                \
    for (int r = r0; r < r0 + n; r++) {                                                                    \
      const R *xr = x + (size_t)r * (size_t)ldx, *mr = m + (size_t)r * (size_t)ldm;                        \
      const R *g = dy + (size_t)r * (size_t)lddy;                                                          \
      for (long i = 0; i < a && dx; i++) {                                                                 \
        const R *mi = mr + (size_t)i * (size_t)b;                                                          \
        R s = 0;                                                                                           \
        for (long j = 0; j < b; j++) s += g[j] * mi[j];                                                    \
        dx[(size_t)r * (size_t)lddx + (size_t)i] += s;                                                     \
      }                                                                                                    \
      for (long i = 0; i < a && dm; i++) {                                                                 \
        const R xi = xr[i];                                                                                \
        R *di = dm + (size_t)r * (size_t)lddm + (size_t)i * (size_t)b;                                     \
        for (long j = 0; j < b; j++) di[j] += xi * g[j];                                                   \
      }                                                                                                    \
    }                                                                                                      \
  }
RMAT_OPS(float, f)
RMAT_OPS(double, d)
#undef RMAT_OPS

static void cpu_rowmv_fwd(cavs_ctx *c, long a, long b, const void *x, long ldx, const void *m, long ldm, void *y,
                          long ldy, int r0, int n) {
  ROW_OPS_CALL(c, rowmv_fwd, a, b, x, ldx, m, ldm, y, ldy, r0, n);
}
static void cpu_rowmv_bwd(cavs_ctx *c, long a, long b, const void *x, long ldx, const void *m, long ldm, const void *dy,
                          long lddy, void *dx, long lddx, void *dm, long lddm, int r0, int n) {
  ROW_OPS_CALL(c, rowmv_bwd, a, b, x, ldx, m, ldm, dy, lddy, dx, lddx, dm, lddm, r0, n);
}

/* rows [r0, r0 + n) of width w, ld apart, packed into `to` (w apart), or added back */
static void pack_rows(size_t es, char *to, const char *from, long ld, long w, int r0, int n) {
  for (int r = 0; r < n; r++)
    memcpy(to + (size_t)r * (size_t)w * es, from + ((size_t)(r0 + r) * (size_t)ld) * es, (size_t)w * es);
}
#define ADD_ROWS(R)                                                                                        \
  for (int r = 0; r < n; r++)                                                                              \
    for (long j = 0; j < w; j++)                                                                           \
      ((R *)to)[(size_t)(r0 + r) * (size_t)ld + (size_t)j] += ((const R *)from)[(size_t)r * (size_t)w + (size_t)j]
static void add_rows(cavs_ctx *c, char *to, long ld, const char *from, long w, int r0, int n) {
  if (DBL(c)) ADD_ROWS(double);
  else ADD_ROWS(float);
}
#undef ADD_ROWS

/* scratch for mm: `bytes`, or NULL with the failure in the model */
static char *rm_scratch(cavs_ctx *c, size_t bytes) {
  cavs_model *m = c->model;
  if (bytes > m->rm_cap) {
    void *p = realloc(m->rm_buf, bytes);
    if (!p) {
      if (!m->launch_failed) cv_fail_mem(m, "out of memory for mm's packed rows (%zu bytes)", bytes);
      m->launch_failed = true;
      return NULL;
    }
    m->rm_buf = p;
    m->rm_cap = bytes;
  }
  return m->rm_buf;
}

static void cpu_rowmm_fwd(cavs_ctx *c, long a, long b, long cc, const void *m, long ldm, const void *w, long ldw, void *y,
                          long ldy, int r0, int n) {
  size_t es = DBL(c) ? 8 : 4, na = (size_t)n * (size_t)a;
  if (n <= 0) return;
  if (na > INT_MAX / 2 && n > 1) { /* one product's rows fit an int: halves */
    cpu_rowmm_fwd(c, a, b, cc, m, ldm, w, ldw, y, ldy, r0, n / 2);
    cpu_rowmm_fwd(c, a, b, cc, m, ldm, w, ldw, y, ldy, r0 + n / 2, n - n / 2);
    return;
  }
  bool pm = ldm != a * b, py = ldy != a * cc;
  char *buf = rm_scratch(c, (pm ? na * (size_t)b : 0) * es + (py ? na * (size_t)cc : 0) * es + 1);
  if (!buf) return;
  const char *M = pm ? buf : (const char *)m + (size_t)r0 * (size_t)ldm * es;
  char *Y = py ? buf + (pm ? na * (size_t)b * es : 0) : (char *)y + (size_t)r0 * (size_t)ldy * es;
  if (pm) TIMED(c->model, rows_seconds, pack_rows(es, buf, m, ldm, a * b, r0, n));
  cpu_gemm(c, CAVS_NO_TRANS, CAVS_NO_TRANS, (int)na, (int)cc, (int)b, 1, M, b, w, ldw, 0, Y, cc);
  if (py)
    for (int r = 0; r < n; r++)
      memcpy((char *)y + (size_t)(r0 + r) * (size_t)ldy * es, Y + (size_t)r * (size_t)(a * cc) * es,
             (size_t)(a * cc) * es);
}

static void cpu_rowmm_bwd(cavs_ctx *c, long a, long b, long cc, const void *m, long ldm, const void *w, long ldw,
                          const void *dy, long lddy, void *dm, long lddm, void *dw, long lddw, int r0, int n) {
  size_t es = DBL(c) ? 8 : 4, na = (size_t)n * (size_t)a;
  if (n <= 0) return;
  if (na > INT_MAX / 2 && n > 1) {
    cpu_rowmm_bwd(c, a, b, cc, m, ldm, w, ldw, dy, lddy, dm, lddm, dw, lddw, r0, n / 2);
    cpu_rowmm_bwd(c, a, b, cc, m, ldm, w, ldw, dy, lddy, dm, lddm, dw, lddw, r0 + n / 2, n - n / 2);
    return;
  }
  /* packed where the rows are not one after another: M (for dW), dY, and dM's product
     before it is added back */
  bool pm = dw && ldm != a * b, pg = lddy != a * cc, pd = dm && lddm != a * b;
  size_t om = 0, og = om + (pm ? na * (size_t)b : 0), od = og + (pg ? na * (size_t)cc : 0),
         end = od + (pd ? na * (size_t)b : 0);
  char *buf = rm_scratch(c, end * es + 1);
  if (!buf) return;
  const char *M = pm ? buf + om * es : (const char *)m + (size_t)r0 * (size_t)ldm * es;
  const char *G = pg ? buf + og * es : (const char *)dy + (size_t)r0 * (size_t)lddy * es;
  if (pm) TIMED(c->model, rows_seconds, pack_rows(es, buf + om * es, m, ldm, a * b, r0, n));
  if (pg) TIMED(c->model, rows_seconds, pack_rows(es, buf + og * es, dy, lddy, a * cc, r0, n));
  if (dm) {
    /* dM += dY W^T */
    char *D = pd ? buf + od * es : (char *)dm + (size_t)r0 * (size_t)lddm * es;
    cpu_gemm(c, CAVS_NO_TRANS, CAVS_TRANS, (int)na, (int)b, (int)cc, 1, G, cc, w, ldw, pd ? 0 : 1, D, b);
    if (pd) TIMED(c->model, rows_seconds, add_rows(c, dm, lddm, D, a * b, r0, n));
  }
  /* dW += M^T dY, over every row's matrix */
  if (dw) cpu_gemm(c, CAVS_TRANS, CAVS_NO_TRANS, (int)b, (int)cc, (int)na, 1, M, b, G, cc, 1, dw, lddw);
}

static void cpu_dropout_fwd(cavs_ctx *c, unsigned salt, double p, const void *x, long ldx, void *y, long ldy, long w,
                            int r0, int n) {
  ROW_OPS_CALL(c, dropout_fwd, c, salt, p, x, ldx, y, ldy, w, r0, n);
}
static void cpu_noise_fwd(cavs_ctx *c, unsigned salt, const void *x, long ldx, void *y, long ldy, long w, int r0,
                          int n) {
  ROW_OPS_CALL(c, noise_fwd, c, salt, x, ldx, y, ldy, w, r0, n);
}
static void cpu_noise_bwd(cavs_ctx *c, unsigned salt, const void *dy, long ldy, void *dx, long ldx, long w, int r0,
                          int n) {
  ROW_OPS_CALL(c, noise_bwd, c, salt, dy, ldy, dx, ldx, w, r0, n);
}
static void cpu_dropout_bwd(cavs_ctx *c, unsigned salt, double p, const void *dy, long ldy, void *dx, long ldx, long w,
                            int r0, int n) {
  ROW_OPS_CALL(c, dropout_bwd, c, salt, p, dy, ldy, dx, ldx, w, r0, n);
}
static void cpu_echild_fwd(cavs_ctx *c, int state, void *dst, long ld, int r0, int n) {
  ROW_OPS_CALL(c, echild_fwd, c, state, dst, ld, r0, n);
}
static void cpu_echild_bwd(cavs_ctx *c, int state, const void *src, long ld, int r0, int n) {
  ROW_OPS_CALL(c, echild_bwd, c, state, src, ld, r0, n);
}
static void cpu_ebcast_fwd(cavs_ctx *c, const void *src, long lds, void *dst, long ldd, long w, int r0, int n) {
  ROW_OPS_CALL(c, ebcast, c, (void *)src, lds, dst, ldd, w, r0, n, false);
}
static void cpu_ebcast_bwd(cavs_ctx *c, void *dsrc, long lds, const void *ddst, long ldd, long w, int r0, int n) {
  ROW_OPS_CALL(c, ebcast, c, dsrc, lds, (void *)ddst, ldd, w, r0, n, true);
}
static void cpu_esum_fwd(cavs_ctx *c, const void *src, long lds, void *dst, long ldd, long w, int r0, int n) {
  ROW_OPS_CALL(c, esum_fwd, c, src, lds, dst, ldd, w, r0, n);
}
static void cpu_esum_bwd(cavs_ctx *c, void *dsrc, long lds, const void *ddst, long ldd, long w, int r0, int n) {
  ROW_OPS_CALL(c, esum_bwd, c, dsrc, lds, ddst, ldd, w, r0, n);
}

static void cpu_lookup_fwd(cavs_ctx *c, const void *table, long ldt, const int *idx, void *dst, long ld, int r0,
                           int n, long width) {
  LAUNCH(c, n > 0 && width > 0);
  rows_run(&(RowJob){.c = c, .op = ROW_LOOKUP_FWD, .src = table, .lds = ldt, .idx = idx, .dst = dst, .ld = ld,
                     .r0 = r0, .n = n, .w = width});
}

static void cpu_lookup_bwd(cavs_ctx *c, void *dtable, long ldt, const int *idx, const void *src, long ld, int r0,
                           int n, long width) {
  LAUNCH(c, n > 0 && width > 0);
  rows_run(&(RowJob){.c = c, .op = ROW_LOOKUP_BWD, .dst = dtable, .lds = ldt, .idx = idx, .src = src, .ld = ld,
                     .r0 = r0, .n = n, .w = width});
}

static void cpu_copy_rows(cavs_ctx *c, void *dst, long ldd, const void *src, long lds, int n, long w, int add) {
  LAUNCH(c, n > 0 && w > 0);
  rows_run(&(RowJob){.c = c, .op = ROW_COPY, .dst = dst, .ld = ldd, .src = src, .lds = lds, .n = n, .w = w,
                     .add = add});
}

/* ---- Products over distinct looked-up rows (cavs_gemm_table in training) ----
 * x = table[idx[r]]: the rows with one index are one row. So y = x W is computed once
 * an index and copied to its rows; dW += x^T dy is, an index u, x_u^T times the sum of
 * dy over u's rows; and dx += dy W^T, which the lookup's backward adds up by index into
 * the table's gradient, is that sum times W^T, added at u's first row alone (the
 * lookup's backward adds the same; nothing else reads a looked-up row's gradient; a
 * product that sets dx, CAVS_PROD_DX_SET, which no example has, multiplies every
 * row). The
 * sums over an index's rows are in row order, a column's on one thread: the same bits
 * at every thread count. On SST at batch 64 about half of a minibatch's words repeat
 * one before them ("the", ",", "."), so the leaves' three products are halved
 * (bench/README, "Each word multiplied once"). */
enum { DISTINCT_MAX_WORDS = 1 << 26 };

/* room for indices below `words` and rows below `rows` */
static bool distinct_room(Distinct *d, long words, long rows) {
  if (words > d->words) {
    free(d->slot_of);
    d->words = 0;
    if (!(d->slot_of = calloc((size_t)words, sizeof(int)))) return false;
    d->words = words;
  }
  if (rows > d->rows) {
    free(d->slot), free(d->word), free(d->first);
    d->word = d->first = NULL;
    d->rows = 0;
    if (!(d->slot = malloc(sizeof(int) * (size_t)rows)) || !(d->word = malloc(sizeof(int) * (size_t)rows)) ||
        !(d->first = malloc(sizeof(int) * (size_t)rows)))
      return false;
    d->rows = rows;
  }
  return true;
}
static void *distinct_space(void **p, size_t *have, size_t bytes) {
  if (bytes > *have) {
    free(*p);
    *have = 0;
    if (!(*p = aligned_alloc(64, (bytes + 63) & ~(size_t)63))) return NULL;
    *have = bytes;
  }
  return *p;
}

/* Sorts rows [a, b) out by index: their distinct rows in order of first appearance.
   Returns how many, and the rows with an index in *nw; -1 for an index not below
   `words` (the caller then multiplies every row). */
static int distinct_rows(Distinct *d, const int *idx, int a, int b, long words, int *nw) {
  int nu = 0;
  bool bad = false;
  *nw = 0;
  for (int r = a; r < b && !bad; r++) {
    int i = idx[r];
    d->slot[r] = -1;
    if (i < 0) continue;
    if (i >= words) {
      bad = true;
      break;
    }
    ++*nw;
    int u = d->slot_of[i] - 1;
    if (u < 0) {
      u = nu++;
      d->slot_of[i] = u + 1;
      d->word[u] = i;
      d->first[u] = r;
    }
    d->slot[r] = u;
  }
  for (int u = 0; u < nu; u++) d->slot_of[d->word[u]] = 0;
  return bad ? -1 : nu;
}

static bool cpu_gemm_distinct(cavs_ctx *c, const int *idx, int skip, int r0, int n, int form, int cols, int k,
                              long trows, const void *x, long ldx, const void *w, long ldw, void *y, long ldy) {
  Cpu *s = c->model->bs;
  if (!s || form == CAVS_PROD_Y_CLOSE || form == CAVS_PROD_DX_SET || trows <= 0 ||
      trows > DISTINCT_MAX_WORDS || n <= 0 || cols <= 0 || k <= 0)
    return false;
  if (skip > n) skip = n;
  if (skip < 0) skip = 0;
  Distinct *d = &s->distinct;
  int a = r0 + skip, b = r0 + n, nw;
  if (!distinct_room(d, trows, b)) return false;
  double t0 = cv_now();
  int nu = distinct_rows(d, idx, a, b, trows, &nw);
  /* 32 rows with an index, a sixteenth of them repeats, at least: below that the
     copies cost about what the products would save (a tree at batch size 1) */
  if (nu <= 0 || nw < 32 || (nw - nu) * 16 < nw) return false;
  size_t es = DBL(c) ? 8 : 4;
  bool y_form = form == CAVS_PROD_Y || form == CAVS_PROD_Y_INNER || form == CAVS_PROD_Y_OPEN || form == CAVS_PROD_Y_ADD;
  bool dx = form == CAVS_PROD_DX;
  /* xu: nu rows of k (x's distinct rows, or dx's), tu: nu rows of cols (y's, or the sums
     of dy) */
  char *xu = distinct_space(&d->xu, &d->xu_bytes, (size_t)nu * (size_t)k * es);
  char *tu = distinct_space(&d->tu, &d->tu_bytes, (size_t)nu * (size_t)cols * es);
  if (!xu || !tu) return false;
  if (form == CAVS_PROD_Y && skip) zero_rows(c, y, ldy, r0, skip, cols);
  if (!dx)
    for (int u = 0; u < nu; u++)
      memcpy(xu + (size_t)u * (size_t)k * es, (const char *)x + (size_t)d->first[u] * (size_t)ldx * es, (size_t)k * es);
  if (y_form) {
    d->sums = false;
    c->model->stats.rows_seconds += cv_now() - t0;
    cpu_gemm(c, CAVS_NO_TRANS, CAVS_NO_TRANS, nu, cols, k, 1, xu, k, w, ldw, 0, tu, cols);
    /* each row its index's product; a row without one zeros (or, open, nothing; or,
       added to, the product added and the others left) */
    rows_run(&(RowJob){.c = c, .op = ROW_LOOKUP_FWD, .src = tu, .lds = cols, .idx = d->slot, .dst = y, .ld = ldy,
                       .r0 = a, .n = b - a, .w = cols, .open = form == CAVS_PROD_Y_OPEN,
                       .add = form == CAVS_PROD_Y_ADD});
    return true;
  }
  /* the sums of dy (dx's x, the product's y otherwise) over each index's rows, unless
     tu holds them already (dx's product, then dW's) */
  const void *dy = dx ? x : y;
  long lddy = dx ? ldx : ldy;
  c->model->stats.rows_seconds += cv_now() - t0;
  if (!(d->sums && d->sums_of == dy && d->sums_ld == lddy && d->sums_a == a && d->sums_b == b &&
        d->sums_cols == cols && d->sums_idx == idx && d->sums_pass == c->model->pass)) {
    rows_run(&(RowJob){.c = c, .op = ROW_SUM, .dst = tu, .lds = cols, .idx = d->slot, .first = d->first, .src = dy,
                       .ld = lddy, .r0 = a, .n = b - a, .w = cols});
    d->sums = true, d->sums_of = dy, d->sums_ld = lddy, d->sums_idx = idx, d->sums_pass = c->model->pass;
    d->sums_a = a, d->sums_b = b, d->sums_cols = cols;
  }
  if (!dx) {
    cpu_gemm(c, CAVS_TRANS, CAVS_NO_TRANS, k, cols, nu, 1, xu, k, tu, cols, 1, (void *)w, ldw);
    return true;
  }
  cpu_gemm(c, CAVS_NO_TRANS, CAVS_TRANS, nu, k, cols, 1, tu, cols, w, ldw, 0, xu, k);
  t0 = cv_now();
  for (int u = 0; u < nu; u++) {
    char *o = (char *)y + (size_t)d->first[u] * (size_t)ldy * es;
    const char *v = xu + (size_t)u * (size_t)k * es;
    if (DBL(c)) copy_rows_d((double *)o, ldy, (const double *)v, k, 1, k, 1);
    else copy_rows_f((float *)o, ldy, (const float *)v, k, 1, k, 1);
  }
  c->model->stats.rows_seconds += cv_now() - t0;
  return true;
}

/* Softmax cross-entropy over the pool, in chunks of XENT_ROWS rows, whatever the
   threads: a chunk's loss is summed in row order and the chunks' sums in chunk order,
   so the reported loss has the same bits at every thread count (a language model's
   head, as many columns as words, was a third of its epoch on one thread). */
enum { XENT_ROWS = 16 };
typedef struct XentJob {
  cavs_ctx *c;
  int loss, r0, n;
  const void *z;
  void *dz;
  long ld, ldd, w, count;
  const int *label;
  cavs_loss_acc *acc; /* [chunks] (forward) */
} XentJob;
static void xent_part(void *arg, int i) {
  const XentJob *q = arg;
  int r0 = q->r0 + i * XENT_ROWS, n = q->r0 + q->n - r0 < XENT_ROWS ? q->r0 + q->n - r0 : XENT_ROWS;
  if (q->acc) {
    if (DBL(q->c)) xent_fwd_d(q->c, &q->acc[i], q->loss, q->z, q->ld, q->label, r0, n, q->w);
    else xent_fwd_f(q->c, &q->acc[i], q->loss, q->z, q->ld, q->label, r0, n, q->w);
  } else if (DBL(q->c))
    xent_bwd_d(q->c, q->count, q->z, q->ld, q->label, q->dz, q->ldd, r0, n, q->w);
  else
    xent_bwd_f(q->c, q->count, q->z, q->ld, q->label, q->dz, q->ldd, r0, n, q->w);
}
/* the job's chunks on the pool where there is enough work, else in order here */
static void xent_run(XentJob *q) {
  cv_pool *pool = pool_of(q->c);
  int chunks = (q->n + XENT_ROWS - 1) / XENT_ROWS;
  if (pool && chunks > 1 && (long)q->n * q->w >= 32768) cv_pool_run(pool, xent_part, q, chunks);
  else
    for (int i = 0; i < chunks; i++) xent_part(q, i);
}

static void acc_add(cavs_loss_acc *a, const cavs_loss_acc *b) {
  a->sum += b->sum, a->count += b->count, a->correct += b->correct;
  a->root_count += b->root_count, a->root_correct += b->root_correct;
}

static void cpu_xent_fwd(cavs_ctx *c, int loss, const void *z, long ld, const int *label, int r0, int n, long w) {
  LAUNCH(c, n > 0);
  double t0 = cv_now();
  int chunks = (n + XENT_ROWS - 1) / XENT_ROWS;
  cavs_model *m = c->model;
  if (chunks > 1 && chunks > m->capxent) { /* grown only: a pass allocates nothing after the first */
    cavs_loss_acc *a = realloc(m->xent_acc, sizeof *a * (size_t)chunks);
    if (a) m->xent_acc = a, m->capxent = chunks;
  }
  cavs_loss_acc *acc = chunks > 1 && chunks <= m->capxent ? m->xent_acc : NULL;
  if (acc) memset(acc, 0, sizeof *acc * (size_t)chunks);
  XentJob q = {.c = c, .loss = loss, .r0 = r0, .n = n, .z = z, .ld = ld, .w = w, .label = label, .acc = acc};
  if (acc) {
    xent_run(&q);
    for (int i = 0; i < chunks; i++) acc_add(&c->loss[loss], &acc[i]);
  } else /* one chunk, or no memory for the chunks' sums: the same sums, in order */
    for (int i = 0; i < chunks; i++) {
      cavs_loss_acc one = {0};
      int a = r0 + i * XENT_ROWS, k = r0 + n - a < XENT_ROWS ? r0 + n - a : XENT_ROWS;
      if (DBL(c)) xent_fwd_d(c, &one, loss, z, ld, label, a, k, w);
      else xent_fwd_f(c, &one, loss, z, ld, label, a, k, w);
      acc_add(&c->loss[loss], &one);
    }
  c->model->stats.rows_seconds += cv_now() - t0;
}

static void cpu_xent_bwd(cavs_ctx *c, int loss, const void *z, long ld, const int *label, void *dz, long ldd,
                         int r0, int n, long w) {
  LAUNCH(c, n > 0 && c->loss[loss].count);
  XentJob q = {.c = c, .r0 = r0, .n = n, .z = z, .dz = dz, .ld = ld, .ldd = ldd, .w = w, .label = label,
               .count = c->loss[loss].count ? cv_loss_count(c->model, loss) : 0};
  TIMED(c->model, rows_seconds, xent_run(&q));
}

static void cpu_mse_fwd(cavs_ctx *c, int loss, const void *p, long ld, const void *t, long ldt, int r0, int n,
                        long w) {
  LAUNCH(c, n > 0);
  TIMED(c->model, rows_seconds,
        if (DBL(c)) mse_fwd_d(c, loss, p, ld, t, ldt, r0, n, w);
        else mse_fwd_f(c, loss, p, ld, t, ldt, r0, n, w));
}

static void cpu_mse_bwd(cavs_ctx *c, int loss, const void *p, long ld, const void *t, long ldt, void *dp, long ldd,
                        int r0, int n, long w) {
  LAUNCH(c, n > 0 && c->loss[loss].count);
  TIMED(c->model, rows_seconds,
        if (DBL(c)) mse_bwd_d(c, loss, p, ld, t, ldt, dp, ldd, r0, n, w);
        else mse_bwd_f(c, loss, p, ld, t, ldt, dp, ldd, r0, n, w));
}

/* The step's update over the pool, the spans counted end to end in parts of whole
   blocks of 16 values: each value's update reads and writes only its own value,
   gradient and moments (kernels.h, step_range), so every split gives one thread's bits.
   The weight decay and the norm before it (step_begin) run here, in their one order.
   At 2 threads the update ran on one while the other waited: Adam over a mixture's 16
   experts, 2.3 million values a step, is a pass over memory that one core does not
   saturate. */
typedef struct StepJob {
  cavs_model *m;
  const void *k; /* step_k_f or step_k_d */
  const cv_span *sp;
  int ns, parts;
  long total;
} StepJob;
static void step_part(void *arg, int i) {
  const StepJob *q = arg;
  long lo, cnt;
  cv_pool_share(q->total, q->parts, i, 16, &lo, &cnt);
  if (cnt <= 0) return;
  if (q->m->esize == 8) step_range_d(q->m, q->k, q->sp, q->ns, (size_t)lo, (size_t)(lo + cnt));
  else step_range_f(q->m, q->k, q->sp, q->ns, (size_t)lo, (size_t)(lo + cnt));
}
/* Bytes of values (each read with its gradient and moments) below which the step runs on
   the calling thread: a step whose state the caches hold ran slower split. On a 2-core
   Zen 4 (bench/README, "Optimizer steps and slot kernels over the threads") the
   Tree-LSTM's step, 0.86 million values, 14 MB with its gradients and moments, took
   0.24-0.30 s an epoch split against 0.13-0.16 on one thread (timed apart, the other
   thread alone took 2.5 times the caller's time: the values were in the caller's
   caches); a mixture's, 2.27 million values, 36 MB, gained 0.3 s an epoch. */
enum { STEP_SPLIT = 8 << 20 };
static void step_run(cavs_model *m, const cv_hyper *h, const cv_span *sp, int ns) {
  cv_pool *pool = cv_cpu_pool(m);
  step_k_f kf;
  step_k_d kd;
  StepJob q = {.m = m, .sp = sp, .ns = ns, .parts = pool ? cv_pool_threads(pool) : 1};
  if (m->esize == 8) kd = step_begin_d(m, h, sp, ns), q.k = &kd;
  else kf = step_begin_f(m, h, sp, ns), q.k = &kf;
  for (int k = 0; k < ns; k++) q.total += (long)sp[k].len;
  if (q.parts < 2 || q.total * (long)m->esize < STEP_SPLIT) {
    q.parts = 1;
    step_part(&q, 0);
  } else
    cv_pool_run(pool, step_part, &q, q.parts);
}

static int cpu_step(cavs_model *m, const cv_hyper *h, const cv_span *sp, int ns) {
  TIMED(m, step_seconds, step_run(m, h, sp, ns));
  return 0;
}

static long cpu_first_bad(cavs_model *m, const void *p, size_t n) {
  return m->esize == 8 ? first_bad_d(p, n) : first_bad_f(p, n);
}

const cv_backend cv_backend_cpu = {
    .name = "cpu",
    .about = "host memory, OpenBLAS",
    .target = CAVS_TARGET_C,
    .probe = cpu_probe,
    .open = cpu_open,
    .close = cpu_close,
    .alloc = cpu_alloc,
    .alloc_zeroed = cpu_alloc_zeroed,
    .drop = cpu_drop,
    .release = cpu_release,
    .zero = cpu_zero,
    .zero_rows = cpu_zero_rows,
    .upload = cpu_copy,
    .download = cpu_copy,
    .upload2d = cpu_copy2d,
    .schedule = cpu_schedule,
    .synchronize = cpu_synchronize,
    .gemm = cpu_gemm,
    .gemms = cpu_gemms,
    .gemm_rows = cpu_gemm_rows,
    .gemm_distinct = cpu_gemm_distinct,
    .open_rows = true,
    .gemm_skip = cpu_gemm_skip,
    .loop = cpu_loop,
    .gather_fwd = cpu_gather_fwd,
    .gather_bwd = cpu_gather_bwd,
    .lookup_fwd = cpu_lookup_fwd,
    .lookup_bwd = cpu_lookup_bwd,
    .copy_rows = cpu_copy_rows,
    .xent_fwd = cpu_xent_fwd,
    .xent_bwd = cpu_xent_bwd,
    .mse_fwd = cpu_mse_fwd,
    .mse_bwd = cpu_mse_bwd,
    .step = cpu_step,
    .first_bad = cpu_first_bad,
    /* one stream: the plan's steps run in the order issued */
    .stream = NULL,
    .record = NULL,
    .wait = NULL,
    .pass_begin = NULL,
    .pass_end = NULL,
    .echild_fwd = cpu_echild_fwd,
    .echild_bwd = cpu_echild_bwd,
    .ebcast_fwd = cpu_ebcast_fwd,
    .ebcast_bwd = cpu_ebcast_bwd,
    .esum_fwd = cpu_esum_fwd,
    .esum_bwd = cpu_esum_bwd,
    .dropout_fwd = cpu_dropout_fwd,
    .dropout_bwd = cpu_dropout_bwd,
    .noise_fwd = cpu_noise_fwd,
    .noise_bwd = cpu_noise_bwd,
    .rowmv_fwd = cpu_rowmv_fwd,
    .rowmv_bwd = cpu_rowmv_bwd,
    .rowmm_fwd = cpu_rowmm_fwd,
    .rowmm_bwd = cpu_rowmm_bwd,
    .moe = &cv_moe_cpu,
};
