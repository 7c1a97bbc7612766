/* peak.c: the processor's single-precision fused multiply-add peak, what no product can
 * beat: 12 independent chains of vector FMAs in registers (no memory operand), one
 * chain per accumulator so that each FMA's latency is covered, on 1 and on THREADS
 * threads at once (default 2). AVX-512 (16 floats a vector) where the processor has
 * it, else AVX2 with FMA (8). Prints GFLOP/s (2 flops a lane), the best of five timings
 * of 0.3 s each after a warm-up. bench/treefc uses it to say how far its products' floor
 * is from this ceiling.
 *   peak [THREADS] */
#define _GNU_SOURCE
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

enum { CHAINS = 12, STEPS = 1 << 20 };

/* run512 and run256: flops a second over `secs` seconds at least, for vectors of LANES
   floats; the accumulators' sum in *sink, so that nothing is thrown away */
#define RUN(NAME, TARGET, VEC, LANES, SET1, FMADD, STORE)                                                         \
  __attribute__((target(TARGET))) static double NAME(double secs, float *sink) {                                 \
    VEC acc[CHAINS], m = SET1(0.9999999f), a = SET1(1e-7f);                                                         \
    for (int i = 0; i < CHAINS; i++) acc[i] = SET1((float)i);                                                       \
    double t0 = now(), flops = 0;                                                                                   \
    do {                                                                                                            \
      for (long s = 0; s < STEPS; s++)                                                                              \
        _Pragma("GCC unroll 12") for (int i = 0; i < CHAINS; i++) acc[i] = FMADD(acc[i], m, a);                   \
      flops += 2.0 * LANES * CHAINS * STEPS;                                                                        \
    } while (now() - t0 < secs);                                                                                    \
    float out[LANES], s = 0;                                                                                        \
    for (int i = 0; i < CHAINS; i++) {                                                                              \
      STORE(out, acc[i]);                                                                                           \
      for (int j = 0; j < LANES; j++) s += out[j];                                                                  \
    }                                                                                                               \
    *sink = s;                                                                                                      \
    return flops / (now() - t0);                                                                                    \
  }
RUN(run512, "avx512f", __m512, 16, _mm512_set1_ps, _mm512_fmadd_ps, _mm512_storeu_ps)
RUN(run256, "avx2,fma", __m256, 8, _mm256_set1_ps, _mm256_fmadd_ps, _mm256_storeu_ps)

static int wide;
typedef struct {
  double rate;
  float sink;
} Job;
static void *job(void *arg) {
  Job *j = arg;
  j->rate = wide ? run512(0.3, &j->sink) : run256(0.3, &j->sink);
  return NULL;
}

/* GFLOP/s of n threads at once, summed: the best of five rounds */
static double rate(int n) {
  double best = 0;
  for (int round = 0; round < 6; round++) {
    Job jobs[64];
    pthread_t t[64];
    for (int i = 1; i < n; i++)
      if (pthread_create(&t[i], NULL, job, &jobs[i])) return 0;
    job(&jobs[0]);
    double sum = jobs[0].rate;
    for (int i = 1; i < n; i++) {
      pthread_join(t[i], NULL);
      sum += jobs[i].rate;
    }
    if (round && sum > best) best = sum; /* round 0 warms up */
  }
  return best / 1e9;
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 2;
  if (n < 1 || n > 64) {
    fprintf(stderr, "usage: peak [THREADS]  (1 to 64)\n");
    return 2;
  }
  __builtin_cpu_init();
  wide = __builtin_cpu_supports("avx512f");
  if (!wide && !(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))) {
    fprintf(stderr, "peak: no AVX2 with FMA on this processor\n");
    return 1;
  }
  double r1 = rate(1), rn = n > 1 ? rate(n) : r1;
  printf("fma peak %s: %.1f GFLOP/s at 1 thread, %.1f at %d\n", wide ? "avx512" : "avx2", r1, rn, n);
  return 0;
}
