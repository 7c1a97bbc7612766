/* sgemm.h: libcavs's own single-precision product (sgemm.c), for processors with
 * AVX-512 or AVX2 and FMA, and its few-rows product: C = alpha op(A) op(B) + beta C,
 * row-major, one thread. */
#ifndef CAVS_SGEMM_H
#define CAVS_SGEMM_H
#include <stdbool.h>
#include <stddef.h>

/* Whether this process can use cv_sgemm: the processor has AVX-512F, or AVX2 and FMA,
   and the environment does not ask for the BLAS (CAVS_GEMM=blas). It runs in AVX-512
   where the processor has it and CAVS_GEMM is not avx2, else in AVX2 (the instruction
   set cv_sgemm_small_isa names). Decided once. */
bool cv_sgemm_usable(void);
/* 0, or -1 when out of memory (C untouched then only if beta is 1). */
int cv_sgemm(bool ta, bool tb, int m, int n, int k, float alpha, const float *a, long lda, const float *b, long ldb,
             float beta, float *c, long ldc);
/* op(B) (k x n) packed once, for many products that share it (a parameter within a
   pass): the floats it needs, and the packing. */
size_t cv_sgemm_packed_floats(int n, int k);
void cv_sgemm_pack(bool tb, int n, int k, const float *b, long ldb, float *packed);
/* cv_sgemm's product over columns [jo, jo + n) of a packed op(B) of ncols columns (jo
   a multiple of 64: the panels are 64 columns wide in AVX-512, 16 in AVX2): the same
   bits as cv_sgemm over those columns. -1 when out of memory or jo is not a panel's
   start. */
int cv_sgemm_packed(bool ta, int m, int n, int k, float alpha, const float *a, long lda, const float *packed,
                    int ncols, int jo, float beta, float *c, long ldc);
/* A product of at most CV_SGEMM_SMALL_M rows with op(B) read where it lies, not packed
   (packing costs as much as such a product). Not transposed, cv_sgemm's bits; with B
   transposed, a dot product a row (its own order, the same however the product is
   split by rows or columns). -1 for more rows, both operands transposed, or a
   processor with neither AVX-512 nor AVX2 and FMA (or CAVS_GEMM=blas). In AVX-512
   where the processor has it (and CAVS_GEMM is not avx2), else in AVX2; the two give
   the same bits not transposed (and the transposed sums differ between them). */
#define CV_SGEMM_SMALL_M 16
int cv_sgemm_small(bool ta, bool tb, int m, int n, int k, float alpha, const float *a, long lda, const float *b,
                   long ldb, float beta, float *c, long ldc);
/* Whether cv_sgemm_small runs here, and in which instruction set ("avx512", "avx2",
   "none"). */
bool cv_sgemm_small_usable(void);
const char *cv_sgemm_small_isa(void);
/* A product of fewer than 16 columns (a classifier's few classes), any number of rows,
   in the few-rows kernels' instruction set: A not transposed, a dot product a row and
   column (the order depending on k alone); A transposed, the few-rows product's order.
   Either way the same bits however the product is split by rows or columns. -1 for 16
   columns or more, where cv_sgemm_small does not run, or out of memory (C untouched
   then). */
int cv_sgemm_narrow(bool ta, bool tb, int m, int n, int k, float alpha, const float *a, long lda, const float *b,
                    long ldb, float beta, float *c, long ldc);
/* cv_sgemm_narrow in AVX2 whatever the processor has beyond it (for tests); -1 without
   AVX2 and FMA. */
int cv_sgemm_narrow_avx2(bool ta, bool tb, int m, int n, int k, float alpha, const float *a, long lda,
                         const float *b, long ldb, float beta, float *c, long ldc);
/* cv_sgemm_small's AVX2 version whatever the processor has beyond it (for tests); -1
   without AVX2 and FMA. */
int cv_sgemm_small_avx2(bool ta, bool tb, int m, int n, int k, float alpha, const float *a, long lda,
                        const float *b, long ldb, float beta, float *c, long ldc);
/* cv_sgemm and its packed forms in AVX2 whatever the processor has beyond it (for
   tests); -1 (0 floats) without AVX2 and FMA. */
int cv_sgemm_avx2(bool ta, bool tb, int m, int n, int k, float alpha, const float *a, long lda, const float *b,
                  long ldb, float beta, float *c, long ldc);
size_t cv_sgemm_packed_floats_avx2(int n, int k);
void cv_sgemm_pack_avx2(bool tb, int n, int k, const float *b, long ldb, float *packed);
int cv_sgemm_packed_avx2(bool ta, int m, int n, int k, float alpha, const float *a, long lda, const float *packed,
                         int ncols, int jo, float beta, float *c, long ldc);
#endif
