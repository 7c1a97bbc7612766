/* check_math.c: the elementwise functions of cavs_abi.h that the fused loops call, against
 * libm, over the whole float range and at its edges: NaN, infinities, results that
 * overflow or underflow (subnormal, then zero), and arguments near zero. Each value is
 * checked called alone and from a loop the compiler vectorizes, as generated code does.
 * Also the index arithmetic of the kernels of a GPU (the CUDA target's, which row and
 * column each thread computes; the CUDA backend's, which optimizer span an element is
 * in), run on the CPU over whole grids. And libcavs's own single-precision product
 * (sgemm.c) against sums in double, and split as the CPU backend splits it. */
#include <float.h>
#include <stdint.h>

#include "arith.h"
#include "cavs.h"
#include "forms.h"
#include "pool.h"
#include "sgemm.h"
#include "testutil.h"

#include <stdatomic.h>
#include <unistd.h>

enum { N = 1 << 16 };
static float in[N], out[N];

/* As a fused loop of generated code: vectorized (with the runtime's ISA flags). */
__attribute__((noinline)) static void exp_loop(int n) {
  CAVS_IVDEP
  for (int i = 0; i < n; i++) out[i] = cavs_exp_f(in[i]);
}

/* How many units in the last place of `want` separate `got` from it (0 when both are the
 * same infinity, or both NaN; huge when only one is). */
static double ulps(float got, float want) {
  if (isnan(want) || isnan(got)) return isnan(want) && isnan(got) ? 0 : INFINITY;
  if (isinf(want) || isinf(got)) return got == want ? 0 : INFINITY;
  float a = fabsf(want), ulp = nextafterf(a, INFINITY) - a;
  return fabs((double)got - (double)want) / (double)ulp;
}

/* Returns the largest error seen, in ulps. One assertion for all the values: Check
 * reports every assertion that passes to the parent process, one write each. */
static double check_values(const float *x, int n, double tol) {
  double worst = 0;
  int bad = -1;
  for (int i = 0; i < n; i++) in[i] = x[i];
  exp_loop(n);
  for (int i = 0; i < n && bad < 0; i++) {
    float want = expf(x[i]);
    double e = fmax(ulps(cavs_exp_f(x[i]), want), ulps(out[i], want));
    if (!(e <= tol)) bad = i;
    worst = fmax(worst, e);
  }
  if (bad >= 0)
    ck_abort_msg("cavs_exp_f(%a) = %a, in a vectorized loop %a; expf says %a", (double)x[bad],
                 (double)cavs_exp_f(x[bad]), (double)out[bad], (double)expf(x[bad]));
  return worst;
}

START_TEST(exp_special_values) {
  const float x[] = {NAN, -NAN, INFINITY, -INFINITY};
  check_values(x, 4, 0);
  ck_assert(isnan(out[0]) && isnan(out[1]));
  ck_assert(isinf(out[2]) && out[2] > 0);
  ck_assert(out[3] == 0 && !signbit(out[3]));
}
END_TEST

START_TEST(exp_huge_arguments) {
  /* past log(FLT_MAX) = 88.7228: +Inf; below log(FLT_TRUE_MIN / 2) = -103.972: 0 */
  const float x[] = {88.0f, 88.5f, 88.72f, 88.7228f, 88.723f, 89.0f, 100.0f, 1e10f, FLT_MAX,
                     -87.0f, -87.5f, -90.0f, -100.0f, -103.0f, -103.9f, -104.0f, -110.0f, -1e10f, -FLT_MAX};
  check_values(x, sizeof x / sizeof *x, 1);
  ck_assert(isinf(cavs_exp_f(88.723f)) && isinf(cavs_exp_f(FLT_MAX)));
  ck_assert(cavs_exp_f(-104.0f) == 0 && cavs_exp_f(-FLT_MAX) == 0);
  ck_assert(cavs_exp_f(88.72f) < FLT_MAX && cavs_exp_f(-103.0f) > 0);
}
END_TEST

START_TEST(exp_tiny_arguments) {
  const float x[] = {0.0f, -0.0f, 1e-30f, -1e-30f, FLT_MIN, -FLT_MIN, FLT_TRUE_MIN, -FLT_TRUE_MIN, 1e-7f, -1e-7f};
  check_values(x, sizeof x / sizeof *x, 1);
  ck_assert(cavs_exp_f(0.0f) == 1 && cavs_exp_f(-FLT_TRUE_MIN) == 1);
}
END_TEST

/* [-110, 110] on a grid of 2^18 points, subnormal results included. */
START_TEST(exp_whole_range) {
  static float x[N];
  double worst = 0;
  for (int block = 0; block < 4; block++) {
    for (int i = 0; i < N; i++) x[i] = -110.0f + 220.0f * (float)(block * N + i) / (float)(4 * N);
    worst = fmax(worst, check_values(x, N, 2));
  }
  fprintf(stderr, "cavs_exp_f: at most %.2f ulp from expf\n", worst);
}
END_TEST

START_TEST(sigmoid_tanh_edges) {
  ck_assert(cavs_sigmoid_f(INFINITY) == 1 && cavs_sigmoid_f(-INFINITY) == 0);
  ck_assert(cavs_tanh_f(INFINITY) == 1 && cavs_tanh_f(-INFINITY) == -1);
  ck_assert(cavs_sigmoid_f(200.0f) == 1 && cavs_sigmoid_f(-200.0f) == 0);
  ck_assert(cavs_tanh_f(100.0f) == 1 && cavs_tanh_f(-100.0f) == -1);
  ck_assert(isnan(cavs_sigmoid_f(NAN)) && isnan(cavs_tanh_f(NAN)));
  for (float x = -20; x <= 20; x += 0.0625f) {
    ck_assert_msg(fabsf(cavs_tanh_f(x) - tanhf(x)) < 4e-7f, "tanh(%g)", (double)x);
    ck_assert_msg(fabsf(cavs_sigmoid_f(x) - 1 / (1 + expf(-x))) < 2e-7f, "sigmoid(%g)", (double)x);
  }
}
END_TEST

/* The cells of a CUDA target's fused kernel (cavs_cuda_blocks, cavs_cuda_cell), run here
 * as the GPU runs them: every block of the grid, every thread of a block. Each cell of
 * the n rows and `width` columns is taken by exactly one thread, none outside them, the
 * last block is not idle, and consecutive threads take consecutive columns of a row.
 * Returns what was wrong, or NULL (Check's assertions are too slow for every thread). */
static const char *cells_once(long n, long width, uint32_t block) {
  uint32_t blocks = cavs_cuda_blocks(n, width, block);
  long cells = n > 0 && width > 0 ? n * width : 0;
  if (blocks != (uint32_t)((cells + block - 1) / block)) return "the number of blocks";
  unsigned char *seen = calloc((size_t)cells + 1, 1);
  long taken = 0, last_block = 0;
  const char *bad = NULL;
  for (uint32_t b = 0; b < blocks && !bad; b++)
    for (uint32_t t = 0; t < block && !bad; t++) {
      long r = -1, c = -1, k = (long)b * block + t;
      if (!cavs_cuda_cell(b, block, t, n, width, &r, &c)) continue;
      if (r < 0 || r >= n || c < 0 || c >= width) bad = "a cell outside the rows and columns";
      else if (seen[r * width + c]++) bad = "a cell taken twice";
      else if (r != k / width || c != k % width) bad = "a cell out of row-major order";
      taken++;
      last_block += b == blocks - 1;
    }
  free(seen);
  if (!bad && taken != cells) bad = "a cell nobody took";
  if (!bad && blocks && !last_block) bad = "an idle last block";
  return bad;
}

START_TEST(cuda_cells) {
  const long ns[] = {0, 1, 2, 3, 7, 64, 255, 256, 257, 1000};
  const long widths[] = {0, 1, 3, 5, 31, 32, 33, 256, 300};
  const uint32_t blocks[] = {1, 32, 64, 128, 256, 1024};
  for (size_t a = 0; a < sizeof ns / sizeof *ns; a++)
    for (size_t b = 0; b < sizeof widths / sizeof *widths; b++)
      for (size_t k = 0; k < sizeof blocks / sizeof *blocks; k++) {
        const char *bad = cells_once(ns[a], widths[b], blocks[k]);
        if (bad) ck_abort_msg("n %ld, width %ld, block %u: %s", ns[a], widths[b], blocks[k], bad);
      }
  ck_assert_ptr_null(cells_once(513, 129, CAVS_CUDA_BLOCK));
}
END_TEST

/* Nothing to launch for no rows or no columns; past what a grid holds, a count the launch
 * refuses (UINT32_MAX blocks), never one that wrapped around to a small grid. */
START_TEST(cuda_grid_limits) {
  ck_assert_uint_eq(cavs_cuda_blocks(0, 100, 256), 0);
  ck_assert_uint_eq(cavs_cuda_blocks(-1, 100, 256), 0);
  ck_assert_uint_eq(cavs_cuda_blocks(100, 0, 256), 0);
  ck_assert_uint_eq(cavs_cuda_blocks(1L << 30, 1L << 8, 256), 1u << 30);
  ck_assert_uint_eq(cavs_cuda_blocks(0x7fffffffL, 256, 256), 0x7fffffffu); /* the largest grid */
  ck_assert_uint_eq(cavs_cuda_blocks(0x7fffffffL, 257, 256), UINT32_MAX);
  ck_assert_uint_eq(cavs_cuda_blocks(1L << 30, 1L << 40, 256), UINT32_MAX);
  ck_assert_uint_eq(cavs_cuda_blocks(1L << 62, 1L << 62, 256), UINT32_MAX); /* n * width overflows */
  long r, c;
  ck_assert(!cavs_cuda_cell(0, 256, 0, 5, 0, &r, &c));
  ck_assert(!cavs_cuda_cell(0, 256, 0, 0, 5, &r, &c));
  ck_assert(cavs_cuda_cell(0x7ffffffeu, 256, 255, 0x7fffffffL, 256, &r, &c) && r == 0x7ffffffeL && c == 255);
}
END_TEST

/* cv_span_of: the span of every flat index, against a linear search, with empty spans
 * among them. */
/* The optimizers' moments with the gradient left at zero (a dead unit, an expert without
 * rows): decayed step after step, each stays a normal number until it is exactly zero;
 * it never sinks into the subnormals, where an Intel processor takes a microcode assist
 * for every instruction that touches one (arith.h, cv_flush; bench/steps). A whole
 * array of them at once, in a loop the compiler vectorizes as the CPU's step does, each
 * element from a different starting size, so that at every step some cross the edge. */
enum { MOM = 256 };
static float mp[MOM], mm1[MOM], mm2[MOM];
static double dp[MOM], dm1[MOM], dm2[MOM];

/* every element's update as the CPU's step makes it, in float (S f) and double (S d) */
#define STEP_LOOP(R, S, P, M1, M2)                                                                        \
  __attribute__((noinline)) static void step_loop_##S(int kind, R g) {                                    \
    CAVS_IVDEP                                                                                            \
    for (int i = 0; i < MOM; i++) {                                                                       \
      if (kind == CAVS_ADAM) cv_adam_##S(&P[i], &M1[i], &M2[i], g, (R)1e-3, (R)0.9, (R)0.9, (R)1.25, (R)1.5, (R)1e-8); \
      else if (kind == CAVS_ADAMW)                                                                        \
        cv_adamw_##S(&P[i], &M1[i], &M2[i], g, (R)1e-3, (R)0.9, (R)0.9, (R)1.25, (R)1.5, (R)1e-8, (R)0.01); \
      else if (kind == CAVS_MOMENTUM) cv_momentum_##S(&P[i], &M1[i], g, (R)1e-3, (R)0.9);                   \
      else cv_nesterov_##S(&P[i], &M1[i], g, (R)1e-3, (R)0.9);                                              \
    }                                                                                                     \
  }
STEP_LOOP(float, f, mp, mm1, mm2)
STEP_LOOP(double, d, dp, dm1, dm2)

START_TEST(moments_never_subnormal) {
  static const int kinds[] = {CAVS_ADAM, CAVS_ADAMW, CAVS_MOMENTUM, CAVS_NESTEROV};
  for (int k = 0; k < 4; k++) {
    int kind = kinds[k];
    bool two = kind == CAVS_ADAM || kind == CAVS_ADAMW;
    for (int i = 0; i < MOM; i++) {
      mp[i] = 0.5f, dp[i] = 0.5;
      /* from 1e-30 to 1e-37 (float) and 1e-290 to 1e-305 (double), either sign; the
         second moment's rate is 0.9 here as the first's (step_loop), so that both
         cross within a few hundred steps (about 22 a decade; the flush does not depend
         on the rate, and the test stays short under valgrind) */
      mm1[i] = (i & 1 ? -1 : 1) * 1e-30f * powf(10.0f, -(float)(i % 8));
      dm1[i] = (i & 1 ? -1 : 1) * 1e-290 * pow(10.0, -(double)(i % 16));
      mm2[i] = 1e-30f * powf(10.0f, -(float)(i % 8));
      dm2[i] = 1e-290 * pow(10.0, -(double)(i % 16));
    }
    int steps_f = 300, steps_d = 600;
    for (int s = 0; s < steps_f; s++) {
      step_loop_f(kind, 0.0f);
      for (int i = 0; i < MOM; i++)
        if (fpclassify(mm1[i]) == FP_SUBNORMAL || (two && fpclassify(mm2[i]) == FP_SUBNORMAL))
          ck_abort_msg("kind %d, float, step %d: moment %d subnormal (%a, %a)", kind, s, i, (double)mm1[i],
                       (double)mm2[i]);
    }
    for (int i = 0; i < MOM; i++) {
      ck_assert_msg(mm1[i] == 0 && (!two || mm2[i] == 0), "kind %d, float: moment %d not zero after %d steps: %a %a",
                    kind, i, steps_f, (double)mm1[i], (double)mm2[i]);
      ck_assert(isfinite(mp[i]));
    }
    for (int s = 0; s < steps_d; s++) {
      step_loop_d(kind, 0.0);
      for (int i = 0; i < MOM; i++)
        if (fpclassify(dm1[i]) == FP_SUBNORMAL || (two && fpclassify(dm2[i]) == FP_SUBNORMAL))
          ck_abort_msg("kind %d, double, step %d: moment %d subnormal (%a, %a)", kind, s, i, dm1[i], dm2[i]);
    }
    for (int i = 0; i < MOM; i++)
      ck_assert_msg(dm1[i] == 0 && (!two || dm2[i] == 0), "kind %d, double: moment %d not zero after %d steps: %a %a",
                    kind, i, steps_d, dm1[i], dm2[i]);
  }
}
END_TEST

/* ... and a normal moment, NaN (a poisoned gradient must still show) and the edge itself
   pass through unchanged */
START_TEST(moments_flush_only_subnormals) {
  ck_assert(cv_flush_f(FLT_MIN) == FLT_MIN && cv_flush_f(-FLT_MIN) == -FLT_MIN);
  ck_assert(cv_flush_f(nextafterf(FLT_MIN, 0)) == 0 && cv_flush_f(-nextafterf(FLT_MIN, 0)) == 0);
  ck_assert(cv_flush_d(DBL_MIN) == DBL_MIN && cv_flush_d(nextafter(DBL_MIN, 0)) == 0);
  ck_assert(isnan(cv_flush_f(NAN)) && isnan(cv_flush_d(NAN)) && cv_flush_f(INFINITY) == INFINITY);
  /* one Adam step from normal moments: the formula's values exactly */
  float p = 0.25f, m1 = 3e-4f, m2 = 2e-7f, g = -1.5e-3f;
  float w1 = 0.9f * m1 + (1 - 0.9f) * g, w2 = 0.999f * m2 + (1 - 0.999f) * g * g;
  float wp = p - 1e-3f * (w1 * 1.25f) / (sqrtf(w2 * 1.5f) + 1e-8f);
  cv_adam_f(&p, &m1, &m2, g, 1e-3f, 0.9f, 0.999f, 1.25f, 1.5f, 1e-8f);
  ck_assert(m1 == w1 && m2 == w2 && p == wp);
}
END_TEST

START_TEST(spans_by_bisection) {
  static const size_t len[] = {3, 0, 1, 7, 0, 0, 2, 5, 1};
  enum { NS = sizeof len / sizeof *len };
  size_t start[NS + 1] = {0};
  for (int k = 0; k < NS; k++) start[k + 1] = start[k] + len[k];
  for (size_t i = 0; i < start[NS]; i++) {
    int want = 0;
    while (!(start[want] <= i && i < start[want + 1])) want++;
    ck_assert_int_eq(cv_span_of(start, NS, i), want);
  }
}
END_TEST

/* ---- the CPU backend's pool (runtime/pool.c, compiled into this test) ---- */

typedef struct PoolJob {
  long gen;
  atomic_int *ran; /* [64]: how often each part ran */
  long *sum;       /* [64] */
} PoolJob;

static void pool_part(void *arg, int i) {
  PoolJob *j = arg;
  atomic_fetch_add(&j->ran[i], 1);
  j->sum[i] += j->gen;
}

/* Every part of every job runs exactly once, and before cv_pool_run returns: jobs of
 * changing sizes back to back (a worker still finishing one while the next is set up is
 * where a part could run twice, or a job return early), with pauses long enough for
 * the workers to fall asleep, on more threads than cores. */
START_TEST(pool_runs_each_part_once) {
  int threads[] = {2, 5};
  for (int t = 0; t < 2; t++) {
    cv_pool *p = cv_pool_new(threads[t]);
    ck_assert_ptr_nonnull(p);
    ck_assert_int_eq(cv_pool_threads(p), threads[t]);
    static atomic_int ran[64];
    static long sum[64], want[64];
    for (int i = 0; i < 64; i++) {
      atomic_store(&ran[i], 0);
      sum[i] = want[i] = 0;
    }
    for (long g = 1; g <= 20000; g++) {
      int parts = (int)(g % 9) + 1;
      PoolJob j = {g, ran, sum};
      cv_pool_run(p, pool_part, &j, parts);
      for (int i = 0; i < parts; i++) {
        want[i] += g;
        /* the sum is read right after the run: each part done, and done once */
        ck_assert_msg(sum[i] == want[i], "threads %d, job %ld, part %d: %ld, want %ld", threads[t], g, i, sum[i],
                      want[i]);
      }
      if (g % 4000 == 0) usleep(3000);
    }
    cv_pool_free(p);
  }
  ck_assert_ptr_null(cv_pool_new(1)); /* one thread: no pool, run inline */
}
END_TEST

/* A small generator of its own, so the cases are the same on every machine. */
static uint64_t lcg = 88172645463325252u;
static double rnd(void) {
  lcg = lcg * 6364136223846793005u + 1442695040888963407u;
  return (double)(lcg >> 11) / 9007199254740992.0; /* [0, 1) */
}
static float rnd_value(void) { return (float)(rnd() * 2 - 1); }

/* op(X)(i, p) of a row-major X with leading dimension ld */
static float at(const float *x, bool t, long ld, int i, int p) { return t ? x[(size_t)p * ld + i] : x[(size_t)i * ld + p]; }

/* One product of m x k by k x n against sums in double: every element of C within a
   bound of float rounding (k products and sums, then alpha and beta), the columns of
   C past n and the rows of A and B past their shapes untouched and unread (NaN there
   would show), C's old NaNs ignored where beta is 0, as BLAS does. */
typedef int Gemm(bool, bool, int, int, int, float, const float *, long, const float *, long, float, float *, long);
static void one_product_ld(Gemm *f, bool ta, bool tb, int m, int n, int k, float alpha, float beta, long lda, long ldb,
                           long ldc) {
  long ar = ta ? k : m, br = tb ? n : k;
  float *a = malloc(sizeof(float) * (size_t)(ar * lda)), *b = malloc(sizeof(float) * (size_t)(br * ldb));
  float *c = malloc(sizeof(float) * (size_t)m * (size_t)ldc), *c0 = malloc(sizeof(float) * (size_t)m * (size_t)ldc);
  ck_assert(a && b && c && c0);
  for (long i = 0; i < ar * lda; i++) a[i] = i % lda < (ta ? m : k) ? rnd_value() : NAN;
  for (long i = 0; i < br * ldb; i++) b[i] = i % ldb < (tb ? k : n) ? rnd_value() : NAN;
  for (long i = 0; i < (long)m * ldc; i++) c0[i] = c[i] = i % ldc < n ? (beta == 0 ? NAN : rnd_value()) : -7.0f;
  ck_assert_int_eq(f(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc), 0);
  for (int i = 0; i < m; i++)
    for (int j = 0; j < ldc; j++) {
      float got = c[(size_t)i * ldc + j];
      if (j >= n) {
        ck_assert_msg(got == -7.0f, "%d%d %dx%dx%d: C(%d,%d) past n written", ta, tb, m, n, k, i, j);
        continue;
      }
      double want = 0, mag = 0;
      for (int p = 0; p < k; p++) {
        double x = at(a, ta, lda, i, p), y = at(b, tb, ldb, p, j);
        want += x * y;
        mag += fabs(x * y);
      }
      double old = beta == 0 ? 0 : c0[(size_t)i * ldc + j];
      want = alpha * want + beta * old;
      double tol = (k + 4) * FLT_EPSILON * (fabs(alpha) * mag + fabs(beta * old)) + FLT_MIN;
      ck_assert_msg(fabs(got - want) <= tol, "%d%d %dx%dx%d alpha %g beta %g: C(%d,%d) = %.9g, want %.9g (tol %.3g)",
                    ta, tb, m, n, k, alpha, beta, i, j, got, want, tol);
    }
  free(a);
  free(b);
  free(c);
  free(c0);
}
/* with leading dimensions past the shapes (their padding NaN) */
static void one_product_with(Gemm *f, bool ta, bool tb, int m, int n, int k, float alpha, float beta) {
  one_product_ld(f, ta, tb, m, n, k, alpha, beta, (ta ? m : k) + 3, (tb ? k : n) + 5, n + 7);
}

/* Under the test wrapper (valgrind, which runs AVX2 but never AVX-512, each vector
   instruction some hundred times slower), the big product's checks keep every blocking
   edge but run the largest shapes in one transposition and only the smaller random
   cases: in full, the test case took 10 minutes there (2026-12-03, Zen 3), its tests
   past the 120 s each is allowed. */
static bool wrapped(void) {
  const char *w = getenv("CAVS_TEST_WRAPPER");
  return w && *w;
}

/* The kernels of a kind (big, few rows, narrow) this processor runs: the one libcavs
   picks (AVX-512 or AVX2), and the AVX2 one where that is not it (an AVX-512 processor
   runs AVX2 too, so the kernel that processors without AVX-512 use is tested on every
   machine that can run it). */
static int kernels_of(Gemm *picked, Gemm *avx2, const char *what, Gemm **f, const char **name) {
  int n = 0;
  if (cv_sgemm_small_usable()) f[n] = picked, name[n++] = cv_sgemm_small_isa();
  float x = 1, y = 0;
  if (strcmp(cv_sgemm_small_isa(), "avx2") && avx2(false, false, 1, 1, 1, 1, &x, 1, &x, 1, 0, &y, 1) == 0)
    f[n] = avx2, name[n++] = "avx2 (forced)";
  if (!n) fprintf(stderr, "check_math: neither AVX-512 nor AVX2 with FMA: no %s kernel runs here\n", what);
  return n;
}
static int big_kernels(Gemm **f, const char **name) { return kernels_of(cv_sgemm, cv_sgemm_avx2, "big", f, name); }

/* Edges of every blocking sgemm.c does (6-row tiles, 64- and 16-column panels, 512-deep
   slices, 192-row and 1024-column blocks), each form of transposition, alpha and beta;
   A's rows 4 KB apart (read in place without asking for the next ones). */
START_TEST(sgemm_matches_double) {
  Gemm *fs[2];
  const char *names[2];
  int nk = big_kernels(fs, names);
  static const int ms[] = {1, 2, 5, 6, 7, 13, 64, 193, 250}, ns[] = {1, 15, 16, 17, 63, 64, 65, 130, 1030},
                   ks[] = {1, 3, 16, 17, 255, 511, 512, 513, 1030};
  static const float alphas[] = {1, -0.5f, 2}, betas[] = {1, 0, 0.25f};
  int big = wrapped() ? 1 : 4;
  double most = wrapped() ? 2e6 : 3e7;
  for (int f = 0; f < nk; f++) {
    for (int t = 0; t < 4; t++) { /* each transposition with the largest shapes */
      if (t < big) one_product_with(fs[f], t & 1, t >> 1, 193, 1030, 1030, 1, 1);
      one_product_ld(fs[f], t & 1, t >> 1, 61, 200, 1024, 0.5f, 0, t & 1 ? 61 : 1024, t >> 1 ? 1024 : 200, 200);
    }
    for (int c = 0; c < 300; c++) {
      int m = ms[(int)(rnd() * 9)], n = ns[(int)(rnd() * 9)], k = ks[(int)(rnd() * 9)];
      if ((double)m * n * k > most) continue;
      one_product_with(fs[f], rnd() < 0.5, rnd() < 0.5, m, n, k, alphas[(int)(rnd() * 3)], betas[(int)(rnd() * 3)]);
    }
  }
}
END_TEST

/* Random A (m x k) and B (k x n), and two zeroed m x n results */
static void operands(int m, int n, int k, float **a, float **b, float **whole, float **part) {
  *a = malloc(sizeof(float) * (size_t)m * k), *b = malloc(sizeof(float) * (size_t)k * n);
  *whole = calloc((size_t)m * n, sizeof(float)), *part = calloc((size_t)m * n, sizeof(float));
  ck_assert(*a && *b && *whole && *part);
  for (long i = 0; i < (long)m * k; i++) (*a)[i] = rnd_value();
  for (long i = 0; i < (long)k * n; i++) (*b)[i] = rnd_value();
}

/* f's product of m x k by k x n (n = 1000) into c in five column blocks: [0, 16), [16, 80),
   [80, 512), [512, 592), [592, 1000), as a pool's threads might take them */
static void by_columns(Gemm *f, bool ta, bool tb, int m, int n, int k, const float *a, long lda, const float *b,
                       long ldb, float *c) {
  static const int cuts[] = {16, 80, 512, 592, 1000};
  for (int j = 0, j0 = 0; j < 5; j0 = cuts[j++]) /* columns [j0, cuts[j]) */
    f(ta, tb, m, cuts[j] - j0, k, 1, a, lda, b + (tb ? (size_t)j0 * ldb : (size_t)j0), ldb, 0, c + j0, n);
}

/* f's product of m x k by k x n, each transposition (NN alone where step is 4),
   against itself split into row blocks ending at rcuts (the last m) and into column
   blocks ending at ccuts (the last n): every element the same bits. */
static void splits_of(Gemm *f, const char *name, int step, int m, int n, int k, const int *rcuts, int nrc,
                      const int *ccuts, int ncc) {
  for (int t = 0; t < 4; t += step) {
    bool ta = t & 1, tb = t >> 1;
    long lda = ta ? m : k, ldb = tb ? k : n;
    float *a, *b, *whole, *part;
    operands(m, n, k, &a, &b, &whole, &part);
    ck_assert_int_eq(f(ta, tb, m, n, k, 1, a, lda, b, ldb, 0, whole, n), 0);
    for (int j = 0, i0 = 0; j < nrc; i0 = rcuts[j++])
      ck_assert_int_eq(f(ta, tb, rcuts[j] - i0, n, k, 1, a + (ta ? (size_t)i0 : (size_t)i0 * lda), lda, b, ldb, 0,
                         part + (size_t)i0 * n, n),
                       0);
    ck_assert_msg(!memcmp(whole, part, sizeof(float) * (size_t)m * n), "%s %d%d: split by rows differs", name, ta, tb);
    memset(part, 0, sizeof(float) * (size_t)m * n);
    for (int j = 0, j0 = 0; j < ncc; j0 = ccuts[j++])
      ck_assert_int_eq(
          f(ta, tb, m, ccuts[j] - j0, k, 1, a, lda, b + (tb ? (size_t)j0 * ldb : (size_t)j0), ldb, 0, part + j0, n), 0);
    ck_assert_msg(!memcmp(whole, part, sizeof(float) * (size_t)m * n), "%s %d%d: split by columns differs", name, ta,
                  tb);
    free(a);
    free(b);
    free(whole);
    free(part);
  }
}

/* The CPU backend splits a product over its threads by column blocks (multiples of 16)
   or by row blocks, each one call: every element must come out with the same bits as
   from the whole product, or results would depend on the thread count. */
START_TEST(sgemm_splits_change_no_bit) {
  Gemm *fs[2];
  const char *names[2];
  int nk = big_kernels(fs, names);
  static const int rcuts[] = {1, 7, 150, 301}, ccuts[] = {16, 80, 512, 592, 1000};
  for (int f = 0; f < nk; f++) splits_of(fs[f], names[f], wrapped() ? 4 : 1, 301, 1000, 600, rcuts, 4, ccuts, 5);
}
END_TEST

static int small_kernels(Gemm **f, const char **name) {
  return kernels_of(cv_sgemm_small, cv_sgemm_small_avx2, "few-rows", f, name);
}

/* The few-rows product (cv_sgemm_small: op(B) read in place): every row count it takes,
   the edges of its tiles (6 rows and 64 columns not transposed, 4 rows, 4 columns and
   16-float steps of k transposed in AVX-512; 3 rows and 32 columns, 3 rows, 4 columns
   and 8-float steps in AVX2), against sums in double as cv_sgemm is; both operands
   transposed and more than CV_SGEMM_SMALL_M rows refused. */
START_TEST(sgemm_small_matches_double) {
  Gemm *fs[2];
  const char *names[2];
  int nk = small_kernels(fs, names);
  static const int ns[] = {1, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 130, 1030},
                   ks[] = {1, 3, 7, 8, 9, 15, 16, 17, 255, 511, 512, 513, 1030};
  static const float alphas[] = {1, -0.5f, 2}, betas[] = {1, 0, 0.25f};
  for (int f = 0; f < nk; f++) {
    fprintf(stderr, "check_math: few-rows kernel %s\n", names[f]);
    for (int m = 1; m <= CV_SGEMM_SMALL_M; m++)
      for (int t = 0; t < 3; t++) /* NN, TN, NT */
        one_product_with(fs[f], t == 1, t == 2, m, 1030, 1030, 1, 1);
    for (int c = 0; c < 600; c++) {
      int m = 1 + (int)(rnd() * CV_SGEMM_SMALL_M), n = ns[(int)(rnd() * 18)], k = ks[(int)(rnd() * 13)];
      int t = (int)(rnd() * 3);
      one_product_with(fs[f], t == 1, t == 2, m, n, k, alphas[(int)(rnd() * 3)], betas[(int)(rnd() * 3)]);
    }
    float x[4] = {1, 2, 3, 4}, y[4] = {0};
    ck_assert_int_eq(fs[f](true, true, 2, 2, 2, 1, x, 2, x, 2, 0, y, 2), -1);
    float *big = calloc((size_t)(CV_SGEMM_SMALL_M + 1) * 64, sizeof(float));
    ck_assert(big);
    ck_assert_int_eq(fs[f](false, false, CV_SGEMM_SMALL_M + 1, 16, 4, 1, big, 4, big, 16, 0, big, 16), -1);
    free(big);
  }
}
END_TEST

/* The few-rows product split by columns (over the pool's threads: blocks of 16) or by
   rows gives the bits of the whole: results do not depend on the thread count. Not
   transposed, they are cv_sgemm's bits too (the AVX2 kernel's included), so a level of
   a tree computes the same whichever kernel its row count picks where cv_sgemm runs. */
START_TEST(sgemm_small_splits_change_no_bit) {
  Gemm *fs[2];
  const char *names[2];
  int nk = small_kernels(fs, names);
  const int n = 1000, k = 600;
  for (int f = 0; f < nk; f++)
    for (int m = 1; m <= CV_SGEMM_SMALL_M; m += 3)
      for (int t = 0; t < 3; t++) {
        bool ta = t == 1, tb = t == 2;
        long lda = ta ? m : k, ldb = tb ? k : n;
        float *a, *b, *whole, *part;
        operands(m, n, k, &a, &b, &whole, &part);
        ck_assert_int_eq(fs[f](ta, tb, m, n, k, 1, a, lda, b, ldb, 0, whole, n), 0);
        if (!tb && cv_sgemm_usable()) {
          ck_assert_int_eq(cv_sgemm(ta, tb, m, n, k, 1, a, lda, b, ldb, 0, part, n), 0);
          ck_assert_msg(!memcmp(whole, part, sizeof(float) * (size_t)m * n), "%s %d%d m=%d: not cv_sgemm's bits",
                        names[f], ta, tb, m);
          memset(part, 0, sizeof(float) * (size_t)m * n);
        }
        by_columns(fs[f], ta, tb, m, n, k, a, lda, b, ldb, part);
        ck_assert_msg(!memcmp(whole, part, sizeof(float) * (size_t)m * n), "%s %d%d m=%d: split by columns differs",
                      names[f], ta, tb, m);
        if (m > 1) {
          memset(part, 0, sizeof(float) * (size_t)m * n);
          int i1 = m / 2;
          fs[f](ta, tb, i1, n, k, 1, a, lda, b, ldb, 0, part, n);
          fs[f](ta, tb, m - i1, n, k, 1, a + (ta ? (size_t)i1 : (size_t)i1 * lda), lda, b, ldb, 0,
                part + (size_t)i1 * n, n);
          ck_assert_msg(!memcmp(whole, part, sizeof(float) * (size_t)m * n), "%s %d%d m=%d: split by rows differs",
                        names[f], ta, tb, m);
        }
        free(a);
        free(b);
        free(whole);
        free(part);
      }
}
END_TEST

/* The narrow kernels this processor runs (cv_sgemm_narrow, and its AVX2 version where
   that is not the one libcavs picks), as small_kernels */
static int narrow_kernels(Gemm **f, const char **name) {
  return kernels_of(cv_sgemm_narrow, cv_sgemm_narrow_avx2, "narrow", f, name);
}

/* Products of fewer than 16 columns (cv_sgemm_narrow: a classifier's classes) of any
   row count: every column count, the edges of the few-rows tiles it reuses (4 or 2 rows
   of A and 4 columns a dot-product tile, 16- or 8-float steps of k; with A transposed,
   C' = op(B)' A in 6 or 3 rows and 64 or 32 columns, 512-deep slices), each
   transposition, alpha and beta, against sums in double; 16 columns refused. */
START_TEST(sgemm_narrow_matches_double) {
  Gemm *fs[2];
  const char *names[2];
  int nk = narrow_kernels(fs, names);
  static const int ms[] = {1, 2, 3, 4, 5, 7, 17, 33, 65, 130, 301},
                   ks[] = {1, 3, 7, 8, 9, 15, 16, 17, 255, 256, 513, 1030};
  static const float alphas[] = {1, -0.5f, 2}, betas[] = {1, 0, 0.25f};
  for (int f = 0; f < nk; f++) {
    fprintf(stderr, "check_math: narrow kernel %s\n", names[f]);
    for (int n = 1; n < 16; n++)
      for (int t = 0; t < 4; t++) one_product_with(fs[f], t & 1, t >> 1, 301, n, 1030, 1, 1);
    for (int c = 0; c < 600; c++) {
      int m = ms[(int)(rnd() * 11)], n = 1 + (int)(rnd() * 15), k = ks[(int)(rnd() * 12)], t = (int)(rnd() * 4);
      one_product_with(fs[f], t & 1, t >> 1, m, n, k, alphas[(int)(rnd() * 3)], betas[(int)(rnd() * 3)]);
    }
    float x[64] = {0}, y[16] = {0};
    ck_assert_int_eq(fs[f](false, false, 1, 16, 4, 1, x, 4, x, 16, 0, y, 16), -1);
  }
}
END_TEST

/* A narrow product split by rows (at any row, as the pool's threads take blocks of 16)
   or by columns gives the bits of the whole, in each transposition. */
START_TEST(sgemm_narrow_splits_change_no_bit) {
  Gemm *fs[2];
  const char *names[2];
  int nk = narrow_kernels(fs, names);
  static const int rcuts[] = {1, 7, 160, 301}, ccuts[] = {5, 6, 13};
  for (int f = 0; f < nk; f++) splits_of(fs[f], names[f], 1, 301, 13, 600, rcuts, 4, ccuts, 3);
}
END_TEST

/* A parameter packed once a pass (cv_sgemm_pack) and read by many products, over all of
 * its columns or a thread's block of them, gives the bits of packing it each time. */
typedef struct Packing {
  Gemm *whole;
  size_t (*floats)(int n, int k);
  void (*pack)(bool tb, int n, int k, const float *b, long ldb, float *packed);
  int (*packed)(bool ta, int m, int n, int k, float alpha, const float *a, long lda, const float *packed, int ncols,
                int jo, float beta, float *c, long ldc);
} Packing;
START_TEST(sgemm_packed_changes_no_bit) {
  static const Packing picked = {cv_sgemm, cv_sgemm_packed_floats, cv_sgemm_pack, cv_sgemm_packed},
                       avx2 = {cv_sgemm_avx2, cv_sgemm_packed_floats_avx2, cv_sgemm_pack_avx2, cv_sgemm_packed_avx2};
  Gemm *fs[2];
  const char *names[2];
  int nk = big_kernels(fs, names);
  static const int shapes[][3] = {{37, 1000, 600}, {6, 64, 256}, {1, 130, 17}, {200, 768, 256}, {5, 70, 1030}};
  for (int f = 0; f < nk; f++)
    for (int s = 0; s < 5; s++)
      for (int t = 0; t < 4; t++) {
        const Packing *x = fs[f] == cv_sgemm ? &picked : &avx2;
        bool ta = t & 1, tb = t >> 1;
        int m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
        long lda = ta ? m : k, ldb = (tb ? k : n) + 3;
        float *a = malloc(sizeof(float) * (size_t)m * k), *b = malloc(sizeof(float) * (size_t)(tb ? n : k) * ldb);
        float *want = malloc(sizeof(float) * (size_t)m * n), *got = malloc(sizeof(float) * (size_t)m * n);
        float *packed = NULL;
        ck_assert(!posix_memalign((void **)&packed, 64, sizeof(float) * x->floats(n, k)));
        ck_assert(a && b && want && got);
        for (long i = 0; i < (long)m * k; i++) a[i] = rnd_value();
        for (long i = 0; i < (long)(tb ? n : k) * ldb; i++) b[i] = rnd_value();
        for (long i = 0; i < (long)m * n; i++) want[i] = got[i] = rnd_value();
        ck_assert_int_eq(x->whole(ta, tb, m, n, k, 0.5f, a, lda, b, ldb, 1, want, n), 0);
        x->pack(tb, n, k, b, ldb, packed);
        /* columns in blocks that start on panels: [0, 64), [64, j1), [j1, n) */
        int j1 = n > 128 ? (n / 2) / 64 * 64 : n;
        static const int starts[] = {0, 64};
        for (int q = 0; q < 3; q++) {
          int j0 = q < 2 ? starts[q] : j1, je = q == 0 ? 64 : q == 1 ? j1 : n;
          if (je > n) je = n;
          if (j0 >= je) continue;
          ck_assert_int_eq(x->packed(ta, m, je - j0, k, 0.5f, a, lda, packed, n, j0, 1, got + j0, n), 0);
        }
        ck_assert_msg(!memcmp(want, got, sizeof(float) * (size_t)m * n), "%s %d%d %dx%dx%d: packed differs",
                      names[f], ta, tb, m, n, k);
        ck_assert_int_eq(x->packed(ta, m, 1, k, 1, a, lda, packed, n, 8, 1, got, n), -1); /* not a panel */
        free(a);
        free(b);
        free(want);
        free(got);
        free(packed);
      }
}
END_TEST

/* forms.h's products by runs of rows, with a plain product as the backend's: a product
 * that leaves its rows without an index open (CAVS_PROD_Y_OPEN) and the product that
 * adds into it and sets them (CAVS_PROD_Y_CLOSE) give the bits of clearing those rows
 * (CAVS_PROD_Y) and adding over all rows past the leaves (CAVS_PROD_Y_ADD), whatever
 * the runs: rows without an index among the leaves, inner rows with one, runs that
 * alternate, past the backend's most runs (the CUDA backend's 2) or not. Rows start
 * NaN, so a row read before it was written shows. */
static void plain_gemm(cavs_ctx *c, int ta, int tb, int m, int n, int k, double alpha, const void *a, long lda,
                       const void *b, long ldb, double beta, void *cm, long ldc) {
  (void)c;
  const float *A = a, *B = b;
  float *C = cm;
  for (int i = 0; i < m; i++)
    for (int j = 0; j < n; j++) {
      float sum = 0;
      for (int p = 0; p < k; p++)
        sum += (ta ? A[(size_t)p * lda + i] : A[(size_t)i * lda + p]) * (tb ? B[(size_t)j * ldb + p] : B[(size_t)p * ldb + j]);
      float *o = &C[(size_t)i * ldc + j];
      *o = beta == 0 ? (float)alpha * sum : (float)alpha * sum + (float)beta * *o;
    }
}
static int zeroed_rows;
static void plain_zero(cavs_ctx *c, void *y, long ldy, int a, int len, int cols) {
  (void)c;
  zeroed_rows += len;
  for (int r = a; r < a + len; r++) memset((float *)y + (size_t)r * ldy, 0, sizeof(float) * (size_t)cols);
}

START_TEST(open_rows_closed_as_cleared) {
  enum { ROWS = 20, R0 = 3, N = 14, COLS = 5, K = 4, LDY = 7 };
  cavs_desc d = {.precision = CAVS_FLOAT};
  cavs_ctx c = {.desc = &d};
  uint64_t seed = 7;
  int opened = 0;
  for (int trial = 0; trial < 400; trial++) {
    int idx[ROWS], skip = trial % 5, kind = trial % 4;
    for (int r = 0; r < ROWS; r++) {
      seed = cavs_mix64(seed);
      /* 0: words at random, 1: leaves with words and inner rows without (SST), 2: every
         row a word (a language model), 3: words in alternating runs of one or two */
      idx[r] = kind == 0 ? ((seed & 1) ? (int)(seed >> 8) % 9 : -1)
               : kind == 1 ? (r < R0 + skip ? 3 : -1)
               : kind == 2 ? r % 9
                           : (((r / (1 + (int)(trial / 4 % 2))) & 1) ? 2 : -1);
    }
    float xo[ROWS * K], xc[ROWS * K], w[K * COLS];
    for (int i = 0; i < ROWS * K; i++) {
      int r = i / K;
      seed = cavs_mix64(seed);
      xo[i] = idx[r] >= 0 ? (float)(seed % 1000) / 500 - 1 : 0; /* a looked-up row: zero without a word */
      seed = cavs_mix64(seed);
      xc[i] = r >= R0 + skip ? (float)(seed % 1000) / 500 - 1 : 0; /* gathered: zero at the leaves */
    }
    for (int i = 0; i < K * COLS; i++) w[i] = (float)((i * 37) % 11) / 7 - 0.7f;
    float want[ROWS * LDY], got[ROWS * LDY];
    for (int i = 0; i < ROWS * LDY; i++) want[i] = got[i] = NAN;
    cv_gemm_rows_with(plain_gemm, plain_zero, &c, idx, 0, R0, N, CAVS_PROD_Y, COLS, K, xo, K, w, COLS, want, LDY, INT_MAX);
    cv_gemm_skip_with(plain_gemm, plain_zero, &c, skip, R0, N, CAVS_PROD_Y_ADD, COLS, K, xc, K, w, COLS, want, LDY);
    const int most[] = {INT_MAX, 2, 0};
    for (int q = 0; q < 3; q++) {
      for (int i = 0; i < ROWS * LDY; i++) got[i] = NAN;
      zeroed_rows = 0;
      cv_gemm_rows_with(plain_gemm, plain_zero, &c, idx, 0, R0, N, CAVS_PROD_Y_OPEN, COLS, K, xo, K, w, COLS, got, LDY,
                        most[q]);
      ck_assert_int_eq(zeroed_rows, 0);
      for (int r = R0; r < R0 + N && q == 0; r++) /* (one product over every row past the most runs) */
        if (idx[r] < 0) ck_assert_msg(isnan(got[(size_t)r * LDY]), "trial %d: open row %d written", trial, r), opened++;
      cv_gemm_rows_with(plain_gemm, plain_zero, &c, idx, skip, R0, N, CAVS_PROD_Y_CLOSE, COLS, K, xc, K, w, COLS, got,
                        LDY, most[q]);
      for (int r = 0; r < ROWS; r++)
        for (int j = 0; j < LDY; j++) {
          float a = want[r * LDY + j], b = got[r * LDY + j];
          ck_assert_msg((isnan(a) && isnan(b)) || !memcmp(&a, &b, sizeof a),
                        "trial %d (kind %d, skip %d, most runs %d): row %d column %d: %a, cleared %a", trial, kind, skip,
                        most[q], r, j, (double)b, (double)a);
        }
    }
  }
  ck_assert_int_gt(opened, 1000);
}
END_TEST

int main(void) {
  Suite *s = suite_create("math");
  TCase *tc = tcase_create("exp");
  tcase_add_test(tc, exp_special_values);
  tcase_add_test(tc, exp_huge_arguments);
  tcase_add_test(tc, exp_tiny_arguments);
  tcase_add_test(tc, exp_whole_range);
  tcase_add_test(tc, sigmoid_tanh_edges);
  suite_add_tcase(s, tc);
  TCase *cu = tcase_create("cuda cells");
  tcase_add_test(cu, cuda_cells);
  tcase_add_test(cu, cuda_grid_limits);
  tcase_add_test(cu, spans_by_bisection);
  suite_add_tcase(s, cu);
  TCase *mo = tcase_create("moments");
  tcase_set_timeout(mo, 60);
  tcase_add_test(mo, moments_never_subnormal);
  tcase_add_test(mo, moments_flush_only_subnormals);
  suite_add_tcase(s, mo);
  TCase *po = tcase_create("pool");
  tcase_add_test(po, pool_runs_each_part_once);
  suite_add_tcase(s, po);
  TCase *mm = tcase_create("sgemm");
  tcase_set_timeout(mm, 120);
  tcase_add_test(mm, sgemm_matches_double);
  tcase_add_test(mm, sgemm_splits_change_no_bit);
  tcase_add_test(mm, sgemm_packed_changes_no_bit);
  tcase_add_test(mm, sgemm_small_matches_double);
  tcase_add_test(mm, sgemm_small_splits_change_no_bit);
  tcase_add_test(mm, sgemm_narrow_matches_double);
  tcase_add_test(mm, sgemm_narrow_splits_change_no_bit);
  tcase_add_test(mm, open_rows_closed_as_cleared);
  suite_add_tcase(s, mm);
  return tu_run_suite(s);
}
