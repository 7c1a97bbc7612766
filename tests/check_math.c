/* check_math.c: the elementwise functions of cavs_abi.h that the fused loops call, against
 * libm, over the whole float range and at its edges: NaN, infinities, results that
 * overflow or underflow (subnormal, then zero), and arguments near zero. Each value is
 * checked called alone and from a loop the compiler vectorizes, as generated code does.
 * Then the index arithmetic of runtime/arith.h, which a GPU's kernels run and no GPU
 * here can: executed on the CPU. */
#include <float.h>
#include <stdint.h>

#include "arith.h"
#include "cavs.h"
#include "testutil.h"

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

/* cv_cell: the threads of a launch over n rows and w columns, in blocks of b, cover
 * every cell once and no other, for shapes that fill the last block and shapes that
 * leave a tail. */
START_TEST(cells_cover_a_row_block_once) {
  static const long shapes[][3] = {{1, 1, 32}, {3, 5, 32}, {64, 256, 256}, {7, 33, 128}, {1, 1000, 256}, {300, 1, 64}};
  for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
    long n = shapes[s][0], w = shapes[s][1], b = shapes[s][2], r0 = 17;
    long blocks = (n * w + b - 1) / b;
    unsigned char *seen = calloc((size_t)(n * w), 1);
    long hits = 0;
    for (long t = 0; t < blocks * b; t++) {
      long row = -1, col = -1;
      if (!cv_cell(t, r0, n, w, &row, &col)) continue;
      ck_assert(row >= r0 && row < r0 + n && col >= 0 && col < w);
      ck_assert_int_eq(seen[(row - r0) * w + col]++, 0);
      hits++;
    }
    ck_assert_int_eq(hits, n * w);
    long row, col;
    ck_assert(!cv_cell(-1, r0, n, w, &row, &col));
    ck_assert(!cv_cell(0, r0, n, 0, &row, &col));
    free(seen);
  }
}
END_TEST

/* cv_span_of: the span of every flat index, against a linear search, with empty spans
 * among them. */
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

int main(void) {
  
  Suite *s = suite_create("math");
  TCase *tc = tcase_create("exp");
  tcase_add_test(tc, exp_special_values);
  tcase_add_test(tc, exp_huge_arguments);
  tcase_add_test(tc, exp_tiny_arguments);
  tcase_add_test(tc, exp_whole_range);
  tcase_add_test(tc, sigmoid_tanh_edges);
  suite_add_tcase(s, tc);
  tc = tcase_create("index arithmetic");
  tcase_add_test(tc, cells_cover_a_row_block_once);
  tcase_add_test(tc, spans_by_bisection);
  suite_add_tcase(s, tc);
  return tu_run_suite(s);
}
