/* check_cuda_emu.c: the cuda backend, runtime/backend_cuda.cu as nvcc builds it, run on
 * the CPU against an emulated CUDA device (tests/cuda_emu.cc) and compared with the cpu
 * backend. This program links the tests' build of libcavs (tests/libcavs-emu.la), whose
 * "cuda" backend is backend_cuda.cu compiled by the host C++ compiler against the
 * emulated runtime and cuBLAS; each example's MODEL.cu is compiled the same way
 * (tests/cuda_emu.h force-included), and runs beside the C target's model on the cpu
 * backend, the same dims, seed and minibatch of random trees and DAGs.
 *
 * The emulator is strict where a GPU is (device memory the host cannot touch, copies
 * whose kind must match their pointers, ranges inside their allocations, cuBLAS's
 * argument checks, streams that run only what their events allow), so the comparison
 * checks what the backend computes and how it uses the API: every test ends with no
 * misuse recorded and nothing the model allocated left alive. Needs neither nvcc nor a
 * GPU: it runs in every configuration. */
#include "cuda_emu_api.h"
#include "cuda_emu_cases.h"
#include "cudatest.h"
#include "drawn.h"
#include "moe.h"

#include <errno.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- the models ---- */

static const char *const examples[] = {"treelstm", "treefc", "lstm_lm", "lstm_lm2", "treegru", "twotype", "tagger",
                                       "tagger_chars", "childsum", "lattice_lstm", "lattice_gru", "seq2seq", "mvrnn", "nary_treelstm", "moe_tree", "moe_lm"};
enum { NEX = sizeof examples / sizeof *examples };

/* Each example's C target (cpu) and CUDA target (cuda, MODEL.cu under cuda_emu.h), in
 * float and double, built once by main() before the tests fork: [example][double][cuda] */
static const cavs_desc *built[NEX][2][2];

static const cavs_desc *example(int i, const char *prec, bool cuda) {
  const cavs_desc **d = &built[i][!strcmp(prec, "double")][cuda];
  if (!*d) {
    char vf[64];
    snprintf(vf, sizeof vf, "%s.vf", examples[i]);
    *d = cuda ? load_host_cuda_with(examples[i], NULL, prec, "cuda_emu.h") : load_model(vf, prec);
  }
  return *d;
}

static cavs_model *model_on(const cavs_desc *d, const long *dims, const char *backend, int one_stream, int graphs) {
  char err[512];
  cavs_model_opts o = {.backend = backend, .one_stream = one_stream, .graphs = graphs};
  cavs_model *m = cavs_model_new_opts(d, dims, &o, err, sizeof err);
  ck_assert_msg(m != NULL, "%s: %s", backend, err);
  cavs_model_init(m, 5);
  /* the cpu multiplies every looked-up row, as cuda does, so that the rows' gradients
     compare too (its own multiplies a word once and leaves the sum of its rows'
     gradients at its first: check_engine's dedup_changes_nothing holds it to this) */
  if (!strcmp(backend, "cpu")) cavs_model_set_ablations(m, CAVS_NO_DEDUP);
  return m;
}

/* No misuse of the CUDA API so far. */
static void no_errors(void) {
  const char *e = cavs_emu_errors();
  ck_assert_msg(e == NULL, "the emulator found:\n%s", e ? e : "");
}

/* A model's free leaves nothing alive that was made after `since`. */
static void free_all(cavs_model *m, long since) {
  cavs_model_free(m);
  ck_assert_msg(cavs_emu_live(since) == 0, "left alive by cavs_model_free:\n%s", cavs_emu_live_report(since));
  no_errors();
}

/* The tests' minibatch of trees and DAGs for model d, in the test's variables: dims,
   the graphs g, gs pointing at them (room for them twice over), k of them */
#define MINIBATCH(d)                                                                       \
  long dims[CAVS_MAX_DIMS];                                                                \
  static TGraph g[TG_MINIBATCH];                                                           \
  const cavs_graph *gs[2 * TG_MINIBATCH];                                                  \
  int k = tg_minibatch(d, dims, g, gs, true)

/* ---- the model's memory, read back ---- */

/* `bytes` of the model's memory at p, in a host copy the caller frees */
static void *download(cavs_model *m, const void *p, size_t bytes) {
  void *h = malloc(bytes + 1);
  ck_assert(h != NULL);
  ck_assert_msg(cavs_model_read(m, h, p, bytes) == 0, "%s", cavs_model_error(m));
  return h;
}

static void device_write(cavs_model *m, void *dst, const void *src, size_t bytes) {
  ck_assert_msg(cavs_model_write(m, dst, src, bytes) == 0, "%s", cavs_model_error(m));
}
static void host_write(cavs_model *m, void *dst, const void *src, size_t bytes) { memcpy(dst, src, bytes); }
static void poison(cavs_model *m, bool grads) {
  poison_bufs(m, grads, strcmp(cavs_model_backend(m), "cpu") ? device_write : host_write);
}

/* rows x cols at the same place of a's and b's memory (ld apart), either backend's, but
   the rows `skip` sets (NULL: none) */
static void same_memory(cavs_model *a, const void *pa, cavs_model *b, const void *pb, long rows, long cols, long ld,
                        const char *what, double tol, const unsigned char *skip, double scale) {
  size_t bytes = (size_t)(rows > 0 ? (rows - 1) * ld + cols : 0) * a->esize;
  if (!bytes) return;
  void *ha = download(a, pa, bytes), *hb = download(b, pb, bytes);
  same_matrix_as(a, ha, hb, rows, cols, ld, what, tol, cavs_model_backend(a), cavs_model_backend(b), skip, scale);
  free(ha);
  free(hb);
}

static long buf_rows(const cavs_model *m, int b) { return m->d->bufs[b].edge ? m->nedges : m->rows; }

/* The rows of each per-row buffer whose values are all zero on both models (a looked-up
 * row of a vertex without a word, a gathered row without a child): their gradients are
 * read by nothing, and each backend writes other cells of them (a product over
 * looked-up rows takes the rows without an index along past two runs of rows with one
 * on CUDA, never on the CPU, and with two streams the eager products run by chunks of
 * levels): those rows are compared through what reads them. [nbufs][rows], freed by
 * the caller. */
static unsigned char **zero_rows(cavs_model *a, cavs_model *b) {
  int nb = a->d->nbufs;
  unsigned char **z = calloc((size_t)nb + 1, sizeof *z);
  ck_assert(z != NULL);
  for (int i = 0; i < nb; i++) {
    long rows = buf_rows(a, i), w = a->bw[i];
    z[i] = calloc((size_t)rows + 1, 1);
    ck_assert(z[i] != NULL);
    if (!rows || !w) continue;
    void *ha = download(a, a->val[i], (size_t)(rows * w) * a->esize), *hb = download(b, b->val[i], (size_t)(rows * w) * a->esize);
    for (long r = 0; r < rows; r++) {
      z[i][r] = 1;
      for (long j = 0; j < w && z[i][r]; j++) z[i][r] = cv_test_at(a, ha, (size_t)(r * w + j)) == 0 && cv_test_at(a, hb, (size_t)(r * w + j)) == 0;
    }
    free(ha);
    free(hb);
  }
  return z;
}
static void free_rows(cavs_model *m, unsigned char **z) {
  for (int i = 0; i < m->d->nbufs; i++) free(z[i]);
  free(z);
}

/* Rows [0, rows) of every per-row buffer (edges [0, nedges) of an edge buffer), values
 * or (with `zero`, the rows zero_rows found) gradients. */
static void same_buffers(cavs_model *a, cavs_model *b, unsigned char **zero, double tol) {
  const cavs_desc *d = a->d;
  for (int i = 0; i < d->nbufs; i++) {
    char what[300];
    snprintf(what, sizeof what, "%s of buffer %d (%s)", zero ? "gradient" : "value", i, d->bufs[i].name);
    if (!zero || a->grad[i])
      same_memory(a, zero ? a->grad[i] : a->val[i], b, zero ? b->grad[i] : b->val[i], buf_rows(a, i), a->bw[i],
                  a->bw[i], what, tol, zero ? zero[i] : NULL, 0);
  }
}

/* every parameter's gradient, to the tolerance of its values or of the model's largest
   gradient (some are sums that cancel to a millionth of the others) */
static void same_param_grads(cavs_model *a, cavs_model *b, double tol) {
  size_t n;
  const void *flat = cavs_model_grads_flat(a, &n);
  void *h = download(a, flat, n * a->esize);
  double scale = 0;
  for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs(cv_test_at(a, h, i)));
  free(h);
  for (int i = 0; i < a->d->nparams; i++) {
    long rows, cols, ld;
    const void *ga = cavs_model_grad(a, i, &rows, &cols, &ld), *gb = cavs_model_grad(b, i, &rows, &cols, &ld);
    char what[300];
    snprintf(what, sizeof what, "gradient of %s", a->d->params[i].name);
    same_memory(a, ga, b, gb, rows, cols, ld, what, tol, NULL, scale);
  }
}

/* b's gradients made a's, so that a step compares the optimizers alone (Adam's first
   step is about lr times the sign of each gradient: one that cancels to rounding noise
   would flip) */
static void same_grads_now(cavs_model *a, cavs_model *b) {
  size_t n, nb;
  const void *ga = cavs_model_grads_flat(a, &n);
  void *gb = cavs_model_grads_flat(b, &nb), *h = download(a, ga, n * a->esize);
  ck_assert(n == nb);
  device_write(b, gb, h, n * a->esize);
  free(h);
}

static void same_params(cavs_model *a, cavs_model *b, double tol) {
  for (int i = 0; i < a->d->nparams; i++) {
    long rows, cols, ld;
    const void *pa = cavs_model_param(a, i, &rows, &cols, &ld), *pb = cavs_model_param(b, i, &rows, &cols, &ld);
    char what[300];
    snprintf(what, sizeof what, "parameter %s after a step", a->d->params[i].name);
    same_memory(a, pa, b, pb, rows, cols, ld, what, tol, NULL, 0);
  }
}

/* The same forward pass on both: losses, counts and predictions. */
static void same_forward(cavs_model *a, cavs_model *b, const cavs_graph *const *gs, int k, double tol) {
  cavs_stats sa, sb;
  ck_assert_msg(cavs_model_forward(a, gs, k, &sa) == 0, "%s", cavs_model_error(a));
  ck_assert_msg(cavs_model_forward(b, gs, k, &sb) == 0, "%s", cavs_model_error(b));
  const char *name = a->d->name;
  ck_assert_msg(agree(sa.loss, sb.loss, tol), "%s: loss: %.17g, %.17g", name, sa.loss, sb.loss);
  ck_assert(sa.count == sb.count && sa.correct == sb.correct && sa.root_count == sb.root_count &&
            sa.root_correct == sb.root_correct && sa.tasks == sb.tasks);
  int na, nb;
  const cavs_loss_acc *la = cavs_model_losses(a, &na), *lb = cavs_model_losses(b, &nb);
  ck_assert_int_eq(na, nb);
  for (int i = 0; i < na; i++)
    ck_assert_msg(agree(la[i].sum, lb[i].sum, tol) && la[i].count == lb[i].count && la[i].correct == lb[i].correct,
                  "%s: loss %d: %.17g over %ld, %.17g over %ld", name, i, la[i].sum, la[i].count, lb[i].sum,
                  lb[i].count);
  ck_assert_int_eq(a->rows, b->rows);
  for (int r = 0; r < a->rows; r++)
    if (a->pred[r] != b->pred[r]) ck_abort_msg("%s: prediction of row %d: %d, %d", name, r, a->pred[r], b->pred[r]);
  for (int i = 0; i < k; i++) ck_assert_int_eq(cavs_model_root_class(a, i), cavs_model_root_class(b, i));
}

/* ---- the cuda backend against the cpu backend ---- */

/* Example `i` at `prec` on each backend: a forward pass to size the buffers, then
 * with every buffer poisoned, a forward pass (every value of every per-row buffer, the
 * losses, counts and predictions), a backward pass (every gradient of a buffer and of
 * a parameter), and an optimizer step (Adam, clipped: every parameter). */
static void models_agree_at(const cavs_desc *dc, const cavs_desc *du, double tol, int wide) {
  long dims[CAVS_MAX_DIMS];
  static TGraph g[TG_MINIBATCH];
  const cavs_graph *gs[2 * TG_MINIBATCH];
  int k = tg_minibatch_wide(dc, dims, g, gs, true, wide);
  long since = cavs_emu_serial();
  cavs_model *mc = model_on(dc, dims, "cpu", 0, 0), *mu = model_on(du, dims, "cuda", 0, 0);
  same_forward(mc, mu, gs, k, tol);
  poison(mc, false);
  poison(mu, false);
  same_forward(mc, mu, gs, k, tol);
  same_buffers(mc, mu, NULL, tol);
  unsigned char **zero = zero_rows(mc, mu);
  poison(mc, true);
  poison(mu, true);
  cavs_model_backward(mc);
  cavs_model_backward(mu);
  same_buffers(mc, mu, zero, tol);
  free_rows(mc, zero);
  same_param_grads(mc, mu, tol);
  same_grads_now(mc, mu);
  cavs_optim o = {.kind = CAVS_ADAM, .lr = 1e-2, .clip = 1};
  ck_assert(cavs_model_step(mc, &o) == 0);
  ck_assert_msg(cavs_model_step(mu, &o) == 0, "%s", cavs_model_error(mu));
  same_params(mc, mu, tol);
  /* (with dropout, the next forward pass draws new masks: the same on both) */
  same_forward(mc, mu, gs, k, tol);
  cavs_model_free(mc);
  free_all(mu, since);
}

static void models_agree(const cavs_desc *dc, const cavs_desc *du, double tol) { models_agree_at(dc, du, tol, 8); }

static void cuda_vs_cpu(int i, const char *prec, double tol) { models_agree(example(i, prec, false), example(i, prec, true), tol); }

START_TEST(examples_double) { cuda_vs_cpu(_i, "double", 1e-12); }
END_TEST

START_TEST(examples_float) { cuda_vs_cpu(_i, "float", 1e-5); }
END_TEST

/* ---- streams and graphs ---- */

/* A forward and a backward pass of `m` on the minibatch, run in the emulator's `order`,
   every per-row buffer poisoned first (a cell the pass leaves shows). */
static void pass_in(cavs_model *m, const cavs_graph *const *gs, int k, int order) {
  cavs_emu_set_order(order);
  ck_assert_msg(cavs_model_forward(m, gs, k, NULL) == 0, "%s", cavs_model_error(m));
  poison(m, false);
  ck_assert_msg(cavs_model_forward(m, gs, k, NULL) == 0, "%s", cavs_model_error(m));
  poison(m, true);
  cavs_model_backward(m);
  ck_assert_msg(!m->launch_failed, "%s", cavs_model_error(m));
  cavs_emu_set_order(CAVS_EMU_ISSUED);
}

static void same_pass(cavs_model *a, cavs_model *b, double vtol, double gtol) {
  same_buffers(a, b, NULL, vtol);
  unsigned char **zero = zero_rows(a, b);
  same_buffers(a, b, zero, gtol);
  free_rows(a, zero);
  same_param_grads(a, b, gtol);
}

/* A GPU runs a pass's two streams in any order their events allow: here the same pass
 * runs with its work run as issued, and then only when the host waits for it, the
 * first stream as far ahead as the events let it (the eager work as late as possible)
 * or the second (as early as possible). Each gives the bits of the others, and what
 * one stream gives (but for the eager products taken by chunks of levels: see
 * check_cuda_host's streams_in_any_order). */
START_TEST(streams_in_any_order) {
  const cavs_desc *d = example(_i, "double", true);
  MINIBATCH(d);
  long since = cavs_emu_serial();
  static const int orders[] = {CAVS_EMU_ISSUED, CAVS_EMU_MAIN_FIRST, CAVS_EMU_SIDE_FIRST};
  cavs_model *one = model_on(d, dims, "cuda", 1, 0), *two[3];
  pass_in(one, gs, k, CAVS_EMU_SIDE_FIRST);
  for (int i = 0; i < 3; i++) {
    two[i] = model_on(d, dims, "cuda", 0, 0);
    pass_in(two[i], gs, k, orders[i]);
  }
  for (int i = 1; i < 3; i++) same_pass(two[0], two[i], 0, 0);
  same_pass(one, two[0], 1e-11, 1e-10);
  for (int i = 0; i < 3; i++) cavs_model_free(two[i]);
  free_all(one, since);
}
END_TEST

/* Each pass captured as a CUDA graph and launched (cavs_model_opts.graphs): the graph
 * made, updated in place for a minibatch of the same shape, made again for another
 * (cudaGraphExecUpdate refuses a new topology), its nodes run in either order the
 * edges allow; the same bits as the passes launched kernel by kernel. A model that
 * routes to experts runs its first pass kernel by kernel (its routes' arrays are made
 * there), then every pass as a graph, routed on the device. */
START_TEST(graphs_as_launches) {
  const cavs_desc *d = example(_i, "double", true);
  MINIBATCH(d);
  long since = cavs_emu_serial();
  cavs_model *plain = model_on(d, dims, "cuda", 0, 0), *graphs = model_on(d, dims, "cuda", 0, 1);
  bool routes = !strncmp(examples[_i], "moe_", 4);
  for (int round = 0; round < 4; round++) {
    int kr = round < 2 ? k : k - 1 - (round & 1);
    cavs_emu_counts c;
    pass_in(plain, gs, kr, CAVS_EMU_ISSUED);
    cavs_emu_counters(NULL, 1);
    pass_in(graphs, gs, kr, round & 1 ? CAVS_EMU_SIDE_FIRST : CAVS_EMU_MAIN_FIRST);
    cavs_emu_counters(&c, 1);
    same_pass(plain, graphs, 0, 0);
    /* two forward passes and a backward one, a graph each (but the first pass of a
       model that routes), and nothing else launched in them */
    ck_assert_int_eq(c.graph_launches, routes && round == 0 ? 2 : 3);
    ck_assert_int_gt(c.graph_kernels, 3);
  }
  cavs_model_free(plain);
  free_all(graphs, since);
}
END_TEST

/* ---- faults ---- */

static bool all; /* every example and fault point (the plain build: tu_checked_build) */

/* 1, 2, and `parts` points spread to `total` (at has room for parts + 2): which of
   `total` calls to fail */
static int spread(long total, int parts, long *at) {
  int n = 0;
  for (long v = 1; v <= 2 && v <= total; v++) at[n++] = v;
  for (int j = 1; j <= parts; j++)
    if (total * j / parts > at[n - 1]) at[n++] = total * j / parts;
  return n;
}

/* What a user does with a model: made on the cuda backend, two training steps, the
 * gradients read, then inference twice (the second makes the product tables, an
 * allocation that may fail: the products are then made as in training). 0, or -1
 * with the first error (cavs_model_new_opts's or cavs_model_error's) in err. With
 * `again`, what fails for want of device memory (errno ENOMEM) is done again, on the
 * same model (a step's failure: its forward and backward passes too), and *again counts
 * the redone; params (the model's parameter bytes) then gets them as they end. */
static int use_model_again(const cavs_desc *d, const long *dims, const cavs_graph *const *gs, int k, char *err,
                           size_t len, int *again, void *params) {
  cavs_model_opts o = {.backend = "cuda"};
  errno = 0;
  cavs_model *m = cavs_model_new_opts(d, dims, &o, err, len);
  if (!m && again && errno == ENOMEM) (*again)++, m = cavs_model_new_opts(d, dims, &o, err, len);
  if (!m) return -1;
  cavs_model_init(m, 5);
  cavs_optim opt = {.kind = CAVS_ADAM, .lr = 1e-3, .clip = 5};
  int rc = 0;
  for (int step = 0; step < 2 && !rc; step++)
    for (int tries = 0; tries < 2; tries++) {
      errno = 0;
      rc = cavs_model_forward(m, gs, k, NULL);
      if (!rc) cavs_model_backward(m);
      if (!rc) rc = cavs_model_step(m, &opt);
      if (!rc || !again || errno != ENOMEM) break;
      (*again)++;
    }
  size_t n;
  const void *g = cavs_model_grads_flat(m, &n);
  double first;
  if (!rc) rc = cavs_model_read(m, &first, g, m->esize);
  cavs_model_set_inference(m, 1);
  for (int pass = 0; pass < 2 && !rc; pass++)
    for (int tries = 0; tries < 2; tries++) {
      errno = 0;
      rc = cavs_model_forward(m, gs, k, NULL);
      if (!rc || !again || errno != ENOMEM) break;
      (*again)++;
    }
  const void *p = cavs_model_params_flat(m, &n);
  if (!rc && params) rc = cavs_model_read(m, params, p, n * m->esize);
  if (rc) snprintf(err, len, "%s", cavs_model_error(m));
  cavs_model_free(m);
  return rc;
}
static int use_model(const cavs_desc *d, const long *dims, const cavs_graph *const *gs, int k, char *err, size_t len) {
  return use_model_again(d, dims, gs, k, err, len, NULL, NULL);
}

/* What the device is asked to do by a model's use without faults */
static cavs_emu_counts use_counted(const cavs_desc *d, const long *dims, const cavs_graph *const *gs, int k) {
  char err[512];
  cavs_emu_counts c;
  cavs_emu_counters(NULL, 1);
  ck_assert_msg(use_model(d, dims, gs, k, err, sizeof err) == 0, "%s", err);
  cavs_emu_counters(&c, 1);
  return c;
}

/* Every device allocation a model and its use make, failed in turn (the emulator fails
 * the n-th cudaMalloc with cudaErrorMemoryAllocation; in a checked build a few): each
 * comes back as an error that names cudaMalloc (from the model's making, or the pass
 * or step that needed the memory), or, for the product tables of inference, as nothing at all; nothing the model
 * made is left alive, and the emulator saw no misuse. */
START_TEST(failed_malloc) {
  const cavs_desc *d = example(_i, "float", true);
  MINIBATCH(d);
  char err[512];
  cavs_emu_counts c = use_counted(d, dims, gs, k);
  ck_assert_int_gt(c.mallocs, 3);
  int failed = 0;
  long at[12];
  int nat = all ? 0 : spread(c.mallocs, 3, at);
  for (long i = 0, n = 1; all ? n <= c.mallocs : i < nat; i++, n++) {
    if (!all) n = at[i];
    long since = cavs_emu_serial();
    cavs_emu_fail_malloc(n);
    err[0] = 0;
    int rc = use_model(d, dims, gs, k, err, sizeof err);
    cavs_emu_fail_malloc(0);
    ck_assert_msg(rc == 0 || strstr(err, "cudaMalloc"), "%s: cudaMalloc %ld of %ld failed: \"%s\"", examples[_i], n,
                  c.mallocs, err);
    failed += rc != 0;
    ck_assert_msg(cavs_emu_live(since) == 0, "%s: cudaMalloc %ld failed, left alive:\n%s", examples[_i], n,
                  cavs_emu_live_report(since));
    no_errors();
  }
  ck_assert_int_gt(failed, 0);
}
END_TEST

/* The same failures, each done again once it failed (use_model_again): the model goes
 * on where it failed (the device's memory is not a lasting fault: backend_cuda.cu's
 * schedule clears it, and the buffers that could not grow hold nothing) and ends with
 * the parameters of a use where nothing failed, bit for bit; nothing is left alive, no
 * misuse. */
START_TEST(failed_malloc_again) {
  const cavs_desc *d = example(_i, "float", true);
  MINIBATCH(d);
  char err[512];
  cavs_emu_counts c = use_counted(d, dims, gs, k);
  size_t bytes = 0;
  {
    char e[512];
    cavs_model_opts o = {.backend = "cuda"};
    cavs_model *m = cavs_model_new_opts(d, dims, &o, e, sizeof e);
    ck_assert_msg(m != NULL, "%s", e);
    size_t n;
    cavs_model_params_flat(m, &n);
    bytes = n * m->esize;
    cavs_model_free(m);
  }
  unsigned char *want = malloc(bytes), *got = malloc(bytes);
  ck_assert(want && got);
  int none = 0;
  ck_assert_msg(use_model_again(d, dims, gs, k, err, sizeof err, &none, want) == 0 && !none, "%s", err);
  long at[12];
  int nat = all ? 0 : spread(c.mallocs, 3, at), redone = 0;
  for (long i = 0, n = 1; all ? n <= c.mallocs : i < nat; i++, n++) {
    if (!all) n = at[i];
    long since = cavs_emu_serial();
    int again = 0;
    cavs_emu_fail_malloc(n);
    err[0] = 0;
    int rc = use_model_again(d, dims, gs, k, err, sizeof err, &again, got);
    cavs_emu_fail_malloc(0);
    ck_assert_msg(rc == 0, "%s: cudaMalloc %ld of %ld failed, done again: \"%s\"", examples[_i], n, c.mallocs, err);
    ck_assert_msg(!memcmp(got, want, bytes), "%s: cudaMalloc %ld of %ld failed: other parameters after it", examples[_i],
                  n, c.mallocs);
    redone += again;
    ck_assert_msg(cavs_emu_live(since) == 0, "%s: cudaMalloc %ld failed, left alive:\n%s", examples[_i], n,
                  cavs_emu_live_report(since));
    no_errors();
  }
  ck_assert_int_gt(redone, 0);
  free(want);
  free(got);
}
END_TEST

/* Kernels a model's use launches, made to fault (cudaErrorIllegalAddress when it runs,
 * sticky as on a GPU: the context is lost), each in a process of its own: the first
 * two and every tenth of the way to the last (a fork and a model's use each: all of
 * them would take a minute), in the forward and backward passes, the step and
 * inference alike: the error comes back from the next call that waits for the device,
 * naming the call that saw it and what CUDA said; the model frees, leaving nothing
 * alive, and the emulator saw no misuse (no free of memory queued work still uses). */
START_TEST(failed_launch) {
  const cavs_desc *d = example(_i, "float", true);
  MINIBATCH(d);
  char err[512];
  cavs_emu_counts c = use_counted(d, dims, gs, k);
  ck_assert_int_gt(c.launches, 10);
  long at[12];
  int nat = spread(c.launches, all ? 10 : 3, at);
  for (int i = 0; i < nat; i++) {
    long n = at[i];
    fflush(NULL);
    pid_t pid = fork();
    ck_assert(pid >= 0);
    if (!pid) {
      long since = cavs_emu_serial();
      cavs_emu_fail_launch(n);
      int rc = use_model(d, dims, gs, k, err, sizeof err);
      const char *bad = rc == 0                                            ? "no error"
                        : !strstr(err, "an illegal memory access was encountered") ? "not CUDA's message"
                        : !strstr(err, "cudaDeviceSynchronize")                ? "not the call"
                        : cavs_emu_live(since)                                 ? "something left alive"
                        : cavs_emu_errors()                                    ? "a misuse"
                                                                               : NULL;
      if (bad) fprintf(stderr, "%s: launch %ld faulted: %s: \"%s\"\n%s%s", examples[_i], n, bad, err,
                       cavs_emu_live_report(since), cavs_emu_errors() ? cavs_emu_errors() : "");
      _exit(bad ? 1 : 0);
    }
    int st;
    ck_assert(waitpid(pid, &st, 0) == pid);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s: launch %ld faulted (status %#x): see the log", examples[_i],
                  n, st);
  }
}
END_TEST

/* ---- the emulator's own checks ---- */

static void error_says(const char *what) {
  const char *e = cavs_emu_errors();
  ck_assert_msg(e && strstr(e, what), "no error saying \"%s\" in:\n%s", what, e ? e : "(none)");
  cavs_emu_clear_errors();
}

START_TEST(copies_checked) {
  ck_assert(emu_case_copy_kind());
  error_says("cudaMemcpyDeviceToHost): the destination is device memory");
  no_errors();
  ck_assert(emu_case_copy_2d());
  const char *e = cavs_emu_errors(); /* both refusals said, each naming cudaMemcpy2D */
  ck_assert_msg(e && strstr(e, "cudaMemcpy2D(") && strstr(e, "the width is more than a pitch") && strstr(e, "past its end"),
                "%s", e ? e : "(none)");
  cavs_emu_clear_errors();
  no_errors();
}
END_TEST

/* column-major, computed as the documentation says; a leading dimension too small or a
   negative size refused */
START_TEST(gemm_column_major) {
  double c[4];
  ck_assert(emu_case_gemm(c));
  /* A = [1 3 5; 2 4 6], B = [1 0; 0 1; 2 1] */
  ck_assert(c[0] == 11 && c[1] == 14 && c[2] == 8 && c[3] == 10);
  error_says("lda 1 is less than max(1, 2)");
}
END_TEST

START_TEST(host_memory_launched) {
  ck_assert(emu_case_host_pointer_launch());
  error_says("pointer argument 1");
}
END_TEST

/* these end the process, with the emulator's message */
START_TEST(host_reads_device) { emu_case_host_reads_device(); }
END_TEST
START_TEST(kernel_past_end) { emu_case_kernel_past_end(); }
END_TEST
START_TEST(kernel_after_free) { emu_case_kernel_after_free(); }
END_TEST

START_TEST(barriers) {
  double sum = 0;
  emu_case_barriers(&sum);
  ck_assert(sum == 255.0 * 256 / 2);
  error_says("ended without it");
}
END_TEST

START_TEST(poison_until_synchronized) {
  double before, after;
  emu_case_poison_until_sync(&before, &after);
  ck_assert(isnan(before) && after == 2.5);
  error_says("the host changed the pinned source before the copy ran");
}
END_TEST

START_TEST(graph_update_rules) {
  int bad = emu_case_graph_update();
  ck_assert_msg(bad == 0, "graph update case: %#x", bad);
  error_says("cudaMalloc during a stream capture");
}
END_TEST

/* ---- what check_gpu also asserts, on the emulator ---- */

/* Dropout (no example has it; drawn.h's mixdrop): the masks (drawn from each row's
 * vertex, the seed and the step) the cpu's, before a step and after it. */
static const cavs_desc *drop_c, *drop_u;

static int example_index(const char *name);

START_TEST(dropout_as_cpu) { models_agree(drop_c, drop_u, 1e-12); }
END_TEST

/* noise (no example has it; drawn.h's noisy): the draws (Box and Muller's transform of
 * each row's key, the node and the column, cavs_noise_z) the cpu's, before a step and
 * after */
static const cavs_desc *noise_c, *noise_u;

/* (1e-10, not 1e-12: with OpenBLAS's Haswell kernels, which it takes under valgrind,
   as valgrind hides AVX-512, and with OPENBLAS_CORETYPE=Haswell, the cpu's products
   sum in another order than the emulated cuBLAS's, and a state of 1.9e-4 rounds apart
   by 3.8e-15, past 1e-12's floor of 1e-15 of the buffer's largest value; with the
   SkylakeX kernels it agrees to 1e-12) */
START_TEST(noise_as_cpu) { models_agree(noise_c, noise_u, 1e-10); }
END_TEST

/* The experts' grouped products past one block's tile: the mixture-of-experts Tree-LSTM
 * with every width 70 or more (two tiles of columns, five slices of k, stages of
 * several tiles of slots with many runs of experts in each) and as many experts (most
 * receive no slot in a stage, some none in a pass): the cpu's values, gradients and
 * step. */
START_TEST(moe_wide_as_cpu) {
  int x = example_index("moe_tree");
  models_agree_at(example(x, "double", false), example(x, "double", true), 1e-12, 70);
}
END_TEST

/* A mixture of experts in the push block, no balancing loss, the leaves unlabeled: the
 * push block's backward runs over the labeled rows only, a part of the routing's, whose
 * other slots' gradients (set whole, not cleared: cavs_scomb_bwd's dv_set) must come out
 * zero. Every buffer poisoned first, then the cpu's values and gradients. */
/* (a binary tree whose push block is a mixture: the model's name, its experts, the
   gate's parameter and top's arguments) */
#define MOE_PUSH_SRC(NAME, X, GATE_PARAM, TOP)                                                                \
  "model " NAME "; dim H = 4; dim C = 3; dim V = 6; dim X = " X "; dim HC = H * C;\n"                        \
  "input w : index[V]; input y : class[C];\n"                                                                \
  "param emb[V,H], W[2H,H], " GATE_PARAM ", E[X,HC], Wc[H,C] init uniform(-1, 1);\n"                        \
  "pull { x = emb[w]; }\n"                                                                                   \
  "vertex v (children 2) { h = tanh(pull() + concat(gather(0), gather(1)) @ W); scatter(h); push(h); }\n"    \
  "push (h) { loss softmax_xent(moe(e in top(" TOP "): relu(h) @ E[e] + h @ Wc), y); }\n"
static const char *const moe_push_src = MOE_PUSH_SRC("moepush", "4", "Wg[H,X]", "h @ Wg, 2");
static const cavs_desc *moe_push_c, *moe_push_u;

START_TEST(moe_labeled_rows_as_cpu) {
  const cavs_desc *dc = moe_push_c, *du = moe_push_u;
  MINIBATCH(dc);
  int y = -1;
  for (int i = 0; i < dc->ninputs; i++)
    if (dc->inputs[i].kind == CAVS_IN_CLASS) y = dc->inputs[i].slot;
  ck_assert(y >= 0);
  for (int i = 0; i < k; i++)
    for (int v = 0; v < g[i].g.n; v++) {
      bool leaf = true;
      for (int c = 0; c < g[i].g.maxc; c++) leaf = leaf && g[i].child[v * g[i].g.maxc + c] < 0;
      if (leaf) g[i].feat[v * dc->nint + y] = -1;
    }
  long since = cavs_emu_serial();
  cavs_model *mc = model_on(dc, dims, "cpu", 0, 0), *mu = model_on(du, dims, "cuda", 0, 0);
  same_forward(mc, mu, gs, k, 1e-12);
  poison(mc, false), poison(mu, false);
  same_forward(mc, mu, gs, k, 1e-12);
  poison(mc, true), poison(mu, true);
  cavs_model_backward(mc);
  cavs_model_backward(mu);
  ck_assert_msg(!mu->launch_failed, "%s", cavs_model_error(mu));
  unsigned char **zero = zero_rows(mc, mu);
  same_buffers(mc, mu, zero, 1e-12);
  free_rows(mc, zero);
  same_param_grads(mc, mu, 1e-12);
  cavs_model_free(mc);
  free_all(mu, since);
}
END_TEST

/* The slots the device's tiled counting sort numbers (topk_tile_k and after) are the
 * cpu's, each row's choices' and each slot's expert, in both mixtures: a stage's rows
 * routed together, the language model's push block's stage of more choices than two
 * tiles of CAVS_CUDA_BLOCK hold, the last partial; and that model with 300 experts,
 * more than a block's threads, most without a slot in the tile. (The per-slot buffers
 * compared above tell it too, as a value at a slot; this names the route, row and
 * choice.) The second pass's, with each route's rows marked unrouted before it.
 *
 * And the balancing loss's sums, the same bits on both backends (`sums`), in a mixture
 * whose gate is a table's row (moe_bal_src's G[w]: the same bits on both, where a
 * product's may differ in the last place), so that each row's softmax is too: over a
 * push block's stage of more rows than a tile of CV_PSUM_ROWS holds, they are added in
 * moe.h's order on both (a thread an expert adding the rows in row order gives other
 * bits). */
static const char *const moe_bal_src = MOE_PUSH_SRC("moebal", "5", "G[V,X]", "G[w], 2, 0.01");
static const cavs_desc *moe_bal_c, *moe_bal_u;
int cavs_emu_route_slots(cavs_model *m, int id, const int **rslot, const int **sexp); /* backend_cuda_emu.cc */
void cavs_emu_route_one_block(long max);
static const struct {
  const char *name;
  long experts; /* X, or 0: MINIBATCH's */
  bool sums;    /* moe_bal_src, its sums compared too */
} slot_cases[] = {{"moe_tree", 0, false}, {"moe_lm", 0, false}, {"moe_lm", 300, false}, {"moebal", 0, true}};
START_TEST(moe_slots_as_cpu) {
  int c = _i / 2; /* each case routed in one block a stage (route_block_k) and in tiles */
  bool tiled = _i % 2;
  cavs_emu_route_one_block(tiled ? 0 : -1);
  bool sums = slot_cases[c].sums;
  int x = sums ? -1 : example_index(slot_cases[c].name);
  const char *name = slot_cases[c].name;
  const cavs_desc *dc = sums ? moe_bal_c : example(x, "double", false);
  const cavs_desc *du = sums ? moe_bal_u : example(x, "double", true);
  MINIBATCH(dc);
  for (int i = 0; i < dc->ndims; i++)
    if (slot_cases[c].experts && !strcmp(dc->dims[i].name, "X")) dims[i] = slot_cases[c].experts;
  long since = cavs_emu_serial();
  cavs_model *mc = model_on(dc, dims, "cpu", 0, 0), *mu = model_on(du, dims, "cuda", 0, 0);
  same_forward(mc, mu, gs, k, 1e-12);
  for (int id = 0; id < CV_MAX_ROUTES; id++)
    for (int b = 0; b < 2; b++) {
      struct cv_route *rt = &(b ? mu : mc)->route[id];
      if (rt->stages) memset(rt->rbeg, 0xff, sizeof(int) * (size_t)rt->caprows);
    }
  same_forward(mc, mu, gs, k, 1e-12);
  int routes = 0, wide = 0, wide_rows = 0;
  for (int id = 0; id < CV_MAX_ROUTES; id++) {
    const struct cv_route *rc = &mc->route[id], *ru = &mu->route[id];
    if (!rc->stages) continue;
    routes++;
    if (sums) {
      ck_assert(rc->bal > 0 && ru->bal > 0 && rc->aux_rows == ru->aux_rows && rc->nx_pass == ru->nx_pass);
      for (long e = 0; e < rc->nx_pass; e++) {
        ck_assert_msg(rc->pcnt[e] == ru->pcnt[e], "route %d, expert %ld: %ld slots, the cpu's %ld", id, e, ru->pcnt[e],
                      rc->pcnt[e]);
        ck_assert_msg(!memcmp(&rc->psum[e], &ru->psum[e], sizeof(double)),
                      "route %d, expert %ld: summed probability %.17g, the cpu's %.17g", id, e, ru->psum[e],
                      rc->psum[e]);
      }
    }
    int K = rc->K;
    long n = (long)K * mc->rows;
    const int *rs, *se;
    ck_assert(cavs_emu_route_slots(mu, id, &rs, &se) == 0);
    int *rslot = download(mu, rs, sizeof(int) * (size_t)n), *sexp = download(mu, se, sizeof(int) * (size_t)n);
    long routed = 0;
    for (int r = 0; r < mc->rows; r++) {
      if (rc->rbeg[r] < 0) {
        ck_assert_int_lt(ru->rbeg[r], 0);
        continue;
      }
      ck_assert(ru->rbeg[r] == rc->rbeg[r] && ru->rend[r] == rc->rend[r]);
      if (r == rc->rbeg[r] && (long)K * (rc->rend[r] - r) > CAVS_CUDA_BLOCK) wide++;
      if (r == rc->rbeg[r] && rc->rend[r] - r > CV_PSUM_ROWS) wide_rows++;
      for (long i = (long)K * r; i < (long)K * (r + 1); i++) {
        ck_assert_msg(rslot[i] == rc->rslot[i], "%s: route %d, row %d, choice %ld: slot %d, the cpu's %d",
                      name, id, r, i - (long)K * r, rslot[i], rc->rslot[i]);
        ck_assert(rslot[i] >= 0 && rslot[i] < n && sexp[rslot[i]] == rc->sexp[rc->rslot[i]]);
      }
      routed++;
    }
    ck_assert_int_gt(routed, 0);
    free(rslot);
    free(sexp);
  }
  ck_assert_int_gt(routes, 0);
  if (strcmp(name, "moe_tree")) ck_assert_int_gt(wide, 0); /* (the tree's stages have one tile each) */
  if (sums) ck_assert_int_gt(wide_rows, 0);
  cavs_model_free(mc);
  free_all(mu, since);
  cavs_emu_route_one_block(-1);
}
END_TEST

/* A forward and a backward pass of a model of d on `backend` under `policy`, from seed 5,
   every per-row buffer poisoned first (cells a pass leaves keep the poison) */
static cavs_model *passes(const cavs_desc *d, const long *dims, const char *backend, int policy,
                          const cavs_graph *const *gs, int k) {
  cavs_model *m = model_on(d, dims, backend, 0, 0);
  cavs_model_set_policy(m, policy);
  ck_assert_msg(cavs_model_forward(m, gs, k, NULL) == 0, "%s", cavs_model_error(m));
  poison(m, false);
  ck_assert_msg(cavs_model_forward(m, gs, k, NULL) == 0, "%s", cavs_model_error(m));
  poison(m, true);
  cavs_model_backward(m);
  ck_assert_msg(!m->launch_failed, "%s", cavs_model_error(m));
  return m;
}

/* One vertex at a time (CAVS_SERIAL: every stage a row, products of one row) against
 * batched, both on the cuda backend: the same loss, values and gradients. */
START_TEST(serial_as_batched) {
  const cavs_desc *d = example(_i, "double", true);
  MINIBATCH(d);
  long since = cavs_emu_serial();
  cavs_model *b = passes(d, dims, "cuda", CAVS_BFS, gs, k), *s1 = passes(d, dims, "cuda", CAVS_SERIAL, gs, k);
  int nb, ns;
  const cavs_loss_acc *lb = cavs_model_losses(b, &nb), *ls = cavs_model_losses(s1, &ns);
  for (int i = 0; i < nb; i++)
    ck_assert_msg(agree(lb[i].sum, ls[i].sum, 1e-11) && lb[i].count == ls[i].count && lb[i].correct == ls[i].correct,
                  "%s: loss %d: batched %.17g, serial %.17g", d->name, i, lb[i].sum, ls[i].sum);
  same_pass(b, s1, 1e-11, 1e-10);
  cavs_model_free(b);
  free_all(s1, since);
}
END_TEST

/* Every optimizer step of the cpu backend's, two steps from the same gradients (the
 * moments and the momentum buffer too; the second step's gradients are zero, which
 * momentum still moves by): SGD, Adagrad, Adam, Adam clipped (a clip below the
 * gradients' norm), SGD with weight decay, Adam with weight decay and clipping, Adam's
 * settings, Momentum and Nesterov plain and with weight decay and clipping, AdamW's
 * decoupled decay alone and clipped, and Adam with a parameter frozen; lookup tables
 * (the Tree-LSTM's: only the rows read) and dense groups. */
START_TEST(optimizers_as_cpu) {
  const cavs_desc *dc = example(_i, "double", false), *du = example(_i, "double", true);
  MINIBATCH(dc);
  static const cavs_optim optims[] = {
      {.kind = CAVS_SGD, .lr = 0.1},
      {.kind = CAVS_ADAGRAD, .lr = 0.1},
      {.kind = CAVS_ADAM, .lr = 1e-2},
      {.kind = CAVS_ADAM, .lr = 1e-2, .clip = 1e-3},
      {.kind = CAVS_SGD, .lr = 0.1, .weight_decay = 0.01},
      {.kind = CAVS_ADAM, .lr = 1e-2, .weight_decay = 0.01, .clip = 1e-2},
      {.kind = CAVS_ADAM, .lr = 1e-2, .beta1 = 0.8, .beta2 = 0.99, .eps = 1e-6},
      {.kind = CAVS_MOMENTUM, .lr = 0.1},
      {.kind = CAVS_MOMENTUM, .lr = 0.1, .momentum = 0.5, .weight_decay = 0.01, .clip = 1e-2},
      {.kind = CAVS_NESTEROV, .lr = 0.1, .momentum = 0.8},
      {.kind = CAVS_NESTEROV, .lr = 0.1, .weight_decay = 0.01, .clip = 1e-3},
      {.kind = CAVS_ADAMW, .lr = 1e-2, .weight_decay = 0.1},
      {.kind = CAVS_ADAMW, .lr = 1e-2, .weight_decay = 0.1, .clip = 1e-2, .beta1 = 0.8, .eps = 1e-6},
  };
  for (int o = 0; o <= (int)(sizeof optims / sizeof *optims); o++) {
    long since = cavs_emu_serial();
    cavs_model *mc = passes(dc, dims, "cpu", CAVS_BFS, gs, k), *mu = passes(du, dims, "cuda", CAVS_BFS, gs, k);
    const cavs_optim *op = &optims[o < (int)(sizeof optims / sizeof *optims) ? o : 2];
    if (o == (int)(sizeof optims / sizeof *optims)) { /* the last: a parameter frozen */
      int p = 0;
      while (p < dc->nparams && cavs_model_freeze(mc, p, 1)) p++;
      ck_assert_msg(p < dc->nparams, "%s: no parameter can be frozen alone", dc->name);
      ck_assert(cavs_model_freeze(mu, p, 1) == 0);
    }
    same_grads_now(mc, mu);
    for (int step = 0; step < 2; step++) {
      ck_assert(cavs_model_step(mc, op) == 0);
      ck_assert_msg(cavs_model_step(mu, op) == 0, "%s", cavs_model_error(mu));
    }
    same_params(mc, mu, 1e-12);
    cavs_model_free(mc);
    free_all(mu, since);
  }
}
END_TEST

/* Inference (cavs_model_set_inference): nothing kept for a backward pass, and from the
 * second pass the product tables of looked-up rows (made on the device once as many
 * rows went through the product as the table has): the cpu's losses, counts and
 * predictions, with kernels launched one by one and with each pass a CUDA graph. */
START_TEST(inference_as_cpu) {
  const cavs_desc *dc = example(_i, "double", false), *du = example(_i, "double", true);
  MINIBATCH(dc);
  for (int graphs = 0; graphs < 2; graphs++) {
    long since = cavs_emu_serial();
    cavs_model *mc = model_on(dc, dims, "cpu", 0, 0), *mu = model_on(du, dims, "cuda", 0, graphs);
    cavs_model_set_inference(mc, 1);
    cavs_model_set_inference(mu, 1);
    for (int pass = 0; pass < 3; pass++) same_forward(mc, mu, gs, k, 1e-12);
    cavs_model_free(mc);
    free_all(mu, since);
  }
}
END_TEST

/* A checkpoint written from the cuda backend (cavs_ckpt_save after a training step),
 * read back and applied to a model of the C target on the cpu backend: the cuda model's
 * parameters, and its loss on the next minibatch. */
START_TEST(checkpoint_to_cpu) {
  const cavs_desc *dc = example(_i, "double", false), *du = example(_i, "double", true);
  MINIBATCH(dc);
  long since = cavs_emu_serial();
  cavs_model *mu = passes(du, dims, "cuda", CAVS_BFS, gs, k), *mc = model_on(dc, dims, "cpu", 0, 0);
  cavs_optim o = {.kind = CAVS_ADAM, .lr = 1e-2};
  ck_assert_msg(cavs_model_step(mu, &o) == 0, "%s", cavs_model_error(mu));
  char path[4200], err[512], *dir = tu_tmpdir();
  snprintf(path, sizeof path, "%s/cuda.ckpt", dir);
  ck_assert_msg(cavs_ckpt_save(path, mu, NULL, NULL, NULL, err, sizeof err) == 0, "%s", err);
  cavs_ckpt *ck = cavs_ckpt_read(path, err, sizeof err);
  ck_assert_msg(ck != NULL, "%s", err);
  ck_assert_msg(cavs_ckpt_apply_weights(ck, mc, err, sizeof err) == 0, "%s", err);
  cavs_ckpt_free(ck);
  unlink(path);
  rmdir(dir);
  free(dir);
  same_params(mc, mu, 0);
  same_forward(mc, mu, gs, k, 1e-12);
  cavs_model_free(mc);
  free_all(mu, since);
}
END_TEST

/* ---- what a minibatch costs on the device ---- */

/* What the device was asked to do in one training step, and what the step's minibatch
 * is: its trees, rows, and the bytes of its schedule and inputs. */
typedef struct StepCounts {
  cavs_emu_counts c;
  int trees;
  long rows, sched, out;
  double flops, host; /* the products' flops; the host's seconds scheduling (levels, rows, plans) */
  /* a mixture of experts: the stages routed (on the device: no wait), the rows routed,
     the expert products issued, and the bytes the routings send down over the step */
  long routed_stages, routed_rows, route_down, expert_products;
} StepCounts;

/* Each routing's stages, slots and expert products so far */
static void routing_so_far(const cavs_model *m, long stages[CV_MAX_ROUTES], long slots[CV_MAX_ROUTES],
                           long products[CV_MAX_ROUTES]) {
  for (int i = 0; i < CV_MAX_ROUTES; i++) {
    const struct cv_route *r = &m->route[i];
    stages[i] = r->stages, slots[i] = 0, products[i] = r->products;
    for (long j = 0; r->load && j < r->nx; j++) slots[i] += r->load[j];
  }
}

/* What the routings since (stages, slots) cost: rows, products, and bytes: nothing up
   (the rows are routed where their gate values are), and down, once a forward pass,
   each routing's loads, balancing counts and summed probabilities (3 X words) */
static void routing_since(const cavs_model *m, const long stages[CV_MAX_ROUTES], const long slots[CV_MAX_ROUTES],
                          const long products[CV_MAX_ROUTES], StepCounts *out) {
  out->routed_stages = out->routed_rows = out->route_down = out->expert_products = 0;
  for (int i = 0; i < CV_MAX_ROUTES; i++) {
    const struct cv_route *r = &m->route[i];
    long now = 0;
    for (long j = 0; r->load && j < r->nx; j++) now += r->load[j];
    out->expert_products += m->route[i].products - products[i];
    if (now == slots[i]) continue;
    out->routed_stages += r->stages - stages[i];
    out->routed_rows += (now - slots[i]) / r->K;
    out->route_down += 3 * 8 * r->nx;
  }
}

/* The bytes the host must send the device for the minibatch `m` holds: its schedule as
 * the scheduler keeps it in host arrays (each row's children, root and pushed flags,
 * vertex, homes; each edge's row, parent and child), its index and real inputs, each
 * array rounded up to 16 bytes; and the rows of the lookup tables it and the minibatch
 * before it touched (the ones a backward pass clears, cavs_sparse_reset: `before` of
 * them; the optimizer's spans, {offset, start} a span: one a dense group and one a
 * touched row). Nothing proportional to the parameters or the per-row buffers. */
static long schedule_bytes(const cavs_model *m, long before) {
  const cavs_desc *d = m->d;
  long N = m->rows, E = m->has_edges ? m->nedges : 0, b = 0, spans = 0, touched = 0;
#define ARRAY(bytes) (b += ((long)(bytes) + 15) / 16 * 16)
  ARRAY(4 * N * m->maxc), ARRAY(N), ARRAY(N), ARRAY(4 * N);
  if (m->has_edges) ARRAY(4 * (N + 1)), ARRAY(4 * E), ARRAY(4 * E);
  for (int k = 0; k < m->nhomes; k++) ARRAY(sizeof(void *) * N), ARRAY(sizeof(void *) * N), ARRAY(sizeof(long) * N);
  for (int i = 0; i < d->nint; i++) ARRAY(4 * N);
  for (int i = 0; i < d->nreal; i++) ARRAY((long)m->rw[i] * (long)m->esize * N);
#undef ARRAY
  for (int g = 0; g < d->npgroups; g++) {
    if (d->pgroups[g].sparse_input >= 0) touched += m->ntouched[g];
    spans += m->frozen[g] ? 0 : d->pgroups[g].sparse_input >= 0 ? m->ntouched[g] : 1;
  }
  return b + 4 * before + 2 * (long)sizeof(size_t) * (spans + 1);
}

static long touched_rows(const cavs_model *m) {
  long n = 0;
  for (int g = 0; g < m->d->npgroups; g++)
    if (m->d->pgroups[g].sparse_input >= 0) n += m->ntouched[g];
  return n;
}

/* A training step (forward, backward, Adam with clipping) of `m` on gs[0..k), counted */
static void counted_step(cavs_model *m, const cavs_graph *const *gs, int k, StepCounts *out) {
  cavs_optim o = {.kind = CAVS_ADAM, .lr = 1e-3, .clip = 5};
  long before = touched_rows(m), stages[CV_MAX_ROUTES], slots[CV_MAX_ROUTES], products[CV_MAX_ROUTES];
  routing_so_far(m, stages, slots, products);
  cavs_emu_counters(NULL, 1);
  cavs_model_backend_stats(m, NULL, 1);
  ck_assert_msg(cavs_model_forward(m, gs, k, NULL) == 0, "%s", cavs_model_error(m));
  cavs_model_backward(m);
  ck_assert_msg(cavs_model_step(m, &o) == 0, "%s", cavs_model_error(m));
  cavs_emu_counters(&out->c, 0); /* (the log of its ops kept until the next step) */
  cavs_backend_stats st;
  cavs_model_backend_stats(m, &st, 1);
  out->trees = k;
  out->rows = m->rows;
  out->sched = schedule_bytes(m, before);
  /* the losses' sums and counts, and a prediction a row */
  out->out = (8 + 32) * (long)m->d->nlosses + 4 * m->rows;
  out->flops = st.gemm_flops;
  out->host = st.schedule_seconds;
  routing_since(m, stages, slots, products, out);
}

static void counts_line(const char *name, const char *prec, const StepCounts *s) {
  const cavs_emu_counts *c = &s->c;
  printf("%-13s %-6s %5d %6ld %8ld %8ld %7ld %10ld %10ld %10ld %7ld %7ld %5ld %10.4g\n", name, prec, s->trees, s->rows,
         c->launches, c->blas_calls, c->memsets, c->bytes_htod, s->sched, c->bytes_dtoh, c->mallocs + c->host_mallocs,
         c->frees + c->host_frees, c->syncs, s->flops);
}

static void counts_header(void) {
  printf("%-13s %-6s %5s %6s %8s %8s %7s %10s %10s %10s %7s %7s %5s %10s\n", "example", "prec", "trees", "rows",
         "launches", "cuBLAS", "memsets", "H->D", "schedule", "D->H", "mallocs", "frees", "syncs", "flops");
}

/* The targets of a training step in the steady state, once buffers have grown: no device
 * or pinned allocation or free, one host synchronization (the forward pass reading its
 * losses back), no more bytes up than the minibatch's schedule and inputs, and down its
 * losses and predictions. A mixture of experts routes on the device: no more waits,
 * nothing more up, and down its routings' counts (routing_since). */
static void steady(const char *name, const StepCounts *s) {
  const cavs_emu_counts *c = &s->c;
  ck_assert_msg(c->mallocs + c->host_mallocs + c->frees + c->host_frees == 0, "%s: %ld allocations, %ld frees", name,
                c->mallocs + c->host_mallocs, c->frees + c->host_frees);
  ck_assert_msg(c->syncs == 1, "%s: %ld host synchronizations in a training step (%ld routed stages)", name, c->syncs,
                s->routed_stages);
  ck_assert_msg(c->bytes_htod <= s->sched, "%s: %ld bytes up, the schedule and inputs are %ld", name, c->bytes_htod,
                s->sched);
  ck_assert_msg(c->bytes_dtoh <= s->out + s->route_down, "%s: %ld bytes down, the losses and predictions %ld, the routing %ld",
                name, c->bytes_dtoh, s->out, s->route_down);
}

/* Every example, a training step on its minibatch and on the minibatch twice over (the
 * same trees again: as many levels, twice the trees and rows), after a step on half of
 * it and one on the larger to grow the buffers (freeing those the step before used, its
 * work still queued: no wait for the device after a backward pass or a step): each
 * meets the targets, and the second launches no more
 * kernels, cuBLAS calls or memsets than the first. The counts go to the log, a line a
 * step. */
/* The last step's kernel launches by kernel, a line each ("kernels EXAMPLE COUNT NAME",
   NAME the kernel's template without its arguments), most first: for bench/counts */
static void print_kernels(const char *example) {
  const cavs_emu_op *op;
  long nops = cavs_emu_ops(&op), nk = 0, count[256];
  char names[256][64];
  for (long i = 0; i < nops; i++) {
    if (op[i].kind != CAVS_EMU_OP_KERNEL || !op[i].name) continue;
    const char *a = op[i].name + (op[i].name[0] == '(');
    char name[64];
    snprintf(name, sizeof name, "%.*s", (int)strcspn(a, "<,)"), a);
    long j = 0;
    while (j < nk && strcmp(names[j], name)) j++;
    if (j == nk && nk < 256) strcpy(names[nk], name), count[nk++] = 0;
    if (j < nk) count[j]++;
  }
  for (long done = 0; done < nk; done++) {
    long best = -1;
    for (long j = 0; j < nk; j++)
      if (count[j] >= 0 && (best < 0 || count[j] > count[best])) best = j;
    printf("kernels %s %ld %s\n", example, count[best], names[best]);
    count[best] = -1;
  }
}

START_TEST(steady_state_counts) {
  const cavs_desc *d = example(_i, "float", true);
  MINIBATCH(d);
  for (int i = 0; i < k; i++) gs[k + i] = gs[i];
  long since = cavs_emu_serial();
  cavs_model *m = model_on(d, dims, "cuda", 0, 0);
  StepCounts once, twice;
  counted_step(m, gs, k / 2, &once); /* then the buffers grow, the last step's work queued */
  counted_step(m, gs, 2 * k, &twice);
  counted_step(m, gs, k, &once);
  bool kernels = getenv("CAVS_COUNTS_KERNELS") != NULL; /* (bench/counts: the step's launches by kernel) */
  cavs_emu_log(kernels);
  counted_step(m, gs, k, &once);
  if (kernels) print_kernels(examples[_i]);
  cavs_emu_log(0);
  counted_step(m, gs, 2 * k, &twice);
  counts_header();
  counts_line(examples[_i], "float", &once);
  counts_line(examples[_i], "float", &twice);
  steady(examples[_i], &once);
  steady(examples[_i], &twice);
  /* (a mixture's experts too: their products are one grouped launch a stage, however
     many experts received slots) */
  long l1 = once.c.launches + once.c.blas_calls + once.c.memsets,
       l2 = twice.c.launches + twice.c.blas_calls + twice.c.memsets;
  ck_assert_msg(twice.expert_products <= once.expert_products, "%s: %ld expert products for %d trees, %ld for %d",
                examples[_i], once.expert_products, k, twice.expert_products, 2 * k);
  ck_assert_msg(l2 <= l1, "%s: %ld launches, cuBLAS calls and memsets for %d trees, %ld for %d", examples[_i], l1, k, l2,
                2 * k);
  free_all(m, since);
}
END_TEST

/* Setting a model up on the device: cavs_model_init's values and a checkpoint's weights
 * go up a block of rows at a time, not a row at a time (which made the host wait for
 * the device once a vocabulary word, 20000 times here: the H200 run of 2026-11-25's
 * counts, bench/README). The bound: one copy a parameter, and one more for each half
 * MiB of it; the values themselves are the cpu backend's (examples_float). */
static long setup_bound(cavs_model *m, const cavs_desc *d) {
  long bound = 0;
  for (int i = 0; i < d->nparams; i++) {
    long rows, cols, ld;
    cavs_model_param(m, i, &rows, &cols, &ld);
    bound += 1 + rows * cols * 4 / (1L << 19);
  }
  return bound;
}

/* cavs_host_alloc: pinned memory on the cuda backend (cudaMallocHost, freed by
   cudaFreeHost), which the model's copies read and write; malloc's on the cpu. */
START_TEST(host_memory_pinned) {
  const cavs_desc *d = example(0, "float", true), *dc = example(0, "float", false);
  long dims[CAVS_MAX_DIMS];
  cavs_dims_default(d, dims);
  for (int i = 0; i < d->ndims; i++) dims[i] = 16;
  long since = cavs_emu_serial();
  char err[512];
  cavs_model_opts o = {.backend = "cuda"}, oc = {.backend = "cpu"};
  cavs_model *m = cavs_model_new_opts(d, dims, &o, err, sizeof err), *mc = cavs_model_new_opts(dc, dims, &oc, err, sizeof err);
  ck_assert_msg(m && mc, "%s", err);
  cavs_model_init(m, 3);
  cavs_model_init(mc, 3);
  size_t n, nc;
  void *flat = cavs_model_params_flat(m, &n), *flatc = cavs_model_params_flat(mc, &nc);
  ck_assert_uint_eq(n, nc);
  cavs_emu_counts c;
  cavs_emu_counters(NULL, 1);
  float *h = cavs_host_alloc(m, n * 4), *hc = cavs_host_alloc(mc, n * 4);
  ck_assert(h && hc);
  cavs_emu_counters(&c, 1);
  ck_assert_int_eq(c.host_mallocs, 1); /* the cuda model's; the cpu's is malloc's */
  ck_assert_int_eq(cavs_model_read(m, h, flat, n * 4), 0);
  ck_assert_int_eq(cavs_model_read(mc, hc, flatc, n * 4), 0);
  ck_assert_msg(!memcmp(h, hc, n * 4), "the parameters read through pinned memory differ from the cpu model's");
  for (size_t i = 0; i < n; i++) h[i] *= 2;
  ck_assert_int_eq(cavs_model_write(m, flat, h, n * 4), 0);
  memset(h, 0, n * 4);
  ck_assert_int_eq(cavs_model_read(m, h, flat, n * 4), 0);
  for (size_t i = 0; i < n; i++) ck_assert_msg(h[i] == 2 * hc[i], "parameter %zu written through pinned memory", i);
  cavs_host_free(m, h);
  cavs_host_free(mc, hc);
  cavs_emu_counters(&c, 1);
  ck_assert_int_eq(c.host_frees, 1);
  cavs_model_free(m);
  cavs_model_free(mc);
  ck_assert_msg(cavs_emu_live(since) == 0, "left alive:\n%s", cavs_emu_live_report(since));
  no_errors();
}
END_TEST

START_TEST(setup_copies) {
  const cavs_desc *d = example(0, "float", true);
  long dims[CAVS_MAX_DIMS];
  cavs_dims_default(d, dims);
  int v = -1;
  for (int i = 0; i < d->ndims; i++)
    if (!strcmp(d->dims[i].name, "V")) v = i, dims[i] = 20000;
  ck_assert_msg(v >= 0, "treelstm has no dim V");
  for (int i = 0; i < d->ndims; i++)
    if (i != v) dims[i] = 16;
  long since = cavs_emu_serial();
  char err[512], path[4200], *dir = tu_tmpdir();
  cavs_model_opts o = {.backend = "cuda"};
  cavs_model *m = cavs_model_new_opts(d, dims, &o, err, sizeof err), *m2 = cavs_model_new_opts(d, dims, &o, err, sizeof err);
  ck_assert_msg(m && m2, "%s", err);
  long bound = setup_bound(m, d);
  cavs_emu_counts c;
  cavs_emu_counters(NULL, 1);
  cavs_model_init(m, 5);
  cavs_emu_counters(&c, 1);
  ck_assert_msg(c.syncs <= bound, "cavs_model_init: %ld host synchronizations, more than %ld", c.syncs, bound);
  ck_assert_msg(c.bytes_htod >= 20000L * 16 * 4, "cavs_model_init: %ld bytes up", c.bytes_htod);
  snprintf(path, sizeof path, "%s/setup.ckpt", dir);
  ck_assert_msg(cavs_ckpt_save(path, m, NULL, NULL, NULL, err, sizeof err) == 0, "%s", err);
  cavs_ckpt *ck = cavs_ckpt_read(path, err, sizeof err);
  ck_assert_msg(ck != NULL, "%s", err);
  cavs_emu_counters(NULL, 1);
  ck_assert_msg(cavs_ckpt_apply_weights(ck, m2, err, sizeof err) == 0, "%s", err);
  cavs_emu_counters(&c, 1);
  ck_assert_msg(c.syncs <= bound, "a checkpoint's weights: %ld host synchronizations, more than %ld", c.syncs, bound);
  /* and they arrived where they belong: the two models' parameters are the same */
  size_t n1, n2;
  const void *p1 = cavs_model_params_flat(m, &n1), *p2 = cavs_model_params_flat(m2, &n2);
  ck_assert(n1 == n2 && n1 > 0);
  float *h1 = malloc(n1 * 4), *h2 = malloc(n2 * 4);
  ck_assert(h1 && h2);
  ck_assert(cavs_model_read(m, h1, p1, n1 * 4) == 0 && cavs_model_read(m2, h2, p2, n2 * 4) == 0);
  ck_assert_msg(memcmp(h1, h2, n1 * 4) == 0, "the checkpoint's weights differ from the model's");
  free(h1);
  free(h2);
  cavs_ckpt_free(ck);
  cavs_model_free(m2);
  free_all(m, since);
  tu_rmtree(dir);
}
END_TEST

/* Run by bench/counts, not by make check (CAVS_COUNTS_SST names SST's train.txt): the
 * Tree-LSTM at E = H = $CAVS_COUNTS_H (512), float, on SST's minibatches of
 * $CAVS_COUNTS_BATCH (64) trees in the file's order; after a step on the epoch's largest
 * minibatch, twice (the buffers as they are after an epoch), $CAVS_COUNTS_STEPS (2) minibatches
 * counted, each a line, and with CAVS_COUNTS_OPS set each kernel, product, memset and
 * copy a line ("op KIND A B C", cavs_emu_op) for bench/counts' estimate. */
static long env_long(const char *name, long def) {
  const char *v = getenv(name);
  return v && *v ? atol(v) : def;
}

START_TEST(sst_counts) {
  const char *path = getenv("CAVS_COUNTS_SST");
  long h = env_long("CAVS_COUNTS_H", 512), batch = env_long("CAVS_COUNTS_BATCH", 64), steps = env_long("CAVS_COUNTS_STEPS", 2);
  const cavs_desc *d = example(0, "float", true);
  char err[512];
  cavs_vocab *v = cavs_vocab_new();
  long dims[CAVS_MAX_DIMS];
  cavs_dims_default(d, dims);
  cavs_dataset *set = cavs_dataset_load(path, "ptb-tree", d, dims, v, 1, err, sizeof err);
  ck_assert_msg(set != NULL, "%s", err);
  for (int i = 0; i < d->ndims; i++) {
    if (!strcmp(d->dims[i].name, "E") || !strcmp(d->dims[i].name, "H")) dims[i] = h;
    if (!strcmp(d->dims[i].name, "V")) dims[i] = cavs_vocab_size(v);
  }
  int n = cavs_dataset_count(set), nb = (int)((n + batch - 1) / batch), largest = 0;
  long most = -1;
  const cavs_graph **gs = malloc(sizeof *gs * (size_t)n);
  ck_assert(gs != NULL);
  for (int i = 0; i < n; i++) gs[i] = cavs_dataset_graph(set, i);
  for (int b = 0; b < nb; b++) {
    long rows = 0;
    for (int i = b * (int)batch; i < n && i < (b + 1) * (int)batch; i++) rows += gs[i]->n;
    if (rows > most) most = rows, largest = b;
  }
  long since = cavs_emu_serial();
  cavs_model *m = model_on(d, dims, "cuda", 0, 0);
  StepCounts c;
  int k0 = (int)(largest * batch), kl = n - k0 < batch ? n - k0 : (int)batch;
  counted_step(m, gs + k0, kl, &c);
  counted_step(m, gs + k0, kl, &c); /* (zero_rows clears the rows the last step touched) */
  printf("# SST %s: %d trees, minibatches of %ld (%d), E=H=%ld; the largest (%ld vertices) first\n", path, n, batch, nb, h,
         most);
  counts_header();
  bool ops = getenv("CAVS_COUNTS_OPS") != NULL;
  cavs_emu_log(ops);
  for (int b = 0; b < steps && b < nb; b++) {
    int kb = n - b * (int)batch < batch ? n - b * (int)batch : (int)batch;
    counted_step(m, gs + b * batch, kb, &c);
    counts_line("treelstm-sst", "float", &c);
    printf("# host scheduling: %.3f ms\n", 1e3 * c.host);
    steady("treelstm on SST", &c);
    const cavs_emu_op *op;
    long nops = cavs_emu_ops(&op);
    static const char *const kinds[] = {"kernel", "gemm", "memset", "copy"};
    for (long i = 0; i < nops; i++) printf("op %s %ld %ld %ld\n", kinds[op[i].kind], op[i].a, op[i].b, op[i].c);
  }
  cavs_emu_log(0);
  free(gs);
  free_all(m, since);
  cavs_dataset_free(set);
  cavs_vocab_free(v);
}
END_TEST

/* In a checked build (under valgrind, where the emulator cannot close device memory to
   the host and a pass costs some fifty times as much, or with the sanitizers: there
   check_cuda_host runs every example's kernels), the examples whose code differs most:
   a Tree-LSTM, children as a set (Child-Sum), attention over a set (seq2seq), and
   matrices per vertex (MV-RNN). By name: indices moved when an example was added (lstm_lm2 made these
   tagger_chars, lattice_gru and seq2seq for a while). */
static const char *const few_names[] = {"treelstm", "childsum", "seq2seq", "mvrnn"};
static int few[4];
static int nrun;

/* examples[]'s index of `name` */
static int example_index(const char *name) {
  for (int i = 0; i < NEX; i++)
    if (!strcmp(examples[i], name)) return i;
  fprintf(stderr, "check_cuda_emu: no example %s\n", name);
  abort();
}

/* in the parent, before the tests fork: each model they use built once */
static void build_models(void) {
  for (int i = 0; i < nrun; i++)
    for (int p = 0; p < 2; p++)
      for (int t = 0; t < 2; t++) example(all ? i : few[i], p ? "double" : "float", t);
  drop_c = load_model(drop_src, "double");
  drop_u = load_host_cuda_with("mixdrop", drop_src, "double", "cuda_emu.h");
  noise_c = load_model(noise_src, "double");
  noise_u = load_host_cuda_with("noisy", noise_src, "double", "cuda_emu.h");
  moe_push_c = load_model(moe_push_src, "double");
  moe_push_u = load_host_cuda_with("moepush", moe_push_src, "double", "cuda_emu.h");
  moe_bal_c = load_model(moe_bal_src, "double");
  moe_bal_u = load_host_cuda_with("moebal", moe_bal_src, "double", "cuda_emu.h");
}

/* the models the counts use */
static void build_counted(void) {
  for (int i = 0; i < nrun; i++) example(all ? i : few[i], "float", true);
}

/* the models the faults use */
static void build_faulted(void) {
  example(0, "float", true);
  example(example_index("childsum"), "float", true);
}

int main(void) {
  all = !tu_checked_build();
  for (int i = 0; i < 4; i++) few[i] = example_index(few_names[i]);
  nrun = all ? NEX : (int)(sizeof few / sizeof *few);
  int n = nrun;
  Suite *s = suite_create("cuda_emu");
  TCase *tc = tcase_create("the cuda backend on the emulator");
  tcase_set_timeout(tc, 300);
  tcase_add_unchecked_fixture(tc, build_models, NULL);
  for (int i = 0; i < n; i++) {
    int x = all ? i : few[i];
    tcase_add_loop_test(tc, examples_double, x, x + 1);
    tcase_add_loop_test(tc, examples_float, x, x + 1);
    if (all || i < 2) tcase_add_loop_test(tc, streams_in_any_order, x, x + 1); /* (checked: two) */
    if (all || x == 0) tcase_add_loop_test(tc, graphs_as_launches, x, x + 1);
    tcase_add_loop_test(tc, inference_as_cpu, x, x + 1);
  }
  /* a Tree-LSTM (lookup tables), children as a set, attention, matrices per vertex; the
     optimizers, whose kernels do not depend on the model, on the Tree-LSTM alone in a
     checked build (14 steps of two passes each: four minutes under valgrind) */
  for (int i = 0; i < 4; i++) {
    tcase_add_loop_test(tc, serial_as_batched, few[i], few[i] + 1);
    if (all || i == 0) tcase_add_loop_test(tc, optimizers_as_cpu, few[i], few[i] + 1);
    tcase_add_loop_test(tc, checkpoint_to_cpu, few[i], few[i] + 1);
  }
  tcase_add_test(tc, dropout_as_cpu);
  tcase_add_test(tc, noise_as_cpu);
  tcase_add_test(tc, moe_labeled_rows_as_cpu);
  tcase_add_loop_test(tc, moe_slots_as_cpu, 0, 2 * (int)(sizeof slot_cases / sizeof *slot_cases));
  if (all) tcase_add_test(tc, moe_wide_as_cpu); /* (not in a checked build) */
  suite_add_tcase(s, tc);
  TCase *counts = tcase_create("counts");
  tcase_set_timeout(counts, 300);
  tcase_add_unchecked_fixture(counts, build_counted, NULL);
  for (int i = 0; i < n; i++) tcase_add_loop_test(counts, steady_state_counts, all ? i : few[i], (all ? i : few[i]) + 1);
  tcase_add_test(counts, setup_copies);
  tcase_add_test(counts, host_memory_pinned);
  if (getenv("CAVS_COUNTS_SST")) tcase_add_test(counts, sst_counts);
  suite_add_tcase(s, counts);
  /* a Tree-LSTM (lookup tables, two streams) and children as a set (edges); in a
     checked build the Tree-LSTM, at a few points */
  TCase *faults = tcase_create("faults");
  tcase_set_timeout(faults, 300);
  tcase_add_unchecked_fixture(faults, build_faulted, NULL);
  for (int x = 0, cs = example_index("childsum"); x <= cs; x += all ? cs : cs + 1) {
    tcase_add_loop_test(faults, failed_malloc, x, x + 1);
    tcase_add_loop_test(faults, failed_malloc_again, x, x + 1);
    tcase_add_loop_test(faults, failed_launch, x, x + 1);
  }
  suite_add_tcase(s, faults);
  TCase *own = tcase_create("the emulator's checks");
  tcase_add_test(own, copies_checked);
  tcase_add_test(own, gemm_column_major);
  tcase_add_test(own, host_memory_launched);
  if (cavs_emu_host_faults()) tcase_add_test_raise_signal(own, host_reads_device, SIGABRT);
  tcase_add_test_raise_signal(own, kernel_past_end, SIGABRT);
  tcase_add_test_raise_signal(own, kernel_after_free, SIGABRT);
  tcase_add_test(own, barriers);
  tcase_add_test(own, poison_until_synchronized);
  tcase_add_test(own, graph_update_rules);
  suite_add_tcase(s, own);
  return tu_run_suite(s);
}
