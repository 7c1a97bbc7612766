/* gemm.c: single-precision products at the shapes one Tree-LSTM training step runs
 * (E=H=256, a batch of 64 SST trees), timed through cblas_sgemm of whichever BLAS this
 * is linked with; bench/gemms builds it against each BLAS and prints them side by side.
 * GFLOP/s per shape (2mnk a product), the best of three timings of enough repetitions to
 * take 0.2 s, after a warm-up. Built with -DOWN it times libcavs's own product
 * (runtime/sgemm.c) instead, split over OWN_THREADS threads as the CPU backend splits a
 * product: by blocks of rows where C has at least as many rows as columns or too few
 * columns, else of columns (multiples of 16).
 * Built with -DXSMM it times LIBXSMM's libxsmm_sgemm (libxsmm-dev), one thread: a
 * column-major product, so C^T = op(B)^T op(A)^T with the operands swapped. */
#define _GNU_SOURCE
#ifdef OWN
#include "../runtime/sgemm.h"
#include <pthread.h>
#endif
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Row-major C[m,n] += op(A) op(B), as libcavs calls it (forms of cavs_abi.h). */
typedef struct Shape {
  const char *what;
  int ta, tb, m, n, k;
} Shape;
static const Shape shapes[] = {
    {"eager  x @ [Wi|Wf|Wo|Wu]   (rows with a word)", 0, 0, 1200, 1024, 256},
    {"path   hs @ [Ui|Uo|Uu]     (a low level)", 0, 0, 600, 768, 256},
    {"path   hs @ [Ui|Uo|Uu]     (a high level)", 0, 0, 32, 768, 256},
    {"path   h_k @ Uf            (a low level)", 0, 0, 600, 256, 256},
    {"path   h_k @ Uf            (a high level)", 0, 0, 32, 256, 256},
    {"bwd    dhs += d W^T        (a low level)", 0, 1, 600, 256, 768},
    {"bwd    dx += d W^T         (eager)", 0, 1, 1200, 256, 1024},
    {"bwd    dW += x^T d         (eager)", 1, 0, 256, 1024, 1200},
    {"bwd    dU += hs^T d        (all inner rows)", 1, 0, 256, 768, 2400},
    {"push   h @ Wc              (every row)", 0, 0, 4800, 5, 256},
    {"push   h @ Wc              (a level)", 0, 0, 160, 5, 256},
    {"bwd    dh += dz Wc^T       (every row)", 0, 1, 2400, 256, 5},
    {"bwd    dWc += h^T dz       (every row)", 1, 0, 256, 5, 2400},
};
/* `gemm treefc`: bench/treefc's products (H = 512, a minibatch of 64 complete trees of
   256 leaves): a level of inner vertices, [h_l; h_r] @ W and its two gradients, at the
   lowest level's 8192 rows and a higher one's 1024; operands larger than the caches at
   8192, as in the epoch */
static const Shape treefc_shapes[] = {
    {"fwd    [hl;hr] @ W         (lowest level)", 0, 0, 8192, 512, 1024},
    {"bwd    d[hl;hr] = d W^T    (lowest level)", 0, 1, 8192, 1024, 512},
    {"bwd    dW += [hl;hr]^T d   (lowest level)", 1, 0, 1024, 512, 8192},
    {"fwd    [hl;hr] @ W         (a higher level)", 0, 0, 1024, 512, 1024},
    {"bwd    d[hl;hr] = d W^T    (a higher level)", 0, 1, 1024, 1024, 512},
    {"bwd    dW += [hl;hr]^T d   (a higher level)", 1, 0, 1024, 512, 1024},
};

#ifdef OWN
typedef struct Part {
  int ta, tb, m, n, k, lda, ldb, i, parts;
  const float *a, *b;
  float *c;
} Part;

/* as the CPU backend runs it: fewer than 16 columns through cv_sgemm_narrow */
static void own(int ta, int tb, int m, int n, int k, const float *a, int lda, const float *b, int ldb, float *c,
                int ldc) {
  if (n < 16 && cv_sgemm_narrow(ta, tb, m, n, k, 1, a, lda, b, ldb, 1, c, ldc) == 0) return;
  cv_sgemm(ta, tb, m, n, k, 1, a, lda, b, ldb, 1, c, ldc);
}

static void *part(void *arg) {
  Part *p = arg;
  int by_rows = p->n < 32 * p->parts || p->m >= p->n, len = by_rows ? p->m : p->n;
  int per = ((len + p->parts - 1) / p->parts + 15) & ~15, at = p->i * per;
  if (at >= len) return NULL;
  int cnt = len - at < per ? len - at : per;
  if (by_rows)
    own(p->ta, p->tb, cnt, p->n, p->k, p->a + (size_t)at * (p->ta ? 1 : (size_t)p->lda), p->lda, p->b, p->ldb,
        p->c + (size_t)at * p->n, p->n);
  else
    own(p->ta, p->tb, p->m, cnt, p->k, p->a, p->lda, p->b + (size_t)at * (p->tb ? (size_t)p->ldb : 1), p->ldb,
        p->c + at, p->n);
  return NULL;
}

/* workers that live as long as the program, as libcavs's pool does: each product is
   two barriers, not thread starts */
static Part parts[16];
static int threads;
static pthread_barrier_t start, done;
static void *worker(void *arg) {
  for (;;) {
    pthread_barrier_wait(&start);
    part(arg);
    pthread_barrier_wait(&done);
  }
  return NULL;
}

static void product(int ta, int tb, int m, int n, int k, const float *a, int lda, const float *b, int ldb, float *c) {
  if (!threads) {
    threads = getenv("OWN_THREADS") ? atoi(getenv("OWN_THREADS")) : 1;
    if (threads < 1 || threads > 16) threads = 1;
    pthread_barrier_init(&start, NULL, (unsigned)threads);
    pthread_barrier_init(&done, NULL, (unsigned)threads);
    for (int i = 1; i < threads; i++) {
      pthread_t t;
      pthread_create(&t, NULL, worker, &parts[i]);
    }
  }
  for (int i = 0; i < threads; i++) parts[i] = (Part){ta, tb, m, n, k, lda, ldb, i, threads, a, b, c};
  if (threads > 1) pthread_barrier_wait(&start);
  part(&parts[0]);
  if (threads > 1) pthread_barrier_wait(&done);
}
#elif defined(XSMM)
#include <libxsmm.h>
static void product(int ta, int tb, int m, int n, int k, const float *a, int lda, const float *b, int ldb, float *c) {
  const char *tA = ta ? "T" : "N", *tB = tb ? "T" : "N";
  const float one = 1;
  const libxsmm_blasint M = n, N = m, K = k, LA = ldb, LB = lda, LC = n;
  libxsmm_sgemm(tB, tA, &M, &N, &K, &one, b, &LA, a, &LB, &one, c, &LC);
}
#else
static void product(int ta, int tb, int m, int n, int k, const float *a, int lda, const float *b, int ldb, float *c) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, 1, a, lda, b,
              ldb, 1, c, n);
}
#endif

/* `gemm moe [X [ROWS [F [shared]]]]`: one step's products of a two-layer feed-forward block over
   ROWS token slots (1280 tokens, K = 2: 2560), E = H = 256, as X experts of F hidden
   units each (ROWS / X slots an expert: the forward, the two weight gradients and the
   two input gradients of each expert's two matrices, every expert's matrices apart)
   against the dense block of the same products (F K hidden units over the tokens):
   seconds a step, the best of five rounds of 0.5 s, and their ratio. What the experts'
   grouping costs in the products alone, before any routing. With `shared` every expert
   runs over the first expert's matrices and rows: the same shapes with the operands in
   cache, to tell what their leaving it costs. */
static float *rnd(size_t n) {
  float *p = malloc(sizeof(float) * n);
  if (!p) exit(1);
  for (size_t i = 0; i < n; i++) p[i] = (float)rand() / RAND_MAX - 0.5f;
  return p;
}
/* a block's step: x[m,h] @ W1[h,f] -> r[m,f] @ W2[f,h] -> y; then dW2 += r^T dy, dr = dy
   W2^T, dW1 += x^T dr, dx = dr W1^T */
typedef struct Block {
  int m, h, f;
  float *x, *w1, *r, *w2, *y, *dw1, *dw2, *dr, *dx;
} Block;
static Block block(int m, int h, int f) {
  Block b = {m, h, f, rnd((size_t)m * h), rnd((size_t)h * f), rnd((size_t)m * f), rnd((size_t)f * h),
             rnd((size_t)m * h), rnd((size_t)h * f), rnd((size_t)f * h), rnd((size_t)m * f), rnd((size_t)m * h)};
  return b;
}
static void block_step(Block *b) {
  int m = b->m, h = b->h, f = b->f;
  product(0, 0, m, f, h, b->x, h, b->w1, f, b->r);
  product(0, 0, m, h, f, b->r, f, b->w2, h, b->y);
  product(1, 0, f, h, m, b->r, f, b->y, h, b->dw2);
  product(0, 1, m, f, h, b->y, h, b->w2, h, b->dr);
  product(1, 0, h, f, m, b->x, h, b->dr, f, b->dw1);
  product(0, 1, m, h, f, b->dr, f, b->w1, f, b->dx);
}
static double step_secs(Block *bs, int n) {
  double best = 1e30;
  for (int round = 0; round < 6; round++) {
    int reps = 0;
    double t0 = now(), t;
    do {
      for (int i = 0; i < n; i++) block_step(&bs[i]);
      reps++;
    } while ((t = now() - t0) < 0.5);
    if (round && t / reps < best) best = t / reps; /* round 0 warms up */
  }
  return best;
}
static int moe(int X, int rows, int F, int shared) {
  if (X < 1 || X > 1024 || rows < X || F < 1) return 2;
  int K = 2, H = 256;
  Block *ex = malloc(sizeof(Block) * (size_t)X), dense = block(rows / K, H, F * K);
  if (!ex) return 1;
  for (int e = 0; e < X; e++) ex[e] = shared && e ? ex[0] : block(rows / X, H, F);
  double te = step_secs(ex, X), td = step_secs(&dense, 1);
  double flop = 12.0 * rows / X * X * H * F;
  printf("%d experts of F=%d over %d slots (%d each%s): %.3f ms a step, %.1f GFLOP/s\n", X, F, rows, rows / X,
         shared ? ", one set of matrices" : "", te * 1e3, flop / te / 1e9);
  printf("dense F=%d over %d tokens: %.3f ms a step, %.1f GFLOP/s\n", F * K, rows / K, td * 1e3, flop / td / 1e9);
  printf("experts / dense: %.3f\n", te / td);
  return 0;
}

/* `gemm few [N K]` (own builds only): products of a few rows with op(B) transposed (a
   level's gradient times a parameter's transpose near a tree's root, or at batch size
   1), C[m, N] = A[m, K] B[N, K]^T for m = 1 to 16, through libcavs's few-rows kernel
   (cv_sgemm_small: B read in place, no packing) and through cblas_sgemm; N = 512, K =
   2048 unless given (E = H = 512: d[i|f|o|u] W^T) */
static int few(int n, int k) {
#ifdef OWN
  if (n < 1 || k < 1 || n > 8192 || k > 8192) return 2;
  float *a = malloc(sizeof(float) * 16 * (size_t)k), *b = malloc(sizeof(float) * (size_t)n * k),
        *c = calloc(16 * (size_t)n, sizeof(float));
  if (!a || !b || !c) return 1;
  for (long i = 0; i < 16L * k; i++) a[i] = (float)rand() / RAND_MAX - 0.5f;
  for (long i = 0; i < (long)n * k; i++) b[i] = (float)rand() / RAND_MAX - 0.5f;
  printf("%-20s %10s %10s\n", "m x n x k, B'", "own", "OpenBLAS");
  static const int ms[] = {1, 2, 3, 4, 6, 8, 12, 16};
  for (size_t s = 0; s < sizeof ms / sizeof *ms; s++) {
    int m = ms[s];
    double best[2] = {0, 0};
    for (int round = 0; round < 8; round++) {
      int w = round & 1, reps = 0;
      double t0 = now(), t;
      do {
        if (w) cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1, a, k, b, k, 1, c, n);
        else if (cv_sgemm_small(false, true, m, n, k, 1, a, k, b, k, 1, c, n)) return 1;
        reps++;
      } while ((t = now() - t0) < 0.1);
      double g = 2.0 * m * n * k * reps / t / 1e9;
      if (round > 1 && g > best[w]) best[w] = g; /* each one's first round warms up */
    }
    printf("%2d x %4d x %4d      %10.1f %10.1f\n", m, n, k, best[0], best[1]);
  }
  free(a);
  free(b);
  free(c);
  return 0;
#else
  (void)n, (void)k;
  fprintf(stderr, "gemm few: an own build's mode (-DOWN)\n");
  return 2;
#endif
}

int main(int argc, char **argv) {
  srand(1);
  if (argc > 1 && !strcmp(argv[1], "few")) return few(argc > 2 ? atoi(argv[2]) : 512, argc > 3 ? atoi(argv[3]) : 2048);
  if (argc > 1 && !strcmp(argv[1], "moe"))
    return moe(argc > 2 ? atoi(argv[2]) : 16, argc > 3 ? atoi(argv[3]) : 2560, argc > 4 ? atoi(argv[4]) : 256,
               argc > 5 && !strcmp(argv[5], "shared"));
  const Shape *table = shapes;
  size_t count = sizeof shapes / sizeof *shapes;
  if (argc > 1 && !strcmp(argv[1], "treefc"))
    table = treefc_shapes, count = sizeof treefc_shapes / sizeof *treefc_shapes;
  printf("%-48s %10s\n", "shape (m x n x k)", "GFLOP/s");
  for (size_t s = 0; s < count; s++) {
    int m = table[s].m, n = table[s].n, k = table[s].k, ta = table[s].ta, tb = table[s].tb;
    float *a = malloc(sizeof(float) * (size_t)m * k), *b = malloc(sizeof(float) * (size_t)k * n),
          *c = calloc((size_t)m * n, sizeof(float));
    if (!a || !b || !c) return 1;
    for (long i = 0; i < (long)m * k; i++) a[i] = (float)rand() / RAND_MAX - 0.5f;
    for (long i = 0; i < (long)k * n; i++) b[i] = (float)rand() / RAND_MAX - 0.5f;
    int lda = ta ? m : k, ldb = tb ? k : n;
    double best = 0;
    for (int round = 0; round < 4; round++) {
      int reps = 0;
      double t0 = now(), t;
      do {
        product(ta, tb, m, n, k, a, lda, b, ldb, c);
        reps++;
      } while ((t = now() - t0) < 0.2);
      double g = 2.0 * m * n * k * reps / t / 1e9;
      if (round && g > best) best = g; /* round 0 warms up */
    }
    printf("%-38s %4dx%4dx%4d %7.1f\n", table[s].what, m, n, k, best);
    free(a);
    free(b);
    free(c);
  }
  return 0;
}
