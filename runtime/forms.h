/* forms.h: the product forms of cavs_abi.h (enum cavs_prod_form) over the runs of rows
 * that have a left operand, written once for every backend: a backend gives its own
 * plain product and its own way to zero a block of rows. Static inline, so a backend
 * built as a module (which cannot call libcavs's internals) has them too. */
#ifndef CV_FORMS_H
#define CV_FORMS_H

#include "cavs_abi.h"

#include <limits.h>
#include <stdbool.h>

typedef void (*cv_gemm_fn)(cavs_ctx *c, int ta, int tb, int m, int n, int k, double alpha, const void *a, long lda,
                           const void *b, long ldb, double beta, void *cm, long ldc);
/* rows [a, a + len) of y, cols columns each, to zero */
typedef void (*cv_zero_rows_fn)(cavs_ctx *c, void *y, long ldy, int a, int len, int cols);

/* One product of a form over rows [a, a + len); x and y point to row 0. */
static inline void cv_form_gemm(cv_gemm_fn gemm, cavs_ctx *c, int form, int a, int len, int cols, int k,
                                const void *x, long ldx, const void *w, long ldw, void *y, long ldy) {
  size_t es = c->desc->precision == CAVS_DOUBLE ? 8 : 4;
  const char *xa = (const char *)x + (size_t)a * (size_t)ldx * es;
  char *ya = (char *)y + (size_t)a * (size_t)ldy * es;
  if (form == CAVS_PROD_Y || form == CAVS_PROD_Y_INNER || form == CAVS_PROD_Y_ADD || form == CAVS_PROD_Y_OPEN)
    gemm(c, CAVS_NO_TRANS, CAVS_NO_TRANS, len, cols, k, 1, xa, ldx, w, ldw, form == CAVS_PROD_Y_ADD, ya, ldy);
  else if (form == CAVS_PROD_DX || form == CAVS_PROD_DX_SET)
    gemm(c, CAVS_NO_TRANS, CAVS_TRANS, len, k, cols, 1, xa, ldx, w, ldw, form == CAVS_PROD_DX, ya, ldy);
  else gemm(c, CAVS_TRANS, CAVS_NO_TRANS, k, cols, len, 1, xa, ldx, ya, ldy, 1, (void *)w, ldw);
}

/* CAVS_PROD_Y_CLOSE (cavs_abi.h): the rows a CAVS_PROD_Y_OPEN product left without an
 * index written, by runs: those past `skip` set (beta 0) where the index is < 0 and
 * added to where it is not, those of the first `skip` without an index zeroed. Past
 * `max_runs` runs, the rows without an index zeroed and one product adding over all
 * rows past `skip` (the same sums). */
static inline void cv_gemm_close_with(cv_gemm_fn gemm, cv_zero_rows_fn zero, cavs_ctx *c, const int *idx, int skip,
                                      int r0, int n, int cols, int k, const void *x, long ldx, const void *w,
                                      long ldw, void *y, long ldy, int max_runs) {
  for (int r = r0; r < r0 + skip;) {
    int a = r;
    bool on = idx[r] >= 0;
    while (r < r0 + skip && (idx[r] >= 0) == on) r++;
    if (!on) zero(c, y, ldy, a, r - a, cols);
  }
  int runs = 0, b0 = r0 + skip, b1 = r0 + n;
  for (int r = b0; r < b1 && runs <= max_runs; r++) runs += r == b0 || (idx[r] >= 0) != (idx[r - 1] >= 0);
  for (int r = b0; r < b1;) {
    int a = r;
    bool on = idx[r] >= 0;
    while (r < b1 && (idx[r] >= 0) == on) r++;
    if (runs > max_runs && !on) zero(c, y, ldy, a, r - a, cols);
    else if (runs <= max_runs)
      cv_form_gemm(gemm, c, on ? CAVS_PROD_Y_ADD : CAVS_PROD_Y, a, r - a, cols, k, x, ldx, w, ldw, y, ldy);
  }
  if (runs > max_runs) cv_form_gemm(gemm, c, CAVS_PROD_Y_ADD, b0, b1 - b0, cols, k, x, ldx, w, ldw, y, ldy);
}

/* cavs_gemm_rows: the runs of rows past the first `skip` whose index (in host memory)
 * is >= 0; past `max_runs` such runs, one product over all those rows instead: the left
 * operand is zero where there is no index, so that is the same product (the same sums,
 * with zeros added) in fewer calls, which a device whose launches cost more than its
 * flops prefers. */
static inline void cv_gemm_rows_with(cv_gemm_fn gemm, cv_zero_rows_fn zero, cavs_ctx *c, const int *idx, int skip,
                                     int r0, int n, int form, int cols, int k, const void *x, long ldx, const void *w,
                                     long ldw, void *y, long ldy, int max_runs) {
  if (skip > n) skip = n;
  if (skip < 0) skip = 0;
  if (form == CAVS_PROD_Y_CLOSE) {
    cv_gemm_close_with(gemm, zero, c, idx, skip, r0, n, cols, k, x, ldx, w, ldw, y, ldy, max_runs);
    return;
  }
  if (form == CAVS_PROD_Y && skip) zero(c, y, ldy, r0, skip, cols);
  r0 += skip;
  n -= skip;
  int runs = 0;
  for (int r = r0; r < r0 + n && runs <= max_runs; r++) runs += idx[r] >= 0 && (r == r0 || idx[r - 1] < 0);
  if (runs > max_runs) {
    cv_form_gemm(gemm, c, form, r0, n, cols, k, x, ldx, w, ldw, y, ldy);
    return;
  }
  for (int r = r0; r < r0 + n;) {
    int a = r;
    bool on = idx[r] >= 0;
    while (r < r0 + n && (idx[r] >= 0) == on) r++;
    if (on) cv_form_gemm(gemm, c, form, a, r - a, cols, k, x, ldx, w, ldw, y, ldy);
    else if (form == CAVS_PROD_Y || form == CAVS_PROD_Y_INNER) zero(c, y, ldy, a, r - a, cols);
  }
}

/* mm (cavs_rowmm_*) over n rows whose matrices of `a` values (ld lda apart) lie one
 * after another, and likewise the other operand's `b` (ldb): one product of n times the
 * rows, when that fits an int. */
static inline bool cv_rows_stacked(long a, long lda, long b, long ldb, int n) {
  return lda == a && ldb == b && (long)n * a <= INT_MAX / 2;
}

/* cavs_gemm_skip: all rows but the first `skip`. */
static inline void cv_gemm_skip_with(cv_gemm_fn gemm, cv_zero_rows_fn zero, cavs_ctx *c, int skip, int r0, int n,
                                     int form, int cols, int k, const void *x, long ldx, const void *w, long ldw,
                                     void *y, long ldy) {
  if (skip > n) skip = n;
  if (skip < 0) skip = 0;
  if (form == CAVS_PROD_Y && skip) zero(c, y, ldy, r0, skip, cols);
  if (n - skip > 0) cv_form_gemm(gemm, c, form, r0 + skip, n - skip, cols, k, x, ldx, w, ldw, y, ldy);
}

#endif
