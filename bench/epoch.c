/* epoch.c: times training epochs of a generated model on a ptb-tree, text or cgf file,
 * without the driver: load, bind the vocabulary, then per minibatch forward, backward
 * and an Adam step, exactly what training does (or, with --infer, forward passes only).
 * Prints one line per run: the settings, seconds per epoch, graphs/s, the share of time
 * in matrix products, the products' GFLOP/s, and that against this machine's own sgemm
 * rate (measured once, on a large product: the floor that batching aims for); then
 * where the time went (products, row operations, fused loops, clears, optimizer,
 * scheduling, the rest), the process's peak memory and the page faults the epoch took
 * (its first touches of memory: the first epoch's, where buffers grow and the optimizer's
 * moments are mapped as first written; none after it).
 *
 *   bench/epoch [--policy bfs|depth|agenda|frontier|serial] [--batch 64] [--dim H=256] [--threads 2]
 *               [--epochs 1] [--limit N] [--infer] [--no-eager] [--no-lazy] [--no-views] [--no-homes]
 *               [--no-dedup] [--blas] [--optimizer adam|adagrad|sgd] MODEL FORMAT FILE
 * --no-eager and --no-lazy run those phases task by task, --no-views copies every
 * gather that a view would read in place, --no-homes every one that a child's loops
 * store at home, --no-dedup multiplies every looked-up row, a word as often as it
 * occurs (cavs_model_set_ablations);
 * --blas sends every product to the BLAS (cavs_model_opts.blas). The sgemm floor is
 * measured with the product the model uses: libcavs's own (runtime/sgemm.c, compiled
 * into this program for the purpose) or the BLAS's. products= says which kernels ran
 * and why: own(avx512) or own(avx2) (libcavs's products, in the instruction set the
 * processor has; few rows through its kernel in place), blas(--blas) or blas(no-avx2).
 * CAVS_GEMM=avx2 in the environment runs an AVX-512 processor as one without it.
 * MODEL is one of the models linked in (treelstm, treefc, lstm_lm, lstm_lm2, treegru, twotype, tagger, tagger_chars, childsum,
 * lattice_lstm, lattice_gru, seq2seq, mvrnn, nary_treelstm, moe_lm, moe_tree). */
#include "cavs.h"
#include "../generated/lstm_lm.h"
#include "../generated/lstm_lm2.h"
#include "../generated/treefc.h"
#include "../generated/treegru.h"
#include "../generated/treelstm.h"
#include "../generated/twotype.h"
#include "../generated/tagger.h"
#include "../generated/tagger_chars.h"
#include "../generated/childsum.h"
#include "../generated/lattice_lstm.h"
#include "../generated/lattice_gru.h"
#include "../generated/seq2seq.h"
#include "../generated/mvrnn.h"
#include "../generated/nary_treelstm.h"
#include "../generated/moe_lm.h"
#include "../generated/moe_tree.h"

#include "../runtime/sgemm.h"
#include "cpu_name.h"

#include <cblas.h>
#include <pthread.h>
#include <stdio.h>
#include <sys/resource.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

enum { FM = 2048, FN = 1024, FK = 256 };
typedef struct Floor {
  const float *a, *b;
  float *c;
  int i0, m, it;
} Floor;

/* one thread's rows of the floor's product, as libcavs's pool splits a product of more
   rows than columns */
static void *floor_part(void *arg) {
  Floor *f = arg;
  for (int i = 0; i < f->it; i++)
    cv_sgemm(false, false, f->m, FN, FK, 1, f->a + (size_t)f->i0 * FK, FK, f->b, FN, 0, f->c + (size_t)f->i0 * FN,
             FN);
  return NULL;
}

/* GFLOP/s of one large sgemm, the rate the batched products are measured against:
   through the BLAS with its threads, or libcavs's own product split by rows over as
   many threads. The operands hold values: left as calloc gives them, every page of A
   and B is the one zero page, and a product reading A in place (libcavs's) then reads
   one physical line through many addresses: 73-74 GFLOP/s at 1 thread on a Zen 3
   against 89 with values (OpenBLAS copies A and ran at 89 either way). */
static int run_threads = 1; /* the BLAS's threads for the run */
static double sgemm_rate(int own, int threads) {
  float *a = malloc(sizeof(float) * (size_t)FM * FK), *b = malloc(sizeof(float) * (size_t)FK * FN),
        *c = calloc((size_t)FM * FN, 4);
  if (!a || !b || !c) {
    free(a), free(b), free(c);
    return 0;
  }
  for (size_t i = 0; i < (size_t)FM * FK; i++) a[i] = (float)(i % 61) / 61 - 0.5f;
  for (size_t i = 0; i < (size_t)FK * FN; i++) b[i] = (float)(i % 67) / 67 - 0.5f;
  int it = 0;
  openblas_set_num_threads(threads); /* the floor of this count, whatever the run's */
  double t0 = now();
  while (now() - t0 < 0.5 || it < 2) {
    if (!own) cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, FM, FN, FK, 1, a, FK, b, FN, 0, c, FN);
    else {
      Floor f[16];
      pthread_t t[16];
      int parts = threads < 1 ? 1 : threads > 16 ? 16 : threads, per = (FM / parts + 15) & ~15;
      for (int p = 0; p < parts; p++) {
        f[p] = (Floor){a, b, c, p * per, p == parts - 1 ? FM - p * per : per, 1};
        if (p) pthread_create(&t[p], NULL, floor_part, &f[p]);
      }
      floor_part(&f[0]);
      for (int p = 1; p < parts; p++) pthread_join(t[p], NULL);
    }
    it++;
  }
  double r = 2.0 * FM * FN * FK * it / (now() - t0) / 1e9;
  openblas_set_num_threads(run_threads);
  free(a);
  free(b);
  free(c);
  return r;
}

int main(int argc, char **argv) {
  const char *policy = "bfs", *dimset[CAVS_MAX_DIMS], *optimizer = "adam";
  int ndimset = 0, batch = 64, threads = 2, epochs = 1, limit = 0, infer = 0, ablate = 0, blas = 0;
  int i = 1;
  for (; i < argc && argv[i][0] == '-'; i += 2) {
    int flag = !strcmp(argv[i], "--infer")      ? 1
               : !strcmp(argv[i], "--no-eager") ? 2
               : !strcmp(argv[i], "--no-lazy")  ? 3
               : !strcmp(argv[i], "--blas")     ? 4
               : !strcmp(argv[i], "--no-views") ? 5
               : !strcmp(argv[i], "--no-homes") ? 6
               : !strcmp(argv[i], "--no-dedup") ? 7
                                                : 0;
    if (flag) {
      if (flag == 1) infer = 1;
      else if (flag == 4) blas = 1;
      else
        ablate |= flag == 2   ? CAVS_NO_EAGER
                  : flag == 3 ? CAVS_NO_LAZY
                  : flag == 5 ? CAVS_NO_VIEWS
                  : flag == 6 ? CAVS_NO_HOMES
                              : CAVS_NO_DEDUP;
      i--;
      continue;
    }
    if (i + 1 >= argc) break;
    if (!strcmp(argv[i], "--policy")) policy = argv[i + 1];
    else if (!strcmp(argv[i], "--batch")) batch = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--epochs")) epochs = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--limit")) limit = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--optimizer")) optimizer = argv[i + 1];
    else if (!strcmp(argv[i], "--dim") && ndimset < CAVS_MAX_DIMS) dimset[ndimset++] = argv[i + 1];
    else {
      fprintf(stderr, "epoch: unknown option %s\n", argv[i]);
      return 1;
    }
  }
  if (argc - i != 3) {
    fprintf(stderr, "usage: epoch [options] MODEL FORMAT FILE\n");
    return 1;
  }
  const char *name = argv[i], *format = argv[i + 1], *path = argv[i + 2];
  const cavs_desc *descs[] = {&treelstm_desc, &treefc_desc, &lstm_lm_desc, &lstm_lm2_desc, &treegru_desc, &twotype_desc, &tagger_desc, &tagger_chars_desc, &childsum_desc, &lattice_lstm_desc,
                              &lattice_gru_desc, &seq2seq_desc, &mvrnn_desc, &nary_treelstm_desc,
                              &moe_lm_desc, &moe_tree_desc};
  const cavs_desc *d = NULL;
  for (size_t k = 0; k < sizeof descs / sizeof *descs; k++)
    if (!strcmp(descs[k]->name, name)) d = descs[k];
  if (!d) {
    fprintf(stderr, "epoch: no model %s linked in\n", name);
    return 1;
  }
  /* the floor is measured with the threads the model will be given */
  run_threads = threads;
  openblas_set_num_threads(threads);
  int own = !blas && cv_sgemm_usable();
  const char *genv = getenv("CAVS_GEMM");
  const char *products = blas                                ? "blas(--blas)"
                         : genv && !strcmp(genv, "blas")     ? "blas(CAVS_GEMM=blas)"
                         : own && !strcmp(cv_sgemm_small_isa(), "avx512") ? "own(avx512)"
                         : own                                             ? "own(avx2)"
                                                             : "blas(no-avx2)";
  double floor_rate = sgemm_rate(own, threads);
  /* the floor at one and at two threads too, whatever this run's count: the CPU's own
     numbers, printed with it on every line */
  double floor1 = threads == 1 ? floor_rate : sgemm_rate(own, 1), floor2 = threads == 2 ? floor_rate : sgemm_rate(own, 2);
  char cpu[256];
  cpu_name(cpu, sizeof cpu);
  long dims[CAVS_MAX_DIMS];
  cavs_dims_default(d, dims);
  for (int k = 0; k < ndimset; k++) {
    const char *eq = strchr(dimset[k], '=');
    for (int j = 0; eq && j < d->ndims; j++)
      if (strlen(d->dims[j].name) == (size_t)(eq - dimset[k]) && !strncmp(d->dims[j].name, dimset[k], (size_t)(eq - dimset[k])))
        dims[j] = atol(eq + 1);
  }
  char err[512];
  cavs_vocab *v = cavs_vocab_new();
  double t0 = now();
  cavs_dataset *ds = cavs_dataset_load(path, format, d, dims, v, 1, err, sizeof err);
  if (!ds) {
    fprintf(stderr, "%s\n", err);
    return 1;
  }
  double tload = now() - t0;
  for (int j = 0; j < d->ndims; j++) /* cgf: the ids used, as cavs train binds them */
    if (d->dims[j].kind == CAVS_DIM_VOCAB) {
      int mx = cavs_dataset_max_feature(ds, d->inputs[d->dims[j].input].slot);
      dims[j] = strcmp(format, "cgf") ? cavs_vocab_size(v) + 1 : mx + 1 > 1 ? mx + 1 : 1;
    }
  cavs_model_opts mo = {.backend = "cpu", .threads = threads, .blas = blas};
  cavs_model *m = cavs_model_new_opts(d, dims, &mo, err, sizeof err);
  if (!m) {
    fprintf(stderr, "%s\n", err);
    return 1;
  }
  cavs_model_init(m, 1);
  const char *pnames[] = {"bfs", "serial", "depth", "agenda", "frontier"};
  int pol = -1;
  for (int i = 0; i < 5; i++)
    if (!strcmp(policy, pnames[i])) pol = i; /* enum cavs_policy's order */
  if (pol < 0) {
    fprintf(stderr, "--policy: '%s' is not bfs, depth, agenda, frontier or serial\n", policy);
    return 1;
  }
  cavs_model_set_policy(m, pol);
  cavs_model_set_ablations(m, ablate);
  cavs_model_set_inference(m, infer);
  int n = cavs_dataset_count(ds);
  if (limit && limit < n) n = limit;
  const cavs_graph **gs = malloc(sizeof(cavs_graph *) * (size_t)batch);
  /* Adam by default, as cavs train; --optimizer adagrad is the hand-written anchor's */
  cavs_optim opt = {.kind = cavs_optim_kind(optimizer), .lr = cavs_optim_default_lr(cavs_optim_kind(optimizer))};
  if (opt.kind < 0) {
    fprintf(stderr, "epoch: unknown optimizer %s\n", optimizer);
    return 1;
  }
  for (int e = 0; e < epochs; e++) {
    double loss = 0;
    long count = 0, correct = 0, vertices = 0;
    int batches = 0;
    long tasks = 0, bound = 0;
    cavs_model_backend_stats(m, NULL, 1);
    struct rusage ru0;
    getrusage(RUSAGE_SELF, &ru0);
    double start = now();
    for (int b = 0; b < n; b += batch) {
      int k = n - b < batch ? n - b : batch;
      for (int j = 0; j < k; j++) {
        gs[j] = cavs_dataset_graph(ds, b + j);
        vertices += gs[j]->n;
      }
      cavs_stats st;
      if (cavs_model_forward(m, gs, k, &st)) {
        fprintf(stderr, "%s\n", cavs_model_error(m));
        return 1;
      }
      if (!infer) {
        cavs_model_backward(m);
        cavs_model_step(m, &opt);
      }
      loss += st.loss;
      tasks += st.tasks;
      bound += st.lower_bound;
      count += st.count;
      correct += st.correct;
      batches++;
    }
    double secs = now() - start;
    cavs_backend_stats bs;
    cavs_model_backend_stats(m, &bs, 0);
    double gsecs = bs.gemm_seconds, gflops = bs.gemm_flops;
    printf("%s %s policy=%s batch=%d", name, infer ? "infer" : "train", policy, batch);
    for (int j = 0; j < d->ndims; j++) printf(" %s=%ld", d->dims[j].name, dims[j]);
    printf(" threads=%d graphs=%d vertices=%ld load=%.2fs epoch=%.2fs graphs/s=%.0f loss=%.4f acc=%.4f", threads, n,
           vertices, tload, secs, n / secs, loss / batches, count ? (double)correct / (double)count : 0.0);
    printf(" gemm=%.0f%% gemm_gflops=%.1f overall_gflops=%.1f sgemm_floor=%.1f (%.0f%% of it) products=%s"
           " cpu=\"%s\" floor_1t=%.1f floor_2t=%.1f\n",
           100 * gsecs / secs, gflops / gsecs / 1e9, gflops / secs / 1e9, floor_rate,
           100 * gflops / secs / 1e9 / floor_rate, products, cpu, floor1, floor2);
    double other = secs - gsecs - bs.rows_seconds - bs.loop_seconds - bs.zero_seconds - bs.step_seconds -
                   bs.schedule_seconds - bs.grow_seconds;
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf("  time: products %.2fs, gathers/scatters/lookups/losses %.2fs (of which gathers and their backward "
           "%.2fs), fused loops %.2fs, clears %.2fs, optimizer %.2fs, scheduling %.2fs, growing buffers %.2fs, other %.2fs; %ld "
           "launches/batch; peak memory %.0f MB, %ld page faults; gathered rows %ld, %.1f%% in blocks, %.1f%% read in place (views), "
           "%.1f%% stored at home\n"
           "  batching: %.1f tasks/batch, lower bound %.1f/batch, scheduling %.1f%% of the epoch\n",
           gsecs, bs.rows_seconds, bs.gather_seconds, bs.loop_seconds, bs.zero_seconds, bs.step_seconds, bs.schedule_seconds, bs.grow_seconds, other,
           bs.launches / (batches ? batches : 1), ru.ru_maxrss / 1024.0, ru.ru_minflt - ru0.ru_minflt, bs.gathered_rows,
           bs.gathered_rows ? 100.0 * (double)bs.gathered_in_place / (double)bs.gathered_rows : 0.0,
           bs.gathered_rows ? 100.0 * (double)bs.gathered_viewed / (double)bs.gathered_rows : 0.0,
           bs.gathered_rows ? 100.0 * (double)bs.gathered_homed / (double)bs.gathered_rows : 0.0,
           (double)tasks / (batches ? batches : 1), (double)bound / (batches ? batches : 1),
           100 * bs.schedule_seconds / secs);
    fflush(stdout);
  }
  free(gs);
  cavs_model_free(m);
  cavs_dataset_free(ds);
  cavs_vocab_free(v);
  return 0;
}
