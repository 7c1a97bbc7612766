/* check_cuda_host.c: the CUDA target's kernels, run on the CPU, compute what the C
 * target's loops do. Each example's MODEL.cu, fresh from `cavsc --target=cuda`, is
 * compiled by the host C++ compiler under tests/cuda_host.h, where a launch runs every
 * thread of its grid in turn; its model and the C target's are made on the cpu backend
 * with the same dims and seed and run on the same minibatch of random trees and DAGs.
 * Every value of every per-row buffer (forward values, then gradients), every
 * parameter's gradient, the losses, the counts and the predictions must agree, cell by
 * cell: a kernel that takes a wrong row or column, or misses a cell, fails here. Needs
 * neither a GPU nor nvcc, so it runs in every configuration (the valgrind and sanitizer
 * builds too: the object gets $CAVS_MODEL_CFLAGS as every test model does). */
#include "cudatest.h"

static const cavs_desc *load_host_cuda(const char *model, const char *src, const char *prec) {
  return load_host_cuda_with(model, src, prec, "cuda_host.h");
}

static void same_matrix(const cavs_model *mc, const void *c, const void *u, long rows, long cols, long ld,
                        const char *what, double tol) {
  same_matrix_as(mc, c, u, rows, cols, ld, what, tol, "C", "CUDA", NULL, 0);
}

/* Rows [0, rows) of every per-row buffer (edges [0, nedges) of an edge buffer), values
 * or gradients. */
static void same_buffers(const cavs_model *c, const cavs_model *u, bool grads, double tol) {
  const cavs_desc *d = c->d;
  for (int b = 0; b < d->nbufs; b++) {
    char what[300];
    snprintf(what, sizeof what, "%s of buffer %d (%s)", grads ? "gradient" : "value", b, d->bufs[b].name);
    if (!grads || c->grad[b])
      same_matrix(c, grads ? c->grad[b] : c->val[b], grads ? u->grad[b] : u->val[b],
                  d->bufs[b].edge ? c->nedges : c->rows, c->bw[b], c->bw[b], what, tol);
  }
}

/* A pass sized the per-row buffers; set every value in them to one odd number, in both
 * models, so that a cell a kernel misses keeps it where the C loop writes the cell (the
 * cpu backend's memory is the host's: a plain copy). */
static void host_write(cavs_model *m, void *dst, const void *src, size_t bytes) { memcpy(dst, src, bytes); }
static void poison_values(cavs_model *m) { poison_bufs(m, false, host_write); }
/* The same for the gradients, before a backward pass: it clears those it adds to, but
 * not those it writes whole (CAVS_GRAD_WHOLE), whose rows of other vertex types it never
 * touches. */
static void poison_grads(cavs_model *m) { poison_bufs(m, true, host_write); }

/* Model MODEL of dsl-examples/, or the one `src` holds, at `prec`. */
static void host_vs_c(const char *model, const char *src, const char *prec, double tol) {
  char vf[64];
  snprintf(vf, sizeof vf, "%s.vf", model);
  const cavs_desc *dc = load_model(src ? src : vf, prec);
  /* The CUDA target's descriptor says so, and the cpu backend refuses it: such stages
     launch kernels on a device. Under cuda_host.h the launches run here, on the pointers
     the cpu backend gives the stages, its host memory: a copy that says C runs. */
  static cavs_desc du;
  du = *load_host_cuda(model, src, prec);
  ck_assert_int_eq(du.target, CAVS_TARGET_CUDA);
  du.target = CAVS_TARGET_C;

  long dims[CAVS_MAX_DIMS];
  static TGraph g[TG_MINIBATCH];
  const cavs_graph *gs[TG_MINIBATCH];
  cavs_model *mc, *mu;
  int k = cuda_and_c(dc, &du, dims, g, gs, &mc, &mu);
  cavs_stats sc, su;
  ck_assert(cavs_model_forward(mc, gs, k, &sc) == 0);
  ck_assert(cavs_model_forward(mu, gs, k, &su) == 0);
  poison_values(mc);
  poison_values(mu);
  ck_assert(cavs_model_forward(mc, gs, k, &sc) == 0);
  ck_assert_msg(cavs_model_forward(mu, gs, k, &su) == 0, "%s", cavs_model_error(mu));
  same_buffers(mc, mu, false, tol); /* first: a wrong cell is named */
  ck_assert_msg(agree(sc.loss, su.loss, tol), "%s: loss: C %.17g, CUDA %.17g", model, sc.loss, su.loss);
  ck_assert(sc.count == su.count && sc.correct == su.correct && sc.root_count == su.root_count &&
            sc.root_correct == su.root_correct && sc.tasks == su.tasks);
  int nc, nu;
  const cavs_loss_acc *lc = cavs_model_losses(mc, &nc), *lu = cavs_model_losses(mu, &nu);
  ck_assert_int_eq(nc, nu);
  for (int i = 0; i < nc; i++)
    ck_assert_msg(agree(lc[i].sum, lu[i].sum, tol) && lc[i].count == lu[i].count && lc[i].correct == lu[i].correct,
                  "%s: loss %d: C %.17g over %ld, CUDA %.17g over %ld", model, i, lc[i].sum, lc[i].count, lu[i].sum,
                  lu[i].count);
  ck_assert_int_eq(mc->rows, mu->rows);
  for (int r = 0; r < mc->rows; r++)
    if (mc->pred[r] != mu->pred[r]) ck_abort_msg("%s: prediction of row %d: C %d, CUDA %d", model, r, mc->pred[r], mu->pred[r]);
  for (int i = 0; i < k; i++) ck_assert_int_eq(cavs_model_root_class(mc, i), cavs_model_root_class(mu, i));

  poison_grads(mc);
  poison_grads(mu);
  cavs_model_backward(mc);
  cavs_model_backward(mu);
  same_buffers(mc, mu, true, tol);
  for (int i = 0; i < dc->nparams; i++) {
    long rows, cols, ld;
    const void *gc = cavs_model_grad(mc, i, &rows, &cols, &ld), *gu = cavs_model_grad(mu, i, &rows, &cols, &ld);
    char what[300];
    snprintf(what, sizeof what, "gradient of %s", dc->params[i].name);
    same_matrix(mc, gc, gu, rows, cols, ld, what, tol);
  }
  cavs_model_free(mc);
  cavs_model_free(mu);
}

static const char *const examples[] = {"treelstm", "treefc", "lstm_lm", "lstm_lm2", "treegru", "twotype", "tagger", "tagger_chars", "childsum", "lattice_lstm", "lattice_gru", "seq2seq", "mvrnn", "nary_treelstm", "moe_tree", "moe_lm"};

START_TEST(examples_double) { host_vs_c(examples[_i], NULL, "double", 1e-12); }
END_TEST

START_TEST(treelstm_float) { host_vs_c("treelstm", NULL, "float", 1e-5); }
END_TEST

/* No example has a kernel whose gradients may overlap (two slices of one buffer, each
 * added to by its own thread: cavs_cuda_sum per row, atomic adds on the GPU). */
START_TEST(overlapping_gradients) {
  host_vs_c("overlap",
            "model overlap; dim H = 4; dim C = 3; input y : class[C];\n"
            "param W[H,2H], Wc[H,C] init uniform(-1, 1); param b[H];\n"
            "vertex v (children 2) {\n  s = gather(0)[0:H] @ W;\n"
            "  h = tanh(s[0:H] * s[1:H+1] + b + gather(1)[0:H]);\n  scatter(concat(h, h)); push(h);\n}\n"
            "push (h) { loss softmax_xent(h @ Wc, y); }\n",
            "double", 1e-12);
}
END_TEST

/* ---- the eager phase on a second stream ----
 *
 * A GPU runs a pass's two streams in any order their events allow. Here the cpu
 * backend, which has no streams, runs the same steps in the two orders furthest apart:
 * stream 0 as far ahead as the events let it (the eager work as late as possible) and
 * stream 1 as far ahead (as early as possible). With every event in place, each comes
 * out bit for bit as the steps run in the order issued; a missing one shows (below). */

static cavs_desc streams_desc;

/* The CUDA target of example `model` in double, its kernels emulated, as a descriptor
 * the cpu backend takes (see host_vs_c), and the minibatch to run it on. */
static int streams_load(const char *model, long *dims, TGraph g[TG_MINIBATCH], const cavs_graph *gs[TG_MINIBATCH],
                        bool dags) {
  streams_desc = *load_host_cuda(model, NULL, "double");
  streams_desc.target = CAVS_TARGET_C;
  return tg_minibatch(&streams_desc, dims, g, gs, dags);
}

/* A model of it with two streams (order >= 0: how they run) or one (order -1). */
static cavs_model *streams_model(const long *dims, int order) {
  cavs_model *m = new_model(&streams_desc, dims, 9);
  /* every looked-up row multiplied: two streams split the eager products in other
     chunks, and a word multiplied once a chunk leaves its rows' gradient at another
     first row (the table's is the same sum: check_engine's dedup_changes_nothing) */
  cavs_model_set_ablations(m, CAVS_NO_DEDUP);
  m->overlap = order >= 0;
  m->order = order < 0 ? CV_ISSUED : order;
  return m;
}

/* the plan has both streams in it */
static bool two_streams(const cavs_model *m) {
  for (int i = 0; i < m->nplan; i++)
    if (m->plan[i].kind == CV_STREAM && m->plan[i].arg == 1) return true;
  return false;
}

static void same_grads(cavs_model *a, cavs_model *b, double tol) {
  same_buffers(a, b, true, tol);
  for (int i = 0; i < a->d->nparams; i++) {
    long rows, cols, ld;
    const void *ga = cavs_model_grad(a, i, &rows, &cols, &ld), *gb = cavs_model_grad(b, i, &rows, &cols, &ld);
    char what[300];
    snprintf(what, sizeof what, "gradient of %s", a->d->params[i].name);
    same_matrix(a, ga, gb, rows, cols, ld, what, tol);
  }
}

START_TEST(streams_in_any_order) {
  const char *model = examples[_i];
  long dims[CAVS_MAX_DIMS];
  static TGraph g[TG_MINIBATCH];
  const cavs_graph *gs[TG_MINIBATCH];
  int k = streams_load(model, dims, g, gs, true);
  /* one stream; two, issued in order; two, in each of the orders furthest apart */
  cavs_model *m[4];
  for (int i = 0; i < 4; i++) {
    m[i] = streams_model(dims, i == 0 ? -1 : i == 1 ? CV_ISSUED : i == 2 ? CV_MAIN_FIRST : CV_SIDE_FIRST);
    ck_assert(cavs_model_forward(m[i], gs, k, NULL) == 0);
    poison_values(m[i]);
    ck_assert_msg(cavs_model_forward(m[i], gs, k, NULL) == 0, "%s", cavs_model_error(m[i]));
    ck_assert_msg(i == 0 ? !two_streams(m[i]) : two_streams(m[i]), "%s: forward plan %d", model, i);
  }
  for (int i = 2; i < 4; i++) same_buffers(m[1], m[i], false, 0);
  /* the eager products over chunks of rows, not all at once: the same sums but for the
     last bits of a product over other row blocks, which the softmax of seq2seq's
     attention turns into 2.5e-13 of a weight of 4e-5 (with the roots of the largest
     graphs numbered first); a missing event leaves poison, off by far more */
  same_buffers(m[0], m[1], false, 1e-11);
  for (int i = 0; i < 4; i++) {
    poison_grads(m[i]);
    cavs_model_backward(m[i]);
    ck_assert_msg(!m[i]->launch_failed, "%s", cavs_model_error(m[i]));
    ck_assert_msg(i == 0 ? !two_streams(m[i]) : two_streams(m[i]), "%s: backward plan %d", model, i);
  }
  for (int i = 2; i < 4; i++) same_grads(m[1], m[i], 0);
  /* the parameter gradients summed chunk by chunk, from values that differ in their last
     bits (the eager products by chunks): the lattice models' gradients, sums of many
     terms that cancel, then differ at 1e-10 */
  same_grads(m[0], m[1], 1e-10);
  for (int i = 0; i < 4; i++) cavs_model_free(m[i]);
}
END_TEST

/* Without its events, the second stream's work runs too late (or too early) and the
 * values or gradients come out wrong: what the test above would see of a missing one. */
static bool plan_without_waits_differs(bool backward, int order) {
  long dims[CAVS_MAX_DIMS];
  static TGraph g[TG_MINIBATCH];
  const cavs_graph *gs[TG_MINIBATCH];
  int k = streams_load("treelstm", dims, g, gs, false);
  cavs_model *ref = streams_model(dims, CV_ISSUED), *m = streams_model(dims, CV_ISSUED);
  ck_assert(cavs_model_forward(ref, gs, k, NULL) == 0 && cavs_model_forward(m, gs, k, NULL) == 0);
  if (backward) {
    poison_grads(ref);
    poison_grads(m);
    cavs_model_backward(ref);
    ck_assert(cavs_plan_backward(m) == 0);
  } else {
    poison_values(m);
    ck_assert(cavs_plan_forward(m) == 0);
  }
  int n = 0;
  for (int i = 0; i < m->nplan; i++)
    if (m->plan[i].kind != CV_WAIT) m->plan[n++] = m->plan[i];
  ck_assert_int_lt(n, m->nplan);
  m->nplan = n;
  m->order = order;
  if (backward)
    for (int b = 0; b < m->d->nbufs; b++)
      if (m->grad[b] && m->d->bufs[b].grad != CAVS_GRAD_WHOLE)
        memset(m->grad[b], 0, (size_t)m->rows * (size_t)m->bw[b] * m->esize);
  ck_assert(cavs_run_plan(m) == 0);
  bool differs = false;
  for (int b = 0; b < m->d->nbufs && !differs; b++) {
    const void *x = backward ? ref->grad[b] : ref->val[b], *y = backward ? m->grad[b] : m->val[b];
    if (x) differs = memcmp(x, y, (size_t)m->rows * (size_t)m->bw[b] * m->esize) != 0;
  }
  cavs_model_free(ref);
  cavs_model_free(m);
  return differs;
}

START_TEST(missing_events_show) {
  ck_assert_msg(plan_without_waits_differs(false, CV_MAIN_FIRST), "forward, eager work late");
  ck_assert_msg(plan_without_waits_differs(true, CV_SIDE_FIRST), "backward, eager work early");
}
END_TEST

/* Launches per pass depend on the tasks, not on their rows: one tree, and the same tree
 * sixteen times over, launch as many kernels (the aim: a gather, the products, a fused
 * kernel and a scatter per task, whatever its width). Every vertex has a word here: the
 * runs of rows with one are the cpu backend's to split (the CUDA backend's products
 * over looked-up rows stop splitting past two). */
START_TEST(launches_do_not_grow_with_rows) {
  long dims[CAVS_MAX_DIMS];
  static TGraph g[TG_MINIBATCH];
  const cavs_graph *gs[TG_MINIBATCH];
  streams_load("treelstm", dims, g, gs, false);
  for (int i = 0; i < g[5].g.n * streams_desc.nint; i++)
    if (g[5].feat[i] < 0) g[5].feat[i] = 0;
  const cavs_graph *same[16];
  for (int i = 0; i < 16; i++) same[i] = gs[5];
  cavs_model *m = streams_model(dims, CV_ISSUED);
  cavs_backend_stats one, many;
  cavs_stats s1, s16;
  /* a pass first: each backward clears the embedding gradient rows the one before it
     touched (one launch more after the first) */
  for (int pass = 0; pass < 3; pass++) {
    cavs_model_backend_stats(m, NULL, 1);
    ck_assert(cavs_model_forward(m, same, pass == 2 ? 16 : 1, pass == 2 ? &s16 : &s1) == 0);
    cavs_model_backward(m);
    cavs_model_backend_stats(m, pass == 2 ? &many : &one, 0);
  }
  ck_assert_int_eq(s1.tasks, s16.tasks);
  ck_assert_int_gt(one.launches, 2 * s1.tasks);
  ck_assert_int_eq(one.launches, many.launches);
  cavs_model_free(m);
}
END_TEST

int main(void) {
  Suite *s = suite_create("cuda_host");
  TCase *tc = tcase_create("kernels on the CPU");
  tcase_set_timeout(tc, 300);
  enum { NEX = sizeof examples / sizeof *examples }; /* every one: a literal 12 once left two out */
  tcase_add_loop_test(tc, examples_double, 0, NEX);
  tcase_add_test(tc, treelstm_float);
  tcase_add_test(tc, overlapping_gradients);
  /* two streams */
  tcase_add_loop_test(tc, streams_in_any_order, 0, NEX);
  tcase_add_test(tc, missing_events_show);
  tcase_add_test(tc, launches_do_not_grow_with_rows);
  suite_add_tcase(s, tc);
  return tu_run_suite(s);
}
