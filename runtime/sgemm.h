/* sgemm.h: libcavs's own single-precision product (sgemm.c), for processors with
 * AVX-512: C = alpha op(A) op(B) + beta C, row-major, one thread. */
#ifndef CAVS_SGEMM_H
#define CAVS_SGEMM_H
#include <stdbool.h>

/* Whether this process can use cv_sgemm: the processor has AVX-512F and the
   environment does not ask for the BLAS (CAVS_GEMM=blas). Decided once. */
bool cv_sgemm_usable(void);
/* 0, or -1 when out of memory (C untouched then only if beta is 1). */
int cv_sgemm(bool ta, bool tb, int m, int n, int k, float alpha, const float *a, long lda, const float *b, long ldb,
             float beta, float *c, long ldc);
#endif
