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
#include "engine.h"

#include "cv.h" /* the per-row buffers: the public API shows only what comes out of them */

/* cavsc --target=cuda on dsl-examples/MODEL.vf (or on `src`, the text of model MODEL),
 * then the host C++ compiler on MODEL.cu with the flags every test model gets
 * ($CAVS_MODEL_CFLAGS: -Wall -Werror and, in a sanitizer build, the sanitizers); loaded
 * as load_model loads the C target's. No fused multiply-adds, as in the C target's build
 * (-std=c11 implies -ffp-contract=off; g++ contracts where the machine has them): each
 * value is then rounded as the C loop rounds it. */
static const cavs_desc *load_host_cuda(const char *model, const char *src, const char *prec) {
  const char *top = tu_env("TOP_SRCDIR", ".");
  char *dir = tu_tmpdir(), popt[64], vf[4200], cmd[16384], so[4400];
  snprintf(popt, sizeof popt, "--precision=%s", prec);
  if (src) {
    snprintf(vf, sizeof vf, "%s/%s.vf", dir, model);
    tu_write(vf, src, strlen(src));
  } else {
    snprintf(vf, sizeof vf, "%s/dsl-examples/%s.vf", top, model);
  }
  char *gen[] = {(char *)tu_env("CAVSC", "./cavsc"), "--target=cuda", popt, "-o", dir, vf, NULL};
  RunResult r = tu_run(NULL, gen, 30);
  ck_assert_msg(r.status == 0, "cavsc --target=cuda %s: %s", vf, tu_tail(r.err, 1800));
  tu_free(&r);
  snprintf(so, sizeof so, "%s/%s.so", dir, model);
  snprintf(cmd, sizeof cmd,
           "%s -x c++ -std=c++17 -O2 -ffp-contract=off -fPIC -shared %s -include %s/tests/cuda_host.h -I%s/runtime "
           "-o %s %s/%s.cu",
           tu_env("CXX", "g++"), tu_env("CAVS_MODEL_CFLAGS", ""), top, top, so, dir, model);
  char *sh[] = {"/bin/sh", "-c", cmd, NULL};
  r = tu_run(NULL, sh, 120);
  ck_assert_msg(r.status == 0, "%s (status %d):\n%s%s", cmd, r.status, tu_tail(r.out, 800), tu_tail(r.err, 1800));
  tu_free(&r);
  return open_model(so, dir);
}

static double at(const cavs_model *m, const void *p, size_t i) {
  return m->esize == 8 ? ((const double *)p)[i] : (double)((const float *)p)[i];
}

/* The C target's value and the emulated kernel's, to `tol` relative (zero only to zero). */
static bool agree(double want, double got, double tol) {
  return fabs(want - got) <= tol * fmax(fabs(want), fabs(got));
}

/* rows x cols values at c and u (rows ld apart) agree, or the first that does not is
 * named: `what`[row, column] */
static void same_matrix(const cavs_model *mc, const void *c, const void *u, long rows, long cols, long ld,
                        const char *what, double tol) {
  for (long r = 0; r < rows; r++)
    for (long j = 0; j < cols; j++) {
      double want = at(mc, c, (size_t)(r * ld + j)), got = at(mc, u, (size_t)(r * ld + j));
      if (!agree(want, got, tol))
        ck_abort_msg("%s: %s[%ld, %ld]: C %.17g, CUDA %.17g", mc->d->name, what, r, j, want, got);
    }
}

/* Rows [0, rows) of every per-row buffer, values or gradients. */
static void same_buffers(const cavs_model *c, const cavs_model *u, bool grads, double tol) {
  const cavs_desc *d = c->d;
  for (int b = 0; b < d->nbufs; b++) {
    char what[300];
    snprintf(what, sizeof what, "%s of buffer %d (%s)", grads ? "gradient" : "value", b, d->bufs[b].name);
    if (!grads || c->grad[b])
      same_matrix(c, grads ? c->grad[b] : c->val[b], grads ? u->grad[b] : u->val[b], c->rows, c->bw[b], c->bw[b],
                  what, tol);
  }
}

/* A pass sized the per-row buffers; set every value in them to one odd number, in both
 * models, so that a cell a kernel misses keeps it where the C loop writes the cell (the
 * gradients need no such care: the backward pass clears them first). */
static void poison_values(cavs_model *m) {
  for (int b = 0; b < m->d->nbufs; b++)
    for (size_t i = 0; i < (size_t)m->cap_rows * (size_t)m->bw[b]; i++) {
      if (m->esize == 8) ((double *)m->val[b])[i] = -7.25;
      else ((float *)m->val[b])[i] = -7.25f;
    }
}

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
  int k = tg_minibatch(dc, dims, g, gs, true);
  cavs_model *mc = new_model(dc, dims, 5), *mu = new_model(&du, dims, 5);
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

static const char *const examples[] = {"treelstm", "treefc", "lstm_lm", "treegru", "twotype"};

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

int main(void) {
  Suite *s = suite_create("cuda_host");
  TCase *tc = tcase_create("kernels on the CPU");
  tcase_set_timeout(tc, 300);
  tcase_add_loop_test(tc, examples_double, 0, 5);
  tcase_add_test(tc, treelstm_float);
  tcase_add_test(tc, overlapping_gradients);
  suite_add_tcase(s, tc);
  return tu_run_suite(s);
}
