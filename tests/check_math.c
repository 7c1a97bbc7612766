/* check_math.c: the elementwise functions of cavs.h that the fused loops call, against
 * libm, over the whole float range and at its edges: NaN, infinities, results that
 * overflow or underflow (subnormal, then zero), and arguments near zero. Each value is
 * checked called alone and from a loop the compiler vectorizes, as generated code does. */
#include <float.h>
#include <stdint.h>

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

int main(void) {
  Suite *s = suite_create("math");
  TCase *tc = tcase_create("exp");
  tcase_add_test(tc, exp_special_values);
  tcase_add_test(tc, exp_huge_arguments);
  tcase_add_test(tc, exp_tiny_arguments);
  tcase_add_test(tc, exp_whole_range);
  tcase_add_test(tc, sigmoid_tanh_edges);
  suite_add_tcase(s, tc);
  return tu_run_suite(s);
}
