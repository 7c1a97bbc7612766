/* check_engine.c: the engine end to end. The committed generated/ code is exactly what
 * cavsc writes now; BFS batching gives the same loss and gradients as one vertex per task;
 * and the generated Tree-LSTM learns a toy treebank well beyond chance. */
#include "engine.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *examples[] = {"treelstm", "treefc", "lstm_lm", "lstm_lm2", "treegru", "twotype", "tagger", "tagger_chars", "childsum", "lattice_lstm", "lattice_gru", "seq2seq", "mvrnn", "nary_treelstm", "moe_lm", "moe_tree"};
enum { NEXAMPLES = sizeof examples / sizeof *examples };

/* generated/ matches the compiler, byte for byte: MODEL.h and MODEL.c from the C target,
 * the same MODEL.h and MODEL.cu from the CUDA target */
START_TEST(golden) {
  const char *top = tu_env("TOP_SRCDIR", ".");
  char *dir = tu_tmpdir();
  char src[256];
  snprintf(src, sizeof src, "dsl-examples/%s.vf", examples[_i]);
  const char *targets[][2] = {{"--target=c", "c"}, {"--target=cuda", "cu"}};
  for (int t = 0; t < 2; t++) {
    char *argv[] = {(char *)tu_env("CAVSC", "./cavsc"), (char *)targets[t][0], "-o", dir, src, NULL};
    RunResult r = tu_run(top, argv, 30);
    ck_assert_msg(r.status == 0, "%s", r.err);
    tu_free(&r);
    const char *ext[] = {"h", targets[t][1]};
    for (int k = 0; k < 2; k++) {
      char a[4400], b[4400];
      snprintf(a, sizeof a, "%s/%s.%s", dir, examples[_i], ext[k]);
      snprintf(b, sizeof b, "%s/generated/%s.%s", top, examples[_i], ext[k]);
      char *now = tu_slurp(a, NULL), *kept = tu_slurp(b, NULL);
      ck_assert_msg(kept != NULL, "%s is missing: run `make generated`", b);
      ck_assert_msg(!strcmp(now, kept), "%s differs from what cavsc %s writes now: run `make generated`", b,
                    targets[t][0]);
      free(now);
      free(kept);
      unlink(a);
    }
  }
  rmdir(dir);
  free(dir);
}
END_TEST

/* BFS batching against one vertex at a time (CAVS_SERIAL, in every phase): same loss,
 * same gradients. In double on trees and random DAGs, to 1e-11; in float on trees, to
 * 1e-4 relative: one row is a matrix-vector product (gemv, ger) and a batch a matrix
 * product, whose sums run in other orders, and float keeps seven digits (in float, a DAG's
 * many paths let rounding differ more still: the double run shows it is only that). */
/* Batched against one vertex a task (ablate 0), or against the eager and lazy phases
 * run task by task (ablate: enum cavs_ablation). */
/* The batched side under `policy`; with `mixed`, every vertex's type drawn at random
 * (for models whose types all take children). */
static void batched_vs_policy(const char *file, const char *prec, bool dags, double tol, int ablate, int policy,
                              bool mixed) {
  const cavs_desc *d = load_model(file, prec);
  bool dbl = !strcmp(prec, "double");
  long dims[CAVS_MAX_DIMS];
  static TGraph g[TG_MINIBATCH];
  const cavs_graph *gs[TG_MINIBATCH];
  int k_graphs = tg_minibatch(d, dims, g, gs, dags);
  unsigned seed = 31;
  for (int i = 0; mixed && i < k_graphs; i++)
    for (int v = 0; v < g[i].g.n; v++) g[i].type[v] = (int)(tg_rand(&seed) % (unsigned)d->nvertex);
  cavs_model *a = new_model(d, dims, 5), *b = new_model(d, dims, 5);
  cavs_model_set_policy(a, policy);
  if (ablate) cavs_model_set_ablations(b, ablate);
  else cavs_model_set_policy(b, CAVS_SERIAL);
  cavs_stats sa, sb;
  ck_assert(cavs_model_forward(a, gs, k_graphs, &sa) == 0);
  ck_assert(cavs_model_forward(b, gs, k_graphs, &sb) == 0);
  ck_assert_msg(ablate || sb.tasks > sa.tasks, "serial ran %d tasks, batched %d", sb.tasks, sa.tasks);
  ck_assert_msg(fabs(sa.loss - sb.loss) <= tol * fabs(sa.loss), "%s: loss %.12g vs %.12g", file, sa.loss, sb.loss);
  ck_assert_int_eq(sa.correct, sb.correct);
  cavs_model_backward(a);
  cavs_model_backward(b);
  size_t n;
  const void *pa = cavs_model_grads_flat(a, &n), *pb = cavs_model_grads_flat(b, &n);
#define G(p, i) (dbl ? ((const double *)(p))[i] : (double)((const float *)(p))[i])
  double scale = 0;
  for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs(G(pa, i)));
  ck_assert(scale > 0);
  for (size_t i = 0; i < n; i++)
    ck_assert_msg(fabs(G(pa, i) - G(pb, i)) <= tol * fmax(fabs(G(pa, i)), 1e-2 * scale), "%s: gradient %zu: %.12g vs %.12g",
                  file, i, G(pa, i), G(pb, i));
#undef G
  cavs_model_free(a);
  cavs_model_free(b);
}
static void batched_vs(const char *file, const char *prec, bool dags, double tol, int ablate) {
  batched_vs_policy(file, prec, dags, tol, ablate, CAVS_BFS, false);
}

START_TEST(batched_equals_serial) {
  char file[64];
  snprintf(file, sizeof file, "%s.vf", examples[_i]);
  batched_vs(file, "float", false, 1e-4, 0);
}
END_TEST

START_TEST(batched_equals_serial_dags) {
  char file[64];
  snprintf(file, sizeof file, "%s.vf", examples[_i]);
  batched_vs(file, "double", true, 1e-11, 0);
}
END_TEST

/* Every batching policy computes what one vertex at a time does (in double, on trees
 * and DAGs); on a model of two types that both take children, with types drawn at
 * random, agenda and frontier make tasks that hold a type's vertices without children
 * and some with (its first), which the rows must put first. */
static const char *mixed_model =
    "model mix; dim H = 4; dim C = 3; input y : class[C]; input f : real[H];\n"
    "param Wa[2H,H], Wb[2H,H], Wc[H,C] init uniform(-1, 1);\n"
    "vertex a (children 2) { h = tanh(f + concat(gather(0), gather(1)) @ Wa); scatter(h); push(h); }\n"
    "vertex b (children 2) { u = concat(gather(0), gather(1)) @ Wb; h = sigmoid(f * u) - 0.5; scatter(h); push(h); }\n"
    "push (p) { loss softmax_xent(p @ Wc, y); }\n";
static const int policies[] = {CAVS_BFS, CAVS_DEPTH, CAVS_AGENDA, CAVS_FRONTIER};

START_TEST(policies_equal_serial) {
  char file[64];
  snprintf(file, sizeof file, "%s.vf", examples[_i]);
  for (int p = 1; p < 4; p++) batched_vs_policy(file, "double", true, 1e-11, 0, policies[p], false);
}
END_TEST

START_TEST(policies_equal_serial_mixed_types) {
  for (int p = 0; p < 4; p++) batched_vs_policy(mixed_model, "double", true, 1e-11, 0, policies[p], true);
}
END_TEST

/* --no-eager and --no-lazy change where those phases run, not what they compute. */
START_TEST(ablations_change_nothing) {
  char file[64];
  snprintf(file, sizeof file, "%s.vf", examples[_i]);
  batched_vs(file, "double", true, 1e-11, CAVS_NO_EAGER | CAVS_NO_LAZY);
  batched_vs(file, "double", true, 1e-11, CAVS_NO_EAGER);
}
END_TEST

/* Nor do --no-fuse, --no-merge, --no-homes and --no-push-view (each elementwise node a
 * loop of its own; no merged or stacked products; no state stored at home, every gather
 * a copy; the pushed rows copied to a buffer of their own): the loss and every gradient
 * of a minibatch, in double. */
START_TEST(build_ablations_change_nothing) {
  char file[64];
  snprintf(file, sizeof file, "%s.vf", examples[_i]);
  const cavs_desc *ref = load_model(file, "double");
  long dims[CAVS_MAX_DIMS];
  static TGraph g[TG_MINIBATCH];
  const cavs_graph *gs[TG_MINIBATCH];
  int k = tg_minibatch(ref, dims, g, gs, true);
  const char *flags[] = {"--no-fuse", "--no-merge", "--no-homes", "--no-push-view"};
  for (int f = 0; f < 4; f++) {
    const cavs_desc *d = load_model_with(file, "double", "c", flags[f]);
    ck_assert_msg(d != ref, "%s %s: loaded the build without it (the suite's store)", file, flags[f]);
    cavs_model *a = new_model(ref, dims, 5), *b = new_model(d, dims, 5);
    cavs_stats sa, sb;
    ck_assert(cavs_model_forward(a, gs, k, &sa) == 0 && cavs_model_forward(b, gs, k, &sb) == 0);
    ck_assert_msg(fabs(sa.loss - sb.loss) <= 1e-12 * fabs(sa.loss), "%s %s: loss %.15g vs %.15g", file, flags[f],
                  sa.loss, sb.loss);
    cavs_model_backward(a);
    cavs_model_backward(b);
    for (int i = 0; i < ref->nparams; i++) {
      /* merged, a parameter is a column range of a wider block: its own stride */
      long rows, cols, lda, ldb;
      const double *ga = cavs_model_grad(a, i, &rows, &cols, &lda), *gb = cavs_model_grad(b, i, &rows, &cols, &ldb);
      for (long r = 0; r < rows; r++)
        for (long j = 0; j < cols; j++) {
          double x = ga[r * lda + j], y = gb[r * ldb + j];
          if (fabs(x - y) > 1e-10 * fmax(fabs(x), 1e-6))
            ck_abort_msg("%s %s: gradient of %s[%ld, %ld]: %.15g vs %.15g", file, flags[f], ref->params[i].name, r, j,
                         x, y);
        }
    }
    cavs_model_free(a);
    cavs_model_free(b);
  }
}
END_TEST

/* Data parallelism's arithmetic (cavs_model_set_loss_counts): a minibatch run in two
 * parts, each on a model of the same parameters told the rows each loss counted over the
 * whole, gives gradients that sum to the whole minibatch's (1e-11 in double; a lookup
 * table's rows a part did not touch are zero in its model). Without the counts they do
 * not (each part's mean over its own rows). A count below the part's own is refused.
 * On every example and on a model of two losses, one a regression. A mixture of
 * experts' load-balancing loss is a product of two means over the rows routed, which
 * no sum of the parts' gives: it is off here (option balance 0), and
 * parts_balance_to_the_whole below gives each part the whole's sums. */
static const char *two_losses =
    "model two; dim H = 4; dim C = 3; input y : class[C]; input f : real[H]; input t : real[2];\n"
    "param Wa[2H,H], Wc[H,C], Wr[H,2] init uniform(-1, 1);\n"
    "vertex a (children 2) { h = tanh(f + concat(gather(0), gather(1)) @ Wa); scatter(h); push(h); }\n"
    "push (p) { loss softmax_xent(p @ Wc, y); loss mse(p @ Wr, t); }\n";

static double max_gap(const cavs_desc *d, cavs_model *whole, cavs_model *p1, cavs_model *p2, int *at) {
  double worst = 0;
  for (int i = 0; i < d->nparams; i++) {
    long rows, cols, ld, ld1, ld2;
    const double *g = cavs_model_grad(whole, i, &rows, &cols, &ld), *g1 = cavs_model_grad(p1, i, &rows, &cols, &ld1),
                 *g2 = cavs_model_grad(p2, i, &rows, &cols, &ld2);
    for (long r = 0; r < rows; r++)
      for (long j = 0; j < cols; j++) {
        double x = g[r * ld + j], y = g1[r * ld1 + j] + g2[r * ld2 + j];
        double gap = fabs(x - y) / fmax(fabs(x), 1e-6);
        if (gap > worst) worst = gap, *at = i;
      }
  }
  return worst;
}

/* A model of d with its balancing loss's weight `balance` (where it has one) */
static cavs_model *balanced_model(const cavs_desc *d, const long *dims, double balance) {
  cavs_model *m = new_model(d, dims, 9);
  if (cavs_option_find(d, "balance") >= 0) ck_assert_int_eq(cavs_model_set_option(m, "balance", balance), 0);
  return m;
}
static cavs_model *unbalanced_model(const cavs_desc *d, const long *dims) { return balanced_model(d, dims, 0); }

/* A model of d (balancing at `balance`) through forward and backward passes of
   gs[0..k): the whole minibatch; counts[0..8) its losses' row counts (0 past the
   model's) */
static cavs_model *whole_pass(const cavs_desc *d, const long *dims, const cavs_graph **gs, int k, long counts[8],
                              double balance) {
  cavs_model *whole = balanced_model(d, dims, balance);
  cavs_stats st;
  ck_assert_int_eq(cavs_model_forward(whole, gs, k, &st), 0);
  cavs_model_backward(whole);
  int nl;
  const cavs_loss_acc *acc = cavs_model_losses(whole, &nl);
  ck_assert(nl <= 8);
  for (int l = 0; l < 8; l++) counts[l] = l < nl ? acc[l].count : 0;
  return whole;
}

static void parts_sum_to_whole(const char *file) {
  const cavs_desc *d = load_model(file, "double");
  long dims[CAVS_MAX_DIMS];
  static TGraph g[TG_MINIBATCH];
  const cavs_graph *gs[TG_MINIBATCH];
  int k = tg_minibatch(d, dims, g, gs, true), h = k / 2;
  long counts[8];
  cavs_model *whole = whole_pass(d, dims, gs, k, counts, 0);
  cavs_stats st;
  for (int told = 1; told >= 0; told--) {
    cavs_model *p1 = unbalanced_model(d, dims), *p2 = unbalanced_model(d, dims);
    ck_assert_int_eq(cavs_model_forward(p1, gs, h, &st), 0);
    if (told) ck_assert_int_eq(cavs_model_set_loss_counts(p1, counts), 0);
    cavs_model_backward(p1);
    ck_assert_int_eq(cavs_model_forward(p2, gs + h, k - h, &st), 0);
    if (told) ck_assert_int_eq(cavs_model_set_loss_counts(p2, counts), 0);
    cavs_model_backward(p2);
    int at = -1;
    double gap = max_gap(d, whole, p1, p2, &at);
    if (told) ck_assert_msg(gap <= 1e-11, "%s: the parts' gradient of %s is %.3g off the whole's", file,
                            d->params[at].name, gap);
    else ck_assert_msg(gap > 1e-6, "%s: the parts' own means sum to the whole's", file);
    if (told) {
      /* refused: fewer rows than the part counted (when it counted any) */
      const cavs_loss_acc *a1 = cavs_model_losses(p1, NULL);
      long few[8] = {0};
      few[0] = a1[0].count - 1;
      if (a1[0].count > 1) {
        ck_assert_int_eq(cavs_model_set_loss_counts(p1, few), -1);
        ck_assert_msg(strstr(cavs_model_error(p1), "fewer than"), "%s", cavs_model_error(p1));
      }
    }
    cavs_model_free(p1);
    cavs_model_free(p2);
  }
  cavs_model_free(whole);
}

START_TEST(parts_sum_to_the_whole) {
  char file[64];
  snprintf(file, sizeof file, "%s.vf", examples[_i]);
  parts_sum_to_whole(file);
}
END_TEST

START_TEST(parts_sum_to_the_whole_two_losses) { parts_sum_to_whole(two_losses); }
END_TEST

/* The load-balancing loss over parts (cavs_model_balance, cavs_model_set_balance): each
 * part told the whole's sums of every routing, beside its losses' counts, gives gradients
 * that sum to the whole minibatch's at a weight (0.5) where the loss moves the gate; told
 * the counts alone they do not. The parts' sums are read before either part's backward
 * pass; a sum that cannot be the whole's and a set after the backward pass are refused. */
START_TEST(parts_balance_to_the_whole) {
  const char *file = _i ? "moe_tree.vf" : "moe_lm.vf";
  const cavs_desc *d = load_model(file, "double");
  long dims[CAVS_MAX_DIMS];
  static TGraph g[TG_MINIBATCH];
  const cavs_graph *gs[TG_MINIBATCH];
  int k = tg_minibatch(d, dims, g, gs, true), h = k / 2;
  long counts[8];
  cavs_model *whole = whole_pass(d, dims, gs, k, counts, 0.5);
  cavs_stats st;
  for (int told = 1; told >= 0; told--) {
    cavs_model *p[2] = {balanced_model(d, dims, 0.5), balanced_model(d, dims, 0.5)};
    ck_assert_int_eq(cavs_model_forward(p[0], gs, h, &st), 0);
    ck_assert_int_eq(cavs_model_forward(p[1], gs + h, k - h, &st), 0);
    long X = cavs_model_balance(p[0], 0, NULL, 0);
    ck_assert_msg(X > 1, "%s: routing 0 balanced %ld experts", file, X);
    ck_assert_int_eq(cavs_model_balance(p[1], 0, NULL, 0), X);
    ck_assert_int_eq(cavs_model_balance(p[0], 1, NULL, 0), 0); /* (one routing) */
    ck_assert_int_eq(cavs_model_balance(p[0], -1, NULL, 0), -1);
    double *v[2], *sum = calloc((size_t)(2 * X + 1), sizeof *sum);
    for (int q = 0; q < 2; q++) {
      v[q] = calloc((size_t)(2 * X + 1), sizeof **v);
      ck_assert_int_eq(cavs_model_balance(p[q], 0, v[q], 2 * X + 1), X);
      for (long j = 0; j < 2 * X + 1; j++) sum[j] += v[q][j];
    }
    /* the whole's sums as one pass counts them */
    double *w = calloc((size_t)(2 * X + 1), sizeof *w);
    cavs_model *again = balanced_model(d, dims, 0.5);
    ck_assert_int_eq(cavs_model_forward(again, gs, k, &st), 0);
    ck_assert_int_eq(cavs_model_balance(again, 0, w, 2 * X + 1), X);
    for (long j = 0; j < 2 * X + 1; j++)
      ck_assert_msg(fabs(w[j] - sum[j]) <= 1e-12 * fmax(1, fabs(w[j])), "%s: the parts' sum %ld is %.17g, the whole's %.17g",
                    file, j, sum[j], w[j]);
    cavs_model_free(again);
    if (told) { /* refused: sums that cannot be the whole's */
      double *bad = malloc(sizeof *bad * (size_t)(2 * X + 1));
      const char *want[] = {"rows in all", "slots in all", "summed probability", "do not add up", "experts, not"};
      for (int c = 0; c < 5; c++) {
        memcpy(bad, sum, sizeof *bad * (size_t)(2 * X + 1));
        if (c == 0) bad[0] = v[0][0] - 1;
        if (c == 1) bad[1] = v[0][1] - 1;
        if (c == 2) bad[X + 1] = NAN;
        if (c == 3) bad[1] += 1;
        ck_assert_int_eq(cavs_model_set_balance(p[0], 0, bad, c == 4 ? X + 1 : X), -1);
        ck_assert_msg(strstr(cavs_model_error(p[0]), want[c]), "%s: %s", file, cavs_model_error(p[0]));
      }
      free(bad);
    }
    for (int q = 0; q < 2; q++) {
      ck_assert_int_eq(cavs_model_set_loss_counts(p[q], counts), 0);
      if (told) ck_assert_int_eq(cavs_model_set_balance(p[q], 0, sum, X), 0);
      cavs_model_backward(p[q]);
    }
    int at = -1;
    double gap = max_gap(d, whole, p[0], p[1], &at);
    if (told) {
      ck_assert_msg(gap <= 1e-11, "%s: the balanced parts' gradient of %s is %.3g off the whole's", file,
                    d->params[at].name, gap);
      ck_assert_int_eq(cavs_model_set_balance(p[0], 0, sum, X), -1); /* (after its backward pass) */
      ck_assert_msg(strstr(cavs_model_error(p[0]), "ran no load-balancing loss"), "%s", cavs_model_error(p[0]));
    } else
      ck_assert_msg(gap > 1e-6, "%s: the parts' own balancing sums to the whole's", file);
    for (int q = 0; q < 2; q++) free(v[q]), cavs_model_free(p[q]);
    free(sum), free(w);
  }
  cavs_model_free(whole);
}
END_TEST

/* ---- the gradient hook (data parallelism's overlap) ---- */

typedef struct HookSeen {
  const double *flat;
  size_t nflat;
  int ngroups, ticks, calls;
  int *at;         /* [group]: the tick it came at (-1: not yet) */
  double **snap;   /* [group]: its gradient then */
  const double **where;
  size_t *count;
} HookSeen;

static void seen_hook(void *arg, int g, void *grad, size_t count) {
  HookSeen *h = arg;
  h->calls++;
  if (g < 0) {
    ck_assert(grad == NULL && count == 0);
    h->ticks++;
    return;
  }
  ck_assert_msg(g < h->ngroups && h->at[g] < 0, "group %d came twice in one pass", g);
  h->at[g] = h->ticks;
  const double *p = grad;
  ck_assert_msg(p >= h->flat && p + count <= h->flat + h->nflat, "group %d's gradient outside the model's", g);
  h->snap[g] = malloc(sizeof(double) * (count + 1));
  memcpy(h->snap[g], grad, sizeof(double) * count);
  h->where[g] = p, h->count[g] = count;
}

/* cavs_model_set_grad_hook: every parameter group comes once a backward pass, and its
 * gradient then is its gradient once the pass is over (nothing adds to it after its
 * last writer, as the descriptor's flags say); a tick between every two steps; the
 * groups that the first backward stages finish (the push block's products in a model
 * whose push block has parameters) come before the pass's last step. Two passes (the
 * second from gradients the first step left), one and two threads. */
START_TEST(grad_hook_says_final) {
  char file[64];
  snprintf(file, sizeof file, "%s.vf", examples[_i]);
  const cavs_desc *d = load_model(file, "double");
  long dims[CAVS_MAX_DIMS];
  static TGraph g[TG_MINIBATCH];
  const cavs_graph *gs[TG_MINIBATCH];
  int k = tg_minibatch(d, dims, g, gs, true);
  for (int threads = 1; threads <= 2; threads++) {
    char err[512];
    cavs_model *m = cavs_model_new_opts(d, dims, &(cavs_model_opts){.backend = "cpu", .threads = threads}, err, sizeof err);
    ck_assert_msg(m != NULL, "%s", err);
    cavs_model_init(m, 3);
    HookSeen h = {.ngroups = d->npgroups};
    h.flat = cavs_model_grads_flat(m, &h.nflat);
    h.at = malloc(sizeof(int) * ((size_t)d->npgroups + 1));
    h.snap = calloc((size_t)d->npgroups + 1, sizeof *h.snap);
    h.where = calloc((size_t)d->npgroups + 1, sizeof *h.where);
    h.count = calloc((size_t)d->npgroups + 1, sizeof *h.count);
    cavs_model_set_grad_hook(m, seen_hook, &h);
    for (int pass = 0; pass < 2; pass++) {
      h.ticks = h.calls = 0;
      for (int i = 0; i < d->npgroups; i++) h.at[i] = -1;
      ck_assert_msg(cavs_model_forward(m, gs, k, NULL) == 0, "%s", cavs_model_error(m));
      ck_assert_int_eq(h.calls, 0); /* (not in a forward pass) */
      cavs_model_backward(m);
      ck_assert(h.ticks > 2);
      bool early = false, push_params = false;
      size_t total = 0;
      for (int i = 0; i < d->npgroups; i++) {
        ck_assert_msg(h.at[i] >= 0, "%s: group %d never came", file, i);
        size_t n = h.count[i];
        const double *now = h.where[i];
        total += n;
        for (size_t j = 0; j < n; j++)
          ck_assert_msg(now[j] == h.snap[i][j], "%s: group %d's gradient changed after it came (element %zu: %g, then %g)",
                        file, i, j, h.snap[i][j], now[j]);
        free(h.snap[i]);
        h.snap[i] = NULL;
        early = early || h.at[i] < h.ticks - 1;
        push_params = push_params || (d->push_grads[i] && d->pgroups[i].sparse_input < 0);
      }
      if (push_params) ck_assert_msg(early, "%s: every group came at the pass's end", file);
      ck_assert_msg(total <= h.nflat, "%s: the groups hold %zu of the %zu gradients", file, total, h.nflat);
      cavs_optim o = {.kind = CAVS_SGD, .lr = 0.1};
      ck_assert_msg(cavs_model_step(m, &o) == 0, "%s", cavs_model_error(m));
    }
    cavs_model_set_grad_hook(m, NULL, NULL);
    ck_assert(cavs_model_forward(m, gs, k, NULL) == 0);
    int calls = h.calls;
    cavs_model_backward(m);
    ck_assert_int_eq(h.calls, calls);
    free(h.at), free(h.snap), free(h.where), free(h.count);
    cavs_model_free(m);
  }
}
END_TEST

/* Sums part b's gradients into part a's and the reverse, after each has added the other's
   table rows to its own (with `touch`), as an allreduce would leave them */
static void exchange(const cavs_desc *d, cavs_model *a, cavs_model *b, bool touch) {
  for (int i = 0; i < d->nparams; i++) {
    const int *ra, *rb;
    int na = cavs_model_touched_rows(a, i, &ra), nb = cavs_model_touched_rows(b, i, &rb);
    if (touch && na >= 0) {
      int *copy = malloc(sizeof(int) * (size_t)(na + 1));
      memcpy(copy, ra, sizeof(int) * (size_t)na);
      ck_assert_int_eq(cavs_model_touch_rows(a, i, rb, nb), 0);
      ck_assert_int_eq(cavs_model_touch_rows(b, i, copy, na), 0);
      free(copy);
    }
    long rows, cols, lda, ldb;
    double *ga = cavs_model_grad(a, i, &rows, &cols, &lda), *gb = cavs_model_grad(b, i, &rows, &cols, &ldb);
    for (long r = 0; r < rows; r++)
      for (long j = 0; j < cols; j++) ga[r * lda + j] = gb[r * ldb + j] = ga[r * lda + j] + gb[r * ldb + j];
  }
}

/* A step after the exchange: two parts' models, each stepping on the summed gradients
 * over the union of the table rows the parts read, hold the parameters one model holds
 * after a step over the whole minibatch (1e-12 in double; SGD and lazy Adam); without
 * the union, the rows only the other part read are left behind. A dense parameter has
 * no touched rows; a row out of range is refused. */
START_TEST(parts_step_as_the_whole) {
  const cavs_desc *d = load_model("treelstm.vf", "double");
  long dims[CAVS_MAX_DIMS];
  static TGraph g[TG_MINIBATCH];
  const cavs_graph *gs[TG_MINIBATCH];
  int k = tg_minibatch(d, dims, g, gs, true), h = k / 2, emb = -1;
  /* words from a vocabulary of 500: the parts read rows the other does not */
  unsigned seed = 5;
  dims[find_dim(d, "V")] = 500;
  for (int i = 0; i < k; i++) tg_features(&g[i], d, dims, &seed);
  for (int i = 0; i < d->nparams; i++)
    if (!strcmp(d->params[i].name, "emb")) emb = i;
  ck_assert_int_ge(emb, 0);
  const cavs_optim opts[] = {{.kind = CAVS_SGD, .lr = 0.5}, {.kind = CAVS_ADAM, .lr = 0.01}};
  for (int o = 0; o < 2; o++)
    for (int touch = 1; touch >= 0; touch--) {
      cavs_model *whole = new_model(d, dims, 9), *a = new_model(d, dims, 9), *b = new_model(d, dims, 9);
      cavs_stats st;
      ck_assert_int_eq(cavs_model_forward(whole, gs, k, &st), 0);
      cavs_model_backward(whole);
      long counts[1] = {cavs_model_losses(whole, NULL)[0].count};
      ck_assert_int_eq(cavs_model_forward(a, gs, h, &st), 0);
      ck_assert_int_eq(cavs_model_set_loss_counts(a, counts), 0);
      cavs_model_backward(a);
      ck_assert_int_eq(cavs_model_forward(b, gs + h, k - h, &st), 0);
      ck_assert_int_eq(cavs_model_set_loss_counts(b, counts), 0);
      cavs_model_backward(b);
      const int *rw, *ra;
      int nw = cavs_model_touched_rows(whole, emb, &rw), na = cavs_model_touched_rows(a, emb, &ra);
      ck_assert_msg(nw > na && na > 0, "the parts read %d and the whole %d rows of emb", na, nw);
      exchange(d, a, b, touch);
      if (touch) ck_assert_int_eq(cavs_model_touched_rows(a, emb, &ra), nw);
      ck_assert(cavs_model_step(whole, &opts[o]) == 0 && cavs_model_step(a, &opts[o]) == 0 &&
                cavs_model_step(b, &opts[o]) == 0);
      double worst = 0;
      for (int i = 0; i < d->nparams; i++) {
        long rows, cols, ldw, lda, ldb;
        const double *pw = cavs_model_param(whole, i, &rows, &cols, &ldw), *pa = cavs_model_param(a, i, &rows, &cols, &lda),
                     *pb = cavs_model_param(b, i, &rows, &cols, &ldb);
        for (long r = 0; r < rows; r++)
          for (long j = 0; j < cols; j++) {
            if (touch) ck_assert(pa[r * lda + j] == pb[r * ldb + j]);
            worst = fmax(worst, fabs(pa[r * lda + j] - pw[r * ldw + j]) / fmax(fabs(pw[r * ldw + j]), 1e-3));
          }
      }
      if (touch) ck_assert_msg(worst <= 1e-12, "%s: the parts' step is %.3g off the whole's", opts[o].kind ? "adam" : "sgd", worst);
      else ck_assert_msg(worst > 1e-6, "%s: without the union the parts step as the whole", opts[o].kind ? "adam" : "sgd");
      cavs_model_free(whole);
      cavs_model_free(a);
      cavs_model_free(b);
    }
  cavs_model *m = new_model(d, dims, 9);
  const int *r;
  int bad = 1 << 30;
  ck_assert_int_eq(cavs_model_touched_rows(m, emb == 0 ? 1 : 0, &r), -1);
  ck_assert_int_eq(cavs_model_touch_rows(m, emb == 0 ? 1 : 0, &bad, 1), -1);
  ck_assert_int_eq(cavs_model_touch_rows(m, emb, &bad, 1), -1);
  ck_assert_msg(strstr(cavs_model_error(m), "out of range"), "%s", cavs_model_error(m));
  cavs_model_free(m);
}
END_TEST

/* Train the generated Tree-LSTM on a toy treebank; test on held-out trees. */
START_TEST(treelstm_learns) {
  const cavs_desc *d = load_model("treelstm.vf", "float");
  char *dir = tu_tmpdir(), train[4200], test[4200];
  snprintf(train, sizeof train, "%s/train.txt", dir);
  snprintf(test, sizeof test, "%s/test.txt", dir);
  FILE *f = fopen(train, "w");
  ck_assert(cavs_gen_toy(f, 800, 10, 24, 1) == 0);
  fclose(f);
  f = fopen(test, "w");
  ck_assert(cavs_gen_toy(f, 200, 10, 24, 2) == 0);
  fclose(f);
  long dims[CAVS_MAX_DIMS];
  cavs_dims_default(d, dims);
  dims[find_dim(d, "E")] = 16;
  dims[find_dim(d, "H")] = 32;
  char err[512];
  cavs_vocab *v = cavs_vocab_new();
  cavs_dataset *tr = cavs_dataset_load(train, "ptb-tree", d, dims, v, 1, err, sizeof err);
  ck_assert_msg(tr != NULL, "%s", err);
  cavs_dataset *te = cavs_dataset_load(test, "ptb-tree", d, dims, v, 0, err, sizeof err);
  ck_assert_msg(te != NULL, "%s", err);
  dims[find_dim(d, "V")] = cavs_vocab_size(v);
  cavs_model *m = new_model(d, dims, 3);
  cavs_optim opt = {.kind = CAVS_ADAM, .lr = 0.01};
  const cavs_graph *gs[32];
  for (int epoch = 0; epoch < 8; epoch++)
    for (int b = 0; b < cavs_dataset_count(tr); b += 32) {
      int k = 0;
      for (; k < 32 && b + k < cavs_dataset_count(tr); k++) gs[k] = cavs_dataset_graph(tr, b + k);
      cavs_stats st;
      ck_assert(cavs_model_forward(m, gs, k, &st) == 0);
      cavs_model_backward(m);
      cavs_model_step(m, &opt);
    }
  long count = 0, correct = 0, rc = 0, rcorrect = 0, majority[5] = {0};
  for (int b = 0; b < cavs_dataset_count(te); b += 32) {
    int k = 0;
    for (; k < 32 && b + k < cavs_dataset_count(te); k++) {
      gs[k] = cavs_dataset_graph(te, b + k);
      for (int i = 0; i < gs[k]->n; i++) majority[gs[k]->feat[i * d->nint + d->inputs[find_input(d, "label")].slot]]++;
    }
    cavs_stats st;
    ck_assert(cavs_model_forward(m, gs, k, &st) == 0);
    count += st.count;
    correct += st.correct;
    rc += st.root_count;
    rcorrect += st.root_correct;
  }
  long best = 0;
  for (int i = 0; i < 5; i++) best = majority[i] > best ? majority[i] : best;
  double acc = (double)correct / (double)count, chance = (double)best / (double)count;
  fprintf(stderr, "toy treebank: all-node accuracy %.3f (majority class %.3f), root %.3f\n", acc, chance,
          (double)rcorrect / (double)rc);
  ck_assert_msg(acc > 0.85 && acc > chance + 0.3, "accuracy %.3f, majority %.3f", acc, chance);
  cavs_model_free(m);
  cavs_dataset_free(tr);
  cavs_dataset_free(te);
  cavs_vocab_free(v);
  unlink(train);
  unlink(test);
  rmdir(dir);
  free(dir);
}
END_TEST

/* The push block runs over all rows; those of a vertex type that does not push hold no
 * value of the minibatch. A NaN left there by an earlier minibatch (whose rows of a
 * pushing type had NaN features) must not reach the gradients through 0 * NaN. */
/* A model with no dims, no inputs and no push block is valid: its generated header must
 * compile (C has no empty enum) and a forward pass runs. */
START_TEST(model_without_dims_or_inputs) {
  const cavs_desc *d = load_model("model bare;\nparam U[2,2] init uniform(-1, 1);\n"
                                  "vertex v (children 1) { h = tanh(gather(0) @ U + 1); scatter(h); }\n",
                                  "float");
  ck_assert_int_eq(d->ndims, 0);
  ck_assert_int_eq(d->ninputs, 0);
  char err[256];
  cavs_model *m = cavs_model_new(d, NULL, err, sizeof err);
  ck_assert_msg(m != NULL, "%s", err);
  static TGraph g;
  memset(&g, 0, sizeof g);
  g.g.n = 3;
  g.g.maxc = 1;
  g.child[0] = -1, g.child[1] = 0, g.child[2] = 1;
  g.g.child = g.child;
  g.g.type = g.type;
  const cavs_graph *gs[1] = {&g.g};
  cavs_stats st;
  ck_assert_msg(cavs_model_forward(m, gs, 1, &st) == 0, "%s", cavs_model_error(m));
  ck_assert_int_eq(st.tasks, 3);
  cavs_model_free(m);
}
END_TEST

/* The backend is chosen by name when a model is made: "cpu" is always there, an
 * unknown name and a backend this build lacks are refused with a message saying so. */
START_TEST(backends_by_name) {
  ck_assert_int_ge(cavs_backend_count(), 1);
  ck_assert_str_eq(cavs_backend_name(0), "cpu");
  ck_assert_ptr_null(cavs_backend_name(cavs_backend_count()));
  char msg[256];
  ck_assert_int_eq(cavs_backend_probe("cpu", msg, sizeof msg), 0);
  ck_assert_int_eq(cavs_backend_probe("tpu", msg, sizeof msg), -1);
  ck_assert_msg(strstr(msg, "unknown backend 'tpu'") && strstr(msg, "cpu"), "%s", msg);
  bool have_cuda = false;
  for (int i = 0; i < cavs_backend_count(); i++) have_cuda |= !strcmp(cavs_backend_name(i), "cuda");
  if (!have_cuda) {
    ck_assert_int_eq(cavs_backend_probe("cuda", msg, sizeof msg), -1);
    ck_assert_msg(strstr(msg, "without the CUDA backend"), "%s", msg);
  } else if (cavs_backend_probe("cuda", msg, sizeof msg)) {
    /* built, but no GPU here (or no driver): it says so */
    ck_assert_msg(strstr(msg, "no CUDA device"), "%s", msg);
  }
  const cavs_desc *d = load_model("treelstm.vf", "float");
  long dims[CAVS_MAX_DIMS];
  cavs_dims_default(d, dims);
  dims[find_dim(d, "V")] = 10;
  char err[256] = "";
  cavs_model_opts o = {.backend = "tpu"};
  ck_assert_ptr_null(cavs_model_new_opts(d, dims, &o, err, sizeof err));
  ck_assert_msg(strstr(err, "unknown backend 'tpu'"), "%s", err);
  if (have_cuda) {
    /* the C target's loops run on the host: not on a device, whatever the machine */
    o.backend = "cuda";
    ck_assert_ptr_null(cavs_model_new_opts(d, dims, &o, err, sizeof err));
    ck_assert_msg(strstr(err, "compiled for the c target, which the cuda backend cannot run"), "%s", err);
  }
  /* and a CUDA target's stages launch kernels: not on the CPU */
  cavs_desc gpu = *d;
  gpu.target = CAVS_TARGET_CUDA;
  ck_assert_ptr_null(cavs_model_new(&gpu, dims, err, sizeof err));
  ck_assert_msg(strstr(err, "compiled for the cuda target, which the cpu backend cannot run (compile it with "
                            "cavsc --target=c)"), "%s", err);
  o.backend = "cpu";
  cavs_model *m = cavs_model_new_opts(d, dims, &o, err, sizeof err);
  ck_assert_msg(m != NULL, "%s", err);
  ck_assert_str_eq(cavs_model_backend(m), "cpu");
  cavs_model_free(m);
  m = cavs_model_new(d, dims, err, sizeof err);
  ck_assert_str_eq(cavs_model_backend(m), "cpu");
  cavs_model_free(m);
}
END_TEST

/* The backend's statistics count the products a minibatch makes, and a reset clears
 * them. A Tree-LSTM forward pass over one tree of three vertices makes products. */
START_TEST(backend_stats_count_products) {
  const cavs_desc *d = load_model("treelstm.vf", "float");
  long dims[CAVS_MAX_DIMS];
  cavs_dims_default(d, dims);
  dims[find_dim(d, "V")] = 10;
  cavs_model *m = new_model(d, dims, 10);
  cavs_backend_stats st;
  cavs_model_backend_stats(m, &st, 0);
  ck_assert_int_eq(st.gemm_calls, 0);
  static TGraph g;
  memset(&g, 0, sizeof g);
  g.g.n = 3;
  g.g.maxc = 2;
  int ch[] = {-1, -1, -1, -1, 0, 1};
  memcpy(g.child, ch, sizeof ch);
  int feat[] = {1, -1, 2, -1, -1, 1};
  memcpy(g.feat, feat, sizeof feat);
  g.g.child = g.child;
  g.g.feat = g.feat;
  const cavs_graph *gs[1] = {&g.g};
  cavs_stats s;
  ck_assert_msg(cavs_model_forward(m, gs, 1, &s) == 0, "%s", cavs_model_error(m));
  cavs_model_backend_stats(m, &st, 1);
  ck_assert_int_gt(st.gemm_calls, 0);
  ck_assert(st.gemm_flops > 0);
  cavs_model_backend_stats(m, &st, 0);
  ck_assert_int_eq(st.gemm_calls, 0);
  ck_assert(st.gemm_flops == 0);
  /* what an application reads and writes on any backend: the same bytes the pointers
     show on this one */
  cavs_model_backward(m);
  size_t n;
  const float *gr = cavs_model_grads_flat(m, &n);
  float *copy = malloc(n * sizeof *copy);
  ck_assert_int_eq(cavs_model_read(m, copy, gr, n * sizeof *copy), 0);
  ck_assert(!memcmp(copy, gr, n * sizeof *copy));
  float *p = cavs_model_params_flat(m, &n);
  for (size_t i = 0; i < n; i++) copy[i] = (float)i;
  ck_assert_int_eq(cavs_model_write(m, p, copy, n * sizeof *copy), 0);
  ck_assert(p[n - 1] == (float)(n - 1) && p[1] == 1);
  free(copy);
  cavs_model_free(m);
}
END_TEST

/* Two threads split the products into column (or row) blocks and the fused loops into
 * column blocks. Each block is one thread's, so two runs with two threads give the same
 * bits (whichever thread takes which block), and one thread the same numbers but for
 * rounding: OpenBLAS may sum a narrower product in another order. A lost or doubled
 * update (two threads on one cell, a block run twice or never) would show. The sizes
 * are past the splits' thresholds (a megaflop a product, 16384 cells a loop). */
/* The Tree-LSTM at E, H and V = 300, and a minibatch of trees for it: tree k of
 * n0 + dn k vertices, or n0 + k mod `mod` where mod > 0 */
static void treelstm_trees(const cavs_desc *d, long *dims, long E, long H, TGraph *g, const cavs_graph **gs,
                           unsigned seed, int n0, int dn, int mod) {
  cavs_dims_default(d, dims);
  dims[find_dim(d, "E")] = E;
  dims[find_dim(d, "H")] = H;
  dims[find_dim(d, "V")] = 300;
  for (int k = 0; k < TG_MINIBATCH; k++) {
    tg_tree(&g[k], n0 + (mod > 0 ? k % mod : dn * k), 2, false, &seed, 0, 0);
    tg_features(&g[k], d, dims, &seed);
    gs[k] = &g[k].g;
  }
}

START_TEST(threads_do_not_change_results) {
  const cavs_desc *d = load_model("treelstm.vf", "float");
  long dims[CAVS_MAX_DIMS];
  static TGraph g[TG_MINIBATCH];
  const cavs_graph *gs[TG_MINIBATCH];
  treelstm_trees(d, dims, 96, 160, g, gs, 5, 100, 13, 0);
  /* one thread, two, two again */
  cavs_model *m[3];
  for (int t = 0; t < 3; t++) {
    char err[512];
    m[t] = cavs_model_new_opts(d, dims, &(cavs_model_opts){.backend = "cpu", .threads = t ? 2 : 1}, err, sizeof err);
    ck_assert_msg(m[t] != NULL, "%s", err);
    cavs_model_init(m[t], 3);
  }
  cavs_optim o = {.kind = CAVS_ADAM, .lr = 1e-2};
  for (int step = 0; step < 2; step++) {
    cavs_stats s[3];
    for (int t = 0; t < 3; t++) {
      ck_assert_msg(cavs_model_forward(m[t], gs, TG_MINIBATCH, &s[t]) == 0, "%s", cavs_model_error(m[t]));
      cavs_model_backward(m[t]);
    }
    ck_assert_msg(s[1].loss == s[2].loss, "loss %.9g, then %.9g with two threads", s[1].loss, s[2].loss);
    ck_assert_msg(fabs(s[0].loss - s[1].loss) <= 1e-6 * fabs(s[0].loss), "loss %.9g with one thread, %.9g with two",
                  s[0].loss, s[1].loss);
    size_t n[3];
    const float *gr[3];
    for (int t = 0; t < 3; t++) gr[t] = cavs_model_grads_flat(m[t], &n[t]);
    ck_assert(n[0] == n[1] && n[1] == n[2]);
    ck_assert_msg(!memcmp(gr[1], gr[2], n[1] * sizeof *gr[1]), "step %d: two runs with two threads differ", step);
    double scale = 0;
    for (size_t i = 0; i < n[0]; i++) scale = fmax(scale, fabs(gr[0][i]));
    for (size_t i = 0; i < n[0]; i++)
      if (fabs(gr[0][i] - gr[1][i]) > 1e-4 * fmax(fabs(gr[0][i]), 1e-2 * scale))
        ck_abort_msg("step %d: gradient %zu: %.9g with one thread, %.9g with two", step, i, gr[0][i], gr[1][i]);
    for (int t = 0; t < 3; t++) ck_assert(cavs_model_step(m[t], &o) == 0);
  }
  for (int t = 0; t < 3; t++) cavs_model_free(m[t]);
}
END_TEST

/* The optimizer's update splits over the threads (backend_cpu.c, step_run: the spans
 * end to end in parts of 16 values, past STEP_SPLIT's 8 MB of values): at 2 and 3
 * threads, given one thread's gradients, every optimizer (with weight decay and a
 * clip, and without) leaves the parameters of one thread bit for bit, over two steps
 * (the second reads the first's moments), with the lookup table's touched rows and a
 * frozen parameter among the spans. A value updated twice or never, or a part's bounds
 * off by a block, would show. (E = H = 640: 3.3 million values, 13 MB; small trees, so
 * that the passes cost little.) */
START_TEST(steps_split_over_threads) {
  const cavs_desc *d = load_model("treelstm.vf", "float");
  long dims[CAVS_MAX_DIMS];
  static TGraph g[TG_MINIBATCH];
  const cavs_graph *gs[TG_MINIBATCH];
  treelstm_trees(d, dims, 640, 640, g, gs, 11, 3, 0, 5);
  static const cavs_optim optims[] = {
      {.kind = CAVS_SGD, .lr = 0.1},
      {.kind = CAVS_ADAGRAD, .lr = 0.1, .weight_decay = 0.01},
      {.kind = CAVS_MOMENTUM, .lr = 0.05, .clip = 0.05},
      {.kind = CAVS_NESTEROV, .lr = 0.05, .weight_decay = 0.01, .clip = 0.05},
      {.kind = CAVS_ADAM, .lr = 1e-2},
      {.kind = CAVS_ADAM, .lr = 1e-2, .weight_decay = 0.01, .clip = 0.05},
      {.kind = CAVS_ADAMW, .lr = 1e-2, .weight_decay = 0.1},
  };
  for (size_t o = 0; o < sizeof optims / sizeof *optims; o++) {
    /* a checked build (valgrind took most of its 600 s at 7): no state, one block, two
       with a decay and a clip; the plain build every optimizer */
    if (tu_checked_build() && o != 0 && o != 2 && o != 5) continue;
    cavs_model *m[3];
    for (int t = 0; t < 3; t++) {
      char err[512];
      m[t] = cavs_model_new_opts(d, dims, &(cavs_model_opts){.backend = "cpu", .threads = t + 1}, err, sizeof err);
      ck_assert_msg(m[t] != NULL, "%s", err);
      cavs_model_init(m[t], 4);
      int frozen = d->nparams - 1; /* the last that can be frozen alone */
      while (frozen > 0 && cavs_model_freeze(m[t], frozen, 1)) frozen--;
      ck_assert(frozen > 0);
    }
    size_t n[3];
    for (int step = 0; step < 2; step++) {
      int k = step ? TG_MINIBATCH / 2 : TG_MINIBATCH;
      cavs_stats st;
      float *gr[3];
      for (int t = 0; t < 3; t++) {
        ck_assert_msg(cavs_model_forward(m[t], gs, k, &st) == 0, "%s", cavs_model_error(m[t]));
        cavs_model_backward(m[t]);
        gr[t] = cavs_model_grads_flat(m[t], &n[t]);
        ck_assert(n[t] == n[0]);
      }
      ck_assert_msg(n[0] * sizeof **gr >= 12u << 20, "%zu values: below the split's threshold", n[0]);
      for (int t = 1; t < 3; t++) memcpy(gr[t], gr[0], n[0] * sizeof *gr[0]);
      for (int t = 0; t < 3; t++) ck_assert(cavs_model_step(m[t], &optims[o]) == 0);
      const float *p0 = cavs_model_params_flat(m[0], &n[0]);
      for (int t = 1; t < 3; t++) {
        const float *pt = cavs_model_params_flat(m[t], &n[t]);
        for (size_t i = 0; i < n[0]; i++)
          if (memcmp(&p0[i], &pt[i], sizeof *p0))
            ck_abort_msg("%s, case %zu, step %d: value %zu is %.9g at %d threads, %.9g at 1",
                         cavs_optim_name(optims[o].kind), o, step + 1, i, pt[i], t + 1, p0[i]);
        /* and the gradients zeroed as the step used them, at every thread count */
        const float *gt = cavs_model_grads_flat(m[t], &n[t]);
        for (size_t i = 0; i < n[0]; i++)
          if (memcmp(&gt[i], &gr[0][i], sizeof *gt))
            ck_abort_msg("case %zu, step %d: gradient %zu is %.9g after the step at %d threads, %.9g at 1", o,
                         step + 1, i, gt[i], t + 1, gr[0][i]);
      }
    }
    for (int t = 0; t < 3; t++) cavs_model_free(m[t]);
  }
}
END_TEST

/* Every example at 1, 2 and 3 threads, its fused loops past the split's thresholds
 * (fixed dims of 64 and more, the minibatch's graphs twice over: a leaves' loop of some
 * 300 rows): the loops that write only their own rows (CAVS_LOOP_ROWS) split by rows,
 * unevenly at 3, the others by columns. The loss and every gradient equal one thread's
 * but for the products' rounding (the BLAS may sum a narrower product in another
 * order), and a second run at 3 threads gives the same bits: a block of rows run twice
 * or never, or two threads on one cell, would show. */
START_TEST(threads_split_every_example) {
  char file[64];
  snprintf(file, sizeof file, "%s.vf", examples[_i]);
  const cavs_desc *d = load_model(file, "double");
  long dims[CAVS_MAX_DIMS];
  static TGraph g[TG_MINIBATCH];
  const cavs_graph *gs[2 * TG_MINIBATCH];
  int k = tg_minibatch_wide(d, dims, g, gs, true, 64);
  for (int i = 0; i < k; i++) gs[k + i] = gs[i];
  k *= 2;
  static const int threads[] = {1, 2, 3, 3};
  cavs_model *m[4];
  cavs_stats s[4];
  const double *gr[4];
  size_t n[4];
  for (int t = 0; t < 4; t++) {
    char err[512];
    m[t] = cavs_model_new_opts(d, dims, &(cavs_model_opts){.backend = "cpu", .threads = threads[t]}, err, sizeof err);
    ck_assert_msg(m[t] != NULL, "%s: %s", file, err);
    cavs_model_init(m[t], 3);
    ck_assert_msg(cavs_model_forward(m[t], gs, k, &s[t]) == 0, "%s: %s", file, cavs_model_error(m[t]));
    cavs_model_backward(m[t]);
    gr[t] = cavs_model_grads_flat(m[t], &n[t]);
    ck_assert(n[t] == n[0]);
  }
  ck_assert_msg(s[2].loss == s[3].loss && !memcmp(gr[2], gr[3], n[2] * sizeof *gr[2]), "%s: two runs at 3 threads differ",
                file);
  double scale = 0;
  for (size_t i = 0; i < n[0]; i++) scale = fmax(scale, fabs(gr[0][i]));
  for (int t = 1; t < 3; t++) {
    ck_assert_msg(fabs(s[t].loss - s[0].loss) <= 1e-12 * fabs(s[0].loss), "%s: loss %.17g at 1 thread, %.17g at %d",
                  file, s[0].loss, s[t].loss, threads[t]);
    for (size_t i = 0; i < n[0]; i++)
      if (fabs(gr[t][i] - gr[0][i]) > 1e-10 * fmax(fabs(gr[0][i]), 1e-3 * scale))
        ck_abort_msg("%s: gradient %zu: %.17g at 1 thread, %.17g at %d", file, i, gr[0][i], gr[t][i], threads[t]);
  }
  for (int t = 0; t < 4; t++) cavs_model_free(m[t]);
}
END_TEST

/* The optimizer's state as each kind reads it: SGD keeps none, so its checkpoint holds
 * the parameters alone, two blocks of their size smaller than Adam's; momentum's holds
 * its buffer, one block (format 8: format 7 wrote a second, of zeros). A model that goes
 * on from each checkpoint with Adam takes the same step, to the bit, as the model that
 * wrote it. */
START_TEST(optimizer_state_by_kind) {
  const cavs_desc *d = load_model("treelstm.vf", "float");
  long dims[CAVS_MAX_DIMS];
  static TGraph g[TG_MINIBATCH];
  const cavs_graph *gs[TG_MINIBATCH];
  int k = tg_minibatch(d, dims, g, gs, false);
  static const int kinds[] = {CAVS_SGD, CAVS_MOMENTUM, CAVS_ADAM};
  char *dir = tu_tmpdir(), path[4200], err[512];
  long long size[3];
  size_t count = 0;
  cavs_optim adam = {.kind = CAVS_ADAM, .lr = 0.01};
  for (int o = 0; o < 3; o++) {
    cavs_model *a = new_model(d, dims, 9), *b = new_model(d, dims, 4);
    cavs_optim opt = {.kind = kinds[o], .lr = 0.05};
    cavs_stats st;
    ck_assert_msg(cavs_model_forward(a, gs, k, &st) == 0, "%s", cavs_model_error(a));
    cavs_model_backward(a);
    ck_assert(cavs_model_step(a, &opt) == 0);
    snprintf(path, sizeof path, "%s/k%d.ckpt", dir, o);
    ck_assert_msg(cavs_ckpt_save(path, a, NULL, NULL, NULL, err, sizeof err) == 0, "%s", err);
    struct stat fs;
    ck_assert_int_eq(stat(path, &fs), 0);
    size[o] = (long long)fs.st_size;
    cavs_ckpt *ck = cavs_ckpt_read(path, err, sizeof err);
    ck_assert_msg(ck != NULL, "%s", err);
    count = (size_t)cavs_ckpt_param_count(ck);
    ck_assert_msg(cavs_ckpt_apply(ck, b, err, sizeof err) == 0, "%s", err);
    cavs_ckpt_free(ck);
    unlink(path);
    /* then Adam, on both */
    for (int m = 0; m < 2; m++) {
      cavs_model *x = m ? b : a;
      ck_assert(cavs_model_forward(x, gs, k, &st) == 0);
      cavs_model_backward(x);
      ck_assert_msg(cavs_model_step(x, &adam) == 0, "%s", cavs_model_error(x));
    }
    size_t n, nb;
    const float *pa = cavs_model_params_flat(a, &n), *pb = cavs_model_params_flat(b, &nb);
    ck_assert(n == nb && !memcmp(pa, pb, n * sizeof *pa));
    cavs_model_free(a);
    cavs_model_free(b);
  }
  rmdir(dir);
  free(dir);
  /* each block the optimizer keeps, and nothing for one it does not (format 8) */
  ck_assert_msg(size[2] - size[0] == 2 * (long long)(count * sizeof(float)),
                "SGD's checkpoint is %lld bytes, Adam's %lld, of %zu values", size[0], size[2], count);
  ck_assert_msg(size[1] - size[0] == (long long)(count * sizeof(float)),
                "SGD's checkpoint is %lld bytes, momentum's %lld, of %zu values", size[0], size[1], count);
}
END_TEST

/* cavs_ckpt_save writes no checkpoint that cavs_ckpt_read would refuse: a training
 * state with a value out of range (a dev metric that overflowed as the best, an epoch
 * past any run's, a format name that is none, or not terminated in its 32 bytes, a rate
 * that is not finite), a log record of two lines (cavs_ckpt_save_record), or a carried
 * state that is not finite, is an error naming the
 * part, and the checkpoint saved before is there, byte for byte; the same state made
 * valid saves and reads back. */
START_TEST(saved_state_reads_back) {
  const cavs_desc *d = load_model("treegru.vf", "float");
  long dims[CAVS_MAX_DIMS];
  static TGraph g[TG_MINIBATCH];
  const cavs_graph *gs[TG_MINIBATCH];
  tg_minibatch(d, dims, g, gs, false);
  cavs_model *m = new_model(d, dims, 3);
  char *dir = tu_tmpdir(), path[4200], err[512];
  snprintf(path, sizeof path, "%s/m.ckpt", dir);
  cavs_train_state ok = {.epoch = 3, .best = 0.5, .best_epoch = 2, .plateau_best = -1, .format = "ptb-tree",
                         .optim = {.kind = CAVS_ADAM, .lr = 1e-3}};
  ck_assert_msg(cavs_ckpt_save(path, m, NULL, NULL, &ok, err, sizeof err) == 0, "%s", err);
  size_t n0;
  char *before = tu_slurp(path, &n0);
  ck_assert_ptr_nonnull(before);
  static const char *const parts[] = {"training state", "learning-rate schedule", "data format", "optimizer settings"};
  for (int c = 0; c < 9; c++) {
    cavs_train_state t = ok;
    int part = c < 3 ? 0 : c < 4 ? 1 : c < 7 ? 2 : 3;
    switch (c) {
    case 0: t.best = NAN; break;
    case 1: t.best = INFINITY; break;
    case 2: t.epoch = -1; break;
    case 3: t.plateau_best = INFINITY; break;
    case 4: memset(t.format, 'a', sizeof t.format); break;
    case 5: strcpy(t.format, "sst"); break;
    case 6: strcpy(t.format, "text-bptt:0"); break;
    case 7: t.optim.lr = NAN; break;
    case 8: t.optim.kind = CAVS_OPTIM_COUNT; break;
    }
    *err = 0;
    ck_assert_msg(cavs_ckpt_save(path, m, NULL, NULL, &t, err, sizeof err) == -1, "case %d saved", c);
    ck_assert_msg(strstr(err, "cannot save") && strstr(err, parts[part]), "case %d: %s", c, err);
    size_t n;
    char *now = tu_slurp(path, &n);
    ck_assert_msg(now && n == n0 && !memcmp(now, before, n), "case %d: the earlier checkpoint was replaced", c);
    free(now);
  }
  ok.best = 0.75, ok.epoch = 4;
  ck_assert_msg(cavs_ckpt_save(path, m, NULL, NULL, &ok, err, sizeof err) == 0, "%s", err);
  cavs_ckpt *ck = cavs_ckpt_read(path, err, sizeof err);
  ck_assert_msg(ck != NULL, "%s", err);
  const cavs_train_state *back = cavs_ckpt_state(ck);
  ck_assert(back->epoch == 4 && back->best == 0.75 && !strcmp(back->format, "ptb-tree"));
  ck_assert_ptr_null(cavs_ckpt_record(ck)); /* (cavs_ckpt_save keeps none) */
  cavs_ckpt_free(ck);
  free(before);
  /* a log record (cavs_ckpt_save_record) read back as given; one that would not read
     back (a line break; a NUL would cut it short) refused, the checkpoint as it was */
  const char *rec = "{\"epoch\": 4, \"note\": \"\\u00e9t\u00e9\"}";
  ck_assert_msg(cavs_ckpt_save_record(path, m, NULL, NULL, &ok, rec, err, sizeof err) == 0, "%s", err);
  ck = cavs_ckpt_read(path, err, sizeof err);
  ck_assert_msg(ck != NULL, "%s", err);
  ck_assert_str_eq(cavs_ckpt_record(ck), rec);
  cavs_ckpt_free(ck);
  before = tu_slurp(path, &n0);
  ck_assert_int_eq(cavs_ckpt_save_record(path, m, NULL, NULL, &ok, "{}\n{}", err, sizeof err), -1);
  ck_assert_msg(strstr(err, "cannot save") && strstr(err, "record"), "%s", err);
  size_t n1;
  char *kept = tu_slurp(path, &n1);
  ck_assert_msg(kept && n1 == n0 && !memcmp(kept, before, n1), "the checkpoint with a record was replaced");
  free(kept);
  free(before);
  cavs_model_free(m);
  /* a carried state with a value that is not finite, which reading refuses too */
  const cavs_desc *lm = load_model("lstm_lm.vf", "float");
  tg_minibatch(lm, dims, g, gs, false);
  m = new_model(lm, dims, 3);
  ck_assert_msg(cavs_model_carry_state(m, 1) == 0, "%s", cavs_model_error(m));
  long w = 0;
  cavs_model_carried(m, &w);
  ck_assert_int_gt(w, 0);
  float *rows = calloc(2 * (size_t)w, sizeof *rows);
  ck_assert_ptr_nonnull(rows);
  ck_assert_msg(cavs_model_set_carried(m, rows, 2) == 0, "%s", cavs_model_error(m));
  ck_assert_msg(cavs_ckpt_save(path, m, NULL, NULL, NULL, err, sizeof err) == 0, "%s", err);
  before = tu_slurp(path, &n0);
  rows[w + 1] = NAN;
  ck_assert_msg(cavs_model_set_carried(m, rows, 2) == 0, "%s", cavs_model_error(m));
  ck_assert_int_eq(cavs_ckpt_save(path, m, NULL, NULL, NULL, err, sizeof err), -1);
  ck_assert_msg(strstr(err, "carried state holds a value that is not finite"), "%s", err);
  size_t n;
  char *now = tu_slurp(path, &n);
  ck_assert_msg(now && n == n0 && !memcmp(now, before, n), "the checkpoint with a finite carried state was replaced");
  free(now);
  free(before);
  free(rows);
  cavs_model_free(m);
  tu_rmtree(dir);
}
END_TEST

/* The memory limit counts the moment blocks a model holds, not two for every model:
   - a model is made under a limit its parameters and gradients fit (before, it needed
     two blocks more), and not under one byte less;
   - cavs_model_reserve_optimizer adds a block a moment (SGD none, Adagrad one, Adam
     two), each against the limit: ENOMEM past it, and what fit is kept;
   - a first step that has no room for its moments fails with ENOMEM and moves nothing,
     SGD's steps under that limit go through, and with the limit raised the step gives
     the bits of a model that never failed. */
START_TEST(memory_limit_counts_moments) {
  const cavs_desc *d = load_model("treelstm.vf", "float");
  long dims[CAVS_MAX_DIMS];
  static TGraph g[TG_MINIBATCH];
  const cavs_graph *gs[TG_MINIBATCH];
  int k = tg_minibatch(d, dims, g, gs, false);
  char err[512];
  size_t model0, model1, model2, count;
  cavs_model *probe = new_model(d, dims, 9);
  cavs_model_params_flat(probe, &count);
  ck_assert(cavs_model_memory(probe, 0, &model0, NULL) == 0);
  ck_assert(cavs_model_reserve_optimizer(probe, CAVS_SGD) == 0);
  ck_assert(cavs_model_memory(probe, 0, &model1, NULL) == 0);
  ck_assert_msg(model1 == model0, "SGD's state took %zu bytes", model1 - model0);
  ck_assert(cavs_model_reserve_optimizer(probe, CAVS_ADAGRAD) == 0);
  ck_assert(cavs_model_memory(probe, 0, &model1, NULL) == 0);
  ck_assert(cavs_model_reserve_optimizer(probe, CAVS_ADAM) == 0);
  ck_assert(cavs_model_reserve_optimizer(probe, CAVS_SGD) == 0); /* (keeps what it holds) */
  ck_assert(cavs_model_memory(probe, 0, &model2, NULL) == 0);
  size_t block = model1 - model0;
  ck_assert_msg(block >= count * sizeof(float) && block < count * sizeof(float) + 4096 && model2 - model1 == block,
                "%zu values: %zu, %zu, %zu bytes", count, model0, model1, model2);
  ck_assert_int_eq(cavs_model_reserve_optimizer(probe, CAVS_OPTIM_COUNT), -1);
  cavs_model_free(probe);

  cavs_set_memory_limit(model0 - 1);
  cavs_model *m = cavs_model_new(d, dims, err, sizeof err);
  cavs_set_memory_limit(0);
  ck_assert_msg(m == NULL && strstr(err, "memory limit"), "made under %zu bytes: %s", model0 - 1, m ? "" : err);
  cavs_set_memory_limit(model0 + block);
  m = cavs_model_new(d, dims, err, sizeof err);
  ck_assert_msg(m != NULL, "%s", err);
  ck_assert(cavs_model_reserve_optimizer(m, CAVS_ADAGRAD) == 0);
  errno = 0;
  ck_assert_int_eq(cavs_model_reserve_optimizer(m, CAVS_ADAM), -1);
  ck_assert_msg(errno == ENOMEM && strstr(cavs_model_error(m), "memory limit"), "errno %d: %s", errno,
                cavs_model_error(m));
  ck_assert(cavs_model_memory(m, 0, &model1, NULL) == 0 && model1 == model0 + block);
  cavs_set_memory_limit(model0 + 2 * block);
  ck_assert_msg(cavs_model_reserve_optimizer(m, CAVS_ADAM) == 0, "%s", cavs_model_error(m));
  cavs_set_memory_limit(0);
  cavs_model_free(m);

  cavs_model *a = new_model(d, dims, 9), *b = new_model(d, dims, 9), *c = new_model(d, dims, 9);
  const cavs_optim adam = {.kind = CAVS_ADAM, .lr = 0.01}, sgd = {.kind = CAVS_SGD, .lr = 0.05};
  cavs_model *all[3] = {a, b, c};
  cavs_stats st;
  for (int i = 0; i < 3; i++) {
    ck_assert_msg(cavs_model_forward(all[i], gs, k, &st) == 0, "%s", cavs_model_error(all[i]));
    cavs_model_backward(all[i]);
  }
  size_t n;
  const float *pa = cavs_model_params_flat(a, &n), *pb = cavs_model_params_flat(b, &n);
  cavs_set_memory_limit(1);
  errno = 0;
  int rc = cavs_model_step(a, &adam);
  int no_room = errno;
  int sgd_rc = cavs_model_step(c, &sgd);
  cavs_set_memory_limit(0);
  ck_assert_msg(rc == -1 && no_room == ENOMEM, "Adam's step past the limit: %d, errno %d", rc, no_room);
  ck_assert_msg(sgd_rc == 0, "SGD's step past the limit: %s", cavs_model_error(c));
  ck_assert_msg(!memcmp(pa, pb, n * sizeof *pa), "the step that failed moved the parameters");
  ck_assert(cavs_model_step(a, &adam) == 0 && cavs_model_step(b, &adam) == 0);
  ck_assert_msg(!memcmp(pa, pb, n * sizeof *pa), "the step taken again is not the other model's");
  for (int i = 0; i < 3; i++) cavs_model_free(all[i]);
}
END_TEST

/* A step uses the gradients up and zeroes them as it goes, so a backward pass after a
 * step clears only what no step zeroed. The gradients after step, forward, backward are
 * bit for bit those of a new model given the stepped parameters; a second backward pass
 * without a step gives the same gradients again (not twice them); a frozen group, which
 * no step touches, is cleared all the same; every optimizer, the two-type model too (its
 * two types' eager gradients are apart). */
START_TEST(step_leaves_gradients_clean) {
  static const char *const files[] = {"treelstm.vf", "twotype.vf"};
  const cavs_desc *d = load_model(files[_i], "float");
  long dims[CAVS_MAX_DIMS];
  static TGraph g[TG_MINIBATCH];
  const cavs_graph *gs[TG_MINIBATCH];
  int k = tg_minibatch(d, dims, g, gs, false);
  static const int kinds[] = {CAVS_SGD, CAVS_ADAGRAD, CAVS_ADAM, CAVS_MOMENTUM, CAVS_NESTEROV, CAVS_ADAMW};
  for (int o = 0; o < (int)(sizeof kinds / sizeof *kinds); o++)
    for (int frozen = 0; frozen < 2; frozen++) {
      cavs_model *a = new_model(d, dims, 9), *b = new_model(d, dims, 9);
      if (frozen) ck_assert(cavs_model_freeze(a, 0, 1) == 0); /* the embeddings' table */
      cavs_optim opt = {.kind = kinds[o], .lr = 0.05, .weight_decay = 1e-3, .clip = 1};
      cavs_stats st;
      ck_assert_msg(cavs_model_forward(a, gs, k, &st) == 0, "%s", cavs_model_error(a));
      cavs_model_backward(a);
      ck_assert(cavs_model_step(a, &opt) == 0);
      ck_assert(cavs_model_forward(a, gs, k, &st) == 0);
      cavs_model_backward(a);
      /* b: a's parameters now, nothing before */
      size_t n, nb;
      const float *pa = cavs_model_params_flat(a, &n);
      float *pb = cavs_model_params_flat(b, &nb);
      ck_assert(n == nb);
      memcpy(pb, pa, n * sizeof *pb);
      ck_assert(cavs_model_forward(b, gs, k, &st) == 0);
      cavs_model_backward(b);
      const float *ga = cavs_model_grads_flat(a, &n), *gb = cavs_model_grads_flat(b, &nb);
      ck_assert_msg(!memcmp(ga, gb, n * sizeof *ga), "%s, optimizer %d%s: the gradients after a step are not a new model's",
                    files[_i], kinds[o], frozen ? ", emb frozen" : "");
      /* backward again, no step between: the same, not twice */
      cavs_model_backward(a);
      ck_assert_msg(!memcmp(cavs_model_grads_flat(a, &n), gb, n * sizeof *ga),
                    "%s, optimizer %d%s: a second backward pass added to the first", files[_i], kinds[o],
                    frozen ? ", emb frozen" : "");
      cavs_model_free(a);
      cavs_model_free(b);
    }
}
END_TEST

/* ---- the optimizers against a reference written here ---- */

/* The reference's state: parameters and the optimizer's two buffers, in double, over the
 * flat block, and which elements a step updates. */
typedef struct RefOpt {
  size_t n;
  double *p, *b1, *b2;
  unsigned char *upd;
  long t;
  bool clipped; /* some step's clip scaled the gradients */
} RefOpt;

/* The elements a step on graphs gs[0..k) updates: every parameter not frozen, and of a
 * lookup table only the rows the graphs' vertices read (their features, as given). */
static void ref_mask(RefOpt *r, cavs_model *m, const cavs_desc *d, const TGraph *g, int k, int frozen) {
  size_t n;
  const double *flat = cavs_model_params_flat(m, &n);
  memset(r->upd, 0, n);
  for (int i = 0; i < d->nparams; i++) {
    long rows, cols, ld;
    const double *p = cavs_model_param(m, i, &rows, &cols, &ld);
    int slot = d->pgroups[d->params[i].group].sparse_input;
    for (long row = 0; row < rows && i != frozen; row++) {
      bool read = slot < 0;
      for (int gi = 0; gi < k && !read; gi++)
        for (int v = 0; v < g[gi].g.n && !read; v++) read = g[gi].feat[v * d->nint + slot] == row;
      if (read) memset(r->upd + (p - flat) + (size_t)row * (size_t)ld, 1, (size_t)cols);
    }
  }
}

/* One step of o in the reference from the gradients g, as its paper and PyTorch write it:
 * L2 decay into the gradient (not AdamW's), the global norm over what is updated
 * clipped, then the update; each element in double, one at a time. The norm before the
 * clip. */
static double ref_step(RefOpt *r, const cavs_optim *o, const double *grad) {
  double l2 = o->kind == CAVS_ADAMW ? 0 : o->weight_decay, norm2 = 0;
  double mu = o->momentum ? o->momentum : 0.9, b1 = o->beta1 ? o->beta1 : 0.9, b2 = o->beta2 ? o->beta2 : 0.999;
  double eps = o->eps ? o->eps : 1e-8;
  r->t++;
  for (size_t e = 0; e < r->n; e++)
    if (r->upd[e]) norm2 += (grad[e] + l2 * r->p[e]) * (grad[e] + l2 * r->p[e]);
  double scale = o->clip > 0 && sqrt(norm2) > o->clip ? o->clip / sqrt(norm2) : 1;
  r->clipped |= scale < 1;
  for (size_t e = 0; e < r->n; e++) {
    if (!r->upd[e]) continue;
    double g = scale * (grad[e] + l2 * r->p[e]);
    if (o->kind == CAVS_MOMENTUM || o->kind == CAVS_NESTEROV) {
      r->b1[e] = mu * r->b1[e] + g;
      r->p[e] -= o->lr * (o->kind == CAVS_NESTEROV ? g + mu * r->b1[e] : r->b1[e]);
      continue;
    }
    r->b1[e] = b1 * r->b1[e] + (1 - b1) * g;
    r->b2[e] = b2 * r->b2[e] + (1 - b2) * g * g;
    double mhat = r->b1[e] / (1 - pow(b1, (double)r->t)), vhat = r->b2[e] / (1 - pow(b2, (double)r->t));
    r->p[e] -= o->lr * (mhat / (sqrt(vhat) + eps) + o->weight_decay * r->p[e]);
  }
  return sqrt(norm2);
}

/* Momentum, Nesterov and AdamW, three steps each on the Tree-LSTM in double (the first
 * and the last on a minibatch, the second on its first two graphs, so that some rows of
 * the lookup table are read, left for a step and read again, their state waiting), with
 * a dense parameter frozen: every parameter as the reference has it, to 1e-12
 * relative, and the frozen one as it was. The global norm each step reports
 * (cavs_model_grad_norm, tracked) is the reference's, over
 * what the step updates; untracked, none (-1), clipped or not. */
START_TEST(optimizers_match_reference) {
  static const cavs_optim optims[] = {
      {.kind = CAVS_MOMENTUM, .lr = 0.05},
      {.kind = CAVS_MOMENTUM, .lr = 0.05, .momentum = 0.7, .weight_decay = 0.01, .clip = 0.05},
      {.kind = CAVS_NESTEROV, .lr = 0.05},
      {.kind = CAVS_NESTEROV, .lr = 0.05, .momentum = 0.8, .weight_decay = 0.01, .clip = 0.05},
      {.kind = CAVS_ADAMW, .lr = 1e-2, .weight_decay = 0.1},
      {.kind = CAVS_ADAMW, .lr = 1e-2, .weight_decay = 0.1, .clip = 0.05, .beta1 = 0.8, .beta2 = 0.99, .eps = 1e-6},
  };
  const cavs_desc *d = load_model("treelstm.vf", "double");
  long dims[CAVS_MAX_DIMS];
  static TGraph g[TG_MINIBATCH];
  const cavs_graph *gs[TG_MINIBATCH];
  int k = tg_minibatch(d, dims, g, gs, false);
  for (size_t o = 0; o < sizeof optims / sizeof *optims; o++) {
    cavs_model *m = new_model(d, dims, 3);
    bool tracked = o != 2 && o != 3; /* (3 clips: a norm taken, not kept) */
    ck_assert_int_eq(cavs_model_track_grad_norm(m, tracked), 0);
    ck_assert(cavs_model_grad_norm(m) == -1); /* no step yet */
    int frozen = 1; /* the first that can be frozen alone, after the table */
    while (frozen < d->nparams && cavs_model_freeze(m, frozen, 1)) frozen++;
    ck_assert(frozen < d->nparams);
    RefOpt r = {0};
    const double *p = cavs_model_params_flat(m, &r.n);
    r.p = malloc(r.n * sizeof *r.p), r.b1 = calloc(r.n, sizeof *r.b1), r.b2 = calloc(r.n, sizeof *r.b2);
    r.upd = malloc(r.n);
    double *grad = malloc(r.n * sizeof *grad);
    memcpy(r.p, p, r.n * sizeof *r.p);
    for (int step = 0; step < 3; step++) {
      int kk = step == 1 ? 2 : k;
      cavs_stats st;
      ck_assert_msg(cavs_model_forward(m, gs, kk, &st) == 0, "%s", cavs_model_error(m));
      cavs_model_backward(m);
      memcpy(grad, cavs_model_grads_flat(m, &r.n), r.n * sizeof *grad);
      ref_mask(&r, m, d, g, kk, frozen);
      double norm = ref_step(&r, &optims[o], grad);
      ck_assert(cavs_model_step(m, &optims[o]) == 0);
      double got = cavs_model_grad_norm(m);
      if (tracked)
        ck_assert_msg(fabs(got - norm) <= 1e-12 * norm, "case %zu, step %d: norm %.17g, not %.17g", o, step + 1, got, norm);
      else ck_assert_msg(got == -1, "case %zu: a norm (%g) nobody asked for", o, got);
      for (size_t e = 0; e < r.n; e++)
        ck_assert_msg(fabs(p[e] - r.p[e]) <= 1e-12 * fabs(r.p[e]), "%s, case %zu, step %d: element %zu is %.17g, not %.17g",
                      cavs_optim_name(optims[o].kind), o, step + 1, e, p[e], r.p[e]);
    }
    ck_assert_msg(r.clipped == (optims[o].clip > 0), "case %zu: the clip was%s used", o, r.clipped ? "" : " not");
    free(r.p), free(r.b1), free(r.b2), free(r.upd), free(grad);
    cavs_model_free(m);
  }
}
END_TEST

/* A softmax runs over the pool in chunks of 16 rows (backend_cpu.c), and one of 16 columns
 * or fewer with its rows in the vector's lanes (kernels.h, xent_tile): the loss, the
 * counts and every prediction are those of the probabilities read back
 * (cavs_model_vertex_probs, computed in double from the logits), row for row, with one
 * thread and with two, for vocabularies of 1500, 17 (the widest a row at a time), 16 and
 * 5 (the lanes), over sentences of lengths that leave chunks part full; a chunk lost,
 * run twice, a lane read from the wrong row or summed into the wrong loss would show.
 * With the output layer zeroed every logit ties: the first class is predicted and each
 * row's loss is log V. The loss is the same with one thread and with two. */
static void softmax_case(const cavs_desc *d, long vocab, bool tie) {
  long dims[CAVS_MAX_DIMS];
  cavs_dims_default(d, dims);
  dims[find_dim(d, "E")] = 24;
  dims[find_dim(d, "H")] = 32;
  dims[find_dim(d, "V")] = vocab;
  static TGraph g[6];
  const cavs_graph *gs[6];
  unsigned seed = 11;
  for (int k = 0; k < 6; k++) {
    memset(&g[k], 0, sizeof g[k]);
    int n = 20 + 9 * k;
    g[k].g.n = n;
    g[k].g.maxc = 1;
    for (int v = 0; v < n; v++) g[k].child[v] = v - 1;
    tg_features(&g[k], d, dims, &seed);
    g[k].g.child = g[k].child;
    gs[k] = &g[k].g;
  }
  double loss[2];
  for (int t = 0; t < 2; t++) {
    char err[512];
    cavs_model *m = cavs_model_new_opts(d, dims, &(cavs_model_opts){.backend = "cpu", .threads = t + 1}, err,
                                        sizeof err);
    ck_assert_msg(m != NULL, "%s", err);
    cavs_model_init(m, 4);
    for (int i = 0; tie && i < d->nparams; i++)
      if (!strcmp(d->params[i].name, "Wout") || !strcmp(d->params[i].name, "bout")) {
        long rows, cols, ld;
        float *w = cavs_model_param(m, i, &rows, &cols, &ld);
        for (long r = 0; r < rows; r++) memset(w + r * ld, 0, sizeof *w * (size_t)cols);
      }
    cavs_stats s;
    ck_assert_msg(cavs_model_forward(m, gs, 6, &s) == 0, "%s", cavs_model_error(m));
    double sum = 0;
    long count = 0, correct = 0;
    static double p[1500];
    for (int k = 0; k < 6; k++)
      for (int v = 0; v < gs[k]->n; v++) {
        ck_assert_int_eq(cavs_model_vertex_probs(m, k, v, p, vocab), vocab);
        int am = 0;
        for (int j = 1; j < vocab; j++) am = p[j] > p[am] ? j : am;
        ck_assert_msg(cavs_model_vertex_class(m, k, v) == am, "V %ld%s, %d thread(s), graph %d, vertex %d: class %d, not %d",
                      vocab, tie ? " (ties)" : "", t + 1, k, v, cavs_model_vertex_class(m, k, v), am);
        int label = g[k].feat[v * d->nint + 1];
        if (label < 0) continue;
        sum -= log(p[label]);
        count++;
        correct += am == label;
      }
    ck_assert_int_eq(s.count, count);
    ck_assert_int_eq(s.correct, correct);
    ck_assert_msg(fabs(s.loss - sum / (double)count) <= 1e-5 * s.loss, "V %ld%s, %d thread(s): loss %.9g, probabilities %.9g",
                  vocab, tie ? " (ties)" : "", t + 1, s.loss, sum / (double)count);
    if (tie)
      ck_assert_msg(fabs(s.loss - log((double)vocab)) <= 1e-6 * s.loss,
                    "V %ld, every logit zero: loss %.9g, not log V", vocab, s.loss);
    loss[t] = s.loss;
    cavs_model_free(m);
  }
  ck_assert_msg(fabs(loss[0] - loss[1]) <= 1e-6 * loss[0], "V %ld: loss %.9g, %.9g", vocab, loss[0], loss[1]);
}

START_TEST(softmax_over_threads) {
  const cavs_desc *d = load_model("lstm_lm.vf", "float");
  static const long vocab[] = {1500, 17, 16, 5};
  for (size_t i = 0; i < sizeof vocab / sizeof *vocab; i++) {
    softmax_case(d, vocab[i], false);
    if (vocab[i] <= 17) softmax_case(d, vocab[i], true);
  }
}
END_TEST

/* A descriptor generated against another ABI is refused before anything in it but its
 * version is read, with a message that says what to do. */
/* The scheduler numbers a level's rows from the top down (scheduler.c): in a minibatch of
 * complete binary trees of different depths (roots at several levels) and one of chains
 * of different lengths (sentences ending at every level), the children of every task's
 * rows are one block of rows, parent by parent and slot by slot. On random trees some
 * are not, and the count says so without going past the rows gathered. */
static void complete_tree(TGraph *t, int depth, unsigned *seed, const cavs_desc *d, const long *dims) {
  memset(t, 0, sizeof *t);
  int leaves = 1 << depth, n = 2 * leaves - 1;
  t->g.n = n;
  t->g.maxc = 2;
  /* vertices bottom level first: level l's vertices follow level l - 1's */
  for (int v = 0; v < n; v++) t->child[2 * v] = t->child[2 * v + 1] = -1;
  for (int lo = 0, w = leaves; w > 1; lo += w, w /= 2)
    for (int i = 0; i < w / 2; i++) {
      t->child[2 * (lo + w + i)] = lo + 2 * i;
      t->child[2 * (lo + w + i) + 1] = lo + 2 * i + 1;
    }
  t->g.child = t->child;
  tg_features(t, d, dims, seed);
}

static void chain(TGraph *t, int n, unsigned *seed, const cavs_desc *d, const long *dims) {
  memset(t, 0, sizeof *t);
  t->g.n = n;
  t->g.maxc = 1;
  for (int v = 0; v < n; v++) t->child[v] = v - 1;
  t->g.child = t->child;
  tg_features(t, d, dims, seed);
}

static void layout_of(const char *file, int which, double *share, long *rows) {
  const cavs_desc *d = load_model(file, "double");
  long dims[CAVS_MAX_DIMS];
  static TGraph g[TG_MINIBATCH];
  const cavs_graph *gs[TG_MINIBATCH];
  int k = tg_minibatch(d, dims, g, gs, false);
  unsigned seed = 5;
  if (which == 1)
    for (k = 0; k < 6; k++) complete_tree(&g[k], (int[]){3, 1, 4, 2, 0, 5}[k], &seed, d, dims);
  if (which == 2)
    for (k = 0; k < 7; k++) chain(&g[k], (int[]){9, 1, 4, 17, 4, 30, 2}[k], &seed, d, dims);
  for (int i = 0; i < k; i++) gs[i] = &g[i].g;
  cavs_model *m = new_model(d, dims, 3);
  cavs_stats st;
  ck_assert_msg(cavs_model_forward(m, gs, k, &st) == 0, "%s", cavs_model_error(m));
  cavs_backend_stats bs;
  cavs_model_backend_stats(m, &bs, 0);
  ck_assert(bs.gathered_in_place >= 0 && bs.gathered_in_place <= bs.gathered_rows);
  *share = bs.gathered_rows ? (double)bs.gathered_in_place / (double)bs.gathered_rows : -1;
  *rows = bs.gathered_rows;
  cavs_model_free(m);
}

START_TEST(layout_puts_children_in_blocks) {
  double share;
  long rows;
  layout_of("treefc.vf", 1, &share, &rows);
  ck_assert_int_eq(rows, 2 * (7 + 1 + 15 + 3 + 0 + 31)); /* two children a parent */
  ck_assert_msg(share == 1, "complete trees: %g of the gathered rows in blocks", share);
  layout_of("lstm_lm.vf", 2, &share, &rows);
  ck_assert_int_eq(rows, 8 + 0 + 3 + 16 + 3 + 29 + 1);
  ck_assert_msg(share == 1, "chains: %g of the gathered rows in blocks", share);
  layout_of("treefc.vf", 0, &share, &rows);
  ck_assert(rows > 0 && share >= 0 && share < 1);
}
END_TEST

/* Gathers as views (scheduler.c, plan_views): on complete trees of one depth and on
 * chains of one length a vertex type's children lie in one block of the state, task
 * after task, and every gathered row is read in place; the forward pass reads the same
 * numbers (the loss to the bit), the gradients add the same terms in another order
 * (to rounding, in double), and an Adam step leaves the same parameters to rounding.
 * Where cavsc cannot prove a buffer is untouched at the leaves (twotype.vf copies its
 * gathered rows whole), or the rows do not line up (trees of several depths), nothing
 * is viewed. */
/* Sentences of n words for tagger.vf: fwd i (child i - 1), bwd i (child n + i + 1),
 * tok i (children i and n + i), features at random. */
static void sentence(TGraph *t, int n, unsigned *seed, const cavs_desc *d, const long *dims) {
  memset(t, 0, sizeof *t);
  t->g.n = 3 * n;
  t->g.maxc = 2;
  for (int i = 0; i < 6 * n; i++) t->child[i] = -1;
  for (int i = 0; i < n; i++) {
    t->type[i] = 0, t->type[n + i] = 1, t->type[2 * n + i] = 2;
    t->child[2 * i] = i - 1;
    t->child[2 * (n + i)] = i + 1 < n ? n + i + 1 : -1;
    t->child[2 * (2 * n + i)] = i, t->child[2 * (2 * n + i) + 1] = n + i;
  }
  t->g.child = t->child;
  t->g.type = t->type;
  tg_features(t, d, dims, seed);
}

/* Dropout (training only): the same masks one vertex at a time, under every policy, as
 * batched (a mask is drawn from the vertex's place in the minibatch, the step count, the
 * node and the column, never the row); about p of the values dropped and the others
 * scaled by 1 / (1 - p); new masks after a step; and in inference the model computes
 * what it computes without dropout. */
static const char *drop_model =
    "model drop; dim H = 64; dim C = 3; input y : class[C]; input f : real[H];\n"
    "param W[H,H], Wc[H,C] init uniform(-0.2, 0.2);\n"
    "vertex v (children 2) { a = tanh(f + (gather(0) + gather(1)) @ W); d = dropout(a, 0.3); scatter(d); push(d); }\n"
    "push (p) { loss softmax_xent(p @ Wc, y); }\n";

START_TEST(dropout_masks) {
  for (int p = 0; p < 4; p++) batched_vs_policy(drop_model, "double", true, 1e-11, 0, policies[p], false);
  /* two types at random: agenda and frontier lay the rows out unlike one vertex a task */
  static const char *mixed_drop =
      "model mixdrop; dim H = 4; dim C = 3; input y : class[C]; input f : real[H];\n"
      "param Wa[2H,H], Wb[2H,H], Wc[H,C] init uniform(-1, 1);\n"
      "vertex a (children 2) { h = dropout(tanh(f + concat(gather(0), gather(1)) @ Wa), 0.5); scatter(h); push(h); }\n"
      "vertex b (children 2) { u = concat(gather(0), gather(1)) @ Wb; h = sigmoid(f * u) - 0.5; scatter(h); push(h); }\n"
      "push (p) { loss softmax_xent(dropout(p, 0.2) @ Wc, y); }\n";
  for (int p = 0; p < 4; p++) batched_vs_policy(mixed_drop, "double", true, 1e-11, 0, policies[p], true);
  const cavs_desc *d = load_model(drop_model, "double");
  long dims[CAVS_MAX_DIMS];
  static TGraph g[TG_MINIBATCH];
  const cavs_graph *gs[TG_MINIBATCH];
  int k = tg_minibatch(d, dims, g, gs, false);
  cavs_model *m = new_model(d, dims, 4);
  ck_assert(cavs_model_forward(m, gs, k, NULL) == 0);
  long dropped = 0, kept = 0, differ = 0, w = dims[find_dim(d, "H")];
  double a[64], dv[64], before[64];
  ck_assert(w <= 64);
  for (int i = 0; i < k; i++)
    for (int v = 0; v < gs[i]->n; v++) {
      ck_assert_int_eq(cavs_model_vertex_value(m, i, v, "a", a, 64), w);
      ck_assert_int_eq(cavs_model_vertex_value(m, i, v, "d", dv, 64), w);
      for (int j = 0; j < w; j++) {
        if (dv[j] == 0) dropped++;
        else ck_assert_msg(fabs(dv[j] - a[j] / 0.7) <= 1e-12 * fabs(dv[j]), "kept %.17g of %.17g", dv[j], a[j]), kept++;
      }
    }
  double share = (double)dropped / (double)(dropped + kept);
  ck_assert_msg(share > 0.25 && share < 0.35, "dropped %.3f of the values, not about 0.3", share);
  ck_assert(cavs_model_vertex_value(m, 5, 30, "d", before, 64) == w);
  cavs_model_backward(m);
  cavs_optim o = {.kind = CAVS_SGD, .lr = 1e-3};
  ck_assert(cavs_model_step(m, &o) == 0);
  ck_assert(cavs_model_forward(m, gs, k, NULL) == 0);
  ck_assert(cavs_model_vertex_value(m, 5, 30, "d", dv, 64) == w);
  for (int j = 0; j < w; j++) differ += (dv[j] == 0) != (before[j] == 0);
  ck_assert_msg(differ > 0, "the same mask after a step");
  /* inference: no dropout */
  char src[1024];
  snprintf(src, sizeof src, "%s", drop_model);
  char *at = strstr(src, "dropout(a, 0.3)");
  memcpy(at, "(a)            ", 15);
  const cavs_desc *plain = load_model(src, "double");
  cavs_model *q = new_model(plain, dims, 4), *r = new_model(d, dims, 4);
  cavs_model_set_inference(r, 1);
  cavs_stats sq, sr;
  ck_assert(cavs_model_forward(q, gs, k, &sq) == 0 && cavs_model_forward(r, gs, k, &sr) == 0);
  ck_assert_msg(sq.loss == sr.loss, "inference %.17g, without dropout %.17g", sr.loss, sq.loss);
  cavs_model_free(m);
  cavs_model_free(q);
  cavs_model_free(r);
}
END_TEST

/* noise(a) (training only): the same draws one vertex at a time, under every policy, as
 * batched (drawn as dropout's masks are, from the vertex's place in the minibatch, the
 * step, the node and the column); d / a standard normal (mean 0, variance 1, and the
 * fourth moment a normal's 3, where a uniform's would be 1.8); two calls of noise(a)
 * two draws, not one (never merged as common subexpressions), and new draws after a
 * step; in inference 0. */
START_TEST(noise_draws) {
  static const char *noise_model =
      "model noisy; dim H = 64; dim C = 3; input y : class[C]; input f : real[H];\n"
      "param W[H,H], Wc[H,C] init uniform(-0.2, 0.2);\n"
      "vertex v (children 2) { a = tanh(f + (gather(0) + gather(1)) @ W);\n"
      "  d = noise(a); d2 = noise(a); scatter(a + d * 0.1); push(a + d2 * 0.1); }\n"
      "push (p) { loss softmax_xent(p @ Wc, y); }\n";
  for (int p = 0; p < 4; p++) batched_vs_policy(noise_model, "double", true, 1e-11, 0, policies[p], false);
  const cavs_desc *d = load_model(noise_model, "double");
  long dims[CAVS_MAX_DIMS];
  static TGraph g[TG_MINIBATCH];
  const cavs_graph *gs[TG_MINIBATCH];
  int k = tg_minibatch_wide(d, dims, g, gs, true, 64);
  cavs_model *m = new_model(d, dims, 4);
  ck_assert(cavs_model_forward(m, gs, k, NULL) == 0);
  long w = dims[find_dim(d, "H")], count = 0, same = 0;
  double a[64], z[64], z2[64], before[64], s1 = 0, s2 = 0, s4 = 0;
  ck_assert(w <= 64);
  for (int i = 0; i < k; i++)
    for (int v = 0; v < gs[i]->n; v++) {
      ck_assert_int_eq(cavs_model_vertex_value(m, i, v, "a", a, 64), w);
      ck_assert_int_eq(cavs_model_vertex_value(m, i, v, "d", z, 64), w);
      ck_assert_int_eq(cavs_model_vertex_value(m, i, v, "d2", z2, 64), w);
      for (int j = 0; j < w; j++) {
        if (fabs(a[j]) < 1e-3) continue;
        double t = z[j] / a[j];
        s1 += t, s2 += t * t, s4 += t * t * t * t, count++;
        same += z[j] == z2[j];
      }
    }
  ck_assert_msg(count > 10000, "%ld draws", count);
  double mean = s1 / (double)count, var = s2 / (double)count - mean * mean, m4 = s4 / (double)count;
  ck_assert_msg(fabs(mean) < 0.05 && fabs(var - 1) < 0.05 && fabs(m4 - 3) < 0.3,
                "%ld draws: mean %.4f, variance %.4f, fourth moment %.3f: not a standard normal's 0, 1, 3", count, mean,
                var, m4);
  ck_assert_msg(same == 0, "%ld values of two noise nodes drew the same", same);
  ck_assert(cavs_model_vertex_value(m, 5, 30, "d", before, 64) == w);
  cavs_model_backward(m);
  cavs_optim o = {.kind = CAVS_SGD, .lr = 1e-3};
  ck_assert(cavs_model_step(m, &o) == 0);
  ck_assert(cavs_model_forward(m, gs, k, NULL) == 0);
  ck_assert(cavs_model_vertex_value(m, 5, 30, "a", a, 64) == w && cavs_model_vertex_value(m, 5, 30, "d", z, 64) == w);
  long differ = 0;
  for (int j = 0; j < w; j++) differ += fabs(z[j] / a[j] - before[j] / a[j]) > 1e-3;
  ck_assert_msg(differ > w / 2, "the same draws after a step (%ld of %ld differ)", differ, w);
  /* inference: none */
  cavs_model_set_inference(m, 1);
  ck_assert(cavs_model_forward(m, gs, k, NULL) == 0);
  for (int i = 0; i < k; i++)
    for (int v = 0; v < gs[i]->n; v++) {
      ck_assert_int_eq(cavs_model_vertex_value(m, i, v, "d", z, 64), w);
      for (int j = 0; j < w; j++) ck_assert_msg(z[j] == 0, "inference: graph %d vertex %d: %.17g", i, v, z[j]);
    }
  cavs_model_free(m);
}
END_TEST

/* A dropout whose probability names an option (`option p = 0.3;`, dropout(a, p)) reads
 * it at run time: at its default it computes what the literal 0.3 computes, bit for
 * bit; set to 0 (cavs_model_set_option) what the model without the dropout computes;
 * set to 0.5 what a literal 0.5 computes, dropping about half and scaling by 2. Names
 * the model does not declare and values outside [0, 1) are refused. */
static void drop_variant(char *out, size_t n, const char *name, const char *decl, const char *call) {
  char src[1024];
  snprintf(src, sizeof src, "%s", drop_model);
  char *at = strstr(src, "dropout(a, 0.3)");
  *at = 0;
  snprintf(out, n, "model %s; %s%s%s%s", name, decl, strchr(src, ';') + 1, call, at + strlen("dropout(a, 0.3)"));
}

static double drop_loss(cavs_model *m, const cavs_graph **gs, int k) {
  cavs_stats st;
  ck_assert_msg(cavs_model_forward(m, gs, k, &st) == 0, "%s", cavs_model_error(m));
  return st.loss;
}

START_TEST(dropout_option) {
  char named[1024], lit5[1024], plain[1024];
  drop_variant(named, sizeof named, "dropopt", "option p_drop = 0.3;", "dropout(a, p_drop)");
  drop_variant(lit5, sizeof lit5, "droplit", "", "dropout(a, 0.5)");
  drop_variant(plain, sizeof plain, "dropnone", "", "(a)");
  const cavs_desc *d = load_model(drop_model, "double"), *dn = load_model(named, "double"),
                  *d5 = load_model(lit5, "double"), *d0 = load_model(plain, "double");
  ck_assert_int_eq(dn->noptions, 1);
  ck_assert_str_eq(dn->options[0].name, "p_drop");
  ck_assert(dn->options[0].kind == CAVS_OPTION_DROPOUT && dn->options[0].value == 0.3);
  ck_assert_int_eq(d->noptions, 0);
  ck_assert_int_eq(cavs_option_find(dn, "p_drop"), 0);
  ck_assert_int_eq(cavs_option_find(dn, "p"), -1);
  long dims[CAVS_MAX_DIMS];
  static TGraph g[TG_MINIBATCH];
  const cavs_graph *gs[TG_MINIBATCH];
  int k = tg_minibatch(d, dims, g, gs, false);
  cavs_model *m = new_model(dn, dims, 4), *ml = new_model(d, dims, 4), *m5 = new_model(d5, dims, 4),
             *m0 = new_model(d0, dims, 4);
  ck_assert(cavs_model_option(m, 0) == 0.3);
  double l_named = drop_loss(m, gs, k), l_lit = drop_loss(ml, gs, k);
  ck_assert_msg(l_named == l_lit, "default 0.3: %.17g, literal 0.3: %.17g", l_named, l_lit);
  ck_assert_int_eq(cavs_model_set_option(m, "p_drop", 0), 0);
  double l0 = drop_loss(m, gs, k), lplain = drop_loss(m0, gs, k);
  ck_assert_msg(l0 == lplain, "p_drop 0: %.17g, without dropout: %.17g", l0, lplain);
  ck_assert_msg(l0 != l_named, "p_drop 0 and 0.3 give the same loss %.17g", l0);
  ck_assert_int_eq(cavs_model_set_option(m, "p_drop", 0.5), 0);
  ck_assert(cavs_model_option(m, 0) == 0.5);
  double l5 = drop_loss(m, gs, k), llit5 = drop_loss(m5, gs, k);
  ck_assert_msg(l5 == llit5, "p_drop 0.5: %.17g, literal 0.5: %.17g", l5, llit5);
  long dropped = 0, kept = 0, w = dims[find_dim(d, "H")];
  double a[64], dv[64];
  ck_assert(w <= 64);
  for (int i = 0; i < k; i++)
    for (int v = 0; v < gs[i]->n; v++) {
      ck_assert_int_eq(cavs_model_vertex_value(m, i, v, "a", a, 64), w);
      ck_assert_int_eq(cavs_model_vertex_value(m, i, v, "d", dv, 64), w);
      for (int j = 0; j < w; j++) {
        if (dv[j] == 0) dropped++;
        else ck_assert_msg(dv[j] == a[j] * 2, "kept %.17g of %.17g", dv[j], a[j]), kept++;
      }
    }
  double share = (double)dropped / (double)(dropped + kept);
  ck_assert_msg(share > 0.45 && share < 0.55, "dropped %.3f of the values, not about 0.5", share);
  /* refused: a name it lacks, a value that is no probability; the value stays */
  ck_assert_int_eq(cavs_model_set_option(m, "p_dorp", 0.1), -1);
  ck_assert_msg(strstr(cavs_model_error(m), "no option 'p_dorp'"), "%s", cavs_model_error(m));
  ck_assert_int_eq(cavs_model_set_option(m, "p_drop", 1), -1);
  ck_assert_msg(strstr(cavs_model_error(m), "not in [0, 1)"), "%s", cavs_model_error(m));
  ck_assert_int_eq(cavs_model_set_option(m, "p_drop", -0.25), -1);
  ck_assert_int_eq(cavs_model_set_option(m, "p_drop", NAN), -1);
  ck_assert(cavs_model_option(m, 0) == 0.5);
  ck_assert_int_eq(cavs_model_set_option(ml, "p_drop", 0.1), -1);
  ck_assert_msg(strstr(cavs_model_error(ml), "declares none"), "%s", cavs_model_error(ml));
  cavs_model_free(m);
  cavs_model_free(ml);
  cavs_model_free(m5);
  cavs_model_free(m0);
}
END_TEST

/* A vertex in a named slot must be of the slot's type: the minibatch is refused,
 * naming the slot, both types and the vertex. */
START_TEST(typed_slots_checked) {
  const cavs_desc *d = load_model("tagger.vf", "double");
  long dims[CAVS_MAX_DIMS];
  static TGraph g[TG_MINIBATCH];
  const cavs_graph *gs[TG_MINIBATCH];
  tg_minibatch(d, dims, g, gs, false);
  unsigned seed = 2;
  sentence(&g[0], 5, &seed, d, dims);
  gs[0] = &g[0].g;
  cavs_model *m = new_model(d, dims, 1);
  ck_assert_msg(cavs_model_forward(m, gs, 1, NULL) == 0, "%s", cavs_model_error(m));
  g[0].child[2 * (2 * 5 + 3) + 1] = 2; /* tok 3's slot b: fwd 2, not a bwd */
  ck_assert(cavs_model_forward(m, gs, 1, NULL) != 0);
  ck_assert_msg(strstr(cavs_model_error(m), "graph 0, vertex 13: the child in slot 'b' is a 'fwd' (vertex 2), but 'tok' "
                                            "takes a 'bwd' there"),
                "%s", cavs_model_error(m));
  cavs_model_free(m);
}
END_TEST

/* want_views: 0 none, 1 every gathered row, 2 some */
static void views_against_copies(const char *file, int shape, int want_views) {
  const cavs_desc *d = load_model(file, "double");
  long dims[CAVS_MAX_DIMS];
  static TGraph g[TG_MINIBATCH];
  const cavs_graph *gs[TG_MINIBATCH];
  tg_minibatch(d, dims, g, gs, false);
  unsigned seed = 9;
  int k = 6;
  for (int i = 0; i < k; i++) {
    if (shape == 0) complete_tree(&g[i], 4, &seed, d, dims);
    else if (shape == 1) complete_tree(&g[i], 1 + i % 4, &seed, d, dims);
    else if (shape == 3) sentence(&g[i], 12, &seed, d, dims);
    else chain(&g[i], 12, &seed, d, dims);
    if (d->nvertex == 2) { /* the leaves are the type without children */
      int leaf = d->vertex[0].children ? 1 : 0;
      for (int v = 0; v < g[i].g.n; v++) g[i].type[v] = g[i].child[v * g[i].g.maxc] < 0 ? leaf : 1 - leaf;
      g[i].g.type = g[i].type;
    }
    gs[i] = &g[i].g;
  }
  cavs_model *m[2];
  cavs_stats st[2];
  cavs_backend_stats bs[2];
  cavs_optim o = {.kind = CAVS_ADAM, .lr = 1e-2};
  for (int v = 0; v < 2; v++) {
    m[v] = new_model(d, dims, 21);
    if (v) cavs_model_set_ablations(m[v], CAVS_NO_VIEWS);
    ck_assert_msg(cavs_model_forward(m[v], gs, k, &st[v]) == 0, "%s", cavs_model_error(m[v]));
    cavs_model_backward(m[v]);
    cavs_model_backend_stats(m[v], &bs[v], 0);
  }
  ck_assert_int_gt(bs[0].gathered_rows, 0);
  ck_assert_int_eq(bs[1].gathered_viewed, 0);
  ck_assert_msg(want_views == 2 ? bs[0].gathered_viewed > 0 && bs[0].gathered_viewed < bs[0].gathered_rows
                                : bs[0].gathered_viewed == (want_views ? bs[0].gathered_rows : 0),
                "%s, shape %d: %ld of %ld rows viewed", file, shape, bs[0].gathered_viewed, bs[0].gathered_rows);
  ck_assert_msg(st[0].loss == st[1].loss, "%s: loss %.17g with views, %.17g without", file, st[0].loss, st[1].loss);
  for (int pass = 0; pass < 2; pass++) {
    size_t n[2];
    const double *x[2];
    for (int v = 0; v < 2; v++)
      x[v] = pass ? cavs_model_params_flat(m[v], &n[v]) : cavs_model_grads_flat(m[v], &n[v]);
    ck_assert(n[0] == n[1]);
    double scale = 0;
    for (size_t i = 0; i < n[0]; i++) scale = fmax(scale, fabs(x[1][i]));
    for (size_t i = 0; i < n[0]; i++)
      if (fabs(x[0][i] - x[1][i]) > 1e-12 * scale)
        ck_abort_msg("%s, shape %d: %s %zu: %.17g with views, %.17g without", file, shape, pass ? "parameter" : "gradient",
                     i, x[0][i], x[1][i]);
    for (int v = 0; v < 2 && !pass; v++) ck_assert(cavs_model_step(m[v], &o) == 0);
  }
  for (int v = 0; v < 2; v++) cavs_model_free(m[v]);
}

START_TEST(views_read_children_in_place) {
  views_against_copies("treelstm.vf", 0, true);
  views_against_copies("treefc.vf", 0, true);
  views_against_copies("treegru.vf", 0, true);
  views_against_copies("lstm_lm.vf", 2, true);
  views_against_copies("treelstm.vf", 1, false);
  views_against_copies("twotype.vf", 0, false);
  /* sentences of one length: each chain's cells view the state of their own type (the
     tok vertices, which read two types in sentence order, copy) */
  views_against_copies("tagger.vf", 3, 2);
}
END_TEST

/* The gradients of two models (double) after a backward pass: bit for bit (tol 0), or
 * within tol of the largest. */
static void grads_agree(const char *what, cavs_model *a, cavs_model *b, double tol) {
  size_t n[2];
  const double *x[2] = {cavs_model_grads_flat(a, &n[0]), cavs_model_grads_flat(b, &n[1])};
  ck_assert(n[0] == n[1]);
  double scale = 0;
  for (size_t i = 0; i < n[0]; i++) scale = fmax(scale, fabs(x[1][i]));
  ck_assert(scale > 0);
  for (size_t i = 0; i < n[0]; i++)
    if (tol == 0 ? memcmp(&x[0][i], &x[1][i], sizeof x[0][i]) != 0 : fabs(x[0][i] - x[1][i]) > tol * scale)
      ck_abort_msg("%s: gradient %zu: %.17g, against %.17g", what, i, x[0][i], x[1][i]);
}

/* A dropout that keeps every value (its probability 0, every example's default, or
 * inference) is read in place (cavsc's drop_aliases): the Tree-LSTM's two, the pull
 * block's x = dropout(emb[word]) and the push block's dropout(h) of the state, copy
 * nothing then, and their readers read, and add their gradients to, the looked-up row
 * and the state. Against the model written without them: the same loss and gradients,
 * bit for bit, and the same value x (read where it lies); with p_drop 0.5 the dropout
 * runs in its own buffer (x dropped and scaled); at 0 again, and in inference at 0.5,
 * the model without them once more. */
static void drop_cut(char *s, const char *from, const char *to) {
  char *at = strstr(s, from);
  ck_assert_msg(at != NULL, "no '%s' in the model", from);
  size_t n = strlen(from), m = strlen(to);
  memmove(at + m, at + n, strlen(at + n) + 1);
  memcpy(at, to, m);
}

static void x_values(cavs_model *a, cavs_model *b, const cavs_graph **gs, int k, long w, double scale) {
  double xa[256], xb[256];
  long zero = 0, cells = 0;
  ck_assert(w <= 256);
  for (int i = 0; i < k; i++)
    for (int v = 0; v < gs[i]->n; v++) {
      ck_assert_msg(cavs_model_vertex_value(a, i, v, "x", xa, 256) == w, "%s", cavs_model_error(a));
      ck_assert_msg(cavs_model_vertex_value(b, i, v, "x", xb, 256) == w, "%s", cavs_model_error(b));
      for (long j = 0; j < w; j++, cells++) {
        zero += xa[j] == 0 && xb[j] != 0;
        if (scale == 1 || xa[j] != 0)
          ck_assert_msg(xa[j] == xb[j] * scale, "graph %d vertex %d: x[%ld] %.17g, without the dropout %.17g", i, v, j,
                        xa[j], xb[j]);
      }
    }
  if (scale != 1) ck_assert_msg(zero > cells / 5, "%ld of %ld values of x dropped", zero, cells);
}

START_TEST(dropout_read_in_place) {
  const cavs_desc *d = load_model("treelstm.vf", "double");
  ck_assert_int_eq(d->naliases, 2);
  char src[8192];
  ck_assert(d->source_text && strlen(d->source_text) < sizeof src);
  strcpy(src, d->source_text);
  drop_cut(src, "dropout(emb[word], p_drop)", "emb[word]");
  drop_cut(src, "dropout(h, p_drop)", "h");
  drop_cut(src, "option p_drop = 0;", "");
  const cavs_desc *d0 = load_model(src, "double");
  ck_assert_int_eq(d0->naliases, 0);
  long dims[CAVS_MAX_DIMS];
  static TGraph g[TG_MINIBATCH];
  const cavs_graph *gs[TG_MINIBATCH];
  int k = tg_minibatch(d, dims, g, gs, false);
  long w = dims[find_dim(d, "E")];
  cavs_model *m = new_model(d, dims, 4), *m0 = new_model(d0, dims, 4);
  cavs_stats st, st0;
  for (int round = 0; round < 3; round++) {
    if (round == 1) ck_assert_int_eq(cavs_model_set_option(m, "p_drop", 0.5), 0);
    if (round == 2) ck_assert_int_eq(cavs_model_set_option(m, "p_drop", 0), 0);
    ck_assert_msg(cavs_model_forward(m, gs, k, &st) == 0, "%s", cavs_model_error(m));
    ck_assert_msg(cavs_model_forward(m0, gs, k, &st0) == 0, "%s", cavs_model_error(m0));
    x_values(m, m0, gs, k, w, round == 1 ? 2 : 1);
    cavs_model_backward(m);
    cavs_model_backward(m0);
    if (round == 1) {
      ck_assert_msg(st.loss != st0.loss, "p_drop 0.5: the loss without the dropout, %.17g", st.loss);
      continue;
    }
    ck_assert_msg(st.loss == st0.loss, "round %d: loss %.17g, without the dropout %.17g", round, st.loss, st0.loss);
    grads_agree("p_drop 0, against no dropout", m, m0, 0);
  }
  /* inference drops nothing whatever p_drop is */
  ck_assert_int_eq(cavs_model_set_option(m, "p_drop", 0.5), 0);
  cavs_model_set_inference(m, 1);
  cavs_model_set_inference(m0, 1);
  ck_assert(cavs_model_forward(m, gs, k, &st) == 0 && cavs_model_forward(m0, gs, k, &st0) == 0);
  ck_assert_msg(st.loss == st0.loss, "inference at 0.5: %.17g, without the dropout %.17g", st.loss, st0.loss);
  x_values(m, m0, gs, k, w, 1);
  cavs_model_free(m);
  cavs_model_free(m0);
}
END_TEST

/* Homes (scheduler.c, plan_homes; cavsc's state_homes): a child whose type's loops write
 * its whole state stores it in its parent's gathered row as well, and reads the gradient
 * its parent leaves there, so that the gather copies nothing and adds nothing back.
 * Against every gather copying (CAVS_NO_HOMES, under which the loops store to scratch
 * rows and read zeros): the same loss, and the same gradients, bit for bit where every
 * vertex has one parent (a child's gradient is the same two terms added: its own row's
 * and the parent's), to 1e-12 on DAGs, where a second parent's term comes in another
 * order. `want`: how many gathered rows are at home: 0 none, 1 all but the views', 2
 * some but not all, -1 not checked. `shape`: 0 the random trees and DAGs (typed graphs)
 * of tg_minibatch, 1 complete trees of one depth (views), 2 chains of several lengths,
 * 3 tagger sentences; `dags` adds tg_minibatch's DAGs. */
static void homes_against_copies(const char *file, int shape, bool dags, int want) {
  const cavs_desc *d = load_model(file, "double");
  long dims[CAVS_MAX_DIMS];
  static TGraph g[TG_MINIBATCH];
  const cavs_graph *gs[TG_MINIBATCH];
  int k = tg_minibatch(d, dims, g, gs, dags);
  unsigned seed = 12;
  for (int i = 0; shape && i < k; i++) {
    if (shape == 1) complete_tree(&g[i], 3, &seed, d, dims);
    else if (shape == 2) chain(&g[i], 3 + 4 * i, &seed, d, dims);
    else sentence(&g[i], 3 + 5 * i, &seed, d, dims);
    gs[i] = &g[i].g;
  }
  cavs_model *m[2];
  cavs_stats st[2];
  cavs_backend_stats bs[2];
  for (int v = 0; v < 2; v++) {
    m[v] = new_model(d, dims, 17);
    if (v) cavs_model_set_ablations(m[v], CAVS_NO_HOMES);
    ck_assert_msg(cavs_model_forward(m[v], gs, k, &st[v]) == 0, "%s", cavs_model_error(m[v]));
    cavs_model_backward(m[v]);
    cavs_model_backend_stats(m[v], &bs[v], 0);
  }
  long rows = bs[0].gathered_rows, home = bs[0].gathered_homed, viewed = bs[0].gathered_viewed;
  ck_assert_int_gt(rows, 0);
  ck_assert_int_eq(bs[1].gathered_homed, 0);
  ck_assert_msg(want < 0 || (want == 0 && home == 0) || (want == 1 && home > 0 && home + viewed == rows) ||
                    (want == 2 && home > 0 && home + viewed < rows),
                "%s, shape %d: %ld of %ld gathered rows at home, %ld viewed", file, shape, home, rows, viewed);
  ck_assert_msg(st[0].loss == st[1].loss, "%s: loss %.17g at home, %.17g copied", file, st[0].loss, st[1].loss);
  /* a stacked LSTM's first-layer h takes more than two terms (its parent's, and the
     second layer's input products' at its own row), which a home adds in another
     order: to 1e-12, as on DAGs */
  grads_agree(file, m[0], m[1], dags || !strcmp(file, "lstm_lm2.vf") ? 1e-12 : 0);
  for (int v = 0; v < 2; v++) cavs_model_free(m[v]);
}

/* Each distinct looked-up row multiplied once (backend_cpu.c, cpu_gemm_distinct: x =
 * emb[word], x @ W once a word of the stage, dW and dx over the sums of dy by word)
 * against every row multiplied (CAVS_NO_DEDUP), over two training steps: the same loss
 * and gradients to 1e-12 (the sums of a word's rows come in another order), and fewer
 * product flops wherever the model multiplies looked-up rows (every example but
 * Tree-FC's and MV-RNN's, whose lookups go into a state or a matrix; the test graphs'
 * vocabulary has 11 words, so words repeat). With the Tree-LSTM's dropout at 0.5
 * (rows of one word differ) every row is multiplied: the flops and gradients of
 * CAVS_NO_DEDUP, bit for bit. Built with --no-merge, the Tree-LSTM's x @ Wi, x @ Wo
 * and x @ Wu are three products over the same rows and columns, whose dy differ: the
 * sums of dy one product's dx computed are not another's. */
static void dedup_against_every_row(const char *file, double p_drop, const char *build) {
  const cavs_desc *d = load_model_with(file, "double", "c", build);
  long dims[CAVS_MAX_DIMS];
  static TGraph g[TG_MINIBATCH];
  const cavs_graph *gs[TG_MINIBATCH];
  int k = tg_minibatch(d, dims, g, gs, true); /* with DAGs: more rows */
  cavs_model *m[2];
  cavs_stats st[2];
  cavs_backend_stats bs[2];
  for (int v = 0; v < 2; v++) {
    m[v] = new_model(d, dims, 23);
    if (v) cavs_model_set_ablations(m[v], CAVS_NO_DEDUP);
    if (p_drop > 0) ck_assert_int_eq(cavs_model_set_option(m[v], "p_drop", p_drop), 0);
  }
  cavs_optim opt = {.kind = CAVS_SGD, .lr = 0.1};
  for (int step = 0; step < 2; step++) {
    for (int v = 0; v < 2; v++) {
      ck_assert_msg(cavs_model_forward(m[v], gs, k, &st[v]) == 0, "%s", cavs_model_error(m[v]));
      cavs_model_backward(m[v]);
      cavs_model_backend_stats(m[v], &bs[v], 1);
    }
    /* (Tree-FC's leaves holding their words: as many or fewer, as the tasks mix them) */
    bool some = strcmp(file, "treefc.vf") && strcmp(file, "mvrnn.vf") && p_drop == 0;
    bool kids = !strcmp(file, TG_TREEFC_WORDS);
    ck_assert_msg(kids   ? bs[0].gemm_flops <= bs[1].gemm_flops
                  : some ? bs[0].gemm_flops < bs[1].gemm_flops
                         : bs[0].gemm_flops == bs[1].gemm_flops,
                  "%s, step %d: %.0f product flops, every row multiplied %.0f", file, step, bs[0].gemm_flops,
                  bs[1].gemm_flops);
    double tol = p_drop > 0 ? 0 : 1e-12;
    ck_assert_msg(fabs(st[0].loss - st[1].loss) <= tol * fabs(st[1].loss), "%s, step %d: loss %.17g, against %.17g",
                  file, step, st[0].loss, st[1].loss);
    grads_agree(file, m[0], m[1], tol);
    for (int v = 0; v < 2; v++) ck_assert_msg(cavs_model_step(m[v], &opt) == 0, "%s", cavs_model_error(m[v]));
  }
  for (int v = 0; v < 2; v++) cavs_model_free(m[v]);
}

START_TEST(dedup_changes_nothing) {
  char file[64];
  snprintf(file, sizeof file, "%s.vf", examples[_i]);
  dedup_against_every_row(file, 0, NULL);
  if (!strcmp(file, "treelstm.vf")) dedup_against_every_row(file, 0.5, NULL);
  if (!strcmp(file, "treelstm.vf")) dedup_against_every_row(file, 0, "--no-merge");
}
END_TEST

/* The same where the looked-up rows are children's states (cavs_gemm_kids): Tree-FC's
 * leaves hold their word's row, and the inner vertices' product over [h_0; h_1] takes
 * each distinct word once at each child slot, the other children's rows apart. Fewer
 * flops, the loss and gradients to 1e-12 against every row multiplied, on trees large
 * enough for both slots' words to be multiplied once and on DAGs (a leaf of two
 * parents); on the small minibatch of every example's test (each slot's rows apart,
 * too few to take the words once). And inference, where the product's rows come from a
 * table made once, as training. */
/* A complete binary tree of `leaves` leaves (a power of two), leaves first, each level
   after the one below; with `ladder`, the first level's vertices take leaves i and i + 1
   (leaves of two parents: a DAG), and the levels above pair them up, an odd one carried
   up a level as a vertex of one child. Every vertex of the first level has two leaves as
   children, and no other has one: the tasks cavs_gemm_kids takes apart. */
static void full_tree(TGraph *t, int leaves, bool ladder, int leaf, int inner) {
  memset(t, 0, sizeof *t);
  t->g.maxc = 2;
  int n = leaves, lo = 0, hi = leaves; /* the level below: [lo, hi) */
  for (int v = 0; v < leaves; v++) t->type[v] = leaf, t->child[2 * v] = t->child[2 * v + 1] = -1;
  for (bool first = true; hi - lo > 1; first = false) {
    int at = n;
    if (first && ladder)
      for (int i = lo; i + 1 < hi; i++, n++) t->child[2 * n] = i, t->child[2 * n + 1] = i + 1, t->type[n] = inner;
    else
      for (int i = lo; i < hi; i += 2, n++) {
        t->child[2 * n] = i;
        t->child[2 * n + 1] = i + 1 < hi ? i + 1 : -1;
        t->type[n] = inner;
      }
    lo = at, hi = n;
  }
  ck_assert_int_le(n, 1024);
  t->g.n = n;
  t->g.child = t->child;
  t->g.type = t->type;
}

static void inference_like_training(const char *file);
START_TEST(dedup_of_children_holding_words) {
  const cavs_desc *d = load_model(TG_TREEFC_WORDS, "double");
  long dims[CAVS_MAX_DIMS];
  cavs_dims_default(d, dims);
  dims[find_dim(d, "H")] = 8;
  dims[find_dim(d, "V")] = 11;
  static TGraph g[TG_MINIBATCH];
  const cavs_graph *gs[TG_MINIBATCH];
  int arity, leaf, inner;
  tg_types(d, &arity, &leaf, &inner);
  /* complete trees of 16 to 128 leaves, and two DAGs whose leaves have two parents:
     each slot's first-level task has more than the 32 rows with a word that make it
     worth taking apart, and W's gradient, over every level at once, has both kinds of
     child in a slot (tg_features leaves a fifth of the leaves without a word: zero
     rows, neither kind) */
  unsigned seed = 31;
  for (int k = 0; k < TG_MINIBATCH; k++) {
    full_tree(&g[k], 16 << (k % 4), k >= TG_MINIBATCH - 2, leaf, inner);
    tg_features(&g[k], d, dims, &seed);
    gs[k] = &g[k].g;
  }
  cavs_model *m[2];
  for (int v = 0; v < 2; v++) m[v] = new_model(d, dims, 23);
  cavs_model_set_ablations(m[1], CAVS_NO_DEDUP);
  cavs_optim opt = {.kind = CAVS_SGD, .lr = 0.1};
  for (int step = 0; step < 2; step++) {
    cavs_stats st[2];
    cavs_backend_stats bs[2];
    for (int v = 0; v < 2; v++) {
      cavs_model_backend_stats(m[v], NULL, 1);
      ck_assert_msg(cavs_model_forward(m[v], gs, TG_MINIBATCH, &st[v]) == 0, "%s", cavs_model_error(m[v]));
      cavs_model_backward(m[v]);
      cavs_model_backend_stats(m[v], &bs[v], 0);
    }
    /* the first level's products are half the flops, of 11 words: a third at least off */
    ck_assert_msg(bs[0].gemm_flops < 0.67 * bs[1].gemm_flops, "step %d: %.0f product flops, every row multiplied %.0f",
                  step, bs[0].gemm_flops, bs[1].gemm_flops);
    ck_assert_msg(fabs(st[0].loss - st[1].loss) <= 1e-12 * fabs(st[1].loss), "step %d: loss %.17g, against %.17g", step,
                  st[0].loss, st[1].loss);
    grads_agree("tfc_words", m[0], m[1], 1e-12);
    for (int v = 0; v < 2; v++) ck_assert_msg(cavs_model_step(m[v], &opt) == 0, "%s", cavs_model_error(m[v]));
  }
  for (int v = 0; v < 2; v++) cavs_model_free(m[v]);
  /* random trees and DAGs, whose levels mix leaves and inner vertices: every row in one
     product, mostly (the products' flops as many or fewer) */
  dedup_against_every_row(TG_TREEFC_WORDS, 0, NULL);
  inference_like_training(TG_TREEFC_WORDS);
}
END_TEST

/* Every example, on trees (bit for bit) and with DAGs */
START_TEST(homes_change_nothing) {
  char file[64];
  snprintf(file, sizeof file, "%s.vf", examples[_i]);
  homes_against_copies(file, 0, false, -1);
  homes_against_copies(file, 0, true, -1);
}
END_TEST

/* Who is at home: on trees of mixed depths (no views) every child of a Tree-LSTM, GRU
 * or Tree-FC; on complete trees of one depth none (the views read them in place); on
 * chains of several lengths every step; MV-RNN's children that are internal vertices
 * (its leaves' state holds a looked-up matrix, copied into it: no home); every chain
 * step of the tagger's sentences, each at home twice (in the next step's gathered row
 * and in its word's); a set's children in their edge's row: the Child-Sum
 * Tree-LSTM's all of them; with tg_minibatch's DAGs, whose shared vertices have more
 * readers than homes, some of the lattice's. */
START_TEST(homes_store_children_at_home) {
  homes_against_copies("treelstm.vf", 0, false, 1);
  homes_against_copies("treegru.vf", 0, false, 1);
  homes_against_copies("treefc.vf", 0, false, 1);
  homes_against_copies("treelstm.vf", 1, false, 0);
  homes_against_copies("lstm_lm.vf", 2, false, 1);
  homes_against_copies("mvrnn.vf", 0, false, 2);
  homes_against_copies("tagger.vf", 3, false, 1);
  homes_against_copies("childsum.vf", 0, false, 1);
  homes_against_copies("lattice_lstm.vf", 0, true, 2);
  homes_against_copies("nary_treelstm.vf", 0, false, 1);
}
END_TEST

/* What a pass reads it first writes: every per-row buffer and gradient set to NaN
 * between a first pass and a second over the same minibatch (cavs_model_poison), and
 * the second gives the loss and gradients of a model never poisoned, bit for bit. A
 * gather, a product or a loop reading a row left unwritten (a product's rows without
 * children, CAVS_PROD_Y_INNER; a gathered buffer's; another type's rows) would carry
 * the NaN into the loss or a gradient. On random trees with empty slots and DAGs, and
 * on complete trees, whose gathers are views. */
static void poison_changes_nothing_policy(const char *file, bool complete, int policy, bool mixed) {
  const cavs_desc *d = load_model(file, "double");
  long dims[CAVS_MAX_DIMS];
  static TGraph g[TG_MINIBATCH];
  const cavs_graph *gs[TG_MINIBATCH];
  int k = tg_minibatch(d, dims, g, gs, true);
  unsigned seed = 4;
  for (int i = 0; complete && i < k; i++) {
    complete_tree(&g[i], 3, &seed, d, dims);
    int leaf, inner, arity;
    tg_types(d, &arity, &leaf, &inner);
    for (int v = 0; v < g[i].g.n; v++) g[i].type[v] = g[i].child[2 * v] < 0 ? leaf : inner;
    g[i].g.type = g[i].type;
    gs[i] = &g[i].g;
  }
  for (int i = 0; mixed && i < k; i++)
    for (int v = 0; v < g[i].g.n; v++) g[i].type[v] = (int)(tg_rand(&seed) % (unsigned)d->nvertex);
  cavs_model *m[2];
  cavs_stats st[2];
  for (int v = 0; v < 2; v++) {
    m[v] = new_model(d, dims, 8);
    cavs_model_set_policy(m[v], policy);
    ck_assert_msg(cavs_model_forward(m[v], gs, k, &st[v]) == 0, "%s", cavs_model_error(m[v]));
    if (v) {
      ck_assert_int_eq(cavs_model_poison(m[v]), 0);
      ck_assert_msg(cavs_model_forward(m[v], gs, k, &st[v]) == 0, "%s", cavs_model_error(m[v]));
    }
    cavs_model_backward(m[v]);
  }
  ck_assert_msg(st[0].loss == st[1].loss, "%s: loss %.17g, poisoned %.17g", file, st[0].loss, st[1].loss);
  int graph, vertex;
  char msg[256];
  ck_assert_msg(cavs_model_check_finite(m[1], &graph, &vertex, msg, sizeof msg) == 0, "%s: %s (graph %d, vertex %d)",
                file, msg, graph, vertex);
  grads_agree(file, m[0], m[1], 0); /* (the second poisoned) */
  for (int v = 0; v < 2; v++) cavs_model_free(m[v]);
}

static void poison_changes_nothing(const char *file, bool complete) {
  poison_changes_nothing_policy(file, complete, CAVS_BFS, false);
}

START_TEST(passes_read_only_what_they_wrote) {
  for (size_t i = 0; i < sizeof examples / sizeof *examples; i++) {
    char file[64];
    snprintf(file, sizeof file, "%s.vf", examples[i]);
    poison_changes_nothing(file, false);
    if (strcmp(examples[i], "lstm_lm") && strcmp(examples[i], "lstm_lm2") && strcmp(examples[i], "tagger") && strcmp(examples[i], "tagger_chars") &&
        strcmp(examples[i], "lattice_lstm") && strcmp(examples[i], "lattice_gru") &&
        strcmp(examples[i], "seq2seq") && strcmp(examples[i], "moe_lm"))
      poison_changes_nothing(file, true);
  }
  /* a value zero at the leaves that the push block reads there, through a concat that
     copies it: its loop must store the zeros */
  poison_changes_nothing("model zl; dim H = 4; dim C = 3; input y : class[C]; input f : real[H];\n"
                         "param W[H,H], Wc[2H,C] init uniform(-1, 1);\n"
                         "vertex node (children 1) { a = tanh(gather(0)); h = tanh(f + a @ W);\n"
                         "  scatter(h); push(concat(h, a)); }\n"
                         "push (p) { loss softmax_xent(p @ Wc, y); }\n",
                         false);
  /* rows without a word left open by x @ [Wg|W2], where h @ Ug, added into x @ Wg alone,
     sets only Wg's columns: W2's must not be left open (they were, found by a helper's
     differential testing: a dev loss that moved with the policy) */
  poison_changes_nothing("model op; dim H = 2; dim X = 2; dim V = 3; input word : index[V]; input label : class[H];\n"
                         "param emb[V,H], Wg[H,X], Ug[H,X], W2[H,H], Wo[X,H];\npull { x = emb[word]; }\n"
                         "vertex v (children 1) { x = pull(); h = tanh(gather(0)); g = x @ Wg + h @ Ug; y = x @ W2;\n"
                         "  scatter(tanh(g @ Wo + y)); push(h); }\n"
                         "push (p) { loss softmax_xent(p, label); }\n",
                         false);
  /* tasks that mix a type's vertices without children and with: a leaves' loop over
     their first rows only */
  for (int p = 2; p < 4; p++) {
    poison_changes_nothing_policy(mixed_model, false, policies[p], true);
    poison_changes_nothing_policy("treelstm.vf", true, policies[p], false);
  }
}
END_TEST

/* The pull block runs at the rows of the types that read it alone (cavs_vertex_desc
 * .reads_pull): twotype's leaves look their word up, its internal vertices read nothing
 * of the pull block, which neither looks a row up there nor clears its gradient. At a
 * leaf its x is the embedding's row of the word (a row of zeros without one), read back
 * against the table itself; at an internal vertex there is no x to read, and the value
 * is refused, saying why. (That the results are the same: batched_equals_serial,
 * passes_read_only_what_they_wrote, the gradient checks.) */
START_TEST(pull_runs_where_read) {
  const cavs_desc *d = load_model("twotype.vf", "double");
  int leaf = -1, internal = -1, emb = -1;
  for (int t = 0; t < d->nvertex; t++) {
    if (!strcmp(d->vertex[t].name, "leaf")) leaf = t;
    if (!strcmp(d->vertex[t].name, "internal")) internal = t;
  }
  for (int i = 0; i < d->nparams; i++)
    if (!strcmp(d->params[i].name, "emb")) emb = i;
  ck_assert(leaf >= 0 && internal >= 0 && emb >= 0);
  ck_assert_msg(d->vertex[leaf].reads_pull && !d->vertex[internal].reads_pull, "reads_pull %d %d",
                d->vertex[leaf].reads_pull, d->vertex[internal].reads_pull);
  long dims[CAVS_MAX_DIMS];
  static TGraph g[TG_MINIBATCH];
  const cavs_graph *gs[TG_MINIBATCH];
  int k = tg_minibatch(d, dims, g, gs, false);
  cavs_model *m = new_model(d, dims, 5);
  cavs_stats st;
  ck_assert_msg(cavs_model_forward(m, gs, k, &st) == 0, "%s", cavs_model_error(m));
  cavs_model_backward(m);
  long rows, cols, ld, E = dims[find_dim(d, "E")];
  const double *table = cavs_model_param(m, emb, &rows, &cols, &ld);
  ck_assert_int_eq(cols, E);
  int word = find_input(d, "word"), leaves = 0, inner = 0;
  static double x[1024];
  for (int j = 0; j < k; j++)
    for (int v = 0; v < gs[j]->n; v++) {
      long got = cavs_model_vertex_value(m, j, v, "x", x, E);
      if (g[j].type[v] == internal) {
        ck_assert_msg(got == -1 && strstr(cavs_model_error(m), "pull block") &&
                          strstr(cavs_model_error(m), "internal"),
                      "graph %d, internal vertex %d: x gave %ld (%s)", j, v, got, cavs_model_error(m));
        inner++;
        continue;
      }
      ck_assert_msg(got == E, "graph %d, leaf %d: %s", j, v, cavs_model_error(m));
      int w = g[j].feat[v * d->nint + word];
      for (long c = 0; c < E; c++)
        ck_assert_msg(x[c] == (w < 0 ? 0 : table[(size_t)w * (size_t)ld + (size_t)c]), "graph %d, leaf %d, word %d, column %ld: %g",
                      j, v, w, c, x[c]);
      leaves++;
    }
  ck_assert(leaves > 0 && inner > 0);
  cavs_model_free(m);
}
END_TEST

/* Tasks a minibatch takes under each policy (cavs_stats.tasks) against the lower bound
 * (lower_bound: summed over the types, the most vertices of the type on one path). On
 * chains, trees of one type and the two-type tree every policy takes the bound, the
 * longest path. Where two types alternate along chains out of step (a0 <- b1 <- a2 and
 * b0 <- a1 <- b2: level by level that is both types at each of 3 levels), depth takes 6
 * tasks; frontier takes a{a0}, b{b0, b1}, then a{a1, a2} (every a left is ready: Lemma
 * 1), b{b2}: 4, the bound, as does agenda (mean levels 0 against 0, then b alone, then
 * a's 1.5 against nothing). */
static int tasks_of(const cavs_desc *d, const long *dims, const cavs_graph **gs, int k, int policy, int *bound) {
  cavs_model *m = new_model(d, dims, 3);
  cavs_model_set_policy(m, policy);
  cavs_stats st;
  ck_assert_msg(cavs_model_forward(m, gs, k, &st) == 0, "%s", cavs_model_error(m));
  *bound = st.lower_bound;
  cavs_model_free(m);
  return st.tasks;
}

START_TEST(policies_count_tasks) {
  const char *files[] = {"lstm_lm.vf", "treelstm.vf", "twotype.vf"};
  for (int f = 0; f < 3; f++) {
    const cavs_desc *d = load_model(files[f], "double");
    long dims[CAVS_MAX_DIMS];
    static TGraph g[TG_MINIBATCH];
    const cavs_graph *gs[TG_MINIBATCH];
    int k = tg_minibatch(d, dims, g, gs, false), leaf, inner, arity;
    tg_types(d, &arity, &leaf, &inner);
    unsigned seed = 3;
    if (f == 0)
      for (int i = 0; i < k; i++) chain(&g[i], (int[]){9, 1, 4, 17, 4, 30}[i], &seed, d, dims);
    for (int i = 0; i < k; i++) {
      for (int v = 0; f == 2 && v < g[i].g.n; v++) {
        bool none = true;
        for (int c = 0; c < g[i].g.maxc; c++) none = none && g[i].child[v * g[i].g.maxc + c] < 0;
        g[i].type[v] = none ? leaf : inner;
      }
      g[i].g.type = g[i].type;
      gs[i] = &g[i].g;
    }
    int bound = 0, b2 = 0;
    for (int p = 0; p < 4; p++) {
      int n = tasks_of(d, dims, gs, k, policies[p], &b2);
      if (p == 0) bound = b2;
      ck_assert_int_eq(b2, bound);
      ck_assert_msg(n == bound, "%s, policy %d: %d tasks, longest path %d", files[f], policies[p], n, bound);
    }
    if (f == 0) ck_assert_int_eq(bound, 30);
  }
  const cavs_desc *d = load_model(mixed_model, "double");
  long dims[CAVS_MAX_DIMS];
  static TGraph g[2];
  const cavs_graph *gs[2];
  unsigned seed = 1;
  cavs_dims_default(d, dims);
  for (int i = 0; i < 2; i++) {
    chain(&g[i], 3, &seed, d, dims);
    for (int v = 0; v < 3; v++) g[i].type[v] = (v + i) % 2;
    g[i].g.type = g[i].type;
    gs[i] = &g[i].g;
  }
  int want[] = {6, 6, 4, 4}, bound;
  for (int p = 0; p < 4; p++) {
    int n = tasks_of(d, dims, gs, 2, policies[p], &bound);
    ck_assert_msg(n == want[p], "alternating chains, policy %d: %d tasks, not %d", policies[p], n, want[p]);
    ck_assert_int_eq(bound, 4); /* two a's on one path, two b's on another */
  }
  /* tagger sentences: the forward and the backward chain need n tasks each, the tok
     vertices one more; level by level takes about n / 2 more for the toks */
  d = load_model("tagger.vf", "double");
  static TGraph sg[3];
  const cavs_graph *sgs[3];
  cavs_dims_default(d, dims);
  dims[find_dim(d, "V")] = 50;
  for (int i = 0; i < 3; i++) {
    sentence(&sg[i], (int[]){7, 12, 9}[i], &seed, d, dims);
    sgs[i] = &sg[i].g;
  }
  int n[4];
  for (int p = 0; p < 4; p++) n[p] = tasks_of(d, dims, sgs, 3, policies[p], &bound);
  ck_assert_int_eq(bound, 2 * 12 + 1);
  ck_assert_msg(n[3] == bound && n[0] > bound && n[1] == n[0], "tagger: bfs %d, depth %d, agenda %d, frontier %d, bound %d",
                n[0], n[1], n[2], n[3], bound);
}
END_TEST

/* Inference (cavs_model_set_inference): the same losses and predictions as a training
 * model's forward pass, though it keeps nothing for a backward pass and, once as many
 * rows as the vocabulary went through a product of looked-up rows, looks rows of
 * emb @ W up instead (fewer flops then); after a step taken with inference off, turned
 * on again, it uses the new parameters, not the old table; and a backward pass after
 * an inference pass makes the step fail, saying why. */
static void inference_like_training(const char *file) {
  const cavs_desc *d = load_model(file, "double");
  long dims[CAVS_MAX_DIMS];
  static TGraph g[TG_MINIBATCH];
  const cavs_graph *gs[TG_MINIBATCH];
  int k = tg_minibatch(d, dims, g, gs, true);
  cavs_model *m[2];
  for (int v = 0; v < 2; v++) m[v] = new_model(d, dims, 13);
  cavs_model_set_inference(m[1], 1);
  cavs_optim o = {.kind = CAVS_ADAM, .lr = 1e-2};
  for (int round = 0; round < 2; round++) {
    cavs_backend_stats bs[2];
    for (int pass = 0; pass < 3; pass++) {
      cavs_stats st[2];
      for (int v = 0; v < 2; v++) {
        cavs_model_backend_stats(m[v], NULL, 1);
        ck_assert_msg(cavs_model_forward(m[v], gs, k, &st[v]) == 0, "%s", cavs_model_error(m[v]));
        cavs_model_backend_stats(m[v], &bs[v], 0);
      }
      ck_assert_msg(fabs(st[0].loss - st[1].loss) <= 1e-12 * fabs(st[0].loss), "%s, round %d: loss %.17g, inference %.17g",
                    file, round, st[0].loss, st[1].loss);
      ck_assert_int_eq(st[0].correct, st[1].correct);
      for (int i = 0; i < k; i++)
        for (int v = 0; v < gs[i]->n; v++)
          ck_assert_int_eq(cavs_model_vertex_class(m[0], i, v), cavs_model_vertex_class(m[1], i, v));
    }
    /* by the third pass the tables are made: fewer flops */
    ck_assert_msg(bs[1].gemm_flops < bs[0].gemm_flops, "%s: %g flops in inference, %g in training", file,
                  bs[1].gemm_flops, bs[0].gemm_flops);
    /* a step on both, inference off for it */
    cavs_model_set_inference(m[1], 0);
    for (int v = 0; v < 2; v++) {
      ck_assert_msg(cavs_model_forward(m[v], gs, k, NULL) == 0, "%s", cavs_model_error(m[v]));
      cavs_model_backward(m[v]);
      ck_assert(cavs_model_step(m[v], &o) == 0);
    }
    cavs_model_set_inference(m[1], 1);
  }
  /* no backward pass after an inference pass */
  ck_assert(cavs_model_forward(m[1], gs, k, NULL) == 0);
  cavs_model_backward(m[1]);
  ck_assert(cavs_model_step(m[1], &o) != 0);
  ck_assert_msg(strstr(cavs_model_error(m[1]), "inference"), "%s", cavs_model_error(m[1]));
  for (int v = 0; v < 2; v++) cavs_model_free(m[v]);
}

START_TEST(inference_matches_training) {
  inference_like_training("treelstm.vf");
  inference_like_training("lstm_lm.vf");
  inference_like_training("treegru.vf");
  inference_like_training("twotype.vf");
}
END_TEST

/* cavs_model_vertex_value: a named value at any vertex, read back where the stages left
 * it: h equals what the vertex pushed; at an internal vertex, hs is the sum of its
 * children's h; a kept gate is a sigmoid's; c and h at a vertex are the values its
 * parent gathered (c_0/h_0 are not names a parent keeps: s is named twice); values
 * not stored, not computed at a leaf or not kept in inference are refused, saying why. */
START_TEST(vertex_values_by_name) {
  const cavs_desc *d = load_model("treelstm.vf", "double");
  long dims[CAVS_MAX_DIMS];
  static TGraph g[TG_MINIBATCH];
  const cavs_graph *gs[TG_MINIBATCH];
  int k = tg_minibatch(d, dims, g, gs, false);
  long H = dims[find_dim(d, "H")];
  cavs_model *m = new_model(d, dims, 6);
  ck_assert_msg(cavs_model_forward(m, gs, k, NULL) == 0, "%s", cavs_model_error(m));
  double h[64], out[64], hs[64], a[64], b[64], gate[64];
  int internal = 0, leaves = 0;
  for (int i = 0; i < k; i++)
    for (int v = 0; v < gs[i]->n; v++) {
      ck_assert_int_eq(cavs_model_vertex_value(m, i, v, "h", h, 64), H);
      ck_assert_int_eq(cavs_model_vertex_output(m, i, v, out, 64), H);
      for (long j = 0; j < H; j++) ck_assert(h[j] == out[j]);
      const int *ch = gs[i]->child + (size_t)v * (size_t)gs[i]->maxc;
      if (ch[0] < 0 && ch[1] < 0) {
        leaves++;
        ck_assert_int_eq(cavs_model_vertex_value(m, i, v, "f_0", gate, 64), -1);
        ck_assert_msg(strstr(cavs_model_error(m), "without children"), "%s", cavs_model_error(m));
        continue;
      }
      internal++;
      ck_assert_int_eq(cavs_model_vertex_value(m, i, v, "hs", hs, 64), H);
      for (long j = 0; j < H; j++) a[j] = b[j] = 0;
      if (ch[0] >= 0) ck_assert_int_eq(cavs_model_vertex_value(m, i, ch[0], "h", a, 64), H);
      if (ch[1] >= 0) ck_assert_int_eq(cavs_model_vertex_value(m, i, ch[1], "h", b, 64), H);
      for (long j = 0; j < H; j++) ck_assert_msg(fabs(hs[j] - (a[j] + b[j])) <= 1e-12, "hs[%ld]", j);
      ck_assert_int_eq(cavs_model_vertex_value(m, i, v, "i", gate, 64), H);
      for (long j = 0; j < H; j++) ck_assert(gate[j] > 0 && gate[j] < 1);
    }
  ck_assert(internal > 0 && leaves > 0);
  ck_assert_int_eq(cavs_model_vertex_value(m, 0, 0, "s", NULL, 0), -1);
  ck_assert_int_eq(cavs_model_vertex_value(m, 0, 0, "nonesuch", NULL, 0), -1);
  ck_assert_msg(strstr(cavs_model_error(m), "no value 'nonesuch'"), "%s", cavs_model_error(m));
  ck_assert_int_eq(cavs_model_vertex_value(m, 0, 100000, "h", NULL, 0), -1);
  ck_assert_int_eq(cavs_model_vertex_value(m, 0, 0, "logits", NULL, 0), dims[find_dim(d, "C")]);
  cavs_model_set_inference(m, 1);
  ck_assert_msg(cavs_model_forward(m, gs, k, NULL) == 0, "%s", cavs_model_error(m));
  int root = gs[0]->n - 1;
  ck_assert_int_eq(cavs_model_vertex_value(m, 0, root, "i", gate, 64), -1);
  ck_assert_msg(strstr(cavs_model_error(m), "inference"), "%s", cavs_model_error(m));
  ck_assert_int_eq(cavs_model_vertex_value(m, 0, root, "h", h, 64), H);
  cavs_model_free(m);
}
END_TEST

/* Carried state (cavs_model_carry_state): chains cut in two, the second halves run in
 * the pass after the first halves, against each whole chain in one pass (an independent
 * reference: the carried state is what the whole chain's vertex before the cut
 * scattered). Each second half's pushed values must match the whole chain's there (to
 * 1e-12: the same arithmetic, another batching), a graph without a first half (its
 * place empty in the last pass) starts from zeros as it would alone, and the gradient
 * is the truncated one: finite differences of the second pass's loss with the carried
 * state held (the first pass at the unperturbed parameters each time). The first pass
 * after a reset is the uncarried pass, bit for bit. */
static void halves(const cavs_desc *d, const long *dims, TGraph *whole, TGraph *a, TGraph *b, int n, int cut,
                   unsigned *seed) {
  chain(whole, n, seed, d, dims);
  chain(a, cut, seed, d, dims);
  chain(b, n - cut, seed, d, dims);
  memcpy(a->feat, whole->feat, sizeof(int) * (size_t)(cut * d->nint));
  memcpy(b->feat, whole->feat + cut * d->nint, sizeof(int) * (size_t)((n - cut) * d->nint));
}

static double carried_loss(cavs_model *m, const cavs_graph **ga, int ka, const cavs_graph **gb, int kb, bool back) {
  cavs_stats st;
  cavs_model_reset_state(m);
  ck_assert_msg(cavs_model_forward(m, ga, ka, &st) == 0, "%s", cavs_model_error(m));
  ck_assert_msg(cavs_model_forward(m, gb, kb, &st) == 0, "%s", cavs_model_error(m));
  if (back) cavs_model_backward(m);
  return st.loss;
}

static void carry_against_whole(const char *file, int policy) {
  const cavs_desc *d = load_model(file, "double");
  long dims[CAVS_MAX_DIMS];
  static TGraph g[TG_MINIBATCH], w[4], a[4], b[5];
  const cavs_graph *gs[TG_MINIBATCH], *gw[4], *ga[4], *gb[5];
  tg_minibatch(d, dims, g, gs, false);
  unsigned seed = 5;
  int len[4] = {9, 14, 6, 11}, cut[4] = {4, 7, 1, 10};
  for (int i = 0; i < 4; i++) {
    halves(d, dims, &w[i], &a[i], &b[i], len[i], cut[i], &seed);
    gw[i] = &w[i].g, ga[i] = &a[i].g, gb[i] = &b[i].g;
  }
  chain(&b[4], 5, &seed, d, dims); /* no first half: from zeros */
  gb[4] = &b[4].g;
  cavs_model *m = new_model(d, dims, 3), *ref = new_model(d, dims, 3);
  cavs_model_set_policy(m, policy);
  ck_assert_msg(cavs_model_carry_state(m, 1) == 0, "%s", cavs_model_error(m));
  ck_assert_msg(cavs_model_forward(ref, gw, 4, NULL) == 0, "%s", cavs_model_error(ref));
  /* one chain on a new model first: its first vertex is row 0, whose home key is 0, what
     rows past the minibatch's held in fresh memory (the carried row must never be at
     home) */
  double x[256], y[256];
  for (int inf = 0; inf < 2; inf++) {
    cavs_model *one = new_model(d, dims, 3);
    cavs_model_set_policy(one, policy);
    cavs_model_set_inference(one, inf);
    ck_assert(cavs_model_carry_state(one, 1) == 0);
    carried_loss(one, &ga[1], 1, &gb[1], 1, false);
    for (int v = 0; v < len[1] - cut[1]; v++) {
      long n = cavs_model_vertex_output(one, 0, v, x, 256);
      ck_assert_int_eq(cavs_model_vertex_output(ref, 1, cut[1] + v, y, 256), n);
      for (long j = 0; j < n; j++)
        ck_assert_msg(fabs(x[j] - y[j]) <= 1e-12, "%s: one chain, vertex %d: %.17g carried, %.17g whole", file,
                      cut[1] + v, x[j], y[j]);
    }
    cavs_model_free(one);
  }
  /* a larger minibatch first, in training and in inference, so that the rows past the
     carried ones hold an earlier pass's (homes, above all) */
  for (int inf = 0; inf < 2; inf++) {
    cavs_model_set_inference(m, inf);
    ck_assert(cavs_model_forward(m, gw, 4, NULL) == 0);
    carried_loss(m, gw, 4, gw, 4, false);
    carried_loss(m, ga, 4, gb, 5, false);
    carried_loss(m, ga, 4, gb, 5, false);
  }
  cavs_model_set_inference(m, 0);
  carried_loss(m, gw, 4, gw, 4, false);
  carried_loss(m, ga, 4, gb, 5, false);
  for (int i = 0; i < 4; i++)
    for (int v = 0; v < len[i] - cut[i]; v++) {
      long n = cavs_model_vertex_output(m, i, v, x, 256);
      ck_assert_int_eq(cavs_model_vertex_output(ref, i, cut[i] + v, y, 256), n);
      ck_assert(n > 0);
      for (long j = 0; j < n; j++)
        ck_assert_msg(fabs(x[j] - y[j]) <= 1e-12, "%s: chain %d, vertex %d of %d: %.17g carried, %.17g whole", file, i,
                      cut[i] + v, len[i], x[j], y[j]);
    }
  /* the fifth graph alone, uncarried */
  ck_assert_msg(cavs_model_forward(ref, &gb[4], 1, NULL) == 0, "%s", cavs_model_error(ref));
  for (int v = 0; v < 5; v++) {
    long n = cavs_model_vertex_output(m, 4, v, x, 256);
    ck_assert_int_eq(cavs_model_vertex_output(ref, 0, v, y, 256), n);
    for (long j = 0; j < n; j++) ck_assert_msg(fabs(x[j] - y[j]) <= 1e-12, "%s: the graph from zeros", file);
  }
  /* the truncated gradient against finite differences, the carried state held */
  carried_loss(m, ga, 4, gb, 5, true);
  size_t np;
  double *p = cavs_model_params_flat(m, &np);
  const double *gr = cavs_model_grads_flat(m, &np);
  double *grad = malloc(sizeof(double) * np);
  memcpy(grad, gr, sizeof(double) * np);
  int checked = 0;
  for (size_t i = 0; i < np; i += np / 40 + 1) {
    double keep = p[i], h = 1e-6, lo, hi;
    cavs_model_reset_state(m);
    ck_assert(cavs_model_forward(m, ga, 4, NULL) == 0);
    p[i] = keep + h;
    cavs_stats st;
    ck_assert(cavs_model_forward(m, gb, 5, &st) == 0);
    hi = st.loss;
    cavs_model_reset_state(m);
    p[i] = keep;
    ck_assert(cavs_model_forward(m, ga, 4, NULL) == 0);
    p[i] = keep - h;
    ck_assert(cavs_model_forward(m, gb, 5, &st) == 0);
    lo = st.loss;
    p[i] = keep;
    double fd = (hi - lo) / (2 * h);
    ck_assert_msg(fabs(fd - grad[i]) <= 1e-6 * (1 + fabs(fd)), "%s: parameter %zu: gradient %.10g, differences %.10g",
                  file, i, grad[i], fd);
    checked += grad[i] != 0;
  }
  ck_assert_int_gt(checked, 5);
  free(grad);
  /* after a reset, the pass is the uncarried one, bit for bit */
  cavs_stats s1, s2;
  cavs_model_reset_state(m);
  ck_assert(cavs_model_forward(m, gb, 5, &s1) == 0);
  cavs_model_backward(m);
  ck_assert(cavs_model_carry_state(ref, 0) == 0);
  cavs_model_set_policy(ref, policy);
  ck_assert(cavs_model_forward(ref, gb, 5, &s2) == 0);
  cavs_model_backward(ref);
  ck_assert(s1.loss == s2.loss);
  grads_agree("the first pass carried", m, ref, 0);
  cavs_model_free(m);
  cavs_model_free(ref);
}

START_TEST(carried_state_continues_chains) {
  carry_against_whole("lstm_lm.vf", CAVS_BFS);
  carry_against_whole("lstm_lm2.vf", CAVS_BFS);
  carry_against_whole("lstm_lm.vf", CAVS_SERIAL);
  carry_against_whole("lstm_lm.vf", CAVS_AGENDA);
}
END_TEST

START_TEST(carried_state_needs_one_state) {
  const cavs_desc *d = load_model("tagger.vf", "double");
  long dims[CAVS_MAX_DIMS];
  static TGraph g[TG_MINIBATCH];
  const cavs_graph *gs[TG_MINIBATCH];
  tg_minibatch(d, dims, g, gs, false);
  cavs_model *m = new_model(d, dims, 3);
  ck_assert_int_eq(cavs_model_carry_state(m, 1), -1);
  ck_assert_msg(strstr(cavs_model_error(m), "one state"), "%s", cavs_model_error(m));
  cavs_model_free(m);
}
END_TEST

START_TEST(abi_mismatch_is_refused) {
  const cavs_desc *d = load_model("treelstm.vf", "float");
  ck_assert_int_eq(d->abi, CAVS_ABI_VERSION);
  cavs_desc old = *d;
  old.abi = CAVS_ABI_VERSION - 1;
  long dims[CAVS_MAX_DIMS];
  cavs_dims_default(d, dims);
  dims[find_dim(d, "V")] = 10;
  char err[512] = "";
  ck_assert_ptr_null(cavs_model_new(&old, dims, err, sizeof err));
  char want[128];
  snprintf(want, sizeof want, "generated for libcavs ABI %d, but this libcavs is ABI %d", CAVS_ABI_VERSION - 1,
           CAVS_ABI_VERSION);
  ck_assert_msg(strstr(err, want) && strstr(err, "generate it again"), "%s", err);
}
END_TEST

/* A mixture of experts is dropless and padding-free, and an expert without rows costs
 * nothing: in the push block (one stage over every row), a forward pass runs the gate's
 * product and one product per expert that received a slot, of exactly its slots (the
 * flops count K slots a row, no more), at 8 experts and at 64 (where some receive none:
 * their gradients stay exactly zero). The per-row memory grows with the experts' count
 * only by the gate's own rows (its values and weights, with their gradients): the
 * experts' activations are K slots a row whatever their count. Among equal gate values
 * the lower index is taken: top 1 of a gate of two equal halves never routes to the
 * second. */
static const char *moe_count_src =
    "model moe_count; dim H = 4; dim X = 8; dim C = 4; dim HC = H * C;\n"
    "input y : class[C]; input f : real[H];\n"
    "param Wg[H,X], E[X,HC] init uniform(-1, 1);\n"
    "vertex v (children 2) { h = tanh(f + gather(0) + gather(1)); scatter(h); push(h); }\n"
    "push (h) { loss softmax_xent(moe(e in top(h @ Wg, 2): h @ E[e]), y); }\n";
/* A gate that matters only where the vertex has children (its mixture meets only s0,
 * zero at the leaves) still feeds its load-balancing loss at every routed row: the loss,
 * the loads and every gradient are those of the same model where the mixture is read at
 * the leaves too (+ 0 * m). The leaves' gate had been stored as 0 (routed on ties, its
 * balancing gradient dropped there): loads 0.092 and 0.242 apart on cavs train. */
static const char *dead_gate_src =
    "model %s; dim H = 3; dim C = 3; dim V = 5; dim X = 3;\n"
    "input w : index[V]; input y : class[C];\n"
    "param emb[V,H], Wg[H,X], T[X,H], U[2H,H], Wc[H,C] init uniform(-1, 1);\n"
    "pull { x = emb[w]; }\n"
    "vertex v (children 2) {\n  s0 = gather(0); s1 = gather(1);\n"
    "  m = moe(e in top(sigmoid(pull() @ Wg), 2, 0.5): pull() * T[e]);\n"
    "  h = tanh(concat(s0, s1) @ U + m * s0%s + pull());\n  scatter(h); push(h);\n}\n"
    "push (h) { loss softmax_xent(h @ Wc, y); }\n";

START_TEST(balance_reads_a_dead_gate) {
  char src[2][1024];
  snprintf(src[0], sizeof src[0], dead_gate_src, "moe_dead_gate", "");
  snprintf(src[1], sizeof src[1], dead_gate_src, "moe_live_gate", " + 0 * m");
  const cavs_desc *d[2] = {load_model(src[0], "double"), load_model(src[1], "double")};
  long dims[CAVS_MAX_DIMS];
  static TGraph g[TG_MINIBATCH];
  const cavs_graph *gs[TG_MINIBATCH];
  int k = tg_minibatch(d[0], dims, g, gs, true);
  cavs_model *m[2];
  cavs_stats st[2];
  long load[2][64], X = dims[find_dim(d[0], "X")];
  for (int i = 0; i < 2; i++) {
    m[i] = new_model(d[i], dims, 5);
    ck_assert_msg(cavs_model_forward(m[i], gs, k, &st[i]) == 0, "%s", cavs_model_error(m[i]));
    ck_assert_int_eq(cavs_model_expert_load(m[i], 0, load[i], 64), X);
    cavs_model_backward(m[i]);
  }
  ck_assert(st[0].aux_loss > 0);
  ck_assert_msg(fabs(st[0].aux_loss - st[1].aux_loss) <= 1e-12 * st[1].aux_loss, "aux loss %.17g, not %.17g",
                st[0].aux_loss, st[1].aux_loss);
  ck_assert_msg(fabs(st[0].loss - st[1].loss) <= 1e-12 * fabs(st[1].loss), "loss %.17g, not %.17g", st[0].loss,
                st[1].loss);
  for (long e = 0; e < X; e++) ck_assert_msg(load[0][e] == load[1][e], "expert %ld: %ld slots, not %ld", e, load[0][e], load[1][e]);
  size_t n[2];
  const double *gr[2] = {cavs_model_grads_flat(m[0], &n[0]), cavs_model_grads_flat(m[1], &n[1])};
  ck_assert_uint_eq(n[0], n[1]);
  for (size_t i = 0; i < n[0]; i++)
    ck_assert_msg(fabs(gr[0][i] - gr[1][i]) <= 1e-10 * (fabs(gr[1][i]) + 1e-3), "gradient %zu: %.17g, not %.17g", i,
                  gr[0][i], gr[1][i]);
  cavs_model_free(m[0]);
  cavs_model_free(m[1]);
}
END_TEST

START_TEST(moe_groups_by_expert) {
  const cavs_desc *d = load_model(moe_count_src, "double");
  long dims[CAVS_MAX_DIMS];
  static TGraph g[TG_MINIBATCH];
  const cavs_graph *gs[TG_MINIBATCH];
  int k = tg_minibatch(d, dims, g, gs, true);
  long H = dims[find_dim(d, "H")], C = dims[find_dim(d, "C")], K = 2, N = 0;
  for (int i = 0; i < k; i++) N += g[i].g.n;
  size_t rb[2];
  const long experts[2] = {8, 64};
  for (int t = 0; t < 2; t++) {
    long X = experts[t];
    dims[find_dim(d, "X")] = X;
    cavs_model *m = new_model(d, dims, 3);
    cavs_backend_stats st;
    cavs_model_backend_stats(m, &st, 1);
    cavs_stats s;
    ck_assert_msg(cavs_model_forward(m, gs, k, &s) == 0, "%s", cavs_model_error(m));
    cavs_model_backend_stats(m, &st, 1);
    long load[64], slots = 0, used = 0;
    ck_assert_int_eq(cavs_model_expert_load(m, 0, load, 64), X);
    for (long e = 0; e < X; e++) slots += load[e], used += load[e] > 0;
    ck_assert_int_eq(slots, K * N);
    ck_assert_msg(st.gemm_calls == 1 + used, "X = %ld: %ld products, %ld experts received slots", X, st.gemm_calls, used);
    ck_assert(st.gemm_flops == 2.0 * N * H * X + 2.0 * K * N * H * C);
    if (X == 64) ck_assert_msg(used < X, "every expert received a slot: no empty one checked");
    cavs_model_backward(m);
    int ie = -1;
    for (int i = 0; i < d->nparams; i++) ie = strcmp(d->params[i].name, "E") ? ie : i;
    long rows, cols, ld;
    double *gE = (double *)cavs_model_grad(m, ie, &rows, &cols, &ld), nonzero = 0;
    ck_assert_int_eq(rows, X);
    for (long e = 0; e < X; e++)
      for (long j = 0; j < cols; j++) {
        if (!load[e]) ck_assert_msg(gE[e * ld + j] == 0, "expert %ld received no slot, its gradient is %g", e, gE[e * ld + j]);
        nonzero += gE[e * ld + j] != 0;
      }
    ck_assert(nonzero > 0);
    size_t mb;
    ck_assert_int_eq(cavs_model_memory(m, 1000, &mb, &rb[t]), 0);
    cavs_model_free(m);
  }
  ck_assert_msg(rb[1] - rb[0] <= (size_t)(64 - 8) * 4 * sizeof(double) * 1000, "%zu bytes a 1000 rows at 64 experts, %zu at 8",
                rb[1], rb[0]);
  /* ties: the second half of the gate equals the first, and is never taken */
  const cavs_desc *t1 = load_model(
      "model moe_tie; dim H = 3; dim C = 3; dim G = 3; dim HH = H * H; input y : class[C]; input f : real[H];\n"
      "param Wg[H,G], E[2G,HH], Wc[H,C] init uniform(-1, 1);\n"
      "vertex v (children 2) { h = tanh(f + gather(0) + gather(1)); scatter(h); push(h); }\n"
      "push (h) { loss softmax_xent(moe(e in top(concat(h @ Wg, h @ Wg), 1): h @ E[e]) @ Wc, y); }\n",
      "double");
  k = tg_minibatch(t1, dims, g, gs, true);
  cavs_model *m = new_model(t1, dims, 3);
  cavs_stats s;
  ck_assert_msg(cavs_model_forward(m, gs, k, &s) == 0, "%s", cavs_model_error(m));
  long load[64], G = dims[find_dim(t1, "G")], first = 0, N1 = 0;
  for (int i = 0; i < k; i++) N1 += g[i].g.n;
  ck_assert_int_eq(cavs_model_expert_load(m, 0, load, 64), 2 * G);
  for (long e = 0; e < G; e++) {
    ck_assert_int_eq(load[G + e], 0);
    first += load[e];
  }
  ck_assert_int_eq(first, N1);
  cavs_model_free(m);
}
END_TEST

/* Expert parallelism (cavs_model_set_expert_comm) without MPI: P models, one a thread,
 * each running its part of a minibatch with its experts' products placed by the rule
 * of cavs.h, over two collectives made of a barrier and memcpy (Hub). Their gradients
 * sum to the whole minibatch's run in one model (1e-11 in double: only the order of an
 * expert's sums differs), every part's output is the whole's, an expert's gradient
 * is zero on every process but its own (without replicas), and rows did travel; a
 * process with no graph (cavs_model_expert_serve in place of its backward pass) counts
 * for nothing. With replicas (a round's hot expert's rows split with the least busy
 * process) the sums are the same, and some rows did go to a replica. */
enum { HUB_MAX = 4 };
typedef struct Hub {
  int n;
  pthread_barrier_t bar;
  const char *send[HUB_MAX];
  const size_t *sb[HUB_MAX];
  /* what each process called (1 allgather, 2 alltoallv) and its allgather's size: the
     processes must call the same collective each time. Once they have not (mismatch),
     every collective fails at once, without waiting, so that nothing hangs. */
  int op[HUB_MAX];
  size_t bytes[HUB_MAX];
  volatile int mismatch;
} Hub;
typedef struct Port {
  Hub *h;
  int rank;
  /* the part: graphs [lo, hi) (none: graph 0, served), the whole's loss counts */
  const cavs_graph *const *gs;
  int lo, hi;
  const long *counts;
  int replicate;
  cavs_model *m;
  double loss;
  int rc;
} Port;

/* the first half of a collective: each says what it calls; false when they differ */
static bool hub_meet(Hub *h, int rank, int op, size_t bytes) {
  if (h->mismatch) return false;
  h->op[rank] = op, h->bytes[rank] = bytes;
  pthread_barrier_wait(&h->bar);
  bool same = true;
  for (int q = 0; q < h->n; q++) same &= h->op[q] == op && h->bytes[q] == bytes;
  if (!same) {
    pthread_barrier_wait(&h->bar); /* (all have looked before any says so) */
    h->mismatch = 1;
    pthread_barrier_wait(&h->bar);
  }
  return same;
}
static int hub_allgather(void *arg, const void *mine, size_t bytes, void *all) {
  Port *p = arg;
  Hub *h = p->h;
  h->send[p->rank] = mine;
  if (!hub_meet(h, p->rank, 1, bytes)) return -1;
  for (int q = 0; q < h->n; q++) memcpy((char *)all + (size_t)q * bytes, h->send[q], bytes);
  pthread_barrier_wait(&h->bar);
  return 0;
}
static int hub_alltoallv(void *arg, const void *send, const size_t *sbytes, void *recv, const size_t *rbytes) {
  Port *p = arg;
  Hub *h = p->h;
  h->send[p->rank] = send, h->sb[p->rank] = sbytes;
  if (!hub_meet(h, p->rank, 2, 0)) return -1;
  int rc = 0;
  size_t at = 0;
  for (int q = 0; q < h->n; q++) {
    size_t off = 0;
    for (int j = 0; j < p->rank; j++) off += h->sb[q][j];
    if (h->sb[q][p->rank] != rbytes[q]) rc = -1; /* what q sends is what this one expects */
    else memcpy((char *)recv + at, h->send[q] + off, rbytes[q]);
    at += rbytes[q];
  }
  pthread_barrier_wait(&h->bar);
  return rc;
}

static void *hub_part(void *arg) {
  Port *p = arg;
  cavs_expert_comm comm = {.rank = p->rank, .size = p->h->n, .allgather = hub_allgather,
                           .alltoallv = hub_alltoallv, .arg = p, .replicate = p->replicate};
  cavs_stats st;
  bool none = p->lo == p->hi;
  p->rc = cavs_model_set_expert_comm(p->m, &comm) ||
          cavs_model_forward(p->m, p->gs + (none ? 0 : p->lo), none ? 1 : p->hi - p->lo, &st) ||
          cavs_model_set_loss_counts(p->m, p->counts);
  p->loss = st.loss;
  if (none) p->rc |= cavs_model_expert_serve(p->m);
  else cavs_model_backward(p->m);
  return NULL;
}

/* the step (collective where it clips) and the sync, on each process */
static const cavs_optim placed_opt = {.kind = CAVS_ADAM, .lr = 0.01, .clip = 0.05};
static void *hub_step(void *arg) {
  Port *p = arg;
  p->rc = cavs_model_step(p->m, &placed_opt) || cavs_model_expert_sync(p->m);
  return NULL;
}

static void hub_run(Port *port, int P, void *(*fn)(void *)) {
  pthread_t th[HUB_MAX];
  for (int q = 0; q < P; q++) ck_assert_int_eq(pthread_create(&th[q], NULL, fn, &port[q]), 0);
  for (int q = 0; q < P; q++) pthread_join(th[q], NULL);
}

/* What the application sums over the processes (data parallelism): every gradient but
   the placed expert tables', a lookup table's rows touched anywhere touched everywhere */
static void sum_unplaced(const cavs_desc *d, Port *port, int P) {
  for (int i = 0; i < d->nparams; i++)
    for (int q = 0; q < P; q++) {
      const int *rows;
      int n = cavs_model_touched_rows(port[q].m, i, &rows);
      for (int o = 0; o < P && n > 0; o++) ck_assert_int_eq(cavs_model_touch_rows(port[o].m, i, rows, n), 0);
    }
  size_t count, off[4], len[4];
  double *g0 = cavs_model_grads_flat(port[0].m, &count);
  int nt = cavs_model_expert_placed(port[0].m, 0, NULL, NULL);
  ck_assert_msg(nt == 2, "%s: %d expert tables placed (2: W1, W2)", d->name, nt);
  for (int i = 0; i < nt; i++) cavs_model_expert_placed(port[0].m, i, &off[i], &len[i]);
  for (size_t j = 0; j < count; j++) {
    bool placed = false;
    for (int i = 0; i < nt; i++) placed |= j >= off[i] && j < off[i] + len[i];
    if (placed) continue;
    double sum = 0;
    for (int q = 0; q < P; q++) sum += ((double *)cavs_model_grads_flat(port[q].m, &count))[j];
    for (int q = 0; q < P; q++) ((double *)cavs_model_grads_flat(port[q].m, &count))[j] = sum;
  }
  (void)g0;
}

/* A model of d whose expert tables are placed before its parameters are made: the comm
   set first (process q of P, over port's hub), then cavs_model_init (seed 9, as
   unbalanced_model's) */
static cavs_model *placed_model(const cavs_desc *d, const long *dims, Port *port, int q, int P) {
  char err[256];
  cavs_model *m = cavs_model_new(d, dims, err, sizeof err);
  ck_assert_msg(m != NULL, "%s", err);
  cavs_expert_comm comm = {.rank = q, .size = P, .allgather = hub_allgather, .alltoallv = hub_alltoallv, .arg = port};
  ck_assert_int_eq(cavs_model_set_expert_comm(m, &comm), 0);
  cavs_model_init(m, 9);
  if (cavs_option_find(d, "balance") >= 0) ck_assert_int_eq(cavs_model_set_option(m, "balance", 0), 0);
  return m;
}

/* The processes' gradients after their passes (port[0..P)), summed, against the whole
   minibatch's (1e-11 relative); a placed expert table's rows of another process's
   experts zero on each */
static void parts_grads_whole(const char *file, const cavs_desc *d, const long *dims, cavs_model *whole, Port *port,
                              int P) {
  double worst = 0;
  int at = -1, experts = 0;
  for (int i = 0; i < d->nparams; i++) {
    long rows, cols, ld, lq;
    const double *gw = cavs_model_grad(whole, i, &rows, &cols, &ld);
    bool table = rows == dims[find_dim(d, "X")] && d->params[i].name[0] == 'W'; /* W1, W2: the experts' matrices */
    experts += table;
    for (long r = 0; r < rows; r++)
      for (long j = 0; j < cols; j++) {
        double sum = 0;
        for (int q = 0; q < P; q++) {
          const double *gq = cavs_model_grad(port[q].m, i, &rows, &cols, &lq);
          long X = rows, first = ((long)q * X + P - 1) / P, next = ((long)(q + 1) * X + P - 1) / P;
          if (table && (r < first || r >= next)) /* (a replica's sent home at the pass's end) */
            ck_assert_msg(gq[r * lq + j] == 0, "%s: process %d holds a gradient of expert %ld, not its own", file, q, r);
          sum += gq[r * lq + j];
        }
        double gap = fabs(sum - gw[r * ld + j]) / fmax(fabs(gw[r * ld + j]), 1e-6);
        if (gap > worst) worst = gap, at = i;
      }
  }
  ck_assert_msg(experts == 2, "%s: %d expert tables found", file, experts);
  ck_assert_msg(worst <= 1e-11, "%s, %d processes: the parts' gradient of %s is %.3g off the whole's", file, P,
                d->params[at].name, worst);
}

/* (first: the processes' models placed before their parameters are made, placed_model) */
static long experts_placed(const char *file, int P, bool with_none, int replicate, bool first) {
  const cavs_desc *d = load_model(file, "double");
  long dims[CAVS_MAX_DIMS];
  static TGraph g[TG_MINIBATCH];
  const cavs_graph *gs[TG_MINIBATCH];
  int k = tg_minibatch(d, dims, g, gs, true);
  if (with_none) k = P - 1; /* a graph for all but the last */
  long counts[8];
  cavs_model *whole = whole_pass(d, dims, gs, k, counts, 0);
  Hub hub = {.n = P};
  pthread_barrier_init(&hub.bar, NULL, (unsigned)P);
  Port port[HUB_MAX];
  for (int q = 0; q < P; q++) {
    port[q] = (Port){.h = &hub, .rank = q, .gs = gs, .lo = k * q / P, .hi = k * (q + 1) / P, .counts = counts,
                     .replicate = replicate};
    port[q].m = first ? placed_model(d, dims, &port[q], q, P) : unbalanced_model(d, dims);
    if (with_none) port[q].lo = q < P - 1 ? q : 0, port[q].hi = q < P - 1 ? q + 1 : 0;
  }
  hub_run(port, P, hub_part);
  for (int q = 0; q < P; q++) ck_assert_msg(!port[q].rc, "%s: process %d: %s", file, q, cavs_model_error(port[q].m));
  parts_grads_whole(file, d, dims, whole, port, P);
  long moved = 0, replicated = 0;
  /* the rest summed as the application does, a clipped step on each process (its own
     experts only), the sync: every process holds the whole's stepped parameters */
  sum_unplaced(d, port, P);
  hub_run(port, P, hub_step);
  pthread_barrier_destroy(&hub.bar);
  for (int q = 0; q < P; q++) ck_assert_msg(!port[q].rc, "%s: process %d: %s", file, q, cavs_model_error(port[q].m));
  ck_assert_int_eq(cavs_model_step(whole, &placed_opt), 0);
  size_t count;
  const double *pw = cavs_model_params_flat(whole, &count);
  double worst = 0;
  for (int q = 0; q < P; q++) {
    const double *pq = cavs_model_params_flat(port[q].m, &count);
    for (size_t j = 0; j < count; j++) worst = fmax(worst, fabs(pq[j] - pw[j]) / fmax(fabs(pw[j]), 1e-6));
  }
  ck_assert_msg(worst <= 1e-9, "%s, %d processes: the parameters after the step are %.3g off the whole's", file, P,
                worst);
  for (int q = 0; q < P; q++) {
    cavs_expert_stats es;
    cavs_model_expert_stats(port[q].m, &es, 1);
    moved += es.rows_out, replicated += es.rows_replicated;
    ck_assert(es.rounds > 0 && es.rows_out >= 0 && es.rows_in >= 0 && es.rows_replicated <= es.rows_out + es.rows_here);
    if (!replicate) ck_assert_int_eq(es.rows_replicated, 0);
    cavs_model_free(port[q].m);
  }
  ck_assert_msg(moved > 0, "%s: no row went to another process", file);
  cavs_model_free(whole);
  return replicated;
}

/* the step alone on each process; then the experts gathered to process 0 */
static void *hub_step_only(void *arg) {
  Port *p = arg;
  p->rc = cavs_model_step(p->m, &placed_opt);
  return NULL;
}
static void *hub_gather(void *arg) {
  Port *p = arg;
  p->rc = cavs_model_expert_gather(p->m, 0);
  return NULL;
}
static void *hub_sync(void *arg) {
  Port *p = arg;
  p->rc = cavs_model_expert_sync(p->m);
  return NULL;
}

/* The pages wholly inside bytes [a, b) of block p that the system holds (mincore), and
   how many such pages there are */
static long resident_pages(const void *p, size_t a, size_t b, long *pages) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  uintptr_t lo = ((uintptr_t)p + a + page - 1) / page * page, hi = ((uintptr_t)p + b) / page * page;
  if (hi <= lo) return *pages = 0;
  size_t n = (hi - lo) / page;
  unsigned char *vec = malloc(n);
  ck_assert_ptr_nonnull(vec);
  ck_assert_int_eq(mincore((void *)lo, hi - lo, vec), 0);
  long in = 0;
  for (size_t i = 0; i < n; i++) in += vec[i] & 1;
  free(vec);
  *pages = (long)n;
  return in;
}

/* What a process holds of the other processes' experts after a step (P = 2, each
   expert's matrices several pages; synced before the step, so that every process held
   them all): none of their pages in the parameters or the
   gradient, and zeros where read; its own experts' pages held; gathered to process 0,
   that one's parameters are the whole's stepped, and process 1 still holds none of
   the others'; released, process 0 none either */
START_TEST(experts_hold_their_share) {
  const cavs_desc *d = load_model("moe_lm.vf", "double");
  long dims[CAVS_MAX_DIMS];
  static TGraph g[TG_MINIBATCH];
  const cavs_graph *gs[TG_MINIBATCH];
  int k = tg_minibatch(d, dims, g, gs, true), P = 2;
  dims[find_dim(d, "H")] = dims[find_dim(d, "F")] = 48; /* (an expert's matrix: 18 KiB) */
  long counts[8];
  cavs_model *whole = whole_pass(d, dims, gs, k, counts, 0);
  Hub hub = {.n = P};
  pthread_barrier_init(&hub.bar, NULL, (unsigned)P);
  Port port[HUB_MAX];
  for (int q = 0; q < P; q++)
    port[q] = (Port){.h = &hub, .rank = q, .gs = gs, .lo = k * q / P, .hi = k * (q + 1) / P, .counts = counts,
                     .replicate = 1, .m = unbalanced_model(d, dims)};
  hub_run(port, P, hub_part);
  sum_unplaced(d, port, P);
  hub_run(port, P, hub_sync); /* (every process whole: the step gives the others' back) */
  hub_run(port, P, hub_step_only);
  for (int q = 0; q < P; q++) ck_assert_msg(!port[q].rc, "process %d: %s", q, cavs_model_error(port[q].m));
  long others = 0, own = 0;
  for (int pass = 0; pass < 2; pass++) {
    for (int q = P - 1; q >= 0; q--) {
      size_t count, off, n;
      const double *blocks[2] = {cavs_model_params_flat(port[q].m, &count), cavs_model_grads_flat(port[q].m, &count)};
      int nt = cavs_model_expert_placed(port[q].m, 0, NULL, NULL);
      ck_assert_int_eq(nt, 2);
      for (int i = 0; i < nt; i++) {
        cavs_model_expert_placed(port[q].m, i, &off, &n);
        size_t X = (size_t)dims[find_dim(d, "X")], ld = n / X, first = ((size_t)q * X + P - 1) / P,
               next = ((size_t)(q + 1) * X + P - 1) / P;
        for (int b = 0; b < 2; b++) {
          if (pass == 1 && q == 0) continue; /* (gathered: process 0 holds them all) */
          long pages, in;
          size_t es = sizeof(double);
          in = resident_pages(blocks[b], (off + first * ld) * es, (off + next * ld) * es, &pages);
          if (b == 0) ck_assert_msg(in == pages, "process %d holds %ld of its %ld pages of table %d", q, in, pages, i);
          own += pages;
          long in0 = resident_pages(blocks[b], off * es, (off + first * ld) * es, &pages);
          others += pages;
          long in1 = resident_pages(blocks[b], (off + next * ld) * es, (off + n) * es, &pages);
          others += pages;
          ck_assert_msg(in0 + in1 == 0, "process %d holds %ld pages of the others' experts (%s of table %d)", q,
                        in0 + in1, b ? "gradient" : "parameters", i);
        }
      }
    }
    if (pass == 0) hub_run(port, P, hub_gather);
    for (int q = 0; q < P; q++) ck_assert_msg(!port[q].rc, "process %d: %s", q, cavs_model_error(port[q].m));
  }
  ck_assert_msg(others > 0 && own > 0, "no page to check (%ld, %ld): the experts are too small", others, own);
  /* process 1's copies of process 0's experts read as zero (read last: a read maps the
     system's zero pages, which mincore counts) */
  for (int i = 0; i < 2; i++) {
    size_t count, off, n, X = (size_t)dims[find_dim(d, "X")], first = (X + 1) / 2;
    const double *blocks[2] = {cavs_model_params_flat(port[1].m, &count), cavs_model_grads_flat(port[1].m, &count)};
    cavs_model_expert_placed(port[1].m, i, &off, &n);
    for (int b = 0; b < 2; b++)
      for (size_t j = 0; j < first * (n / X); j++)
        ck_assert_msg(blocks[b][off + j] == 0, "process 1: process 0's expert reads %g", blocks[b][off + j]);
  }
  /* process 0 gathered: the whole's step */
  ck_assert_int_eq(cavs_model_step(whole, &placed_opt), 0);
  size_t count;
  const double *pw = cavs_model_params_flat(whole, &count), *p0 = cavs_model_params_flat(port[0].m, &count);
  double worst = 0;
  for (size_t j = 0; j < count; j++) worst = fmax(worst, fabs(p0[j] - pw[j]) / fmax(fabs(pw[j]), 1e-6));
  ck_assert_msg(worst <= 1e-9, "gathered, process 0's parameters are %.3g off the whole's", worst);
  /* given back at once (cavs_model_expert_release, as cavs train does once it has
     written a checkpoint), not at the next step: process 0 holds none of the others'
     pages again, and its own experts are still the whole's */
  for (int q = 0; q < P; q++) ck_assert_int_eq(cavs_model_expert_release(port[q].m), 0);
  for (int i = 0; i < 2; i++) {
    size_t off, n, X = (size_t)dims[find_dim(d, "X")], next = (X + 1) / 2, ld;
    cavs_model_expert_placed(port[0].m, i, &off, &n);
    ld = n / X;
    long pages, in = resident_pages(p0, (off + next * ld) * sizeof(double), (off + n) * sizeof(double), &pages);
    ck_assert_msg(pages > 0 && in == 0, "released, process 0 holds %ld of the %ld pages of the others' experts (table %d)",
                  in, pages, i);
    for (size_t j = off; j < off + next * ld; j++)
      ck_assert_msg(fabs(p0[j] - pw[j]) <= 1e-9 * fmax(fabs(pw[j]), 1e-6), "released, process 0's own expert changed");
  }
  ck_assert_int_eq(cavs_model_expert_release(NULL), -1);
  /* a root that is not one of the processes: refused, nothing sent */
  ck_assert_int_eq(cavs_model_expert_gather(port[0].m, P), -1);
  ck_assert_msg(strstr(cavs_model_error(port[0].m), "no process 2 of 2"), "%s", cavs_model_error(port[0].m));
  pthread_barrier_destroy(&hub.bar);
  for (int q = 0; q < P; q++) cavs_model_free(port[q].m);
  cavs_model_free(whole);
}
END_TEST

/* a pass's part and the step after it (a backward pass's failure shows in the step) */
static void *hub_part_step(void *arg) {
  Port *p = arg;
  hub_part(p);
  if (!p->rc) p->rc = cavs_model_step(p->m, &placed_opt);
  return NULL;
}

/* Bytes this process has read from files (read, pread: /proc/self/io's rchar) */
static long read_bytes(void) {
  FILE *f = fopen("/proc/self/io", "r");
  ck_assert_msg(f != NULL, "/proc/self/io: %s", strerror(errno));
  char line[128];
  long n = -1;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "rchar: %ld", &n) == 1) break;
  fclose(f);
  ck_assert(n >= 0);
  return n;
}

/* The checkpoint at path opened (cavs_ckpt_open), not read, and applied to another model
   of process q of P placed from the start: the same parameters as `m` (where the same
   checkpoint was read whole and applied), and only the rows it holds read from the file
   at the apply: every dense parameter's, its own experts', with both moments (Adam).
   And a file that changed after it was opened (grown by a byte) is refused. */
static void opened_reads_its_own(const cavs_desc *d, const long *dims, const char *path, Port *port, int q, int P,
                                 cavs_model *m) {
  char err[512];
  cavs_model *o = placed_model(d, dims, port, q, P);
  cavs_ckpt *k = cavs_ckpt_open(path, err, sizeof err);
  ck_assert_msg(k != NULL, "%s", err);
  long X = dims[find_dim(d, "X")], first = ((long)q * X + P - 1) / P, next = ((long)(q + 1) * X + P - 1) / P;
  size_t count, es = sizeof(double), others = 0, off[2], n[2];
  for (int t = 0; t < 2; t++) {
    ck_assert_int_eq(cavs_model_expert_placed(o, t, &off[t], &n[t]), 2);
    others += (size_t)(X - (next - first)) * (n[t] / (size_t)X); /* (a table is one parameter: no padding) */
  }
  long before = read_bytes();
  ck_assert_msg(cavs_ckpt_apply(k, o, err, sizeof err) == 0, "%s", err);
  long got = read_bytes() - before, want = 3 * (long)(((size_t)cavs_ckpt_param_count(k) - others) * es);
  ck_assert_msg(got >= want && got < want + (long)(others * es), "process %d: the apply read %ld bytes, not %ld", q,
                got, want);
  const double *po = cavs_model_params_flat(o, &count), *pm = cavs_model_params_flat(m, &count);
  for (size_t j = 0; j < count; j++) {
    int t = j >= off[0] && j < off[0] + n[0] ? 0 : j >= off[1] && j < off[1] + n[1] ? 1 : -1;
    long e = t < 0 ? -1 : (long)((j - off[t]) / (n[t] / (size_t)X));
    if (t >= 0 && (e < first || e >= next)) continue;
    ck_assert_msg(po[j] == pm[j], "process %d, opened: scalar %zu is %.17g, not %.17g", q, j, po[j], pm[j]);
  }
  cavs_ckpt_free(k);
  cavs_model_free(o);
  if (q) return;
  /* changed since it was opened: refused at the apply */
  o = placed_model(d, dims, port, q, P);
  k = cavs_ckpt_open(path, err, sizeof err);
  ck_assert_msg(k != NULL, "%s", err);
  struct stat st;
  ck_assert_int_eq(stat(path, &st), 0);
  FILE *f = fopen(path, "ab");
  ck_assert(f && fputc(0, f) == 0 && fclose(f) == 0);
  ck_assert_int_eq(cavs_ckpt_apply(k, o, err, sizeof err), -1);
  ck_assert_msg(strstr(err, "changed since it was opened"), "%s", err);
  ck_assert_int_eq(truncate(path, st.st_size), 0);
  cavs_ckpt_free(k);
  cavs_model_free(o);
}

/* Expert tables placed from the start: the descriptor names them (moe_lm's W1 and W2:
   cavs_pgroup_desc.experts), and the comm set before the parameters are made places
   them at once. cavs_model_init then writes each process's own experts alone, their
   values and every other parameter's the unplaced model's bits, and touches none of
   the others' pages (mincore: not in the parameters, nor the gradient; a page shared
   with the process's own experts is its own); a checkpoint
   applied after it (parameters and Adam's moments of a stepped model) gives the own
   experts and the rest the checkpoint's values and leaves the others' pages untouched.
   Models placed so train as one: experts_placed's sums and step with them. */
START_TEST(experts_placed_from_the_start) {
  const cavs_desc *d = load_model("moe_lm.vf", "double");
  long dims[CAVS_MAX_DIMS];
  static TGraph g[TG_MINIBATCH];
  const cavs_graph *gs[TG_MINIBATCH];
  int k = tg_minibatch(d, dims, g, gs, true), P = 2;
  dims[find_dim(d, "H")] = dims[find_dim(d, "F")] = 48; /* (an expert's matrix: 18 KiB) */
  cavs_model *fresh = unbalanced_model(d, dims);
  cavs_model *stepped = unbalanced_model(d, dims);
  cavs_stats st;
  ck_assert_int_eq(cavs_model_forward(stepped, gs, k, &st), 0);
  cavs_model_backward(stepped);
  ck_assert_int_eq(cavs_model_step(stepped, &placed_opt), 0);
  char *dir = tu_tmpdir(), path[4200], err[256];
  snprintf(path, sizeof path, "%s/w.ckpt", dir);
  ck_assert_msg(cavs_ckpt_save(path, stepped, NULL, NULL, NULL, err, sizeof err) == 0, "%s", err);
  cavs_ckpt *ck = cavs_ckpt_read(path, err, sizeof err);
  ck_assert_msg(ck != NULL, "%s", err);
  Hub hub = {.n = P};
  Port port[HUB_MAX] = {{0}};
  long X = dims[find_dim(d, "X")];
  for (int q = 0; q < P; q++) {
    port[q] = (Port){.h = &hub, .rank = q};
    cavs_model *m = port[q].m = placed_model(d, dims, &port[q], q, P);
    ck_assert_int_eq(cavs_model_expert_placed(m, 0, NULL, NULL), 2);
    for (int pass = 0; pass < 2; pass++) {
      const cavs_model *ref = pass ? stepped : fresh;
      size_t count;
      const double *pm = cavs_model_params_flat(m, &count), *pr = cavs_model_params_flat((cavs_model *)ref, &count);
      const double *gm = cavs_model_grads_flat(m, &count);
      size_t off[2], n[2];
      long first = ((long)q * X + P - 1) / P, next = ((long)(q + 1) * X + P - 1) / P;
      for (int i = 0; i < 2; i++) cavs_model_expert_placed(m, i, &off[i], &n[i]);
      for (size_t j = 0; j < count; j++) {
        int t = j >= off[0] && j < off[0] + n[0] ? 0 : j >= off[1] && j < off[1] + n[1] ? 1 : -1;
        long e = t < 0 ? -1 : (long)((j - off[t]) / (n[t] / (size_t)X));
        if (t >= 0 && (e < first || e >= next)) continue; /* (another's expert: not read, below) */
        ck_assert_msg(pm[j] == pr[j], "process %d, %s: scalar %zu is %.17g, not %.17g", q,
                      pass ? "the checkpoint applied" : "made", j, pm[j], pr[j]);
      }
      for (int i = 0; i < 2; i++) {
        size_t ld = n[i] / (size_t)X, es = sizeof(double);
        long pages, in = resident_pages(pm, off[i] * es, (off[i] + (size_t)first * ld) * es, &pages), all = pages;
        in += resident_pages(pm, (off[i] + (size_t)next * ld) * es, (off[i] + n[i]) * es, &pages), all += pages;
        in += resident_pages(gm, off[i] * es, (off[i] + (size_t)first * ld) * es, &pages);
        in += resident_pages(gm, (off[i] + (size_t)next * ld) * es, (off[i] + n[i]) * es, &pages);
        ck_assert_msg(all > 0 && in == 0, "process %d, %s: %ld pages of the others' experts of table %d held", q,
                      pass ? "the checkpoint applied" : "made", in, i);
        long own = resident_pages(pm, (off[i] + (size_t)first * ld) * es, (off[i] + (size_t)next * ld) * es, &pages);
        ck_assert_msg(own == pages && pages > 0, "process %d: %ld of its %ld pages of table %d", q, own, pages, i);
      }
      if (!pass) ck_assert_msg(cavs_ckpt_apply(ck, m, err, sizeof err) == 0, "%s", err);
    }
    opened_reads_its_own(d, dims, path, &port[q], q, P, m);
    cavs_model_free(m);
  }
  cavs_ckpt_free(ck);
  tu_rmtree(dir);
  cavs_model_free(fresh);
  cavs_model_free(stepped);
  /* and trained so, their sums and step are the whole's */
  experts_placed("moe_lm.vf", 2, false, 1, true);
  experts_placed("moe_tree.vf", 3, true, 1, true);
}
END_TEST

/* A forward pass that fails (a graph it refuses; its rows past the memory limit, errno
   ENOMEM) leaves the model as it was: the backward pass after it does nothing and the
   step returns -1 and moves no parameter (Adam's moments are not zero: a step on no
   gradient would), and the next pass gives the bits of a model that never failed. */
START_TEST(failed_pass_leaves_the_model) {
  const cavs_desc *d = load_model("treelstm.vf", "double");
  long dims[CAVS_MAX_DIMS];
  static TGraph g[TG_MINIBATCH];
  const cavs_graph *gs[TG_MINIBATCH], *bad[TG_MINIBATCH];
  int k = tg_minibatch(d, dims, g, gs, true);
  cavs_model *a = unbalanced_model(d, dims), *b = unbalanced_model(d, dims);
  const cavs_optim opt = {.kind = CAVS_ADAM, .lr = 0.01};
  cavs_stats sa, sb;
  cavs_model *both[2] = {a, b};
  for (int i = 0; i < 2; i++) { /* (one small graph: the rows stay under what the full minibatch needs) */
    ck_assert_int_eq(cavs_model_forward(both[i], gs, 1, &sa), 0);
    cavs_model_backward(both[i]);
    ck_assert_int_eq(cavs_model_step(both[i], &opt), 0);
  }
  size_t count;
  const double *pa = cavs_model_params_flat(a, &count), *pb = cavs_model_params_flat(b, &count);
  cavs_graph neg = {.n = -1};
  for (int i = 0; i < k; i++) bad[i] = i == k - 1 ? &neg : gs[i];
  for (int how = 0; how < 2; how++) {
    if (how) cavs_set_memory_limit(1);
    errno = 0;
    int rc = cavs_model_forward(a, how ? gs : bad, k, &sa);
    cavs_set_memory_limit(0);
    ck_assert_msg(rc == -1, "%s: the pass went through", how ? "past the limit" : "a graph refused");
    if (how) ck_assert_msg(errno == ENOMEM, "past the limit: errno %d (%s)", errno, cavs_model_error(a));
    cavs_model_backward(a);
    ck_assert_int_eq(cavs_model_step(a, &opt), -1);
    ck_assert_msg(!memcmp(pa, pb, count * sizeof *pa), "%s: the step after the failed pass moved the parameters",
                  how ? "past the limit" : "a graph refused");
  }
  for (int i = 0; i < 2; i++) {
    ck_assert_msg(cavs_model_forward(both[i], gs, k, i ? &sb : &sa) == 0, "%s", cavs_model_error(both[i]));
    cavs_model_backward(both[i]);
    ck_assert_int_eq(cavs_model_step(both[i], &opt), 0);
  }
  ck_assert(sa.loss == sb.loss);
  ck_assert_msg(!memcmp(pa, pb, count * sizeof *pa), "after the failed passes, a step that is not the other model's");
  cavs_model_free(a);
  cavs_model_free(b);
}
END_TEST

/* hub_run's, where a process may wait in a collective no other calls: each joined
   within a minute, or the test fails */
static void hub_run_bounded(Port *port, int P, void *(*fn)(void *)) {
  pthread_t th[HUB_MAX];
  for (int q = 0; q < P; q++) ck_assert_int_eq(pthread_create(&th[q], NULL, fn, &port[q]), 0);
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += 60;
  for (int q = 0; q < P; q++)
    ck_assert_msg(pthread_timedjoin_np(th[q], NULL, &until) == 0, "process %d still waits in a collective", q);
}

/* One process out of memory in the middle of an exchange round (the memory limit: its
   minibatch's rows fill it but for `slack` bytes, so that its exchange buffers go past
   it; the other's minibatch is smaller, and its exchange fits): every process's pass
   fails, none waits in a collective the failed one never calls (the Hub checks that
   every process calls the same collective each time, and the threads end), the failed
   process says why (ENOMEM, the exchange) and the others name it. Swept over the slack
   from none to enough, so that the failure falls at each of a pass's allocations in
   turn; enough, every process's pass goes through. */
START_TEST(experts_fail_together) {
  const cavs_desc *d = load_model("moe_tree.vf", "double");
  long dims[CAVS_MAX_DIMS];
  static TGraph g[TG_MINIBATCH];
  const cavs_graph *gs[TG_MINIBATCH];
  int k = tg_minibatch(d, dims, g, gs, true), P = 2;
  long counts[8];
  cavs_model *whole = whole_pass(d, dims, gs, k, counts, 0);
  int mid = 0, through = 0, trials = 0;
  for (size_t slack = 0; !through && trials < 40; slack = slack ? slack * 3 / 2 : 512, trials++) {
    Hub hub = {.n = P};
    pthread_barrier_init(&hub.bar, NULL, (unsigned)P);
    Port port[HUB_MAX];
    /* process 0 runs every graph but the first, process 1 the first (5 vertices) */
    for (int q = 0; q < P; q++)
      port[q] = (Port){.h = &hub, .rank = q, .gs = gs, .lo = q ? 0 : 1, .hi = q ? 1 : k, .counts = counts,
                       .m = unbalanced_model(d, dims)};
    /* process 0's rows grown by a pass of its part alone; then the limit */
    cavs_stats st;
    ck_assert_int_eq(cavs_model_forward(port[0].m, gs + 1, k - 1, &st), 0);
    size_t model, rows;
    long n = 0;
    for (int i = 1; i < k; i++) n += gs[i]->n;
    long cap = 256;
    while (cap < n) cap *= 2; /* (as the model grows its rows: cv_grow_rows) */
    ck_assert_int_eq(cavs_model_memory(port[0].m, cap, &model, &rows), 0);
    /* (the comm set before: what it makes is not the exchange's, and a process whose
       comm could not be set takes no part) */
    for (int q = 0; q < P; q++) {
      cavs_expert_comm comm = {.rank = q, .size = P, .allgather = hub_allgather, .alltoallv = hub_alltoallv,
                               .arg = &port[q]};
      ck_assert_int_eq(cavs_model_set_expert_comm(port[q].m, &comm), 0);
    }
    cavs_set_memory_limit(model + rows + slack);
    hub_run_bounded(port, P, hub_part_step);
    cavs_set_memory_limit(0);
    ck_assert_msg(!hub.mismatch, "slack %zu: the processes called different collectives", slack);
    const char *e0 = cavs_model_error(port[0].m), *e1 = cavs_model_error(port[1].m);
    if (!port[0].rc && !port[1].rc) {
      through = 1;
    } else {
      ck_assert_msg(port[0].rc && port[1].rc, "slack %zu: one process failed alone (%s | %s)", slack, e0, e1);
      ck_assert_msg(strstr(e0, "the experts' exchange needs") && strstr(e0, "memory limit"), "slack %zu: %s", slack, e0);
      ck_assert_msg(strstr(e1, "process 0 failed its part of the round"), "slack %zu: %s", slack, e1);
      mid++;
      /* nothing of the failed pass stays: the limit lifted, the same models' passes go
         through, their gradients the whole's */
      hub_run_bounded(port, P, hub_part);
      ck_assert_msg(!hub.mismatch, "slack %zu, again: the processes called different collectives", slack);
      for (int q = 0; q < P; q++)
        ck_assert_msg(!port[q].rc, "slack %zu, again: process %d: %s", slack, q, cavs_model_error(port[q].m));
      parts_grads_whole("moe_tree.vf", d, dims, whole, port, P);
    }
    pthread_barrier_destroy(&hub.bar);
    for (int q = 0; q < P; q++) cavs_model_free(port[q].m);
  }
  ck_assert_msg(mid >= 3 && through, "%d limits failed in a round (3 or more), then %s", mid,
                through ? "one went through" : "none went through");
  cavs_model_free(whole);
}
END_TEST

START_TEST(experts_placed_sum_to_whole) {
  long replicated = 0;
  for (int rep = 0; rep < 2; rep++) {
    replicated += experts_placed("moe_tree.vf", 2, false, rep, false);
    replicated += experts_placed("moe_lm.vf", 2, false, rep, false);
    replicated += experts_placed("moe_tree.vf", 3, false, rep, false);
    replicated += experts_placed("moe_tree.vf", 3, true, rep, false);
  }
  ck_assert_msg(replicated > 0, "no hot expert was replicated: the replicas' arithmetic went unchecked");
}
END_TEST

START_TEST(rows_that_do_not_push_stay_out) {
  const cavs_desc *d = load_model("model stale; dim H = 3; dim C = 3; input y : class[C]; input f : real[H];\n"
                                  "param W[2H,H], Wc[H,C] init uniform(-1, 1);\n"
                                  "vertex leaf (children 0) { scatter(tanh(f)); }\n"
                                  "vertex inner (children 2) { h = tanh(f + concat(gather(0), gather(1)) @ W);\n"
                                  "  scatter(h); push(h); }\n"
                                  "push (h) { loss softmax_xent(h @ Wc, y); }\n",
                                  "float");
  int leaf = d->vertex[0].children ? 1 : 0, inner = 1 - leaf;
  long dims[CAVS_MAX_DIMS];
  cavs_dims_default(d, dims);
  cavs_model *m = new_model(d, dims, 3);
  static TGraph g;
  /* first minibatch: eight inner vertices without children, features NaN; they take the
     rows the leaves take next */
  memset(&g, 0, sizeof g);
  g.g.n = 8;
  g.g.maxc = 2;
  for (int v = 0; v < 8; v++) {
    g.type[v] = inner;
    g.child[2 * v] = g.child[2 * v + 1] = -1;
    g.feat[v] = v % 3;
    for (int j = 0; j < 3; j++) g.real[3 * v + j] = NAN;
  }
  g.g.child = g.child;
  g.g.type = g.type;
  g.g.feat = g.feat;
  g.g.real = g.real;
  const cavs_graph *gs[1] = {&g.g};
  cavs_stats st;
  ck_assert(cavs_model_forward(m, gs, 1, &st) == 0);
  ck_assert(isnan(st.loss));
  /* then a finite tree: four leaves under three inner vertices */
  int kids[] = {0, 1, 2, 3, 4, 5};
  g.g.n = 7;
  for (int v = 0; v < 7; v++) {
    g.type[v] = v < 4 ? leaf : inner;
    g.child[2 * v] = v < 4 ? -1 : kids[2 * (v - 4)];
    g.child[2 * v + 1] = v < 4 ? -1 : kids[2 * (v - 4) + 1];
    g.feat[v] = v % 3; /* labels at the leaves too, which push nothing: not read */
    for (int j = 0; j < 3; j++) g.real[3 * v + j] = 0.25f * (float)(v - j);
  }
  ck_assert(cavs_model_forward(m, gs, 1, &st) == 0);
  ck_assert_msg(isfinite(st.loss) && st.count == 3, "loss %g over %ld vertices", st.loss, st.count);
  /* the push block reads h in the state (push_off 0 of the one state, the leaves' rows
     not run); at an inner vertex its value is what the vertex pushed, at a leaf none */
  ck_assert_int_eq(d->push_buf, d->state_buf);
  double out[3], val[3];
  ck_assert_int_eq(cavs_model_vertex_output(m, 0, 0, out, 3), -1);
  ck_assert_int_lt(cavs_model_vertex_value(m, 0, 0, "h", val, 3), 0);
  ck_assert_msg(strstr(cavs_model_error(m), "pushes nothing"), "%s", cavs_model_error(m));
  for (int v = 4; v < 7; v++) {
    ck_assert_int_eq(cavs_model_vertex_output(m, 0, v, out, 3), 3);
    ck_assert_int_eq(cavs_model_vertex_value(m, 0, v, "h", val, 3), 3);
    for (int j = 0; j < 3; j++) ck_assert(out[j] == val[j] && fabs(out[j]) < 1 && out[j] != 0);
  }
  cavs_model_backward(m);
  size_t n;
  const float *grad = cavs_model_grads_flat(m, &n);
  for (size_t i = 0; i < n; i++) ck_assert_msg(isfinite(grad[i]), "gradient %zu is %g", i, (double)grad[i]);
  int gv = -1, vv = -1;
  char why[256];
  ck_assert_msg(cavs_model_check_finite(m, &gv, &vv, why, sizeof why) == 0, "%s", why);
  cavs_model_free(m);
}
END_TEST

/* cavs_model_set_targets_only: a training pass runs the push block at the labeled rows
 * alone (here the roots of two trees, the last level), with the same loss and gradients
 * as the pass over every row, in double; the other rows have no prediction and the push
 * block's values there are refused, even with every buffer poisoned first; a pass in
 * inference is not narrowed. */
/* Two models of d on the same minibatch, the second with cavs_model_set_targets_only and
 * its buffers poisoned: the same loss and gradients, every value it reads finite. The
 * models are left in m[2]. */
static void targets_only_same(const cavs_desc *d, const long *dims, const cavs_graph **gs, int k, cavs_model *m[2],
                              const char *what) {
  cavs_stats st[2];
  for (int v = 0; v < 2; v++) {
    m[v] = new_model(d, dims, 9);
    cavs_model_set_targets_only(m[v], v);
    ck_assert_msg(cavs_model_forward(m[v], gs, k, &st[v]) == 0, "%s", cavs_model_error(m[v]));
    if (v) { /* every buffer NaN: a row the pass does not write shows */
      ck_assert_int_eq(cavs_model_poison(m[v]), 0);
      ck_assert_msg(cavs_model_forward(m[v], gs, k, &st[v]) == 0, "%s", cavs_model_error(m[v]));
    }
    cavs_model_backward(m[v]);
  }
  ck_assert_int_eq(st[0].count, st[1].count);
  ck_assert_msg(fabs(st[0].loss - st[1].loss) <= 1e-13 * fabs(st[0].loss), "%s: loss %.17g vs %.17g", what,
                st[0].loss, st[1].loss);
  ck_assert_int_eq(st[0].correct, st[1].correct);
  for (int i = 0; i < d->nparams; i++) {
    long rows, cols, lda, ldb;
    const double *ga = cavs_model_grad(m[0], i, &rows, &cols, &lda), *gb = cavs_model_grad(m[1], i, &rows, &cols, &ldb);
    for (long r = 0; r < rows; r++)
      for (long j = 0; j < cols; j++)
        ck_assert_msg(fabs(ga[r * lda + j] - gb[r * ldb + j]) <= 1e-13 * fmax(fabs(ga[r * lda + j]), 1e-6),
                      "%s: gradient of %s[%ld, %ld]: %.17g vs %.17g", what, d->params[i].name, r, j, ga[r * lda + j],
                      gb[r * ldb + j]);
  }
  int gv = -1, vv = -1;
  char why[256];
  ck_assert_msg(cavs_model_check_finite(m[1], &gv, &vv, why, sizeof why) == 0, "%s: %s", what, why);
}

START_TEST(targets_only_runs_the_head_where_labeled) {
  const cavs_desc *d = load_model("model heads; dim H = 3; dim C = 3; input y : class[C]; input f : real[H];\n"
                                  "param W[2H,H], Wc[H,C] init uniform(-1, 1);\n"
                                  "vertex leaf (children 0) { scatter(tanh(f)); }\n"
                                  "vertex inner (children 2) { h = tanh(f + concat(gather(0), gather(1)) @ W);\n"
                                  "  scatter(h); push(h); }\n"
                                  "push (h) { logits = h @ Wc; loss softmax_xent(logits, y); }\n",
                                  "double");
  ck_assert_int_eq(d->push_routes, 0);
  int leaf = d->vertex[0].children ? 1 : 0, inner = 1 - leaf;
  long dims[CAVS_MAX_DIMS];
  cavs_dims_default(d, dims);
  static TGraph g[2];
  const cavs_graph *gs[2];
  /* two trees: four leaves under three inner vertices, labeled at the root (6) alone */
  for (int t = 0; t < 2; t++) {
    memset(&g[t], 0, sizeof g[t]);
    g[t].g.n = 7;
    g[t].g.maxc = 2;
    for (int v = 0; v < 7; v++) {
      g[t].type[v] = v < 4 ? leaf : inner;
      g[t].child[2 * v] = v < 4 ? -1 : 2 * (v - 4);
      g[t].child[2 * v + 1] = v < 4 ? -1 : 2 * (v - 4) + 1;
      g[t].feat[v] = v == 6 ? t + 1 : -1;
      for (int j = 0; j < 3; j++) g[t].real[3 * v + j] = 0.3f * (float)(v - j) + 0.1f * (float)t;
    }
    g[t].g.child = g[t].child;
    g[t].g.type = g[t].type;
    g[t].g.feat = g[t].feat;
    g[t].g.real = g[t].real;
    gs[t] = &g[t].g;
  }
  cavs_model *m[2];
  targets_only_same(d, dims, gs, 2, m, "heads");
  double a[3], b[3];
  for (int t = 0; t < 2; t++) {
    /* the roots: the same predictions and logits */
    ck_assert_int_ge(cavs_model_vertex_class(m[1], t, 6), 0);
    ck_assert_int_eq(cavs_model_vertex_class(m[0], t, 6), cavs_model_vertex_class(m[1], t, 6));
    ck_assert_int_eq(cavs_model_vertex_value(m[0], t, 6, "logits", a, 3), 3);
    ck_assert_int_eq(cavs_model_vertex_value(m[1], t, 6, "logits", b, 3), 3);
    for (int j = 0; j < 3; j++) ck_assert(a[j] == b[j]);
    ck_assert_int_eq(cavs_model_vertex_probs(m[1], t, 6, b, 3), 3);
    /* an inner vertex below a root: none where narrowed */
    ck_assert_int_ge(cavs_model_vertex_class(m[0], t, 4), 0);
    ck_assert_int_eq(cavs_model_vertex_class(m[1], t, 4), -1);
    ck_assert_int_eq(cavs_model_vertex_probs(m[1], t, 4, b, 3), -1);
    ck_assert_int_lt(cavs_model_vertex_value(m[1], t, 4, "logits", b, 3), 0);
    ck_assert_msg(strstr(cavs_model_error(m[1]), "targets_only"), "%s", cavs_model_error(m[1]));
    /* what it pushed is the state's, there either way */
    ck_assert_int_eq(cavs_model_vertex_output(m[1], t, 4, b, 3), 3);
  }
  /* in inference: every row */
  cavs_stats st;
  cavs_model_set_inference(m[1], 1);
  ck_assert(cavs_model_forward(m[1], gs, 2, &st) == 0);
  ck_assert_int_eq(cavs_model_vertex_class(m[1], 0, 4), cavs_model_vertex_class(m[0], 0, 4));
  cavs_model_free(m[0]);
  cavs_model_free(m[1]);
  /* a mixture of experts in the vertex block, with its balancing loss, and a dropout
     before the head (a buffer of the push block's): labeled at the roots alone, the
     backward pass's push block runs where the forward pass's did */
  d = load_model("moe_tree.vf", "double");
  static TGraph tg[TG_MINIBATCH];
  const cavs_graph *tgs[TG_MINIBATCH];
  int k = tg_minibatch(d, dims, tg, tgs, false), y = d->inputs[find_input(d, "label")].slot;
  for (int i = 0; i < k; i++) {
    bool parent[1024] = {false};
    for (int c = 0; c < tg[i].g.n * tg[i].g.maxc; c++)
      if (tg[i].child[c] >= 0) parent[tg[i].child[c]] = true;
    for (int v = 0; v < tg[i].g.n; v++)
      if (parent[v]) tg[i].feat[v * d->nint + y] = -1;
  }
  targets_only_same(d, dims, tgs, k, m, "moe_tree");
  cavs_model_free(m[0]);
  cavs_model_free(m[1]);
}
END_TEST

int main(void) {
  Suite *s = suite_create("engine");
  TCase *tc = tcase_create("engine");
  tcase_set_timeout(tc, 600);
  /* every example in every build: golden, batched as serial, the parts; the repeated
     comparisons (tu_add_examples) over a few in a checked build */
  tcase_add_loop_test(tc, golden, 0, NEXAMPLES);
  tcase_add_loop_test(tc, batched_equals_serial, 0, NEXAMPLES);
  tcase_add_loop_test(tc, batched_equals_serial_dags, 0, NEXAMPLES);
  tcase_add_loop_test(tc, parts_sum_to_the_whole, 0, NEXAMPLES);
  tcase_add_test(tc, parts_sum_to_the_whole_two_losses);
  tcase_add_loop_test(tc, parts_balance_to_the_whole, 0, 2);
  tcase_add_test(tc, parts_step_as_the_whole);
  tu_add_examples(tc, grad_hook_says_final, examples, NEXAMPLES);
  tu_add_examples(tc, ablations_change_nothing, examples, NEXAMPLES);
  tu_add_examples(tc, policies_equal_serial, examples, NEXAMPLES);
  tcase_add_test(tc, policies_equal_serial_mixed_types);
  tcase_add_test(tc, policies_count_tasks);
  tcase_add_test(tc, typed_slots_checked);
  tcase_add_test(tc, dropout_masks);
  tcase_add_test(tc, noise_draws);
  tcase_add_test(tc, dropout_option);
  tcase_add_test(tc, dropout_read_in_place);
  tu_add_examples(tc, build_ablations_change_nothing, examples, NEXAMPLES);
  tcase_add_test(tc, treelstm_learns);
  tcase_add_test(tc, rows_that_do_not_push_stay_out);
  tcase_add_test(tc, targets_only_runs_the_head_where_labeled);
  tcase_add_test(tc, moe_groups_by_expert);
  tcase_add_test(tc, balance_reads_a_dead_gate);
  tcase_add_test(tc, experts_placed_sum_to_whole);
  tcase_add_test(tc, experts_hold_their_share);
  tcase_add_test(tc, experts_fail_together);
  tcase_add_test(tc, failed_pass_leaves_the_model);
  tcase_add_test(tc, experts_placed_from_the_start);
  tcase_add_test(tc, model_without_dims_or_inputs);
  tcase_add_test(tc, backends_by_name);
  tcase_add_test(tc, backend_stats_count_products);
  tcase_add_test(tc, threads_do_not_change_results);
  tcase_add_test(tc, steps_split_over_threads);
  tu_add_examples(tc, threads_split_every_example, examples, NEXAMPLES);
  tcase_add_loop_test(tc, step_leaves_gradients_clean, 0, 2);
  tcase_add_test(tc, optimizer_state_by_kind);
  tcase_add_test(tc, saved_state_reads_back);
  tcase_add_test(tc, memory_limit_counts_moments);
  tcase_add_test(tc, optimizers_match_reference);
  tcase_add_test(tc, views_read_children_in_place);
  tu_add_examples(tc, homes_change_nothing, examples, NEXAMPLES);
  tu_add_examples(tc, dedup_changes_nothing, examples, NEXAMPLES);
  tcase_add_test(tc, dedup_of_children_holding_words);
  tcase_add_test(tc, homes_store_children_at_home);
  tcase_add_test(tc, passes_read_only_what_they_wrote);
  tcase_add_test(tc, inference_matches_training);
  tcase_add_test(tc, vertex_values_by_name);
  tcase_add_test(tc, layout_puts_children_in_blocks);
  tcase_add_test(tc, abi_mismatch_is_refused);
  tcase_add_test(tc, carried_state_continues_chains);
  tcase_add_test(tc, carried_state_needs_one_state);
  suite_add_tcase(s, tc);
  /* the losses' kernels, on their own (CK_RUN_CASE=softmax) */
  TCase *tl = tcase_create("softmax");
  tcase_set_timeout(tl, 600);
  tcase_add_test(tl, softmax_over_threads);
  suite_add_tcase(s, tl);
  /* where the pull block runs (CK_RUN_CASE=pull) */
  TCase *tp = tcase_create("pull");
  tcase_set_timeout(tp, 600);
  tcase_add_test(tp, pull_runs_where_read);
  suite_add_tcase(s, tp);
  return tu_run_suite(s);
}
