/* backend_cpu.c: the CPU backend: matrix products through OpenBLAS, and the row kernels
 * of kernels.h in the model's precision. The entry points are the ones cavs.h declares
 * for generated code (a CUDA backend, not written yet, is to provide the same). */
#include "cv.h"

#include <cblas.h>
#include <stdbool.h>
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

/* Benchmark counters (a model is used by one thread at a time). */
static double gemm_seconds, gemm_flops;

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

void cavs_gemm_counters(double *seconds, double *flops, int reset) {
  if (seconds) *seconds = gemm_seconds;
  if (flops) *flops = gemm_flops;
  if (reset) gemm_seconds = gemm_flops = 0;
}

void cavs_gemm(cavs_ctx *c, int ta, int tb, int m, int n, int k, double alpha, const void *a, long lda,
               const void *b, long ldb, double beta, void *cm, long ldc) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    /* an empty sum: C = beta C */
    for (int i = 0; i < m; i++)
      for (int j = 0; j < n; j++) {
        if (DBL(c)) ((double *)cm)[(size_t)i * ldc + j] *= beta;
        else ((float *)cm)[(size_t)i * ldc + j] *= (float)beta;
      }
    return;
  }
  enum CBLAS_TRANSPOSE A = ta ? CblasTrans : CblasNoTrans, B = tb ? CblasTrans : CblasNoTrans;
  double t0 = now_s();
  if (DBL(c))
    cblas_dgemm(CblasRowMajor, A, B, m, n, k, alpha, a, (int)lda, b, (int)ldb, beta, cm, (int)ldc);
  else
    cblas_sgemm(CblasRowMajor, A, B, m, n, k, (float)alpha, a, (int)lda, b, (int)ldb, (float)beta, cm,
                (int)ldc);
  gemm_seconds += now_s() - t0;
  gemm_flops += 2.0 * m * n * k;
}

void cavs_gemm_rows(cavs_ctx *c, const int *idx, int r0, int n, int form, int cols, int k, const void *x, long ldx,
                    const void *w, long ldw, void *y, long ldy) {
  size_t es = DBL(c) ? 8 : 4;
  for (int r = r0; r < r0 + n;) {
    int a = r;
    bool on = idx[r] >= 0;
    while (r < r0 + n && (idx[r] >= 0) == on) r++;
    int len = r - a;
    const char *xa = (const char *)x + (size_t)a * (size_t)ldx * es;
    char *ya = (char *)y + (size_t)a * (size_t)ldy * es;
    if (!on) {
      if (form == 0)
        for (int i = 0; i < len; i++) memset(ya + (size_t)i * (size_t)ldy * es, 0, (size_t)cols * es);
      continue;
    }
    if (form == 0) cavs_gemm(c, 0, 0, len, cols, k, 1, xa, ldx, w, ldw, 0, ya, ldy);
    else if (form == 1) cavs_gemm(c, 0, 1, len, k, cols, 1, xa, ldx, w, ldw, 1, ya, ldy);
    else cavs_gemm(c, 1, 0, k, cols, len, 1, xa, ldx, ya, ldy, 1, (void *)w, ldw);
  }
}

void cavs_gemm_skip(cavs_ctx *c, int skip, int r0, int n, int form, int cols, int k, const void *x, long ldx,
                    const void *w, long ldw, void *y, long ldy) {
  size_t es = DBL(c) ? 8 : 4;
  if (skip > n) skip = n;
  if (skip < 0) skip = 0;
  if (form == 0)
    for (int r = r0; r < r0 + skip; r++) memset((char *)y + (size_t)r * (size_t)ldy * es, 0, (size_t)cols * es);
  int a = r0 + skip, len = n - skip;
  if (len <= 0) return;
  const char *xa = (const char *)x + (size_t)a * (size_t)ldx * es;
  char *ya = (char *)y + (size_t)a * (size_t)ldy * es;
  if (form == 0) cavs_gemm(c, 0, 0, len, cols, k, 1, xa, ldx, w, ldw, 0, ya, ldy);
  else if (form == 1) cavs_gemm(c, 0, 1, len, k, cols, 1, xa, ldx, w, ldw, 1, ya, ldy);
  else cavs_gemm(c, 1, 0, k, cols, len, 1, xa, ldx, ya, ldy, 1, (void *)w, ldw);
}

void cavs_gather_fwd(cavs_ctx *c, int k, void *dst, long ld, int r0, int n) {
  if (DBL(c)) gather_fwd_d(c, k, dst, ld, r0, n);
  else gather_fwd_f(c, k, dst, ld, r0, n);
}

void cavs_gather_bwd(cavs_ctx *c, int k, const void *src, long ld, int r0, int n) {
  if (DBL(c)) gather_bwd_d(c, k, src, ld, r0, n);
  else gather_bwd_f(c, k, src, ld, r0, n);
}

void cavs_lookup_fwd(cavs_ctx *c, const void *table, long ldt, const int *idx, void *dst, long ld, int r0,
                     int n, long width) {
  if (DBL(c)) lookup_fwd_d(table, ldt, idx, dst, ld, r0, n, width);
  else lookup_fwd_f(table, ldt, idx, dst, ld, r0, n, width);
}

void cavs_lookup_bwd(cavs_ctx *c, void *dtable, long ldt, const int *idx, const void *src, long ld, int r0,
                     int n, long width) {
  if (DBL(c)) lookup_bwd_d(dtable, ldt, idx, src, ld, r0, n, width);
  else lookup_bwd_f(dtable, ldt, idx, src, ld, r0, n, width);
}

void cavs_copy_rows(cavs_ctx *c, void *dst, long ldd, const void *src, long lds, int n, long w, int add) {
  if (DBL(c)) copy_rows_d(dst, ldd, src, lds, n, w, add);
  else copy_rows_f(dst, ldd, src, lds, n, w, add);
}

void cavs_xent_fwd(cavs_ctx *c, int loss, const void *z, long ld, const int *label, int r0, int n, long w) {
  if (DBL(c)) xent_fwd_d(c, loss, z, ld, label, r0, n, w);
  else xent_fwd_f(c, loss, z, ld, label, r0, n, w);
}

void cavs_xent_bwd(cavs_ctx *c, int loss, const void *z, long ld, const int *label, void *dz, long ldd, int r0,
                   int n, long w) {
  if (DBL(c)) xent_bwd_d(c, loss, z, ld, label, dz, ldd, r0, n, w);
  else xent_bwd_f(c, loss, z, ld, label, dz, ldd, r0, n, w);
}

void cavs_mse_fwd(cavs_ctx *c, int loss, const void *p, long ld, const void *t, long ldt, int r0, int n, long w) {
  if (DBL(c)) mse_fwd_d(c, loss, p, ld, t, ldt, r0, n, w);
  else mse_fwd_f(c, loss, p, ld, t, ldt, r0, n, w);
}

void cavs_mse_bwd(cavs_ctx *c, int loss, const void *p, long ld, const void *t, long ldt, void *dp, long ldd,
                  int r0, int n, long w) {
  if (DBL(c)) mse_bwd_d(c, loss, p, ld, t, ldt, dp, ldd, r0, n, w);
  else mse_bwd_f(c, loss, p, ld, t, ldt, dp, ldd, r0, n, w);
}

void cavs_set_threads(int n) { openblas_set_num_threads(n); }
