/* backend_cpu.c: the CPU backend: a model's state in host memory (64-byte aligned),
 * the products through OpenBLAS, and the kernels of kernels.h in the model's precision.
 * Its operations are the row of backend.c's registry named "cpu". */
#include "arith.h"
#include "cv.h"
#include "forms.h"

#include <cblas.h>
#include <limits.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cpu_probe(char *msg, size_t len) {
  if (len) *msg = 0;
  return 0;
}

/* OpenBLAS's threads are the process's, not the model's: the last model made sets them. */
static int cpu_open(cavs_model *m, const cavs_model_opts *o) {
  if (o && o->threads > 0) openblas_set_num_threads(o->threads);
  return 0;
}

static void *cpu_alloc(size_t bytes) { return aligned_alloc(64, (bytes + 63) & ~(size_t)63); }
static void cpu_release(void *p) { free(p); }
static void cpu_zero(cavs_model *m, void *p, size_t bytes) { memset(p, 0, bytes); }
static void cpu_copy(void *dst, const void *src, size_t bytes) { memcpy(dst, src, bytes); }
/* Launches are counted where the CUDA backend launches (cavs_backend_stats): the same
   pass counts the same on both. */
#define LAUNCH(c, cond) ((c)->model->stats.launches += (cond) ? 1 : 0)

static int cpu_zero_rows(cavs_model *m, void *base, size_t row, const int *rows, int n) {
  m->stats.launches += n > 0;
  for (int i = 0; i < n; i++) memset((char *)base + (size_t)rows[i] * row, 0, row);
  return 0;
}
static void cpu_close(cavs_model *m) {}
static int cpu_schedule(cavs_model *m) { return 0; }
static int cpu_synchronize(cavs_model *m) { return 0; }

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
  double t0 = now_s();
  /* A single row (one vertex: batch size 1, a tree's top levels, --policy serial) is a
     matrix-vector product, and a single-row parameter gradient an outer product: gemv
     and ger, without the packing gemm does for its blocks (most of an M=1 gemm's time).
     op(A)'s one row, or op(A)'s one column, is read with A's stride where it is not
     contiguous. */
  if (m == 1) {
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
  } else if (DBL(c))
    cblas_dgemm(CblasRowMajor, A, B, m, n, k, alpha, a, (int)lda, b, (int)ldb, beta, cm, (int)ldc);
  else
    cblas_sgemm(CblasRowMajor, A, B, m, n, k, (float)alpha, a, (int)lda, b, (int)ldb, (float)beta, cm,
                (int)ldc);
  cavs_backend_stats *st = &c->model->stats;
  st->gemm_seconds += now_s() - t0;
  st->gemm_flops += 2.0 * m * n * k;
  st->gemm_calls++;
}

static void zero_rows(cavs_ctx *c, void *y, long ldy, int a, int len, int cols) {
  size_t es = DBL(c) ? 8 : 4;
  LAUNCH(c, len > 0);
  for (int r = a; r < a + len; r++) memset((char *)y + (size_t)r * (size_t)ldy * es, 0, (size_t)cols * es);
}

static void cpu_gemm_rows(cavs_ctx *c, const int *idx, int skip, int r0, int n, int form, int cols, int k, const void *x,
                          long ldx, const void *w, long ldw, void *y, long ldy) {
  /* every run its own product: a zero row costs flops here, a call very little */
  cv_gemm_rows_with(cpu_gemm, zero_rows, c, idx, skip, r0, n, form, cols, k, x, ldx, w, ldw, y, ldy, INT_MAX);
}

static void cpu_gemm_skip(cavs_ctx *c, int skip, int r0, int n, int form, int cols, int k, const void *x, long ldx,
                          const void *w, long ldw, void *y, long ldy) {
  cv_gemm_skip_with(cpu_gemm, zero_rows, c, skip, r0, n, form, cols, k, x, ldx, w, ldw, y, ldy);
}

static void cpu_gather_fwd(cavs_ctx *c, int k, void *dst, long ld, int r0, int n) {
  LAUNCH(c, n > 0);
  if (DBL(c)) gather_fwd_d(c, k, dst, ld, r0, n);
  else gather_fwd_f(c, k, dst, ld, r0, n);
}

static void cpu_gather_bwd(cavs_ctx *c, int k, const void *src, long ld, int r0, int n) {
  LAUNCH(c, n > 0);
  if (DBL(c)) gather_bwd_d(c, k, src, ld, r0, n);
  else gather_bwd_f(c, k, src, ld, r0, n);
}

static void cpu_lookup_fwd(cavs_ctx *c, const void *table, long ldt, const int *idx, void *dst, long ld, int r0,
                           int n, long width) {
  LAUNCH(c, n > 0 && width > 0);
  if (DBL(c)) lookup_fwd_d(table, ldt, idx, dst, ld, r0, n, width);
  else lookup_fwd_f(table, ldt, idx, dst, ld, r0, n, width);
}

static void cpu_lookup_bwd(cavs_ctx *c, void *dtable, long ldt, const int *idx, const void *src, long ld, int r0,
                           int n, long width) {
  LAUNCH(c, n > 0 && width > 0);
  if (DBL(c)) lookup_bwd_d(dtable, ldt, idx, src, ld, r0, n, width);
  else lookup_bwd_f(dtable, ldt, idx, src, ld, r0, n, width);
}

static void cpu_copy_rows(cavs_ctx *c, void *dst, long ldd, const void *src, long lds, int n, long w, int add) {
  LAUNCH(c, n > 0 && w > 0);
  if (DBL(c)) copy_rows_d(dst, ldd, src, lds, n, w, add);
  else copy_rows_f(dst, ldd, src, lds, n, w, add);
}

static void cpu_xent_fwd(cavs_ctx *c, int loss, const void *z, long ld, const int *label, int r0, int n, long w) {
  LAUNCH(c, n > 0);
  if (DBL(c)) xent_fwd_d(c, loss, z, ld, label, r0, n, w);
  else xent_fwd_f(c, loss, z, ld, label, r0, n, w);
}

static void cpu_xent_bwd(cavs_ctx *c, int loss, const void *z, long ld, const int *label, void *dz, long ldd,
                         int r0, int n, long w) {
  LAUNCH(c, n > 0 && c->loss[loss].count);
  if (DBL(c)) xent_bwd_d(c, loss, z, ld, label, dz, ldd, r0, n, w);
  else xent_bwd_f(c, loss, z, ld, label, dz, ldd, r0, n, w);
}

static void cpu_mse_fwd(cavs_ctx *c, int loss, const void *p, long ld, const void *t, long ldt, int r0, int n,
                        long w) {
  LAUNCH(c, n > 0);
  if (DBL(c)) mse_fwd_d(c, loss, p, ld, t, ldt, r0, n, w);
  else mse_fwd_f(c, loss, p, ld, t, ldt, r0, n, w);
}

static void cpu_mse_bwd(cavs_ctx *c, int loss, const void *p, long ld, const void *t, long ldt, void *dp, long ldd,
                        int r0, int n, long w) {
  LAUNCH(c, n > 0 && c->loss[loss].count);
  if (DBL(c)) mse_bwd_d(c, loss, p, ld, t, ldt, dp, ldd, r0, n, w);
  else mse_bwd_f(c, loss, p, ld, t, ldt, dp, ldd, r0, n, w);
}

static int cpu_step(cavs_model *m, const cavs_optim *o, const cv_span *sp, int ns, double b1, double b2,
                    double eps) {
  if (m->esize == 8) step_d(m, o, sp, ns, b1, b2, eps);
  else step_f(m, o, sp, ns, b1, b2, eps);
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
    .release = cpu_release,
    .zero = cpu_zero,
    .zero_rows = cpu_zero_rows,
    .upload = cpu_copy,
    .download = cpu_copy,
    .schedule = cpu_schedule,
    .synchronize = cpu_synchronize,
    .gemm = cpu_gemm,
    .gemm_rows = cpu_gemm_rows,
    .gemm_skip = cpu_gemm_skip,
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
};
