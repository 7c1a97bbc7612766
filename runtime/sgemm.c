/* sgemm.c: libcavs's own single-precision product for x86-64 processors with AVX-512
 * or AVX2 and FMA, and its products of a few rows, C = alpha op(A) op(B) + beta C,
 * row-major, single-threaded (backend_cpu.c splits a product over its pool and calls
 * this once a block).
 *
 * Why a product of our own: the OpenBLAS of the target distribution (0.3.21) predates
 * the processors it runs on here, so the environment pins its AVX2 kernels; at the
 * Tree-LSTM's shapes those run at half of what the processor's AVX-512 units do
 * (bench/gemms, bench/README). On a processor with AVX2 alone the same loops in AVX2
 * are at par with OpenBLAS's kernels on a product by itself and ahead in an epoch,
 * where a parameter is packed once a pass, C is set rather than cleared and the
 * operands are asked for ahead (a Zen 3, bench/README). libcavs itself is built
 * without -march (it must run anywhere): the functions below are compiled for AVX-512
 * or AVX2 through the target attribute and called only where cv_sgemm_usable() found
 * the instructions at run time.
 *
 * The shape is the usual one (Goto; BLIS): for each KC-deep slice of k, op(B)'s slice is
 * packed into panels NR columns wide, zero-padded; for each MC-row block of C, each
 * MR x NR tile is one call of the micro-kernel, which keeps the tile in 24 registers and
 * adds one rank-1 update per k: MR broadcasts of op(A), NR/16 loads of the panel. op(A)
 * is read where it lies when its rows are contiguous in k (A not transposed, a whole
 * tile of rows) and packed otherwise. A product of a few rows (cv_sgemm_small) packs
 * nothing and reads op(B) in place.
 *
 * Determinism: every element of C is the same sum in the same order wherever it falls:
 * its dot product over each KC slice, k ascending, in one accumulator (fused
 * multiply-adds), then added to C, slices in order. A partial tile is computed by the
 * same kernel over zero-padded operands. So a product split by rows or columns over
 * threads gives the bits of the whole product, as backend_cpu.c promises. */
#include "sgemm.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

/* MR x NR = 6 x 64: 24 accumulators, 4 loads and 6 broadcasts a k. Measured against
   12 x 32, 14 x 32 and 8 x 48 (bench/README): 12 and 14 rows spill registers under
   GCC 12. KC 512: each KC slice reads and writes all of C's block once, and at
   thousands of rows (Tree-FC's lower levels, 8192 x 512 x 1024) C's traffic set the
   pace: 170 GFLOP/s at KC 256, 195-203 at 512, 135 at 128, on a Zen 5 (bench/README,
   "On a Zen 5 EPYC"); at the Tree-LSTM's shapes 512 is at par or ahead. A micro-panel
   of B (512 x 64 floats, 128 KB) is read from the second-level cache. */
enum { MR = 6, NV = 4, NR = 16 * NV, KC = 512, MC = 192, NC = 1024 };

#define AVX512 __attribute__((target("avx512f")))

/* The micro-kernel: c[0..mr) x [0..nr) += alpha * A(0..R, 0..kc) B(0..kc, 0..NR), with
   A(i, p) = a[i * ars + p * acs]; b packed (NR floats a k), or with `direct` read in
   place (B(p, j) = b[p * bs + j], loads masked past nr: zeros, as a packed panel's
   padding); with `ahead`, A's rows lie in place (acs 1) and the next R rows are
   prefetched. R (MR, or a few-rows product's count), `direct` and `ahead` are constants
   in each instance. All R rows of a are readable; rows past mr and columns past nr are
   computed and thrown away. With `set` (a product with beta 0, at its first slice of k)
   the tile is stored as alpha * acc + 0 without reading C: the bits of adding to a
   cleared C, without clearing it first and reading the zeros back. */
AVX512 static inline __attribute__((always_inline)) void
tile(int R, bool direct, bool ahead, int kc, const float *restrict a, long ars, long acs, const float *restrict b,
     long bs, float *restrict c, long ldc, int mr, int nr, float alpha, bool set) {
  __m512 acc[MR][NV];
  __mmask16 mask[NV];
#pragma GCC unroll 8
  for (int v = 0; v < NV; v++) {
    int left = nr - 16 * v;
    mask[v] = left >= 16 ? (__mmask16)0xffff : left <= 0 ? (__mmask16)0 : (__mmask16)((1u << left) - 1);
  }
#pragma GCC unroll 8
  for (int i = 0; i < R; i++)
#pragma GCC unroll 8
    for (int v = 0; v < NV; v++) acc[i][v] = _mm512_setzero_ps();
  /* The tile of C is read once, at the end, after kc steps: asked for now, its lines
     arrive while the tile is computed. With A's rows read in place, the next tile's
     rows are asked for a line at a time as this tile reaches that line. A product whose
     operands are in cache runs as before (bench/gemm.c's shapes); one whose operands
     have left the cache since they were last read paid a stall a line of C and of A:
     a mixture's 16 experts, each expert's matrices and rows read once a pass (its
     epoch 0.88 of the time), and the Tree-LSTM's and Tree-FC's own epochs too (0.87-0.95,
     0.93; bench/README, "Operands asked for ahead"). A prefetch past an array's end does
     not fault. */
#pragma GCC unroll 8
  for (int i = 0; i < R; i++)
    if (i < mr && !set)
#pragma GCC unroll 8
      for (int v = 0; v < NV; v++) _mm_prefetch((const char *)(c + (size_t)i * ldc + 16 * v), _MM_HINT_T0);
  for (int p = 0; p < kc; p++) {
    if (ahead && (p & 15) == 0)
#pragma GCC unroll 8
      for (int i = 0; i < R; i++) _mm_prefetch((const char *)(a + (size_t)(i + R) * ars + p), _MM_HINT_T0);
    __m512 bv[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; v++)
      bv[v] = direct ? _mm512_maskz_loadu_ps(mask[v], b + (size_t)p * bs + 16 * v) : _mm512_load_ps(b + (size_t)p * NR + 16 * v);
#pragma GCC unroll 8
    for (int i = 0; i < R; i++) {
      __m512 ai = _mm512_set1_ps(a[i * ars + p * acs]);
#pragma GCC unroll 8
      for (int v = 0; v < NV; v++) acc[i][v] = _mm512_fmadd_ps(ai, bv[v], acc[i][v]);
    }
  }
  __m512 al = _mm512_set1_ps(alpha);
#pragma GCC unroll 8
  for (int i = 0; i < R; i++) {
    if (i >= mr) break;
#pragma GCC unroll 8
    for (int v = 0; v < NV; v++) {
      float *cp = c + (size_t)i * ldc + 16 * v;
      __m512 old = set ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(mask[v], cp);
      _mm512_mask_storeu_ps(cp, mask[v], _mm512_fmadd_ps(al, acc[i][v], old));
    }
  }
}

/* Two instances the compiler can specialise: rows read in place (k contiguous), and a
   packed panel (MR floats a k). */
AVX512 static void kernel_rows(int kc, const float *a, long lda, const float *b, float *c, long ldc, int mr, int nr,
                               float alpha, bool set) {
  tile(MR, false, true, kc, a, lda, 1, b, NR, c, ldc, mr, nr, alpha, set);
}
AVX512 static void kernel_packed(int kc, const float *a, const float *b, float *c, long ldc, int mr, int nr,
                                 float alpha, bool set) {
  tile(MR, false, false, kc, a, 1, MR, b, NR, c, ldc, mr, nr, alpha, set);
}

/* 16 rows of 16 floats (src[r * ld + j]) to dst[j * dld + r]: a 16 x 16 transpose in
   registers. */
AVX512 static void transpose16(const float *src, long ld, float *dst, long dld) {
  __m512 r[16], t[16];
  for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_ps(src + (size_t)i * ld);
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
    r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
    r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
    r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
  }
  /* r[4q + s] now holds, in each 128-bit lane l, column 4l + s of rows 4q..4q+3 */
  for (int s = 0; s < 4; s++) {
    __m512 a0 = r[s], a1 = r[4 + s], a2 = r[8 + s], a3 = r[12 + s];
    /* lanes (l of a0, l of a1) and (l of a2, l of a3), then interleave */
    __m512 lo01 = _mm512_shuffle_f32x4(a0, a1, 0x44), hi01 = _mm512_shuffle_f32x4(a0, a1, 0xee);
    __m512 lo23 = _mm512_shuffle_f32x4(a2, a3, 0x44), hi23 = _mm512_shuffle_f32x4(a2, a3, 0xee);
    t[s] = _mm512_shuffle_f32x4(lo01, lo23, 0x88);      /* lane 0 of each: column s */
    t[4 + s] = _mm512_shuffle_f32x4(lo01, lo23, 0xdd);  /* lane 1: column 4 + s */
    t[8 + s] = _mm512_shuffle_f32x4(hi01, hi23, 0x88);  /* lane 2: column 8 + s */
    t[12 + s] = _mm512_shuffle_f32x4(hi01, hi23, 0xdd); /* lane 3: column 12 + s */
  }
  for (int j = 0; j < 16; j++) _mm512_storeu_ps(dst + (size_t)j * dld, t[j]);
}

/* One panel of a transposed op(B) (op(B)(p, j) = b[j * ldb + p]), `width` columns of
   which the first w are B's, the rest zeros: blk x blk blocks through the instruction
   set's register transpose, the rest one by one. */
static void pack_bt(const float *b, long ldb, int kc, int w, int width, int blk,
                    void (*transpose)(const float *, long, float *, long), float *dst) {
  int pb = kc / blk * blk;
  for (int jj = 0; jj < width; jj += blk) {
    if (jj + blk <= w)
      for (int p = 0; p < pb; p += blk) transpose(b + (size_t)jj * ldb + p, ldb, dst + (size_t)p * width + jj, width);
    else
      for (int p = 0; p < pb; p++)
        for (int j = jj; j < jj + blk; j++) dst[(size_t)p * width + j] = j < w ? b[(size_t)j * ldb + p] : 0.0f;
  }
  for (int p = pb; p < kc; p++)
    for (int j = 0; j < width; j++) dst[(size_t)p * width + j] = j < w ? b[(size_t)j * ldb + p] : 0.0f;
}

/* op(B)(p, j) for p < kc, j < nc into panels of NR columns, each kc x NR, zero past nc. */
AVX512 static void pack_b(bool tb, const float *b, long ldb, int kc, int nc, float *pb) {
  for (int j0 = 0; j0 < nc; j0 += NR) {
    float *dst = pb + (size_t)j0 * kc;
    int w = nc - j0 < NR ? nc - j0 : NR;
    if (!tb) {
      for (int p = 0; p < kc; p++) {
        const float *src = b + (size_t)p * ldb + j0;
#pragma GCC unroll 8
        for (int v = 0; v < NV; v++) {
          int left = w - 16 * v;
          __mmask16 mk = left >= 16 ? (__mmask16)0xffff : left <= 0 ? (__mmask16)0 : (__mmask16)((1u << left) - 1);
          _mm512_store_ps(dst + (size_t)p * NR + 16 * v, _mm512_maskz_loadu_ps(mk, src + 16 * v));
        }
      }
      continue;
    }
    pack_bt(b + (size_t)j0 * ldb, ldb, kc, w, NR, 16, transpose16, dst);
  }
}

/* op(A)(i, p) for i < mc, p < kc into panels of MR rows, each kc x MR, zero past mc. */
static void pack_a(bool ta, const float *a, long lda, int mc, int kc, float *pa) {
  for (int i0 = 0; i0 < mc; i0 += MR) {
    float *dst = pa + (size_t)i0 * kc;
    int h = mc - i0 < MR ? mc - i0 : MR;
    if (ta && h == MR) { /* a whole panel of a transposed A: MR contiguous floats a k */
      for (int p = 0; p < kc; p++) memcpy(dst + (size_t)p * MR, a + (size_t)p * lda + i0, sizeof(float) * MR);
      continue;
    }
    for (int p = 0; p < kc; p++)
      for (int i = 0; i < MR; i++)
        dst[(size_t)p * MR + i] =
            i < h ? (ta ? a[(size_t)p * lda + i0 + i] : a[(size_t)(i0 + i) * lda + p]) : 0.0f;
  }
}

/* The big product's kernels for one instruction set: its panels' width, op(B)'s packing
   and the two micro-kernels (A's rows in place, A packed MR floats a k). */
typedef struct BigIsa {
  int nr, kc, nc;
  /* with a single block of rows, each panel of op(B) packed right before its tiles read
     it (from the first- or second-level cache), not the whole slice first */
  bool late;
  void (*pack_b)(bool tb, const float *b, long ldb, int kc, int nc, float *pb);
  /* rows_near: for A's rows 4 KB apart or a multiple of it, which share the first-level
     cache's sets (where the next rows asked for ahead evicted the current ones) */
  void (*rows)(int kc, const float *a, long lda, const float *b, float *c, long ldc, int mr, int nr, float alpha,
               bool set);
  void (*rows_near)(int kc, const float *a, long lda, const float *b, float *c, long ldc, int mr, int nr,
                    float alpha, bool set);
  void (*packed)(int kc, const float *a, const float *b, float *c, long ldc, int mr, int nr, float alpha, bool set);
} BigIsa;
static const BigIsa big512 = {NR, KC, NC, false, pack_b, kernel_rows, kernel_rows, kernel_packed};

/* With `pre` (cv_sgemm_pack's layout, npad columns a slice, this product's columns
   starting at its column jo), op(B) is read from there instead of packed here. With
   `set` (beta 0) the first slice of k stores C instead of adding to it. */
static void product(const BigIsa *x, bool ta, bool tb, int m, int n, int k, float alpha, const float *a, long lda,
                    const float *b, long ldb, float *c, long ldc, float *pb, float *pa, const float *pre, long npad,
                    int jo, bool set) {
  for (int j0 = 0; j0 < n; j0 += x->nc) {
    int nc = n - j0 < x->nc ? n - j0 : x->nc;
    for (int p0 = 0; p0 < k; p0 += x->kc) {
      int kc = k - p0 < x->kc ? k - p0 : x->kc;
      const float *bs = pre ? NULL : tb ? b + (size_t)j0 * ldb + p0 : b + (size_t)p0 * ldb + j0;
      bool late = !pre && x->late && m <= MC;
      if (pre) pb = (float *)pre + (size_t)p0 * (size_t)npad + (size_t)(jo + j0) * (size_t)kc;
      else if (!late) x->pack_b(tb, bs, ldb, kc, nc, pb);
      for (int i0 = 0; i0 < m; i0 += MC) {
        int mc = m - i0 < MC ? m - i0 : MC;
        /* op(A)'s block: in place when its rows are k-contiguous, but for a last
           partial tile (its missing rows must read as zeros) */
        const float *ab = ta ? a + (size_t)p0 * lda + i0 : a + (size_t)i0 * lda + p0;
        int whole = ta ? 0 : mc / MR * MR;
        if (whole < mc) pack_a(ta, ab + (ta ? whole : (size_t)whole * lda), lda, mc - whole, kc, pa);
        for (int j = 0; j < nc; j += x->nr) {
          const float *bp = late ? pb : pb + (size_t)j * kc; /* late: one panel's room, reused */
          int nr = nc - j < x->nr ? nc - j : x->nr;
          if (late) x->pack_b(tb, tb ? bs + (size_t)j * ldb : bs + j, ldb, kc, nr, pb);
          for (int i = 0; i < mc; i += MR) {
            float *cp = c + (size_t)(i0 + i) * ldc + j0 + j;
            int mr = mc - i < MR ? mc - i : MR;
            bool first = set && p0 == 0;
            if (i < whole)
              (lda % 1024 ? x->rows : x->rows_near)(kc, ab + (size_t)i * lda, lda, bp, cp, ldc, mr, nr, alpha, first);
            else x->packed(kc, pa + (size_t)(i - whole) * kc, bp, cp, ldc, mr, nr, alpha, first);
          }
        }
      }
    }
  }
}

/* Products of a few rows (a tree's level at batch size 1, a short sentence's step): op(B)
   read where it lies, not packed. Such a product reads each of B's elements once or a
   few times, so packing it (reading it, writing it, reading it again; transposing it for
   a transposed B) cost as much as the product: 18% of a batch-1 Tree-LSTM epoch went to
   pack_b and its transposes (bench/README, Zen 4). */

/* Not transposed: the micro-kernel's tiles of R rows, B read in place. Each element is
   the same sum as in product(): over each KC slice in one accumulator, k ascending, then
   alpha times it added to C. So these are cv_sgemm's bits. */
#define SMALL_NN(R)                                                                                                  \
  AVX512 static void small_nn_##R(int kc, const float *a, long ars, long acs, const float *b, long ldb, float *c,    \
                                  long ldc, int nr, float alpha) {                                                   \
    tile(R, true, false, kc, a, ars, acs, b, ldb, c, ldc, R, nr, alpha, false);                                     \
  }
SMALL_NN(1)
SMALL_NN(2)
SMALL_NN(3)
SMALL_NN(4)
SMALL_NN(5)
SMALL_NN(6)
typedef void SmallNN(int, const float *, long, long, const float *, long, float *, long, int, float);
static SmallNN *const small_nn[MR + 1] = {NULL, small_nn_1, small_nn_2, small_nn_3, small_nn_4, small_nn_5, small_nn_6};

/* Transposed (op(B)(p, j) = b[j * ldb + p], the gradient of a product's input: dX = dY W'):
   C(i, j) is the dot product of A's row i and B's row j, both contiguous. JR rows of B
   at a time against mr rows of A, each pair one accumulator of 16 lanes, k in 16s,
   summed across the lanes at the end. The order of the sum depends on k alone, so a
   split over threads by rows or columns changes no bit; it is not cv_sgemm's order. */
enum { TR = 4, JR = 4 };
AVX512 static inline __attribute__((always_inline)) void
small_nt_tile(int MRC, int k, const float *a, long lda, const float *b, long ldb, float *c, long ldc, int nr,
              float alpha) {
  __m512 acc[TR][JR];
#pragma GCC unroll 8
  for (int i = 0; i < MRC; i++)
#pragma GCC unroll 8
    for (int j = 0; j < JR; j++) acc[i][j] = _mm512_setzero_ps();
  /* rows of B past nr read as B's last row of the tile (in bounds; thrown away) */
  const float *br[JR];
#pragma GCC unroll 8
  for (int j = 0; j < JR; j++) br[j] = b + (size_t)(j < nr ? j : nr - 1) * ldb;
  for (int p = 0; p < k; p += 16) {
    __mmask16 mk = k - p >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (k - p)) - 1);
    __m512 bv[JR];
#pragma GCC unroll 8
    for (int j = 0; j < JR; j++) bv[j] = _mm512_maskz_loadu_ps(mk, br[j] + p);
#pragma GCC unroll 8
    for (int i = 0; i < MRC; i++) {
      __m512 ai = _mm512_maskz_loadu_ps(mk, a + (size_t)i * lda + p);
#pragma GCC unroll 8
      for (int j = 0; j < JR; j++) acc[i][j] = _mm512_fmadd_ps(ai, bv[j], acc[i][j]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MRC; i++)
#pragma GCC unroll 8
    for (int j = 0; j < JR; j++)
      if (j < nr) c[(size_t)i * ldc + j] += alpha * _mm512_reduce_add_ps(acc[i][j]);
}

#define SMALL_NT(R)                                                                                                  \
  AVX512 static void small_nt_##R(int k, const float *a, long lda, const float *b, long ldb, float *c, long ldc,     \
                                  int nr, float alpha) {                                                             \
    small_nt_tile(R, k, a, lda, b, ldb, c, ldc, nr, alpha);                                                          \
  }
SMALL_NT(1)
SMALL_NT(2)
SMALL_NT(3)
SMALL_NT(4)
typedef void SmallNT(int, const float *, long, const float *, long, float *, long, int, float);
static SmallNT *const small_nt[TR + 1] = {NULL, small_nt_1, small_nt_2, small_nt_3, small_nt_4};

static void scale(int m, int n, float beta, float *c, long ldc);

/* The few-rows product in AVX2 with FMA, for processors without AVX-512 (Zen 2 and 3,
   Intel client cores): there OpenBLAS runs every product, and at a few rows it packs
   op(B) (gemm) or reads it at a dot product's pace (gemv), as on Zen 4 before
   cv_sgemm_small. The same sums as small512: not transposed, each element one chain of
   fused multiply-adds over each KC slice, k ascending, then alpha times it added to C
   (so the bits of small512 and of cv_sgemm, where those run); transposed, a dot product
   in 8 lanes, k in steps of 8, summed across the lanes at the end in a fixed order: its
   own order, depending on k alone. Tiles of R2 rows (up to 3) and 32 columns: 12
   accumulators of the 16 registers; transposed, of TR2 = 3 rows of A by JR2 = 4 of B,
   12 accumulators too: 7 loads a 12 multiply-adds where 2 by 4 took 6 a 8 (these
   products read their operands from the second-level cache, whose pace they set: at
   3 to 16 rows times a 512 x 2048 B', 43-48 -> 57-78 GFLOP/s on a Zen 3, `bench/gemms
   few`; bench/README, "Dot products three rows at a time"). Four rows left go as 3 and
   1 (as 2 and 2 they ran at 48 against 57-61). */
#define AVX2 __attribute__((target("avx2,fma")))
enum { R2 = 3, NV2 = 4, NR2 = 8 * NV2, TR2 = 3, JR2 = 4 };

/* lanes [0, left) set */
AVX2 static inline __attribute__((always_inline)) __m256i lanes(int left) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(left), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* c[0..R) x [0..nr) += alpha * A(0..R, 0..kc) B(0..kc, 0..nr), B(p, j) = b[p * bs + j];
   `full`: nr is NR2 and nothing is masked. Lanes past nr load as zeros (a masked load
   does not touch them) and are not stored. */
AVX2 static inline __attribute__((always_inline)) void
tile2(int R, bool full, int kc, const float *restrict a, long ars, long acs, const float *restrict b, long bs,
      float *restrict c, long ldc, int nr, float alpha) {
  __m256 acc[R2][NV2];
  __m256i mask[NV2];
#pragma GCC unroll 8
  for (int v = 0; v < NV2; v++) mask[v] = lanes(nr - 8 * v);
#pragma GCC unroll 8
  for (int i = 0; i < R; i++)
#pragma GCC unroll 8
    for (int v = 0; v < NV2; v++) acc[i][v] = _mm256_setzero_ps();
  for (int p = 0; p < kc; p++) {
    __m256 ai[R2];
#pragma GCC unroll 8
    for (int i = 0; i < R; i++) ai[i] = _mm256_broadcast_ss(a + i * ars + p * acs);
#pragma GCC unroll 8
    for (int v = 0; v < NV2; v++) {
      const float *bp = b + (size_t)p * bs + 8 * v;
      __m256 bv = full ? _mm256_loadu_ps(bp) : _mm256_maskload_ps(bp, mask[v]);
#pragma GCC unroll 8
      for (int i = 0; i < R; i++) acc[i][v] = _mm256_fmadd_ps(ai[i], bv, acc[i][v]);
    }
  }
  __m256 al = _mm256_set1_ps(alpha);
#pragma GCC unroll 8
  for (int i = 0; i < R; i++)
#pragma GCC unroll 8
    for (int v = 0; v < NV2; v++) {
      float *cp = c + (size_t)i * ldc + 8 * v;
      if (full) _mm256_storeu_ps(cp, _mm256_fmadd_ps(al, acc[i][v], _mm256_loadu_ps(cp)));
      else if (nr > 8 * v)
        _mm256_maskstore_ps(cp, mask[v], _mm256_fmadd_ps(al, acc[i][v], _mm256_maskload_ps(cp, mask[v])));
    }
}

#define SMALL2_NN(R)                                                                                                 \
  AVX2 static void small2_nn_##R(int kc, const float *a, long ars, long acs, const float *b, long ldb, float *c,     \
                                 long ldc, int nr, float alpha) {                                                    \
    if (nr == NR2) tile2(R, true, kc, a, ars, acs, b, ldb, c, ldc, nr, alpha);                                       \
    else tile2(R, false, kc, a, ars, acs, b, ldb, c, ldc, nr, alpha);                                                \
  }
SMALL2_NN(1)
SMALL2_NN(2)
SMALL2_NN(3)
static SmallNN *const small2_nn[R2 + 1] = {NULL, small2_nn_1, small2_nn_2, small2_nn_3};

/* The 8 lanes' sum, always in the same order */
AVX2 static inline __attribute__((always_inline)) float lanes_sum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

/* C(i, j) += alpha * dot(A's row i, B's row j) for MRC rows of A and nr (up to JR2)
   rows of B; k's last partial step of 8 through masked loads. */
AVX2 static inline __attribute__((always_inline)) void
small2_nt_tile(int MRC, int k, const float *a, long lda, const float *b, long ldb, float *c, long ldc, int nr,
               float alpha) {
  __m256 acc[TR2][JR2];
#pragma GCC unroll 8
  for (int i = 0; i < MRC; i++)
#pragma GCC unroll 8
    for (int j = 0; j < JR2; j++) acc[i][j] = _mm256_setzero_ps();
  /* rows of B past nr read as B's last row of the tile (in bounds; thrown away) */
  const float *br[JR2];
#pragma GCC unroll 8
  for (int j = 0; j < JR2; j++) br[j] = b + (size_t)(j < nr ? j : nr - 1) * ldb;
  int p = 0;
  for (; p + 8 <= k; p += 8) {
    __m256 ai[TR2];
#pragma GCC unroll 8
    for (int i = 0; i < MRC; i++) ai[i] = _mm256_loadu_ps(a + (size_t)i * lda + p);
#pragma GCC unroll 8
    for (int j = 0; j < JR2; j++) {
      __m256 bv = _mm256_loadu_ps(br[j] + p);
#pragma GCC unroll 8
      for (int i = 0; i < MRC; i++) acc[i][j] = _mm256_fmadd_ps(ai[i], bv, acc[i][j]);
    }
  }
  if (p < k) {
    __m256i mk = lanes(k - p);
    __m256 ai[TR2];
#pragma GCC unroll 8
    for (int i = 0; i < MRC; i++) ai[i] = _mm256_maskload_ps(a + (size_t)i * lda + p, mk);
#pragma GCC unroll 8
    for (int j = 0; j < JR2; j++) {
      __m256 bv = _mm256_maskload_ps(br[j] + p, mk);
#pragma GCC unroll 8
      for (int i = 0; i < MRC; i++) acc[i][j] = _mm256_fmadd_ps(ai[i], bv, acc[i][j]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MRC; i++)
#pragma GCC unroll 8
    for (int j = 0; j < JR2; j++)
      if (j < nr) c[(size_t)i * ldc + j] += alpha * lanes_sum(acc[i][j]);
}

#define SMALL2_NT(R)                                                                                                 \
  AVX2 static void small2_nt_##R(int k, const float *a, long lda, const float *b, long ldb, float *c, long ldc,      \
                                 int nr, float alpha) {                                                              \
    small2_nt_tile(R, k, a, lda, b, ldb, c, ldc, nr, alpha);                                                         \
  }
SMALL2_NT(1)
SMALL2_NT(2)
SMALL2_NT(3)
static SmallNT *const small2_nt[TR2 + 1] = {NULL, small2_nt_1, small2_nt_2, small2_nt_3};

/* The big product in AVX2 with FMA (cv_sgemm where the processor has no AVX-512: Zen 2
   and 3, Intel client cores): product()'s loops over MR x 16 tiles, 12 accumulators of
   the 16 registers, 2 loads of the packed panel and MR broadcasts of op(A) a k. The
   sums are product()'s and the few-rows kernels' (each KC slice in one accumulator, k
   ascending, then alpha times it added to C), so cv_sgemm and cv_sgemm_small give the
   same bits here as well. */
/* The slices 512 deep, as in AVX-512 (so the few-rows kernel gives this product's bits)
   and the blocks as there: on a Zen 3, slices of 256 and 128 and blocks of 256 and 512
   columns or 72 to 288 rows moved nothing at the Tree-LSTM's shapes (bench/README,
   "The big product in AVX2"). */
enum { NV2B = 2, NR2B = 8 * NV2B, KC2 = KC, NC2 = NC };

AVX2 static inline __attribute__((always_inline)) void
tile2b(bool ahead, int kc, const float *restrict a, long ars, long acs, const float *restrict b, float *restrict c,
       long ldc, int mr, int nr, float alpha, bool set) {
  __m256 acc[MR][NV2B];
  __m256i mask[NV2B];
#pragma GCC unroll 8
  for (int v = 0; v < NV2B; v++) mask[v] = lanes(nr - 8 * v);
#pragma GCC unroll 8
  for (int i = 0; i < MR; i++)
#pragma GCC unroll 8
    for (int v = 0; v < NV2B; v++) acc[i][v] = _mm256_setzero_ps();
  /* C's tile and the next tile's rows asked for ahead, as in tile() */
#pragma GCC unroll 8
  for (int i = 0; i < MR; i++)
    if (i < mr && !set) _mm_prefetch((const char *)(c + (size_t)i * ldc), _MM_HINT_T0);
  for (int p = 0; p < kc; p++) {
    if (ahead && (p & 15) == 0)
#pragma GCC unroll 8
      for (int i = 0; i < MR; i++) _mm_prefetch((const char *)(a + (size_t)(i + MR) * ars + p), _MM_HINT_T0);
    __m256 b0 = _mm256_load_ps(b + (size_t)p * NR2B), b1 = _mm256_load_ps(b + (size_t)p * NR2B + 8);
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++) {
      __m256 ai = _mm256_broadcast_ss(a + i * ars + p * acs);
      acc[i][0] = _mm256_fmadd_ps(ai, b0, acc[i][0]);
      acc[i][1] = _mm256_fmadd_ps(ai, b1, acc[i][1]);
    }
  }
  __m256 al = _mm256_set1_ps(alpha);
  bool full = nr >= NR2B;
#pragma GCC unroll 8
  for (int i = 0; i < MR; i++) {
    if (i >= mr) break;
#pragma GCC unroll 8
    for (int v = 0; v < NV2B; v++) {
      float *cp = c + (size_t)i * ldc + 8 * v;
      if (full) {
        __m256 old = set ? _mm256_setzero_ps() : _mm256_loadu_ps(cp);
        _mm256_storeu_ps(cp, _mm256_fmadd_ps(al, acc[i][v], old));
      } else if (nr > 8 * v) {
        __m256 old = set ? _mm256_setzero_ps() : _mm256_maskload_ps(cp, mask[v]);
        _mm256_maskstore_ps(cp, mask[v], _mm256_fmadd_ps(al, acc[i][v], old));
      }
    }
  }
}

AVX2 static void kernel2_rows(int kc, const float *a, long lda, const float *b, float *c, long ldc, int mr, int nr,
                              float alpha, bool set) {
  tile2b(true, kc, a, lda, 1, b, c, ldc, mr, nr, alpha, set);
}
AVX2 static void kernel2_rows_near(int kc, const float *a, long lda, const float *b, float *c, long ldc, int mr,
                                   int nr, float alpha, bool set) {
  tile2b(false, kc, a, lda, 1, b, c, ldc, mr, nr, alpha, set);
}
AVX2 static void kernel2_packed(int kc, const float *a, const float *b, float *c, long ldc, int mr, int nr,
                                float alpha, bool set) {
  tile2b(false, kc, a, 1, MR, b, c, ldc, mr, nr, alpha, set);
}

/* op(B)(p, j) for p < kc, j < nc into panels of 16 columns, each kc x 16, zero past nc;
   transposed, 8 x 8 blocks through registers. */
AVX2 static void transpose8(const float *src, long ld, float *dst, long dld) {
  __m256 r[8], t[8];
  for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_ps(src + (size_t)i * ld);
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    r[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
    r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xee);
    r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xee);
  }
  /* r[q] (q < 4) holds columns q (low lane) and 4 + q (high lane) of rows 0..3; r[4 + q]
     the same of rows 4..7 */
  for (int q = 0; q < 4; q++) {
    _mm256_storeu_ps(dst + (size_t)q * dld, _mm256_permute2f128_ps(r[q], r[4 + q], 0x20));
    _mm256_storeu_ps(dst + (size_t)(4 + q) * dld, _mm256_permute2f128_ps(r[q], r[4 + q], 0x31));
  }
}

AVX2 static void pack2_b(bool tb, const float *b, long ldb, int kc, int nc, float *pb) {
  for (int j0 = 0; j0 < nc; j0 += NR2B) {
    float *dst = pb + (size_t)j0 * kc;
    int w = nc - j0 < NR2B ? nc - j0 : NR2B;
    if (!tb) {
      __m256i m0 = lanes(w), m1 = lanes(w - 8);
      for (int p = 0; p < kc; p++) {
        const float *src = b + (size_t)p * ldb + j0;
        _mm256_store_ps(dst + (size_t)p * NR2B, w >= 8 ? _mm256_loadu_ps(src) : _mm256_maskload_ps(src, m0));
        _mm256_store_ps(dst + (size_t)p * NR2B + 8,
                        w >= 16 ? _mm256_loadu_ps(src + 8) : _mm256_maskload_ps(src + 8, m1));
      }
      continue;
    }
    pack_bt(b + (size_t)j0 * ldb, ldb, kc, w, NR2B, 8, transpose8, dst);
  }
}
static const BigIsa big256 = {NR2B, KC2, NC2, true, pack2_b, kernel2_rows, kernel2_rows_near, kernel2_packed};

/* A few-rows product's kernels and their tiles: rows and columns of a tile not
   transposed (nn[r] computes r rows), rows of A and of B a dot-product tile (nt[r]). */
typedef struct SmallIsa {
  int rows, cols, trows, tcols;
  SmallNN *const *nn;
  SmallNT *const *nt;
} SmallIsa;
static const SmallIsa isa512 = {MR, NR, TR, JR, small_nn, small_nt}, isa256 = {R2, NR2, TR2, JR2, small2_nn, small2_nt};

static int small_run(const SmallIsa *x, bool ta, bool tb, int m, int n, int k, float alpha, const float *a, long lda,
                     const float *b, long ldb, float *c, long ldc) {
  if (tb) {
    /* tcols rows of B (their k floats: 24 KB at the Tree-LSTM's 5H = 1536, four rows)
       stay in the first- or second-level cache while every block of A's rows reads
       them: B streams once */
    for (int j = 0; j < n; j += x->tcols)
      for (int i0 = 0; i0 < m; i0 += x->trows) {
        int mr = m - i0 < x->trows ? m - i0 : x->trows;
        x->nt[mr](k, a + (size_t)i0 * lda, lda, b + (size_t)j * ldb, ldb, c + (size_t)i0 * ldc + j, ldc,
                  n - j < x->tcols ? n - j : x->tcols, alpha);
      }
    return 0;
  }
  long ars = ta ? 1 : lda, acs = ta ? lda : 1;
  /* a KC-deep block of B's columns (128 KB, or 64 in AVX2) stays in cache while every
     block of A's rows reads it: B streams once; the slices in order, as product() adds
     them */
  for (int p0 = 0; p0 < k; p0 += KC) {
    int kc = k - p0 < KC ? k - p0 : KC;
    for (int j = 0; j < n; j += x->cols)
      for (int i0 = 0; i0 < m; i0 += x->rows) {
        int mr = m - i0 < x->rows ? m - i0 : x->rows;
        x->nn[mr](kc, a + (size_t)i0 * ars + (size_t)p0 * acs, ars, acs, b + (size_t)p0 * ldb + j, ldb,
                  c + (size_t)i0 * ldc + j, ldc, n - j < x->cols ? n - j : x->cols, alpha);
      }
  }
  return 0;
}

/* Which instruction set the few-rows product runs in: 2 AVX-512, 1 AVX2 with FMA, 0
   none (or CAVS_GEMM=blas); decided once. CAVS_GEMM=avx2 asks for the AVX2 kernels
   where AVX-512 would run (to measure them, or to test them on such a machine). */
static int small_isa(void) {
  static int isa = -1;
  if (isa < 0) {
    const char *e = getenv("CAVS_GEMM");
    __builtin_cpu_init();
    bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (e && strcmp(e, "blas") == 0) isa = 0;
    else if (__builtin_cpu_supports("avx512f") && !(e && strcmp(e, "avx2") == 0)) isa = 2;
    else isa = avx2 ? 1 : 0;
  }
  return isa;
}

bool cv_sgemm_small_usable(void) { return small_isa() > 0; }

const char *cv_sgemm_small_isa(void) { return small_isa() == 2 ? "avx512" : small_isa() == 1 ? "avx2" : "none"; }

static int small_with(int isa, bool ta, bool tb, int m, int n, int k, float alpha, const float *a, long lda,
                      const float *b, long ldb, float beta, float *c, long ldc) {
  if (m <= 0 || n <= 0) return 0;
  if (m > CV_SGEMM_SMALL_M || (tb && ta) || isa <= 0) return -1;
  scale(m, n, beta, c, ldc);
  if (k <= 0 || alpha == 0.0f) return 0;
  return small_run(isa == 2 ? &isa512 : &isa256, ta, tb, m, n, k, alpha, a, lda, b, ldb, c, ldc);
}

int cv_sgemm_small(bool ta, bool tb, int m, int n, int k, float alpha, const float *a, long lda, const float *b,
                   long ldb, float beta, float *c, long ldc) {
  return small_with(small_isa(), ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

/* 1 where the processor runs AVX2 with FMA, else 0 (none): the forced AVX2 kernels' */
static int avx2_isa(void) {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

int cv_sgemm_small_avx2(bool ta, bool tb, int m, int n, int k, float alpha, const float *a, long lda,
                        const float *b, long ldb, float beta, float *c, long ldc) {
  return small_with(avx2_isa(), ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

/* Which instruction set the big product runs in: 2 AVX-512, 1 AVX2 with FMA, 0 none
   (or CAVS_GEMM=blas); CAVS_GEMM=avx2 asks for AVX2 where AVX-512 would run, as for
   the few-rows product. Decided once. */
static int big_isa(void) {
  static int isa = -1;
  if (isa < 0) isa = small_isa();
  return isa;
}
static const BigIsa *big(void) { return big_isa() == 2 ? &big512 : big_isa() == 1 ? &big256 : NULL; }

bool cv_sgemm_usable(void) { return big_isa() > 0; }

/* Each thread's packing space, kept between products (a product of the Tree-LSTM needs
   up to 2.4 MB with 512-deep slices, which malloc would map and unmap each time) and
   freed when the thread ends. */
static pthread_key_t space_key;
static pthread_once_t space_once = PTHREAD_ONCE_INIT;
static _Thread_local float *space;
static _Thread_local size_t space_floats;
static void space_key_make(void) { (void)pthread_key_create(&space_key, free); }

static float *space_for(size_t floats) {
  if (floats <= space_floats) return space;
  (void)pthread_once(&space_once, space_key_make);
  void *p = NULL;
  if (posix_memalign(&p, 64, floats * sizeof(float))) return NULL;
  free(space);
  space = p;
  space_floats = floats;
  (void)pthread_setspecific(space_key, p);
  return space;
}

/* C = beta C, before the products add to it: 0 sets it (its old NaNs do not count, as in
   BLAS) */
static void scale(int m, int n, float beta, float *c, long ldc) {
  if (beta == 1.0f) return;
  for (int i = 0; i < m; i++) {
    float *row = c + (size_t)i * ldc;
    if (beta == 0.0f) memset(row, 0, sizeof(float) * (size_t)n);
    else
      for (int j = 0; j < n; j++) row[j] *= beta;
  }
}

/* A product of fewer than 16 columns (a classifier's few classes; NARROW_N): the
   tiles above are 64 or 32 columns wide and would compute mostly padding, and the BLAS
   ran the Tree-LSTM's (5 classes) at 14-18 GFLOP/s, 0.1 s of a 3.2 s epoch at 1 thread
   (bench/README, "Products of a few columns, the push block by task"). Both ways below reuse the few-rows
   kernels, which read op(B) in place.
   - A not transposed (logits = h Wc): C(i, j) is the dot product of A's row i and
     op(B)'s column j, so op(B) is laid out as n rows of k (transposed into the thread's
     space unless B is already stored so) and each block of A's rows (4, or 2 in AVX2:
     in the first-level cache) meets all n columns before the next: A streams once.
     The dot products' order depends on k alone.
   - A transposed (dWc = h' dlogits, k the minibatch's rows): C' = op(B)' A is a product
     of n rows, A's rows read in place as the columns, into the thread's space; then C =
     alpha C' + beta C. The few-rows product's order: KC slices, k ascending.
   Either way a split over threads by rows or columns changes no bit. */
enum { NARROW_N = 16 };
static int narrow_with(int isa, bool ta, bool tb, int m, int n, int k, float alpha, const float *a, long lda,
                       const float *b, long ldb, float beta, float *c, long ldc) {
  if (m <= 0 || n <= 0) return 0;
  if (n >= NARROW_N || isa <= 0) return -1;
  const SmallIsa *x = isa == 2 ? &isa512 : &isa256;
  if (k <= 0 || alpha == 0.0f) {
    scale(m, n, beta, c, ldc);
    return 0;
  }
  if (!ta) {
    const float *bt = b;
    long ldt = ldb;
    if (!tb) {
      float *t = space_for((size_t)n * (size_t)k);
      if (!t) return -1;
      for (int p = 0; p < k; p++)
        for (int j = 0; j < n; j++) t[(size_t)j * k + p] = b[(size_t)p * ldb + j];
      bt = t, ldt = k;
    }
    scale(m, n, beta, c, ldc);
    for (int i0 = 0; i0 < m; i0 += x->trows) {
      int mr = m - i0 < x->trows ? m - i0 : x->trows;
      /* the rows two blocks ahead asked for now: read a block at a time, interleaved,
         they left the hardware's prefetcher behind (2460 rows of 256 out of the
         third-level cache, a minibatch's h Wc: 130-270 us, 85-100 with this, Zen 5) */
      for (int r = i0 + 2 * x->trows; r < i0 + 3 * x->trows && r < m; r++)
        for (int o = 0; o < k; o += 16) __builtin_prefetch(a + (size_t)r * lda + o);
      for (int j = 0; j < n; j += x->tcols)
        x->nt[mr](k, a + (size_t)i0 * lda, lda, bt + (size_t)j * ldt, ldt, c + (size_t)i0 * ldc + j, ldc,
                  n - j < x->tcols ? n - j : x->tcols, alpha);
    }
    return 0;
  }
  /* C'(j, i) = sum_p op(B)(p, j) A(p, i): op(B)' is B itself when B is transposed */
  float *t = space_for((size_t)n * (size_t)m);
  if (!t) return -1;
  memset(t, 0, sizeof(float) * (size_t)n * (size_t)m);
  small_run(x, !tb, false, n, m, k, 1.0f, b, ldb, a, lda, t, m);
  for (int i = 0; i < m; i++) {
    float *row = c + (size_t)i * ldc;
    for (int j = 0; j < n; j++)
      row[j] = beta == 0.0f ? alpha * t[(size_t)j * m + i] : alpha * t[(size_t)j * m + i] + beta * row[j];
  }
  return 0;
}

int cv_sgemm_narrow(bool ta, bool tb, int m, int n, int k, float alpha, const float *a, long lda, const float *b,
                    long ldb, float beta, float *c, long ldc) {
  return narrow_with(small_isa(), ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

int cv_sgemm_narrow_avx2(bool ta, bool tb, int m, int n, int k, float alpha, const float *a, long lda,
                         const float *b, long ldb, float beta, float *c, long ldc) {
  return narrow_with(avx2_isa(), ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

static int sgemm_with(const BigIsa *x, bool ta, bool tb, int m, int n, int k, float alpha, const float *a, long lda,
                      const float *b, long ldb, float beta, float *c, long ldc) {
  if (m <= 0 || n <= 0) return 0;
  if (!x) return -1;
  int nc = n < x->nc ? n : x->nc, kc = k < x->kc ? k : x->kc, mc = m < MC ? m : MC;
  size_t nb = (size_t)((nc + x->nr - 1) / x->nr * x->nr) * (size_t)kc;
  size_t na = (size_t)((mc + MR - 1) / MR * MR) * (size_t)kc;
  float *pb = k > 0 && alpha != 0.0f ? space_for(nb + na) : NULL;
  if (k > 0 && alpha != 0.0f && !pb) return -1;
  /* a product that runs sets C itself at its first slice (a cleared C read back from
     memory cost the Tree-LSTM 1.3 GB of stores and as many loads an epoch) */
  if (!pb || beta != 0.0f) scale(m, n, beta, c, ldc);
  if (pb) product(x, ta, tb, m, n, k, alpha, a, lda, b, ldb, c, ldc, pb, pb + nb, NULL, 0, 0, beta == 0.0f);
  return 0;
}

/* A whole op(B) packed once: for each KC-deep slice, its panels side by side, the
   columns padded to a multiple of the panels' width: the panels product() packs for
   each block, at the offsets it would read them from. */
static size_t floats_with(const BigIsa *x, int n, int k) {
  if (!x) return 0;
  return (size_t)((n + x->nr - 1) / x->nr * x->nr) * (size_t)(k > 0 ? k : 0);
}

static void pack_with(const BigIsa *x, bool tb, int n, int k, const float *b, long ldb, float *packed) {
  if (!x) return;
  long npad = (n + x->nr - 1) / x->nr * x->nr;
  for (int p0 = 0; p0 < k; p0 += x->kc) {
    int kc = k - p0 < x->kc ? k - p0 : x->kc;
    x->pack_b(tb, tb ? b + p0 : b + (size_t)p0 * ldb, ldb, kc, n, packed + (size_t)p0 * (size_t)npad);
  }
}

static int packed_with(const BigIsa *x, bool ta, int m, int n, int k, float alpha, const float *a, long lda,
                       const float *packed, int ncols, int jo, float beta, float *c, long ldc) {
  if (m <= 0 || n <= 0) return 0;
  if (!x || jo % x->nr || jo + n > ncols) return -1;
  int mc = m < MC ? m : MC, kc = k < x->kc ? k : x->kc;
  size_t na = (size_t)((mc + MR - 1) / MR * MR) * (size_t)kc;
  float *pa = k > 0 && alpha != 0.0f ? space_for(na) : NULL;
  if (k > 0 && alpha != 0.0f && !pa) return -1;
  if (!pa || beta != 0.0f) scale(m, n, beta, c, ldc);
  long npad = (ncols + x->nr - 1) / x->nr * x->nr;
  if (pa) product(x, ta, false, m, n, k, alpha, a, lda, NULL, 0, c, ldc, NULL, pa, packed, npad, jo, beta == 0.0f);
  return 0;
}

int cv_sgemm(bool ta, bool tb, int m, int n, int k, float alpha, const float *a, long lda, const float *b, long ldb,
             float beta, float *c, long ldc) {
  return sgemm_with(big(), ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
size_t cv_sgemm_packed_floats(int n, int k) { return floats_with(big(), n, k); }
void cv_sgemm_pack(bool tb, int n, int k, const float *b, long ldb, float *packed) {
  pack_with(big(), tb, n, k, b, ldb, packed);
}
int cv_sgemm_packed(bool ta, int m, int n, int k, float alpha, const float *a, long lda, const float *packed,
                    int ncols, int jo, float beta, float *c, long ldc) {
  return packed_with(big(), ta, m, n, k, alpha, a, lda, packed, ncols, jo, beta, c, ldc);
}

/* The same in AVX2 whatever the processor has beyond it (for tests) */
static const BigIsa *big_avx2(void) { return avx2_isa() ? &big256 : NULL; }
int cv_sgemm_avx2(bool ta, bool tb, int m, int n, int k, float alpha, const float *a, long lda, const float *b,
                  long ldb, float beta, float *c, long ldc) {
  return sgemm_with(big_avx2(), ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
size_t cv_sgemm_packed_floats_avx2(int n, int k) { return floats_with(big_avx2(), n, k); }
void cv_sgemm_pack_avx2(bool tb, int n, int k, const float *b, long ldb, float *packed) {
  pack_with(big_avx2(), tb, n, k, b, ldb, packed);
}
int cv_sgemm_packed_avx2(bool ta, int m, int n, int k, float alpha, const float *a, long lda, const float *packed,
                         int ncols, int jo, float beta, float *c, long ldc) {
  return packed_with(big_avx2(), ta, m, n, k, alpha, a, lda, packed, ncols, jo, beta, c, ldc);
}

#else /* not x86-64 with GCC or clang: never used */
bool cv_sgemm_usable(void) { return false; }
size_t cv_sgemm_packed_floats(int n, int k) { return 0; }
void cv_sgemm_pack(bool tb, int n, int k, const float *b, long ldb, float *packed) {}
int cv_sgemm_packed(bool ta, int m, int n, int k, float alpha, const float *a, long lda, const float *packed,
                    int ncols, int jo, float beta, float *c, long ldc) {
  return -1;
}
int cv_sgemm(bool ta, bool tb, int m, int n, int k, float alpha, const float *a, long lda, const float *b, long ldb,
             float beta, float *c, long ldc) {
  return -1;
}
int cv_sgemm_small(bool ta, bool tb, int m, int n, int k, float alpha, const float *a, long lda, const float *b,
                   long ldb, float beta, float *c, long ldc) {
  return -1;
}
int cv_sgemm_small_avx2(bool ta, bool tb, int m, int n, int k, float alpha, const float *a, long lda,
                        const float *b, long ldb, float beta, float *c, long ldc) {
  return -1;
}
int cv_sgemm_narrow(bool ta, bool tb, int m, int n, int k, float alpha, const float *a, long lda, const float *b,
                    long ldb, float beta, float *c, long ldc) {
  return -1;
}
int cv_sgemm_narrow_avx2(bool ta, bool tb, int m, int n, int k, float alpha, const float *a, long lda,
                         const float *b, long ldb, float beta, float *c, long ldc) {
  return -1;
}
int cv_sgemm_avx2(bool ta, bool tb, int m, int n, int k, float alpha, const float *a, long lda, const float *b,
                  long ldb, float beta, float *c, long ldc) {
  return -1;
}
size_t cv_sgemm_packed_floats_avx2(int n, int k) { return 0; }
void cv_sgemm_pack_avx2(bool tb, int n, int k, const float *b, long ldb, float *packed) {}
int cv_sgemm_packed_avx2(bool ta, int m, int n, int k, float alpha, const float *a, long lda, const float *packed,
                         int ncols, int jo, float beta, float *c, long ldc) {
  return -1;
}
bool cv_sgemm_small_usable(void) { return false; }
const char *cv_sgemm_small_isa(void) { return "none"; }
#endif
